"""The builder-mode bench runs: ``builder-{sync,cadence,async}/{nccl,cpu}`` (policy / averaging backend).

Why it exists: builder mode owns its loop and spawns its own workers (a coordinator thread in the caller, one
worker process per device), so it cannot run inside the rank pool; this module drives it through its public API
(``Trainer.builder(...).dataset().batch_size().num_epochs().policy().backend().devices().simulate_speeds()``)
with the same workload, data and per-batch modelled time as the other modes.

Differences from the other modes, stated in the report:

- Speed modelling: the builder gives its factories no rank, so the modelled time is slept at speed 1.0 by the
  same device model, and the builder's own ``simulate_speeds`` stretches each whole batch to ``time / speed``.
  With the bench's tiny models the real compute (the only part modelled differently) is ~1 ms per batch.
- Throughput: 2 epochs over the run's ``steps * W * batch_size`` samples; the first epoch (worker start-up,
  El Che calibration) is untimed; samples/s = samples of epoch 2 / its ``epoch_ms``.
- Accuracy: one epoch per ``eval_every * W * batch_size`` samples (the data is the same and visited once, in
  consecutive chunks: a chunked dataset told its epoch by ``epoch_fn``); the averaged model of each epoch is
  checkpointed by the builder and evaluated afterwards, off the clock, at the cumulative ``epoch_ms``. The
  builder checkpoints the state of the first average after an epoch ends, which may include a few batches more.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Any, Optional

import torch

from .device_model import DeviceModel
from .meter import RunSpec
from .workloads import WorkloadSpec, build_workload

__all__ = ["run_builder", "ChunkedDataset"]

_THROUGHPUT_EPOCHS = 2


class ChunkedDataset(torch.utils.data.Dataset):
    """Epoch ``e`` shows chunk ``e`` of ``base`` (``len(base) // chunks`` items); :meth:`set_epoch` (passed to
    the builder as ``epoch_fn``) moves it on. Pickled together with the recipe, so each worker's copy is told."""

    def __init__(self, base: Any, chunks: int) -> None:
        self.base, self.chunks = base, int(chunks)
        self.size = len(base) // self.chunks
        self.epoch = 0

    def set_epoch(self, epoch: int, model: Any = None) -> None:
        if epoch < self.epoch:
            raise RuntimeError(f"chunked dataset went back from epoch {self.epoch} to {epoch}")
        self.epoch = epoch

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> Any:
        return self.base[(self.epoch % self.chunks) * self.size + int(i)]


def _model(wspec: WorkloadSpec, device_ms: float, device: Any) -> torch.nn.Module:
    return DeviceModel(device_ms, 1.0).attach(build_workload(wspec).build(device))


def _loss(keyword_inputs: bool, model: torch.nn.Module, batch: Any) -> torch.Tensor:
    inputs, labels = batch
    out = model(**inputs) if keyword_inputs else model(inputs)
    logits = out.logits if hasattr(out, "logits") else out
    return torch.nn.functional.cross_entropy(logits, labels)


def _optimizer(lr: float, params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=lr, foreach=True)


def _history(metrics: list) -> list[dict[str, Any]]:
    return [{"window": m.epoch, "anchor": m.anchor, "shares": list(m.per_rank_batch_share),
             "batch_sizes": list(m.per_rank_batches), "rounds": m.rounds} for m in metrics]


def run_builder(spec: RunSpec, wspec: WorkloadSpec) -> dict[str, Any]:
    """Run one builder mode in this process (the builder spawns its workers); return the run summary."""
    from ..builder import ApplyPolicy, AverageBackend, DdpBuilder

    policy_name, backend_name = spec.mode[len("builder-"):].split("/")
    workload = build_workload(wspec)
    world = spec.world
    chunks = max(1, spec.steps // spec.eval_every) if spec.accuracy else 1
    dataset: Any = ChunkedDataset(workload.train, chunks) if spec.accuracy else workload.train
    epochs = chunks if spec.accuracy else _THROUGHPUT_EPOCHS
    builder = (DdpBuilder(functools.partial(_model, wspec, spec.device_ms),
                          functools.partial(_optimizer, workload.lr),
                          functools.partial(_loss, workload.keyword_inputs))
               .dataset(dataset).batch_size(spec.batch_size).num_epochs(epochs)
               .collate_fn(workload.collate).seed(spec.seed).devices(list(spec.devices))
               .simulate_speeds(list(spec.speeds)).policy(ApplyPolicy[policy_name.upper()])
               .backend(AverageBackend[backend_name.upper()]).timeout(spec.timeout_s).progress(False)
               .start_method("forkserver"))
    with tempfile.TemporaryDirectory(prefix="flodl-bench-builder-") as tmp:
        if spec.accuracy:
            builder = builder.epoch_fn(dataset.set_epoch).checkpoint_every(1).checkpoint_fn(
                functools.partial(_checkpoint_path, tmp))
        handle = builder.run()
        state = handle.join(timeout=spec.timeout_s)
        metrics = list(handle.metrics)
        timed = metrics[1:] if not spec.accuracy and len(metrics) > 1 else metrics
        seconds = sum(m.epoch_ms for m in timed) / 1000.0
        samples = sum(m.samples for m in timed)
        out: dict[str, Any] = {"samples_per_s": samples / seconds, "elapsed_s": seconds,
                               "per_rank_samples": [sum(m.per_rank_batches[r] for m in timed) * spec.batch_size
                                                    for r in range(world)],
                               "modelled_s": None, "curve": [], "final_accuracy": None,
                               "elche_history": _history(metrics),
                               "elche_describe": f"anchor {metrics[-1].anchor}, batch shares "
                                                 f"[{', '.join(f'{s:.2f}' for s in metrics[-1].per_rank_batch_share)}]"
                                                 f", {state.rounds} averages"}
        if spec.accuracy:
            out["curve"] = _curve(workload, metrics, tmp, spec)
            model = state.load_into(workload.build("cpu"))
            out["final_accuracy"] = workload.accuracy(model, torch.device("cpu"))
            out["curve"].append((round(seconds, 4), spec.steps, out["final_accuracy"]))
    return out


def _checkpoint_path(directory: str, epoch: int) -> str:
    return str(Path(directory) / f"epoch{epoch}.json")


def _curve(workload: Any, metrics: list, directory: str, spec: RunSpec) -> list[tuple[float, int, float]]:
    from ..builder.checkpoint import read_checkpoint

    model = workload.build("cpu")
    curve = [(0.0, 0, workload.accuracy(model, torch.device("cpu")))]
    clock = 0.0
    for m in metrics[:-1]:
        clock += m.epoch_ms / 1000.0
        path = Path(_checkpoint_path(directory, m.epoch))
        if not path.exists():
            continue
        model.load_state_dict(_state_of(read_checkpoint(path)))
        curve.append((round(clock, 4), (m.epoch + 1) * spec.eval_every, workload.accuracy(model, torch.device("cpu"))))
    return curve


def _state_of(checkpoint: Any) -> Optional[dict]:
    return checkpoint["model"] if isinstance(checkpoint, dict) and "model" in checkpoint else checkpoint
