"""Loops a practitioner writes that setup mode must train exactly on N ranks or refuse before any update.

Each loop runs on 2 and 3 real gloo ranks through a task head (or a plain transformers model where the loop is
about the model object) and is compared with a one-process replay written out here with plain transformers: the
window's samples (each epoch's ``torch.randperm`` cut by the pinned split) as one batch, the model's own loss, one
optimizer step. The plan is pinned (``batch_sizes``, ``anchor``, ``freeze_plan``) so nothing depends on timing.

1. the loop steps its own transformers LR schedule after ``graph.step()``;
2. a rank skips a bad batch: ``compute_loss`` (which declares its items), no ``backward()``, ``graph.step()``;
3. a gradient-enabled evaluation (``head.eval()``, a loss on an eval batch, ``head.train()``) before the training
   forward and between its ``backward()`` and ``graph.step()``;
4. the loop calls the model object it wrapped instead of ``graph.module`` (also on one device): refused;
5. settings made on the model before setup (a submodule in eval mode, gradient checkpointing) reach the replica;
7. a rank skips a batch with ``continue``: refused at the window where it happens, before that window's update.
The dropout rule (6) is checked in ``test_setup_dropout_rule``.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import BertForSequenceClassification, get_linear_schedule_with_warmup

import tiny_models
from dist_helpers import run_ranks, values
from flodl_hf import DdpConfig, Graph, Trainer
from flodl_hf.distributed.context import DistributedError
from heads import AutoHeadForSequenceClassification

ROWS = tiny_models.toy_task(96, seed=1)
SIZES = {1: [4], 2: [5, 3], 3: [5, 3, 4]}  # per-rank micro-batch sizes (batch_size 4 per rank)
ANCHOR, SEED, LR, WARMUP = 3, 3, 1.0, 4
CONTINUE_AT = (3, 5)  # the first and the last micro-step of window 1
TOL = dict(rtol=1e-5, atol=1e-5)


def _config(**dropout):
    config = tiny_models.tiny_config("bert", num_labels=2)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    for key, value in dropout.items():
        setattr(config, key, value)
    return config


def _plan(world: int) -> DdpConfig:
    if world == 1:
        return DdpConfig(verbose=False, seed=SEED)
    return DdpConfig(verbose=False, batch_sizes=SIZES[world], anchor=ANCHOR, freeze_plan=True, seed=SEED,
                     timeout_s=60)


def _windows(world: int) -> list[list[tuple[int, int, list[int]]]]:
    """The pinned plan written out: windows of (micro-step, rank, sample ids); epoch 0 is ``randperm`` seeded SEED."""
    perm = torch.randperm(len(ROWS), generator=torch.Generator().manual_seed(SEED)).tolist()
    sizes, g = SIZES[world], sum(SIZES[world])
    anchor = ANCHOR if world > 1 else 1
    steps = len(ROWS) // g
    micro = [[(j, r, perm[j * g + sum(sizes[:r]): j * g + sum(sizes[:r + 1])]) for r in range(world)]
             for j in range(steps)]
    return [[piece for step in micro[k:k + anchor] for piece in step] for k in range(0, steps, anchor)]


def _head(rank: int = 0):
    torch.manual_seed(5 + rank)  # other weights on other ranks: setup must broadcast rank 0's
    return AutoHeadForSequenceClassification.from_config(_config(), tokenizer=tiny_models.tiny_tokenizer("bert"))


def _state(module: torch.nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _reference(world: int, loop: str, skipped: frozenset = frozenset()) -> tuple[dict, dict]:
    """One process, plain transformers: (final state, initial state)."""
    head = _head(0)
    model = head.model.train()
    start = _state(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    windows = _windows(world)
    total = sum(len({j for j, _, _ in w}) for w in windows)
    schedule = get_linear_schedule_with_warmup(optimizer, WARMUP, total) if loop == "user-schedule" else None
    for window in windows:
        ids = [i for j, r, piece in window if (j, r) not in skipped for i in piece]
        enc = head.encode([ROWS[i][0] for i in ids])
        model(**enc, labels=torch.tensor([ROWS[i][1] for i in ids])).loss.backward()
        optimizer.step()  # the LR the schedule holds at the window's first micro-step
        optimizer.zero_grad()
        for _ in {j for j, _, _ in window}:
            if schedule is not None:
                schedule.step()
    return _state(model), start


def _evaluate(head, batch) -> float:
    """A mid-training evaluation that forgot torch.no_grad(): eval mode, a loss (which declares items), train."""
    head.eval()
    loss = head.compute_loss(*batch)
    head.train()
    return float(loss)


def _trained_head(rank: int, world: int) -> tuple:
    """(head, graph) of this rank, set up on the pinned plan with SGD, its data loader set."""
    head = _head(rank)
    config = _config()
    Trainer.setup_head_with(head, lambda dev: AutoHeadForSequenceClassification.on_device(config, 2, dev),
                            lambda p: torch.optim.SGD(p, lr=LR), _plan(world))
    graph = head.graph()
    graph.set_data_loader(ROWS, batch_size=4, collate_fn=head.collate)
    return head, graph


def _loop_rank(rank: int, world: int, loop: str, skipped: frozenset) -> dict:
    head, graph = _trained_head(rank, world)
    schedule = None
    if loop == "user-schedule":  # built on graph.optimizer and stepped by the loop, as every HF script does
        schedule = get_linear_schedule_with_warmup(graph.optimizer, WARMUP, graph.total_steps(1))
    eval_batch = head.collate(ROWS[:6])
    for j, (enc, labels) in enumerate(graph.epoch(0)):
        if loop == "grad-eval" and j % 4 == 1:
            _evaluate(head, eval_batch)  # before the training forward
        loss = head.compute_loss(enc, labels)
        if (j, rank) in skipped:  # a bad batch: no backward, graph.step() still called
            graph.step()
            continue
        loss.backward()
        if loop == "grad-eval" and j % 4 == 2:
            _evaluate(head, eval_batch)  # between backward and graph.step()
        graph.step()
        if schedule is not None:
            schedule.step()
    graph.close()
    return _state(head.model)


def _assert_same(got: dict, want: dict, start: dict, what: str) -> None:
    moved = max(float((want[k] - start[k]).abs().max()) for k in want if want[k].is_floating_point())
    assert moved > 1e-3, f"{what}: the reference barely moved ({moved:.2e}); the comparison would prove nothing"
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, **TOL,
                                   msg=lambda m, name=name: f"{what} {name} (reference moved {moved:.2e}): {m}")


def _all_rank(rank: int, world: int) -> dict:
    """Every multi-rank loop of this module in one process group (spawning ranks costs more than the loops)."""
    out: dict = {}
    for loop in LOOPS:
        out[loop] = _loop_rank(rank, world, loop, _skipped(loop, world))
    for at in CONTINUE_AT:
        out[("continue", at)] = _continue_rank(rank, world, at)
    out["stale"] = _stale_rank(rank, world)
    out["carry"] = _carry_rank(rank, world)
    return out


_RUNS: dict[int, list[dict]] = {}


def _runs(world: int) -> list[dict]:
    """Each rank's results of :func:`_all_rank` on ``world`` ranks, run once per test session."""
    if world not in _RUNS:
        _RUNS[world] = values(run_ranks(_all_rank, world, timeout=600))
    return _RUNS[world]


def _skipped(loop: str, world: int) -> frozenset:
    return LOOPS[loop] | (frozenset({(4, 2)}) if loop == "skip-backward" and world == 3 else frozenset())


LOOPS = {
    "user-schedule": frozenset(),
    "skip-backward": frozenset({(4, 1), (7, 0)}),  # (micro-step, rank)
    "grad-eval": frozenset(),
}


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("loop", list(LOOPS))
def test_the_loop_trains_what_one_process_trains(world, loop):
    results = [r[loop] for r in _runs(world)]
    want, start = _reference(world, loop, _skipped(loop, world))
    for rank, got in enumerate(results):
        _assert_same(got, want, start, f"{loop} on {world} ranks, rank {rank}")


# --- 4. the model object that was wrapped ------------------------------------------------------------------------
def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def _stale_rank(rank: int, world: int) -> dict:
    torch.manual_seed(0)
    model = _mlp()
    graph = Graph(model)
    Trainer.setup_with(graph, lambda dev: _mlp(), lambda p: torch.optim.SGD(p, lr=0.1), _plan(world))
    before, source = _state(graph.module), _state(model)
    x, y = torch.randn(4, 4), torch.tensor([0, 1, 0, 1])
    try:
        for _ in range(2 * ANCHOR):
            torch.nn.functional.cross_entropy(model(x), y).backward()  # the wrapped model, not graph.module
            graph.step()
    except ValueError as exc:
        unchanged = all(torch.equal(a, b) for a, b in zip(before.values(), _state(graph.module).values()))
        return {"error": str(exc), "step": graph.training_step, "unchanged": unchanged,
                "source_unchanged": all(torch.equal(a, b) for a, b in zip(source.values(), _state(model).values()))}
    return {"error": None}


@pytest.mark.parametrize("world", [1, 2, 3])
def test_a_loop_that_calls_the_wrapped_model_is_refused_at_the_first_step(world):
    results = [_stale_rank(0, 1)] if world == 1 else [r["stale"] for r in _runs(world)]
    for r in results:
        assert r["error"] is not None, "the loop trained nothing and was not told"
        assert "graph.module" in r["error"] and "model object given to Graph" in r["error"], r["error"]
        assert r["step"] == 0 and r["unchanged"] and r["source_unchanged"]


def test_a_backward_before_setup_is_not_taken_for_the_loop():
    torch.manual_seed(0)
    model = _mlp()
    torch.nn.functional.cross_entropy(model(torch.randn(3, 4)), torch.tensor([0, 1, 1])).backward()  # a sanity check
    graph = Graph(model)
    Trainer.setup_with(graph, lambda dev: _mlp(), lambda p: torch.optim.SGD(p, lr=0.1), DdpConfig(verbose=False))
    torch.nn.functional.cross_entropy(graph.module(torch.randn(3, 4)), torch.tensor([0, 1, 1])).backward()
    graph.step()
    assert graph.training_step == 1


# --- 5. settings made on the model before setup ------------------------------------------------------------------
def _probing_model() -> BertForSequenceClassification:
    """A partly frozen BERT whose encoder stays in eval mode (its dropout off) while the classifier trains, with
    gradient checkpointing on: what a linear-probing or memory-bound script sets before handing the model over."""
    torch.manual_seed(5)
    model = BertForSequenceClassification(_config(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                                                  classifier_dropout=0.0))
    model.train()
    model.bert.embeddings.requires_grad_(False)
    model.bert.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers 5 renamed it activation_checkpointing_enable
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def _is_checkpointing(model: torch.nn.Module) -> bool:
    """transformers' own answer (``is_activation_checkpointing`` in 5.x, ``is_gradient_checkpointing`` before)."""
    name = "is_activation_checkpointing" if hasattr(type(model), "is_activation_checkpointing") else \
        "is_gradient_checkpointing"
    return bool(getattr(model, name))


def _checkpointing(model: torch.nn.Module) -> list[tuple[str, bool]]:
    return [(n, bool(m.gradient_checkpointing)) for n, m in model.named_modules()
            if hasattr(m, "gradient_checkpointing")]


_TOKENIZER: list = []


def _batch(ids: list[int]) -> tuple[dict, torch.Tensor]:
    if not _TOKENIZER:
        _TOKENIZER.append(tiny_models.tiny_tokenizer("bert"))
    enc = _TOKENIZER[0]([ROWS[i][0] for i in ids], padding=True, return_tensors="pt")
    return dict(enc), torch.tensor([ROWS[i][1] for i in ids])


def _carry_rank(rank: int, world: int) -> dict:
    source = _probing_model()
    graph = Graph(source)
    Trainer.setup_with(graph, lambda dev: BertForSequenceClassification(source.config),
                       lambda p: torch.optim.SGD([q for q in p if q.requires_grad], lr=LR), _plan(world))
    replica = graph.module
    out = {"training": [(n, m.training) for n, m in replica.named_modules()],
           "checkpointing": _checkpointing(replica), "is_checkpointing": _is_checkpointing(replica), "frozen": [n for n, p in replica.named_parameters()
                                                                 if not p.requires_grad]}
    graph.set_data_loader(list(range(len(ROWS))), batch_size=4, collate_fn=_batch)
    for enc, labels in graph.epoch(0):
        replica(**enc, labels=labels).loss.backward()
        graph.step()
    graph.close()
    out["state"] = _state(replica)
    return out


@pytest.mark.parametrize("world", [1, 2, 3])
def test_eval_mode_and_checkpointing_set_before_setup_reach_the_replica(world):
    results = [_carry_rank(0, 1)] if world == 1 else [r["carry"] for r in _runs(world)]
    source = _probing_model()
    want_training = [(n, m.training) for n, m in source.named_modules()]
    assert any(not t for _, t in want_training) and any(t for _, t in want_training)
    # the reference: the source model itself, one process, each window's samples as one batch
    start = _state(source)
    optimizer = torch.optim.SGD([p for p in source.parameters() if p.requires_grad], lr=LR)
    for window in _windows(world):
        enc, labels = _batch([i for _, _, piece in window for i in piece])
        source(**enc, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    for rank, r in enumerate(results):
        assert r["training"] == want_training, f"rank {rank}: train/eval flags differ from the source's"
        assert r["checkpointing"] == _checkpointing(source) and any(on for _, on in r["checkpointing"])
        assert r["is_checkpointing"] is _is_checkpointing(source) is True
        assert r["frozen"] == [n for n, p in source.named_parameters() if not p.requires_grad]
        _assert_same(r["state"], _state(source), start, f"eval-mode encoder with checkpointing, rank {rank}")


def test_a_model_entirely_in_eval_mode_trains_as_it_is_and_says_so():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 2)).eval()
    graph = Graph(model)
    with pytest.warns(UserWarning, match=r"eval mode \(dropout off\).*call model.train\(\) before setup"):
        Trainer.setup_with(graph, lambda dev: torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2),
                                                                  torch.nn.Linear(8, 2)),
                           lambda p: torch.optim.SGD(p, lr=0.1), DdpConfig())
    assert not any(m.training for m in graph.module.modules())
    model.train()
    graph = Graph(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        Trainer.setup_with(graph, lambda dev: torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2),
                                                                  torch.nn.Linear(8, 2)),
                           lambda p: torch.optim.SGD(p, lr=0.1), DdpConfig())
    assert all(m.training for m in graph.module.modules())


# --- 7. a rank that skips a batch with `continue` --------------------------------------------------------------
def _continue_rank(rank: int, world: int, at: int) -> dict:
    head, graph = _trained_head(rank, world)
    try:
        for j, (enc, labels) in enumerate(graph.epoch(0)):
            if rank == world - 1 and j == at:
                continue  # skipped without graph.step()
            head.compute_loss(enc, labels).backward()
            graph.step()
        graph.close()
    except DistributedError as exc:
        return {"error": str(exc), "step": graph.training_step, "state": _state(head.model)}
    return {"error": None, "step": graph.training_step}


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("at", CONTINUE_AT)
def test_a_rank_that_skips_a_batch_with_continue_is_stopped_in_that_window(world, at):
    results = [r[("continue", at)] for r in _runs(world)]
    window = at // ANCHOR
    # the windows before it, replayed in one process
    head = _head(0)
    model = head.model.train()
    start = _state(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for w in _windows(world)[:window]:
        ids = [i for _, _, piece in w for i in piece]
        labels = torch.tensor([ROWS[i][1] for i in ids])
        model(**head.encode([ROWS[i][0] for i in ids]), labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    for rank, r in enumerate(results):
        assert r["error"] is not None and "`continue`" in r["error"] and "graph.step()" in r["error"], r
        assert f"rank {world - 1} has 1 more batch" in r["error"], r["error"]
        assert r["step"] == window, f"rank {rank} applied {r['step']} windows; the skip was in window {window}"
        _assert_same(r["state"], _state(model), start, f"continue at micro-step {at}, rank {rank}")
