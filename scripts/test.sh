#!/usr/bin/env bash
# Set up, then run the whole test suite (starts its own redis-servers on free ports) on every
# core: pytest-xdist, one worker per core (EBB_TEST_JOBS overrides; `-n 0` in the arguments runs
# it in one process). Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/unit`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -n "${EBB_TEST_JOBS:-auto}" --dist loadgroup "$@"
