"""What code around a Trainer sees of ElCheTrainer is what it sees of `transformers.Trainer` itself.

Callbacks, subclasses and scripts read the callback list, receive Trainer's events and read the train loader; each
check here compares ElCheTrainer with `transformers.Trainer` built from the same arguments (one process, and 2 gloo
ranks against one Trainer process taking the same global batch). Shown failing once: with El Che's epoch-setting
callback in the public list (as before), the lists differ by one entry and ``pop_callback(DefaultFlowCallback)``
positions shift; with El Che's loader on one process (as before), the loader is a plain DataLoader; with the plan's
callback called without the event's own arguments (as before), ``predict`` raised a TypeError (``on_predict`` requires
``metrics``), found by transformers' own ``test_mem_metrics``.
"""

from __future__ import annotations

import torch
from dist_helpers import run_ranks
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    DefaultFlowCallback,
    PrinterCallback,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from transformers.trainer_utils import has_length

from flodl_hf.integrations import ElCheTrainer


class _Rows(torch.utils.data.Dataset):
    def __init__(self, n: int = 24) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": torch.tensor([1 + i % 5, 2, 3]), "labels": torch.tensor(i % 2)}


class _Events(TrainerCallback):
    """Records every event it receives, by name, with the step it arrives at."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    def __getattribute__(self, name: str):
        attr = object.__getattribute__(self, name)
        if name.startswith("on_") and callable(attr):
            def record(args, state, control, **kwargs):
                self.seen.append((name, state.global_step))
                return attr(args, state, control, **kwargs)
            return record
        return attr


class _Stream(torch.utils.data.IterableDataset):
    """``_Rows`` as a stream: no length."""

    def __init__(self, n: int) -> None:
        self.rows = _Rows(n)

    def __iter__(self):
        return (self.rows[i] for i in range(len(self.rows)))


def _trainer(cls: type, out: str, batch: int, callbacks: list | None = None, rows: int = 24, stream: bool = False,
             **kw) -> Trainer:
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1,
                                                     num_attention_heads=2, intermediate_size=8, num_labels=2,
                                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    args = TrainingArguments(output_dir=out, use_cpu=True, report_to=[], per_device_train_batch_size=batch,
                             gradient_accumulation_steps=2, num_train_epochs=2, logging_steps=2, save_strategy="no",
                             disable_tqdm=True, max_steps=4 if stream else -1, **kw)
    return cls(model=model, args=args, train_dataset=_Stream(rows) if stream else _Rows(rows), callbacks=callbacks)


def _names(trainer: Trainer) -> list[str]:
    return [type(c).__name__ for c in trainer.callback_handler.callbacks]


def _list_changes(trainer: Trainer) -> list[list[str]]:
    """The callback list after each of the changes a script makes to it."""
    lists = [_names(trainer)]
    trainer.add_callback(PrinterCallback)
    lists.append(_names(trainer))
    popped = trainer.pop_callback(DefaultFlowCallback)
    lists.append(_names(trainer) + [type(popped).__name__])
    trainer.remove_callback(PrinterCallback)
    lists.append(_names(trainer))
    return lists


def test_one_process_has_trainers_callback_list(tmp_path):
    ours = _list_changes(_trainer(ElCheTrainer, str(tmp_path / "a"), 4, [_Events()]))
    theirs = _list_changes(_trainer(Trainer, str(tmp_path / "b"), 4, [_Events()]))
    assert ours == theirs and "_Events" in ours[0], (ours, theirs)


def _train_evaluate_predict(trainer: Trainer) -> tuple:
    """What a script does with a Trainer: train, then evaluate and predict (each sends its own events)."""
    trainer.train()
    metrics = trainer.evaluate(_Rows(10))
    predicted = trainer.predict(_Rows(10))
    return metrics["eval_loss"], predicted.predictions, predicted.metrics["test_loss"]


def test_one_process_sends_trainers_events(tmp_path):
    ours, theirs = _Events(), _Events()
    mine = _train_evaluate_predict(_trainer(ElCheTrainer, str(tmp_path / "a"), 4, [ours]))
    reference = _train_evaluate_predict(_trainer(Trainer, str(tmp_path / "b"), 4, [theirs]))
    assert ours.seen == theirs.seen and ("on_step_end", 6) in theirs.seen, (ours.seen, theirs.seen)
    assert ("on_predict", 6) in theirs.seen and ("on_evaluate", 6) in theirs.seen, theirs.seen
    assert mine[0] == reference[0] and mine[2] == reference[2], (mine, reference)
    assert (mine[1] == reference[1]).all(), (mine[1], reference[1])


def _on_two_ranks(rank: int, world: int, out: str) -> tuple[list, list]:
    events = _Events()
    trainer = _trainer(ElCheTrainer, f"{out}/{rank}", 2, [events])
    predicted = _train_evaluate_predict(trainer)
    return _list_changes(trainer), events.seen, predicted


def test_two_ranks_have_one_trainer_process_callbacks_and_events(tmp_path):
    events = _Events()
    reference = _trainer(Trainer, str(tmp_path / "reference"), 4, [events])  # one process, the same global batch
    predicted = _train_evaluate_predict(reference)
    lists = _list_changes(reference)
    for status, value in run_ranks(_on_two_ranks, 2, str(tmp_path / "ranks"), timeout=180):
        assert status == "ok", value
        # evaluation is sharded as under Trainer-DDP: each rank steps through its half of the rows
        per_batch = [event for event in events.seen if event[0] != "on_prediction_step"]
        assert value[0] == lists and [e for e in value[1] if e[0] != "on_prediction_step"] == per_batch, value
        loss, predictions, test_loss = value[2]
        assert abs(loss - predicted[0]) < 1e-5 and abs(test_loss - predicted[2]) < 1e-5, (value[2], predicted)
        assert predictions.shape == predicted[1].shape and abs(predictions - predicted[1]).max() < 1e-5


def test_one_process_train_loader_is_trainers(tmp_path):
    """One process splits nothing: its train loader is the one `transformers.Trainer` builds, batches included."""
    ours = _trainer(ElCheTrainer, str(tmp_path / "a"), 4).get_train_dataloader()
    theirs = _trainer(Trainer, str(tmp_path / "b"), 4).get_train_dataloader()
    assert type(ours) is type(theirs) and type(theirs).__name__ == "DataLoaderShard"
    surface = [(loader.total_batch_size, len(loader), loader.drop_last) for loader in (ours, theirs)]
    assert surface[0] == surface[1], surface
    for a, b in zip(ours, theirs, strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _surface(loader) -> tuple:
    """What code reads of a train loader: its length (None: it has none), ``drop_last``, the global batch (Trainer's
    one-process loader for a stream, accelerate's ``DataLoaderDispatcher``, has none: 8 is assumed)."""
    return len(loader) if has_length(loader) else None, loader.drop_last, getattr(loader, "total_batch_size", 8)


def _loader_on_two_ranks(rank: int, world: int, out: str) -> tuple:
    surfaces, keys, sizes = [], [], []
    for n, kw in enumerate(({}, {"dataloader_drop_last": True}, {"stream": True})):
        loader = _trainer(ElCheTrainer, f"{out}/{rank}-{n}", 4, rows=17, **kw).get_train_dataloader()
        loader.set_epoch(1)
        batches = list(loader)
        surfaces.append(_surface(loader))
        keys.append([sorted(b.keys()) for b in batches])
        sizes.append([len(b["labels"]) for b in batches])
    return surfaces, keys, sizes


def test_two_ranks_train_loader_has_trainers_surface(tmp_path):
    """On N ranks the loader is El Che's, with what code reads of Trainer's: the global batch, the number of
    micro-batches one process draws (none for a stream), ``drop_last``, ``set_epoch``, and the user's keys only (a
    rank's weight-0 stand-in row in a short last micro-batch included: 17 rows = micro-batches of 8, 8 and 1), for
    a map-style set with and without ``dataloader_drop_last`` and for a stream."""
    references = [_trainer(Trainer, str(tmp_path / f"reference{n}"), 8, rows=17, **kw).get_train_dataloader()
                  for n, kw in enumerate(({}, {"dataloader_drop_last": True}, {"stream": True}))]
    keys = sorted(next(iter(references[0])).keys())
    expected = [_surface(loader) for loader in references]
    # Trainer's DataLoaderShard reads drop_last=False where its batch sampler drops the short micro-batch; El Che's
    # loader says what it does
    assert expected == [(3, False, 8), (2, False, 8), (None, False, 8)], expected
    expected[1] = (2, True, 8)
    results = run_ranks(_loader_on_two_ranks, 2, str(tmp_path / "ranks"), timeout=120)
    for status, value in results:
        assert status == "ok", value
        surfaces, batch_keys, _ = value
        assert surfaces == expected, (surfaces, expected)
        assert batch_keys == [[keys] * 3, [keys] * 2, [keys] * 3], (batch_keys, keys)
    # the last micro-batch: its one row on one rank, a weight-0 stand-in row on the other
    sizes = [value[2] for _, value in results]
    assert [[sum(pair) for pair in zip(*(rank[n] for rank in sizes))] for n in range(3)] == [
        [8, 8, 2], [8, 8], [8, 8, 2]], sizes
