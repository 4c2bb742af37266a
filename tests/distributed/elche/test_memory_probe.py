"""Memory-aware El Che (``DdpConfig(max_micro_batch="auto")``): the probe's search, the probe on a real task head
with a fake per-rank memory limit (a forward pre-hook that raises ``torch.OutOfMemoryError`` above a batch size,
standing in for a GPU that is full), and two real gloo ranks whose caps come from their probes: El Che never gives
a rank more than its cap, and the run trains exactly like one given those caps as integers."""

from __future__ import annotations

import math
import random
import re

import pytest
import torch

import tiny_models
from dist_helpers import run_ranks, values
from flodl_hf import DdpConfig, Trainer
from flodl_hf.elche import memory_probe
from flodl_hf.elche.memory_probe import OUT_OF_MEMORY, largest_fitting, probe_micro_batch
from heads import AutoHeadForSequenceClassification


@pytest.mark.parametrize("seed", range(40))
def test_largest_fitting_finds_the_threshold_in_logarithmic_tries(seed):
    rng = random.Random(seed)
    low = rng.randint(1, 8)
    high = rng.randint(low, 600)
    threshold = rng.randint(0, high + 20)
    tries = []

    def fits(n):
        tries.append(n)
        return n <= threshold

    got = largest_fitting(fits, low, high)
    assert got == (0 if threshold < low else min(threshold, high))
    assert all(low <= n <= high for n in tries)
    assert len(tries) <= 2 * math.ceil(math.log2(high / low + 1)) + 2


def test_largest_fitting_refuses_a_bad_range():
    with pytest.raises(ValueError, match="probe range"):
        largest_fitting(lambda n: True, 5, 2)


def _limited(module: torch.nn.Module, limit: int) -> torch.nn.Module:
    """The CPU stand-in for a full GPU: more than ``limit`` samples in one forward is out of memory."""
    def hook(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[0] > limit:
            raise OUT_OF_MEMORY(f"fake limit: {ids.shape[0]} > {limit} samples")
    module.register_forward_pre_hook(hook, with_kwargs=True)
    return module


def test_probe_finds_the_limit_and_leaves_no_trace():
    torch.manual_seed(0)
    config = tiny_models.tiny_config("bert", num_labels=2)
    head = AutoHeadForSequenceClassification.from_config(config, tokenizer=tiny_models.tiny_tokenizer("bert"))
    module = _limited(head.graph().module, 13)
    data = tiny_models.toy_task(64, seed=1)
    rng, params = torch.get_rng_state(), [p.detach().clone() for p in module.parameters()]
    got = probe_micro_batch(module, torch.device("cpu"), data, head.collate, 1, 40)
    assert got == 13
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(a, b) for a, b in zip(module.parameters(), params))
    assert all(p.grad is None for p in module.parameters())
    assert probe_micro_batch(_limited(module, 0), torch.device("cpu"), data, head.collate, 1, 40) == 0


def _auto_rank(rank: int, world: int, limits, caps, frozen=False):
    torch.manual_seed(0)
    config = tiny_models.tiny_config("bert", num_labels=2)
    head = AutoHeadForSequenceClassification.from_config(config, tokenizer=tiny_models.tiny_tokenizer("bert"))

    def factory(dev):
        replica = AutoHeadForSequenceClassification.on_device(config, 2, dev)
        _limited(replica.graph().module, limits[rank])
        return replica

    Trainer.setup_head_with(head, factory, lambda p: torch.optim.AdamW(p, lr=3e-3),
                            DdpConfig(max_micro_batch="auto" if caps is None else caps, seed=3, verbose=False,
                                      timeout_s=60, freeze_plan=frozen))
    graph = head.graph()
    graph.set_data_loader(tiny_models.toy_task(160, seed=0), batch_size=8, collate_fn=head.collate)
    sizes = []
    for epoch in range(2):
        for enc, labels in graph.epoch(epoch):
            sizes.append(int(enc["input_ids"].shape[0]))
            loss = head.compute_loss(enc, labels)
            loss.backward()
            graph.step()
    return graph.el_che().max_batch_sizes, sizes, [p.detach().clone() for p in graph.module.parameters()]


def test_two_ranks_probe_their_caps_and_train_like_the_same_caps_given_as_integers():
    limits = [5, 100]
    auto = values(run_ranks(_auto_rank, 2, limits, None, timeout=240))
    assert auto[0][0] == auto[1][0] == [5, 16]  # rank 1's cap is the most a rank can get: the global batch
    assert max(auto[0][1]) <= 5 and sum(auto[0][1]) > 0  # the fake limit would have raised on more
    # El Che's split follows measured times, so compare on a frozen plan: the probe must leave no trace
    auto = values(run_ranks(_auto_rank, 2, limits, None, True, timeout=240))
    given = values(run_ranks(_auto_rank, 2, limits, [5, 16], True, timeout=240))
    assert auto[0][1] == [5] * 20  # 2 epochs x 160 rows / 16 per step, rank 0 at its cap
    for r in range(2):
        assert auto[r][1] == given[r][1]
        assert all(torch.equal(a, b) for a, b in zip(auto[r][2], given[r][2]))  # the probe left no trace


def test_cli_takes_auto_or_a_positive_cap_and_passes_it_to_the_engine():
    from flodl_hf.cli import UsageError, build_parser, settings_from_args

    parser = build_parser()
    for text, want in (("auto", "auto"), ("AUTO", "auto"), ("24", 24)):
        args = parser.parse_args(["train", "--max-micro-batch", text])
        assert settings_from_args(args).ddp_config().max_micro_batch == want
    for bad, words in (("0", "too small"), ("lots", "is not an integer (nor 'auto')")):
        with pytest.raises(UsageError, match=re.escape(words)):
            parser.parse_args(["train", "--max-micro-batch", bad])
    with pytest.raises(ValueError, match="or 'auto'"):
        DdpConfig(max_micro_batch="big")


def test_the_optimizer_reserve_counts_two_states_per_trainable_parameter():
    """What the CUDA probe holds back for AdamW's exp_avg / exp_avg_sq (created at the first step, after the
    probe): two tensors the size of every trainable parameter; frozen parameters get no state."""
    model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.Linear(20, 3))
    model[0].weight.requires_grad_(False)
    trainable = 20 + 20 * 3 + 3
    assert memory_probe.optimizer_reserve_bytes(model) == 2 * 4 * trainable
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    model(torch.randn(4, 10)).sum().backward()
    opt.step()
    state = sum(t.numel() * t.element_size() for s in opt.state.values() for k, t in s.items() if k != "step")
    assert state == memory_probe.optimizer_reserve_bytes(model)
