"""CDK stacks for Ebb: one construct per concern, composed by stacks that hold no logic.

The stacks take their names (S3 prefixes, variables, metrics, queues) from the runtime's
`ebb.ports.deployment`; without the `ebb` package installed, it is found in `lambda_src/`.
"""

import sys
from pathlib import Path

try:
    import ebb.ports.deployment  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lambda_src"))
