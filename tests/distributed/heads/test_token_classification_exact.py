"""A tagger trained on 2 and 3 real gloo ranks with uneven El Che splits ends with exactly the weights of one process.

The reference is plain PyTorch in one process: per El Che window, one SGD step on the concatenation of every rank's
micro-batches of that window, with the token-count-weighted mean cross-entropy (every labelled token of the window
weighs the same). Sentence lengths differ and some sentences are wholly ``-100``, so ranks (and micro-batches) hold
different numbers of labelled tokens -- some none at all -- and a per-sample weighting would not match: the head
must report labelled tokens through ``Graph.loss_items``. Dropout is zero so that train mode is deterministic.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from dist_helpers import run_ranks, values
from flodl_hf.elche.partition import epoch_permutation
from tokcls_helpers import TAGS, random_tagged, subword_config, subword_tokenizer

SEED, LR, MOMENTUM = 7, 0.5, 0.9


def _data(n: int) -> list[tuple[list[str], list]]:
    """Random tagged sentences of 1-9 words; about one in five is wholly -100, some words are -100 too."""
    rng = random.Random(11)
    out = []
    for words, tags in random_tagged(n, seed=12):
        if rng.random() < 0.2:
            tags = [-100] * len(words)
        else:
            tags = [-100 if rng.random() < 0.15 else tag for tag in tags]
        out.append((words, tags))
    return out


def _head(family: str, all_subwords: bool):
    from heads.token_classification import AutoHeadForTokenClassification

    return AutoHeadForTokenClassification.from_config(subword_config(family, dropout=False),
                                                      tokenizer=subword_tokenizer(family),
                                                      label_all_subwords=all_subwords)


def _sgd(params):
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)


def _rank(rank: int, world: int, family: str, all_subwords: bool, sizes: list[int], anchor: int, windows: int):
    from flodl_hf import DdpConfig, Trainer
    from heads.token_classification import AutoHeadForTokenClassification

    torch.manual_seed(100 + rank)  # every rank starts different: setup must broadcast rank 0's weights
    head = _head(family, all_subwords)
    config = head.config()
    cfg = DdpConfig(batch_sizes=sizes, anchor=anchor, freeze_plan=True, seed=SEED, verbose=False, timeout_s=60)
    Trainer.setup_head_with(head, lambda dev: AutoHeadForTokenClassification.on_device(config, len(TAGS), dev),
                            _sgd, cfg)
    graph = head.graph()
    graph.set_data_loader(_data(windows * anchor * sum(sizes)), batch_size=sum(sizes) // world,
                          collate_fn=head.collate)
    seen = []
    for enc, labels in graph.epoch(0):
        seen.append((int(labels.shape[0]), int((labels != -100).sum())))
        head.compute_loss(enc, labels).backward()
        graph.step()
    graph.close()
    return {k: v.detach().clone() for k, v in head.model.named_parameters()}, seen, graph.training_step


def _reference(family: str, all_subwords: bool, sizes: list[int], anchor: int, windows: int) -> dict:
    torch.manual_seed(100)
    head = _head(family, all_subwords)  # only for its tokenizer, collate and initial weights
    model = head.model
    optimizer = _sgd(model.parameters())
    step = anchor * sum(sizes)
    data = _data(windows * step)
    perm = epoch_permutation(len(data), SEED)
    for w in range(windows):
        enc, labels = head.collate([data[int(i)] for i in perm[w * step: (w + 1) * step]])
        logits = model(**enc).logits
        F.cross_entropy(logits.reshape(-1, len(TAGS)), labels.reshape(-1), ignore_index=-100).backward()
        optimizer.step()
        optimizer.zero_grad()
    return {k: v.detach() for k, v in model.named_parameters()}


@pytest.mark.parametrize("world,sizes,anchor,family,all_subwords", [
    (2, [11, 5], 3, "bert", False),
    (3, [9, 2, 1], 2, "roberta", True),
])
def test_ranks_end_with_the_weights_of_one_process(world, sizes, anchor, family, all_subwords):
    windows = 4
    results = values(run_ranks(_rank, world, family, all_subwords, sizes, anchor, windows, timeout=180))
    want = _reference(family, all_subwords, sizes, anchor, windows)
    for rank, (params, seen, steps) in enumerate(results):
        assert steps == windows
        assert [n for n, _ in seen] == [sizes[rank]] * (windows * anchor)  # the uneven split really ran
        for name, value in want.items():
            torch.testing.assert_close(params[name], value, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    for params, _, _ in results[1:]:  # replicas stay identical
        for name, value in params.items():
            assert torch.equal(value, results[0][0][name]), name
    # The case is one where sample weighting differs from token weighting: per-rank token counts are not
    # proportional to the sample counts, and some micro-batch has no labelled token at all.
    tokens = [sum(t for _, t in seen) for _, seen, _ in results]
    assert len({t / s for t, s in zip(tokens, sizes)}) == world
    if world == 3:
        assert any(t == 0 for _, seen, _ in results for _, t in seen)
