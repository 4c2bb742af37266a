#!/usr/bin/env bash
# Runs transformers' own Trainer test files against ElCheTrainer on one CPU process, the way a drop-in Trainer is
# judged: twice, once as they are and once with ElCheTrainer put in transformers.Trainer's place before the test
# modules load, then lists every test that passes with Trainer and not with ElCheTrainer (exit 1 if there is one).
#
# The files are transformers' (its repository's tests/trainer/), not this project's: they are read from where you
# keep them and copied into a temporary folder that this script creates and removes.
#
# usage: bash scripts/hf_trainer_tests.sh DIR [pytest args]
#   DIR  a folder holding trainer_test_utils.py and test_trainer*.py from transformers' tests/trainer/
#   FLODL_HF_PYTHON  the Python to run (default: this checkout's .venv)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${FLODL_HF_PYTHON:-$here/.venv/bin/python}"
src="${1:-}"
if [[ -z "$src" || ! -f "$src/trainer_test_utils.py" ]]; then
    echo "hf_trainer_tests: give the folder of transformers' tests/trainer files (it must hold trainer_test_utils.py)," \
         "e.g. bash scripts/hf_trainer_tests.sh ~/transformers/tests/trainer" >&2
    exit 2
fi
shift
if [[ ! -x "$python" ]]; then
    echo "hf_trainer_tests: no Python at $python; run 'bash scripts/bootstrap.sh test' first or set FLODL_HF_PYTHON" >&2
    exit 2
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/flodl-hf-trainer-tests.XXXXXX")"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/tests/trainer" "$work/deps"
cp "$src"/trainer_test_utils.py "$src"/test_trainer*.py "$work/tests/trainer/"
: > "$work/tests/__init__.py"
: > "$work/tests/trainer/__init__.py"
printf '[pytest]\nmarkers =\n    torch_compile_test\n    flash_attn_test\n' > "$work/pytest.ini"
cat > "$work/conftest.py" <<'PY'
"""With FLODL_SWAP=1, ElCheTrainer is transformers.Trainer for every test module that imports it."""
import os

if os.environ.get("FLODL_SWAP") == "1":
    import transformers
    import transformers.trainer

    from flodl_hf.integrations import ElCheTrainer

    transformers.Trainer = ElCheTrainer
    transformers.trainer.Trainer = ElCheTrainer
PY

# test_trainer_evaluation.py imports two classes that transformers 5 removed (its @slow tests use them): where they
# are gone, the copy imports them guarded, as None
"$python" - "$work/tests/trainer" <<'PY'
import pathlib
import re
import sys

try:
    from transformers import GlueDataset  # noqa: F401
except ImportError:
    line = re.compile(r"^ +(GlueDataset|GlueDataTrainingArguments),\n", flags=re.M)
    for path in pathlib.Path(sys.argv[1]).glob("test_trainer*.py"):
        text = path.read_text()
        names = line.findall(text)
        if names:
            path.write_text(line.sub("", text) + "\n" + " = ".join(names) + " = None  # removed in transformers 5\n")
PY

# transformers' test files import parameterized, which is not one of this project's dependencies
if ! "$python" -c "import parameterized" 2>/dev/null; then
    "$python" -m pip install --quiet --disable-pip-version-check --target "$work/deps" parameterized >/dev/null 2>&1 || {
        echo "hf_trainer_tests: transformers' tests need the package 'parameterized', which could not be installed" \
             "(pip install parameterized into $python's environment, then run again)" >&2
        exit 2
    }
fi

run() {  # $1: plain | swap
    (cd "$work" && env HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
        PYTHONPATH="$work/deps:$here" FLODL_SWAP="$([[ $1 == swap ]] && echo 1 || echo 0)" \
        "$python" -m pytest -p no:cacheprovider -q -rA --timeout 300 tests/trainer "${@:2}" > "$work/$1.txt" 2>&1) || true
    # the summary line, not a progress bar that a test's Trainer leaves on stderr after it
    echo "$1: $(grep -E '(passed|failed|error|skipped|deselected).* in [0-9.]+s' "$work/$1.txt" | tail -n 1)"
}
echo "transformers.Trainer, then ElCheTrainer in its place, on one process (Hub tests fail offline in both):"
run plain "$@"
run swap "$@"

{ grep -E '^PASSED ' "$work/plain.txt" || true; } | cut -d' ' -f2 | sort > "$work/plain.passed"
{ grep -E '^PASSED ' "$work/swap.txt" || true; } | cut -d' ' -f2 | sort > "$work/swap.passed"
lost="$(comm -23 "$work/plain.passed" "$work/swap.passed")"
if [[ -n "$lost" ]]; then
    echo "passes with Trainer, not with ElCheTrainer:"
    echo "$lost"
    exit 1
fi
echo "every test that passes with Trainer passes with ElCheTrainer ($(wc -l < "$work/plain.passed") tests)"
