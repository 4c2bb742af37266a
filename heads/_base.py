"""SequenceClassificationHead: everything a text-classification task head does, for every model family.

It exists so that each family module only declares what differs (its transformers classes, its ``model_type``,
the inputs its model takes and where its classifier weights live) while loading, encoding, batching, losses,
prediction and saving are written and tested once. A head is a plain object, not an ``nn.Module``: it holds a
:class:`flodl_hf.graph.Graph` around a transformers ``*ForSequenceClassification`` model and an optional tokenizer,
and always reaches the model through the graph, because ``Trainer.setup_head`` swaps the graph's module for a
replica on the target device. Head code never imports the distributed package: distribution is applied from
outside, by ``Trainer``.

For transformers users a head behaves like the model it wraps: ``from_pretrained`` takes the usual keywords
(``_hub``), ``head(**enc)`` returns a ``SequenceClassifierOutput``, sentence pairs are encoded as transformers
does (``_encode``), ``save_pretrained`` stores the training ``max_length`` as the tokenizer's ``model_max_length``
so that ``pipeline("text-classification", truncation=True)`` agrees with :meth:`predict`, and ``push_to_hub``
uploads it with a card.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Optional, Sequence, Union

import torch

from flodl_hf.graph import Graph

from . import _encode, _hub, _inputs, _io, _load, _losses, _run, _save
from ._io import CheckpointError, HeadKeys, PathLike

__all__ = ["SequenceClassificationHead", "TransformersClass", "DEFAULT_MAX_LENGTH"]
DEFAULT_MAX_LENGTH = _load.DEFAULT_MAX_LENGTH

Encoding = dict[str, torch.Tensor]
Prediction = list[tuple[str, float]]


class TransformersClass:
    """A class attribute naming a transformers class, imported on first access.

    Family modules use it so that ``import heads`` does not import transformers' model code (seconds of start-up
    for the CLI and every process that only needs one family).
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        import transformers

        return getattr(transformers, self.name)


class SequenceClassificationHead:
    """A text classifier to fine-tune: a transformers ``*ForSequenceClassification`` model inside a ``Graph``.

    Build one with :meth:`from_pretrained` (a checkpoint directory), :meth:`from_config` (fresh weights) or
    :meth:`on_device` (the replica factory for ``Trainer.setup_head``). A new head's model is in train mode;
    :meth:`predict` switches to eval mode and back. Subclasses set the class attributes below.
    """

    model_type: ClassVar[str] = ""
    """``config.model_type`` this family handles, e.g. ``"bert"``."""
    config_class: ClassVar[Any] = None
    """The transformers config class, e.g. ``BertConfig``."""
    model_class: ClassVar[Any] = None
    """The transformers model class, e.g. ``transformers.BertForSequenceClassification``."""
    input_names: ClassVar[tuple[str, ...]] = ("input_ids", "attention_mask")
    """The tokenizer outputs the model takes (``encode`` returns exactly these)."""
    head_keys: ClassVar[HeadKeys] = HeadKeys(head=(), optional=(), classifier="")
    """Where the task head lives in the state dict (see :class:`heads._io.HeadKeys`)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        max_length: int = DEFAULT_MAX_LENGTH,
        device: Optional[Union[torch.device, str]] = None,
    ) -> None:
        if self.model_class is None:
            raise TypeError(
                "SequenceClassificationHead is the shared base: use a family class such as "
                "BertForSequenceClassification, or AutoHeadForSequenceClassification"
            )
        if not isinstance(model, self.model_class):
            raise TypeError(
                f"{type(self).__name__} wraps a {self.model_class.__name__}, got {type(model).__name__}"
            )
        if device is not None:
            model = model.to(device)
        model.train()
        self._graph = Graph(model, device)
        self.tokenizer = tokenizer
        self.max_length = max_length

    # --- construction -------------------------------------------------------------------------------------
    @classmethod
    def _check_model_type(cls, model_type: str) -> None:
        if model_type != cls.model_type:
            raise CheckpointError(
                f"{cls.__name__} handles model_type {cls.model_type!r} but the config says "
                f"{model_type!r}: use AutoHeadForSequenceClassification, which picks the family "
                "from config.model_type"
            )

    @classmethod
    def from_pretrained(
        cls,
        path_or_id: PathLike,
        *,
        num_labels: Optional[int] = None,
        labels: Optional[Sequence[str]] = None,
        max_length: Optional[int] = None,
        problem_type: Optional[str] = None,
        tokenizer: Any = None,
        revision: Optional[str] = None,
        dtype: Any = None,
        torch_dtype: Any = None,
        local_files_only: bool = False,
        cache_dir: Optional[PathLike] = None,
        token: Optional[Union[str, bool]] = None,
        trust_remote_code: Optional[bool] = None,
    ) -> "SequenceClassificationHead":
        """Load a head from a checkpoint directory (or, with a network, a Hub id / the HF cache).

        A base checkpoint without classifier weights gets a freshly initialised head (logged once at WARNING on
        logger ``flodl_hf.heads``). ``labels`` names the classes (and sets ``num_labels``); a label count that
        disagrees with existing classifier weights raises. ``problem_type`` sets ``config.problem_type`` (e.g.
        ``"multi_label_classification"``). ``tokenizer`` overrides the checkpoint's tokenizer. ``max_length``
        None: for a checkpoint with classifier weights, the tokenizer's ``model_max_length`` (a saved head's
        training length); for a base checkpoint, or a tokenizer that states none, 128.

        transformers' keywords: ``revision``, ``cache_dir``, ``local_files_only`` and ``token`` reach the config,
        weights and tokenizer loading; ``dtype`` (or its old name ``torch_dtype``: a torch dtype, ``"float16"``...
        or ``"auto"``) the weights, float32 when None. ``trust_remote_code=True`` is refused (ValueError: heads
        wrap known families). Every loading failure raises ``CheckpointNotFoundError`` or ``CheckpointError``
        naming the file or key; nothing half-loaded is returned.
        """
        options = _hub.load_options(
            revision=revision, dtype=dtype, torch_dtype=torch_dtype, local_files_only=local_files_only,
            cache_dir=cache_dir, token=token, trust_remote_code=trust_remote_code,
        )
        model, tokenizer, max_length = _load.load_parts(
            cls.model_class, cls.head_keys, cls._check_model_type, path_or_id, num_labels=num_labels,
            labels=labels, max_length=max_length, problem_type=problem_type, tokenizer=tokenizer, options=options,
        )
        return cls(model, tokenizer, max_length=max_length)

    @classmethod
    def from_config(
        cls,
        config: Any,
        num_labels: Optional[int] = None,
        tokenizer: Any = None,
        *,
        labels: Optional[Sequence[str]] = None,
        max_length: int = DEFAULT_MAX_LENGTH,
        device: Optional[Union[torch.device, str]] = None,
    ) -> "SequenceClassificationHead":
        """A head with freshly initialised weights (seed torch first for reproducibility). ``config`` is copied."""
        cls._check_model_type(getattr(config, "model_type", None))
        config = copy.deepcopy(config)
        _inputs.apply_labels(config, num_labels, labels)
        max_length = _inputs.check_max_length(max_length)
        with torch.device(device if device is not None else "cpu"):
            model = cls.model_class(config)
        return cls(model, tokenizer, max_length=max_length, device=device)

    @classmethod
    def on_device(
        cls, config: Any, num_labels: int, device: Union[torch.device, str]
    ) -> "SequenceClassificationHead":
        """A fresh head built directly on ``device``, without tokenizer: the replica factory of
        ``Trainer.setup_head`` (which then copies rank 0's weights into every replica)."""
        return cls.from_config(config, num_labels, device=device)

    # --- the live model and its description ---------------------------------------------------------------
    def graph(self) -> Graph:
        """The Graph that owns this head's model (the ``HasGraph`` protocol)."""
        return self._graph

    @property
    def model(self) -> Any:
        """The live transformers model (``graph().module``, unwrapped from any wrapper such as DDP/compile)."""
        module = self._graph.module
        model_class = self.model_class
        while not isinstance(module, model_class):
            inner = getattr(module, "module", None)
            if not isinstance(inner, torch.nn.Module):
                inner = getattr(module, "_orig_mod", None)  # torch.compile's wrapper
            if not isinstance(inner, torch.nn.Module):
                break
            module = inner
        return module

    def config(self) -> Any:
        """The transformers config of the live model."""
        return self.model.config

    @property
    def num_labels(self) -> int:
        return int(self.config().num_labels)

    def labels(self) -> list[str]:
        """Label names in id order (``LABEL_k`` where the config names none)."""
        id2label = self.config().id2label or {}
        return [str(id2label.get(i, id2label.get(str(i), f"LABEL_{i}"))) for i in range(self.num_labels)]

    @property
    def problem_type(self) -> str:
        """The effective problem type (see ``heads._losses``)."""
        return _losses.problem_type_of(self.config())

    @property
    def max_length(self) -> int:
        """Tokens per text after truncation: the requested value, capped at what the model's positions allow."""
        limit = self.max_positions(self.config())
        return self._max_length if limit is None else min(self._max_length, limit)

    @max_length.setter
    def max_length(self, value: int) -> None:
        self._max_length = _inputs.check_max_length(value)

    @classmethod
    def max_positions(cls, config: Any) -> Optional[int]:
        """The longest input the model can embed (None: unbounded). Families with offset positions override."""
        return getattr(config, "max_position_embeddings", None)

    def train(self, mode: bool = True) -> "SequenceClassificationHead":
        """Put the live model in train mode (``mode=False``: eval mode), like ``nn.Module.train``."""
        self._graph.module.train(mode)
        return self

    def eval(self) -> "SequenceClassificationHead":
        """Put the live model in eval mode (no dropout)."""
        return self.train(False)

    def to(self, device: Union[torch.device, str]) -> "SequenceClassificationHead":
        """Move the model to ``device`` (single-device use; ``Trainer.setup_head`` does this on N ranks)."""
        self._graph.module = self._graph.module.to(device)
        self._graph.device = torch.device(device)
        return self

    # --- inputs -------------------------------------------------------------------------------------------
    def encode(
        self, texts: Sequence[str], text_pairs: Optional[Sequence[str]] = None, max_length: Optional[int] = None
    ) -> Encoding:
        """Tokenise ``texts`` (and, for sentence-pair tasks, ``text_pairs``: one second text per text) into the
        model's inputs on the graph's device: padded to the longest, truncated to ``max_length`` (at most the
        head's), pairs ``longest_first``; ``token_type_ids`` mark the second text where the family takes them."""
        texts = _inputs.check_texts(texts, "encode")
        pairs = _inputs.check_pairs(texts, text_pairs, "encode")
        if not texts:
            raise ValueError("encode got no texts: give at least one")
        if self.tokenizer is None:
            raise RuntimeError(
                f"this {type(self).__name__} has no tokenizer (heads built by on_device/from_config "
                "have none): set head.tokenizer = AutoTokenizer.from_pretrained(...)"
            )
        limit = self.max_length if max_length is None else min(_inputs.check_max_length(max_length), self.max_length)
        return _encode.tokenize(
            self.tokenizer,
            texts,
            pairs,
            limit=limit,
            pad_to_multiple_of=_inputs.pad_multiple(self._graph.device, limit, self.max_positions(self.config())),
            input_names=self.input_names,
            device=self._graph.device,
        )

    def _label_value(self, label: Any, index: int) -> Any:
        if isinstance(label, str):
            label2id = self.config().label2id or {}
            if label not in label2id:
                raise ValueError(
                    f"label {label!r} at index {index} is not one of this head's labels "
                    f"{self.labels()}: use a class id or one of those names"
                )
            return int(label2id[label])
        return label

    def collate(self, items: Sequence[Any]) -> tuple[Encoding, Optional[torch.Tensor]]:
        """Batch ``items`` for ``graph.set_data_loader(..., collate_fn=head.collate)``.

        Items are ``(text, label)`` pairs, ``(text, text_pair, label)`` triples, dicts with ``text`` (+
        ``text_pair``) and ``label`` (or ``labels``), or bare strings; a batch is all single texts or all pairs.
        Labels: ints or label names -> LongTensor; floats -> FloatTensor; lists of floats -> FloatTensor
        ``[B, C]``; all None (or bare strings) -> ``None``, for prediction. Both tensors are on the graph's device.
        """
        texts, pairs, raw = _inputs.split_items(items)
        labels = [self._label_value(label, i) for i, label in enumerate(raw)]
        enc = self.encode(texts, pairs)
        tensor = _losses.labels_to_tensor(labels)
        return enc, None if tensor is None else tensor.to(self._graph.device)

    # --- compute ------------------------------------------------------------------------------------------
    def _to_device(self, enc: Mapping[str, Any]) -> Encoding:
        if not isinstance(enc, Mapping) or "input_ids" not in enc:
            raise ValueError("enc must be the dict that encode()/collate() returns (with 'input_ids')")
        device = self._graph.device
        return {name: torch.as_tensor(enc[name]).to(device) for name in self.input_names if name in enc}

    def forward(self, enc: Mapping[str, Any]) -> torch.Tensor:
        """Logits ``[B, num_labels]`` for an encoded batch, under the graph's autocast."""
        enc = self._to_device(enc)
        with self._graph.autocast():
            output = self._graph.module(**enc)
        return output.logits if hasattr(output, "logits") else output[0]

    def __call__(self, enc: Optional[Mapping[str, Any]] = None, /, labels: Any = None, **inputs: Any) -> Any:
        """Run the model like a transformers model: ``head(**enc)`` or ``head(enc)``, optionally with ``labels``.

        Returns ``transformers.modeling_outputs.SequenceClassifierOutput`` with ``logits`` ``[B, num_labels]`` and,
        with labels, ``loss`` (:meth:`compute_loss`'s). ``forward(enc)`` still returns the bare logits.
        """
        return _run.call_output(self, enc, labels, inputs)

    def compute_loss(self, enc: Mapping[str, Any], labels: Any) -> torch.Tensor:
        """The mean loss over the batch's samples (``heads._losses``); tells the graph what it averaged over.

        Labels are checked (range, shape, dtype) before the forward pass; a bad label raises ValueError.
        """
        return self._loss_and_logits(enc, labels)[0]

    def _loss_and_logits(self, enc: Mapping[str, Any], labels: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if labels is None:
            raise ValueError(
                "compute_loss needs labels: collate returned None because the items had no label"
            )
        enc = self._to_device(enc)
        # Labels are checked and counted where the collate left them (the CPU): on a GPU each check or count of
        # a device tensor would wait for the GPU, once per micro-batch.
        labels = torch.as_tensor(labels)
        batch = int(enc["input_ids"].shape[0])
        kind = _losses.check_labels(labels, batch, self.num_labels, self.problem_type)
        items = _losses.loss_items(kind, labels, (batch, self.num_labels))
        labels = labels.to(self._graph.device, non_blocking=True)
        logits = self.forward(enc)
        loss = _losses.loss_from_logits(kind, logits, labels, labelled=items > 0 if kind == "ce" else None)
        if torch.is_grad_enabled():  # so N ranks weight it exactly (Graph.loss_items)
            self._graph.loss_items(items)
        return loss, logits

    def predict(
        self,
        texts: Sequence[str],
        text_pairs: Optional[Sequence[str]] = None,
        top_k: Optional[int] = None,
        batch_size: int = 32,
    ) -> list[Prediction]:
        """Per text (or ``(text, text_pair)``), ``(label, probability)`` pairs sorted by probability, highest first.

        Softmax for single-label heads, sigmoid for multi-label heads (independent probabilities); a regression
        head gives ``[("score", value)]`` (``[(label, value), ...]`` in id order for several outputs). ``top_k``
        keeps the first k pairs. A single string is refused: pass a list. Runs in eval mode without gradients
        and restores each module's train/eval mode afterwards.
        """
        return _run.predict_all(self, texts, text_pairs, top_k, batch_size)

    # --- output -------------------------------------------------------------------------------------------
    def save_pretrained(self, directory: PathLike) -> Path:
        """Write a standard transformers directory: config.json (with id2label/label2id), model.safetensors and
        the tokenizer files. Loads with ``AutoModelForSequenceClassification`` / ``AutoTokenizer``. The tokenizer's
        ``model_max_length`` is saved as this head's ``max_length``, so ``pipeline("text-classification",
        model=directory, truncation=True)`` truncates exactly like :meth:`predict` (this head's tokenizer object
        is left unchanged).

        Atomic: written to a temporary directory beside ``directory`` and renamed into place. An existing model
        directory (with config.json) is replaced; any other non-empty directory is refused (FileExistsError).
        Same weights give byte-identical safetensors files. On N ranks, call it on the main rank only.
        """
        model, tokenizer, max_length = self.model, self.tokenizer, self.max_length

        def write(tmp: Path) -> None:
            with _io.quiet_transformers():
                model.save_pretrained(tmp)
                if tokenizer is not None:
                    _save.save_tokenizer(tokenizer, tmp, max_length, self.input_names)
            _save.write_label_maps(tmp / "config.json", self.labels())

        return _save.atomic_save(directory, write)

    def push_to_hub(self, repo_id: str, **kwargs: Any) -> Any:
        """Upload the model, tokenizer and a model card to the Hub repository ``repo_id`` (created if needed).

        Keywords: ``card`` (a :class:`flodl_hf.cards.CardInfo` for the full card; None: a short card without
        scores), ``token``, ``private``, ``revision``, ``commit_message``, ``create_pr``. Refuses (ValueError)
        before writing anything when ``HF_HUB_OFFLINE`` is set or no token is available. Returns huggingface_hub's
        ``CommitInfo``; :func:`flodl_hf.hub.plan_push` shows what is sent.
        """
        return _hub.push_head(self, repo_id, **kwargs)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_labels={self.num_labels}, labels={self.labels()!r}, "
            f"device={self._graph.device}, tokenizer={'yes' if self.tokenizer is not None else 'none'})"
        )
