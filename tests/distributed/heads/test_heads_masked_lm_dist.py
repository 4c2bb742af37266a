"""Masked-LM training on 2 real gloo ranks equals one process: the masks do not depend on the rank that collates a
text, and ``compute_loss`` declares its masked-token count, so an uneven El Che split weights each rank's mean loss
by its tokens and the update equals the one-process loss over every masked token of the window."""

from __future__ import annotations

import pytest

import torch
from dist_helpers import run_ranks, values
from mlm_helpers import fresh_head, toy_corpus

SIZES, WINDOWS, SEED = [6, 2], 4, 7


def _sgd(params):
    return torch.optim.SGD(params, lr=0.5, momentum=0.9)


def _corpus() -> list[str]:
    texts = toy_corpus(WINDOWS * sum(SIZES), seed=3)
    return [text if i % 3 else f"{text} and {text}" for i, text in enumerate(texts)]  # uneven token counts


def _mlm_rank(rank: int, world: int):
    from flodl_hf import DdpConfig, Trainer
    from heads.masked_lm import AutoHeadForMaskedLM

    head = fresh_head("bert", seed=100 + rank)  # every rank starts different: setup broadcasts rank 0's weights
    config = head.config()
    cfg = DdpConfig(batch_sizes=SIZES, anchor=1, freeze_plan=True, seed=SEED, verbose=False, timeout_s=60)
    Trainer.setup_head_with(head, lambda device: AutoHeadForMaskedLM.on_device(config, None, device), _sgd, cfg)
    graph = head.graph()
    graph.set_data_loader(_corpus(), batch_size=sum(SIZES) // world, collate_fn=head.collate)
    seen = []
    for enc, labels in graph.epoch(0):
        seen.append((int(enc["input_ids"].shape[0]), int((labels != -100).sum())))
        head.compute_loss(enc, labels).backward()
        graph.step()
    tied = head.model.get_output_embeddings().weight is head.model.get_input_embeddings().weight
    return [p.detach().clone() for p in graph.module.parameters()], seen, tied


def _reference() -> list[torch.Tensor]:
    from flodl_hf.elche.partition import epoch_permutation

    head = fresh_head("bert", seed=100)
    optimizer = _sgd(head.graph().module.parameters())
    data = _corpus()
    order = epoch_permutation(len(data), SEED)
    window = sum(SIZES)
    for w in range(WINDOWS):
        texts = [data[int(i)] for i in order[w * window : (w + 1) * window]]
        head.compute_loss(*head.collate(texts)).backward()  # one mean over every masked token of the window
        optimizer.step()
        optimizer.zero_grad()
    return [p.detach() for p in head.graph().module.parameters()]


def test_two_ranks_uneven_split_equal_one_process():
    results = values(run_ranks(_mlm_rank, 2))
    reference = _reference()
    for rank, (params, seen, tied) in enumerate(results):
        assert [samples for samples, _ in seen] == [SIZES[rank]] * WINDOWS and tied
        assert len(params) == len(reference)
        for p, q in zip(params, reference):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    # the ranks' shares of masked tokens are not their shares of samples: weighting by samples would differ
    token_shares = [a[1] / (a[1] + b[1]) for a, b in zip(results[0][1], results[1][1], strict=True)]
    assert max(abs(share - SIZES[0] / sum(SIZES)) for share in token_shares) > 0.02, token_shares
    for p, q in zip(results[1][0], results[0][0]):  # replicas stay bit-identical
        assert torch.equal(p, q)
