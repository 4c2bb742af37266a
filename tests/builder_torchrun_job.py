"""A builder-mode job for torchrun (no tests here): ``tests/distributed/builder/test_builder_torchrun.py`` starts it on two
``torchrun`` agents (two "nodes" on localhost, gloo) and judges it from outside.

Every rank logs the sample indices of every batch it trains on (``OUT/rank<R>.jsonl``), so coverage is checked
against what the workers saw, not against the engine's metrics. Rank 0 saves the result (``OUT/state.safetensors``)
and the epochs it saw (``OUT/metrics.json``). ``--slow-ms`` slows each batch and ``--mark-after N`` writes
``OUT/started.json`` (this rank's pid and its torchrun agent's) after N batches, for the lost-node test. A failed
run prints the builder's one line and exits 1, as a user's script would.

Usage: ``torchrun ... tests/builder_torchrun_job.py OUT --policy SYNC [--epochs 2] [--ckpt DIR] [--resume PATH]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import builder_exact_helpers as ex  # noqa: E402


class WithIds(torch.utils.data.Dataset):
    """``ex.Indexed`` whose items also carry their index (the coverage log)."""

    def __init__(self, n: int) -> None:
        self.inner = ex.Indexed(n)

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int):
        x, y = self.inner[i]
        return x, y, i


def main() -> int:
    from flodl_hf import ApplyPolicy, Trainer
    from flodl_hf.distributed.errors import DistributedError

    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--policy", default="SYNC")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=96)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--anchor", type=int, default=2)
    p.add_argument("--ckpt")
    p.add_argument("--resume")
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--mark-after", type=int, default=0)
    a = p.parse_args()
    rank = int(os.environ["RANK"])
    os.makedirs(a.out, exist_ok=True)
    log = open(os.path.join(a.out, f"rank{rank}.jsonl"), "a")
    seen = [0]

    def train_fn(model, batch):  # a closure: under torchrun nothing is pickled
        x, y, ids = batch
        log.write(json.dumps(sorted(int(i) for i in ids)) + "\n")
        log.flush()
        seen[0] += 1
        if a.mark_after and seen[0] == a.mark_after:
            with open(os.path.join(a.out, f"started{rank}.json"), "w") as f:
                json.dump({"pid": os.getpid(), "agent": os.getppid()}, f)
        if a.slow_ms:
            time.sleep(a.slow_ms / 1000.0)
        return ex.loss_fn(model, (x, y))

    b = (Trainer.builder(ex.make_model, ex.adamw, train_fn).dataset(WithIds(a.samples)).batch_size(a.batch)
         .num_epochs(a.epochs).policy(ApplyPolicy[a.policy]).anchor(a.anchor).timeout(20).progress(False))
    if a.ckpt:
        b = b.checkpoint_fn(lambda e: os.path.join(a.ckpt, f"epoch{e}.json"))
    if a.resume:
        b = b.resume_from(a.resume)
    try:
        state = b.run().join()
    except DistributedError as exc:
        print(f"flodl-hf builder: {exc}", file=sys.stderr, flush=True)
        return 1
    if rank == 0:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.state_dict().items()}, os.path.join(a.out, "state.safetensors"))
        with open(os.path.join(a.out, "metrics.json"), "w") as f:
            json.dump({"world": state.world_size, "devices": state.devices, "rounds": state.rounds,
                       "global_step": state.global_step}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
