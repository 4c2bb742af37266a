"""CUDA and NCCL paths: the same interfaces as the gloo tests, run only where GPUs exist (see tests/gpu.py)."""

from __future__ import annotations

import torch

import tiny_models
# spawn_ranks, not the rank pool: a CUDA context and NCCL communicators live as long as their process
from dist_helpers import spawn_ranks, values
from flodl_hf import DdpConfig, Trainer
from gpu import requires_gpus
from heads import AutoHeadForSequenceClassification
from test_setup_distributed import _reference, _exact_rank


def _head_on_one_gpu(precision: str):
    """A tiny BERT head set up on cuda:0 at ``precision``, with AdamW; returns (head, graph)."""
    torch.manual_seed(0)
    config = tiny_models.tiny_config("bert", num_labels=2)
    head = AutoHeadForSequenceClassification.from_config(config, tokenizer=tiny_models.tiny_tokenizer("bert"))
    Trainer.setup_head_with(head, lambda dev: AutoHeadForSequenceClassification.on_device(config, 2, dev),
                            lambda p: torch.optim.AdamW(p, lr=3e-3),
                            DdpConfig(devices=["cuda:0"], precision=precision, verbose=False))
    return head, head.graph()


@requires_gpus(1)
def test_setup_head_trains_on_one_gpu_with_bf16():
    head, graph = _head_on_one_gpu("bf16")
    assert graph.device.type == "cuda" and next(graph.module.parameters()).is_cuda
    graph.set_data_loader(tiny_models.toy_task(256, seed=0), batch_size=16, collate_fn=head.collate)
    losses = []
    for epoch in range(4):
        for enc, labels in graph.epoch(epoch):
            loss = head.compute_loss(enc, labels)
            graph.backward(loss)
            graph.step()
            losses.append(loss.item())
    assert sum(losses[-8:]) / 8 < 0.5 * sum(losses[:8]) / 8


@requires_gpus(1)
def test_fp16_on_one_gpu_refuses_an_unscaled_backward():
    """GradScaler.step unscales whatever gradients it finds: after a plain loss.backward() that would divide them
    by the loss scale (65536) and AdamW would barely move, silently. graph.step() refuses instead."""
    import pytest

    head, graph = _head_on_one_gpu("fp16")
    graph.set_data_loader(tiny_models.toy_task(64, seed=0), batch_size=16, collate_fn=head.collate)
    batches = iter(graph.epoch(0))
    enc, labels = next(batches)
    before = [p.detach().clone() for p in graph.module.parameters()]
    head.compute_loss(enc, labels).backward()
    with pytest.raises(ValueError, match=r"call graph.backward\(loss\) instead"):
        graph.step()
    assert all(torch.equal(p, q) for p, q in zip(graph.module.parameters(), before))
    for enc, labels in batches:  # the scaled path still trains (a step GradScaler skips on overflow is fine)
        graph.backward(head.compute_loss(enc, labels))
        graph.step()
    for epoch in range(1, 4):
        for enc, labels in graph.epoch(epoch):
            graph.backward(head.compute_loss(enc, labels))
            graph.step()
    assert any(not torch.equal(p, q) for p, q in zip(graph.module.parameters(), before))


@requires_gpus(2)
def test_nccl_windows_equal_one_big_batch():
    sizes, anchor, windows = [11, 5], 3, 4
    results = values(spawn_ranks(_exact_rank, 2, sizes, anchor, windows, None,
                               env={"FLODL_HF_DEVICES": "cuda:0,cuda:1"}))
    reference = _reference(sizes, anchor, windows, None)
    for params, _, _ in results:
        for p, q in zip(params, reference):
            torch.testing.assert_close(p.cpu(), q, rtol=1e-4, atol=1e-5)


@requires_gpus(1)
def test_cli_fp16_trains_on_one_gpu(tmp_path):
    """The fp16 CLI path used to crash at step 1 (the loop never called graph.backward, so GradScaler had nothing
    to unscale): it must train and evaluate."""
    import subprocess
    import sys

    from cli_helpers import FAST, write_toy_csv
    from cli_helpers import cli_env as _env

    tiny_models.make_checkpoint("bert", tmp_path / "tiny", with_classifier=False)
    write_toy_csv(tmp_path / "toy.csv", 400)
    result = subprocess.run(
        [sys.executable, "-m", "flodl_hf", "train", "--model", tmp_path / "tiny", "--data", tmp_path / "toy.csv",
         "--text-column", "review", "--label-column", "sentiment", "--output-dir", tmp_path / "out",
         "--devices", "cuda:0", "--precision", "fp16", *FAST],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "accuracy=" in result.stdout


def _nccl_vanish_rank(rank: int, world: int):
    import os

    graph = __import__("flodl_hf").Graph(torch.nn.Linear(2, 1))
    Trainer.setup_with(graph, lambda dev: torch.nn.Linear(2, 1), lambda p: torch.optim.SGD(p, lr=0.1),
                       DdpConfig(verbose=False, timeout_s=30))
    for i in range(5):
        if rank == 1 and i == 2:
            os._exit(7)
        graph.module(torch.ones(3, 2, device=graph.device)).sum().backward()
        graph.step()
    graph.close()


@requires_gpus(2)
def test_nccl_vanished_peer_raises_distributed_error_naming_it():
    import time

    start = time.monotonic()
    results = spawn_ranks(_nccl_vanish_rank, 2, timeout=90, env={"FLODL_HF_DEVICES": "cuda:0,cuda:1"})
    assert time.monotonic() - start < 60  # within timeout_s (30 s), not the NCCL watchdog's abort
    status, message = results[0]
    assert status == "error" and "DistributedError" in message and "rank(s) [1] vanished" in message, message


@requires_gpus(2)
def test_nccl_masked_token_losses_and_frozen_layers_match_the_reference():
    """A slice of the differential harness on NCCL ranks: token-level masked loss, AdamW, freeze events."""
    from exactness_harness import check_case, make_case, run_cases_on_rank

    cases = [c for c in (make_case(seed, world=2) for seed in range(40))][:12]
    per_rank = values(spawn_ranks(run_cases_on_rank, 2, cases, timeout=600,
                                env={"FLODL_HF_DEVICES": "cuda:0,cuda:1"}))
    for i, case in enumerate(cases):
        check_case(case, [{**per_rank[r][i], "params": {k: v.cpu() for k, v in per_rank[r][i]["params"].items()}}
                          for r in range(2)])


# ------------------------------------------------------------------------------------------ builder mode
@requires_gpus(1)
def test_builder_cpu_backend_two_workers_share_one_gpu():
    """The CPU backend's shared-memory slots with CUDA replicas: snapshots copy device to host, averages host to
    device; two workers may share one GPU (no NCCL involved)."""
    import builder_exact_helpers as ex

    from flodl_hf import ApplyPolicy, AverageBackend

    handle = (Trainer.builder(ex.make_model, ex.adamw, ex.loss_fn).dataset(ex.Indexed(512)).batch_size(16)
              .num_epochs(2).policy(ApplyPolicy.CADENCE).backend(AverageBackend.CPU)
              .devices(["cuda:0", "cuda:0"]).timeout(60).progress(False).run())
    state = handle.join(timeout=300)
    assert all(torch.isfinite(v).all() for v in state.state_dict().values() if v.is_floating_point())
    assert handle.metrics[-1].avg_loss < handle.metrics[0].avg_loss


def _builder_sync_equals_one_process(devices: list[str]) -> None:
    import builder_exact_helpers as ex
    from test_builder_exact import _reference_sync

    from flodl_hf import ApplyPolicy, AverageBackend

    state = (Trainer.builder(ex.make_model, ex.adamw, ex.loss_fn).dataset(ex.Indexed(96)).batch_size(8)
             .num_epochs(2).policy(ApplyPolicy.SYNC).backend(AverageBackend.NCCL).devices(devices)
             .timeout(60).progress(False).run().join(timeout=300))
    reference = _reference_sync(96, 8, 2, 2, None)
    for key, value in reference.items():
        torch.testing.assert_close(state.state_dict()[key], value, rtol=1e-4, atol=1e-5, msg=key)


@requires_gpus(1)
def test_builder_sync_on_a_cpu_and_a_gpu_worker_equals_one_process():
    """SYNC over gloo with one CPU and one CUDA replica (gradients cross devices in the bucketed all-reduce)."""
    _builder_sync_equals_one_process(["cpu", "cuda:0"])


@requires_gpus(2)
def test_builder_sync_over_nccl_equals_one_process():
    _builder_sync_equals_one_process(["cuda:0", "cuda:1"])


@requires_gpus(1)
def test_encode_on_cuda_pads_to_a_multiple_of_8_and_keeps_the_logits():
    """Dynamic padding gave bf16 attention a new shape per batch (4x slower on an H200); on CUDA batches are
    padded to a multiple of 8 tokens, which masks out and so leaves the logits unchanged."""
    torch.manual_seed(0)
    config = tiny_models.tiny_config("bert", num_labels=2)
    head = AutoHeadForSequenceClassification.from_config(config, tokenizer=tiny_models.tiny_tokenizer("bert"))
    texts = ["good", "a really quite great movie"]
    cpu = head.eval().encode(texts)
    with torch.no_grad():
        ref = head.forward(cpu)
    head.to("cuda:0")
    enc = head.encode(texts)
    assert enc["input_ids"].shape[1] % 8 == 0 and enc["input_ids"].shape[1] >= cpu["input_ids"].shape[1]
    with torch.no_grad():
        torch.testing.assert_close(head.forward(enc).cpu(), ref, rtol=1e-4, atol=1e-4)


@requires_gpus(1)
def test_compute_clock_times_gpu_work_with_events_and_no_per_batch_synchronise():
    from flodl_hf.distributed.clock import ComputeClock

    dev = torch.device("cuda:0")
    a = torch.randn(2048, 2048, device=dev)
    clock = ComputeClock(dev)
    assert clock.events
    for _ in range(3):
        clock.mark()
        for _ in range(20):
            a = (a @ a).tanh()
        assert clock.stop() is None  # nothing waited for the GPU here
    gpu_s = clock.pending_seconds()
    torch.cuda.synchronize()
    clock.mark()
    for _ in range(20):
        a = (a @ a).tanh()
    torch.cuda.synchronize()
    assert clock.stop() is None
    one = clock.pending_seconds()
    assert gpu_s > 0 and 1.5 < gpu_s / one < 4.5  # three batches of the same work take about three times one
    assert clock.pending_seconds() == 0.0
