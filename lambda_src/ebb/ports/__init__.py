"""The floor every other package stands on: the engine's interfaces and what crosses them.

- ``objects``: the object store (datasets, checkpoints, models, reports);
- ``updates``: the update store (a step's encoded updates, replicas, heartbeats);
- ``signals``: the signal channel (worker reports up, directives down);
- ``messages``: the reports and directives themselves, in their one wire encoding;
- ``launcher``: how a worker is started, and the launcher that starts it;
- ``metrics``: the sink a supervisor shows its steps to;
- ``keys``: the names of what the parts share in those stores;
- ``manifest``: what a prepared dataset holds, and its one loader;
- ``deployment``: the names an AWS deployment (``stacks/``) and its runtime share.

The engine, the stores, the local runner, the AWS handlers and the data pipeline all
import from here; nothing here imports from them. Light on purpose (pydantic, no numpy
or torch): the zip functions import it too. docs/ARCHITECTURE.md, "Where each thing lives".
"""
