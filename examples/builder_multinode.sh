#!/usr/bin/env bash
# Builder mode on two nodes. On two machines: run this on each with NODE_RANK=0 / NODE_RANK=1 and MASTER_ADDR set
# to the first machine's address, POLICY=sync|cadence|async (one policy per launch).
# On one machine (no NODE_RANK): both "nodes" start here on localhost (gloo on CPU), every policy in turn, then SYNC's
# one-process reference, and scripts/check_multinode.py compares them (coverage, SYNC == one process, accuracies).
#   bash examples/builder_multinode.sh [OUT_DIR] [extra args for builder_multinode.py, e.g. --rows 512]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd -P)"  # this checkout's examples/
cd "$(dirname "$0")/.."
py="${PYTHON:-}"
[[ -n "$py" ]] || { [[ -x .venv/bin/python ]] && py=.venv/bin/python || py=python; }
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
launch() {  # launch NODE_RANK OUT POLICY EXTRA...
  local node="$1" out="$2" policy="$3"
  shift 3
  "$py" -m torch.distributed.run --nnodes 2 --node-rank "$node" --nproc-per-node "${NPROC:-1}" \
    --master-addr "${MASTER_ADDR:-127.0.0.1}" --master-port "${MASTER_PORT:-29512}" \
    "$here/builder_multinode.py" "$out" --policy "$policy" "$@"
}
if [[ -n "${NODE_RANK:-}" ]]; then
  out="${1:-multinode-out}"
  shift || true
  launch "$NODE_RANK" "$out/${POLICY:-sync}" "${POLICY:-sync}" "$@"
  exit
fi
out="${1:-multinode-out}"
shift || true
mkdir -p "$out"
# a free port for this machine's rendezvous (two machines: pass MASTER_PORT to both)
export MASTER_PORT="${MASTER_PORT:-$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( ($(nproc) + 1) / 2 ))}"  # two ranks share this machine's cores
for policy in sync cadence async; do
  launch 0 "$out/$policy" "$policy" "$@" & node0=$!
  launch 1 "$out/$policy" "$policy" "$@" > "$out/node1-$policy.log" 2>&1 & node1=$!
  wait "$node0"
  wait "$node1"
done
"$py" "$here/builder_multinode.py" "$out/reference" --reference "$@"
"$py" "$here/../scripts/check_multinode.py" "$out" "$@"
