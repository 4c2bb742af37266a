"""Single-device overhead: the setup-mode loop (Trainer.setup_head + graph.epoch + graph.step) against the same
plain PyTorch loop (same model, optimizer, data order and collate), alternating rounds in one process.

    python benchmarks/single_device_overhead.py [--rounds 6] [--steps 25] [--device cuda:0]

Prints the median step time of each and their ratio; the acceptance target is a ratio within 1.03.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import BertConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the offline tiny tokenizer and toy task

import tiny_models  # noqa: E402

from flodl_hf import DdpConfig, Trainer  # noqa: E402
from flodl_hf.elche.partition import epoch_permutation  # noqa: E402
from heads import BertForSequenceClassification  # noqa: E402


def make_config() -> BertConfig:
    vocab = tiny_models.tiny_tokenizer("bert")
    return BertConfig(vocab_size=len(vocab), hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=256, max_position_embeddings=64, num_labels=2)


def _sync(device: str) -> None:
    """On CUDA a step's wall time means something only once its kernels finished (both loops pay this)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def setup_mode_round(data, steps: int, batch: int, device: str) -> list[float]:
    torch.manual_seed(0)
    config = make_config()
    head = BertForSequenceClassification.from_config(config, tokenizer=tiny_models.tiny_tokenizer("bert"))
    Trainer.setup_head_with(head, lambda dev: BertForSequenceClassification.on_device(config, 2, dev),
                            lambda p: torch.optim.AdamW(p, lr=1e-4), DdpConfig(devices=[device], verbose=False))
    graph = head.graph()
    graph.set_data_loader(data, batch_size=batch, collate_fn=head.collate)
    times, last = [], time.perf_counter()
    for enc, labels in graph.epoch(0):
        loss = head.compute_loss(enc, labels)
        loss.backward()
        graph.step()
        _sync(device)
        now = time.perf_counter()
        times.append(now - last)
        last = now
        if len(times) == steps:
            break
    return times[3:]  # warm-up excluded


def plain_round(data, steps: int, batch: int, device: str) -> list[float]:
    torch.manual_seed(0)
    config = make_config()
    head = BertForSequenceClassification.from_config(config, tokenizer=tiny_models.tiny_tokenizer("bert"))
    model = head.graph().module.to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    perm = epoch_permutation(len(data), 0).tolist()
    times, last = [], time.perf_counter()
    for k in range(steps):
        enc, labels = head.collate([data[i] for i in perm[k * batch:(k + 1) * batch]])
        enc, labels = {k2: v.to(device) for k2, v in enc.items()}, labels.to(device)
        loss = torch.nn.functional.cross_entropy(model(**enc).logits, labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(device)
        now = time.perf_counter()
        times.append(now - last)
        last = now
    return times[3:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--device", default="cpu", help="cpu or cuda:N (cpu)")
    args = parser.parse_args()
    data = tiny_models.toy_task(args.steps * args.batch_size + 64, seed=0)
    setup, plain = [], []
    for r in range(args.rounds):  # alternate the order to cancel drift
        first, second = (setup_mode_round, plain_round) if r % 2 == 0 else (plain_round, setup_mode_round)
        for fn in (first, second):
            (setup if fn is setup_mode_round else plain).extend(fn(data, args.steps, args.batch_size, args.device))
    s, p = statistics.median(setup), statistics.median(plain)
    print(f"device: {args.device}")
    print(f"setup-mode loop: median {1000 * s:.2f} ms/step over {len(setup)} steps")
    print(f"plain PyTorch loop: median {1000 * p:.2f} ms/step over {len(plain)} steps")
    print(f"ratio setup/plain: {s / p:.3f} (target <= 1.03)")


if __name__ == "__main__":
    main()
