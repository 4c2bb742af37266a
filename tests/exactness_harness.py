"""The seeded, randomized differential harness of setup mode (issue: "setup mode is exact for every real loop").

Each case is a random real fine-tuning loop -- world size 1-4, a random split that changes mid-run, anchors 1-8,
freeze and unfreeze events (also before setup), masked labels, mean / weighted / token-level / summed losses,
SGD / momentum / AdamW, gradient clipping, a transformers warmup-and-decay schedule, drop_last both ways, read-ahead
depth 0-3 (manual look-ahead or the prefetch thread) -- run on real gloo ranks through ``Trainer.setup_with``.
Every rank records which samples each of its micro-steps took and where the optimizer stepped; the reference then
replays the same samples in ONE process with plain PyTorch: per window, the loss over the concatenation of the
window's micro-batches divided by its own item count, one optimizer step, the scheduler advanced by the window's
micro-steps. Final parameters and the LR of every optimizer step must match (rtol 1e-5, fp32).

Loops practitioners write are drawn too: a transformers schedule stepped by the loop after
``graph.step()``; a rank skipping a bad batch's ``backward()`` (its declaration bound to the loss, so the batch
leaves the window: the reference leaves it out); gradient-enabled evaluations in eval mode before the forward and
between ``backward()`` and ``graph.step()``; submodules in eval mode and gradient checkpointing set before setup
(the replica must carry both); dropout under the documented RNG rule (each rank seeds its own generator after
setup; the reference replays every rank's forward passes, padding and skipped batches included, from that rank's
generator state); and a rank that skips a batch with ``continue``, which must be stopped at the window where it
happens, the windows before it equal to the reference.

Cases share spawned process groups (one per world size), so hundreds fit in the suite's time budget.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any, Optional

import torch
import torch.nn.functional as F

VOCAB, HIDDEN, CLASSES, SEQ = 11, 6, 3, 5
GROUPS = ("emb", "mix", "tok", "cls")
LOSSES = ("samples", "masked", "weighted", "token", "sum")
OPTIMIZERS = ("sgd", "momentum", "adamw")
CLASS_WEIGHTS = torch.tensor([0.5, 1.0, 2.0])
EVAL_ROWS = 3  # a mid-training evaluation's batch: the first rows of the data


class TokenNet(torch.nn.Module):
    """Embedding -> mixing layer -> a token-level head and a sample-level head: losses of both kinds, and a head
    that gets no gradient from the other kind of loss (its ``grad`` must stay None). ``gradient_checkpointing`` and
    dropout as transformers models have them (the attribute name is theirs: setup must carry it to the replica)."""

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, HIDDEN)
        self.mix = torch.nn.Linear(HIDDEN, HIDDEN)
        self.drop = torch.nn.Dropout(dropout)
        self.tok = torch.nn.Linear(HIDDEN, CLASSES)
        self.cls = torch.nn.Linear(HIDDEN, CLASSES)
        self.gradient_checkpointing = False

    def _mixed(self, e: torch.Tensor) -> torch.Tensor:
        return self.drop(torch.tanh(self.mix(e)))

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        e = self.emb(ids)
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            h = torch.utils.checkpoint.checkpoint(self._mixed, e, use_reentrant=False)  # recomputed in backward
        else:
            h = self._mixed(e)
        return self.tok(h), self.cls(h.mean(1))


def make_case(seed: int, world: Optional[int] = None) -> dict:
    """One random loop, as plain data (it travels to the ranks)."""
    rng = random.Random(seed)
    world = world or rng.randint(1, 4)
    batch = rng.randint(1, 5)
    global_batch = world * batch
    drop_last = rng.random() < 0.5
    steps = rng.randint(2, 9)
    n = steps * global_batch + (rng.randint(1, global_batch - 1) if global_batch > 1 and rng.random() < 0.7 else 0)
    epochs = rng.choice((1, 1, 2))
    total_steps = (n // global_batch if drop_last else -(-n // global_batch)) * epochs

    def split() -> list[int]:
        cuts = sorted(rng.sample(range(1, global_batch), world - 1)) if world > 1 else []
        edges = [0] + cuts + [global_batch]
        return [edges[i + 1] - edges[i] for i in range(world)]

    adaptive = world > 1 and rng.random() < 0.25  # El Che's own timing decisions, not only scripted ones
    events: list[tuple[int, str, Any]] = []
    for _ in range(rng.randint(0, 4)):
        events.append((rng.randrange(total_steps), "freeze", (rng.choice(GROUPS), rng.random() < 0.5)))
    if world > 1:
        for _ in range(rng.randint(1, 4)):
            events.append((rng.randrange(total_steps), "anchor", rng.randint(1, 8)))
        for _ in range(rng.randint(0 if adaptive else 1, 3)):
            events.append((rng.randrange(total_steps), "split", split()))
    events.sort(key=lambda e: e[0])
    loss = rng.choice(LOSSES)
    micro_steps = total_steps  # micro-steps per rank over the run
    bind = rng.random() < 0.6  # declarations bound to their loss (graph.loss_items(n, loss=loss)), as heads do
    skips = sorted({(rng.randrange(micro_steps), rng.randrange(world)) for _ in range(rng.randint(1, 3))}) \
        if bind and rng.random() < 0.4 else []
    evals = sorted({(rng.randrange(micro_steps), rng.choice(("before", "between")))
                    for _ in range(rng.randint(1, 3))}) if bind and rng.random() < 0.3 else []
    cont = (rng.randrange(micro_steps), rng.randrange(world)) if world > 1 and rng.random() < 0.08 else None
    case = {
        "seed": seed, "world": world, "batch": batch, "n": n, "epochs": epochs, "drop_last": drop_last,
        "sizes": split(), "anchor": rng.randint(1, 8), "adaptive": adaptive,
        "frozen_at_setup": [g for g in GROUPS if rng.random() < 0.15],
        "events": events, "loss": loss,
        "mask": 0.0 if loss == "samples" else rng.choice((0.0, 0.3, 0.7, 1.0)),
        "optimizer": rng.choice(OPTIMIZERS), "lr": rng.choice((0.05, 0.2)),
        "clip": rng.choice((None, None, 0.3)),
        "schedule": rng.choice((None, "linear", "cosine")),
        "readahead": rng.randint(0, 3), "prefetch_thread": rng.random() < 0.3,
        "data_seed": rng.randrange(1 << 30),
        # overlap of the all-reduce with backward; tiny buckets give every parameter its own (early) launch
        "overlap": rng.random() < 0.75, "bucket_mb": rng.choice((0.0001, 0.0002, 25.0)),
        # the loops practitioners write
        "user_schedule": rng.random() < 0.5, "bind": bind, "skips": skips, "evals": evals, "continue_at": cont,
        "eval_at_setup": [g for g in ("mix", "drop", "cls") if rng.random() < 0.2],
        "checkpointing": rng.random() < 0.25, "dropout": rng.choice((0.0, 0.0, 0.2)),
        "lora": rng.random() < 0.15,  # a peft LoRA model (adapters on the mixing layer), as most fine-tuning is now
    }
    if case["readahead"] and not case["prefetch_thread"]:
        # a loop that holds batches itself: a `continue` in the last micro-steps of an epoch leaves every count as
        # a plain loop's would be (the documented limit); it is caught one window later
        case["continue_at"] = None
    return case


def make_data(case: dict) -> list[tuple[int, torch.Tensor, torch.Tensor, int]]:
    """(index, token ids, token labels, sample label) rows; masked labels are -100."""
    g = torch.Generator().manual_seed(case["data_seed"])
    ids = torch.randint(0, VOCAB, (case["n"], SEQ), generator=g)
    tok = (ids % CLASSES).clone()
    cls = (ids.sum(1) % CLASSES).clone()
    tok[torch.rand(case["n"], SEQ, generator=g) < case["mask"]] = -100
    cls[torch.rand(case["n"], generator=g) < case["mask"]] = -100
    return [(i, ids[i], tok[i], int(cls[i])) for i in range(case["n"])]


def collate(items: list) -> tuple[list[int], torch.Tensor, torch.Tensor, torch.Tensor]:
    return ([int(i) for i, *_ in items], torch.stack([r[1] for r in items]), torch.stack([r[2] for r in items]),
            torch.tensor([r[3] for r in items]))


def loss_sum_and_items(case: dict, model: torch.nn.Module, ids: torch.Tensor, tok: torch.Tensor,
                       cls: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The un-normalised loss of a micro-batch and the number of items its mean is over."""
    tok_logits, cls_logits = model(ids)
    kind = case["loss"]
    if kind in ("samples", "masked"):
        return F.cross_entropy(cls_logits, cls, ignore_index=-100, reduction="sum"), float((cls != -100).sum())
    if kind == "weighted":
        keep = cls != -100
        per = F.cross_entropy(cls_logits, cls.clamp(min=0), reduction="none")
        w = CLASS_WEIGHTS.to(cls.device)[cls.clamp(min=0)] * keep
        return (per * w).sum(), float(w.sum())
    flat_logits, flat = tok_logits.reshape(-1, CLASSES), tok.reshape(-1)
    return F.cross_entropy(flat_logits, flat, ignore_index=-100, reduction="sum"), float((flat != -100).sum())


def make_optimizer(case: dict, params: Any) -> torch.optim.Optimizer:
    kind, lr = case["optimizer"], case["lr"]
    if case["loss"] == "sum":
        lr *= 0.02  # a summed loss is ~tokens-per-window times larger: a user scales the LR down the same way
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if kind == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    return torch.optim.AdamW(params, lr=lr * 0.1, weight_decay=0.05)


def make_schedule(case: dict, optimizer: torch.optim.Optimizer, total: int) -> Any:
    from transformers import get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup

    if case["schedule"] is None:
        return None
    warmup = max(1, total // 5)
    maker = get_linear_schedule_with_warmup if case["schedule"] == "linear" else get_cosine_schedule_with_warmup
    return maker(optimizer, warmup, total)


def set_group(model: torch.nn.Module, group: str, trainable: bool) -> None:
    getattr(core(model), group).requires_grad_(trainable)


def architecture(case: dict) -> torch.nn.Module:
    """What the factory builds on each rank: a TokenNet, or a peft LoRA model around one."""
    model = TokenNet(case.get("dropout", 0.0))
    if case.get("lora"):
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, lora_dropout=0.0, target_modules=["mix"],
                                                 init_lora_weights=False))  # both adapter matrices random
    return model


def core(model: torch.nn.Module) -> TokenNet:
    """The TokenNet inside (a peft model's base model)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def build(case: dict, seed_offset: int = 0) -> torch.nn.Module:
    torch.manual_seed(case["seed"] * 7 + seed_offset)
    model = architecture(case)
    for group in case["frozen_at_setup"]:
        set_group(model, group, False)
    for group in case.get("eval_at_setup", []):
        getattr(core(model), group).eval()
    core(model).gradient_checkpointing = bool(case.get("checkpointing"))
    return model


def rank_seed(case: dict, rank: int) -> int:
    """The documented dropout rule: each rank seeds its own torch generator (here, after setup)."""
    return case["seed"] * 101 + rank + 1


def modes(model: torch.nn.Module) -> list:
    return [(name, m.training) for name, m in model.named_modules()] + [("ckpt",
                                                                         bool(core(model).gradient_checkpointing))]


# --- the rank side ---------------------------------------------------------------------------------------------
def _declare(graph: Any, case: dict, loss: torch.Tensor, items: float) -> torch.Tensor:
    """Declare what the micro-batch's loss averages over, the way the case's loop does; the loss to backpropagate."""
    bound = {"loss": loss} if case.get("bind") else {}
    if case["loss"] == "sum":
        graph.loss_items(items, reduction="sum", **bound)
        return loss
    if case["loss"] != "samples" or case.get("bind"):
        graph.loss_items(items, **bound)
    return loss / items if items > 0 else loss * 0.0


def _evaluate(graph: Any, case: dict, data: list) -> None:
    """A mid-training evaluation that forgot torch.no_grad(): eval mode, a loss that declares its items, train mode
    restored as it was (submodules in eval mode at setup stay so)."""
    saved = [(m, m.training) for m in graph.module.modules()]
    graph.module.eval()
    _, ids, tok, cls = collate(data[:EVAL_ROWS])
    loss, items = loss_sum_and_items(case, graph.module, ids.to(graph.device), tok.to(graph.device),
                                     cls.to(graph.device))
    _declare(graph, case, loss, items)
    for m, training in saved:
        m.training = training


def run_case_on_rank(rank: int, world: int, case: dict) -> dict:
    from flodl_hf import DdpConfig, Graph, Trainer
    from flodl_hf.distributed.context import DistributedError

    graph = Graph(build(case, seed_offset=rank))  # rank 0's weights must win (setup broadcasts them)
    cfg = DdpConfig(verbose=False, timeout_s=60, seed=case["seed"], drop_last=case["drop_last"],
                    max_grad_norm=case["clip"], anchor=case["anchor"] if world > 1 else None,
                    max_anchor=8 if world > 1 else None,  # windows of 1-8: the opt-in to longer windows
                    batch_sizes=None if case["adaptive"] or world == 1 else case["sizes"],
                    freeze_plan=not case["adaptive"], overlap=case["overlap"], bucket_mb=case["bucket_mb"],
                    lr_scaling=case.get("lr_scaling", "none"))
    Trainer.setup_with(graph, lambda dev: architecture(case), lambda ps: make_optimizer(case, ps), cfg)
    carried = modes(graph.module)
    torch.manual_seed(rank_seed(case, rank))  # the dropout rule: each rank's own generator
    data = make_data(case)
    graph.set_data_loader(data, batch_size=case["batch"], collate_fn=collate)
    total = graph.total_steps(case["epochs"])
    schedule = make_schedule(case, graph.optimizer, total)
    user_schedule = schedule is not None and case.get("user_schedule")
    if schedule is not None and not user_schedule:
        graph.set_scheduler(schedule)
    lrs: list[float] = []
    graph.optimizer.register_step_pre_hook(lambda opt, args, kwargs: lrs.append(opt.param_groups[0]["lr"]))
    events = deque(case["events"])
    skips, evals = set(map(tuple, case.get("skips", []))), set(map(tuple, case.get("evals", [])))
    cont = tuple(case["continue_at"]) if case.get("continue_at") else None
    micro: list[tuple[list[int], int, bool]] = []  # per micro-step: indices, real samples, stepped
    step = 0
    error = None
    try:
        for epoch in range(case["epochs"]):
            depth = case["readahead"]
            if case["prefetch_thread"] and depth > 0:
                source = iter(graph.epoch(epoch, prefetch=depth))
                depth = 0
            else:
                source = iter(graph.epoch(epoch))
            ahead: deque = deque()
            while True:
                while len(ahead) < depth + 1:
                    try:
                        ahead.append(next(source))
                    except StopIteration:
                        break
                if not ahead:
                    break
                index, ids, tok, cls = ahead.popleft()
                if cont == (step, rank):
                    step += 1
                    continue  # skipped without graph.step(): must be stopped in this window
                ids, tok, cls = ids.to(graph.device), tok.to(graph.device), cls.to(graph.device)
                while events and events[0][0] <= step:
                    _, what, arg = events.popleft()
                    if what == "freeze":
                        set_group(graph.module, *arg)
                    elif what == "anchor" and graph.el_che() is not None:
                        graph.el_che().set_anchor(arg)
                    elif what == "split" and graph.el_che() is not None:
                        graph.el_che().set_batch_sizes(arg)
                real = graph._pending[0][2]  # whitebox: padding is checked independently by the coverage assertion
                if (step, "before") in evals:
                    _evaluate(graph, case, data)
                loss, items = loss_sum_and_items(case, graph.module, ids, tok, cls)
                loss = _declare(graph, case, loss, items)
                # a skipped bad batch: no backward; everything on its path frozen: step() without backward() too
                if loss.requires_grad and (step, rank) not in skips:
                    loss.backward()
                if (step, "between") in evals:
                    _evaluate(graph, case, data)
                before = graph.training_step
                graph.step()
                if user_schedule:
                    schedule.step()  # the loop's own schedule, stepped after every graph.step()
                micro.append((index, real, graph.training_step != before))
                step += 1
        overlap = getattr(graph._runtime, "overlap", None)
        early = overlap.launched_early if overlap is not None else 0  # whitebox: buckets started during backward
        graph.close()
    except DistributedError as exc:
        if cont is None:
            raise
        error, early = str(exc), 0
    params = {name: p.detach().clone() for name, p in graph.module.named_parameters()}
    history = graph.el_che().history if graph.el_che() is not None else []
    return {"micro": micro, "lrs": lrs, "params": params, "early": early, "modes": carried, "error": error,
            "windows": graph.training_step, "gains": [h.get("lr_gain", 1.0) for h in history]}


def run_cases_on_rank(rank: int, world: int, cases: list[dict]) -> list[dict]:
    return [run_case_on_rank(rank, world, case) for case in cases]


# --- the reference -----------------------------------------------------------------------------------------------
def reference(case: dict, micro_by_rank: list[list[tuple[list[int], int, bool]]],
              windows: Optional[int] = None) -> tuple[dict, list[float]]:
    """One process, plain PyTorch: replay every window's micro-batches (all ranks') as one concatenated batch.

    With dropout, each rank's forward passes are replayed from that rank's generator (seeded as the rank seeded it),
    padding and skipped batches included, since they drew from it too. ``windows``: replay only that many."""
    data = make_data(case)
    model = build(case)
    optimizer = make_optimizer(case, model.parameters())
    global_batch = case["world"] * case["batch"]
    per_epoch = case["n"] // global_batch if case["drop_last"] else -(-case["n"] // global_batch)
    schedule = make_schedule(case, optimizer, per_epoch * case["epochs"])
    skips = set(map(tuple, case.get("skips", [])))  # evaluations change nothing: the reference has none
    streams = []
    for r in range(case["world"]):
        torch.manual_seed(rank_seed(case, r))
        streams.append(torch.get_rng_state())
    lrs: list[float] = []
    events = deque(case["events"])
    stepped = [m[2] for m in micro_by_rank[0]]
    window: list[int] = []
    for k, ends in enumerate(stepped):
        window.append(k)
        if not ends:
            continue
        if windows is not None and len(lrs) == windows:
            break
        total_items = 0.0
        for j in window:
            while events and events[0][0] <= j:
                _, what, arg = events.popleft()
                if what == "freeze":
                    set_group(model, *arg)
            for r in range(case["world"]):
                index, real, _ = micro_by_rank[r][j]
                torch.set_rng_state(streams[r])
                _, ids, tok, cls = _batch(data, index)  # the rank's whole micro-batch: padding draws dropout too
                loss, items = loss_sum_and_items(case, model, ids, tok, cls)
                streams[r] = torch.get_rng_state()
                if real == 0:
                    continue  # padding only: no weight
                if case.get("bind") and ((j, r) in skips or not loss.requires_grad):
                    continue  # a bound declaration counts only a backpropagated loss: one process leaves it out
                total_items += items if case["loss"] != "sum" else 1.0
                if loss.requires_grad:
                    loss.backward()
        if case["loss"] != "sum":
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.div_(total_items if total_items > 0 else 1.0)
        if case["clip"] is not None:
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], case["clip"])
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if schedule is not None:
            for _ in window:
                schedule.step()
        window = []
    return {name: p.detach() for name, p in model.named_parameters()}, lrs


def _batch(data: list, idx: list[int]) -> tuple:
    return collate([data[i] for i in idx])


def check_case(case: dict, results: list[dict]) -> None:
    """Assert one case: coverage of every epoch, identical replicas, parameters and LRs equal the reference."""
    world = case["world"]
    micro = [r["micro"] for r in results]
    for r in range(world):
        assert results[r]["modes"] == modes(build(case)), f"case {case['seed']}: rank {r}'s replica lost a setting"
    if case.get("continue_at"):
        _check_continue(case, results)
        return
    steps = {len(m) for m in micro}
    assert len(steps) == 1, f"case {case['seed']}: ranks ran {steps} micro-steps"
    global_batch = world * case["batch"]
    per_epoch = case["n"] // global_batch if case["drop_last"] else -(-case["n"] // global_batch)
    for epoch in range(case["epochs"]):
        seen = [i for r in range(world) for (index, real, _) in micro[r][epoch * per_epoch:(epoch + 1) * per_epoch]
                for i in index[:real]]
        expected = per_epoch * global_batch if case["drop_last"] else case["n"]
        assert len(seen) == len(set(seen)) == expected, (
            f"case {case['seed']} epoch {epoch}: {len(seen)} samples, {len(set(seen))} distinct, want {expected}")
    assert all(m[-1][2] for m in micro), f"case {case['seed']}: the run ended inside a window"
    _check_replicas(case, results)
    want_params, want_lrs = reference(case, micro)
    got_lrs = results[0]["lrs"]
    assert len(got_lrs) == len(want_lrs), f"case {case['seed']}: {len(got_lrs)} optimizer steps, want {len(want_lrs)}"
    torch.testing.assert_close(torch.tensor(got_lrs, dtype=torch.float64), torch.tensor(want_lrs, dtype=torch.float64),
                               rtol=1e-9, atol=1e-12, msg=lambda m: f"case {case['seed']} LRs: {m}")
    _check_params(case, results[0]["params"], want_params)


def _check_replicas(case: dict, results: list[dict]) -> None:
    for r in range(1, case["world"]):
        for name, p in results[r]["params"].items():
            assert torch.equal(p, results[0]["params"][name]), f"case {case['seed']}: rank {r} {name} differs"


def _check_params(case: dict, got: dict, want: dict) -> None:
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6,
                                   msg=lambda m, name=name: f"case {case['seed']} ({_describe(case)}) {name}: {m}")


def _check_continue(case: dict, results: list[dict]) -> None:
    """A rank skipped a batch with ``continue``: every rank stops at the window that holds the skipped micro-step,
    with the windows before it applied exactly as the reference applies them, and no more."""
    at, rank = case["continue_at"]
    before = sum(1 for _, _, stepped in results[0]["micro"][:at] if stepped)
    for r, result in enumerate(results):
        error = result["error"]
        assert error is not None, f"case {case['seed']}: rank {r} never heard that rank {rank} skipped a batch"
        assert ("`continue`" in error and "graph.step()" in error) or "different numbers of steps" in error, error
        assert result["windows"] == before, (
            f"case {case['seed']}: rank {r} applied {result['windows']} windows; the skip was after {before}")
    _check_replicas(case, results)
    want_params, _ = reference(case, [r["micro"] for r in results], windows=before)
    _check_params(case, results[0]["params"], want_params)


def _describe(case: dict) -> str:
    keys = ("world", "batch", "n", "epochs", "drop_last", "anchor", "adaptive", "loss", "mask", "optimizer", "clip",
            "schedule", "readahead", "prefetch_thread", "frozen_at_setup", "overlap", "bucket_mb", "user_schedule",
            "bind", "skips", "evals", "continue_at", "eval_at_setup", "checkpointing", "dropout")
    return ", ".join(f"{k}={case[k]}" for k in keys) + f", events={case['events']}"
