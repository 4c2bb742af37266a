"""A plain PyTorch fine-tuning loop on one device: the script before porting it to setup mode (docs/porting.md).

It has the shape of the NLP example of accelerate's repository (nlp_example.py): an
``AutoModelForSequenceClassification`` and its tokenizer, ``DataLoader``s, AdamW, a linear warmup-and-decay
schedule, and an evaluation after every epoch. Its shuffle is a ``RandomSampler`` over a seeded generator, so a run
can be repeated. ``examples/ported_loop.py`` is the same loop in setup mode, which trains it on 1 device or N
unchanged.

    python examples/plain_loop.py          # the packaged MiniLM on 640 rows of the packaged sentiment corpus
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.data import DataLoader, RandomSampler
from transformers import AutoModelForSequenceClassification, AutoTokenizer, get_linear_schedule_with_warmup

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
    parser.add_argument("--batch-size", type=int, default=16)
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

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=len(train.labels)).to(device)
    sampler = RandomSampler(train, generator=torch.Generator().manual_seed(args.seed))
    train_loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler, collate_fn=collate,
                              drop_last=True)
    eval_loader = DataLoader(test, batch_size=64, collate_fn=collate)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    total = len(train_loader) * args.epochs
    scheduler = get_linear_schedule_with_warmup(optimizer, total // 10, total)

    for epoch in range(args.epochs):
        model.train()
        for batch in train_loader:
            batch = batch.to(device)
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        model.eval()
        predictions = []
        with torch.no_grad():
            for batch in eval_loader:
                predictions.append(model(**batch.to(device)).logits.argmax(-1).cpu())
        accuracy = (torch.cat(predictions) == torch.tensor([label for _, label in test])).float().mean().item()
        print(f"epoch {epoch}: accuracy {accuracy:.4f}")
    if args.save:
        torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, args.save)


if __name__ == "__main__":
    main()
