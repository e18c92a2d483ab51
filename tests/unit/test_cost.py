"""Cost model: hand-computed bills per component, 64 KB chunking, prices files, predictor."""

from __future__ import annotations

import json
import re

import pytest

from ebb.cost import (
    PricesError,
    Usage,
    chunks_64k,
    estimate_cost,
    load_prices,
    perf_per_dollar,
    would_exceed,
)


@pytest.fixture(scope="module")
def prices():
    return load_prices()


def packaged_prices_dict() -> dict:
    from importlib import resources

    return json.loads(resources.files("ebb.cost").joinpath("prices.json").read_text())


def test_packaged_prices_are_dated_and_as_listed(prices):
    assert (prices.region, prices.date, prices.currency) == ("us-east-1", "2026-11", "USD")
    assert prices.lambda_usd_per_gb_second == {"x86_64": 0.0000166667, "arm64": 0.0000133334}
    assert prices.cache_usd_per_node_hour["cache.t4g.small"] == 0.032
    assert prices.sns_usd_per_million_requests == 0.50


def test_each_component_matches_a_hand_computed_bill(prices):
    usage = Usage(
        worker_seconds=10 * 100.0,  # 10 workers x 100 s
        memory_mb=2048,  # 2 GB
        supervisor_seconds=100.0,
        supervisor_memory_mb=1024,
        arch="x86_64",
        invocations=11,
        wall_seconds=1800.0,  # half an hour
        cache_node_type="cache.t4g.small",
        cache_nodes=2,
        sns_chunks=2_000_000,
        sqs_chunks=1_000_000,
        s3_get=10_000,
        s3_put=600,
        s3_list=400,
        sfn_transitions=4_000,
    )
    cost = estimate_cost(usage, prices)
    parts = cost["by_component"]
    assert parts["lambda_workers"] == pytest.approx(1000 * 2 * 0.0000166667)  # 0.0333334
    assert parts["lambda_supervisor"] == pytest.approx(100 * 1 * 0.0000166667)
    assert parts["lambda_requests"] == pytest.approx(11 * 0.20 / 1e6)
    assert parts["cache"] == pytest.approx(2 * 0.5 * 0.032)  # 2 nodes x 0.5 h, pro rata
    assert parts["sns"] == pytest.approx(1.00)
    assert parts["sqs"] == pytest.approx(0.40)
    assert parts["s3"] == pytest.approx(1000 / 1000 * 0.005 + 10_000 / 1000 * 0.0004)  # 0.009
    assert parts["step_functions"] == pytest.approx(0.10)
    assert cost["total_usd"] == pytest.approx(sum(parts.values()))
    assert (cost["currency"], cost["region"], cost["prices_date"]) == ("USD", "us-east-1", "2026-11")

    arm = estimate_cost(Usage(worker_seconds=1000.0, memory_mb=2048, arch="arm64"), prices)
    assert arm["by_component"]["lambda_workers"] == pytest.approx(1000 * 2 * 0.0000133334)
    per_hour = Usage(wall_seconds=1800.0, cache_node_type="cache.t4g.small", cache_nodes=2, cache_bill_full_hours=True)
    hourly = estimate_cost(per_hour, prices)
    assert hourly["by_component"]["cache"] == pytest.approx(2 * 1 * 0.032)  # a started hour is a full hour


def test_serverless_cache_bills_storage_with_minimum_and_ecpu(prices):
    usage = Usage(wall_seconds=7200.0, cache_serverless=True, cache_data_gb=0.2, cache_ecpu=5_000_000)
    # 0.2 GB is metered as the 1 GB minimum: 1 GB x 2 h x 0.125 + 5 M ECPU x 0.0034 / M.
    assert estimate_cost(usage, prices)["by_component"]["cache"] == pytest.approx(0.25 + 0.017)
    usage.cache_data_gb = 3.0
    assert estimate_cost(usage, prices)["by_component"]["cache"] == pytest.approx(3 * 2 * 0.125 + 0.017)


def test_64k_chunking():
    assert chunks_64k(0) == 1  # an empty receive is still a billed request
    assert chunks_64k(1) == 1
    assert chunks_64k(65_536) == 1
    assert chunks_64k(65_537) == 2
    assert chunks_64k(256 * 1024) == 4
    usage = Usage()
    usage.add_sns_publish(200_000)  # one PublishBatch with 200 KB in total: 4 chunks
    usage.add_sns_publish(10)
    usage.add_sqs_request()
    usage.add_sqs_request(130_000)  # 1.98 chunks: 2
    assert (usage.sns_chunks, usage.sqs_chunks) == (5, 3)
    with pytest.raises(ValueError):
        chunks_64k(-1)


def test_custom_prices_file_is_used(tmp_path, prices):
    data = packaged_prices_dict()
    data["region"] = "eu-west-1"
    data["lambda"]["usd_per_gb_second"]["x86_64"] = 2 * 0.0000166667
    path = tmp_path / "my-prices.json"
    path.write_text(json.dumps(data))
    custom = load_prices(path)
    usage = Usage(worker_seconds=500.0, memory_mb=1024)
    assert custom.region == "eu-west-1"
    assert estimate_cost(usage, custom)["total_usd"] == pytest.approx(2 * estimate_cost(usage, prices)["total_usd"])


@pytest.mark.parametrize(
    "mutate, message",
    [
        (
            lambda d: d["lambda"].pop("usd_per_million_requests"),
            "missing field 'lambda.usd_per_million_requests'",
        ),
        (
            lambda d: d["sqs"].update(usd_per_million_requests=-0.4),
            "'sqs.usd_per_million_requests' must be a non-negative number",
        ),
        (
            lambda d: d["elasticache"]["usd_per_node_hour"].update({"cache.t4g.micro": "cheap"}),
            "'elasticache.usd_per_node_hour.cache.t4g.micro' must be a non-negative number",
        ),
        (lambda d: d.update(date=""), "'date' must be a non-empty string"),
    ],
)
def test_invalid_prices_file_gives_a_clear_error(tmp_path, mutate, message):
    data = packaged_prices_dict()
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PricesError, match=re.escape(message)):
        load_prices(path)


def test_unreadable_prices_files(tmp_path):
    with pytest.raises(PricesError, match="not found"):
        load_prices(tmp_path / "absent.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{ not json")
    with pytest.raises(PricesError, match="not valid JSON"):
        load_prices(broken)


def test_usage_errors_name_the_problem(prices):
    with pytest.raises(ValueError, match="arch 'sparc'"):
        estimate_cost(Usage(arch="sparc"), prices)
    with pytest.raises(ValueError, match="node type 'cache.x9.huge'"):
        estimate_cost(Usage(cache_node_type="cache.x9.huge", cache_nodes=1), prices)
    with pytest.raises(ValueError, match="worker_seconds"):
        estimate_cost(Usage(worker_seconds=-1.0), prices)


def test_perf_per_dollar():
    assert perf_per_dollar(100.0, 0.5) == pytest.approx(0.02)
    # 10 % faster and 30 % cheaper: Perf/$ improves by 1 / (0.9 x 0.7).
    assert perf_per_dollar(90.0, 0.35) / perf_per_dollar(100.0, 0.5) == pytest.approx(1 / 0.63)
    with pytest.raises(ValueError):
        perf_per_dollar(100.0, 0.0)


def test_would_exceed_budget_with_margin():
    assert not would_exceed(0.90, 1.00)  # below 95 % of the budget
    assert would_exceed(0.96, 1.00)  # inside the 5 % safety margin
    assert not would_exceed(0.96, 1.00, margin=0.0)
    assert not would_exceed(1e6, None)  # no budget


def test_a_job_in_a_trial_pack_pays_what_it_adds_and_the_pack_pays_the_execution_once():
    """In a pack (``packed``) a job's transitions and invocations are the pack's; its outputs
    are priced where its report writes them. The pack's own bill: one execution (its states,
    two per worker invocation), a wave of P workers and a supervisor, its start-up seconds."""
    from ebb.cost.meter import JobAccount, pack_usage, packed, usage_of
    from ebb.spec import load_spec

    spec = load_spec(overrides={"model": "pmf", "data": "data/x", "workers": 4})
    account = JobAccount(
        wall_seconds=10.0, worker_seconds=40.0, rounds=2, worker_invocations=8, object_puts=10, output_puts=1
    )
    alone = usage_of(spec, account)
    assert (alone.sfn_transitions, alone.invocations, alone.s3_put) == (4 + 2 * 4 + 2 * 8, 8 + 2, 10 + 3)
    with packed():
        inside = usage_of(spec, account)
    assert (inside.sfn_transitions, inside.invocations, inside.s3_put) == (0, 0, 10 + 1)
    assert (inside.worker_seconds, inside.supervisor_seconds, inside.wall_seconds) == (40.0, 10.0, 10.0)
    assert usage_of(spec, account).sfn_transitions == alone.sfn_transitions  # only within the block

    pack = pack_usage(spec, seconds=3.5, waves=2, object_gets=4 * 10, object_puts=6)
    assert pack.sfn_transitions == 4 + 2 * (4 + 2 * 4) and pack.invocations == 2 * (4 + 1)
    assert (pack.worker_seconds, pack.supervisor_seconds, pack.wall_seconds) == (4 * 3.5, 3.5, 3.5)
    assert (pack.s3_get, pack.s3_put) == (40, 6)
