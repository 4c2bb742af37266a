"""flodl_hf.data: every loader (CSV, TSV, JSON, JSON-lines, saved datasets), the dataset type, every error."""

from __future__ import annotations

import json

import pytest

from flodl_hf.data import TextDataset, load_text_classification


def write_csv(path, rows, header=("text", "label"), encoding="utf-8", delimiter=","):
    lines = [delimiter.join(header)] + [delimiter.join(map(str, row)) for row in rows]
    path.write_bytes(("\n".join(lines) + "\n").encode(encoding))
    return path


ROWS = [("good film", "pos"), ("bad film", "neg"), ("fine film", "neu"), ("great film", "pos")]


# --- loaders ------------------------------------------------------------------------------------------------

def test_csv_maps_sorted_string_labels(tmp_path):
    ds = load_text_classification(write_csv(tmp_path / "d.csv", ROWS))
    assert ds.labels == ["neg", "neu", "pos"]
    assert len(ds) == 4
    assert ds[0] == ("good film", 2)
    assert ds.texts == [t for t, _ in ROWS]
    assert ds.label_ids == [2, 0, 1, 2]
    assert list(ds) == [("good film", 2), ("bad film", 0), ("fine film", 1), ("great film", 2)]
    assert ds.label_counts() == {"neg": 1, "neu": 1, "pos": 2}


def test_given_labels_fix_order_and_may_include_unseen(tmp_path):
    ds = load_text_classification(write_csv(tmp_path / "d.csv", ROWS), labels=["pos", "neg", "neu", "other"])
    assert ds.labels == ["pos", "neg", "neu", "other"]
    assert ds.label_ids == [0, 1, 2, 0]


def test_numeric_string_labels_sort_numerically(tmp_path):
    rows = [(f"t{i}", lab) for i, lab in enumerate(["10", "2", "1", "2"])]
    ds = load_text_classification(write_csv(tmp_path / "d.csv", rows))
    assert ds.labels == ["1", "2", "10"]


def test_csv_custom_columns_quotes_and_commas(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text('id,body,y\n1,"hello, world",a\n2,"multi\nline ""quoted""",b\n', encoding="utf-8")
    ds = load_text_classification(path, text_column="body", label_column="y")
    assert ds.texts == ["hello, world", 'multi\nline "quoted"']
    assert ds.labels == ["a", "b"]


def test_tsv(tmp_path):
    ds = load_text_classification(write_csv(tmp_path / "d.tsv", ROWS, delimiter="\t"))
    assert len(ds) == 4 and ds.labels == ["neg", "neu", "pos"]


def test_encoding_sniffed_latin1_and_utf8_bom(tmp_path):
    latin = write_csv(tmp_path / "latin.csv", [("café crème", "a"), ("naïve", "b")], encoding="latin-1")
    assert load_text_classification(latin).texts == ["café crème", "naïve"]
    bom = tmp_path / "bom.csv"
    bom.write_bytes("text,label\nthé,a\n".encode("utf-8-sig"))
    ds = load_text_classification(bom)  # the BOM must not become part of the first column name
    assert ds.texts == ["thé"]


def test_explicit_encoding_is_used_and_wrong_one_is_explained(tmp_path):
    path = write_csv(tmp_path / "latin.csv", [("café", "a")], encoding="latin-1")
    assert load_text_classification(path, encoding="latin-1").texts == ["café"]
    with pytest.raises(ValueError, match="not valid utf-8"):
        load_text_classification(path, encoding="utf-8")
    with pytest.raises(ValueError, match="unknown encoding 'nope'"):
        load_text_classification(path, encoding="nope")


def test_json_list_columns_and_jsonl(tmp_path):
    records = [{"text": t, "label": lab} for t, lab in ROWS]
    (tmp_path / "a.json").write_text(json.dumps(records))
    (tmp_path / "b.json").write_text(json.dumps({"text": [t for t, _ in ROWS], "label": [lab for _, lab in ROWS]}))
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    (tmp_path / "d.json").write_text("\n".join(json.dumps(r) for r in records))  # JSON lines named .json
    for name in ("a.json", "b.json", "c.jsonl", "d.json"):
        ds = load_text_classification(tmp_path / name)
        assert ds.texts == [t for t, _ in ROWS], name
        assert ds.labels == ["neg", "neu", "pos"], name


def test_integer_labels_are_ids(tmp_path):
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps({"text": f"t{i}", "label": i % 3}) for i in range(6)))
    ds = load_text_classification(tmp_path / "d.jsonl")
    assert ds.labels == ["0", "1", "2"]
    assert ds.label_ids == [0, 1, 2, 0, 1, 2]
    named = load_text_classification(tmp_path / "d.jsonl", labels=["a", "b", "c"])
    assert named.labels == ["a", "b", "c"] and named.label_ids == [0, 1, 2, 0, 1, 2]
    with pytest.raises(ValueError, match=r"row 3 has label id 2, outside the 2 known labels \['a', 'b'\]"):
        load_text_classification(tmp_path / "d.jsonl", labels=["a", "b"])


def test_saved_datasets_directory_with_class_labels(tmp_path):
    import datasets  # a dev dependency: missing means a broken test environment, not a skip
    features = datasets.Features({"sentence": datasets.Value("string"),
                                  "y": datasets.ClassLabel(names=["neg", "pos"])})
    data = datasets.Dataset.from_dict({"sentence": ["bad", "good", "great"], "y": [0, 1, 1]}, features=features)
    data.save_to_disk(str(tmp_path / "ds"))
    ds = load_text_classification(tmp_path / "ds", text_column="sentence", label_column="y")
    assert ds.labels == ["neg", "pos"] and ds.label_ids == [0, 1, 1] and ds.texts == ["bad", "good", "great"]

    datasets.DatasetDict({"train": data, "test": data}).save_to_disk(str(tmp_path / "dd"))
    assert len(load_text_classification(tmp_path / "dd", text_column="sentence", label_column="y")) == 3  # train
    datasets.DatasetDict({"validation": data, "test": data}).save_to_disk(str(tmp_path / "vt"))
    with pytest.raises(ValueError, match=r"holds splits \['validation', 'test'\]: choose one with --split"):
        load_text_classification(tmp_path / "vt", text_column="sentence", label_column="y")
    with pytest.raises(ValueError, match=r"has no split 'dev'; available splits: train, test. Choose one with --split"):
        load_text_classification(tmp_path / "dd", text_column="sentence", label_column="y", split="dev")
    assert len(load_text_classification(tmp_path / "dd", text_column="sentence", label_column="y",
                                        split="test")) == 3
    (tmp_path / "plain").mkdir()
    with pytest.raises(ValueError, match="not a dataset saved with save_to_disk"):
        load_text_classification(tmp_path / "plain")


def test_empty_texts_are_dropped_and_counted(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("text,label\ngood,pos\n,neg\n   ,neg\nbad,neg\n", encoding="utf-8")
    ds = load_text_classification(path)
    assert ds.texts == ["good", "bad"] and ds.dropped == 2
    (tmp_path / "n.jsonl").write_text('{"text": null, "label": "a"}\n{"text": "x", "label": "a"}\n')
    assert load_text_classification(tmp_path / "n.jsonl").dropped == 1


def test_limit_keeps_first_usable_rows(tmp_path):
    ds = load_text_classification(write_csv(tmp_path / "d.csv", ROWS), limit=2)
    assert ds.texts == ["good film", "bad film"]


# --- the dataset type ---------------------------------------------------------------------------------------

def make(n):
    return TextDataset([f"t{i}" for i in range(n)], [i % 3 for i in range(n)], ["a", "b", "c"])


def test_split_is_seeded_disjoint_and_complete():
    ds = make(100)
    train, held = ds.split(20, seed=0)
    assert len(train) == 80 and len(held) == 20
    assert set(train.texts).isdisjoint(held.texts)
    assert set(train.texts) | set(held.texts) == set(ds.texts)
    again_train, again_held = ds.split(20, seed=0)
    assert again_held.texts == held.texts and again_train.texts == train.texts
    assert ds.split(20, seed=1)[1].texts != held.texts
    assert len(ds.split(0.25, seed=0)[1]) == 25
    assert train.labels == ds.labels


@pytest.mark.parametrize("bad, message", [(0, "cannot hold out 0 of 10"), (10, "cannot hold out 10 of 10"),
                                          (1.0, "a fraction must be in"), ("x", "give a fraction")])
def test_split_rejects_bad_sizes(bad, message):
    with pytest.raises(ValueError, match=message):
        make(10).split(bad)


def test_subset_is_seeded_and_capped():
    ds = make(50)
    sub = ds.subset(10, seed=3)
    assert len(sub) == 10 and sub.texts == ds.subset(10, seed=3).texts
    assert set(sub.texts) <= set(ds.texts)
    assert len(ds.subset(500)) == 50
    with pytest.raises(ValueError, match="subset size n=0 is invalid"):
        ds.subset(0)


def test_dataset_checks_ids_and_lengths():
    with pytest.raises(ValueError, match="2 texts but 1 label ids"):
        TextDataset(["a", "b"], [0], ["x"])
    with pytest.raises(ValueError, match="row 2 has label id 5, outside the 1 known labels"):
        TextDataset(["a", "b"], [0, 5], ["x"])


# --- errors -------------------------------------------------------------------------------------------------

def test_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="data file not found: .*missing.csv"):
        load_text_classification(tmp_path / "missing.csv")


def test_unsupported_extension(tmp_path):
    (tmp_path / "d.xlsx").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"unsupported data file 'd.xlsx': use one of .csv, .tsv, .json"):
        load_text_classification(tmp_path / "d.xlsx")


@pytest.mark.parametrize("content", ["", "text,label\n"])
def test_empty_file(tmp_path, content):
    (tmp_path / "d.csv").write_text(content)
    with pytest.raises(ValueError, match="has no data rows"):
        load_text_classification(tmp_path / "d.csv")


def test_only_empty_texts(tmp_path):
    (tmp_path / "d.csv").write_text("text,label\n,a\n  ,b\n")
    with pytest.raises(ValueError, match=r"has no rows with text in column 'text' \(2 empty rows\)"):
        load_text_classification(tmp_path / "d.csv")


def test_missing_text_column_names_it_and_lists_columns(tmp_path):
    path = write_csv(tmp_path / "d.csv", ROWS, header=("sentence", "label"))
    with pytest.raises(ValueError, match=r"no text column 'text'; available columns: 'sentence', 'label'. "
                                         r"Choose one with text_column / --text-column"):
        load_text_classification(path)


def test_missing_label_column_names_it_and_lists_columns(tmp_path):
    path = write_csv(tmp_path / "d.csv", ROWS, header=("text", "y"))
    with pytest.raises(ValueError, match=r"no label column 'label'; available columns: 'text', 'y'. "
                                         r"Choose one with label_column / --label-column"):
        load_text_classification(path)


def test_non_text_value_names_the_row(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"text": "ok", "label": "a"}\n{"text": 42, "label": "a"}\n')
    with pytest.raises(ValueError, match=r"row 2 has a int \(42\) in text column 'text'; every text must be a str"):
        load_text_classification(tmp_path / "d.jsonl")


def test_unknown_label_names_value_row_and_known_labels(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("text,label\n,pos\ngood,pos\nmeh,maybe\n")  # row 1 is dropped: numbering stays the file's
    with pytest.raises(ValueError, match=r"row 3 has label 'maybe', which is not one of the known labels "
                                         r"\['neg', 'pos'\]"):
        load_text_classification(path, labels=["neg", "pos"])


def test_missing_and_bad_labels(tmp_path):
    (tmp_path / "a.csv").write_text("text,label\ngood,\n")
    with pytest.raises(ValueError, match="row 1 has no label in column 'label'"):
        load_text_classification(tmp_path / "a.csv")
    (tmp_path / "b.jsonl").write_text('{"text": "x", "label": 1.5}\n')
    with pytest.raises(ValueError, match="row 1 has a float label"):
        load_text_classification(tmp_path / "b.jsonl")
    (tmp_path / "c.jsonl").write_text('{"text": "x", "label": -1}\n')
    with pytest.raises(ValueError, match="negative label id -1"):
        load_text_classification(tmp_path / "c.jsonl")


def test_bad_arguments(tmp_path):
    path = write_csv(tmp_path / "d.csv", ROWS)
    with pytest.raises(ValueError, match=r"labels \['a', 'a'\] repeat \['a'\]"):
        load_text_classification(path, labels=["a", "a"])
    with pytest.raises(ValueError, match="labels=\\[\\] is invalid"):
        load_text_classification(path, labels=[])
    with pytest.raises(ValueError, match="limit=0 is invalid"):
        load_text_classification(path, limit=0)


def test_bad_json(tmp_path):
    (tmp_path / "a.json").write_text('{"text": ')
    with pytest.raises(ValueError, match="is not valid JSON"):
        load_text_classification(tmp_path / "a.json")
    (tmp_path / "b.jsonl").write_text('{"text": "x", "label": "a"}\nnot json\n')
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        load_text_classification(tmp_path / "b.jsonl")
    (tmp_path / "c.json").write_text('[["x", "a"]]')
    with pytest.raises(ValueError, match="row 1 is a list, not an object"):
        load_text_classification(tmp_path / "c.json")
    (tmp_path / "d.json").write_text('{"text": ["a", "b"], "label": ["x"]}')
    with pytest.raises(ValueError, match="columns have different lengths"):
        load_text_classification(tmp_path / "d.json")
