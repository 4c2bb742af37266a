"""``flodl-hf verify`` of a token-classification, question-answering or masked-LM model directory.

It exists so that the export promise of the text classifier (:func:`flodl_hf.export.verify_model_dir`) holds for
the other three heads too: the directory loads in plain transformers (``AutoModelFor{TokenClassification,
QuestionAnswering,MaskedLM}``) with zero missing, unexpected and mismatched keys; a masked LM whose config ties
the decoder to the word embeddings loads tied (transformers unties them, with only a log warning, when the file
holds a decoder that differs from the embeddings); the head's logits equal transformers' on the head's own
encoding of short texts and of texts 2x and 5x its ``max_length`` (truncated, or cut into stride windows for QA,
as the head does); and the task's prediction equals transformers' pipeline: ``pipeline("token-classification",
aggregation_strategy="simple")`` against ``head.tag``, ``pipeline("fill-mask")`` (``tokenizer_kwargs={"truncation":
True}``: it does not cut texts otherwise) against ``head.fill_mask``, on short and over-long texts.
transformers 5 has no question-answering pipeline, so for QA the check is the logits ``head.answer`` decodes:
the head's windows (question first, context cut into stride windows) are re-tokenised by ``AutoTokenizer`` and
run through ``AutoModelForQuestionAnswering``; token ids and start/end logits must be equal.

The task comes from ``config.json`` ``architectures`` (:mod:`flodl_hf.export.tasks`); the head comes from
``head_loader`` (the CLI's: this package never imports ``heads``). The report is :class:`flodl_hf.export.VerifyReport`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

from . import DEFAULT_VERIFY_SENTENCES, LONG_TEXT_FACTORS, NO_MAX_LENGTH, VerifyReport, long_verify_texts
from . import _check_keys_and_labels, _load_head  # noqa: PLC2701 - the same checks, the same lines
from ..quiet import quiet_transformers
from .tasks import FILL_MASK, QUESTION_ANSWERING, TOKEN_CLASSIFICATION

__all__ = ["VERIFIED_TASKS", "auto_model_class", "verify_task_dir", "PIPELINE_SCORE_TOLERANCE"]

VERIFIED_TASKS = (TOKEN_CLASSIFICATION, QUESTION_ANSWERING, FILL_MASK)
_AUTO_MODELS = {TOKEN_CLASSIFICATION: "AutoModelForTokenClassification",
                QUESTION_ANSWERING: "AutoModelForQuestionAnswering", FILL_MASK: "AutoModelForMaskedLM"}
PIPELINE_SCORE_TOLERANCE = 1e-5
"""Pipeline scores (softmax probabilities) may differ by this much: the same logits, a different reduction order."""
_QUESTION = "what was it like"


def auto_model_class(task: str) -> Any:
    """transformers' ``AutoModelFor...`` class of ``task`` (one of :data:`VERIFIED_TASKS`)."""
    import transformers

    if task not in _AUTO_MODELS:
        raise ValueError(f"task {task!r} has no task verification: use one of {', '.join(VERIFIED_TASKS)}")
    return getattr(transformers, _AUTO_MODELS[task])


def verify_task_dir(path: Union[str, Path], task: str, *, head_loader: Optional[Callable[[str], Any]] = None,
                    sentences: Sequence[str] = DEFAULT_VERIFY_SENTENCES, atol: float = 0.0) -> VerifyReport:
    """Load ``path`` (a ``task`` model) with transformers alone and, given ``head_loader`` (path -> head), compare
    the head's logits and predictions with transformers' (see the module docstring). ``ok`` only if all pass."""
    from transformers import AutoTokenizer

    path = Path(path)
    report = VerifyReport(path=str(path), sentences=list(sentences))
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} is not a model directory (no config.json): give a directory written by "
                         "flodl-hf train / export or save_pretrained")
    try:
        with quiet_transformers():
            model, info = auto_model_class(task).from_pretrained(str(path), output_loading_info=True,
                                                                 ignore_mismatched_sizes=True)
            tokenizer = AutoTokenizer.from_pretrained(str(path))
    except Exception as exc:  # noqa: BLE001 - any loading failure is the verdict, reported in one line
        report.problems.append(f"transformers could not load it as a {task} model: {type(exc).__name__}: {exc}")
        return report
    model.eval()
    _check_keys_and_labels(report, model, info)
    if task != TOKEN_CLASSIFICATION:
        report.num_labels, report.labels = (2, ["start", "end"]) if task == QUESTION_ANSWERING else (0, [])
        report.problems = [p for p in report.problems if not p.startswith("config.id2label")]
    if task == FILL_MASK:
        _check_tie(report, model)
    if head_loader is None or not sentences:
        return report
    head = _load_head(report, head_loader, str(path))
    if head is None:
        return report
    cases = [("sentences", list(sentences))]
    try:
        _model_max_length(tokenizer)
    except ValueError as exc:  # the pipeline would run long texts past the model's positions: short ones only
        report.problems.append(str(exc))
    else:
        with quiet_transformers():  # "sequence longer than the maximum": these texts are meant to be
            long = long_verify_texts(tokenizer, list(sentences), int(head.max_length))
        cases.append((f"long texts ({', '.join(f'{f}x' for f in LONG_TEXT_FACTORS)} max_length)", long))
    report.checks = [name for name, _ in cases]
    diffs: list[float] = []
    checks = {TOKEN_CLASSIFICATION: _check_tagger, QUESTION_ANSWERING: _check_qa, FILL_MASK: _check_mlm}[task]
    for name, texts in cases:
        _run(report, name, lambda t=texts: checks(report, head, model, tokenizer, t, diffs, atol))
    report.checks.append({TOKEN_CLASSIFICATION: "pipeline token-classification (simple) = head.tag",
                          FILL_MASK: "pipeline fill-mask (truncation=True) = head.fill_mask",
                          QUESTION_ANSWERING: "answer windows (no QA pipeline in transformers 5)"}[task])
    texts = [text for _, case in cases for text in case]
    _run(report, report.checks[-1], lambda: _round_trip(report, task, head, model, path, texts))
    if diffs:
        report.max_abs_diff = max(diffs)
        if report.tokens_match is None and task != TOKEN_CLASSIFICATION:  # the tagger's ids: see the pipeline
            report.tokens_match = True
    return report


def _run(report: VerifyReport, name: str, check: Callable[[], None]) -> None:
    try:
        with quiet_transformers():
            check()
    except Exception as exc:  # noqa: BLE001 - one failed check is one line of the report
        report.problems.append(f"{name}: could not run: {type(exc).__name__}: {exc}")


def _check_tie(report: VerifyReport, model: Any) -> None:
    """Tied the transformers way: with ``tie_word_embeddings`` the loaded decoder IS the embedding matrix."""
    if not getattr(model.config, "tie_word_embeddings", True):
        return
    out, emb = model.get_output_embeddings(), model.get_input_embeddings()
    if out is not None and out.weight is not emb.weight:
        report.problems.append("the masked-LM decoder is not tied to the word embeddings although "
                               "config.tie_word_embeddings is true (the file holds a decoder weight that differs "
                               "from the embeddings, so transformers left them untied): re-save it with a flodl-hf "
                               "head's save_pretrained, or set tie_word_embeddings false in config.json")


def _compare(report: VerifyReport, name: str, ours: Any, theirs: Any, diffs: list[float], atol: float) -> None:
    ours, theirs = ours.detach().float().cpu(), theirs.detach().float().cpu()
    if ours.shape != theirs.shape:
        report.problems.append(f"{name}: head logits have shape {tuple(ours.shape)}, transformers' "
                               f"{tuple(theirs.shape)}")
        return
    diff = float((ours - theirs).abs().max()) if ours.numel() else 0.0
    diffs.append(diff)
    if math.isnan(diff) or not diff <= atol:
        report.problems.append(f"{name}: head and transformers logits differ by up to {diff:.3g} (allowed {atol:g})")


def _inputs(enc: Any) -> dict:
    import torch

    return {k: v.cpu() for k, v in dict(enc).items() if torch.is_tensor(v)}


def _check_tagger(report: VerifyReport, head: Any, model: Any, tokenizer: Any, texts: list[str],
                  diffs: list[float], atol: float) -> None:
    import torch

    with torch.no_grad():
        enc = head.encode(texts)
        _compare(report, "token logits", head.forward(enc), model(**_inputs(enc)).logits, diffs, atol)


def _check_mlm(report: VerifyReport, head: Any, model: Any, tokenizer: Any, texts: list[str],
               diffs: list[float], atol: float) -> None:
    import torch

    with torch.no_grad():
        enc = head.encode(texts)
        theirs = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")  # as the pipeline cuts
        _same_ids(report, "masked-LM inputs", enc, theirs, head.max_length)
        _compare(report, "masked-LM logits", head.forward(enc), model(**_inputs(enc)).logits, diffs, atol)


def _check_qa(report: VerifyReport, head: Any, model: Any, tokenizer: Any, texts: list[str],
              diffs: list[float], atol: float) -> None:
    """The windows ``head.answer`` decodes: re-tokenised by AutoTokenizer, run through the transformers model."""
    import torch

    questions = [_QUESTION] * len(texts)
    with torch.no_grad():
        enc = head.encode(questions, texts)
        limit = min(_model_max_length(tokenizer, head.max_length), 384)  # transformers 4's QA pipeline windows
        theirs = tokenizer(questions, texts, truncation="only_second", max_length=limit, stride=min(limit // 2, 128),
                           return_overflowing_tokens=True, padding=True, return_tensors="pt")
        _same_ids(report, "question-answering windows", enc, theirs, head.max_length)
        start, end = head.forward(enc)
        out = model(**_inputs(enc))
        _compare(report, "start logits", start, out.start_logits, diffs, atol)
        _compare(report, "end logits", end, out.end_logits, diffs, atol)


def _model_max_length(tokenizer: Any, default: Optional[int] = None) -> int:
    """The saved tokenizer's ``model_max_length`` (``default``, or ValueError, when it states none)."""
    limit = getattr(tokenizer, "model_max_length", None)
    if not isinstance(limit, int) or limit >= NO_MAX_LENGTH:
        if default is not None:
            return default
        raise ValueError("the tokenizer has no model_max_length, so transformers' pipeline does not cut long texts "
                         "where the head does: re-save it with a flodl-hf head's save_pretrained, or run `flodl-hf "
                         "export` on a flodl-hf output (it takes max_length from metrics.json)")
    return limit


def _same_ids(report: VerifyReport, name: str, ours: Any, theirs: Any, limit: int) -> None:
    """The unpadded token ids of the head's encoding equal AutoTokenizer's, row by row."""
    a_ids, b_ids = ours["input_ids"].cpu(), theirs["input_ids"]
    a_mask, b_mask = ours["attention_mask"].cpu().bool(), theirs["attention_mask"].bool()
    same = a_ids.shape[0] == b_ids.shape[0] and all(
        a_ids[i][a_mask[i]].tolist() == b_ids[i][b_mask[i]].tolist() for i in range(b_ids.shape[0]))
    if not same and report.tokens_match is not False:  # one line, however many input sets differ
        report.tokens_match = False
        report.problems.append(f"{name}: the head's token ids differ from transformers' AutoTokenizer's (the head "
                               f"cuts at max_length={limit}, the pipeline at the saved tokenizer's model_max_length: "
                               "re-save it with the head's save_pretrained, or `flodl-hf export` with the length "
                               "training used)")


def _round_trip(report: VerifyReport, task: str, head: Any, model: Any, path: Path, texts: list[str]) -> None:
    """The task's prediction: transformers' pipeline on the directory equals the head's (scores within
    :data:`PIPELINE_SCORE_TOLERANCE`)."""
    from transformers import pipeline

    if task == QUESTION_ANSWERING:
        answers = head.answer([_QUESTION] * len(texts), texts)
        bad = [a for a, c in zip(answers, texts) if a["answer"] != c[a["start"]:a["end"]]]
        if bad:
            report.problems.append(f"head.answer: answer {bad[0]['answer']!r} is not its context's characters "
                                   f"{bad[0]['start']}..{bad[0]['end']}")
        return
    with quiet_transformers():
        pipe = pipeline(task, model=str(path), device="cpu")
    if task == TOKEN_CLASSIFICATION:
        ours, theirs = head.tag(texts, aggregation_strategy="simple"), pipe(texts, aggregation_strategy="simple")
        what = "pipeline(\"token-classification\", aggregation_strategy=\"simple\") and head.tag"
    else:
        mask = head.tokenizer.mask_token
        texts = [f"{' '.join(t.split()[:3])} {mask} {' '.join(t.split()[3:])}" for t in texts]
        ours = head.fill_mask(texts, top_k=5)
        theirs = [pipe(t, top_k=5, tokenizer_kwargs={"truncation": True}) for t in texts]
        what = "pipeline(\"fill-mask\", truncation) and head.fill_mask"
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if not _same_predictions(a, b):
            j = next((j for j, (x, y) in enumerate(zip(a, b)) if not _same_predictions([x], [y])), min(len(a), len(b)))
            report.problems.append(f"{what} disagree on text {i} ({texts[i][:40]!r}) from entry {j}: "
                                   f"{_short(a[j:])} vs {_short(b[j:])}{_length_hint(head)}")
            return


def _same_predictions(ours: list, theirs: list) -> bool:
    if len(ours) != len(theirs):
        return False
    for a, b in zip(ours, theirs):
        if {k: v for k, v in a.items() if k != "score"} != {k: v for k, v in b.items() if k != "score"}:
            return False
        if not abs(float(a["score"]) - float(b["score"])) <= PIPELINE_SCORE_TOLERANCE:
            return False
    return True


def _short(found: list) -> str:
    """The first entries of a prediction, e.g. ``[movie 0-5 0.213, ...]``."""
    shown = [f"{e.get('word', e.get('token_str', '?'))!s}" + (f" {e['start']}-{e['end']}" if "start" in e else "")
             + f" {float(e.get('score', 0.0)):.3f}" for e in found[:3]]
    return "[" + ", ".join(shown) + (", ..." if len(found) > 3 else "") + "]"


def _length_hint(head: Any) -> str:
    limit = getattr(getattr(head, "tokenizer", None), "model_max_length", None)
    if limit == head.max_length:
        return ""
    return (f" (the head cuts texts at max_length={head.max_length}, the saved tokenizer's model_max_length is "
            f"{limit}: `flodl-hf export` re-saves it with the length training used)")
