"""Builder mode: the framework owns the loop. Two CPU workers (or your GPUs) train a small BERT classifier on the
packaged sentiment corpus with local SGD, averaged per policy; change ONE line to A/B the six combinations.

    python examples/builder_mode.py                       # 2 CPU workers, CADENCE over the process group
    python examples/builder_mode.py --policy async --backend cpu --speeds 1.0,0.4

Factories must be picklable (module-level functions or functools.partial), because they run inside the workers.
The dataset (one small dict of tensors per row) is pickled once into plain bytes and sent to each worker, so the
caller holds no file descriptor per tensor: this runs as shipped under `ulimit -n 1024`.
"""

from __future__ import annotations

import argparse
import functools

import torch
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

from flodl_hf import ApplyPolicy, AverageBackend, Trainer, record_scalar
from flodl_hf.data import load_text_classification
from flodl_hf.defaults import default_corpus_path, default_model_path

MAX_LENGTH = 48


def build_model(device: torch.device, vocab_size: int, num_labels: int) -> torch.nn.Module:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=64, num_labels=num_labels)
    return BertForSequenceClassification(config).to(device)


def build_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=2e-3)


def train_step(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    device = next(model.parameters()).device
    out = model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device),
                labels=batch["labels"].to(device))
    record_scalar("accuracy", (out.logits.argmax(-1) == batch["labels"].to(device)).float().mean().item())
    return out.loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default="cadence", choices=["sync", "cadence", "async"])
    parser.add_argument("--backend", default="nccl", choices=["nccl", "cpu"],
                        help="nccl = the process group's collective (gloo on CPU workers); cpu = coordinator")
    parser.add_argument("--devices", default="cpu,cpu")
    parser.add_argument("--speeds", default=None, help="SIMULATED relative speeds, e.g. 1.0,0.4")
    parser.add_argument("--rows", type=int, default=1500)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    data = load_text_classification(default_corpus_path(), label_column="sentiment").subset(args.rows, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(str(default_model_path()))
    enc = tokenizer(data.texts, padding="max_length", truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
    dataset = [{"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i],
                "labels": torch.tensor(data.label_ids[i])} for i in range(len(data))]

    model_factory = functools.partial(build_model, vocab_size=tokenizer.vocab_size, num_labels=len(data.labels))
    builder = (Trainer.builder(model_factory, build_optimizer, train_step)
               .dataset(dataset).batch_size(16).num_epochs(args.epochs)
               .policy(ApplyPolicy[args.policy.upper()])
               .backend(AverageBackend[args.backend.upper()])
               .devices(args.devices.split(",")))
    if args.speeds:
        builder = builder.simulate_speeds([float(s) for s in args.speeds.split(",")])
    handle = builder.run()
    while (metrics := handle.next_metrics()) is not None:
        print(f"epoch {metrics.epoch}: loss {metrics.avg_loss:.3f}, train accuracy "
              f"{metrics.scalars.get('accuracy', float('nan')):.3f}, batch share {metrics.per_rank_batch_share}")
    state = handle.join()
    model = state.load_into(model_factory(torch.device("cpu")))
    print("trained:", sum(p.numel() for p in model.parameters()), "parameters averaged over", handle.world_size,
          "workers")


if __name__ == "__main__":
    main()
