"""peft LoRA in setup mode: ``Trainer.setup_with(Graph(peft_model), factory, optimizer)`` trains exactly on N ranks
and saves an adapter that ``PeftModel.from_pretrained`` loads.

The way in: heads accept only their transformers class, so a LoRA model goes through a plain ``Graph``; the factory
rebuilds the same peft model on each rank's device (its weights, adapters included, are then copied in and rank 0's
broadcast). The reference is one process with plain transformers + peft on each window's samples as one batch.
"""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import BertForSequenceClassification

import tiny_models
from dist_helpers import run_ranks, values
from flodl_hf import DdpConfig, Graph, Trainer

ROWS = tiny_models.toy_task(64, seed=2)
SIZES = {1: [4], 2: [5, 3], 3: [5, 3, 4]}
ANCHOR, SEED, LR = 2, 3, 5e-2


def _config():
    config = tiny_models.tiny_config("bert", num_labels=2)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    return config


def _base() -> BertForSequenceClassification:
    torch.manual_seed(11)  # the frozen base: the same weights wherever it is built
    return BertForSequenceClassification(_config())


def _lora(base: torch.nn.Module) -> torch.nn.Module:
    config = LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8, lora_dropout=0.0,
                        target_modules=["query", "value"], init_lora_weights="gaussian")
    return get_peft_model(base, config)


def _tokens(ids: list[int]) -> tuple[dict, torch.Tensor]:
    enc = _TOKENIZER[0]([ROWS[i][0] for i in ids], padding=True, return_tensors="pt")
    return dict(enc), torch.tensor([ROWS[i][1] for i in ids])


_TOKENIZER = [tiny_models.tiny_tokenizer("bert")]


def _plan(world: int) -> DdpConfig:
    if world == 1:
        return DdpConfig(verbose=False, seed=SEED)
    return DdpConfig(verbose=False, batch_sizes=SIZES[world], anchor=ANCHOR, freeze_plan=True, seed=SEED,
                     timeout_s=60)


def _rank(rank: int, world: int, out: str) -> dict:
    torch.manual_seed(100 + rank)  # each rank's own adapter init: setup must broadcast rank 0's
    model = _lora(_base())
    graph = Graph(model)
    Trainer.setup_with(graph, lambda dev: _lora(_base()).to(dev),
                       lambda p: torch.optim.AdamW([q for q in p if q.requires_grad], lr=LR), _plan(world))
    graph.set_data_loader(list(range(len(ROWS))), batch_size=4, collate_fn=_tokens)
    for enc, labels in graph.epoch(0):
        graph.module(**enc, labels=labels).loss.backward()
        graph.step()
    graph.close()
    if graph.is_main:
        graph.module.save_pretrained(out)  # a peft adapter directory
    graph.module.eval()
    enc, _ = _tokens(list(range(8)))
    with torch.no_grad():
        logits = graph.module(**enc).logits
    return {"state": {k: v.detach().clone() for k, v in graph.module.state_dict().items()}, "logits": logits,
            "trainable": sorted(n for n, p in graph.module.named_parameters() if p.requires_grad)}


def _reference(world: int) -> dict:
    torch.manual_seed(100)
    model = _lora(_base())
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)
    perm = torch.randperm(len(ROWS), generator=torch.Generator().manual_seed(SEED)).tolist()
    g = sum(SIZES[world])
    anchor = ANCHOR if world > 1 else 1
    steps = len(ROWS) // g
    for k in range(0, steps, anchor):
        enc, labels = _tokens(perm[k * g:min(k + anchor, steps) * g])
        model(**enc, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return {"state": {k: v.detach().clone() for k, v in model.state_dict().items()}, "start": start,
            "trainable": sorted(n for n, p in model.named_parameters() if p.requires_grad)}


@pytest.mark.parametrize("world", [1, 2])
def test_lora_trains_exactly_and_saves_an_adapter_peft_loads(tmp_path, world):
    out = str(tmp_path / "adapter")
    results = [_rank(0, 1, out)] if world == 1 else values(run_ranks(_rank, world, out, timeout=180))
    ref = _reference(world)
    lora = [k for k in ref["state"] if "lora_" in k]
    moved = max(float((ref["state"][k] - ref["start"][k]).abs().max()) for k in lora)
    assert lora and moved > 1e-3, moved
    for r in results:
        assert r["trainable"] == ref["trainable"] and any("lora_A" in n for n in r["trainable"])
        for name, value in ref["state"].items():
            torch.testing.assert_close(r["state"][name], value, rtol=1e-5, atol=1e-5, msg=name)
    # the adapter loads in peft onto a fresh base and gives the trained model's logits
    loaded = PeftModel.from_pretrained(_base(), out).eval()
    enc, _ = _tokens(list(range(8)))
    with torch.no_grad():
        torch.testing.assert_close(loaded(**enc).logits, results[0]["logits"], rtol=1e-5, atol=1e-6)
