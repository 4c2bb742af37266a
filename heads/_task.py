"""TaskHead: what every task head does whatever its task (classification, tagging, QA, masked LM).

It exists so that the four task types share one implementation of the parts that do not depend on the task: the
``Graph`` that owns the live model (``Trainer.setup_head`` swaps its module for a replica), the tokenizer and the
training ``max_length``, strict ``from_pretrained`` / ``from_config`` / ``on_device`` construction, train/eval
modes, moving inputs to the device, atomic ``save_pretrained`` and ``push_to_hub``. A task base class
(``SequenceClassificationHead``, ``TokenClassificationHead``, ...) adds its encoding, loss and prediction; a family
class then only declares its transformers class, inputs and key layout (``heads.families``). Head code never
imports the distributed package.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Optional, Sequence, Union

import torch

from flodl_hf.graph import Graph

from . import _hub, _inputs, _io, _load, _save
from ._io import CheckpointError, HeadKeys, PathLike

__all__ = ["TaskHead", "TransformersClass", "DEFAULT_MAX_LENGTH", "Encoding", "TASK_SUFFIXES"]
DEFAULT_MAX_LENGTH = _load.DEFAULT_MAX_LENGTH

Encoding = dict[str, torch.Tensor]

TASK_SUFFIXES = ("ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering", "ForMultipleChoice",
                 "ForNextSentencePrediction")
"""``config.architectures`` suffixes of checkpoints fine-tuned for a task (a head refuses the others')."""
_TASK_BY_NAME = {"text-classification": "ForSequenceClassification"}
"""Pipeline task -> its suffix, for heads that use :meth:`TaskHead._check_task` (the newer heads check their own)."""


class TransformersClass:
    """A class attribute naming a transformers class, imported on first access.

    Family classes use it so that ``import heads`` does not import transformers' model code (seconds of start-up
    for the CLI and every process that only needs one family).
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        import transformers

        return getattr(transformers, self.name)


class TaskHead:
    """A transformers model for one task inside a ``Graph``, with its tokenizer and training ``max_length``.

    Not used directly: task bases subclass it and family classes set the class attributes below.
    """

    model_type: ClassVar[str] = ""
    """``config.model_type`` this family handles, e.g. ``"bert"``."""
    config_class: ClassVar[Any] = None
    """The transformers config class, e.g. ``BertConfig``."""
    model_class: ClassVar[Any] = None
    """The transformers model class, e.g. ``transformers.BertForTokenClassification``."""
    input_names: ClassVar[tuple[str, ...]] = ("input_ids", "attention_mask")
    """The tokenizer outputs the model takes (``encode`` returns exactly these)."""
    head_keys: ClassVar[HeadKeys] = HeadKeys(head=(), optional=(), classifier="")
    """Where the task head lives in the state dict (see :class:`heads._io.HeadKeys`)."""
    task: ClassVar[str] = ""
    """The pipeline task name, e.g. ``"text-classification"``."""
    auto_name: ClassVar[str] = "an Auto head"
    """The auto class that dispatches this task (named in errors)."""
    family_record: ClassVar[Any] = None
    """The family's :class:`heads.families.Family`, for heads declared from it (its ``max_positions`` is used)."""
    family: ClassVar[Any] = None
    """A family class's declaration: ``family = FAMILIES["bert"]`` in a task base with a :attr:`task_suffix` fills
    ``model_type``, ``config_class``, ``model_class``, ``input_names`` and ``family_record`` from the record."""
    task_suffix: ClassVar[str] = ""
    """The transformers class suffix of the task, e.g. ``"ForTokenClassification"``."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        family = cls.__dict__.get("family")
        if family is not None and cls.task_suffix:
            cls.model_type, cls.input_names, cls.family_record = family.model_type, family.input_names, family
            cls.config_class = TransformersClass(family.transformers_name("Config"))
            cls.model_class = TransformersClass(family.transformers_name(cls.task_suffix))

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
                f"{type(self).__name__} is the shared base: use a family class such as "
                f"BertFor{type(self).__name__.removesuffix('Head')}, or {self.auto_name}"
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
                f"{model_type!r}: use {cls.auto_name}, which picks the family from config.model_type"
            )

    @classmethod
    def _apply_labels(cls, config: Any, num_labels: Optional[int], labels: Optional[Sequence[str]]) -> None:
        """Set the label count and names on ``config`` (tasks without labels override to refuse them)."""
        _inputs.apply_labels(config, num_labels, labels)

    @classmethod
    def _check_task(cls, path_or_id: PathLike, options: Any) -> None:
        """Refuse a checkpoint whose ``config.architectures`` names another task's head (``TASK_SUFFIXES``): its
        task weights could otherwise load as this head's (a tagger's ``classifier.*`` as a sentence classifier's)
        or be dropped without a word. Base, masked-LM and pre-training checkpoints pass."""
        own = _TASK_BY_NAME.get(cls.task)
        if own is None:
            return
        config = _io.load_config(path_or_id, cls._check_model_type, options.hub_kwargs())
        names = [str(name) for name in (getattr(config, "architectures", None) or ())]
        other = [n for n in names if any(n.endswith(s) for s in TASK_SUFFIXES if s != own)]
        if other:
            raise CheckpointError(
                f"{str(path_or_id)!r} is a {other[0]} checkpoint (config.json architectures), not a "
                f"{cls.task} model: load it with the head of its task, or save its encoder alone "
                "(model.base_model.save_pretrained(dir)) and load that for a fresh head"
            )

    @classmethod
    def _load(cls, path_or_id: PathLike, *, num_labels: Optional[int], labels: Optional[Sequence[str]],
              max_length: Optional[int], problem_type: Optional[str], tokenizer: Any,
              options: Any) -> tuple[Any, Any, int]:
        """``(model, tokenizer, max_length)`` of a checkpoint, loaded strictly (``heads._load``), after
        :meth:`_check_task`."""
        cls._check_task(path_or_id, options)
        return _load.load_parts(
            cls.model_class, cls.head_keys, cls._check_model_type, path_or_id, num_labels=num_labels,
            labels=labels, max_length=max_length, problem_type=problem_type, tokenizer=tokenizer, options=options,
            apply_labels=cls._apply_labels,
        )

    @classmethod
    def _from_pretrained(cls, path_or_id: PathLike, *, num_labels: Optional[int] = None,
                         labels: Optional[Sequence[str]] = None, max_length: Optional[int] = None,
                         problem_type: Optional[str] = None, tokenizer: Any = None, **hub: Any) -> Any:
        """The shared body of every task's ``from_pretrained`` (``hub``: transformers' loading keywords)."""
        options = _hub.load_options(**hub)
        model, tokenizer, max_length = cls._load(
            path_or_id, num_labels=num_labels, labels=labels, max_length=max_length, problem_type=problem_type,
            tokenizer=tokenizer, options=options,
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
    ) -> Any:
        """A head with freshly initialised weights (seed torch first for reproducibility). ``config`` is copied."""
        cls._check_model_type(getattr(config, "model_type", None))
        config = copy.deepcopy(config)
        cls._apply_labels(config, num_labels, labels)
        max_length = _inputs.check_max_length(max_length)
        with torch.device(device if device is not None else "cpu"):
            model = cls.model_class(config)
        return cls(model, tokenizer, max_length=max_length, device=device)

    @classmethod
    def on_device(cls, config: Any, num_labels: Optional[int], device: Union[torch.device, str]) -> Any:
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
    def max_length(self) -> int:
        """Tokens per text after truncation: the requested value, capped at what the model's positions allow."""
        limit = self.max_positions(self.config())
        return self._max_length if limit is None else min(self._max_length, limit)

    @max_length.setter
    def max_length(self, value: int) -> None:
        self._max_length = _inputs.check_max_length(value)

    @classmethod
    def max_positions(cls, config: Any) -> Optional[int]:
        """The longest input the model can embed (None: unbounded). Families with offset positions override, or
        state it in their :attr:`family_record`."""
        if cls.family_record is not None:
            return cls.family_record.max_positions(config)
        return getattr(config, "max_position_embeddings", None)

    def train(self, mode: bool = True) -> Any:
        """Put the live model in train mode (``mode=False``: eval mode), like ``nn.Module.train``."""
        self._graph.module.train(mode)
        return self

    def eval(self) -> Any:
        """Put the live model in eval mode (no dropout)."""
        return self.train(False)

    def to(self, device: Union[torch.device, str]) -> Any:
        """Move the model to ``device`` (single-device use; ``Trainer.setup_head`` does this on N ranks)."""
        self._graph.module = self._graph.module.to(device)
        self._graph.device = torch.device(device)
        return self

    # --- inputs and compute -------------------------------------------------------------------------------
    def _require_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise RuntimeError(
                f"this {type(self).__name__} has no tokenizer (heads built by on_device/from_config "
                "have none): set head.tokenizer = AutoTokenizer.from_pretrained(...)"
            )
        return self.tokenizer

    def _pad_multiple(self, limit: int) -> Optional[int]:
        """``pad_to_multiple_of`` for an encoding of at most ``limit`` tokens on the graph's device."""
        return _inputs.pad_multiple(self._graph.device, limit, self.max_positions(self.config()))

    def _to_device(self, enc: Mapping[str, Any]) -> Encoding:
        if not isinstance(enc, Mapping) or "input_ids" not in enc:
            raise ValueError("enc must be the dict that encode()/collate() returns (with 'input_ids')")
        device = self._graph.device
        return {name: torch.as_tensor(enc[name]).to(device) for name in self.input_names if name in enc}

    def _run_model(self, enc: Mapping[str, Any]) -> Any:
        """The model's output object for an encoded batch, under the graph's autocast."""
        enc = self._to_device(enc)
        with self._graph.autocast():
            return self._graph.module(**enc)

    # --- output -------------------------------------------------------------------------------------------
    def _save_extras(self, directory: Path) -> None:
        """Task-specific files or fields written after the model and tokenizer (default: the label maps)."""
        _save.write_label_maps(directory / "config.json", self.labels())

    def save_pretrained(self, directory: PathLike) -> Path:
        """Write a standard transformers directory: config.json, model.safetensors and the tokenizer files, loadable
        with the matching ``AutoModelFor...`` / ``AutoTokenizer`` and ``pipeline``. The tokenizer's
        ``model_max_length`` is saved as this head's ``max_length`` (this head's tokenizer object is unchanged).

        Written to a temporary directory beside ``directory`` first, then moved into place file by file. In an
        existing model directory (a config.json naming a model_type, e.g. a Hub clone) the files it writes replace
        theirs and everything else (``.git/``, notes) stays; any other non-empty directory is refused
        (FileExistsError).
        Same weights give byte-identical safetensors files. On N ranks every rank may call it, as an unchanged
        loop does: rank 0 writes and the others wait until the directory is complete, then return the same path.
        """
        model, tokenizer, max_length = self.model, self.tokenizer, self.max_length

        def write(tmp: Path) -> None:
            with _io.quiet_transformers():
                model.save_pretrained(tmp)
                if tokenizer is not None:
                    _save.save_tokenizer(tokenizer, tmp, max_length, self.input_names)
            self._save_extras(tmp)

        return self._graph.write_once(directory, lambda: _save.atomic_save(directory, write))

    def push_to_hub(self, repo_id: str, **kwargs: Any) -> Any:
        """Upload the model, tokenizer and a model card to the Hub repository ``repo_id`` (created if needed).

        Keywords: ``card`` (a :class:`flodl_hf.export.cards.CardInfo` for the full card; None: a short card without
        scores), ``token``, ``private``, ``revision``, ``commit_message``, ``create_pr``. Refuses (ValueError)
        before writing anything when ``HF_HUB_OFFLINE`` is set or no token is available. Returns huggingface_hub's
        ``CommitInfo``; :func:`flodl_hf.export.hub.plan_push` shows what is sent.
        """
        return _hub.push_head(self, repo_id, **kwargs)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_labels={self.num_labels}, labels={self.labels()!r}, "
            f"device={self._graph.device}, tokenizer={'yes' if self.tokenizer is not None else 'none'})"
        )
