#!/usr/bin/env bash
# Two machines, one process each (set NODE_RANK=0 on the first and NODE_RANK=1 on the second, and MASTER_ADDR to
# the first machine's address). To try it on one machine, run it twice in two terminals with MASTER_ADDR=127.0.0.1:
#   NODE_RANK=0 bash examples/multinode.sh  &  NODE_RANK=1 bash examples/multinode.sh
set -euo pipefail
cd "$(dirname "$0")/.."
exec torchrun --nnodes 2 --node-rank "${NODE_RANK:?set NODE_RANK to 0 or 1}" --nproc-per-node "${NPROC:-1}" \
  --master-addr "${MASTER_ADDR:-127.0.0.1}" --master-port "${MASTER_PORT:-29511}" examples/quickstart.py "$@"
