"""Builder mode on several machines: fine-tune the packaged MiniLM on the packaged sentiment rows with torchrun.

Every process of the job runs this script; the builder sees torchrun's environment and joins as one rank (one
device: ``cuda:LOCAL_RANK``, else the CPU). Rank 0 also runs the coordinator, evaluates the result on held-out rows
and writes ``OUT/result.json``. Each rank logs the rows of every batch it trains on (``OUT/rank<R>.jsonl``), so
coverage can be checked from outside. Dropout is off and the attention key biases and the word embeddings are
frozen (see ``make_head``), so SYNC can be compared with one process exactly.

    bash examples/builder_multinode.sh                       # two "nodes" on this machine, every policy
    torchrun --nnodes 2 --node-rank 0 ... examples/builder_multinode.py OUT --policy cadence   # your own nodes
    python examples/builder_multinode.py OUT --reference     # SYNC's reference: one process, plain PyTorch

Nothing here is pickled: under torchrun each rank builds its own model, optimizer and dataset, so the factories
may be closures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # heads/ when run from a checkout

from flodl_hf import ApplyPolicy, Trainer  # noqa: E402
from flodl_hf.data import load_text_classification  # noqa: E402
from flodl_hf.defaults import default_corpus_path, default_model_path  # noqa: E402
from flodl_hf.distributed.errors import DistributedError  # noqa: E402
from flodl_hf.elche.partition import epoch_permutation  # noqa: E402
from heads import BertForSequenceClassification  # noqa: E402

MAX_LENGTH = 64
# The peak LR is where one epoch reaches its plateau: one process on these 4,000 rows scored 0.689, 0.727, 0.753 and
# 0.753 on the 8,000 held-out rows at 3.5e-5, 5e-5, 1e-4 and 2e-4 (word embeddings trained). Below the plateau,
# comparing policies measures how fast they learn, not what they reach, and CADENCE and ASYNC learn more slowly per
# batch: at 5e-5 they scored 0.695 and 0.697 against SYNC's 0.727, as one process would at an LR between 3.5e-5 and
# 5e-5 (a likely reason: each rank's AdamW steps on its own 16 rows, whose noisier gradients give larger second
# moments, hence smaller steps, than SYNC's on 32). Pass --lr 5e-5 to see it.
LR, WEIGHT_DECAY, WARMUP = 1e-4, 0.01, 0.1
# Held-out rows. The check compares accuracies to 0.02, so the comparison needs rows enough to see 0.02: on 1,000
# rows one accuracy's binomial standard error is 0.014, and one run's CADENCE gap to SYNC measured 0.021 there
# against 0.012 on 8,000 other rows. On 8,000 the paired standard error of a gap measured 0.003.
EVAL_ROWS = 8000


def load(rows: int, eval_rows: int):
    data = load_text_classification(default_corpus_path(), label_column="sentiment")
    train, held_out = data.split(eval_rows, seed=0)
    return train.subset(rows, seed=0), held_out


def make_head(labels, device):
    head = BertForSequenceClassification.from_pretrained(str(default_model_path()), labels=labels,
                                                         max_length=MAX_LENGTH)
    model = head.graph().module
    model.config.hidden_dropout_prob = model.config.attention_probs_dropout_prob = 0.0
    for m in model.modules():  # dropout off: SYNC must equal one process exactly
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    # The attention key biases are frozen. They cannot change the model's outputs (softmax ignores a shift shared
    # by every key), so their gradient is zero in exact arithmetic and only rounding noise reaches them, and AdamW
    # turns that noise into full-size steps that differ between any two implementations. Measured on 4,000 rows
    # without this: SYNC's key biases were up to 4.6e-05 from one process's, while every other parameter was within
    # 3.8e-06.
    # The word embeddings are frozen too: a token seen once in the training rows gets one gradient, after which AdamW
    # keeps moving its row by its moments alone for the rest of the run, and at lr 1e-4 those rows carried rounding
    # differences past 1e-5 (1.95e-05 from one process, all 12 such elements in rows of tokens seen one to three
    # times; every other tensor within 3.3e-07). Frozen: 3.6e-07, and one process's held-out accuracy 0.751 (0.753).
    for name, param in model.named_parameters():
        if name.endswith("attention.self.key.bias") or name.endswith("word_embeddings.weight"):
            param.requires_grad_(False)
    return head


def encode(head, texts, label_ids):
    enc = head.tokenizer(list(texts), padding="max_length", truncation=True, max_length=MAX_LENGTH,
                         return_tensors="pt")
    return [{"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i],
             "labels": torch.tensor(label_ids[i]), "row": torch.tensor(i)} for i in range(len(label_ids))]


def loss_of(head, batch):
    enc = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    return head.compute_loss(enc, batch["labels"])


def optimizer(params, lr: float):
    return torch.optim.AdamW(params, lr=lr, weight_decay=WEIGHT_DECAY)


def schedule(total: int):
    from transformers import get_linear_schedule_with_warmup

    return lambda opt: get_linear_schedule_with_warmup(opt, int(WARMUP * total), total)


def correct(head, held_out) -> list[int]:
    """1 where the model's prediction of a held-out row is right, else 0 (row by row, so that the check can pair
    two models' answers on the same rows)."""
    head.graph().module.eval()
    right: list[int] = []
    with torch.no_grad():
        for start in range(0, len(held_out), 64):
            texts = held_out.texts[start:start + 64]
            enc = head.tokenizer(list(texts), padding=True, truncation=True, max_length=MAX_LENGTH,
                                 return_tensors="pt")
            logits = head.graph().module(**enc).logits
            right += (logits.argmax(-1) == torch.tensor(held_out.label_ids[start:start + 64])).int().tolist()
    return right


def scored(head, held_out) -> dict:
    """result.json's accuracy fields: the accuracy and every row's 0/1, as a string."""
    right = correct(head, held_out)
    return {"accuracy": sum(right) / len(right), "eval_rows": len(right), "correct": "".join(map(str, right))}


def reference(a, train, held_out) -> dict:
    """SYNC's definition in one process: round j trains on every rank's j-th batch together (each epoch dealt
    round robin, as SYNC deals it), and the LR schedule counts every rank's batches."""
    torch.manual_seed(0)
    head = make_head(train.labels, "cpu")
    data = encode(head, train.texts, train.label_ids)
    n, per_epoch = len(data), len(data) // a.batch
    own = [[] for _ in range(a.world)]
    for e in range(a.epochs):
        perm = epoch_permutation(n, e).tolist()
        for i in range(per_epoch):
            own[i % a.world].append(perm[i * a.batch:(i + 1) * a.batch])
    model = head.graph().module
    model.train()
    opt = optimizer(model.parameters(), a.lr)
    sched = schedule(per_epoch * a.epochs)(opt)
    for j in range(max(len(o) for o in own)):
        idx = [i for r in range(a.world) if j < len(own[r]) for i in own[r][j]]
        batch = {k: torch.stack([data[i][k] for i in idx]) for k in ("input_ids", "attention_mask", "labels")}
        loss_of(head, batch).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        for _ in range(sum(1 for r in range(a.world) if j < len(own[r]))):
            sched.step()
    return {"state": model.state_dict(), "head": head}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--policy", default="sync", choices=["sync", "cadence", "async"])
    p.add_argument("--rows", type=int, default=4000, help="training rows, drawn from the corpus's rows left after "
                   "the held-out split (4000: the main job's)")
    p.add_argument("--eval-rows", type=int, default=EVAL_ROWS, help="held-out rows (8000: see EVAL_ROWS)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=LR, help=f"AdamW's peak learning rate ({LR:g}: see LR)")
    p.add_argument("--reference", action="store_true", help="train SYNC's one-process reference instead")
    p.add_argument("--world", type=int, default=2, help="--reference: the ranks it stands for")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    train, held_out = load(a.rows, a.eval_rows)
    t0 = time.time()
    if a.reference:
        ref = reference(a, train, held_out)
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in ref["state"].items()}, str(out / "state.safetensors"))
        train_s = round(time.time() - t0, 1)
        (out / "result.json").write_text(json.dumps({"policy": "reference", **scored(ref["head"], held_out),
                                                     "train_s": train_s}))
        return 0

    rank = int(os.environ.get("RANK", "0"))
    log = open(out / f"rank{rank}.jsonl", "w")
    probe = make_head(train.labels, "cpu")
    data = encode(probe, train.texts, train.label_ids)
    tokenizer = probe.tokenizer
    del probe

    def train_fn(head, batch):  # a closure: under torchrun nothing is pickled
        log.write(json.dumps(batch["row"].tolist()) + "\n")
        log.flush()
        return loss_of(head, batch)

    total = len(data) // a.batch * a.epochs
    try:
        state = (Trainer.builder(lambda device: make_head(train.labels, device),
                                 lambda params: optimizer(params, a.lr), train_fn)
                 .dataset(data).batch_size(a.batch).num_epochs(a.epochs).scheduler(schedule(total))
                 .policy(ApplyPolicy[a.policy.upper()]).timeout(120).run().join())
    except DistributedError as exc:
        print(f"flodl-hf builder: {exc}", file=sys.stderr, flush=True)
        return 1
    train_s = round(time.time() - t0, 1)
    if rank == 0:
        from safetensors.torch import save_file

        head = make_head(train.labels, "cpu")
        state.load_into(head)
        head.tokenizer = tokenizer
        save_file({k: v.contiguous() for k, v in state.state_dict().items()}, str(out / "state.safetensors"))
        result = {"policy": a.policy, "world": state.world_size, "devices": state.devices, "rounds": state.rounds,
                  **scored(head, held_out), "train_s": train_s}
        (out / "result.json").write_text(json.dumps(result))
        print(json.dumps({k: v for k, v in result.items() if k != "correct"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
