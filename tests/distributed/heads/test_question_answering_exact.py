"""The question-answering head trained on 2 and 3 real gloo ranks through ``Trainer.setup_head_with``, with uneven
El Che splits, ends with the weights of a one-process plain-PyTorch reference.

Items have contexts of very different lengths, so they give 1 to 5 stride windows each: a micro-batch's loss is a mean
over its QA windows, not its items, and only weighting each rank by its window count (``compute_loss`` reports it
through ``graph.loss_items``) equals the reference, which takes one SGD step per El Che window on the mean of
transformers' loss over all that window's QA windows. The same reference weighted per item is shown to differ, so
the test can fail.
"""

from __future__ import annotations

import random

import pytest
import torch

from dist_helpers import run_ranks, values
from qa_helpers import random_item
from tiny_models import tiny_config, tiny_tokenizer

MAX_LENGTH, STRIDE, LR, STEPS = 24, 8, 0.5, 3


def _config():
    config = tiny_config("bert")
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0  # deterministic forward passes
    return config


def _head(seed: int):
    from heads.question_answering import BertForQuestionAnswering

    torch.manual_seed(seed)
    head = BertForQuestionAnswering.from_config(_config(), tokenizer=tiny_tokenizer("bert"), max_length=MAX_LENGTH)
    head.doc_stride = STRIDE
    return head


def _data(n: int) -> list[dict]:
    rng = random.Random(5)
    items = []
    for i in range(n):
        item = random_item(rng, rng.choice((3, 10, 25, 45, 70)))
        item["id"] = i
        items.append(item)
    return items


def _rank(rank: int, world: int, sizes: list[int], anchor: int):
    from flodl_hf import DdpConfig, Trainer
    from heads.question_answering import AutoHeadForQuestionAnswering

    head = _head(100 + rank)  # every rank starts different: setup must broadcast rank 0's weights
    config = head.config()
    cfg = DdpConfig(batch_sizes=sizes, anchor=anchor, freeze_plan=True, seed=7, verbose=False, timeout_s=60)
    Trainer.setup_head_with(head, lambda device: AutoHeadForQuestionAnswering.on_device(config, 2, device),
                            lambda params: torch.optim.SGD(params, lr=LR), cfg)
    graph = head.graph()
    graph.set_data_loader(_data(STEPS * anchor * sum(sizes)), batch_size=sum(sizes) // world,
                          collate_fn=lambda items: ([item["id"] for item in items], *head.collate(items)))
    micro = []
    for ids, enc, labels in graph.epoch(0):
        head.compute_loss(enc, labels).backward()
        before = graph.training_step
        graph.step()
        micro.append((ids, int(enc["input_ids"].shape[0]), graph.training_step != before))
    graph.close()
    return micro, {name: p.detach().clone() for name, p in head.model.named_parameters()}


def _reference(micro_by_rank: list, n: int, per_item: bool) -> dict:
    """One process, plain PyTorch: per El Che window, one SGD step on the mean of transformers' per-QA-window loss
    over every QA window of the window's micro-batches (``per_item``: each micro-batch's mean weighted by its items
    instead, the wrong weighting). Each micro-batch is encoded as its rank encoded it: transformers' QA loss is a
    softmax over every position of a padded window, so a window's loss depends slightly on its batch's padding."""
    head = _head(100)
    model, data = head.model, _data(n)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    pending: list[list[int]] = []
    for k, (_, _, stepped) in enumerate(micro_by_rank[0]):
        pending.extend(rank_micro[k][0] for rank_micro in micro_by_rank)
        if not stepped:
            continue
        batches = [head.collate([data[i] for i in ids]) for ids in pending]
        windows = sum(labels.shape[0] for _, labels in batches)
        items = sum(len(ids) for ids in pending)
        for ids, (enc, labels) in zip(pending, batches):
            loss = model(**enc, start_positions=labels[:, 0], end_positions=labels[:, 1]).loss  # mean over its windows
            weight = len(ids) / items if per_item else labels.shape[0] / windows
            (loss * weight).backward()
        optimizer.step()
        optimizer.zero_grad()
        pending = []
    return {name: p.detach() for name, p in model.named_parameters()}


@pytest.mark.parametrize("world,sizes,anchor", [
    (2, [6, 2], 2),
    (3, [5, 1, 3], 1),
])
def test_qa_windows_on_n_ranks_equal_one_process(world, sizes, anchor):
    results = values(run_ranks(_rank, world, sizes, anchor, timeout=120))
    micro_by_rank = [micro for micro, _ in results]
    for rank, micro in enumerate(micro_by_rank):
        assert [len(ids) for ids, _, _ in micro] == [sizes[rank]] * (STEPS * anchor)
        assert sum(stepped for _, _, stepped in micro) == STEPS
    windows = [w for micro in micro_by_rank for _, w, _ in micro]
    items = [len(ids) for micro in micro_by_rank for ids, _, _ in micro]
    assert any(w > i for w, i in zip(windows, items)) and len(set(w / i for w, i in zip(windows, items))) > 2
    n = STEPS * anchor * sum(sizes)
    want = _reference(micro_by_rank, n, per_item=False)
    wrong = _reference(micro_by_rank, n, per_item=True)
    params = results[0][1]
    for name, p in want.items():
        torch.testing.assert_close(params[name], p, rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")
    gap = max(float((params[name] - wrong[name]).abs().max()) for name in want)
    assert gap > 1e-4, f"a per-item weighting would also pass (max difference {gap}): the test has no power"
    for _, other in results[1:]:  # replicas stay bit-identical
        for name, p in other.items():
            assert torch.equal(p, params[name]), name
