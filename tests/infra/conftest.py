"""Infrastructure tests: each variant of the CDK app is synthesised once per session and shared.

- `default`: cdk.json as it ships.
- `scaled`: a large deployment: 64 workers (Distributed Map), NAT egress, a sharded and
  replicated cache, worker concurrency reserved, the data kept on `cdk destroy`; for a
  region and account, as a real deploy is.
- `serverless`: the serverless cache, Valkey engine, and a data bucket kept from an earlier
  deployment (imported, not created); for a region.

cdk-nag runs in every synthesis and any unacknowledged finding makes it raise, so each
fixture is also a nag check of its variant. Run this layer alone with
`pytest tests/infra` (or `-m infra`).
"""

from __future__ import annotations

import pytest

from tests.helpers.infra import (
    ROOT,
    SCALED,
    SCALED_ENV,
    SERVERLESS,
    SERVERLESS_ENV,
    Synthesis,
    cdk_cli_synth,
    synthesise,
)

# The two slow checks run as subprocesses started as early as possible, so that they overlap
# the in-process syntheses: `npx cdk synth` at the start of the session, cfn-lint right after
# each synthesis. Each starts only when the test that reads it is selected.
CLI_TEST = "test_npx_cdk_synth_works_offline"
LINT_TEST = "test_cfn_lint_is_clean"
WHEELS_TEST = "test_every_package_of_the_image_installs_as_a_wheel_on_its_base"


def _selected(request, name: str) -> bool:
    return any(item.name == name for item in request.session.items)


def _stop(process) -> None:
    if process is not None and process.poll() is None:
        process.kill()
        process.wait()


@pytest.fixture(scope="session", autouse=True)
def cli_synth(request, tmp_path_factory):
    """(process, outdir) of `npx cdk synth`, started when the first infrastructure test runs."""
    if not _selected(request, CLI_TEST) or not (ROOT / "node_modules" / ".bin" / "cdk").exists():
        yield None, None
        return
    outdir = tmp_path_factory.mktemp("cdk-cli")
    process = cdk_cli_synth(outdir)
    yield process, outdir
    _stop(process)


@pytest.fixture(scope="session", autouse=True)
def wheel_checks(request, tmp_path_factory):
    """{check: [(pip process, report folder), ...]}: the image's wheel resolution for each
    architecture, and for the Python 3.11 base (which must fail), started with the session
    (they wait on the package registry, not on this machine)."""
    if not _selected(request, WHEELS_TEST):
        yield None
        return
    import os
    import subprocess

    from stacks.image import wheel_resolution

    # The registry as a Docker build sees it: none of this machine's pip configuration.
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    checks = {}
    for name, arch, python in (("x86_64", "x86_64", None), ("arm64", "arm64", None), ("python3.11", "x86_64", "3.11")):
        folder = tmp_path_factory.mktemp(f"wheels-{name}")
        commands = wheel_resolution(ROOT / "lambda_src", arch, folder, python=python)[: 1 if python else None]
        checks[name] = [
            (subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), folder)
            for c in commands
        ]
    yield checks
    for processes in checks.values():
        for process, _ in processes:
            _stop(process)


def _variant(request, tmp_path_factory, name: str, context: dict | None, **env):
    synth = synthesise(tmp_path_factory.mktemp(f"cdk-{name}"), context, lint=_selected(request, LINT_TEST), **env)
    yield synth
    _stop(synth.lint)


@pytest.fixture(scope="session")
def default(request, tmp_path_factory) -> Synthesis:
    yield from _variant(request, tmp_path_factory, "default", None)


@pytest.fixture(scope="session")
def scaled(request, tmp_path_factory) -> Synthesis:
    yield from _variant(request, tmp_path_factory, "scaled", SCALED, **SCALED_ENV)


@pytest.fixture(scope="session")
def serverless(request, tmp_path_factory) -> Synthesis:
    yield from _variant(request, tmp_path_factory, "serverless", SERVERLESS, **SERVERLESS_ENV)
