"""The per-rank loops of the Hugging Face Accelerate bench modes: ``accelerate`` and ``accelerate-localsgd``.

Why it exists: Accelerate is what most people fine-tuning HF models on several devices use, so the bench shows
it in the same table, written the way its documentation writes it: ``Accelerator.prepare(model, optimizer,
dataloader)``, ``accelerator.backward(loss)``. ``accelerate`` is DDP underneath (equal batches of
``batch_size`` per rank, gradient sync every step); ``accelerate-localsgd`` wraps the same loop in
``accelerate.local_sgd.LocalSGD`` (no gradient sync; parameters averaged every ``localsgd_steps`` steps).
Neither adapts to device speed: the slowest rank gates every synchronisation.

Accelerate keeps process-wide singletons; each run resets them afterwards (``AcceleratorState._reset_state``,
as Accelerate's own test cases do) so the next run in the same rank process starts clean.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch

from .device_model import DeviceModel
from .meter import Meter, RunSpec
from .workloads import WorkloadSpec, build_workload

__all__ = ["accelerate_rank"]


def _barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


def accelerate_rank(rank: int, world: int, spec: RunSpec, wspec: WorkloadSpec) -> dict[str, Any]:
    """One rank of ``accelerate`` or ``accelerate-localsgd``."""
    from accelerate import Accelerator
    from accelerate.local_sgd import LocalSGD
    from accelerate.state import AcceleratorState, GradientState
    from accelerate.utils import InitProcessGroupKwargs

    workload = build_workload(wspec)
    cpu = all(d == "cpu" for d in spec.devices)
    try:
        accelerator = Accelerator(cpu=cpu, kwargs_handlers=[InitProcessGroupKwargs(
            timeout=timedelta(seconds=spec.timeout_s))])
        device = accelerator.device
        dm = DeviceModel(spec.device_ms, spec.speeds[rank], spec.stretch)
        model = dm.attach(workload.build(device))
        optimizer = workload.optimizer(model.parameters())
        loader = torch.utils.data.DataLoader(workload.train, batch_size=spec.batch_size, shuffle=True,
                                             drop_last=True, collate_fn=workload.collate,
                                             generator=torch.Generator().manual_seed(spec.seed))
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        inner = accelerator.unwrap_model(model)
        meter = Meter(spec, rank, workload, device, dm, _barrier)

        def train_step(batch: Any) -> int:
            loss = workload.loss(model, batch, device)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            return int(batch[1].shape[0])

        meter.begin(inner)
        if spec.mode == "accelerate-localsgd":
            k = spec.localsgd_steps
            with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=k, enabled=True) as local_sgd:
                for step, batch in enumerate(loader, start=1):
                    samples = train_step(batch)
                    local_sgd.step()
                    last = step >= spec.steps
                    meter.step(samples, synced=(step % k == 0) and not last, module=inner)
                    if last:
                        break
            meter.sync_point(inner)  # LocalSGD averaged the parameters once more on exit
        else:
            for step, batch in enumerate(loader, start=1):
                meter.step(train_step(batch), synced=True, module=inner)
                if step >= spec.steps:
                    break
        if meter.steps != spec.steps:
            raise RuntimeError(f"the prepared dataloader gave {meter.steps} steps, the run asked for {spec.steps}")
        return meter.finish(inner, {"localsgd_steps": spec.localsgd_steps} if "localsgd" in spec.mode else None)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
