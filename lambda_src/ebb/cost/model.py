"""Dollar cost of a job from what it measured (predictions for other fleet sizes and
memories are ``ebb.plan``'s, priced through ``ebb.cost.meter``).

Prices come from one JSON file with its region and date (``prices.json`` next to this
module by default; pass your own to ``load_prices``). Free tiers, Savings Plans and
same-region data transfer (free between Lambda, SNS, SQS, ElastiCache and S3) are not
modelled. S3 storage (GB-month) and CloudWatch are left out: for a training job they are
cents per month, unrelated to the choices the cost model is used for.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ebb.spec import AwsSpec, field_default

# The supervisor's memory when a usage or profile does not say: the job spec's default,
# which is the deployment's (cdk.json ebb:supervisorMemoryMb).
SUPERVISOR_MEMORY_MB: int = field_default(AwsSpec, "supervisor_memory_mb")
# Lambda allocates CPU in proportion to memory; 1,769 MB buys one full vCPU.
MB_PER_VCPU = 1769
# SNS publishes and SQS requests are billed per 64 KB chunk of payload.
BILLING_CHUNK_BYTES = 64 * 1024


class PricesError(ValueError):
    """A prices file is missing, unreadable or has a missing or invalid field."""


@dataclass(frozen=True)
class Prices:
    """Unit prices (see ``prices.json`` for each unit)."""

    region: str
    date: str
    currency: str
    source: str
    lambda_usd_per_gb_second: dict[str, float]
    lambda_usd_per_million_requests: float
    cache_usd_per_node_hour: dict[str, float]
    cache_serverless_usd_per_gb_hour: float
    cache_serverless_usd_per_million_ecpu: float
    cache_serverless_min_data_gb: float
    sns_usd_per_million_requests: float
    sqs_usd_per_million_requests: float
    s3_usd_per_thousand_put_list: float
    s3_usd_per_thousand_get: float
    sfn_usd_per_thousand_transitions: float
    path: str = ""


def load_prices(path: str | Path | None = None) -> Prices:
    """Read and validate a prices file; ``None`` loads the packaged ``prices.json``.

    Raises PricesError naming the file and the offending field.
    """
    if path is None:
        source = resources.files("ebb.cost").joinpath("prices.json")
        label = "packaged prices.json"
        try:
            text = source.read_text(encoding="utf-8")
        except OSError as exc:
            raise PricesError(f"cannot read {label}: {exc}") from exc
    else:
        label = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise PricesError(f"prices file not found: {label}") from None
        except OSError as exc:
            raise PricesError(f"cannot read prices file {label}: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PricesError(f"prices file {label} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise PricesError(f"prices file {label}: top level must be a JSON object")

    def get(dotted: str) -> Any:
        node: Any = data
        for key in dotted.split("."):
            if not isinstance(node, dict) or key not in node:
                raise PricesError(f"prices file {label}: missing field '{dotted}'")
            node = node[key]
        return node

    def text_field(dotted: str) -> str:
        value = get(dotted)
        if not isinstance(value, str) or not value.strip():
            raise PricesError(f"prices file {label}: '{dotted}' must be a non-empty string, got {value!r}")
        return value

    def price(dotted: str, value: Any = None) -> float:
        value = get(dotted) if value is None else value
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not is_number or not math.isfinite(value) or value < 0:
            raise PricesError(f"prices file {label}: '{dotted}' must be a non-negative number, got {value!r}")
        return float(value)

    def price_table(dotted: str) -> dict[str, float]:
        table = get(dotted)
        if not isinstance(table, dict) or not table:
            raise PricesError(f"prices file {label}: '{dotted}' must be a non-empty object of prices")
        return {str(key): price(f"{dotted}.{key}", value) for key, value in table.items()}

    return Prices(
        region=text_field("region"),
        date=text_field("date"),
        currency=text_field("currency"),
        source=text_field("source"),
        lambda_usd_per_gb_second=price_table("lambda.usd_per_gb_second"),
        lambda_usd_per_million_requests=price("lambda.usd_per_million_requests"),
        cache_usd_per_node_hour=price_table("elasticache.usd_per_node_hour"),
        cache_serverless_usd_per_gb_hour=price("elasticache.serverless.usd_per_gb_hour"),
        cache_serverless_usd_per_million_ecpu=price("elasticache.serverless.usd_per_million_ecpu"),
        cache_serverless_min_data_gb=price("elasticache.serverless.min_data_gb"),
        sns_usd_per_million_requests=price("sns.usd_per_million_requests"),
        sqs_usd_per_million_requests=price("sqs.usd_per_million_requests"),
        s3_usd_per_thousand_put_list=price("s3.usd_per_thousand_put_list"),
        s3_usd_per_thousand_get=price("s3.usd_per_thousand_get"),
        sfn_usd_per_thousand_transitions=price("step_functions.usd_per_thousand_transitions"),
        path=label,
    )


def chunks_64k(nbytes: int) -> int:
    """Billed requests for one SNS publish / SQS request carrying ``nbytes`` of payload.

    Each started 64 KB (65,536 bytes) chunk counts as one request; a request with an
    empty payload (e.g. an empty long-poll receive) still counts as one.
    """
    if nbytes < 0:
        raise ValueError(f"payload size must be >= 0, got {nbytes}")
    return max(1, -(-int(nbytes) // BILLING_CHUNK_BYTES))


@dataclass
class Usage:
    """What a job consumed, as the engine measures it.

    Lambda: ``worker_seconds`` is the sum over worker invocations of billed seconds
    (each rounded up to 1 ms by the caller), at ``memory_mb``; the supervisor likewise;
    ``invocations`` counts every Lambda invocation (workers, supervisor, prepare,
    finalize). Cache: node-based clusters are charged for ``wall_seconds`` (the job's
    wall time) pro rata: the assumption is a cluster that outlives the job and is shared
    by jobs. A cluster created for one job is billed by started node-hour; set
    ``cache_bill_full_hours`` for that. Serverless cache: ``cache_data_gb`` is the
    average data stored over ``wall_seconds``, ``cache_ecpu`` the ECPUs consumed.
    SNS/SQS: billed 64 KB chunks; ``add_sns_publish``/``add_sqs_request`` count them
    from payload sizes. S3 requests and Step Functions transitions are plain counts.
    """

    worker_seconds: float = 0.0
    memory_mb: int = MB_PER_VCPU
    supervisor_seconds: float = 0.0
    supervisor_memory_mb: int = SUPERVISOR_MEMORY_MB
    arch: str = "x86_64"
    invocations: int = 0
    wall_seconds: float = 0.0
    cache_node_type: str | None = None
    cache_nodes: int = 0
    cache_bill_full_hours: bool = False
    cache_serverless: bool = False
    cache_data_gb: float = 0.0
    cache_ecpu: float = 0.0
    sns_chunks: int = 0
    sqs_chunks: int = 0
    s3_get: int = 0
    s3_put: int = 0
    s3_list: int = 0
    sfn_transitions: int = 0

    def add_sns_publish(self, nbytes: int) -> None:
        """Count one Publish/PublishBatch request whose messages total ``nbytes``."""
        self.sns_chunks += chunks_64k(nbytes)

    def add_sqs_request(self, nbytes: int = 0) -> None:
        """Count one SQS request (send, receive, delete) moving ``nbytes`` of payload."""
        self.sqs_chunks += chunks_64k(nbytes)

    def to_dict(self) -> dict:
        """JSON-able form (``Usage(**d)`` restores it)."""
        return asdict(self)


def _check_usage(usage: Usage, prices: Prices) -> None:
    for name in (
        "worker_seconds",
        "supervisor_seconds",
        "invocations",
        "wall_seconds",
        "cache_nodes",
        "cache_data_gb",
        "cache_ecpu",
        "sns_chunks",
        "sqs_chunks",
        "s3_get",
        "s3_put",
        "s3_list",
        "sfn_transitions",
    ):
        value = getattr(usage, name)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"usage.{name} must be a non-negative number, got {value!r}")
    for name in ("memory_mb", "supervisor_memory_mb"):
        if not 128 <= getattr(usage, name) <= 10240:
            raise ValueError(f"usage.{name} must be within Lambda's 128..10240 MB, got {getattr(usage, name)!r}")
    if usage.arch not in prices.lambda_usd_per_gb_second:
        raise ValueError(
            f"no Lambda price for arch {usage.arch!r} in {prices.path}; "
            f"known: {sorted(prices.lambda_usd_per_gb_second)}"
        )
    if usage.cache_nodes and usage.cache_serverless:
        raise ValueError("usage has both cache nodes and a serverless cache; a job uses one")
    if usage.cache_nodes and usage.cache_node_type not in prices.cache_usd_per_node_hour:
        raise ValueError(
            f"no ElastiCache price for node type {usage.cache_node_type!r} in {prices.path}; "
            f"known: {sorted(prices.cache_usd_per_node_hour)}"
        )


def estimate_cost(usage: Usage, prices: Prices) -> dict:
    """Cost of ``usage`` at ``prices``: ``{"total_usd", "by_component": {...}, ...}``.

    Components: lambda_workers, lambda_supervisor, lambda_requests, cache, sns, sqs, s3,
    step_functions (all in ``prices.currency``). Also returns the currency, region and
    price date so a report states which prices it used.
    """
    _check_usage(usage, prices)
    gb_second = prices.lambda_usd_per_gb_second[usage.arch]
    hours = usage.wall_seconds / 3600.0
    if usage.cache_serverless:
        stored_gb = max(usage.cache_data_gb, prices.cache_serverless_min_data_gb)
        cache = (
            stored_gb * hours * prices.cache_serverless_usd_per_gb_hour
            + usage.cache_ecpu / 1e6 * prices.cache_serverless_usd_per_million_ecpu
        )
    elif usage.cache_nodes:
        node_hours = math.ceil(hours) if usage.cache_bill_full_hours else hours
        cache = usage.cache_nodes * node_hours * prices.cache_usd_per_node_hour[usage.cache_node_type]
    else:
        cache = 0.0
    by_component = {
        "lambda_workers": usage.worker_seconds * usage.memory_mb / 1024.0 * gb_second,
        "lambda_supervisor": usage.supervisor_seconds * usage.supervisor_memory_mb / 1024.0 * gb_second,
        "lambda_requests": usage.invocations / 1e6 * prices.lambda_usd_per_million_requests,
        "cache": cache,
        "sns": usage.sns_chunks / 1e6 * prices.sns_usd_per_million_requests,
        "sqs": usage.sqs_chunks / 1e6 * prices.sqs_usd_per_million_requests,
        "s3": (usage.s3_put + usage.s3_list) / 1e3 * prices.s3_usd_per_thousand_put_list
        + usage.s3_get / 1e3 * prices.s3_usd_per_thousand_get,
        "step_functions": usage.sfn_transitions / 1e3 * prices.sfn_usd_per_thousand_transitions,
    }
    return {
        "total_usd": sum(by_component.values()),
        "by_component": by_component,
        "currency": prices.currency,
        "region": prices.region,
        "prices_date": prices.date,
    }


def perf_per_dollar(wall_seconds: float, total_usd: float) -> float:
    """MLLess's composite metric ``1 / (execution time in s × price in $)``; higher is better."""
    if not wall_seconds > 0 or not total_usd > 0:
        raise ValueError(f"perf_per_dollar needs positive time and cost, got {wall_seconds} s and ${total_usd}")
    return 1.0 / (wall_seconds * total_usd)


def would_exceed(projected_usd: float, budget_usd: float | None, margin: float = 0.05) -> bool:
    """True when ``projected_usd`` passes the budget less a safety ``margin`` (a fraction).

    The supervisor passes what the job will have cost after its next step or round
    (cost so far + the current cost rate × that time); stopping at ``(1 - margin) ×
    budget`` leaves room for what is billed after the stop (final merge, evaluation,
    report, the last state transitions). ``budget_usd=None`` means no budget.
    """
    if budget_usd is None:
        return False
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"margin must be in [0, 1), got {margin}")
    return projected_usd > budget_usd * (1.0 - margin)
