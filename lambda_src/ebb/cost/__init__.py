"""Dollar cost of a job by component, from measured usage and a dated prices file."""

from .model import (
    BILLING_CHUNK_BYTES,
    MB_PER_VCPU,
    Prices,
    PricesError,
    Usage,
    chunks_64k,
    estimate_cost,
    load_prices,
    perf_per_dollar,
    would_exceed,
)

__all__ = [
    "BILLING_CHUNK_BYTES",
    "MB_PER_VCPU",
    "Prices",
    "PricesError",
    "Usage",
    "chunks_64k",
    "estimate_cost",
    "load_prices",
    "perf_per_dollar",
    "would_exceed",
]
