#!/usr/bin/env bash
# Set up, then run the whole test suite (starts its own redis-servers on free ports).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
