"""Token classification heads (NER, POS and other taggers): one shared implementation, six family declarations.

It exists so that tagging gets the same surface as text classification (strict ``from_pretrained``, ``on_device``
as the replica factory, ``encode`` / ``collate`` / ``compute_loss``, ``head(**enc)``, ``save_pretrained``,
``push_to_hub``) while everything tagging-specific is written once: words -> subword labels
(``_token_classification_inputs``), a token-count loss that keeps N ranks exact, and prediction that agrees with
``pipeline("token-classification")`` (``_token_classification_tags``). A family is one line: its
:class:`heads.families.Family` record.

Decisions (each tested):

- Labels: ``label_all_subwords=False`` (default) labels the first subword of each word and gives the others
  ``-100``; ``True`` labels every subword with its word's tag (``B-X`` becoming ``I-X`` after the first subword when
  the head has ``I-X``), as transformers' ``run_ner.py --label_all_tokens`` does.
- Truncation: words after ``max_length`` have no token, so their labels are absent from the label tensor (the
  loss never sees them); ``encode``/``collate`` count them per row (``enc.truncated_words``) and
  ``predict_words`` gives them the ``truncated`` tag (``"O"`` by default).
- A batch whose tokens are all ``-100``: a zero loss (with a graph) that reports 0 items. On N ranks every rank's
  gradient is weighted by its labelled-token count, so a rank with none contributes exactly nothing and the global
  mean stays exact; a ValueError would kill a multi-rank run over a legitimate batch, and transformers' NaN would
  poison the all-reduce.
- Task mismatch: a checkpoint whose ``config.architectures`` names another task's head (sequence classification,
  QA, multiple choice...) is refused, because for most families that head's ``classifier.*`` keys would otherwise
  load silently as a token classifier. Base, masked-LM and pre-training checkpoints load with a fresh classifier.
- Byte-level BPE tokenizers (RoBERTa's) mark a word start with a space: ``from_pretrained`` loads them with
  ``add_prefix_space=True`` (as ``run_ner.py`` does) and ``encode`` refuses one without it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar, Optional, Sequence, Union

import torch
import torch.nn.functional as F

from . import _inputs, _run
from . import _token_classification_inputs as _words
from . import _token_classification_tags as _tags
from ._io import CheckpointError, HeadKeys, PathLike, load_config, load_tokenizer
from ._auto import AutoHead
from ._task import DEFAULT_MAX_LENGTH, TaskHead
from .families import FAMILIES

__all__ = [
    "TokenClassificationHead",
    "TOKEN_HEAD_KEYS",
    "BertForTokenClassification",
    "DistilBertForTokenClassification",
    "RobertaForTokenClassification",
    "AlbertForTokenClassification",
    "XLMRobertaForTokenClassification",
    "DebertaV2ForTokenClassification",
    "AutoHeadForTokenClassification",
    "WordEncoding",
]

WordEncoding = _words.WordEncoding

TOKEN_HEAD_KEYS = HeadKeys(head=("classifier.weight", "classifier.bias"), optional=(),
                           classifier="classifier.weight")
"""Every family's ``*ForTokenClassification`` has one ``classifier`` Linear on top of the encoder (no pooler)."""

_OTHER_TASK = re.compile(r"For(SequenceClassification|QuestionAnswering|MultipleChoice|NextSentencePrediction)$")


class TokenClassificationHead(TaskHead):
    """A tagger to fine-tune: a transformers ``*ForTokenClassification`` model inside a ``Graph``.

    Family classes set ``family`` (a :class:`heads.families.Family`); the rest follows from it.
    ``label_all_subwords`` (attribute, default False): see the module docstring.
    """

    task: ClassVar[str] = "token-classification"
    auto_name: ClassVar[str] = "AutoHeadForTokenClassification"
    head_keys: ClassVar[HeadKeys] = TOKEN_HEAD_KEYS
    task_suffix: ClassVar[str] = "ForTokenClassification"

    def __init__(self, model: Any, tokenizer: Any = None, *, max_length: int = DEFAULT_MAX_LENGTH,
                 device: Optional[Union[torch.device, str]] = None, label_all_subwords: bool = False) -> None:
        super().__init__(model, tokenizer, max_length=max_length, device=device)
        self.label_all_subwords = label_all_subwords

    @property
    def label_all_subwords(self) -> bool:
        """False: only a word's first subword carries its label (others -100). True: every subword does."""
        return self._label_all_subwords

    @label_all_subwords.setter
    def label_all_subwords(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise ValueError(f"label_all_subwords={value!r} is invalid: use True or False")
        self._label_all_subwords = value

    # --- construction -------------------------------------------------------------------------------------
    @classmethod
    def _apply_labels(cls, config: Any, num_labels: Optional[int], labels: Optional[Sequence[str]]) -> None:
        _inputs.apply_labels(config, num_labels, labels)
        if config.num_labels < 2:
            raise ValueError(
                f"a token classifier needs at least 2 tags, got {config.num_labels}: give labels=['O', 'B-X', ...]"
            )

    @classmethod
    def _load(cls, path_or_id: PathLike, *, options: Any, **kwargs: Any) -> tuple[Any, Any, int]:
        config = load_config(path_or_id, cls._check_model_type, options.hub_kwargs())
        other = [name for name in (getattr(config, "architectures", None) or []) if _OTHER_TASK.search(name)]
        if other:
            raise CheckpointError(
                f"{str(path_or_id)!r} is a {other[0]} checkpoint (config.architectures), not a token classifier: "
                f"its task head would load as a tagger's classifier. Load it with the head of its task, or save "
                f"its encoder alone (model.base_model.save_pretrained(dir)) and load that for a fresh tagger"
            )
        model, tokenizer, max_length = super()._load(path_or_id, options=options, **kwargs)
        if kwargs.get("tokenizer") is None and _words.lacks_prefix_space(tokenizer):
            # byte-level BPE (RoBERTa): words need their leading space, as transformers' run_ner.py loads them
            tokenizer = load_tokenizer(path_or_id, {**options.hub_kwargs(), "add_prefix_space": True})
        return model, tokenizer, max_length

    @classmethod
    def from_pretrained(
        cls,
        path_or_id: PathLike,
        *,
        num_labels: Optional[int] = None,
        labels: Optional[Sequence[str]] = None,
        max_length: Optional[int] = None,
        tokenizer: Any = None,
        label_all_subwords: bool = False,
        revision: Optional[str] = None,
        dtype: Any = None,
        torch_dtype: Any = None,
        local_files_only: bool = False,
        cache_dir: Optional[PathLike] = None,
        token: Optional[Union[str, bool]] = None,
        trust_remote_code: Optional[bool] = None,
    ) -> "TokenClassificationHead":
        """Load a tagger from a checkpoint directory (or, with a network, a Hub id / the HF cache).

        A base (or masked-LM) checkpoint gets a fresh classifier; a token-classification checkpoint is loaded
        strictly (a partial or mis-shaped classifier raises ``CheckpointError``); another task's checkpoint is
        refused. ``labels`` names the tags in id order (e.g. ``["O", "B-PER", "I-PER"]``). ``max_length``,
        ``tokenizer`` and transformers' keywords as in ``SequenceClassificationHead.from_pretrained``.
        """
        head = cls._from_pretrained(
            path_or_id, num_labels=num_labels, labels=labels, max_length=max_length, tokenizer=tokenizer,
            revision=revision, dtype=dtype, torch_dtype=torch_dtype, local_files_only=local_files_only,
            cache_dir=cache_dir, token=token, trust_remote_code=trust_remote_code,
        )
        head.label_all_subwords = label_all_subwords
        return head

    @classmethod
    def from_config(cls, config: Any, num_labels: Optional[int] = None, tokenizer: Any = None, *,
                    labels: Optional[Sequence[str]] = None, max_length: int = DEFAULT_MAX_LENGTH,
                    device: Optional[Union[torch.device, str]] = None,
                    label_all_subwords: bool = False) -> "TokenClassificationHead":
        """A tagger with fresh weights (seed torch first for reproducibility). ``config`` is copied."""
        head = super().from_config(config, num_labels, tokenizer, labels=labels, max_length=max_length,
                                   device=device)
        head.label_all_subwords = label_all_subwords
        return head

    # --- inputs -------------------------------------------------------------------------------------------
    def _tokenize(self, words_batch: list[list[str]], limit: int) -> Any:
        tokenizer = self._require_tokenizer()
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError(
                f"{type(tokenizer).__name__} is a slow tokenizer: word alignment needs a fast one "
                "(AutoTokenizer.from_pretrained(path, use_fast=True))"
            )
        if _words.lacks_prefix_space(tokenizer):
            raise ValueError(
                f"this byte-level BPE tokenizer ({type(tokenizer).__name__}) has add_prefix_space=False, so pre-split "
                "words would lose the leading space that marks a word start: load it with "
                "AutoTokenizer.from_pretrained(path, add_prefix_space=True) (from_pretrained does this for you)"
            )
        return tokenizer(words_batch, is_split_into_words=True, padding="longest", truncation=True,
                         max_length=limit, pad_to_multiple_of=self._pad_multiple(limit), return_tensors="pt",
                         return_token_type_ids="token_type_ids" in self.input_names)

    def encode(self, words_batch: Sequence[Any], max_length: Optional[int] = None) -> WordEncoding:
        """The model inputs of a batch of sentences on the graph's device: each a list of words (pre-split, as in
        CoNLL data; tokenised with ``is_split_into_words=True``) or a text (split on whitespace); padded to the
        longest and truncated to ``max_length`` (at most the head's). The result also carries ``word_ids`` and
        ``truncated_words`` (see :class:`WordEncoding`)."""
        words_batch = _words.check_words_batch(words_batch, "encode")
        limit = self.max_length if max_length is None else min(_inputs.check_max_length(max_length),
                                                               self.max_length)
        batch = self._tokenize(words_batch, limit)
        full = (batch["attention_mask"].sum(1) >= limit).tolist()
        enc = WordEncoding({name: batch[name].to(self._graph.device) for name in self.input_names if name in batch})
        enc.word_ids = [batch.word_ids(i) for i in range(len(words_batch))]
        enc.truncated_words = [
            len(words) - _words.visible_words(ids, len(words), bool(f), i, words)
            for i, (ids, words, f) in enumerate(zip(enc.word_ids, words_batch, full, strict=True))
        ]
        return enc

    def collate(self, items: Sequence[Any]) -> tuple[WordEncoding, Optional[torch.Tensor]]:
        """Batch tagged sentences for ``graph.set_data_loader(..., collate_fn=head.collate)``.

        Items: ``(words, tags)`` pairs, or dicts with ``words`` (or ``tokens``) and ``tags`` (or ``ner_tags`` /
        ``labels``); words are a list of str or a text split on whitespace; tags are label names or ids, one per
        word (-100: ignore that word). Untagged items (word lists, texts) give labels None, for prediction.
        Returns ``(enc, labels)``: ``enc`` on the graph's device, ``labels`` a LongTensor ``[B, T]`` aligned to
        the subwords (see ``label_all_subwords``), -100 on special tokens and padding, left on the CPU until
        :meth:`compute_loss` (checking and counting it there needs no device sync).
        """
        words_batch, raw = _words.split_tagged_items(items)
        names = self.labels()
        label2id = {name: i for i, name in enumerate(names)}
        tag_rows = None if raw is None else [
            _words.tag_ids(tags, words, i, label2id, names) for i, (tags, words) in enumerate(zip(raw, words_batch))
        ]
        enc = self.encode(words_batch)
        if tag_rows is None:
            return enc, None
        later = _words.b_to_i_map(names)
        rows = [_words.align(ids, tags, self.label_all_subwords, later)
                for ids, tags in zip(enc.word_ids, tag_rows, strict=True)]
        return enc, torch.tensor(rows, dtype=torch.long)

    # --- compute ------------------------------------------------------------------------------------------
    def forward(self, enc: Mapping[str, Any]) -> torch.Tensor:
        """Logits ``[B, T, num_labels]`` for an encoded batch, under the graph's autocast."""
        output = self._run_model(enc)
        return output.logits if hasattr(output, "logits") else output[0]

    def __call__(self, enc: Optional[Mapping[str, Any]] = None, /, labels: Any = None, **inputs: Any) -> Any:
        """Run like a transformers model: ``head(**enc)`` or ``head(enc)``, optionally with ``labels`` ``[B, T]``.
        Returns ``transformers.modeling_outputs.TokenClassifierOutput`` (``loss`` is :meth:`compute_loss`'s)."""
        from transformers.modeling_outputs import TokenClassifierOutput

        out = _run.call_output(self, enc, labels, inputs)
        return TokenClassifierOutput(loss=out.loss, logits=out.logits)

    def compute_loss(self, enc: Mapping[str, Any], labels: Any) -> torch.Tensor:
        """Cross-entropy over the labelled tokens (``-100`` ignored): transformers' ``model(**enc, labels=labels)
        .loss``. Labels are checked on the host before the forward pass; with gradients enabled the graph is told
        the number of labelled tokens (``Graph.loss_items``), so N ranks average exactly. No labelled token: a zero
        loss and 0 items (see the module docstring)."""
        return self._loss_and_logits(enc, labels)[0]

    def _loss_and_logits(self, enc: Mapping[str, Any], labels: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if labels is None:
            raise ValueError("compute_loss needs labels: collate returned None because the items had no tags")
        enc = self._to_device(enc)
        labels = _words.check_token_labels(labels, enc["input_ids"].shape, self.num_labels)
        items = int((labels != _words.IGNORE_INDEX).sum())
        labels = labels.to(self._graph.device, non_blocking=True)
        logits = self.forward(enc)
        flat = logits.float().reshape(-1, logits.shape[-1])
        if items == 0:
            loss = flat.sum() * 0.0  # every token ignored: zero, with a graph, over 0 items
        else:
            loss = F.cross_entropy(flat, labels.reshape(-1).long(), ignore_index=_words.IGNORE_INDEX)
        if torch.is_grad_enabled():  # so N ranks weight it exactly (Graph.loss_items)
            self._graph.loss_items(items, loss=loss)
        return loss, logits

    # --- prediction ---------------------------------------------------------------------------------------
    def predict_words(self, words_batch: Sequence[Any], batch_size: int = 32,
                      truncated: Optional[str] = "O") -> list[list[str]]:
        """One tag name per input word (the prediction at its first subword), for seqeval-style evaluation.
        Words cut off by ``max_length`` get ``truncated`` (None: raise ValueError instead). Eval mode, no grad."""
        return _tags.predict_words(self, words_batch, batch_size, truncated)

    def tag(self, texts: Sequence[str], aggregation_strategy: str = "simple",
            ignore_labels: Optional[Sequence[str]] = None, batch_size: int = 32) -> list[list[dict]]:
        """Per text, what ``pipeline("token-classification", model=<saved head>, aggregation_strategy=...)``
        returns: dicts with ``entity`` (``"none"``; also ``index``) or ``entity_group``, ``score``, ``word``,
        ``start``, ``end``; labels in ``ignore_labels`` (default ``["O"]``) dropped. Strategies: ``"none"``,
        ``"simple"``, ``"first"``, ``"average"``, ``"max"``. Texts are truncated to ``max_length`` (no striding).
        Needs a fast tokenizer. Eval mode (each module's mode restored), no grad, batched."""
        return _tags.tag_texts(self, texts, aggregation_strategy, ignore_labels, batch_size)


# --- families: one declaration each --------------------------------------------------------------------------
class BertForTokenClassification(TokenClassificationHead):
    """Tagger around ``transformers.BertForTokenClassification``."""

    family = FAMILIES["bert"]


class DistilBertForTokenClassification(TokenClassificationHead):
    """Tagger around ``transformers.DistilBertForTokenClassification``."""

    family = FAMILIES["distilbert"]


class RobertaForTokenClassification(TokenClassificationHead):
    """Tagger around ``transformers.RobertaForTokenClassification``."""

    family = FAMILIES["roberta"]


class AlbertForTokenClassification(TokenClassificationHead):
    """Tagger around ``transformers.AlbertForTokenClassification``."""

    family = FAMILIES["albert"]


class XLMRobertaForTokenClassification(TokenClassificationHead):
    """Tagger around ``transformers.XLMRobertaForTokenClassification``."""

    family = FAMILIES["xlm-roberta"]


class DebertaV2ForTokenClassification(TokenClassificationHead):
    """Tagger around ``transformers.DebertaV2ForTokenClassification``."""

    family = FAMILIES["deberta-v2"]


HEAD_CLASSES: dict[str, type[TokenClassificationHead]] = {
    cls.model_type: cls
    for cls in (BertForTokenClassification, DistilBertForTokenClassification, RobertaForTokenClassification,
                AlbertForTokenClassification, XLMRobertaForTokenClassification, DebertaV2ForTokenClassification)
}
"""``model_type`` -> tagger class."""


class AutoHeadForTokenClassification(AutoHead):
    """Dispatch to the tagger class of a checkpoint's or config's ``model_type``. Not instantiable."""

    head_classes = HEAD_CLASSES
