"""``DdpBuilder``: the chainable description of a builder-mode run, and ``run()``, which starts it.

It exists as the one place where a user's settings become processes: validate everything in the caller (one
ValueError naming every bad setting), then either run in a thread on one device, or spawn one worker process
per device (models and optimizers are built inside the workers from the picklable factories) and start the
coordinator thread. Switching policy or backend is one line: ``.policy(ApplyPolicy.ASYNC)`` /
``.backend(AverageBackend.CPU)``.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any, Callable, Optional, Sequence

from .handle import DdpHandle
from .settings import BuilderSettings
from .types import ApplyPolicy, AverageBackend

__all__ = ["DdpBuilder"]

log = logging.getLogger("flodl_hf.builder")


class DdpBuilder:
    """Builder mode: the framework owns the training loop (local SGD, averaged per policy).

    ``model_factory(device)`` returns an ``nn.Module`` or a task head (e.g.
    ``functools.partial(BertForSequenceClassification.on_device, config, num_labels)``);
    ``optim_factory(params) -> Optimizer``; ``train_fn(model_or_head, batch)`` returns the loss, e.g.
    ``head.compute_loss(enc, labels)``. They run inside the worker processes, so on 2+ devices they must be
    picklable: module-level functions or ``functools.partial`` of them (lambdas and nested functions are not).
    ``train_fn`` only computes the loss; the builder calls backward, clipping, the optimizer step and the
    scheduler. The dataset is sent to each worker once, pickled with plain pickle (``flodl_hf.builder.data``).
    Batches are collated with ``flodl_hf.builder.data.collate`` (or ``.collate_fn``) and moved to the worker's
    device.
    """

    def __init__(
        self,
        model_factory: Callable[..., Any],
        optim_factory: Callable[..., Any],
        train_fn: Callable[..., Any],
    ) -> None:
        self._s = BuilderSettings(model_factory=model_factory, optim_factory=optim_factory, train_fn=train_fn)

    def _set(self, **kw: Any) -> "DdpBuilder":
        for k, v in kw.items():
            setattr(self._s, k, v)
        return self

    # -- data ------------------------------------------------------------------------------------------------
    def dataset(self, ds: Any) -> "DdpBuilder":
        """Anything with ``len()`` and ``[i]``, including a ``datasets.Dataset``. Sent to each worker once,
        pickled with plain pickle in the caller (one bytes blob, no shared memory, so no file descriptor per
        tensor); a dataset read from disk with ``datasets`` travels as a memory map by file path."""
        return self._set(dataset=ds)

    def batch_size(self, n: int) -> "DdpBuilder":
        """Batch size per device (every batch of every rank has this size; the incomplete last one is
        dropped)."""
        return self._set(batch_size=n)

    def num_epochs(self, n: int) -> "DdpBuilder":
        return self._set(num_epochs=n)

    def collate_fn(self, fn: Callable[[list], Any]) -> "DdpBuilder":
        """``fn(items) -> batch`` (picklable). Default ``flodl_hf.builder.data.collate``: torch's
        ``default_collate``, except that dict columns of equal-length number lists (raw
        ``datasets.Dataset`` rows: ``input_ids``) become one ``[B, L]`` tensor and strings stay lists. For
        rows of different lengths pass ``DataCollatorWithPadding(tokenizer)``."""
        return self._set(collate_fn=fn)

    def seed(self, n: int) -> "DdpBuilder":
        """Seed of the data order (epoch e uses permutation ``seed + e``) and of model construction."""
        return self._set(seed=n)

    # -- averaging -------------------------------------------------------------------------------------------
    def policy(self, p: ApplyPolicy) -> "DdpBuilder":
        """When to average: ``ApplyPolicy.SYNC``, ``CADENCE`` (default) or ``ASYNC``."""
        return self._set(policy=p)

    def backend(self, b: AverageBackend) -> "DdpBuilder":
        """How to average: ``AverageBackend.NCCL`` (default: the process group's all-reduce) or ``CPU``."""
        return self._set(backend=b)

    def anchor(self, n: int) -> "DdpBuilder":
        """Initial El Che anchor: batches of the slowest rank per averaging window (default 10)."""
        return self._set(anchor=n)

    def max_anchor(self, n: int) -> "DdpBuilder":
        """Upper bound of the auto-tuned anchor (default 200); 0 disables El Che (average every batch)."""
        return self._set(max_anchor=n)

    def overhead_target(self, f: float) -> "DdpBuilder":
        """Wanted ceiling of averaging time / compute time, in [0.01, 0.5] (default 0.10)."""
        return self._set(overhead_target=f)

    def max_batch_diff(self, n: int) -> "DdpBuilder":
        """Limit how far a count moves per window and how many batches a rank may run beyond its count."""
        return self._set(max_batch_diff=n)

    def progressive_dispatch(self, flag: bool) -> "DdpBuilder":
        """Hand out each epoch in chunks from a shared pool, so a fast rank takes more and ranks stream into
        the next epoch (default: on unless SYNC). False: one equal slice per rank per epoch. SYNC refuses
        True: it splits each epoch equally up front."""
        return self._set(progressive_dispatch=flag)

    def max_overshoot(self, n: int) -> "DdpBuilder":
        """CPU backend with progressive dispatch: a rank may run at most its El Che count + ``n`` batches past
        the last average, then waits for it. Default auto: clamp(total_batches // 100, 2, 5), total_batches =
        len(dataset) // batch_size * num_epochs; ASYNC grows it by 1 per stable guard verdict up to
        clamp(total_batches // 50, 3, 10), never above 15. Refused with NCCL (each average holds every rank)
        and SYNC (nobody runs ahead)."""
        return self._set(max_overshoot=n)

    def divergence_threshold(self, f: float) -> "DdpBuilder":
        """Relative replica divergence above which a rising trend stops anchor growth (4x it halves the
        anchor). Default 0.05, as in the original."""
        return self._set(divergence_threshold=f, divergence_guard=True)

    def no_divergence_guard(self) -> "DdpBuilder":
        return self._set(divergence_guard=False)

    def round_timeout(self, seconds: float) -> "DdpBuilder":
        """CPU backend: a worker that does not answer a round within this time is left out of it (default 5
        s)."""
        return self._set(round_timeout_s=seconds)

    def timeout(self, seconds: float) -> "DdpBuilder":
        """Timeout of the workers' process group (collectives), default 60 s."""
        return self._set(timeout_s=seconds)

    # -- optimisation ----------------------------------------------------------------------------------------
    def max_grad_norm(self, f: float) -> "DdpBuilder":
        """Clip each local gradient to this norm before the optimizer step."""
        return self._set(max_grad_norm=f)

    def scheduler(self, factory: Callable[[Any], Any]) -> "DdpBuilder":
        """``factory(optimizer) -> LR scheduler``, stepped after every local optimizer step (picklable)."""
        return self._set(scheduler=factory)

    def lr_scale_ratio(self, f: float) -> "DdpBuilder":
        """Multiply the learning rate by ``1 + (world_size - 1) * f`` (f in [0, 1]).

        Default 0: the LR you tuned on one device is kept, the Hugging Face Trainer / Accelerate convention.
        The original defaults to 1.0 (LR x world size, the linear-scaling rule), which for fine-tuning a
        pretrained transformer usually diverges; set ``.lr_scale_ratio(1.0)`` to get it."""
        return self._set(lr_scale_ratio=f)

    # -- hooks and output ------------------------------------------------------------------------------------
    def checkpoint_every(self, n: int) -> "DdpBuilder":
        """Write a checkpoint of the averaged model every ``n`` epochs (and after the last one)."""
        return self._set(checkpoint_every=n)

    def checkpoint_fn(self, fn: Callable[[int], Any]) -> "DdpBuilder":
        """``fn(epoch) -> path`` of the checkpoint's JSON manifest to write (e.g. ``ckpt/epoch2.json``; its
        tensors go beside it in ``epoch2.{0,1}.safetensors``; see ``flodl_hf.builder.checkpoint``), atomically;
        enables ``checkpoint_every(1)`` unless another interval is set."""
        if self._s.checkpoint_every is None:
            self._s.checkpoint_every = 1
        return self._set(checkpoint_fn=fn)

    def resume_from(self, path: Any) -> "DdpBuilder":
        """Continue a run from one of its checkpoints (a file ``.checkpoint_fn`` wrote), on any number of devices.

        Builder checkpoints are written at epoch ends, so the run continues at the next epoch (without the batches
        of it the checkpoint's model already holds) with every worker starting from the checkpoint's averaged
        model, and the LR schedule at the global step it had reached. The optimizer state is carried when the
        checkpoint holds one (SYNC and one-device runs write it); El Che's calibration is not (it recalibrates on
        the new devices). The dataset, batch size, model and ``num_epochs`` must be the run's. See
        ``flodl_hf.builder.resume``."""
        return self._set(resume_from=path)

    def epoch_fn(self, fn: Callable[[int, Any], None]) -> "DdpBuilder":
        """``fn(epoch, model)``, called on every worker before its first batch of each epoch (picklable)."""
        return self._set(epoch_fn=fn)

    def metrics_fn(self, fn: Callable[[Any], None]) -> "DdpBuilder":
        """``fn(EpochMetrics)``, called in the caller's process after each epoch."""
        return self._set(metrics_fn=fn)

    def timeline(self, enabled: bool = True) -> "DdpBuilder":
        """Record a per-rank timeline: every batch, average and throttle with its start and end time, to see
        where time went (default off)."""
        return self._set(timeline=enabled)

    def progress(self, enabled: bool = True) -> "DdpBuilder":
        """Show the caller-side progress bar (default True)."""
        return self._set(progress=enabled)

    # -- devices ---------------------------------------------------------------------------------------------
    def devices(self, devices: Sequence[str]) -> "DdpBuilder":
        """One worker per entry, e.g. ``["cpu", "cpu"]`` or ``["cuda:0", "cuda:1"]`` (default: every GPU, else
        one CPU)."""
        return self._set(devices=devices)

    def simulate_speeds(self, speeds: Optional[Sequence[float]]) -> "DdpBuilder":
        """SIMULATION for tests and benchmarks: worker r stretches each batch's time to ``compute /
        speeds[r]`` by sleeping, as a slower device would. Values in (0, 1]."""
        return self._set(simulate_speeds=speeds)

    def start_method(self, name: str) -> "DdpBuilder":
        """How workers start: ``"spawn"`` (default, a fresh interpreter per worker) or ``"forkserver"``
        (forked from a server process of the caller that imported torch once: starts in well under a second
        after the first run, for notebooks and test suites; the server lives as long as the caller's process).
        """
        return self._set(start_method=name)

    # -- run -------------------------------------------------------------------------------------------------
    def run(self) -> DdpHandle:
        """Validate every setting, start the run and return its handle at once."""
        s = self._s
        from .ranks import torchrun_env
        from .step import Recipe

        env = torchrun_env()
        if env is not None and env["world"] <= 1:
            env = None  # a one-process torchrun job: the in-process single-device run
        devices = s.validate(ranks=None if env is None else env["world"])
        if env is not None:
            devices = [s.rank_device(env["local_rank"])]
        world = len(devices) if env is None else env["world"]
        point = None
        if s.resume_from is not None:
            from .resume import load_resume_point

            point = load_resume_point(s.resume_from, len(s.dataset), int(s.batch_size), int(s.num_epochs))
        s.resume_point = point
        recipe = Recipe(
            model_factory=s.model_factory,
            optim_factory=s.optim_factory,
            train_fn=s.train_fn,
            dataset=s.dataset,
            batch_size=int(s.batch_size),
            seed=int(s.seed),
            collate_fn=s.collate_fn,
            scheduler=s.scheduler,
            epoch_fn=s.epoch_fn,
            max_grad_norm=None if s.max_grad_norm is None else float(s.max_grad_norm),
            lr_scale=1.0 + (world - 1) * float(s.lr_scale_ratio),
            initial_state=None if point is None else dict(point.state),
            start_step=0 if point is None else point.start_step,
            initial_optimizer=None if point is None else point.optimizer,
        )
        if env is not None:
            from .ranks import TorchrunRanks

            runner: Any = TorchrunRanks(s, recipe, env, devices[0])
            devices = runner.devices
            if s.progress and env["rank"] == 0:
                print(f"flodl-hf builder: rank 0 of {world} under torchrun ({', '.join(devices)}) | policy "
                      f"{s.policy.name} | {'nccl' if all(d.startswith('cuda') for d in devices) else 'gloo'} "
                      f"all-reduce | El Che anchor {s.anchor}", file=sys.stderr, flush=True)
        elif world == 1:
            from .local import LocalRunner

            runner = LocalRunner(s, recipe, devices[0])
        else:
            runner = self._start_workers(recipe, devices)
        thread = threading.Thread(target=runner.run, name="flodl-hf-builder", daemon=True)
        thread.start()
        return DdpHandle(runner, thread, devices)

    def _start_workers(self, recipe: Any, devices: list[str]) -> Any:
        from .coordinator import Coordinator
        from .lifecycle import start_workers
        from .ranks import start_store_workers

        s = self._s
        # the collective backend's workers are torch.distributed ranks on a store (the torchrun code path); the CPU
        # backend's average in this process's shared memory, so they stay on queues (one machine)
        start = start_store_workers if s.backend is AverageBackend.NCCL else start_workers
        workers = start(s, recipe, devices)
        if s.progress:
            kind = "gloo" if any(d == "cpu" for d in devices) else "nccl"
            how = (
                f"NCCL ({kind} all-reduce)"
                if s.backend is AverageBackend.NCCL
                else "CPU (coordinator averages)"
            )
            sim = f" | SIMULATED speeds {workers.speeds}" if s.simulate_speeds is not None else ""
            print(
                f"flodl-hf builder: {len(devices)} workers ({', '.join(devices)}) | policy {s.policy.name} | "
                f"backend {how} | El Che anchor {s.anchor}{sim}",
                file=sys.stderr,
                flush=True,
            )
        if s.simulate_speeds is not None:
            log.info(
                "flodl-hf builder: SIMULATION: worker speeds %s (batch times stretched by sleeping)",
                workers.speeds,
            )
        return Coordinator(s, workers)
