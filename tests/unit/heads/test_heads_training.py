"""Fine-tuning: every family learns the toy task with a plain AdamW loop, and through Trainer.setup_head.

Sizes were chosen for reliability on 2 CPU cores: 64 samples, batch 32, 50 steps, lr 3e-3 with 5 warm-up steps
and gradient clipping at 1.0 learned the task (final loss <= 0.08, accuracy >= 0.98) for every family on six seeds.
One intra-op thread keeps the run fast when other test processes share the machine.
"""

from __future__ import annotations

import pytest
import torch

import heads
from tiny_models import FAMILIES, toy_task

STEPS, BATCH, LR, WARMUP = 50, 32, 3e-3, 5
pytestmark = pytest.mark.usefixtures("one_thread")


def full_batch_loss(head, data) -> float:
    module = head.graph().module
    module.eval()
    with torch.no_grad():
        loss = head.compute_loss(*head.collate(data)).item()
    module.train()
    return loss


def accuracy(head, data) -> float:
    names = head.labels()
    predictions = head.predict([text for text, _ in data])
    return sum(
        pairs[0][0] == names[label] for pairs, (_, label) in zip(predictions, data, strict=True)
    ) / len(data)


@pytest.mark.parametrize("family", FAMILIES)
def test_plain_loop_fine_tune_learns(family, tiny_checkpoint):
    torch.manual_seed(0)
    head = heads.AutoHeadForSequenceClassification.from_pretrained(
        tiny_checkpoint(family), labels=["neg", "pos"]
    )
    data = toy_task(64, seed=0)
    before = full_batch_loss(head, data)
    optimizer = torch.optim.AdamW(head.graph().module.parameters(), lr=LR)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / WARMUP))
    draw = torch.Generator().manual_seed(0)
    for _ in range(STEPS):
        batch = [data[i] for i in torch.randint(0, len(data), (BATCH,), generator=draw).tolist()]
        loss = head.compute_loss(*head.collate(batch))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.graph().module.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        schedule.step()
    after = full_batch_loss(head, data)
    assert before > 0.6  # chance level for two balanced classes is ln 2 = 0.69
    assert after < 0.35 and after < before / 2, (before, after)
    assert accuracy(head, data) >= 0.9


def test_fine_tune_through_trainer_setup_head(tiny_checkpoint):
    from flodl_hf.config import DdpConfig
    from flodl_hf.trainer import Trainer

    torch.manual_seed(0)
    cls = heads.AutoHeadForSequenceClassification
    head = cls.from_pretrained(tiny_checkpoint("bert"), labels=["neg", "pos"])
    original = head.graph().module
    config, num_labels = head.config(), len(head.labels())
    Trainer.setup_head_with(
        head,
        lambda device: cls.on_device(config, num_labels, device),
        lambda params: torch.optim.AdamW(params, lr=LR),
        DdpConfig(devices=["cpu"], verbose=False, launch=False),
    )
    assert head.graph().module is not original and head.model is head.graph().module  # the replica is live
    assert head.tokenizer is not None and head.labels() == ["neg", "pos"]
    data = toy_task(64, seed=0)
    before = full_batch_loss(head, data)
    graph = head.graph()
    graph.set_data_loader(data, batch_size=16, collate_fn=head.collate)
    for epoch in range(12):
        for enc, labels in graph.epoch(epoch):
            head.compute_loss(enc, labels).backward()
            graph.step()
    graph.close()
    after = full_batch_loss(head, data)
    assert after < before / 2, (before, after)
    assert accuracy(head, data) >= 0.9
