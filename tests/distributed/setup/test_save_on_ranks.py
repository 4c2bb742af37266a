"""``head.save_pretrained`` at the end of an unchanged loop, on 2 and 3 real gloo ranks: rank 0 writes, the others
wait until the directory is complete and get the same path; the directory is what transformers loads as rank 0's
model (the reference: ``AutoModelForSequenceClassification.from_pretrained`` in this process). A loop that saves on
rank 0 only still works, and a failure on rank 0 is named on every other rank instead of a hang or a race.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tiny_models
from dist_helpers import run_ranks

LABELS = ["neg", "pos"]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return tiny_models.make_checkpoint("bert", tmp_path_factory.mktemp("save-base") / "base", with_classifier=False)


def _set_up(base: str):
    from flodl_hf import DdpConfig, Trainer
    from heads import AutoHeadForSequenceClassification

    head = AutoHeadForSequenceClassification.from_pretrained(base, labels=LABELS, max_length=16)
    config = head.config()
    Trainer.setup_head_with(head, lambda dev: AutoHeadForSequenceClassification.on_device(config, len(LABELS), dev),
                            lambda params: torch.optim.SGD(params, lr=0.1), DdpConfig(verbose=False, timeout_s=60))
    return head


def _save_everywhere(rank: int, world: int, base: str, out: str):
    head = _set_up(base)
    with torch.no_grad():  # a rank whose weights differed would show in the file if it wrote
        next(head.graph().module.parameters()).add_(float(rank))
    written = head.save_pretrained(out)
    complete = sorted(p.name for p in Path(out).iterdir())  # when save_pretrained returns, on every rank
    state = {k: v.detach().clone() for k, v in head.graph().module.state_dict().items()} if rank == 0 else None
    return str(written), complete, state


@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_saving_writes_rank_0s_model_once_and_returns_when_it_is_complete(base, tmp_path, world):
    from transformers import AutoModelForSequenceClassification

    out = tmp_path / "my-classifier"
    results = run_ranks(_save_everywhere, world, str(base), str(out), timeout=120)
    assert [status for status, _ in results] == ["ok"] * world, results
    paths = {value[0] for _, value in results}
    listings = [value[1] for _, value in results]
    assert paths == {str(out)}
    assert all(listing == listings[0] for listing in listings) and "model.safetensors" in listings[0], listings
    assert "config.json" in listings[0] and not [p for p in listings[0] if "partial" in p], listings[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my-classifier"]  # no rank's staging left behind
    loaded = AutoModelForSequenceClassification.from_pretrained(out).state_dict()
    reference = results[0][1][2]
    assert sorted(loaded) == sorted(reference)
    for key, value in reference.items():
        assert torch.equal(loaded[key], value), key


def _save_on_main_only(rank: int, world: int, base: str, out: str):
    head = _set_up(base)
    if head.graph().is_main:
        return str(head.save_pretrained(out))
    return None


def test_saving_on_rank_0_only_still_works(base, tmp_path):
    out = tmp_path / "main-only"
    results = run_ranks(_save_on_main_only, 2, str(base), str(out), timeout=120)
    assert results == [("ok", str(out)), ("ok", None)], results
    assert (out / "model.safetensors").exists()


def _save_refused(rank: int, world: int, base: str, out: str):
    head = _set_up(base)
    try:
        head.save_pretrained(out)
    except Exception as exc:  # noqa: BLE001 - the line each rank shows is what is checked
        return type(exc).__name__, str(exc)
    return None


def test_a_failure_on_rank_0_is_named_on_every_rank(base, tmp_path):
    out = tmp_path / "notes"
    out.mkdir()
    (out / "mine.txt").write_text("a user's file")  # not a model directory: save_pretrained refuses it
    results = run_ranks(_save_refused, 3, str(base), str(out), timeout=120)
    assert [status for status, _ in results] == ["ok"] * 3, results
    (kind0, line0), *others = [value for _, value in results]
    assert kind0 == "FileExistsError" and "refusing to write into" in line0
    for rank, (kind, line) in enumerate(others, start=1):
        assert kind == "DistributedError", (kind, line)
        assert line.startswith(f"rank {rank}: rank 0 could not write {str(out)!r}: FileExistsError: refusing"), line
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]


def _save_export_and_card(rank: int, world: int, base: str, root: str):
    from flodl_hf.export import export_model_dir
    from flodl_hf.export.cards import CardInfo, write_model_card
    from flodl_hf.metrics import classification_summary

    head = _set_up(base)
    saved = head.save_pretrained(Path(root) / "saved")
    info = CardInfo(model_name="tiny", labels=LABELS, metrics=classification_summary([0, 1], [0, 1], LABELS),
                    dataset_name="toy", train_rows=2, eval_rows=2)
    card = write_model_card(info, saved)  # into the saved directory: a later export copies it along
    exported = export_model_dir(saved, Path(root) / "exported")
    return str(card), str(exported), sorted(p.name for p in exported.iterdir())


def test_export_and_a_model_card_on_every_rank_are_written_once(base, tmp_path):
    from flodl_hf.export import export_model_dir

    results = run_ranks(_save_export_and_card, 2, str(base), str(tmp_path), timeout=120)
    assert [status for status, _ in results] == ["ok"] * 2, results
    assert results[0][1] == results[1][1], results  # the same paths, and the export complete on both ranks
    card, exported, listing = results[0][1]
    assert card == str(tmp_path / "saved" / "README.md") and "README.md" in listing and "model.safetensors" in listing
    reference = export_model_dir(tmp_path / "saved", tmp_path / "reference")  # one process, the same source
    assert listing == sorted(p.name for p in reference.iterdir())
    for name in ("model.safetensors", "README.md", "config.json"):
        assert (Path(exported) / name).read_bytes() == (reference / name).read_bytes(), name
