"""A SYNC builder run stopped at an epoch's checkpoint and resumed continues exactly as the uninterrupted run:
the reference is the same run without the stop.

What this needs, and what used to be missing: the checkpoint carries the optimizer state (the replicas' AdamW
moments and step counts are equal under SYNC); the model a checkpoint of epoch ``e`` holds may already hold a few
batches of epoch ``e + 1`` (epochs are pipelined and the state is taken at a later average), which the checkpoint
lists and the resumed run skips instead of running them twice; and the LR schedule resumes at the global step the
model holds. AdamW with weight decay, a linear warmup-and-decay schedule and gradient clipping; no dropout, so
equality to 1e-5 is the expectation. Real worker processes (gloo on CPU, ``forkserver``).
"""

from __future__ import annotations

import functools

import builder_exact_helpers as ex
import pytest
import torch

from flodl_hf import ApplyPolicy, AverageBackend, Trainer
from flodl_hf.builder.checkpoint import read_checkpoint

pytestmark = pytest.mark.timeout(240)

N, BATCH, EPOCHS = 160, 8, 3
TOTAL = EPOCHS * (N // BATCH)


def _builder(backend: AverageBackend, workers: int = 2):
    return (Trainer.builder(ex.make_model, ex.adamw, ex.loss_fn).dataset(ex.Indexed(N)).batch_size(BATCH)
            .num_epochs(EPOCHS).policy(ApplyPolicy.SYNC).backend(backend).devices(["cpu"] * workers)
            .scheduler(functools.partial(ex.linear_schedule, warmup=5, total=TOTAL)).max_grad_norm(0.5)
            .timeout(30).progress(False).start_method("forkserver"))


def _path(root, epoch: int):
    return root / f"epoch{epoch}.json"


@pytest.mark.parametrize("backend", [AverageBackend.CPU, AverageBackend.NCCL])
def test_sync_resume_equals_the_uninterrupted_run(tmp_path, backend):
    full = _builder(backend).checkpoint_fn(functools.partial(_path, tmp_path / "full")).run().join(timeout=200)
    saved = read_checkpoint(_path(tmp_path / "full", 0))
    assert saved["optimizer"]["state"], "a SYNC checkpoint carries the optimizer's moments"
    ahead = saved["ahead"]
    assert all(e == 1 for e, _ in ahead), ahead
    resumed = (_builder(backend).resume_from(_path(tmp_path / "full", 0))
               .checkpoint_fn(functools.partial(_path, tmp_path / "resumed")).run())
    state = resumed.join(timeout=200)
    # the resumed epoch 1 ran exactly the batches the checkpoint did not hold
    assert [m.samples for m in resumed.metrics] == [(N // BATCH - len(ahead)) * BATCH, N]
    assert state.global_step == TOTAL and full.global_step == TOTAL
    reference = full.state_dict()
    got = state.state_dict()
    for key in reference:
        torch.testing.assert_close(got[key], reference[key], rtol=1e-5, atol=1e-6, msg=key)


def test_a_checkpoint_lists_the_next_epochs_batches_it_holds_and_the_resume_skips_them(tmp_path):
    """Three SYNC workers, 20 batches an epoch: epoch 0 is dealt 7/7/6, so worker 2's seventh batch, in the round
    that completes epoch 0, is batch 2 of epoch 1 (its share of epoch 1 dealt round robin). The checkpoint of epoch 0
    therefore holds it; it says so, and the resumed run does not run it again."""
    full = (_builder(AverageBackend.NCCL, workers=3).checkpoint_fn(functools.partial(_path, tmp_path / "full"))
            .run().join(timeout=200))
    assert full.global_step == TOTAL
    ahead = {tuple(p) for p in read_checkpoint(_path(tmp_path / "full", 0))["ahead"]}
    assert (1, 2) in ahead and all(e == 1 for e, _ in ahead), ahead
    resumed = (_builder(AverageBackend.NCCL, workers=3).resume_from(_path(tmp_path / "full", 0)).timeline().run())
    state = resumed.join(timeout=200)
    ran = sorted((e["epoch"], e["batch"]) for e in resumed.timeline() if e["kind"] == "batch")
    per_epoch = N // BATCH
    assert sorted(ran + sorted(ahead)) == [(e, b) for e in (1, 2) for b in range(per_epoch)]  # each batch once
    assert state.global_step == TOTAL
