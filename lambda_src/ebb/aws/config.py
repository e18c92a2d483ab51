"""The environment the stack gives every function (docs/AWS.md; the names in ``ebb.ports.deployment``), read once.

Each function gets only the variables it needs, so a variable is checked when a handler
asks for what needs it: the cache's (``ebb.stores.elasticache.CacheConfig``) and the
SNS/SQS channel's (``SnsSqsSignalChannel.from_env``) are parsed there, from the snapshot
kept here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cache

from ebb.ports import deployment as names


class ConfigError(RuntimeError):
    """A variable the stack should have set is missing or malformed."""


@dataclass(frozen=True)
class AwsConfig:
    bucket: str
    max_workers: int = 64
    events_topic_arn: str | None = None
    metrics_namespace: str = names.METRICS_NAMESPACE
    env: dict[str, str] = field(default_factory=dict, repr=False)  # the snapshot the stores read theirs from

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> AwsConfig:
        env = dict(os.environ if env is None else env)
        if not env.get(names.BUCKET_ENV):
            raise ConfigError(f"{names.BUCKET_ENV} is not set: this function runs only inside the deployed Ebb stack")
        try:
            max_workers = int(env.get(names.MAX_WORKERS_ENV, "64"))
        except ValueError:
            raise ConfigError(
                f"{names.MAX_WORKERS_ENV} must be an integer, got {env[names.MAX_WORKERS_ENV]!r}"
            ) from None
        return cls(
            bucket=env[names.BUCKET_ENV],
            max_workers=max_workers,
            events_topic_arn=env.get(names.EVENTS_TOPIC_ENV) or None,
            metrics_namespace=env.get(names.METRICS_NAMESPACE_ENV, names.METRICS_NAMESPACE),
            env=env,
        )


@cache
def aws_config() -> AwsConfig:
    """The function's configuration, read from its environment on first use."""
    return AwsConfig.from_env()
