"""Builder mode: ``Trainer.builder(model_factory, optim_factory, train_fn)...run()`` trains without a user
loop.

One worker process per device trains its replica (local SGD under CADENCE and ASYNC; synchronous data
parallelism, with averaged gradients, under SYNC); a coordinator thread in the caller's process hands out the
data progressively, runs El Che, and has the replicas averaged per ``ApplyPolicy`` with the chosen
``AverageBackend``. Module map:

- ``builder``: ``DdpBuilder`` (setters, ``run``); ``settings``: validation; ``handle``: ``DdpHandle``
- ``types``: ``ApplyPolicy``, ``AverageBackend``, ``EpochMetrics``, ``TrainedState``; ``scalars``:
  ``record_scalar``
- ``coordinator``: the multi-device run; ``worker``: the worker process; ``local``: the single-device run
- ``lifecycle``: starting, awaiting and stopping worker processes (every wait bounded)
- ``board``: the shared status board and the round trigger; ``workpool``: progressive dispatch
- ``rounds``: CPU-backend rounds and the averager thread; ``slots``: their shared-memory slots; ``allreduce``:
  the collective backend's bucketed averages; ``state``: flat views of a model; ``guard``: divergence guard + anchor
- ``step``: one training step and the global-step schedule; ``data``: the dataset sent once, the default collate
- ``epochs``: per-epoch metrics; ``checkpoint``: atomic files; ``resume``: ``.resume_from`` (any worker count); ``progress``: tqdm; ``timeline``: plot a run
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
