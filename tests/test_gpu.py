"""CUDA and NCCL paths: the same interfaces as the gloo tests, run only where GPUs exist (see tests/gpu.py)."""

from __future__ import annotations

import torch

import tiny_models
from dist_helpers import run_ranks, values
from flodl_hf import DdpConfig, Trainer
from gpu import requires_gpus
from heads import AutoHeadForSequenceClassification
from test_setup_distributed import _reference, _exact_rank


@requires_gpus(1)
def test_setup_head_trains_on_one_gpu_with_bf16():
    torch.manual_seed(0)
    config = tiny_models.tiny_config("bert", num_labels=2)
    head = AutoHeadForSequenceClassification.from_config(config, tokenizer=tiny_models.tiny_tokenizer("bert"))
    Trainer.setup_head_with(head, lambda dev: AutoHeadForSequenceClassification.on_device(config, 2, dev),
                            lambda p: torch.optim.AdamW(p, lr=3e-3),
                            DdpConfig(devices=["cuda:0"], precision="bf16", verbose=False))
    graph = head.graph()
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


@requires_gpus(2)
def test_nccl_windows_equal_one_big_batch():
    sizes, anchor, windows = [11, 5], 3, 4
    results = values(run_ranks(_exact_rank, 2, sizes, anchor, windows, None,
                               env={"FLODL_HF_DEVICES": "cuda:0,cuda:1"}))
    reference = _reference(sizes, anchor, windows, None)
    for params, _, _ in results:
        for p, q in zip(params, reference):
            torch.testing.assert_close(p.cpu(), q, rtol=1e-4, atol=1e-5)
