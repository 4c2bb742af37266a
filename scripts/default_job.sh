#!/usr/bin/env bash
# The main job on the embedded default: fine-tune the packaged MiniLM on the packaged sentiment corpus, evaluate
# on a held-out split, and write an HF-loadable model, metrics, a loss curve and a model card. Extra arguments
# go to `flodl-hf train` (see `flodl-hf train --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh run
venv="${FLODL_HF_VENV:-.venv}"
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
exec "$venv/bin/flodl-hf" train "$@"
