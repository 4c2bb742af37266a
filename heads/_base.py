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

from collections.abc import Mapping
from typing import Any, ClassVar, Optional, Sequence, Union

import torch

from . import _encode, _inputs, _losses, _run
from ._io import PathLike
from ._task import DEFAULT_MAX_LENGTH, Encoding, TaskHead, TransformersClass

__all__ = ["SequenceClassificationHead", "TransformersClass", "DEFAULT_MAX_LENGTH"]
Prediction = list[tuple[str, float]]


class SequenceClassificationHead(TaskHead):
    """A text classifier to fine-tune: a transformers ``*ForSequenceClassification`` model inside a ``Graph``.

    Build one with :meth:`from_pretrained` (a checkpoint directory), :meth:`from_config` (fresh weights) or
    :meth:`on_device` (the replica factory for ``Trainer.setup_head``). A new head's model is in train mode;
    :meth:`predict` switches to eval mode and back. Subclasses set the class attributes below.
    """

    task: ClassVar[str] = "text-classification"
    auto_name: ClassVar[str] = "AutoHeadForSequenceClassification"

    # --- construction -------------------------------------------------------------------------------------
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
        return cls._from_pretrained(
            path_or_id, num_labels=num_labels, labels=labels, max_length=max_length, problem_type=problem_type,
            tokenizer=tokenizer, revision=revision, dtype=dtype, torch_dtype=torch_dtype,
            local_files_only=local_files_only, cache_dir=cache_dir, token=token,
            trust_remote_code=trust_remote_code,
        )

    @property
    def problem_type(self) -> str:
        """The effective problem type (see ``heads._losses``)."""
        return _losses.problem_type_of(self.config())

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
        self._require_tokenizer()
        limit = self.max_length if max_length is None else min(_inputs.check_max_length(max_length), self.max_length)
        return _encode.tokenize(
            self.tokenizer,
            texts,
            pairs,
            limit=limit,
            pad_to_multiple_of=self._pad_multiple(limit),
            input_names=self.input_names,
            device=self._graph.device,
        )

    def _label_value(self, label: Any, index: int, names: Optional[Sequence[str]] = None) -> Any:
        if names is not None and isinstance(label, int) and not isinstance(label, bool):
            if not 0 <= label < len(names):
                raise ValueError(f"label {label} at index {index} is not an id of the {len(names)} label names given "
                                 f"to collator ({list(names)[:10]}): give ids from 0 to {len(names) - 1}")
            label = names[label]
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
        Pre-tokenised rows (dicts with ``input_ids``, from ``dataset.map(tokenizer)``) are padded as they are, their
        other columns left out (as Trainer's collator does). Integer labels are this head's ids (:meth:`collator`
        matches a ``ClassLabel``'s ids by name).
        Labels: ints or label names -> LongTensor; floats -> FloatTensor; lists of floats -> FloatTensor
        ``[B, C]``; all None (or bare strings) -> ``None``, for prediction. Both tensors are on the graph's device.
        """
        return self._collate(items, None)

    def collator(self, label_names: Sequence[str]) -> Any:
        """A collate function like :meth:`collate` for items whose integer labels are ids into ``label_names``, e.g.
        a ``ClassLabel``'s ``dataset.features["label"].names``: each id is turned into its name and matched to this
        head's labels by name, so a dataset listing its classes in another order (or only some) trains correctly.
        :meth:`collate` itself takes integer labels as this head's own ids."""
        if isinstance(label_names, (str, bytes)) or not all(isinstance(n, str) for n in label_names):
            raise ValueError(f"label_names={label_names!r:.80} is invalid: pass the label names in id order, e.g. "
                             "dataset.features['label'].names")
        names = list(label_names)
        return lambda items: self._collate(items, names)

    def _collate(self, items: Sequence[Any], names: Optional[list[str]]) -> tuple[Encoding, Optional[torch.Tensor]]:
        tokenized = _inputs.tokenized_items(items)
        if tokenized is not None:
            rows, raw = tokenized
            self._require_tokenizer()
            enc = _encode.pad(self.tokenizer, rows, limit=self.max_length,
                              pad_to_multiple_of=self._pad_multiple(self.max_length), input_names=self.input_names,
                              device=self._graph.device)
        else:
            texts, pairs, raw = _inputs.split_items(items)
            enc = None
        labels = [self._label_value(label, i, names) for i, label in enumerate(raw)]
        if enc is None:
            enc = self.encode(texts, pairs)
        tensor = _losses.labels_to_tensor(labels)
        return enc, None if tensor is None else tensor.to(self._graph.device)

    # --- compute ------------------------------------------------------------------------------------------
    def forward(self, enc: Mapping[str, Any]) -> torch.Tensor:
        """Logits ``[B, num_labels]`` for an encoded batch, under the graph's autocast."""
        output = self._run_model(enc)
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
            self._graph.loss_items(items, loss=loss)
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
