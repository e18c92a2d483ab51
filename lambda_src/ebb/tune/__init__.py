"""``ebb tune``: hyper-parameter search over ordinary jobs (docs/ARCHITECTURE.md, "Tuning").

``space`` (what is searched: the ``tune:`` section, ``--param``, ``--quick``), ``scheduler``
(ASHA, Optuna's samplers, the $ budget), ``trial`` (one job of a trial, and what its
checkpoints say), ``runner`` (trials run here), ``command`` (the CLI's flags).
"""
