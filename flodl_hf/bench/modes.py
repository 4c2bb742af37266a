"""The per-rank training loops of the torch-level bench modes: ``solo``, ``ddp``, ``elche-setup``, ``setup-sync``.

Why it exists: each mode is the shortest honest loop a user of that approach would write, around the same
workload, the same modelled device time and the same :class:`~flodl_hf.bench.meter.Meter`.

- ``solo``: one rank alone (world 1, no process group) at its own speed, ``batch_size`` samples per step. The W
  solo processes run side by side; the sum of their rates is the ideal.
- ``ddp``: ``torch.nn.parallel.DistributedDataParallel``; every rank takes ``batch_size`` samples per step (the
  equal split of the same seeded permutation El Che partitions), so the slowest rank gates every step.
- ``elche-setup``: flodl-hf setup mode (``Trainer.setup_with`` + ``graph.epoch`` + ``graph.step``), El Che on,
  ``batch_size`` per rank nominal (El Che splits the global ``W * batch_size`` by measured speed). It runs
  without ``DdpConfig.simulate_speeds``: speeds are modelled by the bench's own device model only.
- ``elche-throughput``: the same with ``DdpConfig(anchor_rule="throughput")`` (El Che's window rule before issue
  15: the fewest synchronisations meeting ``overhead_target`` 0.10); ``elche-anchor1``: ``fixed_anchor=1``
  (a synchronisation every micro-step, El Che still splitting the batch); ``elche-adascale``: the goodput rule
  with ``lr_scaling="adascale"`` (the LR follows AdaScale's gain when the window grows). ``elche-setup`` runs the
  default rule (goodput). Setup modes pace held-out evaluations by micro-steps (batches of ``W * batch_size``
  samples, the same unit as DDP's steps), so a longer window does not evaluate less often; ``--sync-stretch`` adds
  ``DdpConfig.simulate_sync`` (a modelled slow interconnect).
- ``setup-sync``: the same setup-mode loop with ``max_anchor=0`` (El Che off: equal split, sync every step),
  to separate the engine's fixed costs from El Che's scheduling.

``solo`` and the setup modes also stamp every micro-step (:class:`~flodl_hf.bench.timeline.StepClock`: a few
clock reads and two optimizer hooks, nothing in the engine changed) for the per-window timeline and the gap
accounting of :mod:`flodl_hf.bench.timeline`.
"""

from __future__ import annotations

from typing import Any

import torch

from ..elche.partition import epoch_permutation, rank_slice
from .device_model import DeviceModel
from .meter import Meter, RunSpec
from .timeline import StepClock
from .workloads import WorkloadSpec, build_workload

__all__ = ["solo_rank", "ddp_rank", "setup_rank"]


def _no_barrier() -> None:
    return None


def _dist_barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


def _items(workload: Any, indices: list[int]) -> list:
    return [workload.train[int(i)] for i in indices]


def solo_rank(rank: int, world: int, spec: RunSpec, wspec: WorkloadSpec) -> dict[str, Any]:
    """Rank ``rank``'s device alone: the same per-step workload as one DDP rank, without any peer."""
    workload = build_workload(wspec)
    device = torch.device(spec.devices[rank])
    dm = DeviceModel(spec.device_ms, spec.speeds[rank], spec.stretch)
    model = dm.attach(workload.build(device))
    opt = workload.optimizer(model.parameters())
    perm = epoch_permutation(len(workload.train), spec.seed + rank)
    meter = Meter(spec, 0, workload, device, dm, _no_barrier)
    clock = StepClock()
    meter.begin(model)
    b = spec.batch_size
    for k in range(spec.steps):
        clock.fetch()
        batch = workload.collate(_items(workload, perm[k * b:(k + 1) * b].tolist()))
        clock.body()
        workload.loss(model, batch, device).backward()
        clock.call()
        opt.step()
        opt.zero_grad(set_to_none=True)
        clock.returned()
        meter.step(b, synced=True, module=model)
        clock.end(b, True)
    result = meter.finish(model, {"step_clock": clock.to_dict(meter.t0, meter.start_step)})
    result["rank"] = rank
    return result


def ddp_rank(rank: int, world: int, spec: RunSpec, wspec: WorkloadSpec) -> dict[str, Any]:
    """Plain DistributedDataParallel: equal micro-batches, one gradient all-reduce per step."""
    from datetime import timedelta

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    workload = build_workload(wspec)
    device = torch.device(spec.devices[rank])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method="env://", rank=rank,
                            world_size=world, timeout=timedelta(seconds=spec.timeout_s))
    dm = DeviceModel(spec.device_ms, spec.speeds[rank], spec.stretch)
    model = dm.attach(workload.build(device))
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = workload.optimizer(ddp.parameters())
    perm = epoch_permutation(len(workload.train), spec.seed)
    sizes = [spec.batch_size] * world
    meter = Meter(spec, rank, workload, device, dm, _dist_barrier)
    meter.begin(model)
    for k in range(spec.steps):
        indices, _ = rank_slice(perm, k, world * spec.batch_size, sizes, rank)
        batch = workload.collate(_items(workload, indices))
        workload.loss(ddp, batch, device).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        meter.step(len(indices), synced=True, module=model)
    return meter.finish(model)


def setup_rank(rank: int, world: int, spec: RunSpec, wspec: WorkloadSpec) -> dict[str, Any]:
    """flodl-hf setup mode: El Che gradient windows (``elche-setup``) or plain synchronous (``setup-sync``)."""
    from ..config import DdpConfig
    from ..distributed.context import shutdown
    from ..graph import Graph
    from ..trainer import Trainer

    workload = build_workload(wspec)
    dm = DeviceModel(spec.device_ms, spec.speeds[rank], spec.stretch)
    rule = {"anchor_rule": "throughput"} if spec.mode == "elche-throughput" else {}
    fixed = {"fixed_anchor": 1} if spec.mode == "elche-anchor1" else {}
    if spec.mode == "elche-adascale":
        rule = {"lr_scaling": "adascale"}
    # The throughput rule and AdaScale act on windows longer than one micro-batch: they need room to grow.
    room = 8 if spec.mode in ("elche-throughput", "elche-adascale") else None
    config = DdpConfig(devices=list(spec.devices), seed=spec.seed, verbose=False, timeout_s=spec.timeout_s,
                       max_anchor=0 if spec.mode == "setup-sync" else (spec.max_anchor or room),
                       simulate_sync=spec.sync_stretch, **rule, **fixed)
    graph = Graph(workload.build("cpu"))
    Trainer.setup_with(graph, lambda dev: dm.attach(workload.build(dev)), workload.optimizer, config)
    graph.set_data_loader(workload.train, batch_size=spec.batch_size, collate_fn=workload.collate)
    if graph.steps_per_epoch() != spec.steps:
        raise RuntimeError(f"setup mode plans {graph.steps_per_epoch()} steps, the run asked for {spec.steps}")
    device = graph.device
    meter = Meter(spec, rank, workload, device, dm, _dist_barrier)
    el_che = graph.el_che()
    clock = StepClock(graph.optimizer)
    # On an error, no clean-up collective is attempted (a peer may be blocked in another collective, and the
    # two would wait on each other until the timeout): the error goes back to the pool, which kills the ranks.
    meter.begin(graph.module)
    clock.start()
    for batch in graph.epoch(0):
        clock.body()
        workload.loss(graph.module, batch, device).backward()
        before = graph.training_step
        clock.call()
        graph.step()
        clock.returned()
        synced = graph.training_step != before
        if synced and rank == 0:
            clock.window(el_che)
        meter.step(len(batch[1]), synced=synced, module=graph.module,
                   optimizer_steps=meter.steps + 1)  # micro-steps, counting this one
        clock.end(len(batch[1]), synced)
    extra = {"elche_history": el_che.history if rank == 0 else [],
             "elche_describe": f"{el_che.describe()}; {graph.training_step} optimizer steps",
             "optimizer_steps": graph.training_step, "step_clock": clock.to_dict(meter.t0, meter.start_step)}
    result = meter.finish(graph.module, extra)
    graph.close()
    shutdown()
    return result
