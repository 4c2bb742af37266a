"""A user's setup-mode loop where synchronising costs more than computing: a 2-layer BERT with a 30,000-word
vocabulary (a dense 7.7 MB embedding gradient on the wire) trained one row per rank per micro-batch, with the
default ``DdpConfig``. It is the regime in which a machine's load made El Che lengthen its window (sync slowed
against compute), here reached without depending on the load.

    python sync_heavy_loop.py OUT BATCH              # one device, BATCH rows per step
    torchrun --nproc-per-node 2 sync_heavy_loop.py OUT 1

Rank 0 writes OUT/params.pt (the final parameters) and OUT/plan.json (the El Che plan, on N ranks).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import BertConfig, BertForSequenceClassification

from flodl_hf import Graph, Trainer

VOCAB, ROWS, SEQ, CLASSES = 30000, 192, 8, 3


def build(device=None) -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        num_labels=CLASSES)
    model = BertForSequenceClassification(config)
    return model if device is None else model.to(device)


def rows() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (ROWS, SEQ), generator=g)
    labels = torch.randint(0, CLASSES, (ROWS,), generator=g)  # random labels: a noisy gradient
    return list(zip(ids, labels))


def collate(batch: list) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.stack([r[0] for r in batch]), torch.stack([r[1] for r in batch])


def main(out: Path, batch_size: int) -> None:
    graph = Graph(build())
    Trainer.setup(graph, build, lambda params: torch.optim.AdamW(params, lr=1e-3))
    graph.set_data_loader(rows(), batch_size=batch_size, collate_fn=collate)
    for ids, labels in graph.epoch(0):
        loss = graph.module(input_ids=ids.to(graph.device), labels=labels.to(graph.device)).loss
        loss.backward()
        graph.step()
    graph.close()
    if graph.is_main:
        out.mkdir(parents=True, exist_ok=True)
        torch.save({k: v.detach().cpu() for k, v in graph.module.state_dict().items()}, out / "params.pt")
        plan = graph.el_che_plan() if graph.world_size > 1 else None
        (out / "plan.json").write_text(json.dumps({"plan": plan, "steps": graph.training_step}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
