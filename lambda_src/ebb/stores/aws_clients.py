"""boto3 clients with Ebb's bounded waits: every AWS call the runtime makes (S3, SNS, SQS,
Secrets Manager, Lambda) goes through :func:`client`, so an endpoint that accepts
connections and never answers fails each call within :func:`silent_endpoint_bound_s`
(docs/RELIABILITY.md, "Bounds"). boto3's usual configuration still applies: credentials
chain, region, ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_<SERVICE>`` for an emulator.
"""

from __future__ import annotations

import threading

import boto3
from botocore.config import Config
from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError

# "standard" retries throttling, 5xx and connection errors with jittered exponential
# backoff; a fleet of workers reading one prefix meets S3's SlowDown, hence more attempts
# than the default 3. An endpoint that does not answer at all is another matter: a connect
# or read timeout is tried TIMEOUT_ATTEMPTS times in all. The read timeout is the longest
# pause between two reads of a socket, not a transfer's duration: a 16 MiB part on a slow
# link still meets it as long as bytes keep coming. botocore's defaults (60 s, 3-5
# attempts) would leave a silent SQS or SNS endpoint holding a worker for minutes.
MAX_ATTEMPTS = 6
TIMEOUT_ATTEMPTS = 2
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 20.0
# Standard mode's backoff before attempt i+1 for an error other than throttling is at most
# 50 ms x 2**i (botocore.retries.standard.ExponentialBackoff).
_BACKOFF_BASE_S = 0.05

_session: boto3.session.Session | None = None
_session_lock = threading.Lock()


def silent_endpoint_bound_s(read_timeout_s: float | None = None) -> float:
    """Longest one call waits on an endpoint that accepts connections (or not) and never
    answers: every timed-out attempt, and the backoff between them."""
    read = READ_TIMEOUT_S if read_timeout_s is None else read_timeout_s
    backoff = sum(_BACKOFF_BASE_S * 2**i for i in range(TIMEOUT_ATTEMPTS - 1))
    return TIMEOUT_ATTEMPTS * (CONNECT_TIMEOUT_S + read) + backoff


def _stop_retrying_timeouts(caught_exception=None, attempts=0, request_dict=None, **_kwargs):
    """``needs-retry`` hook: a timed-out attempt is not tried again past TIMEOUT_ATTEMPTS
    (raising here ends the call with that timeout; returning None leaves the decision to
    the standard retry handler)."""
    if isinstance(caught_exception, (ConnectTimeoutError, ReadTimeoutError)):
        context = request_dict.setdefault("context", {}) if request_dict is not None else {}
        context["ebb_timeouts"] = context.get("ebb_timeouts", 0) + 1
        if context["ebb_timeouts"] >= TIMEOUT_ATTEMPTS:
            raise caught_exception
    return None


def client(service: str, *, region: str | None = None, read_timeout_s: float | None = None, pool: int = 10):
    """A boto3 client for ``service`` with Ebb's retry and timeout settings.

    ``read_timeout_s`` replaces READ_TIMEOUT_S for calls that wait by design (an SQS long
    poll must be given longer than its WaitTimeSeconds). Clients come from one boto3
    session per process, which parses each service model once (a fresh session costs
    ~100 ms per client); sessions are not thread-safe, hence the lock.
    """
    global _session
    config = Config(
        retries={"mode": "standard", "max_attempts": MAX_ATTEMPTS},
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S if read_timeout_s is None else read_timeout_s,
        max_pool_connections=pool,
    )
    with _session_lock:
        if _session is None:
            _session = boto3.session.Session()
        made = _session.client(service, region_name=region, config=config)
    service_id = made.meta.service_model.service_id.hyphenize()
    made.meta.events.register_first(f"needs-retry.{service_id}", _stop_retrying_timeouts)
    return made
