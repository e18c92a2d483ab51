"""Ebb on AWS: the thin Lambda handlers (``handlers/``), their declared events
(``contract``), the environment they run in (``config``), and the AWS-only pieces of the
engine's run time (CloudWatch metrics, job events, the worker launcher). docs/AWS.md is
the contract with the stacks. Nothing outside this package imports from it but ``names``,
the names the stack, the stores and the CLI share (standard library only)."""
