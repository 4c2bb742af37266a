"""One run of a tiny model under `transformers.Trainer` or `ElCheTrainer`, for the integration's tests.

Run as ``python trainer_script.py CASE.json OUT_DIR`` (or ``RUNS.json``, a list of ``[case, out_dir]`` run in turn) (one process: the reference) or under ``torchrun`` (ElCheTrainer
on each rank). CASE.json says the model, data, Trainer arguments and El Che settings; ``orders`` (per epoch, a list of
dataset indices) replays a recorded sample order through a sequential sampler, which is how the reference sees "the
concatenated windows". Each rank writes the dataset indices of every micro-batch its collator saw; rank 0 writes the
final parameters and Trainer's log history. ``save_steps`` writes checkpoints,
``exit_at`` ends every rank abruptly when that step begins, ``resume`` resumes from a checkpoint, ``plain`` runs
`transformers.Trainer` itself instead of ElCheTrainer on the same data, ``stream`` trains on a stream of the rows
(no length; ``max_steps`` says how long; ``stream_fails_at`` makes reading it fail at that row). Each rank records the
optimizer step of every call that clears the device cache (``empty_cache``: ``torch_empty_cache_steps``) in
``cleared_RANK.jsonl``.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    BertForTokenClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)


def rows(case: dict) -> list[dict]:
    g = torch.Generator().manual_seed(case["data_seed"])
    out = []
    for i in range(case["n"]):
        length = int(torch.randint(case.get("min_len", 3), case.get("max_len", 12) + 1, (1,), generator=g))
        ids = torch.randint(1, 60, (length,), generator=g).tolist()
        if case["model"] == "token":
            labels = torch.randint(0, 3, (length,), generator=g)
            labels[torch.rand(length, generator=g) < case.get("mask", 0.3)] = -100  # items differ from samples
            label = labels.tolist()
        else:
            label = int(torch.randint(0, 3, (1,), generator=g))
        out.append({"input_ids": ids, "labels": label, "idx": i})
    return out


class Rows(torch.utils.data.Dataset):
    """The rows, optionally in a recorded order per epoch (``orders[e]``; set by ``Epochs`` at each epoch)."""

    def __init__(self, data: list[dict], orders: list[list[int]] | None = None) -> None:
        self.data, self.orders, self.epoch = data, orders, 0

    def __len__(self) -> int:
        return len(self.orders[0]) if self.orders else len(self.data)

    def __getitem__(self, i: int) -> dict:
        return self.data[self.orders[self.epoch][i] if self.orders else i]


class Stream(torch.utils.data.IterableDataset):
    """The rows as a stream with no length: a seeded order per pass, changed by ``set_epoch`` (as a shuffled
    ``datasets`` stream's is)."""

    def __init__(self, data: list[dict], seed: int, fails_at: int | None = None) -> None:
        self.data, self.seed, self.epoch, self.fails_at = data, seed, 0, fails_at

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = torch.randperm(len(self.data), generator=torch.Generator().manual_seed(self.seed + self.epoch))
        for n, i in enumerate(order.tolist()):
            if n == self.fails_at:
                raise OSError(f"the stream's source went away at row {n}")
            yield self.data[i]


def train_set(case: dict, data: list[dict]) -> torch.utils.data.Dataset:
    """The train set a run (not a recorded-order reference) reads: the rows, or a stream of them (``stream``:
    ``torch`` for the class above, ``hf`` for a shuffled ``datasets.IterableDataset`` of three shards)."""
    if case.get("stream") == "torch":
        return Stream(data, case["seed"], case.get("stream_fails_at"))
    if case.get("stream") == "hf":
        import datasets

        return datasets.Dataset.from_list(data).to_iterable_dataset(num_shards=3).shuffle(seed=case["seed"],
                                                                                         buffer_size=5)
    return Rows(data)


class Epochs(TrainerCallback):
    def __init__(self, rows: Rows) -> None:
        self.rows = rows

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.rows.epoch = round(state.epoch or 0)


class Collate:
    """Pads a batch; appends its dataset indices to ``seen`` (one JSON line per micro-batch, flushed at once)."""

    def __init__(self, seen: str) -> None:
        self.seen = seen

    def __call__(self, batch: list[dict]) -> dict:
        with open(self.seen, "a") as f:
            f.write(json.dumps([r["idx"] for r in batch]) + "\n")
        width = max(len(r["input_ids"]) for r in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for j, r in enumerate(batch):
            ids[j, :len(r["input_ids"])] = torch.tensor(r["input_ids"])
            mask[j, :len(r["input_ids"])] = 1
        if isinstance(batch[0]["labels"], list):
            labels = torch.full((len(batch), width), -100, dtype=torch.long)
            for j, r in enumerate(batch):
                labels[j, :len(r["labels"])] = torch.tensor(r["labels"])
        else:
            labels = torch.tensor([r["labels"] for r in batch])
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


class ExitAt(TrainerCallback):
    """Ends the process abruptly when step ``step`` begins (after the checkpoints of earlier steps are written)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os._exit(17)


class Slow(TrainerCallback):
    """Makes one rank slower (sleep per micro-batch) so El Che's measured split is uneven."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_begin(self, args, state, control, **kwargs):
        time.sleep(self.seconds)


def summed_loss(outputs, labels, num_items_in_batch=None):
    """The usual custom loss: a sum over the labelled items divided by Trainer's ``num_items_in_batch``."""
    logits = outputs["logits"]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                             ignore_index=-100, reduction="sum")
    return loss / num_items_in_batch


def summed_loss_int(outputs, labels, num_items_in_batch=None):
    """The same, with the count turned into a Python number first (``int()``), as many scripts do."""
    logits = outputs["logits"]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                             ignore_index=-100, reduction="sum")
    return loss / int(num_items_in_batch)


CLASS_WEIGHTS = torch.tensor([0.5, 1.0, 2.0])


def weighted_items(batch: dict) -> float:
    """What a class-weighted cross-entropy's mean divides by: the class weights of the batch's labelled items."""
    labels = batch["labels"]
    return float(CLASS_WEIGHTS[labels[labels != -100]].sum())


def overriding(base: type, how: str) -> type:
    """``base`` with the ``compute_loss`` override people write: ``mean`` (their own mean cross-entropy, without
    ``super()``: the usual way to change the loss), ``weighted`` (the same with class weights, declared to
    ElCheTrainer with ``ElCheArguments(loss_items=weighted_items)``) or ``penalty`` (``super()``'s loss plus an L2
    penalty)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if how == "penalty":
            out = base.compute_loss(self, model, inputs, return_outputs=return_outputs,
                                    num_items_in_batch=num_items_in_batch)
            loss, outputs = out if return_outputs else (out, None)
            loss = loss + 1e-2 * sum(p.pow(2).sum() for p in model.parameters() if p.requires_grad)
            return (loss, outputs) if return_outputs else loss
        labels = inputs["labels"]
        outputs = model(**{k: v for k, v in inputs.items() if k != "labels"})
        logits = outputs["logits"]
        weight = CLASS_WEIGHTS.to(logits.device) if how == "weighted" else None
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                                 weight=weight, ignore_index=-100)
        return (loss, outputs) if return_outputs else loss

    return type(f"{how.title()}{base.__name__}", (base,), {"compute_loss": compute_loss})


def model(case: dict) -> torch.nn.Module:
    torch.manual_seed(case["init_seed"])
    cfg = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                     max_position_embeddings=32, hidden_dropout_prob=case.get("dropout", 0.0),
                     attention_probs_dropout_prob=case.get("dropout", 0.0), classifier_dropout=case.get("dropout", 0.0),
                     num_labels=3)
    cls = BertForTokenClassification if case["model"] == "token" else BertForSequenceClassification
    net = cls(cfg)
    if case.get("lora"):
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(case["init_seed"] + 1)
        lora = LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"], lora_dropout=0.0,
                          init_lora_weights="gaussian", modules_to_save=["classifier"])
        net = get_peft_model(net, lora)
    return net


def train(case: dict, out: str) -> None:
    """One run of ``case``, writing into ``out``."""
    os.makedirs(out, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    data = rows(case)
    seen = os.path.join(out, f"seen_{rank}.jsonl")
    reference = "orders" in case
    bs = case["reference_batch"] if reference else case["per_device"]
    args = TrainingArguments(
        output_dir=os.path.join(out, "trainer"), per_device_train_batch_size=bs,
        gradient_accumulation_steps=case["ga"], num_train_epochs=case["epochs"],
        max_steps=case.get("max_steps", -1),
        learning_rate=case["lr"], warmup_steps=case["warmup"], weight_decay=case["wd"],
        max_grad_norm=case["clip"], lr_scheduler_type="linear", logging_steps=1,
        save_strategy="steps" if case.get("save_steps") else "no", save_steps=case.get("save_steps") or 500,
        report_to=case.get("report_to", []), use_cpu=not case.get("cuda", False), seed=case["seed"], disable_tqdm=True,
        train_sampling_strategy="sequential" if reference else case.get("strategy", "random"),
        dataloader_drop_last=case.get("drop_last", False), optim=case.get("optim", "adamw_torch"),
        remove_unused_columns=False, dataloader_num_workers=case.get("workers", 0),
        bf16=case.get("bf16", False), average_tokens_across_devices=case.get("average_tokens", True),
        include_num_input_tokens_seen=case.get("tokens", "no"), torch_empty_cache_steps=case.get("empty_cache"))
    common = {"model": model(case), "args": args, "data_collator": Collate(seen),
              "compute_loss_func": {True: summed_loss, "int": summed_loss_int}.get(case.get("loss_func"))}
    if reference:
        ordered = Rows(data, case["orders"])
        cls = overriding(Trainer, case["override"]) if case.get("override") else Trainer
        trainer = cls(train_dataset=ordered, callbacks=[Epochs(ordered)], **common)
    else:
        from flodl_hf.integrations import ElCheArguments, ElCheTrainer

        slow = case.get("slow", {}).get(str(rank))
        callbacks = ([Slow(slow)] if slow else []) + ([ExitAt(case["exit_at"])] if case.get("exit_at") else [])
        per_row = case.get("slow_rows", {}).get(str(rank))
        if per_row:  # a slower device: a sleep per row inside the forward, which El Che's timing sees
            common["model"].register_forward_pre_hook(
                lambda module, args, kwargs: time.sleep(per_row * kwargs["input_ids"].shape[0]), with_kwargs=True)
        cls = overriding(ElCheTrainer, case["override"]) if case.get("override") else ElCheTrainer
        declared = {"loss_items": weighted_items} if case.get("override") == "weighted" else {}
        if case.get("plain"):  # transformers.Trainer itself, with the same data and arguments
            trainer = Trainer(train_dataset=train_set(case, data), callbacks=callbacks, **common)
        else:
            trainer = cls(train_dataset=train_set(case, data),
                          elche=ElCheArguments(**case.get("elche", {}), **declared),
                          callbacks=callbacks, **common)
    import importlib

    module = importlib.import_module("transformers.trainer" if reference or case.get("plain")
                                     else "flodl_hf.integrations.trainer")
    clear = module.clear_device_cache  # the function Trainer's (or ElCheTrainer's) training_step calls

    def cleared(*a, **kw):  # records at which optimizer step each micro-batch clears the device cache
        with open(os.path.join(out, f"cleared_{rank}.jsonl"), "a") as f:
            f.write(json.dumps(trainer.state.global_step) + "\n")
        return clear(*a, **kw)

    module.clear_device_cache = cleared
    try:
        trainer.train(resume_from_checkpoint=case.get("resume"))
    finally:
        module.clear_device_cache = clear
    if rank == 0:
        torch.save({k: v.detach().cpu() for k, v in trainer.model.state_dict().items()},
                   os.path.join(out, "params.pt"))
        with open(os.path.join(out, "log.json"), "w") as f:
            json.dump(trainer.state.log_history, f)


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    if isinstance(spec, list):  # several runs in one launch: [[case, out], ...] (saves a process start each)
        for case, out in spec:
            train(case, out)
    else:
        train(spec, sys.argv[2])
    if torch.distributed.is_initialized():  # a clean gloo shutdown (5.0.0 ranks sometimes aborted at exit without)
        torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # everything is written; gloo's threads sometimes abort interpreter teardown ("terminate called ...")


if __name__ == "__main__":
    main()
