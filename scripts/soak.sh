#!/usr/bin/env bash
# A longer soak of setup mode's differential harness (tests/exactness_harness.py): N random real loops on real gloo
# ranks, each against the one-process reference. Default 2000 cases (the suite runs 200).
#   bash scripts/soak.sh [CASES] [FIRST_SEED]
set -euo pipefail
cd "$(dirname "$0")/.."
cases="${1:-2000}"
seed="${2:-0}"
export FLODL_HF_EXACTNESS_CASES="$cases" FLODL_HF_EXACTNESS_SEED="$seed"
exec bash scripts/test.sh tests/distributed/setup/test_exactness.py -q -p no:cacheprovider
