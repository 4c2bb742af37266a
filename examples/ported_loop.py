"""``examples/plain_loop.py`` ported to setup mode: the same loop on 1 CPU, 1 GPU, N GPUs, N CPU ranks or N
machines, unchanged. docs/porting.md walks through each change (the numbered comments).

    python examples/ported_loop.py                                           # one device: equals plain_loop.py
    FLODL_HF_DEVICES=cpu,cpu python examples/ported_loop.py --batch-size 8   # 2 CPU ranks: the same 16-row steps
    torchrun --nproc-per-node 2 examples/ported_loop.py --batch-size 8       # the same under torchrun
"""

from __future__ import annotations

import argparse
import copy

import torch
from torch.utils.data import RandomSampler
from transformers import AutoModelForSequenceClassification, AutoTokenizer, get_linear_schedule_with_warmup

from flodl_hf import Graph, Trainer
from flodl_hf.data import load_text_classification
from flodl_hf.defaults import default_corpus_path, default_model_path


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model directory (default: the packaged MiniLM)")
    parser.add_argument("--data", default=None, help="CSV file with text and label columns (default: the packaged "
                                                     "sentiment corpus)")
    parser.add_argument("--label-column", default=None, help="default: 'sentiment' for the packaged corpus")
    parser.add_argument("--rows", type=int, default=640, help="training rows")
    parser.add_argument("--eval-rows", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16, help="rows per rank per step (global: x ranks)")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--save", default=None, help="write the final state_dict here (torch.save)")
    return parser.parse_args()


def load_data(args: argparse.Namespace):
    label_column = args.label_column or ("sentiment" if args.data is None else "label")
    data = load_text_classification(args.data or default_corpus_path(), label_column=label_column)
    data = data.subset(min(len(data), args.rows + args.eval_rows), seed=0)
    train, test = data.split(args.eval_rows, seed=0)  # ds[i] is (text, label id)
    return train, test


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    model_dir = args.model or default_model_path()
    train, test = load_data(args)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def collate(rows: list) -> dict:
        batch = tokenizer([text for text, _ in rows], padding=True, truncation=True, max_length=64,
                          return_tensors="pt")
        batch["labels"] = torch.tensor([label for _, label in rows])
        return batch

    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=len(train.labels))
    graph = Graph(model)  # [1] no .to(device): setup picks this rank's device
    Trainer.setup(graph,
                  lambda device: copy.deepcopy(model).to(device),  # [2] a replica per rank, no random draws
                  lambda params: torch.optim.AdamW(params, lr=args.lr))  # [3] the optimizer, as a factory
    model, device = graph.module, graph.device  # [4] train the replica
    sampler = RandomSampler(train, generator=torch.Generator().manual_seed(args.seed))
    graph.set_data_loader(train, batch_size=args.batch_size, collate_fn=collate, sampler=sampler)  # [5]
    total = graph.total_steps(args.epochs)  # [6] steps of the whole run, the same on every rank
    graph.set_scheduler(get_linear_schedule_with_warmup(graph.optimizer, total // 10, total))

    for epoch in range(args.epochs):
        model.train()
        for batch in graph.epoch(epoch):  # [7] this rank's share of each global batch
            batch = batch.to(device)
            loss = model(**batch).loss
            loss.backward()
            graph.step()  # [8] averages over the ranks, then optimizer.step(), scheduler.step(), zero_grad()
        predictions = graph.gather_predictions(  # [9] each rank predicts a slice; every rank gets all, in order
            test, lambda batch: model(**batch.to(device)).logits.argmax(-1), batch_size=64, collate_fn=collate)
        accuracy = (predictions == torch.tensor([label for _, label in test])).float().mean().item()
        if graph.is_main:  # [10] every rank runs this loop: one prints
            print(f"epoch {epoch}: accuracy {accuracy:.4f}")
    if args.save and graph.is_main:
        torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, args.save)


if __name__ == "__main__":
    main()
