"""Builder mode: ``Trainer.builder(model_factory, optim_factory, train_fn)...run()`` trains without a user
loop.

One worker per device trains its replica (local SGD under CADENCE and ASYNC; synchronous data parallelism, with
averaged gradients, under SYNC); a coordinator thread hands out the data progressively, runs El Che, and has the
replicas averaged per ``ApplyPolicy`` with the chosen ``AverageBackend``. With ``AverageBackend.NCCL`` the workers
are torch.distributed ranks (spawned here, or started by ``torchrun`` on any number of nodes) whose control plane is
the job's c10d store; ``AverageBackend.CPU`` averages in this machine's shared memory. Module map:

- ``builder``: ``DdpBuilder`` (setters, ``run``); ``settings``: validation; ``handle``: ``DdpHandle``
- ``types``: ``ApplyPolicy``, ``AverageBackend``, ``EpochMetrics``, ``TrainedState``; ``scalars``:
  ``record_scalar``
- ``coordinator``: the multi-device run; ``worker``: the worker process; ``local``: the single-device run
- ``lifecycle``: starting, awaiting and stopping worker processes (every wait bounded)
- ``ranks``: workers as torch.distributed ranks (the builder's launcher, torchrun); ``storebus``: their control
  plane on the store (queues, board, heartbeats); ``wire``: messages as bytes without pickle
- ``board``: the status board and the round trigger; ``inbox``: the CPU backend's queues; ``workpool``: dispatch
- ``rounds``: CPU-backend rounds and the averager thread; ``slots``: their shared-memory slots; ``allreduce``:
  the collective backend's bucketed averages; ``state``: flat views of a model; ``guard``: divergence guard + anchor
- ``step``: one training step and the global-step schedule; ``data``: the dataset sent once, the default collate
- ``epochs``: per-epoch metrics; ``checkpoint``: atomic files; ``resume``: ``.resume_from`` (any worker count);
  ``ledger``: what an average holds; ``progress``: tqdm; ``timeline``: plot a run
"""

from __future__ import annotations

from .builder import DdpBuilder
from .handle import DdpHandle
from .scalars import record_scalar
from .types import ApplyPolicy, AverageBackend, EpochMetrics, TrainedState

__all__ = [
    "DdpBuilder",
    "DdpHandle",
    "TrainedState",
    "EpochMetrics",
    "ApplyPolicy",
    "AverageBackend",
    "record_scalar",
]
