#!/usr/bin/env bash
# Set up, then run the main job locally on the embedded default: generate planted
# ratings, prepare them into minibatches, and train PMF with 4 worker processes over a
# private redis-server (ISP sync, scale-in auto-tuner), printing the result.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
mkdir -p data
[ -f data/ratings.csv ] || ebb synth ratings --out data/ratings.csv --seed 0
[ -f data/ratings/manifest.json ] || ebb prepare --format movielens --input data/ratings.csv --out data/ratings
ebb train examples/pmf.yaml "$@"
