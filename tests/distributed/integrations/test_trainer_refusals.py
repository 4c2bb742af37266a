"""What ElCheTrainer cannot do as one process would is refused at construction, in one line naming the argument.

Each refusal is a real `transformers.Trainer` construction (tiny BERT from config); the multi-rank ones run on 2 real
gloo ranks, since El Che's own settings only apply when there is more than one rank. On one process nothing is
split, so ElCheTrainer is `transformers.Trainer`: what Trainer takes is taken, and trains to Trainer's weights.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from dist_helpers import run_ranks
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

from flodl_hf.integrations import ElCheArguments, ElCheTrainer


def _model() -> torch.nn.Module:
    return BertForSequenceClassification(BertConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1,
                                                    num_attention_heads=2, intermediate_size=8, num_labels=2))


class _Rows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": [1, 2, 3], "labels": i % 2}


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        for i in range(12):
            yield {"input_ids": [1 + i % 5, 2, 3], "labels": i % 2}


def _args(tmp_path, **kw) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[], **kw)


def _message(excinfo: pytest.ExceptionInfo) -> str:
    text = str(excinfo.value)
    assert "\n" not in text, text
    return text


REFUSED = [  # on several ranks only: one process is transformers.Trainer, which takes them all
    ({"train_sampling_strategy": "batch_rebalance"}, "train_sampling_strategy='batch_rebalance'"),
    ({"auto_find_batch_size": True}, "auto_find_batch_size=True"),
    ({"optim": "adalomo"}, "optim="),
]


def _refused_on_two_ranks(rank: int, world: int, out: str) -> list[str]:
    messages = []
    for kw, _ in REFUSED:
        args = TrainingArguments(output_dir=out, use_cpu=True, report_to=[], **kw)
        try:
            ElCheTrainer(model=_model(), args=args, train_dataset=_Rows())
            messages.append("constructed")
        except ValueError as exc:
            messages.append(str(exc))
    return messages


def test_trainer_arguments_refused_on_several_ranks(tmp_path):
    for status, messages in run_ranks(_refused_on_two_ranks, 2, str(tmp_path / "out"), timeout=120):
        assert status == "ok", messages
        for (_, named), text in zip(REFUSED, messages, strict=True):
            assert text.startswith("ElCheTrainer: ") and named in text and "\n" not in text, text
            assert ": " in text.split(named, 1)[1], text


def _one_process_run(cls: type, tmp_path, name: str, train: Any, **kw) -> dict:
    torch.manual_seed(0)
    args = _args(tmp_path / name, per_device_train_batch_size=4, save_strategy="no", disable_tqdm=True, **kw)
    trainer = cls(model=_model(), args=args, train_dataset=train,
                  data_collator=lambda rows: {"input_ids": torch.tensor([r["input_ids"] for r in rows]),
                                              "labels": torch.tensor([r["labels"] for r in rows])})
    trainer.train()
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


@pytest.mark.parametrize("kw, stream", [
    ({"auto_find_batch_size": True, "num_train_epochs": 1}, False),
    ({"max_steps": 3}, True),
])
def test_one_process_trains_what_trainer_trains(tmp_path, kw, stream):
    """One process splits nothing, so what transformers.Trainer takes is taken, and trains as Trainer trains."""
    ours = _one_process_run(ElCheTrainer, tmp_path, "ours", _Stream() if stream else _Rows(), **kw)
    theirs = _one_process_run(Trainer, tmp_path, "theirs", _Stream() if stream else _Rows(), **kw)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    torch.manual_seed(0)
    start = _model().state_dict()
    assert not all(torch.equal(ours[k], v) for k, v in start.items())  # it trained


@pytest.mark.parametrize("kw", [{"train_sampling_strategy": "batch_rebalance"}, {"optim": "adalomo"}])
def test_one_process_takes_what_trainer_takes(tmp_path, kw):
    trainer = ElCheTrainer(model=_model(), args=_args(tmp_path, **kw), train_dataset=_Rows())
    assert trainer.args.world_size == 1


@pytest.mark.parametrize("kw, named", [
    ({"speed_hint": (0, 0.5)}, "ElCheArguments.speed_hint=(0, 0.5) is invalid: its ratio 0.5 is below 1"),
    ({"speed_hint": 2.0}, "ElCheArguments.speed_hint=2.0 is invalid: give (slow_rank, ratio)"),
    ({"speed_hint": (1, float("inf"))}, "ElCheArguments.speed_hint=(1, inf) is invalid: its ratio inf is not a "
                                        "finite number: give (slow_rank, ratio), a rank index >= 0 and a finite "
                                        "ratio >= 1"),
    ({"speed_hint": (1, float("nan"))}, "speed_hint=(1, nan) is invalid"),
    ({"batch_sizes": [4, 0]}, "ElCheArguments.batch_sizes=[4, 0] is invalid: give one integer >= 1 per rank"),
    ({"batch_sizes": [4, 4], "speed_hint": (1, 2.0)}, "speed_hint and batch_sizes"),
    ({"loss_items": 3.0}, "loss_items=3.0) is invalid: give a function of a collated batch"),
    ({"replay_plan": 3}, "replay_plan=3) is invalid: give the path of an elche_plan.json"),
    ({"replay_plan": "p.json", "batch_sizes": [4, 4]}, "replay_plan and batch_sizes both set"),
])
def test_el_che_arguments_refused(kw, named):
    with pytest.raises(ValueError) as excinfo:
        ElCheArguments(**kw)
    assert named in _message(excinfo)


def test_elche_keyword_takes_only_el_che_arguments(tmp_path):
    with pytest.raises(TypeError, match="pass an ElCheArguments"):
        ElCheTrainer(model=_model(), args=_args(tmp_path), train_dataset=_Rows(), elche={"speed_hint": (1, 2)})


def test_one_process_ignores_el_che_settings(tmp_path):
    """The same script runs on one process: a hint or a split for several ranks has nothing to split there."""
    trainer = ElCheTrainer(model=_model(), args=_args(tmp_path, max_steps=2, per_device_train_batch_size=4),
                           train_dataset=_Rows(), elche=ElCheArguments(speed_hint=(1, 2.0)),
                           data_collator=lambda rows: {"input_ids": torch.tensor([r["input_ids"] for r in rows]),
                                                       "labels": torch.tensor([r["labels"] for r in rows])})
    trainer.train()
    assert trainer.state.global_step == 2 and trainer.elche is None


MISFITS = [
    ({"speed_hint": (2, 2.0)}, "names rank 2, outside 0..1"),
    ({"batch_sizes": [2, 3, 3]}, "has 3 entries for 2 ranks"),
    ({"batch_sizes": [2, 3]}, "sums to 5: give 2 sizes >= 1 summing to per_device_train_batch_size x world size = 8, "
                              "e.g. batch_sizes=[4, 4]"),
]


def _on_two_ranks(rank: int, world: int, out: str) -> list[str]:
    args = TrainingArguments(output_dir=out, use_cpu=True, report_to=[], per_device_train_batch_size=4, max_steps=1)
    collate = lambda rows: {"input_ids": torch.tensor([r["input_ids"] for r in rows]),
                            "labels": torch.tensor([r["labels"] for r in rows])}
    messages = []
    for elche, _ in MISFITS:
        try:
            ElCheTrainer(model=_model(), args=args, train_dataset=_Rows(), data_collator=collate,
                         elche=ElCheArguments(**elche))
            messages.append("constructed")  # each misfit is refused at construction, before train()
        except ValueError as exc:
            messages.append(str(exc))
    return messages


def _neftune_on_two_ranks(rank: int, world: int, out: str) -> str:
    args = TrainingArguments(output_dir=out, use_cpu=True, report_to=[], per_device_train_batch_size=4, max_steps=1,
                             neftune_noise_alpha=5.0)
    try:
        ElCheTrainer(model=_model(), args=args, train_dataset=_Rows())
    except ValueError as exc:
        return str(exc)
    return "accepted"


def test_neftune_on_several_ranks_is_refused_at_construction(tmp_path):
    for _, text in run_ranks(_neftune_on_two_ranks, 2, str(tmp_path / "out"), timeout=120):
        assert "neftune_noise_alpha=5.0 on 2 ranks" in text and "transformers.Trainer" in text, text
        assert "\n" not in text


def test_el_che_settings_that_do_not_fit_the_ranks(tmp_path):
    for messages in [value for _, value in run_ranks(_on_two_ranks, 2, str(tmp_path / "out"), timeout=120)]:
        for (_, named), text in zip(MISFITS, messages, strict=True):
            assert named in text and "\n" not in text, text


def _plan(world: int, batch: int, ga: int) -> dict:
    return {"format": 1, "world": world, "batch_size": batch, "anchors": [[0, ga]],
            "splits": [[0, [batch * world - world + 1] + [1] * (world - 1)]]}


REPLAYS = [  # (file name, content or None for a FIFO, what the one-line refusal says)
    ("fifo", None, "is not a regular file (a FIFO, socket or device)"),
    ("garbage.json", "{", "is not valid JSON (JSONDecodeError"),
    ("deep.json", "[" * 200_000 + "]" * 200_000, "is JSON nested deeper than 64 levels"),
    ("list.json", "[]", "is not a recorded El Che plan (got list, not a dict): pass the elche_plan.json"),
    ("three.json", _plan(3, 4, 1), "was recorded on 3 ranks with per_device_train_batch_size=4, but this run has 2 x 4"),
    ("ga.json", _plan(2, 4, 2), "was recorded with gradient_accumulation_steps=2, this run has 1: pass "
                                "gradient_accumulation_steps=2"),
]


def _replays_on_two_ranks(rank: int, world: int, out: str) -> list[str]:
    args = TrainingArguments(output_dir=out, use_cpu=True, report_to=[], per_device_train_batch_size=4, max_steps=1)
    messages = []
    for name, _, _ in REPLAYS:
        try:
            ElCheTrainer(model=_model(), args=args, train_dataset=_Rows(),
                         elche=ElCheArguments(replay_plan=f"{out}/{name}"))
            messages.append("constructed")
        except ValueError as exc:
            messages.append(str(exc))
    return messages


def test_a_plan_that_does_not_fit_is_refused_at_construction(tmp_path):
    import json
    import os

    out = tmp_path / "out"
    out.mkdir()
    for name, content, _ in REPLAYS:
        if content is None:
            os.mkfifo(out / name)  # read, it would block for ever
        else:
            (out / name).write_text(content if isinstance(content, str) else json.dumps(content))
    for messages in [value for _, value in run_ranks(_replays_on_two_ranks, 2, str(out), timeout=120)]:
        for (_, _, said), text in zip(REPLAYS, messages, strict=True):
            assert said in text and "ElCheArguments.replay_plan" in text and "\n" not in text, text


BAD_FORMAT = '{"format": "x", "global_micro_batch": 8, "micro_batches_per_window": 1}'


@pytest.mark.parametrize("text", ["{", '{"format": 1}', "[]", BAD_FORMAT])
def test_a_damaged_el_che_state_is_refused_in_one_line(tmp_path, text):
    checkpoint = tmp_path / "checkpoint-4"
    checkpoint.mkdir()
    (checkpoint / "elche_trainer.json").write_text(text)
    trainer = ElCheTrainer(model=_model(), args=_args(tmp_path, max_steps=1), train_dataset=_Rows())
    with pytest.raises(ValueError) as excinfo:
        trainer.train(resume_from_checkpoint=str(checkpoint))
    assert "is not a readable El Che state" in _message(excinfo) and "resume from another checkpoint" in str(
        excinfo.value)


def _whole_count_loss(outputs, labels, num_items_in_batch=None):
    """A loss that turns the count into a Python integer before dividing by it."""
    return torch.nn.functional.cross_entropy(outputs["logits"], labels, reduction="sum") / int(num_items_in_batch)


class _Penalised(ElCheTrainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        return loss + 1e-2 * sum(p.pow(2).sum() for p in model.parameters())


def _whole_count_on_two_ranks(rank: int, world: int, out: str) -> tuple[str, bool]:
    args = TrainingArguments(output_dir=out, use_cpu=True, report_to=[], per_device_train_batch_size=4, max_steps=2,
                             gradient_accumulation_steps=2, save_strategy="no", disable_tqdm=True)
    collate = lambda rows: {"input_ids": torch.tensor([r["input_ids"] for r in rows]),
                            "labels": torch.tensor([r["labels"] for r in rows])}
    torch.manual_seed(0)  # the same weights on both ranks, so that rank 0's broadcast changes nothing
    trainer = _Penalised(model=_model(), args=args, train_dataset=_Rows(), data_collator=collate,
                         compute_loss_func=_whole_count_loss, elche=ElCheArguments(batch_sizes=[5, 3]))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    try:
        trainer.train()
        text = "trained"
    except ValueError as exc:
        text = str(exc)
    untouched = all(torch.equal(a, p) for a, p in zip(before, trainer.model.parameters()))
    return text, untouched


def test_an_override_whose_loss_truncates_the_count_is_refused_before_any_update(tmp_path):
    """Each rank's count is its fractional share of the window's: int() would truncate it, and the whole count
    instead would count a penalty added in the override once per rank."""
    for status, value in run_ranks(_whole_count_on_two_ranks, 2, str(tmp_path / "out"), timeout=120):
        assert status == "ok", value
        text, untouched = value
        assert text.startswith("_Penalised.compute_loss: the loss turns num_items_in_batch into a whole number"), text
        assert "float(num_items_in_batch)" in text and "\n" not in text and untouched, text
