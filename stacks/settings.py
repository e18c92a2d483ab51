"""Every size, count and switch of a deployment, read once from CDK context.

`cdk.json` holds the documented defaults (one `ebb:` key each, listed in docs/AWS.md);
`npx cdk deploy -c ebb:maxWorkers=64` overrides one. Values given with `-c` arrive as
strings, so each reader also accepts "64", "true" and "null". A bad value stops synthesis
with the key, what it must be and what it was.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aws_cdk import aws_logs as logs

from ebb.ports import deployment as names

# The in-VPC functions reach these AWS APIs through interface endpoints (egress "endpoints").
INTERFACE_ENDPOINT_NAMES = ("secretsmanager", "sqs", "sns", "xray", "logs", "monitoring", "lambda", "states")
FUNCTION_NAMES = ("worker", "supervisor", "prepare", "finalize", "validate", "onFailure", "predict", "tune")
# Per worker: a queue, its subscription and its queue policy. Past this the stack would near
# CloudFormation's 500 resources and the worker role's 10 KB inline-policy limit.
MAX_WORKERS_LIMIT = 100
_STACK_NAME = re.compile(r"[A-Za-z](?:[A-Za-z0-9]|-(?!-)){0,31}")


class SettingsError(ValueError):
    """A context value that cannot be used, named by its key."""


@dataclass(frozen=True)
class FunctionSettings:
    memory_mb: int
    timeout_seconds: int
    reserved_concurrency: int | None
    ephemeral_mb: int = 512


@dataclass(frozen=True)
class Settings:
    stack_name: str
    retain_data: bool
    data_bucket_name: str | None
    max_workers: int
    architecture: str  # x86_64 | arm64
    log_retention_days: int
    # network
    max_azs: int
    egress: str  # endpoints | nat
    interface_endpoints: tuple[str, ...]
    endpoint_azs: int
    # cache
    cache_mode: str  # nodes | serverless
    cache_engine: str  # redis | valkey
    cache_node_type: str
    cache_shards: int
    cache_replicas: int
    cache_serverless_max_gb: int
    # storage
    checkpoint_expiry_days: int
    scratch_expiry_days: int
    functions: Mapping[str, FunctionSettings]

    @property
    def log_retention(self) -> logs.RetentionDays:
        return _RETENTION[self.log_retention_days]

    @classmethod
    def from_context(cls, get: Callable[[str], Any]) -> Settings:
        """Read every `ebb:` key through `get` (e.g. `app.node.try_get_context`)."""
        r = _Reader(get)
        functions = {
            name: FunctionSettings(
                memory_mb=r.integer(f"ebb:{name}MemoryMb", 128, 10240),
                timeout_seconds=r.integer(f"ebb:{name}TimeoutSeconds", 1, 900),
                reserved_concurrency=r.integer(f"ebb:{name}ReservedConcurrency", 1, 10000, optional=True),
                ephemeral_mb=r.integer(f"ebb:{name}EphemeralMb", 512, 10240) if name in ("prepare", "predict") else 512,
            )
            for name in FUNCTION_NAMES
        }
        settings = cls(
            stack_name=r.stack_name("ebb:stackName"),
            retain_data=r.boolean("ebb:retainData"),
            data_bucket_name=r.bucket_name("ebb:dataBucketName"),
            max_workers=r.integer("ebb:maxWorkers", 1, MAX_WORKERS_LIMIT),
            architecture=r.choice("ebb:architecture", ("x86_64", "arm64")),
            log_retention_days=r.choice_int("ebb:logRetentionDays", _LOG_RETENTION_DAYS),
            max_azs=r.integer("ebb:maxAzs", 2, 6),
            egress=r.choice("ebb:egress", ("endpoints", "nat")),
            interface_endpoints=r.names("ebb:interfaceEndpoints", INTERFACE_ENDPOINT_NAMES),
            endpoint_azs=r.integer("ebb:endpointAzs", 1, 6),
            cache_mode=r.choice("ebb:cache", ("nodes", "serverless")),
            cache_engine=r.choice("ebb:cacheEngine", ("redis", "valkey")),
            cache_node_type=r.node_type("ebb:cacheNodeType"),
            cache_shards=r.integer("ebb:cacheShards", 1, 500),
            cache_replicas=r.integer("ebb:cacheReplicas", 0, 5),
            cache_serverless_max_gb=r.integer("ebb:cacheServerlessMaxGb", 1, 5000),
            checkpoint_expiry_days=r.integer("ebb:checkpointExpiryDays", 1, 3650),
            scratch_expiry_days=r.integer("ebb:scratchExpiryDays", 1, 3650),
            functions=functions,
        )
        settings._check_consistency()
        return settings

    def deployment(self) -> dict[str, object]:
        """What Validate must know of this deployment (`EBB_DEPLOYMENT`, read by
        `ebb.aws.deployment.Deployment`): the functions a job runs on, the cache it pays for,
        the concurrency it may use and the Map mode that bounds its history."""
        worker, supervisor = self.functions["worker"], self.functions["supervisor"]
        return {
            "worker_memory_mb": worker.memory_mb,
            "supervisor_memory_mb": supervisor.memory_mb,
            "supervisor_timeout_s": supervisor.timeout_seconds,
            "arch": self.architecture,
            "worker_reserved": worker.reserved_concurrency,
            "supervisor_reserved": supervisor.reserved_concurrency,
            "map": "distributed" if self.max_workers > names.INLINE_MAP_LIMIT else "inline",
            "cache_node_type": self.cache_node_type if self.cache_mode == "nodes" else None,
            "cache_nodes": self.cache_shards * (1 + self.cache_replicas) if self.cache_mode == "nodes" else 0,
        }

    def _check_consistency(self) -> None:
        if self.endpoint_azs > self.max_azs:
            raise SettingsError(f"ebb:endpointAzs ({self.endpoint_azs}) cannot exceed ebb:maxAzs ({self.max_azs})")
        worker = self.functions["worker"]
        if worker.reserved_concurrency is not None and worker.reserved_concurrency < self.max_workers:
            raise SettingsError(
                f"ebb:workerReservedConcurrency ({worker.reserved_concurrency}) is below ebb:maxWorkers "
                f"({self.max_workers}): a round's workers meet at a barrier every step, so all of them "
                "must be able to run at once; raise it or leave it null"
            )
        if self.functions["supervisor"].timeout_seconds > worker.timeout_seconds:
            raise SettingsError(
                f"ebb:supervisorTimeoutSeconds ({self.functions['supervisor'].timeout_seconds}) exceeds "
                f"ebb:workerTimeoutSeconds ({worker.timeout_seconds}): a round lasts the supervisor's timeout less a "
                "margin, and a worker stopped by its own timeout before the round ends fails the job; "
                "give the workers at least the supervisor's timeout"
            )


# The values CloudWatch Logs accepts for a retention period.
_LOG_RETENTION_DAYS = (
    1,
    3,
    5,
    7,
    14,
    30,
    60,
    90,
    120,
    150,
    180,
    365,
    400,
    545,
    731,
    1096,
    1827,
    2192,
    2557,
    2922,
    3288,
    3653,
)
# CDK's enum lists the same periods in the same order, then INFINITE.
_RETENTION = dict(zip(_LOG_RETENTION_DAYS, [r for r in logs.RetentionDays if r.name != "INFINITE"], strict=True))


class _Reader:
    def __init__(self, get: Callable[[str], Any]):
        self._get = get

    def _raw(self, key: str) -> Any:
        value = self._get(key)
        if value is None and key not in _NULLABLE:
            raise SettingsError(
                f"context key {key} is missing: set it in cdk.json (see docs/AWS.md) or pass -c {key}=..."
            )
        return value

    def integer(self, key: str, low: int, high: int, optional: bool = False) -> int | None:
        value = self._get(key)
        if isinstance(value, str):
            value = value.strip()
            if value.lower() in ("", "null", "none"):
                value = None
            else:
                try:
                    value = int(value)
                except ValueError:
                    raise SettingsError(f"{key} must be an integer in [{low}, {high}], got {value!r}") from None
        if value is None:
            if optional:
                return None
            raise SettingsError(
                f"context key {key} is missing: set it in cdk.json (see docs/AWS.md) or pass -c {key}=..."
            )
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise SettingsError(f"{key} must be an integer in [{low}, {high}], got {value!r}")
        return value

    def boolean(self, key: str) -> bool:
        value = self._raw(key)
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        if not isinstance(value, bool):
            raise SettingsError(f"{key} must be true or false, got {value!r}")
        return value

    def choice(self, key: str, allowed: tuple[str, ...]) -> str:
        value = self._raw(key)
        if value not in allowed:
            raise SettingsError(f"{key} must be one of {', '.join(allowed)}, got {value!r}")
        return value

    def choice_int(self, key: str, allowed: tuple[int, ...]) -> int:
        value = self.integer(key, min(allowed), max(allowed))
        if value not in allowed:
            raise SettingsError(
                f"{key} must be one of the retention periods CloudWatch Logs accepts "
                f"({', '.join(map(str, allowed))}), got {value}"
            )
        return value

    def names(self, key: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
        value = self._raw(key)
        if isinstance(value, str):  # -c ebb:interfaceEndpoints=secretsmanager,sqs
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list) or any(v not in allowed for v in value):
            raise SettingsError(f"{key} must be a list drawn from {', '.join(allowed)}, got {value!r}")
        return tuple(dict.fromkeys(value))

    def stack_name(self, key: str) -> str:
        value = self._raw(key)
        if not isinstance(value, str) or not _STACK_NAME.fullmatch(value) or value.endswith("-"):
            raise SettingsError(
                f"{key} must be 1-32 letters, digits and single hyphens, starting with a letter and not ending "
                f"with a hyphen (it prefixes queue and cache names), got {value!r}"
            )
        return value

    def bucket_name(self, key: str) -> str | None:
        value = self._get(key)
        if value is None or (isinstance(value, str) and value.strip().lower() in ("", "null", "none")):
            return None
        if not isinstance(value, str) or not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", value):
            raise SettingsError(
                f"{key} must be an S3 bucket name (3-63 lowercase letters, digits, dots and "
                f"hyphens) or null, got {value!r}"
            )
        return value

    def node_type(self, key: str) -> str:
        value = self._raw(key)
        if not isinstance(value, str) or not re.fullmatch(r"cache\.[a-z0-9]+\.[a-z0-9]+", value):
            raise SettingsError(f"{key} must be an ElastiCache node type such as cache.t4g.medium, got {value!r}")
        return value


_NULLABLE = {f"ebb:{name}ReservedConcurrency" for name in FUNCTION_NAMES} | {"ebb:dataBucketName"}
