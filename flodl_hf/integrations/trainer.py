"""`ElCheTrainer`: a `transformers.Trainer` whose ranks take El Che's unequal shares of every batch.

Why it exists: most people fine-tune with `transformers.Trainer`. With this class (the only line of their script
that changes) a fast device takes a larger share of each optimizer step than a slow one, and each step still
applies exactly the update one process running `transformers.Trainer` would apply to the same samples.

How it maps onto Trainer (transformers 5.0+, read from the 5.24 source; see ``../shared/design/hf-trainer.md``):

* **No DDP.** ``_wrap_model`` prepares the model for evaluation only (autocast, compile) and broadcasts rank 0's
  weights once; the gradient reduction is ours, a SUM all-reduce in buckets that start during the backward pass of
  the window's last micro-batch, as DDP's do (``flodl_hf.integrations.reduce``), finished inside
  ``training_step``, so Trainer's clipping, ``optimizer.step``, scheduler and callbacks then run unchanged on
  gradients identical on every rank.
* **Data.** The train loader is ours (``flodl_hf.integrations.plan``): Trainer's windows, El Che's split; for a
  stream, rank 0 reads each global micro-batch and deals out the shares (``flodl_hf.integrations.stream``).
* **Loss.** For a window of several micro-batches, ``get_batch_samples`` sums each micro-batch's item and sample
  counts over the ranks (one small collective per window, like Trainer's own ``average_tokens_across_devices``), so
  each rank weighs its part of a micro-batch by its share of the loss one process computes for the whole
  micro-batch (``flodl_hf.integrations.shares``). A one-micro-batch window needs no such collective: each rank
  back-propagates its loss sum and the reduced gradient is divided by the summed count, which rides with it.
* **One process** splits nothing, so it is `transformers.Trainer`: Trainer's loader, its checks and its resume
  (El Che's state is still written into each checkpoint, for a resume on several ranks).
* **Checkpoints.** Trainer's own, plus ``elche_trainer.json`` (``flodl_hf.integrations.state``: the global
  micro-batch and window shape, El Che's state, the splits so far): a resume on any number of ranks keeps the
  effective batch and sees every remaining sample once. ``output_dir/elche_plan.json`` is the run's split plan.
"""

from __future__ import annotations

import contextlib
import copy
import os
import time
from collections import deque
from functools import partial
from typing import Any, Iterator

import torch
import torch.distributed as dist
from accelerate.utils.memory import clear_device_cache
from transformers import Trainer, TrainerCallback
from transformers.trainer_callback import CallbackHandler
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint, seed_worker

from ..elche.scheduler import ElChe
from .arguments import ElCheArguments, check_trainer
from .plan import (
    WEIGHT_KEY,
    PlanBatchSampler,
    PlanLoader,
    WindowPlan,
    check_sizes,
    equal_sizes,
)
from .reduce import GradSum, broadcast_module
from .shares import CountProbe, Part, rank_count, weighed
from .stream import SizedStreamLoader, StreamLoader, StreamShares, rows_as_read, sized
from .state import (
    PLAN_FILE,
    STATE_FILE,
    check_resume,
    check_stream_resume,
    checkpoint_state,
    read_state,
    recorded,
    write_json,
)

__all__ = ["ElCheTrainer"]


class _PlanCallback(TrainerCallback):
    """Keeps Trainer's state in step with the plan.

    At each epoch it tells the plan sampler which epoch begins, from Trainer's own step count (``epochs_trained`` is
    ``global_step // updates_per_epoch`` in Trainer too): the one source of the sampler's epoch, since Trainer's
    ``set_epoch`` does not reach it everywhere (in 5.0 a resumed epoch's skipping loader has none, and the sampler
    would replay another epoch's order). At the start of training it writes the batch each rank trains into the
    state, which a resume otherwise takes from the checkpoint (written with another number of ranks)."""

    def __init__(self, trainer: ElCheTrainer) -> None:
        self.trainer = trainer

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        state.train_batch_size = self.trainer._train_batch_size

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        sampler = self.trainer._elche_sampler
        if sampler is not None:
            ga = args.gradient_accumulation_steps
            per_epoch = max(1, -(-len(sampler) // ga))
            sampler.set_epoch(state.global_step // per_epoch)


class _PlanHandler(CallbackHandler):
    """Trainer's callback handler, with the plan's callback called first at every event but kept out of
    ``callbacks``: the public list (``add_callback``, ``pop_callback``, ``callback_handler.callbacks``) stays the
    user's and Trainer's, as with ``transformers.Trainer``."""

    def __init__(self, handler: CallbackHandler, plan: _PlanCallback) -> None:  # not super(): it adds defaults again
        self.__dict__.update(handler.__dict__)
        self._plan = plan

    def call_event(self, event: str, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        hook = getattr(self._plan, event, None)
        if hook is not None:  # every event's own arguments: TrainerCallback.on_predict requires metrics
            hook(args, state, control, **kwargs)
        return super().call_event(event, args, state, control, **kwargs)


class ElCheTrainer(Trainer):
    """`transformers.Trainer` with El Che: takes Trainer's arguments, plus ``elche=ElCheArguments(...)``.

    Under ``torchrun --nproc-per-node N`` or ``accelerate launch`` each rank takes El Che's share of every
    micro-batch (faster ranks more), and every optimizer step equals one process's `transformers.Trainer` step on
    the union of the ranks' micro-batches: same loss normalisation, clipping, schedule and optimizer. On one
    process it is `transformers.Trainer`. Refused at construction on N ranks, one line each: DeepSpeed, FSDP,
    tensor/context parallelism, DataParallel, ``batch_rebalance``, ``auto_find_batch_size``, LOMO optimizers,
    NEFTune. An iterable train set (a stream) is read by rank 0 and dealt out (``flodl_hf.integrations.stream``).
    """

    def __init__(self, *args: Any, elche: ElCheArguments | None = None, **kwargs: Any) -> None:
        if elche is not None and not isinstance(elche, ElCheArguments):
            raise TypeError(f"ElCheTrainer(elche={elche!r}): pass an ElCheArguments(...) or leave it out")
        super().__init__(*args, **kwargs)
        self.elche_args = elche or ElCheArguments()
        self._elche_replay = check_trainer(self)
        self._elche_world = int(self.args.world_size)
        self._elche_rank = int(self.args.process_index)
        self._elche_resume: dict | None = None
        self._elche_plan: WindowPlan | None = None
        self._elche: ElChe | None = None
        self._elche_sum: GradSum | None = None
        self._elche_queue: deque = deque()
        self._elche_whole_count: bool | None = None  # None until the first count is handed to the loss
        self._elche_part: Part | None = None
        self._elche_wall = 0.0
        self._elche_work = 0.0
        self._elche_sync_ms = 0.0
        self._elche_sync_share: float | None = None
        self._elche_denominator = 0.0  # a one-micro-batch window's own count (items or samples), summed at its end
        self._elche_loss: Any = 0.0  # the window's loss (its sum when the denominator is deferred), for Trainer's log
        self._elche_logged = 0.0
        self._elche_sampler: PlanBatchSampler | None = None
        self._elche_stream: StreamShares | None = None
        self.callback_handler = _PlanHandler(self.callback_handler, _PlanCallback(self))

    # -- properties a user or a callback may read ------------------------------------------------------------
    @property
    def elche(self) -> ElChe | None:
        """The El Che scheduler of this run (None on one process, or before training starts)."""
        return self._elche

    @property
    def elche_batch_sizes(self) -> list[int] | None:
        """Each rank's share of the global micro-batch in the current window."""
        return None if self._elche_plan is None else list(self._elche_plan.sizes)

    @property
    def _elche_on(self) -> bool:
        return self._elche_world > 1

    # -- resume ------------------------------------------------------------------------------------------------
    def train(self, resume_from_checkpoint: Any = None, trial: Any = None, ignore_keys_for_eval: Any = None,
              **kwargs: Any) -> Any:
        path = resume_from_checkpoint
        if isinstance(path, bool):
            path = get_last_checkpoint(self.args.output_dir) if path else None
            if resume_from_checkpoint and path is None:
                raise ValueError(f"No valid checkpoint found in output directory ({self.args.output_dir})")
        self._elche_resume = None
        if path is not None:
            state_file = os.path.join(path, STATE_FILE)
            if os.path.isfile(state_file) and not self._elche_on:
                self._say_one_process_resume(read_state(state_file), str(path))
            elif os.path.isfile(state_file):
                self._elche_resume = self._check_resume(read_state(state_file), str(path))
            elif self._elche_on and self.is_world_process_zero():
                print(f"ElCheTrainer: {path} has no {STATE_FILE} (not written by ElCheTrainer): the data position "
                      "is recomputed from this run's batch size", flush=True)
        output = super().train(resume_from_checkpoint=path, trial=trial, ignore_keys_for_eval=ignore_keys_for_eval,
                               **kwargs)
        self._write_plan()
        return output

    # -- model -------------------------------------------------------------------------------------------------
    def _wrap_model(self, model: torch.nn.Module, training: bool = True, dataloader: Any = None) -> torch.nn.Module:
        if not training or not self._elche_on:
            return super()._wrap_model(model, training=training, dataloader=dataloader)
        if self.accelerator.unwrap_model(model, keep_torch_compile=False) is not model:
            return model
        broadcast_module(model)
        return self.accelerator.prepare_model(model, evaluation_mode=True)

    # -- evaluation --------------------------------------------------------------------------------------------
    def prediction_step(self, model: torch.nn.Module, inputs: dict, prediction_loss_only: bool,
                        ignore_keys: Any = None) -> tuple:
        """Evaluate a batch as one process does: its loss over its own items, with no factor for the ranks.

        With ``average_tokens_across_devices``, Trainer counts a batch's items over every rank and multiplies the
        loss by the number of ranks, to cancel DDP's mean in training. In evaluation nothing is averaged, so a
        model that takes ``**kwargs`` but computes its own mean (BERT's sequence classification) would report W
        times its loss. Each rank's eval batch is one of the batches one process evaluates (accelerate deals them
        out in turn), so the per-batch loss one process computes is the right one, and Trainer's mean over the
        gathered batches is one process's ``eval_loss``."""
        with self._as_one_process():
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)

    @contextlib.contextmanager
    def _as_one_process(self) -> Iterator[None]:
        """Trainer's loss code as one process runs it: ``average_tokens_across_devices`` off, so it neither counts
        items over the ranks nor multiplies the loss by their number."""
        saved = self.args.average_tokens_across_devices
        self.args.average_tokens_across_devices = False
        try:
            yield
        finally:
            self.args.average_tokens_across_devices = saved

    # -- data --------------------------------------------------------------------------------------------------
    def _train_lengths(self, dataset: Any) -> list[int]:
        column = self.args.length_column_name
        names = getattr(dataset, "column_names", None)
        if names is not None and column in names:
            return [int(v) for v in dataset[column]]
        key = self.processing_class.model_input_names[0] if self.processing_class is not None else "input_ids"
        return [len(dataset[i][key]) for i in range(len(dataset))]

    def get_train_dataloader(self) -> torch.utils.data.DataLoader:
        if not self._elche_on:  # one process: Trainer's own loader; the plan only describes the run's checkpoints
            self._elche_plan = WindowPlan(1, 0, self._train_batch_size, self.args.gradient_accumulation_steps,
                                          [self._train_batch_size])
            return super().get_train_dataloader()
        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        dataset, collator = self.train_dataset, self.data_collator
        if isinstance(dataset, torch.utils.data.IterableDataset):
            return self._stream_loader(dataset)
        try:
            import datasets

            is_hf = isinstance(dataset, datasets.Dataset)
        except ImportError:
            is_hf = False
        if is_hf:
            dataset = self._remove_unused_columns(dataset, description="Training")
        else:
            collator = self._get_collator_with_removed_columns(collator, description="Training")
        plan = self._make_plan()
        strategy = getattr(self.args, "train_sampling_strategy", None) or (
            "group_by_length" if getattr(self.args, "group_by_length", False) else "random")
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        sampler = PlanBatchSampler(len(dataset), plan, seed, order=strategy,
                                   lengths=self._train_lengths(dataset) if strategy == "group_by_length" else None,
                                   drop_last=self.args.dataloader_drop_last)
        self._elche_sampler = sampler
        workers = self.args.dataloader_num_workers
        params: dict[str, Any] = {
            "batch_sampler": sampler, "collate_fn": collator, "num_workers": workers,
            "pin_memory": self.args.dataloader_pin_memory,
            "worker_init_fn": partial(seed_worker, num_workers=workers, rank=self.args.process_index),
        }
        if workers > 0:
            params.update(persistent_workers=self.args.dataloader_persistent_workers,
                          prefetch_factor=self.args.dataloader_prefetch_factor,
                          multiprocessing_context=self.args.dataloader_multiprocessing_context)
        return PlanLoader(dataset, **params)  # its epoch: _PlanCallback

    def _stream_loader(self, dataset: torch.utils.data.IterableDataset) -> StreamLoader:
        """A stream's loader: rank 0 reads it as Trainer's one-process loader would with the global micro-batch, and
        deals each rank its share (``flodl_hf.integrations.stream``)."""
        args = self.args
        collator = self._get_collator_with_removed_columns(self.data_collator, description="Training")
        plan = self._make_plan()
        reader = None
        if self._elche_rank == 0:  # Trainer's one-process loader for a stream (no sampler, no drop_last), uncollated
            reader = torch.utils.data.DataLoader(
                dataset, batch_size=plan.global_micro_batch, collate_fn=rows_as_read,
                num_workers=args.dataloader_num_workers, pin_memory=False,
                persistent_workers=args.dataloader_persistent_workers,
                multiprocessing_context=args.dataloader_multiprocessing_context,
                prefetch_factor=args.dataloader_prefetch_factor, in_order=args.dataloader_in_order)
        shares = self._elche_stream = StreamShares(dataset, reader, plan, collator)
        return (SizedStreamLoader if sized(dataset) else StreamLoader)(shares, pin_memory=args.dataloader_pin_memory)

    def _check_resume(self, state: dict, path: str) -> dict:
        """``state.check_resume`` with this run's ranks, batch and accumulation (and a stream's rule)."""
        if isinstance(self.train_dataset, torch.utils.data.IterableDataset):
            check_stream_resume(state, path)
        return check_resume(state, path, world=self._elche_world, per_device=self.args.train_batch_size,
                            ga=self.args.gradient_accumulation_steps, pinned=self.elche_args.batch_sizes)

    def _say_one_process_resume(self, state: dict, path: str) -> None:
        """One process resumes as transformers.Trainer does, with this run's batch and accumulation; where they
        are not the checkpoint's, rank 0 says so and names the arguments that continue that run exactly."""
        unit, ga = int(state["global_micro_batch"]), int(state["micro_batches_per_window"])
        batch, own_ga = self._train_batch_size, self.args.gradient_accumulation_steps
        if (unit, ga) != (batch, own_ga) and self.is_world_process_zero():
            print(f"ElCheTrainer: {path} was trained in micro-batches of {unit} samples x {ga}; this process goes on "
                  f"as transformers.Trainer does, with {batch} x {own_ga} (pass per_device_train_batch_size={unit} "
                  f"and gradient_accumulation_steps={ga} to continue that run exactly)", flush=True)

    def _make_plan(self) -> WindowPlan:
        world, rank, ga = self._elche_world, self._elche_rank, self.args.gradient_accumulation_steps
        resume = self._elche_resume
        unit = int(resume["global_micro_batch"]) if resume is not None else self.args.train_batch_size * world
        # what Trainer reports (its banner, trainer_state.json's train_batch_size) is what each rank trains
        self._train_batch_size = unit // world
        sizes = equal_sizes(world, unit)
        self._elche = None
        if world > 1:
            pinned = self.elche_args.batch_sizes
            sched = ElChe(world, mode="setup", batch_size=unit // world, anchor=1, min_anchor=1, max_anchor=1,
                          anchor_rule="throughput",
                          batch_sizes=None if pinned is None else check_sizes(pinned, world, unit))
            if pinned is not None:
                sched.freeze()
            elif self.elche_args.speed_hint is not None:
                sched.speed_hint(*self.elche_args.speed_hint)
            saved = (resume or {}).get("elche")
            if saved is not None and int(saved.get("world_size", 0)) == world and pinned is None:
                sched.load_state_dict(saved)
            sizes = sched.batch_sizes()
            self._elche = sched
        plan = WindowPlan(world, rank, unit, ga, sizes, replay=self._elche_replay if world > 1 else None)
        if resume is not None:  # the record goes on from the checkpoint's; the windows before it are not redrawn
            plan.record_from = int(resume.get("step", 0))
            saved_plan = resume.get("plan")
            if saved_plan and saved_plan.get("world") == world and saved_plan.get("batch_size") == unit // world:
                plan.record.anchors, plan.record.splits = saved_plan["anchors"], saved_plan["splits"]
            else:
                plan.record.resumed = True  # another world size, or no record: the plan cannot be replayed from 0
        self._elche_plan = plan
        return plan

    # -- the window ---------------------------------------------------------------------------------------------
    def _items(self, batch: Any) -> int | None:
        if "labels" not in batch:
            return None
        if "shift_labels" in batch:
            labels = batch["shift_labels"]
        elif getattr(self, "_loss_shifts_labels", False):
            labels = batch["labels"][..., 1:]
        else:
            labels = batch["labels"]
        return int(labels.ne(-100).sum())

    def _declared(self, batch: Any) -> float:
        """``ElCheArguments.loss_items(batch)``: what this batch's loss is a mean over (checked)."""
        value = self.elche_args.loss_items(batch)
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = float("nan")
        if not (number >= 0 and number != float("inf")):
            raise ValueError(f"ElCheArguments.loss_items returned {value!r} for a batch: return a finite number "
                             ">= 0, what the batch's loss is a mean over (e.g. the sum of its class weights)")
        return number

    @staticmethod
    def _samples(batch: Any) -> int:
        for value in batch.values():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                return int(value.shape[0])
        raise ValueError("ElCheTrainer: a collated batch holds no tensor with a batch dimension: return tensors "
                         "from your data_collator")

    def _track_num_input_tokens(self, inputs: Any) -> None:
        """Trainer's ``num_input_tokens_seen``, counted as one process counts the whole micro-batch: a rank's
        weight-0 stand-in rows count nothing, and ``"all"`` counts every real row at the micro-batch's longest
        width, to which one process's collator pads them all."""
        mode = self.args.include_num_input_tokens_seen
        part = self._elche_part
        if not self._elche_on or mode in ("no", False, None) or part is None:
            return super()._track_num_input_tokens(inputs)
        name = getattr(self.model, "main_input_name", "input_ids")
        if name not in inputs:
            return super()._track_num_input_tokens(inputs)  # Trainer's warning
        ids = inputs[name]
        real = part.weight > 0
        rows = ids.shape[0] if real and ids.dim() > 0 else 0
        if mode == "non_padding" and "attention_mask" in inputs:
            own = int(inputs["attention_mask"].sum()) if real else 0
        elif mode == "non_padding" and getattr(self.processing_class, "pad_token_id", None) is not None:
            own = int((ids != self.processing_class.pad_token_id).sum()) if real else 0
        else:
            own = -1  # every token: rows x the longest width over the ranks
        width = ids.shape[-1] if ids.dim() > 1 else 1
        figures = torch.tensor([own, rows, width if rows else 0], dtype=torch.int64, device=self.args.device)
        gathered = self.accelerator.gather(figures).view(-1, 3)
        if own >= 0:
            seen = int(gathered[:, 0].sum())
        else:
            seen = int(gathered[:, 1].sum()) * int(gathered[:, 2].max())
        self.state.num_input_tokens_seen += seen

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: torch.device) -> tuple[list, Any]:
        batches = []
        for _ in range(num_batches):
            try:
                batches.append(next(epoch_iterator))
            except StopIteration:
                break
        # each batch's weight: beside it on a PlanLoader's iteration; in it after accelerate's skip_first_batches
        # (on resume) rebuilds the loader as a plain DataLoader; 1 on one process (Trainer's loader)
        pending = getattr(epoch_iterator, "weights", None)
        weights = [int(b.pop(WEIGHT_KEY)) if WEIGHT_KEY in b else pending.popleft() if pending is not None else 1
                   for b in batches]
        if not self._elche_on:
            return batches, self._get_num_items_in_batch(batches, device)
        if not batches:  # the stream has ended (every rank heard it in the same collective)
            return batches, None
        items = [self._items(b) for b in batches]
        samples = [self._samples(b) for b in batches]
        declared = [self._declared(b) for b in batches] if self.elche_args.loss_items is not None else None
        n = len(batches)
        counted = bool(batches) and "labels" in batches[0] and (
            self.model_accepts_loss_kwargs or self.compute_loss_func is not None)
        stream = self._elche_stream
        if n == 1 and (self.args.gradient_accumulation_steps == 1 or stream is None or sized(stream.dataset)):
            # A one-micro-batch window has one denominator, so it can ride with the gradients (no collective here):
            # each rank back-propagates its loss *sum* and the reduced gradient is divided by the summed count.
            # (Not where a stream's last, short window stays open into the next pass: its count cannot wait.)
            self._elche_queue.append(Part(weights[0], items[0], None, samples[0], None, 1,
                                           declared[0] if declared else None))
            return batches, None
        local = [w * (i or 0) for w, i in zip(weights, items)] + [w * s for w, s in zip(weights, samples)]
        local += [w * d for w, d in zip(weights, declared)] if declared else []
        counts = torch.tensor(local, dtype=torch.float64, device=self.args.device)
        dist.all_reduce(counts)
        totals, sample_totals = counts[:n].tolist(), counts[n:2 * n].tolist()
        declared_totals = counts[2 * n:].tolist() if declared else None
        for k in range(n):
            self._elche_queue.append(Part(weights[k], items[k], totals[k], samples[k], sample_totals[k], n,
                                           declared[k] if declared else None,
                                           declared_totals[k] if declared_totals else None))
        if not counted:
            return batches, None
        return batches, torch.tensor(sum(totals), device=device) / 1  # the float tensor one process passes

    def compute_loss(self, model: torch.nn.Module, inputs: dict, return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        """Trainer's loss, without the factor of the world size it multiplies by to cancel DDP's mean.

        There is no DDP here: each rank's part of the loss is scaled to its share of one process's loss in
        ``training_step``. Taking the factor out where Trainer puts it in, rather than dividing by it afterwards,
        keeps a subclass's own loss right: an override that never calls ``super()`` (its own mean, e.g. with class
        weights) was never multiplied, and a penalty added to ``super()``'s loss is one process's penalty. On one
        process the factor is 1: nothing changes."""
        with self._as_one_process():
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)

    def _counted(self, inputs: Any) -> bool:
        return "labels" in inputs and (self.model_accepts_loss_kwargs or self.compute_loss_func is not None)

    def _scaled_for_ga(self, num_items: Any) -> bool:
        if getattr(self, "loss_is_scaled_for_ga", None) is not None:
            return bool(self.loss_is_scaled_for_ga)
        return (self.model_accepts_loss_kwargs and num_items is not None) or self.compute_loss_func is not None

    def training_step(self, model: torch.nn.Module, inputs: dict, num_items_in_batch: Any = None) -> torch.Tensor:
        if not self._elche_on:
            return super().training_step(model, inputs, num_items_in_batch)
        part = self._elche_queue.popleft()
        self._elche_part = part  # Trainer counts the tokens of these inputs after this step
        start = time.perf_counter()
        model.train()
        if hasattr(self.optimizer, "train") and callable(self.optimizer.train):
            self.optimizer.train()
        deferred = part.total_samples is None
        denominator = part.samples if part.items is None else part.items
        if part.declared is not None:
            denominator = part.declared
        if deferred and self._counted(inputs) and part.items is not None:
            # this rank's own count: the loss comes back as a mean over it, whether or not the model uses it
            num_items_in_batch = torch.tensor(float(max(part.items, 1)), device=self.args.device)
        inputs = self._prepare_inputs(inputs)
        whole, probe, rng = num_items_in_batch, None, None
        if not deferred and whole is not None:
            if not self._elche_whole_count:
                num_items_in_batch = rank_count(whole, part)
            if self._elche_whole_count is None:
                CountProbe.integral = False
                num_items_in_batch = probe = num_items_in_batch.detach().clone().as_subclass(CountProbe)
                rng = _rng_state(self.args.device)
        with self.compute_loss_context_manager():  # a copy where it may run again: Trainer pops the labels
            loss = self.compute_loss(model, copy.copy(inputs) if probe is not None else inputs,
                                     num_items_in_batch=num_items_in_batch)
        if probe is not None:
            self._elche_whole_count = CountProbe.integral
            if CountProbe.integral:
                self._check_whole_count()
                if rank_count(whole, part) is not whole:  # the loss truncated a fractional count: once more
                    del loss
                    _set_rng_state(self.args.device, rng)
                    with self.compute_loss_context_manager():
                        loss = self.compute_loss(model, inputs, num_items_in_batch=whole)
        del inputs
        steps = self.args.torch_empty_cache_steps
        if steps is not None and self.state.global_step % steps == 0:  # where Trainer's training_step clears it
            clear_device_cache()
        if deferred:
            loss = loss * float(denominator)  # this rank's loss sum
        else:
            loss = self._contribution(loss, whole, part)
        counts = bool(part.weight and denominator)
        if self.accelerator.sync_gradients:  # the window's last backward: its buckets' all-reduces start within it
            self._grad_sum(model).arm()
        # A weight-0 sample, or a share without a labelled item (its mean loss is NaN), adds nothing; its backward
        # still runs, at zero, so that each parameter ends with a gradient exactly when one process gives it one
        # (one process back-propagates the whole micro-batch, even one without labelled items: zeros, not None).
        self.accelerator.backward(loss if counts else loss * 0.0)
        self._elche_wall += time.perf_counter() - start
        self._elche_work += part.weight * part.samples
        self._elche_denominator += part.weight * denominator if deferred else 0.0
        if counts:
            self._elche_loss = self._elche_loss + loss.detach().float()
        if not self.accelerator.sync_gradients:
            return torch.zeros((), device=self.args.device)
        self._close_window(model, part.window, deferred)
        # the window's one-process loss, the same on every rank (Trainer logs the mean over ranks of what it gets)
        return torch.tensor(self._elche_logged, device=self.args.device)

    def _contribution(self, loss: torch.Tensor, num_items: Any, part: Part) -> torch.Tensor:
        """This rank's part of the loss one process computes for the whole micro-batch (summed over ranks)."""
        loss = weighed(loss, part, whole_count=num_items is not None and bool(self._elche_whole_count))
        if not self._scaled_for_ga(num_items):
            loss = loss / part.window
        return loss

    def _check_whole_count(self) -> None:
        """A loss that truncates the count is handed the window's whole count, exact for a sum over it; inside a
        ``compute_loss`` override it may add a term that does not depend on the rows (a penalty), which every rank
        would then add once: refused before the first update, naming the fix."""
        if type(self).compute_loss is not ElCheTrainer.compute_loss:
            raise ValueError(
                f"{type(self).__name__}.compute_loss: the loss turns num_items_in_batch into a whole number "
                "(int(), .long(), //, rounding), which ElCheTrainer cannot split exactly between ranks inside a "
                "compute_loss override: divide by the tensor itself, or by float(num_items_in_batch)")

    def _grad_sum(self, model: torch.nn.Module) -> GradSum:
        """The reduction of the model's trainable parameters (rebuilt when they change, e.g. a callback unfreezes)."""
        params = [p for p in model.parameters() if p.requires_grad]
        current = self._elche_sum
        if current is None or len(current.params) != len(params) or any(
                a is not b for a, b in zip(current.params, params)):
            if current is not None:
                current.close()
            self._elche_sum = current = GradSum(params, self.args.device)
        return current

    def _close_window(self, model: torch.nn.Module, micro_batches: int, deferred: bool) -> None:
        """Sum the window's gradients over the ranks and feed El Che the window's timings."""
        device = self.args.device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        world, rank = self._elche_world, self._elche_rank
        extra = [0.0] * (3 * world + 2)
        extra[rank], extra[world + rank], extra[2 * world + rank] = (
            self._elche_wall * 1000.0, self._elche_work, self._elche_sync_ms)
        extra[-2], extra[-1] = self._elche_denominator, float(self._elche_loss)
        start = time.perf_counter()
        sums = self._grad_sum(model).reduce(extra, divisor_slot=len(extra) - 2 if deferred else None)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        sync_ms = (time.perf_counter() - start) * 1000.0
        wall, work, syncs = sums[:world], sums[world:2 * world], sums[2 * world:3 * world]
        self._elche_logged = sums[-1] / sums[-2] if deferred and sums[-2] > 0 else sums[-1]
        if self._elche is not None:
            self._elche.report(wall, work, min(syncs), micro_batches=micro_batches)
            self._elche_plan.sizes = self._elche.batch_sizes()
        compute = max(wall)
        self._elche_sync_share = sync_ms / (compute + sync_ms) if compute + sync_ms > 0 else None
        self._elche_sync_ms, self._elche_wall, self._elche_work = sync_ms, 0.0, 0.0
        self._elche_denominator, self._elche_loss = 0.0, 0.0

    # -- logs and checkpoints ------------------------------------------------------------------------------------
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        plan = self._elche_plan
        if self._elche_on and plan is not None and "loss" in logs:
            unit = plan.global_micro_batch
            for r, b in enumerate(plan.last_drawn):
                logs[f"elche_share_{r}"] = round(b / unit, 4)
            logs["elche_anchor"] = plan.micro_batches_per_window
            if self._elche_sync_share is not None:
                logs["elche_sync_share"] = round(self._elche_sync_share, 4)
        super().log(logs, start_time)

    def _save_checkpoint(self, model: torch.nn.Module, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        plan = self._elche_plan
        if plan is None or not self.args.should_save:
            return
        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        if not os.path.isdir(folder):
            return
        stream = self._elche_stream
        write_json(os.path.join(folder, STATE_FILE),
                   checkpoint_state(plan, self._elche_world, self._elche, self.state.global_step,
                                    windows=self._windows_drawn(),
                                    stream_ended=None if stream is None else stream.ended))
        self._write_plan()

    def _windows_drawn(self) -> int:
        """Windows trained so far: the optimizer steps, or for a stream the windows its dealer drew (more than the
        steps where the stream's end cut a window short and the next pass went on with it)."""
        return self.state.global_step if self._elche_stream is None else self._elche_stream.windows

    def _write_plan(self) -> None:
        """``output_dir/elche_plan.json``: the split of every window trained so far, for
        ``ElCheArguments(replay_plan=...)`` (rank 0, on several ranks only)."""
        record = recorded(self._elche_plan, self._windows_drawn()) if self._elche_on else None
        if record is not None and self.args.should_save:
            write_json(os.path.join(self.args.output_dir, PLAN_FILE), record)


def _rng_state(device: torch.device) -> tuple:
    """The random state a forward pass draws from (dropout), to run one again as it was."""
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def _set_rng_state(device: torch.device, state: tuple) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)
