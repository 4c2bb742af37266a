"""Setup mode's exactness contract on the loops users actually write, each against plain PyTorch / transformers:
frozen layers, masked labels through a real head, DataLoader workers and prefetch threads over the plan, memory
caps, a fixed anchor, stop flags, and the failures that must raise instead of crashing or hanging."""

from __future__ import annotations

import os
import time
import warnings

import pytest
import torch

import tiny_models
from dist_helpers import run_ranks, spawn_ranks, values
from flodl_hf import DdpConfig, Graph, Trainer
from flodl_hf.elche.partition import epoch_permutation
from heads import AutoHeadForSequenceClassification


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.Flatten(), torch.nn.Linear(16, 3))


# --- frozen layers on one device -------------------------------------------------------------------------------
def test_a_layer_frozen_before_setup_stays_frozen_on_one_device():
    torch.manual_seed(0)
    model = _mlp()
    model[0].requires_grad_(False)
    graph = Graph(model)
    Trainer.setup_with(graph, lambda dev: _mlp(), lambda p: torch.optim.AdamW(p, lr=0.1, weight_decay=0.1),
                       DdpConfig(verbose=False))
    assert graph.module is not model and not graph.module[0].weight.requires_grad
    before = graph.module[0].weight.detach().clone()
    x = torch.randint(0, 10, (6, 2))
    for _ in range(3):
        torch.nn.functional.cross_entropy(graph.module(x), torch.tensor([0, 1, 2, 0, 1, 2])).backward()
        graph.step()
    assert torch.equal(graph.module[0].weight, before)  # AdamW's weight decay did not touch it either


# --- masked labels through a real head, against transformers' own loss -----------------------------------------
def _no_dropout_config():
    config = tiny_models.tiny_config("bert", num_labels=3)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    return config


def _masked_rank(rank: int, world: int, rows: list, sizes: list[int], anchor: int):
    config = _no_dropout_config()
    torch.manual_seed(5 + rank)
    head = AutoHeadForSequenceClassification.from_config(config, tokenizer=tiny_models.tiny_tokenizer("bert"))
    Trainer.setup_head_with(head, lambda dev: AutoHeadForSequenceClassification.on_device(config, 3, dev),
                            lambda p: torch.optim.AdamW(p, lr=1e-2),
                            DdpConfig(verbose=False, batch_sizes=sizes, anchor=anchor, freeze_plan=True, seed=3,
                                      timeout_s=60))
    graph = head.graph()
    graph.set_data_loader(rows, batch_size=sum(sizes) // world, collate_fn=head.collate)
    for enc, labels in graph.epoch(0):
        head.compute_loss(enc, labels).backward()
        graph.step()
    graph.close()
    return {k: v.detach().clone() for k, v in head.model.state_dict().items()}


def test_masked_labels_on_uneven_ranks_match_transformers_on_one_process():
    rows = [(text, label if i % 3 else -100) for i, (text, label) in enumerate(tiny_models.toy_task(48, seed=1))]
    rows = [(t, (lab + i) % 3 if lab != -100 else -100) for i, (t, lab) in enumerate(rows)]
    sizes, anchor = [6, 2], 3
    results = values(run_ranks(_masked_rank, 2, rows, sizes, anchor))
    # Reference: plain transformers, one process, the window's samples as one batch, the model's own loss.
    config = _no_dropout_config()
    torch.manual_seed(5)
    head = AutoHeadForSequenceClassification.from_config(config, tokenizer=tiny_models.tiny_tokenizer("bert"))
    model = head.model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    perm = epoch_permutation(len(rows), 3).tolist()
    per_step = sum(sizes)
    for w in range(len(rows) // (per_step * anchor)):
        window = [perm[(w * anchor + k) * per_step:(w * anchor + k + 1) * per_step] for k in range(anchor)]
        # the engine's order: micro-step by micro-step, rank 0's slice then rank 1's
        idx = [i for step in window for i in step]
        texts = [rows[i][0] for i in idx]
        labels = torch.tensor([rows[i][1] for i in idx])
        enc = head.encode(texts)
        out = model(**enc, labels=labels)  # transformers: mean cross-entropy over labels != -100
        out.loss.backward()
        opt.step()
        opt.zero_grad()
    want = model.state_dict()
    for got in results:
        for name, value in want.items():
            torch.testing.assert_close(got[name], value, rtol=1e-4, atol=2e-5, msg=name)


def _collate_pairs(items):
    return torch.stack([a for a, _ in items]), torch.stack([b for _, b in items])


# --- read-ahead: DataLoader workers and the prefetch thread are bit-identical to the plain loop ------------------
def _readahead_rank(rank: int, world: int, mode: str, change: bool):
    torch.manual_seed(0)
    graph = Graph(_mlp())
    cfg = DdpConfig(verbose=False, batch_sizes=[5, 3], anchor=2, freeze_plan=True, seed=4, timeout_s=60)
    Trainer.setup_with(graph, lambda dev: _mlp(), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), cfg)
    g = torch.Generator().manual_seed(9)
    data = list(zip(torch.randint(0, 10, (96, 2), generator=g), torch.randint(0, 3, (96,), generator=g)))
    collate = _collate_pairs
    graph.set_data_loader(data, batch_size=4, collate_fn=collate)
    for epoch in range(2):
        if epoch == 1 and change:
            graph.el_che().set_batch_sizes([2, 6])  # the split changes while batches are read ahead
        if mode == "dataloader":
            source = torch.utils.data.DataLoader(data, batch_sampler=graph.plan(epoch), collate_fn=collate,
                                                 num_workers=2, prefetch_factor=2,
                                                 multiprocessing_context="fork")
        elif mode == "prefetch":
            source = graph.epoch(epoch, prefetch=3)
        elif mode == "list":
            source = list(graph.epoch(epoch))
        else:
            source = graph.epoch(epoch)
        for x, y in source:
            torch.nn.functional.cross_entropy(graph.module(x), y).backward()
            graph.step()
    graph.close()
    return [p.detach().clone() for p in graph.module.parameters()], graph.training_step


@pytest.mark.parametrize("change", [False, True])
def test_read_ahead_of_any_kind_trains_the_same_model(change):
    """Bit-identical while the split is fixed. When the split changes, a step already read ahead keeps the split
    it was drawn with: every window still averages the same samples, so only float summation order differs."""
    plain = values(run_ranks(_readahead_rank, 2, "plain", change))
    for mode in ("list", "prefetch", "dataloader"):
        other = values(run_ranks(_readahead_rank, 2, mode, change))
        for (p_params, p_steps), (o_params, o_steps) in zip(plain, other):
            assert p_steps == o_steps
            for a, b in zip(p_params, o_params):
                if change:
                    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=mode)
                else:
                    assert torch.equal(a, b), mode


def test_abandoned_prefetch_iterator_forgets_its_unstepped_batches():
    torch.manual_seed(0)
    graph = Graph(_mlp())
    Trainer.setup_with(graph, lambda dev: _mlp(), lambda p: torch.optim.SGD(p, lr=0.1), DdpConfig(verbose=False))
    data = [(torch.tensor([i % 10, (i * 3) % 10]), torch.tensor(i % 3)) for i in range(40)]
    graph.set_data_loader(data, batch_size=4,
                          collate_fn=lambda items: (torch.stack([a for a, _ in items]),
                                                    torch.stack([b for _, b in items])))
    source = graph.epoch(0, prefetch=3)
    for i, (x, y) in enumerate(source):
        torch.nn.functional.cross_entropy(graph.module(x), y).backward()
        graph.step()
        if i == 2:
            break
    source.close()
    assert len(graph._pending) == 0 and graph.position() == (0, 3)


# --- memory cap and fixed anchor ---------------------------------------------------------------------------------
def _cap_rank(rank: int, world: int):
    torch.manual_seed(0)
    graph = Graph(torch.nn.Linear(4, 2))
    cfg = DdpConfig(verbose=False, simulate_speeds=[1.0, 0.1], max_micro_batch=40, timeout_s=60, seed=1)
    Trainer.setup_with(graph, lambda dev: torch.nn.Linear(4, 2), lambda p: torch.optim.SGD(p, lr=0.01), cfg)
    data = [torch.randn(4) for _ in range(64 * 12)]
    graph.set_data_loader(data, batch_size=32, collate_fn=torch.stack)
    sizes = []
    for x in graph.epoch(0):
        time.sleep(0.0002 * len(x))
        graph.module(x).sum().backward()
        graph.step()
        sizes.append(len(x))
    graph.close()
    return sizes, graph.el_che().batch_sizes()


def test_memory_cap_is_never_exceeded_and_the_rest_goes_elsewhere():
    (fast, plan), (slow, _) = values(run_ranks(_cap_rank, 2))
    assert max(fast) <= 40 and plan == [40, 24]  # uncapped, 1 : 0.1 would give the fast rank 58 of 64
    assert all(a + b == 64 for a, b in zip(fast, slow))


def test_caps_that_cannot_hold_the_batch_are_refused():
    with pytest.raises(ValueError, match="max_micro_batch"):
        DdpConfig(max_micro_batch=0)
    with pytest.raises(ValueError, match="hold 30 samples per step but 2 rank"):
        DdpConfig(max_micro_batch=15).el_che_kwargs(2, 16)
    graph = Graph(torch.nn.Linear(2, 1))
    Trainer.setup_with(graph, lambda dev: torch.nn.Linear(2, 1), lambda p: torch.optim.SGD(p, lr=0.1),
                       DdpConfig(verbose=False, max_micro_batch=8))
    with pytest.raises(ValueError, match="lower batch_size to 8"):
        graph.set_data_loader([torch.zeros(2)] * 32, batch_size=16)


def _fixed_anchor_rank(rank: int, world: int):
    def build(dev=None):
        return torch.nn.Sequential(torch.nn.Linear(4, 512), torch.nn.Linear(512, 512), torch.nn.Linear(512, 2))

    graph = Graph(build())
    Trainer.setup_with(graph, build, lambda p: torch.optim.SGD(p, lr=1e-3),
                       DdpConfig(verbose=False, fixed_anchor=3, timeout_s=60))
    graph.set_data_loader([torch.randn(4) for _ in range(2 * 2 * 30)], batch_size=2, collate_fn=torch.stack)
    anchors = []
    for x in graph.epoch(0):
        graph.module(x).sum().backward()
        before = graph.training_step
        graph.step()
        if graph.training_step != before:
            anchors.append(graph.el_che().anchor)
    graph.close()
    return anchors, graph.training_step


def test_fixed_anchor_keeps_the_effective_batch_constant():
    anchors, steps = values(run_ranks(_fixed_anchor_rank, 2))[0]
    assert set(anchors) == {3} and steps == 10  # sync >> compute here, yet the window never grows


# --- stop flags ride in the window -------------------------------------------------------------------------------
def _flag_rank(rank: int, world: int):
    graph = Graph(torch.nn.Linear(2, 1))
    Trainer.setup_with(graph, lambda dev: torch.nn.Linear(2, 1), lambda p: torch.optim.SGD(p, lr=0.1),
                       DdpConfig(verbose=False, batch_sizes=[2, 2], anchor=2, freeze_plan=True, timeout_s=60))
    graph.set_data_loader([torch.ones(2)] * 32, batch_size=2, collate_fn=torch.stack)
    seen = []
    for i, x in enumerate(graph.epoch(0)):
        graph.module(x).sum().backward()
        if rank == 1 and i == 2:
            graph.raise_flag(1)
        before = graph.training_step
        graph.step()
        if graph.training_step != before:
            seen.append(graph.agreed_flags())
    graph.close()
    return seen


def test_a_flag_raised_on_one_rank_is_seen_by_all_after_the_window():
    for seen in values(run_ranks(_flag_rank, 2)):
        assert seen == [0, 2, 0, 0]


# --- failures ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("devices", [["cuda:0", "cpu"], ["cpu", "cuda"], ["mps", "cpu"]])
def test_mixed_device_lists_are_refused(devices):
    with pytest.raises(ValueError, match="mix|mps"):
        DdpConfig(devices=devices)


def test_mixed_devices_from_the_environment_are_refused(monkeypatch):
    monkeypatch.setenv("FLODL_HF_DEVICES", "cpu,cuda:0")
    with pytest.raises(ValueError, match="mix cpu and cuda"):
        DdpConfig().resolved_devices()


def _pending_rank(rank: int, world: int):
    graph = Graph(torch.nn.Linear(2, 1))
    Trainer.setup_with(graph, lambda dev: torch.nn.Linear(2, 1), lambda p: torch.optim.SGD(p, lr=0.1),
                       DdpConfig(verbose=False, batch_sizes=[2, 2], anchor=3, freeze_plan=True, timeout_s=60))
    graph.set_data_loader([torch.ones(2)] * 32, batch_size=2, collate_fn=torch.stack)
    for i, x in enumerate(graph.epoch(0)):
        graph.module(x).sum().backward()
        graph.step()
        if i == 4:
            break
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph.close()
    return [str(w.message) for w in caught]


def test_close_inside_a_window_says_what_it_discards():
    for rank, messages in enumerate(values(run_ranks(_pending_rank, 2))):
        assert len(messages) == 1 and "discards an unfinished El Che window: 2 micro-batch(es), 4 sample(s)" in \
            messages[0], messages


def _vanish_rank(rank: int, world: int):
    graph = Graph(torch.nn.Linear(2, 1))
    Trainer.setup_with(graph, lambda dev: torch.nn.Linear(2, 1), lambda p: torch.optim.SGD(p, lr=0.1),
                       DdpConfig(verbose=False, timeout_s=30))
    for i in range(5):
        if rank == 2 and i == 2:
            os._exit(7)
        graph.module(torch.ones(3, 2)).sum().backward()
        graph.step()
    graph.close()


def test_a_vanished_rank_is_named_by_every_survivor():
    start = time.monotonic()
    results = spawn_ranks(_vanish_rank, 3, timeout=60)  # a rank exits its process: fresh interpreters
    assert time.monotonic() - start < 30
    for status, message in results[:2]:
        assert status == "error" and "DistributedError" in message and "rank(s) [2] vanished" in message, message


def test_fixed_anchor_and_cap_settings_are_checked_and_reach_the_cli():
    from flodl_hf import cli

    with pytest.raises(ValueError, match="fixed_anchor=0 is invalid"):
        DdpConfig(fixed_anchor=0)
    with pytest.raises(ValueError, match="needs El Che on"):
        DdpConfig(fixed_anchor=2, max_anchor=0).el_che_kwargs(2, 8)
    assert DdpConfig(fixed_anchor=4).el_che_kwargs(2, 8)["min_anchor"] == 4
    with pytest.raises(ValueError, match="one cap per rank"):
        DdpConfig(max_micro_batch=[8, 8, 8]).el_che_kwargs(2, 8)
    args = cli.build_parser().parse_args(["train", "--fixed-anchor", "3", "--max-micro-batch", "24"])
    settings = cli.settings_from_args(args)
    config = settings.ddp_config()
    assert config.fixed_anchor == 3 and config.max_micro_batch == 24


def test_loss_items_rejects_bad_values():
    graph = Graph(torch.nn.Linear(2, 1))
    with pytest.raises(ValueError, match="reduction='avg' is unknown"):
        graph.loss_items(3, reduction="avg")
    with pytest.raises(ValueError, match="finite count >= 0"):
        graph.loss_items(float("nan"))
    with pytest.raises(ValueError, match="not a number"):
        graph.loss_items("three")


def _mixed_reduction_rank(rank: int, world: int):
    graph = Graph(torch.nn.Linear(2, 1))
    Trainer.setup_with(graph, lambda dev: torch.nn.Linear(2, 1), lambda p: torch.optim.SGD(p, lr=0.1),
                       DdpConfig(verbose=False, timeout_s=30))
    graph.module(torch.ones(3, 2)).sum().backward()
    graph.loss_items(3, reduction="sum" if rank == 1 else "mean")
    graph.step()


def test_ranks_declaring_different_reductions_are_told():
    for status, message in run_ranks(_mixed_reduction_rank, 2, timeout=60):
        assert status == "error" and "different loss reductions" in message, message


def test_the_exact_loop_example_runs_on_two_cpu_ranks(tmp_path):
    import subprocess
    from pathlib import Path

    from warm_python import python_command

    root = Path(__file__).resolve().parents[3]
    env = dict(os.environ, PYTHONPATH=str(root), FLODL_HF_DEVICES="cpu,cpu", OMP_NUM_THREADS="1")
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run(python_command(str(root / "examples" / "exact_loop.py")), cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "done: 128 micro-steps, 64 optimizer steps, final lr 0.0" in proc.stdout, proc.stdout
    assert "2 ranks" in proc.stderr
