"""The README quickstart as a script: the same setup-mode loop on 1 CPU, 1 GPU, N GPUs or N machines.

    python examples/quickstart.py                                  # one device (or every local GPU)
    python examples/quickstart.py --devices cpu,cpu                # two gloo ranks started by flodl-hf
    torchrun --nproc-per-node 2 examples/quickstart.py             # two ranks started by torchrun
    accelerate launch --multi_gpu --num_processes 2 examples/quickstart.py   # CPU ranks where no GPU

Defaults: the packaged MiniLM on 2,000 rows of the packaged sentiment corpus. Every rank prints a fingerprint
of its final parameters, so you can see that the replicas agree bit for bit.
"""

from __future__ import annotations

import argparse
import hashlib

import torch

from flodl_hf import DdpConfig, Trainer
from flodl_hf.data import load_text_classification
from flodl_hf.defaults import default_corpus_path, default_model_path
from heads import AutoHeadForSequenceClassification


def fingerprint(module: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for p in module.parameters():
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model directory (default: the packaged MiniLM)")
    parser.add_argument("--data", default=None, help="CSV/JSON file (default: the packaged sentiment corpus)")
    parser.add_argument("--text-column", default="text")
    parser.add_argument("--label-column", default=None, help="default: 'sentiment' for the packaged corpus")
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--devices", default=None, help="e.g. cpu,cpu (default: the launcher's, else auto)")
    args = parser.parse_args()

    data_path = args.data or default_corpus_path()
    label_column = args.label_column or ("sentiment" if args.data is None else "label")
    data = load_text_classification(data_path, text_column=args.text_column, label_column=label_column)
    data = data.subset(min(args.rows, len(data)), seed=0)

    head = AutoHeadForSequenceClassification.from_pretrained(args.model or default_model_path(),
                                                            labels=data.labels, max_length=64)
    config, num_labels = head.config(), len(head.labels())
    Trainer.setup_head_with(head,
                            lambda dev: AutoHeadForSequenceClassification.on_device(config, num_labels, dev),
                            lambda params: torch.optim.AdamW(params, lr=5e-5),
                            DdpConfig(devices=args.devices.split(",") if args.devices else None))
    graph = head.graph()
    graph.set_data_loader(data, batch_size=args.batch_size, collate_fn=head.collate)
    for epoch in range(args.epochs):
        for enc, labels in graph.epoch(epoch):
            loss = head.compute_loss(enc, labels)
            loss.backward()
            graph.step()
    print(f"rank {graph.rank}/{graph.world_size} steps {graph.training_step} loss {loss.item():.4f} "
          f"fingerprint {fingerprint(graph.module)}", flush=True)
    if graph.is_main:
        print(head.predict(["I love this car", "this is a terrible idea"], top_k=1))


if __name__ == "__main__":
    main()
