"""MaskedLMHead: everything a masked-LM task head does, for every model family (``heads.masked_lm`` declares them).

It exists so that a family's masked-LM head is a few lines of declaration (where its LM head lives, how it is
applied) while loading with a tied decoder (``_mlm_load``), seeded masking (``_mlm_mask``), the masked-rows-only
loss (``_mlm_logits``), ``fill_mask``, ``perplexity`` and the push (``_mlm_run``) are written and tested once. A
masked-LM head has no labels: ``labels()`` is empty and label arguments are refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Optional, Sequence, Union

import torch

from . import _encode, _hub, _inputs, _mlm_logits, _mlm_mask, _mlm_run
from ._io import PathLike
from ._mlm_load import LMLayout, head_keys, load_masked_lm
from ._task import DEFAULT_MAX_LENGTH, Encoding, TaskHead, TransformersClass
from .families import FAMILIES

__all__ = ["MaskedLMHead"]


class MaskedLMHead(TaskHead):
    """A masked language model to train: a transformers ``*ForMaskedLM`` model inside a ``Graph``.

    Build one with :meth:`from_pretrained`, :meth:`from_config` or :meth:`on_device`. ``mlm_probability`` is the
    share of tokens ``collate`` selects; ``mask_seed`` and ``mask_epoch`` (:meth:`set_mask_epoch`) decide which.
    """

    task: ClassVar[str] = "fill-mask"
    auto_name: ClassVar[str] = "AutoHeadForMaskedLM"
    layout: ClassVar[LMLayout] = LMLayout(own=("",), decoder="", embeddings="")
    """Where the family's LM head lives (see :class:`heads._mlm_load.LMLayout`)."""
    base: ClassVar[str] = ""
    """The encoder attribute of the model (``model.bert``)."""
    lm_logits: ClassVar[Any] = None
    """``(model, hidden) -> logits``: the family's LM head on selected hidden states (``heads._mlm_logits``)."""

    def __init_subclass__(cls, *, family: Optional[str] = None, own: tuple[str, ...] = (), decoder: str = "",
                          aliases: tuple[str, ...] = (), lm: Union[str, _mlm_logits.LMFunction] = "",
                          **kwargs: Any) -> None:
        """A family's declaration: ``class BertForMaskedLM(MaskedLMHead, family="bert", own=..., decoder=...,
        aliases=..., lm=...)`` sets the transformers classes, inputs, positions and LM layout from
        ``FAMILIES[family]`` (the decoder tied to ``<base>.embeddings.word_embeddings.weight``); ``lm`` is the LM
        head's attribute on the model, or a function applying it (``heads._mlm_logits``)."""
        super().__init_subclass__(**kwargs)
        if family is None:
            return
        record = FAMILIES[family]
        cls.model_type = family
        cls.config_class = TransformersClass(record.transformers_name("Config"))
        cls.model_class = TransformersClass(record.transformers_name("ForMaskedLM"))
        cls.input_names = record.input_names
        cls.layout = LMLayout(own, decoder, f"{record.base}.embeddings.word_embeddings.weight", aliases)
        cls.head_keys = head_keys(cls.layout, None)
        cls.family_record = record
        cls.base = record.base
        cls.lm_logits = staticmethod(lm if callable(lm) else _mlm_logits.module_lm(lm))

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        max_length: int = DEFAULT_MAX_LENGTH,
        device: Optional[Union[torch.device, str]] = None,
        mlm_probability: float = 0.15,
        mask_seed: int = 0,
    ) -> None:
        super().__init__(model, tokenizer, max_length=max_length, device=device)
        self.mlm_probability = _mlm_mask.check_probability(mlm_probability)
        self.mask_seed = _check_int(mask_seed, "mask_seed")
        self.mask_epoch = 0

    # --- construction -------------------------------------------------------------------------------------
    @classmethod
    def _apply_labels(cls, config: Any, num_labels: Optional[int], labels: Optional[Sequence[str]]) -> None:
        if num_labels is not None or labels is not None:
            given = f"labels={labels!r}" if labels is not None else f"num_labels={num_labels!r}"
            raise ValueError(
                f"{given} was given to {cls.__name__}, but a masked-LM head has no labels (it predicts the masked "
                "tokens, labelled by collate): drop num_labels/labels"
            )

    @classmethod
    def layout_of(cls, config: Any) -> LMLayout:
        """The LM head layout for ``config`` (a family whose layout depends on the config overrides this)."""
        return cls.layout

    @classmethod
    def from_pretrained(
        cls,
        path_or_id: PathLike,
        *,
        max_length: Optional[int] = None,
        tokenizer: Any = None,
        mlm_probability: float = 0.15,
        mask_seed: int = 0,
        num_labels: Optional[int] = None,
        labels: Optional[Sequence[str]] = None,
        revision: Optional[str] = None,
        dtype: Any = None,
        torch_dtype: Any = None,
        local_files_only: bool = False,
        cache_dir: Optional[PathLike] = None,
        token: Optional[Union[str, bool]] = None,
        trust_remote_code: Optional[bool] = None,
    ) -> "MaskedLMHead":
        """Load a head from a base checkpoint (fresh LM head, its decoder tied to the word embeddings; logged at
        WARNING on ``flodl_hf.heads``) or a full masked-LM checkpoint (strict: a partial LM head is refused).

        A checkpoint fine-tuned for another task (``config.architectures`` a ``*ForSequenceClassification``,
        ``*ForTokenClassification``, ``*ForQuestionAnswering``...) is refused. ``num_labels``/``labels`` are
        refused (ValueError): a masked LM has none. ``max_length`` None: a saved head's training length for a
        full checkpoint, 128 for a base one. The transformers keywords are ``SequenceClassificationHead``'s.
        """
        options = _hub.load_options(
            revision=revision, dtype=dtype, torch_dtype=torch_dtype, local_files_only=local_files_only,
            cache_dir=cache_dir, token=token, trust_remote_code=trust_remote_code,
        )
        mlm_probability = _mlm_mask.check_probability(mlm_probability)
        mask_seed = _check_int(mask_seed, "mask_seed")
        model, tokenizer, max_length = load_masked_lm(
            cls.model_class, cls.layout_of, cls._check_model_type, cls._apply_labels, path_or_id,
            num_labels=num_labels, labels=labels, max_length=max_length, tokenizer=tokenizer, options=options,
        )
        return cls(model, tokenizer, max_length=max_length, mlm_probability=mlm_probability, mask_seed=mask_seed)

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
        mlm_probability: float = 0.15,
        mask_seed: int = 0,
    ) -> "MaskedLMHead":
        """A head with freshly initialised weights (seed torch first), its decoder tied to the word embeddings
        as the config says. ``num_labels``/``labels`` must be None. ``config`` is copied."""
        mlm_probability = _mlm_mask.check_probability(mlm_probability)
        mask_seed = _check_int(mask_seed, "mask_seed")
        head = super().from_config(config, num_labels, tokenizer, labels=labels, max_length=max_length, device=device)
        head.mlm_probability, head.mask_seed = mlm_probability, mask_seed
        return head

    @classmethod
    def on_device(cls, config: Any, num_labels: Optional[int], device: Union[torch.device, str]) -> Any:
        """A fresh head on ``device`` without tokenizer: the replica factory of ``Trainer.setup_head``.
        ``num_labels`` must be None (or 0, ``len(head.labels())``): a masked LM has no labels."""
        if num_labels == 0 and not isinstance(num_labels, bool):
            num_labels = None
        return cls.from_config(config, num_labels, device=device)

    # --- description ----------------------------------------------------------------------------------------
    @property
    def num_labels(self) -> int:
        """0: a masked LM predicts vocabulary tokens, not labels."""
        return 0

    def labels(self) -> list[str]:
        """``[]``: a masked LM has no labels (its targets are the vocabulary)."""
        return []

    def _save_extras(self, directory: Any) -> None:
        """Nothing: config.json stays exactly as transformers writes it (no label maps for a masked LM)."""

    def set_mask_epoch(self, epoch: int) -> None:
        """Draw ``collate``'s masks for epoch ``epoch`` (like a sampler's ``set_epoch``): call it with the same
        number on every rank at the start of each epoch to mask every text anew each epoch. Never called: every
        epoch sees the same masks (static masking)."""
        self.mask_epoch = _check_int(epoch, "epoch")

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(vocab_size={self.config().vocab_size}, mlm_probability={self.mlm_probability}, "
            f"device={self._graph.device}, tokenizer={'yes' if self.tokenizer is not None else 'none'})"
        )

    # --- inputs -------------------------------------------------------------------------------------------
    def encode(self, texts: Sequence[str], max_length: Optional[int] = None) -> Encoding:
        """Tokenise ``texts`` (unmasked) into the model's inputs on the graph's device: padded to the longest,
        truncated to ``max_length`` (at most the head's)."""
        texts = _inputs.check_texts(texts, "encode")
        if not texts:
            raise ValueError("encode got no texts: give at least one")
        self._require_tokenizer()
        limit = self.max_length if max_length is None else min(_inputs.check_max_length(max_length), self.max_length)
        return _encode.tokenize(
            self.tokenizer, texts, None, limit=limit, pad_to_multiple_of=self._pad_multiple(limit),
            input_names=self.input_names, device=self._graph.device,
        )

    def collate(self, items: Sequence[Any]) -> tuple[Encoding, torch.Tensor]:
        """Batch and mask ``items`` (strings, or dicts with ``text``) for ``graph.set_data_loader(...,
        collate_fn=head.collate)``: ``(enc, labels)`` with ``enc``'s ``input_ids`` masked (on the graph's device)
        and ``labels`` ``[B, T]`` the original ids at selected positions, -100 elsewhere (on the CPU, where
        ``compute_loss`` checks and counts them). Masks follow ``heads._mlm_mask``: seeded by ``mask_seed``,
        ``mask_epoch`` and each text's tokens, so they do not depend on the rank or batch that collates a text."""
        texts = _mlm_run.item_texts(items)
        return self._masked_batch(texts, self.mask_seed, self.mask_epoch)

    def _masked_batch(self, texts: list[str], seed: int, epoch: int) -> tuple[Encoding, torch.Tensor]:
        if not texts:
            raise ValueError("collate got no items: give at least one text")
        tokenizer = self._require_tokenizer()
        if tokenizer.mask_token_id is None:
            raise ValueError(f"the tokenizer of this {type(self).__name__} has no mask token: set one")
        limit = self.max_length
        batch = tokenizer(
            texts, padding="longest", truncation=True, max_length=limit,
            pad_to_multiple_of=self._pad_multiple(limit), return_tensors="pt",
            return_token_type_ids="token_type_ids" in self.input_names, return_special_tokens_mask=True,
        )
        ids = batch["input_ids"]
        specials = torch.tensor(tokenizer.all_special_ids, dtype=ids.dtype)  # [UNK] and [MASK] in the text too
        special = batch["special_tokens_mask"].bool() | torch.isin(ids, specials)
        vocab = min(len(tokenizer), int(self.config().vocab_size))
        masked, labels = _mlm_mask.mask_tokens(
            ids, batch["attention_mask"], special, probability=self.mlm_probability,
            mask_id=int(tokenizer.mask_token_id), vocab_size=vocab, seed=seed, epoch=epoch,
        )
        batch["input_ids"] = masked
        device = self._graph.device
        return {name: batch[name].to(device) for name in self.input_names if name in batch}, labels

    # --- compute ------------------------------------------------------------------------------------------
    def forward(self, enc: Mapping[str, Any]) -> torch.Tensor:
        """Logits ``[B, T, vocab_size]`` for an encoded batch, under the graph's autocast."""
        return self._run_model(enc).logits

    def __call__(self, enc: Optional[Mapping[str, Any]] = None, /, labels: Any = None, **inputs: Any) -> Any:
        """``head(**enc)`` / ``head(enc)``, optionally with ``labels``: a transformers ``MaskedLMOutput`` with
        ``logits`` and, with labels, :meth:`compute_loss`'s ``loss``."""
        return _mlm_run.call_output(self, enc, labels, inputs)

    def compute_loss(self, enc: Mapping[str, Any], labels: Any) -> torch.Tensor:
        """Cross-entropy over the masked positions (labels not -100), transformers' ``model(**enc,
        labels=labels).loss``; tells the graph how many tokens it averaged over (``Graph.loss_items``). A batch
        without any masked token gives a zero loss (with a graph) over 0 tokens. Labels are checked (shape,
        dtype, range) on the host before the forward pass. The LM head runs on the masked positions only
        (``heads._mlm_logits``) unless the model is wrapped or hooked."""
        return self._loss(enc, labels, need_logits=False)[0]

    def _loss_and_logits(self, enc: Mapping[str, Any], labels: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss and the full logits ``[B, T, vocab]`` (``head(**enc, labels=...)``)."""
        return self._loss(enc, labels, need_logits=True)

    def _loss(self, enc: Mapping[str, Any], labels: Any, need_logits: bool) -> tuple[torch.Tensor, torch.Tensor]:
        if labels is None:
            raise ValueError("compute_loss needs labels: use the (enc, labels) that collate returns")
        enc = self._to_device(enc)
        labels = _mlm_run.check_labels(labels, tuple(enc["input_ids"].shape), int(self.config().vocab_size))
        selected = labels != _mlm_mask.IGNORE_INDEX  # counted on the host: no device sync
        items = int(selected.sum())
        device, module = self._graph.device, self._graph.module
        if not need_logits and _mlm_logits.is_plain(module, self.model_class):
            with self._graph.autocast():
                logits = _mlm_logits.masked_logits(
                    module, self.base, self.lm_logits, enc, selected.to(device, non_blocking=True)
                )
            targets = labels[selected].to(device, non_blocking=True)
        else:
            logits = self.forward(enc)
            targets = labels.to(device, non_blocking=True)
        flat = logits.float().reshape(-1, logits.shape[-1])
        if items:
            loss = torch.nn.functional.cross_entropy(flat, targets.reshape(-1), ignore_index=_mlm_mask.IGNORE_INDEX)
        else:
            loss = flat.sum() * 0.0  # nothing masked: a zero loss that still has a graph
        if torch.is_grad_enabled():  # so N ranks weight it exactly (Graph.loss_items)
            self._graph.loss_items(items, loss=loss)
        return loss, logits

    def fill_mask(self, text_or_texts: Union[str, Sequence[str]], top_k: int = 5) -> list[Any]:
        """What ``pipeline("fill-mask", model=saved_dir)(text, top_k=top_k)`` returns: per mask token, ``top_k``
        dicts ``{"score", "token", "token_str", "sequence"}``, highest score first; a text with one mask gives a
        list of dicts, with several masks a list per mask (each ``sequence`` fills that mask only). A string gives
        its result; a list of texts a list of results (also for one text, where the pipeline unwraps it). A text
        without the tokenizer's mask token raises ValueError naming it. Eval mode, no gradients; modes restored."""
        return _mlm_run.fill_mask(self, text_or_texts, top_k)

    def perplexity(self, texts: Sequence[str], batch_size: int = 32, seed: int = 0) -> float:
        """``exp`` of the token-weighted mean masked cross-entropy of ``texts`` under fixed masks (``seed``,
        epoch 0, this head's ``mlm_probability``): the same masks on every call, for held-out evaluation."""
        return _mlm_run.perplexity(self, texts, batch_size, _check_int(seed, "seed"))

    def push_to_hub(self, repo_id: str, **kwargs: Any) -> Any:
        """Upload the model, tokenizer and a short fill-mask model card to ``repo_id`` (keywords: ``token``,
        ``private``, ``revision``, ``commit_message``, ``create_pr``); refuses offline or without a token."""
        return _mlm_run.push(self, repo_id, **kwargs)


def _check_int(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name}={value!r} is invalid: use an integer >= 0")
    return value
