"""QuestionAnsweringHead: everything an extractive question-answering head does, for every model family.

It exists so that fine-tuning a ``*ForQuestionAnswering`` model has the surface of every flodl-hf head
(``from_pretrained`` / ``from_config`` / ``on_device``, ``encode`` / ``collate``, ``compute_loss``, ``graph()``,
``save_pretrained``, ``push_to_hub``) while keeping what is particular to QA in one place: a (question, context) pair
becomes one or more stride windows (``heads._qa_windows``), items carry a character answer span that is checked and
mapped to token positions (``heads._qa_items``), the loss is transformers' (the mean of the start and end
cross-entropies) over windows and reports its window count so N ranks weight it exactly, and :meth:`answer` picks
spans as transformers' ``question-answering`` pipeline did (``heads._qa_decode``). QA has no label names: the model
always has two outputs (start and end logits). A family class (``heads.question_answering``) only names its
:class:`heads.families.Family`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Optional, Sequence, Union

import torch
import torch.nn.functional as F

from . import _io, _load, _qa_card, _qa_decode, _qa_items, _qa_windows
from ._io import CheckpointError, HeadKeys, PathLike
from ._task import Encoding, TaskHead

__all__ = ["QuestionAnsweringHead", "QA_HEAD_KEYS"]

QA_HEAD_KEYS = HeadKeys(head=("qa_outputs.weight", "qa_outputs.bias"), optional=(), classifier="qa_outputs.weight")
"""The QA output layer of every family (``[2, hidden]``: start and end logits); its encoders have no pooler."""

_OTHER_TASKS = ("ForSequenceClassification", "ForTokenClassification", "ForMultipleChoice")


def _check_task(config: Any, path_or_id: PathLike) -> None:
    """Refuse a checkpoint fine-tuned for another task (its head would be dropped for a fresh QA head unnoticed)."""
    names = [str(a) for a in (getattr(config, "architectures", None) or [])]
    if names and not any(n.endswith("ForQuestionAnswering") for n in names) and any(
        n.endswith(_OTHER_TASKS) for n in names
    ):
        raise CheckpointError(
            f"{str(path_or_id)!r} is a {', '.join(names)} checkpoint (config.json 'architectures'), fine-tuned for "
            "another task: loading it for question answering would drop its head and start a fresh one. Load a base "
            "or question-answering checkpoint; to start from this encoder on purpose, save it as a base checkpoint "
            "first (transformers.AutoModel.from_pretrained(path).save_pretrained(new_dir), plus the tokenizer)"
        )


def _weight_names(path_or_id: PathLike) -> Optional[set[str]]:
    """The tensor names of a local checkpoint's safetensors weights (None: a Hub id or a ``.bin`` checkpoint)."""
    if not _io.is_local_path(path_or_id):
        return None
    weights = _io.find_weights(Path(path_or_id).expanduser())
    if weights.name.endswith(".index.json"):
        return set(json.loads(weights.read_text(encoding="utf-8"))["weight_map"])
    if not weights.name.endswith(".safetensors"):
        return None
    from safetensors import safe_open

    with safe_open(str(weights), framework="pt") as handle:
        return set(handle.keys())


def _check_qa_layer(config: Any, path_or_id: PathLike) -> None:
    """Refuse a checkpoint that says it is a QA model but holds no QA layer (it would get a fresh one unnoticed)."""
    names = [str(a) for a in (getattr(config, "architectures", None) or [])]
    if not any(n.endswith("ForQuestionAnswering") for n in names):
        return
    keys = _weight_names(path_or_id)
    if keys is not None and not any(k.endswith(QA_HEAD_KEYS.classifier) for k in keys):
        raise CheckpointError(
            f"{str(path_or_id)!r}: config.json 'architectures' names {', '.join(names)} but its weights hold no "
            f"{QA_HEAD_KEYS.classifier}: the checkpoint is damaged; re-save it, or load its base model to start a "
            "fresh QA layer"
        )


class QuestionAnsweringHead(TaskHead):
    """An extractive QA model to fine-tune: a transformers ``*ForQuestionAnswering`` model inside a ``Graph``.

    ``doc_stride``: the overlap, in tokens, of consecutive windows of a long context (None: ``min(max_length // 2,
    128)``, the pipeline's default). Subclasses set ``family``.
    """

    task: ClassVar[str] = "question-answering"
    auto_name: ClassVar[str] = "AutoHeadForQuestionAnswering"
    head_keys: ClassVar[HeadKeys] = QA_HEAD_KEYS
    task_suffix: ClassVar[str] = "ForQuestionAnswering"

    def __init__(self, model: Any, tokenizer: Any = None, *, max_length: int = _load.DEFAULT_MAX_LENGTH,
                 device: Optional[Union[torch.device, str]] = None, doc_stride: Optional[int] = None) -> None:
        super().__init__(model, tokenizer, max_length=max_length, device=device)
        self.doc_stride = doc_stride

    # --- construction -------------------------------------------------------------------------------------
    @classmethod
    def _apply_labels(cls, config: Any, num_labels: Optional[int], labels: Optional[Sequence[str]]) -> None:
        """QA has exactly two outputs (start, end) and no label names: anything else is refused."""
        if labels is not None:
            raise ValueError(
                f"labels={labels!r:.80} is invalid for question answering: a QA head has no label names (its two "
                "outputs are the start and end logits); drop labels"
            )
        if num_labels is not None and (not isinstance(num_labels, int) or isinstance(num_labels, bool)
                                       or num_labels != 2):
            raise ValueError(
                f"num_labels={num_labels!r} is invalid for question answering: a QA model has 2 outputs (start and "
                "end logits); drop num_labels or pass 2"
            )
        config.num_labels = 2
        config.id2label, config.label2id = {0: "LABEL_0", 1: "LABEL_1"}, {"LABEL_0": 0, "LABEL_1": 1}

    @classmethod
    def _load(cls, path_or_id: PathLike, *, num_labels: Optional[int], labels: Optional[Sequence[str]],
              max_length: Optional[int], problem_type: Optional[str], tokenizer: Any,
              options: Any) -> tuple[Any, Any, int]:
        def apply(config: Any, n: Optional[int], names: Optional[Sequence[str]]) -> None:
            _check_task(config, path_or_id)
            _check_qa_layer(config, path_or_id)
            cls._apply_labels(config, n, names)

        return _load.load_parts(
            cls.model_class, cls.head_keys, cls._check_model_type, path_or_id, num_labels=num_labels, labels=labels,
            max_length=max_length, problem_type=None, tokenizer=tokenizer, options=options, apply_labels=apply,
        )

    @classmethod
    def from_pretrained(
        cls,
        path_or_id: PathLike,
        *,
        max_length: Optional[int] = None,
        doc_stride: Optional[int] = None,
        num_labels: Optional[int] = None,
        tokenizer: Any = None,
        revision: Optional[str] = None,
        dtype: Any = None,
        torch_dtype: Any = None,
        local_files_only: bool = False,
        cache_dir: Optional[PathLike] = None,
        token: Optional[Union[str, bool]] = None,
        trust_remote_code: Optional[bool] = None,
    ) -> "QuestionAnsweringHead":
        """Load a QA head from a checkpoint directory (or, with a network, a Hub id / the HF cache).

        A base checkpoint (no ``qa_outputs``) gets a fresh QA layer (logged at WARNING); a QA checkpoint is loaded
        strictly. A checkpoint fine-tuned for another task (config ``architectures`` such as
        ``BertForSequenceClassification``) is refused (``CheckpointError``) rather than silently losing its head, and
        so is a local checkpoint whose config names a QA model but whose weights hold no QA layer.
        ``max_length`` None: a QA checkpoint's saved training length, else 128. ``doc_stride``: see the class.
        ``num_labels`` may only be 2. transformers' keywords as in ``SequenceClassificationHead.from_pretrained``.
        """
        head = cls._from_pretrained(
            path_or_id, num_labels=num_labels, max_length=max_length, tokenizer=tokenizer, revision=revision,
            dtype=dtype, torch_dtype=torch_dtype, local_files_only=local_files_only, cache_dir=cache_dir,
            token=token, trust_remote_code=trust_remote_code,
        )
        head.doc_stride = doc_stride
        return head

    # --- description --------------------------------------------------------------------------------------
    def labels(self) -> list[str]:
        """``[]``: a QA head has no classes (its two outputs are the start and end logits of each token)."""
        return []

    @property
    def doc_stride(self) -> Optional[int]:
        """The requested window overlap in tokens (None: the default, see :meth:`stride`)."""
        return self._doc_stride

    @doc_stride.setter
    def doc_stride(self, value: Optional[int]) -> None:
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise ValueError(f"doc_stride={value!r} is invalid: use an integer >= 0 (tokens of overlap) or None")
        self._doc_stride = value

    def stride(self, doc_stride: Optional[int] = None) -> int:
        """The window overlap used: ``doc_stride``, else the head's, else ``min(max_length // 2, 128)``."""
        value = doc_stride if doc_stride is not None else self._doc_stride
        if value is None:
            return _qa_windows.default_stride(self.max_length)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < self.max_length:
            raise ValueError(
                f"doc_stride={value!r} is invalid: use an integer in [0, {self.max_length}) (below max_length)"
            )
        return value

    def _save_extras(self, directory: Path) -> None:
        """Nothing to add: transformers' config.json is complete for a QA model (no label names to state)."""

    # --- inputs -------------------------------------------------------------------------------------------
    def _windows(self, questions: list[str], contexts: list[str], doc_stride: Optional[int]) -> Any:
        return _qa_windows.tokenize_windows(
            self._require_tokenizer(), questions, contexts, max_length=self.max_length,
            stride=self.stride(doc_stride), input_names=self.input_names,
        )

    def _pad(self, windows: Any, rows: Sequence[int]) -> Encoding:
        return _qa_windows.pad_windows(windows, rows, self.tokenizer.pad_token_id, self._graph.device,
                                       self._pad_multiple(self.max_length))

    def encode(self, questions: Sequence[str], contexts: Sequence[str]) -> Encoding:
        """The model inputs of every window of every (question, context) pair, on the graph's device: question
        first, only the context cut (``truncation="only_second"``) into windows of ``max_length`` tokens overlapping
        by :meth:`stride`, padded to the longest. N pairs give W >= N rows."""
        questions, contexts = _qa_items.check_pairs(questions, contexts, "encode")
        windows = self._windows(questions, contexts, None)
        return self._pad(windows, range(len(windows)))

    def collate(self, items: Sequence[Any]) -> tuple[Encoding, torch.Tensor]:
        """Batch QA items for ``graph.set_data_loader(..., collate_fn=head.collate)``.

        Items are SQuAD-style ``{"question", "context", "answers": {"text": [...], "answer_start": [...]}}`` (the
        first answer is trained on; empty lists: no answer) or flat ``{"question", "context", "answer_text",
        "answer_start"}`` (a character offset into the context). Returns the windows' inputs (on the graph's device)
        and a LongTensor ``[W, 2]`` of (start, end) token positions, on the CPU; a window without the whole answer is
        labelled with its CLS position. An answer whose offset does not point at its text raises ValueError. As in
        transformers' examples, an answer that no window holds whole (longer than the overlap and cut at a window
        edge) leaves every window of its item labelled CLS: keep ``doc_stride`` above the longest answer.
        """
        questions, contexts, spans = _qa_items.parse_items(items)
        windows = self._windows(questions, contexts, None)
        return self._pad(windows, range(len(windows))), _qa_windows.answer_positions(windows, spans)

    # --- compute ------------------------------------------------------------------------------------------
    def forward(self, enc: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(start_logits, end_logits)``, each ``[W, L]``, for an encoded batch, under the graph's autocast."""
        output = self._run_model(enc)
        return output.start_logits, output.end_logits

    def compute_loss(self, enc: Mapping[str, Any], labels: Any) -> torch.Tensor:
        """The mean over windows of ``(CE(start) + CE(end)) / 2``: transformers' ``model(**enc, start_positions=...,
        end_positions=...).loss``; tells the graph it averaged over W windows (when grad is enabled).

        ``labels``: ``[W, 2]`` (start, end) token positions. Unlike transformers, which clamps a position outside
        the window to its length and ignores it (so start and end losses may average over different window counts,
        which breaks exact weighting across ranks), such a position is refused (ValueError naming the window, the
        position and the window length), as is a start after its end. Checked on the host before the forward pass.
        As in transformers, each softmax runs over every position of the padded window, so a window's loss depends
        slightly on how far its batch is padded (``answer`` masks padding, as the pipeline did).
        """
        return self._loss_and_logits(enc, labels)[0]

    def _loss_and_logits(self, enc: Mapping[str, Any], labels: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        enc = self._to_device(enc)
        windows, length = (int(n) for n in enc["input_ids"].shape)
        positions = _qa_items.check_positions(labels, windows, length).to(self._graph.device, non_blocking=True)
        start, end = self.forward(enc)
        loss = (F.cross_entropy(start.float(), positions[:, 0]) + F.cross_entropy(end.float(), positions[:, 1])) / 2
        if torch.is_grad_enabled():  # so N ranks weight it exactly (Graph.loss_items)
            self._graph.loss_items(windows, loss=loss)
        return loss, start, end

    def __call__(self, enc: Optional[Mapping[str, Any]] = None, /, start_positions: Any = None,
                 end_positions: Any = None, **inputs: Any) -> Any:
        """Run like a transformers model: ``head(**enc)`` or ``head(enc)``, optionally with ``start_positions`` and
        ``end_positions`` (``[W]`` each). Returns ``QuestionAnsweringModelOutput`` (``loss`` with positions)."""
        from transformers.modeling_outputs import QuestionAnsweringModelOutput

        if enc is not None and inputs:
            raise ValueError(f"got an encoding and keyword inputs {sorted(inputs)}: call head(**enc) or head(enc)")
        batch = dict(enc if enc is not None else inputs)
        unknown = sorted(set(batch) - set(self.input_names) - {"token_type_ids"})
        if unknown:
            raise ValueError(
                f"unknown model inputs {unknown}: a {type(self).__name__} takes {', '.join(self.input_names)} (and "
                "start_positions / end_positions)"
            )
        if (start_positions is None) != (end_positions is None):
            raise ValueError("give both start_positions and end_positions, or neither")
        if start_positions is None:
            start, end = self.forward(batch)
            return QuestionAnsweringModelOutput(start_logits=start, end_logits=end)
        labels = torch.stack([torch.as_tensor(start_positions).reshape(-1).cpu(),
                              torch.as_tensor(end_positions).reshape(-1).cpu()], dim=1)
        loss, start, end = self._loss_and_logits(batch, labels)
        return QuestionAnsweringModelOutput(loss=loss, start_logits=start, end_logits=end)

    def answer(self, question: Union[str, Sequence[str]], context: Union[str, Sequence[str]], top_k: int = 1,
               max_answer_len: int = 15, doc_stride: Optional[int] = None, handle_impossible_answer: bool = False,
               batch_size: int = 32) -> Any:
        """The answer(s) to ``question`` in ``context``: ``{"answer", "start", "end", "score"}`` (``start``/``end``:
        character offsets into the context), as transformers' ``question-answering`` pipeline chose them over all
        stride windows (see ``heads._qa_decode``; windows of ``max_length`` tokens, so a pipeline agrees up to 384).

        ``top_k`` 1 gives a dict, more a list of up to ``top_k`` dicts, best first (always a list: the pipeline
        returned a bare dict whenever it found a single answer); lists of questions and contexts give a list of
        those. ``handle_impossible_answer``: also consider the empty answer (CLS). Runs in eval mode
        without gradients and restores each module's train/eval mode afterwards.
        """
        single = isinstance(question, str)
        questions, contexts = _qa_items.check_pairs(question, context, "answer")
        for name, value in (("top_k", top_k), ("max_answer_len", max_answer_len), ("batch_size", batch_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} is invalid: use an integer >= 1")
        windows = self._windows(questions, contexts, doc_stride)
        per_sample: list[list[Any]] = [[] for _ in questions]
        module = self._graph.module
        modes = [(m, m.training) for m in module.modules()]
        module.eval()
        try:
            with torch.no_grad():
                for first in range(0, len(windows), batch_size):
                    rows = range(first, min(first + batch_size, len(windows)))
                    start, end = self.forward(self._pad(windows, rows))
                    start, end = start.float().cpu(), end.float().cpu()
                    for j, w in enumerate(rows):
                        ids = windows.inputs["input_ids"][w]
                        per_sample[windows.sample[w]].append(_qa_decode.window_candidates(
                            start[j, : len(ids)], end[j, : len(ids)], windows.encodings[w], ids,
                            self.tokenizer.cls_token_id, keep=2 * top_k + 10, max_answer_len=max_answer_len,
                        ))
        finally:
            for m, training in modes:
                m.training = training
        results = [
            _qa_decode.merge_answers(c, found, top_k=top_k, handle_impossible_answer=handle_impossible_answer)
            for c, found in zip(contexts, per_sample, strict=True)
        ]
        empty = {"score": 0.0, "start": 0, "end": 0, "answer": ""}  # only if every context probability underflowed
        shaped = [(r[0] if r else empty) if top_k == 1 else r for r in results]
        return shaped[0] if single else shaped

    # --- output -------------------------------------------------------------------------------------------
    def push_to_hub(self, repo_id: str, **kwargs: Any) -> Any:
        """Upload the model, tokenizer and a question-answering model card to ``repo_id`` (created if needed).

        Keywords: ``token``, ``private``, ``revision``, ``commit_message``, ``create_pr`` (``card=`` is refused: the
        classifier card does not fit). Refuses before writing anything when ``HF_HUB_OFFLINE`` is set or no token
        is available."""
        return _qa_card.push_qa_head(self, repo_id, **kwargs)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(max_length={self.max_length}, doc_stride={self.stride()}, "
            f"device={self._graph.device}, tokenizer={'yes' if self.tokenizer is not None else 'none'})"
        )
