"""A fine-tuning loop that uses every part of setup mode's exactness contract, on one device or many.

    python examples/exact_loop.py                          # one device
    FLODL_HF_DEVICES=cpu,cpu python examples/exact_loop.py # two CPU ranks: the same updates, up to float rounding

- a token-level loss (mean over tokens whose label is not -100) declared with ``graph.loss_items``;
- the embeddings frozen before setup, unfrozen after a quarter of the run (gradual unfreezing);
- a transformers warmup + linear-decay schedule sized with ``graph.total_steps(epochs)``: it ends at exactly 0;
- input prepared ahead of compute by a ``DataLoader`` over ``graph.plan(epoch)``;
- a constant effective batch (``fixed_anchor``) and a per-rank memory cap (``max_micro_batch``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import get_linear_schedule_with_warmup

from flodl_hf import DdpConfig, Graph, Trainer

VOCAB, CLASSES, SEQ = 50, 4, 12


class Tagger(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embeddings = torch.nn.Embedding(VOCAB, 32)
        self.encoder = torch.nn.GRU(32, 32, batch_first=True)
        self.classifier = torch.nn.Linear(32, CLASSES)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.encoder(self.embeddings(ids))[0])


def make_rows(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    tags = ids % CLASSES
    tags[torch.rand(n, SEQ, generator=g) < 0.3] = -100  # unlabelled tokens (e.g. sub-words after the first)
    return list(zip(ids, tags))


def collate(rows: list) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])


def main() -> None:
    torch.manual_seed(0)
    model = Tagger()
    model.embeddings.requires_grad_(False)  # frozen at setup: every replica keeps it frozen
    graph = Graph(model)
    config = DdpConfig(fixed_anchor=2, max_micro_batch=24, seed=0)
    Trainer.setup_with(graph, lambda device: Tagger(), lambda params: torch.optim.AdamW(params, lr=3e-3), config)
    rows = make_rows(2048)
    graph.set_data_loader(rows, batch_size=16, collate_fn=collate)
    epochs = 2
    total = graph.total_steps(epochs)  # micro-steps: the same on every rank, whatever El Che does
    graph.set_scheduler(get_linear_schedule_with_warmup(graph.optimizer, total // 10, total))
    done = 0
    for epoch in range(epochs):
        # Workers collate ahead of compute; the plan fixes each step's split when it is drawn, so read-ahead
        # never changes what is trained (graph.epoch(epoch, prefetch=2) does the same on a thread).
        loader = torch.utils.data.DataLoader(rows, batch_sampler=graph.plan(epoch), collate_fn=collate,
                                             num_workers=1)
        for ids, tags in loader:
            if done == total // 4:
                graph.module.embeddings.requires_grad_(True)  # gradual unfreezing: takes effect on every rank
            logits = graph.module(ids.to(graph.device))
            tags = tags.to(graph.device)
            loss = F.cross_entropy(logits.reshape(-1, CLASSES), tags.reshape(-1), ignore_index=-100)
            graph.loss_items(int((tags != -100).sum()))  # what this mean is over: labelled tokens
            loss.backward()
            graph.step()
            done += 1
        if graph.is_main:
            print(f"epoch {epoch + 1}: loss {loss.item():.4f}, lr {graph.optimizer.param_groups[0]['lr']:.2e}, "
                  f"optimizer steps {graph.training_step}")
    graph.close()
    if graph.is_main:
        assert graph.optimizer.param_groups[0]["lr"] == 0.0  # the schedule ended exactly at the last micro-step
        print(f"done: {done} micro-steps, {graph.training_step} optimizer steps, final lr 0.0")


if __name__ == "__main__":
    main()
