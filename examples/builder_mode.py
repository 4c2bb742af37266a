"""Builder mode: the framework owns the loop. Two CPU workers (or your GPUs) train a small BERT task head on the
packaged sentiment corpus; change ONE line to A/B the six policy x backend combinations.

    python examples/builder_mode.py                       # 2 CPU workers, CADENCE over the process group
    python examples/builder_mode.py --policy async --backend cpu --speeds 1.0,0.4
    python examples/builder_mode.py --policy sync         # synchronous data parallelism: gradients averaged

The replica is a task head from heads/ (the same class setup mode uses), built on each worker by
`functools.partial(BertForSequenceClassification.on_device, config, num_labels)`, and `train_fn` is one line of
`head.compute_loss`. Factories must be picklable (module-level functions or functools.partial), because they run
inside the workers. The dataset (one small dict of tensors per row) is pickled once into plain bytes and sent to
each worker, so the caller holds no file descriptor per tensor: this runs as shipped under `ulimit -n 1024`.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer, BertConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # heads/ when run from a checkout

from flodl_hf import ApplyPolicy, AverageBackend, Trainer, record_scalar  # noqa: E402
from flodl_hf.data import load_text_classification  # noqa: E402
from flodl_hf.defaults import default_corpus_path, default_model_path  # noqa: E402
from heads import BertForSequenceClassification  # noqa: E402

MAX_LENGTH = 48


def small_config(vocab_size: int) -> BertConfig:
    return BertConfig(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=128, max_position_embeddings=64)


def train_step(head: BertForSequenceClassification, batch: dict) -> torch.Tensor:
    """What a setup-mode loop does per batch, minus backward and step (the builder runs those)."""
    enc = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    loss = head.compute_loss(enc, batch["labels"])
    record_scalar("loss_check", loss.detach())
    return loss


def build_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=2e-3)


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

    config = small_config(tokenizer.vocab_size)
    config.id2label = dict(enumerate(data.labels))
    config.label2id = {name: i for i, name in enumerate(data.labels)}
    head_factory = functools.partial(BertForSequenceClassification.on_device, config, len(data.labels))
    builder = (Trainer.builder(head_factory, build_optimizer, train_step)
               .dataset(dataset).batch_size(16).num_epochs(args.epochs)
               .policy(ApplyPolicy[args.policy.upper()])
               .backend(AverageBackend[args.backend.upper()])
               .devices(args.devices.split(",")))
    if args.speeds:
        builder = builder.simulate_speeds([float(s) for s in args.speeds.split(",")])
    handle = builder.run()
    while (metrics := handle.next_metrics()) is not None:
        print(f"epoch {metrics.epoch}: loss {metrics.avg_loss:.3f}, batch share {metrics.per_rank_batch_share}")
    state = handle.join()
    head = state.load_into(head_factory(torch.device("cpu")))
    head.tokenizer = tokenizer
    print("trained:", sum(p.numel() for p in head.graph().module.parameters()), "parameters averaged over",
          handle.world_size, "workers")
    print("predict:", head.predict(["what a wonderful day", "this is terrible"], top_k=1))


if __name__ == "__main__":
    main()
