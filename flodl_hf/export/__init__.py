"""HF-canonical model directories: write them atomically, re-save them, and verify them with transformers alone.

It exists to back one promise: a directory flodl-hf writes loads with plain ``transformers``
(``AutoModelForSequenceClassification`` / ``AutoTokenizer``) with zero missing and zero unexpected keys, and gives
the logits the flodl-hf head gives. This module never imports ``heads`` (the engine layer may not): a caller that
wants the logit comparison passes a ``head_loader`` (path -> head with ``encode`` and ``forward``). Verification
covers short sentences, texts of 2x and 5x the tokenizer's ``model_max_length`` and sentence pairs, because
``pipeline("text-classification", truncation=True)`` agrees with ``predict`` only when the saved tokenizer states
the length the model trained with (a head's ``save_pretrained`` and :func:`export_model_dir` both write it).
Pushing to the Hub lives in :mod:`flodl_hf.export.hub` (:func:`push_output_dir` is re-exported here). The other tasks'
directories (token classification, QA, masked LM) are verified by ``flodl_hf.export.verify_tasks`` with this report.

Output directories are built in a temporary sibling and renamed into place at the end
(:func:`flodl_hf.files.ownership.staged_output_dir`), so an interrupted run never leaves a half-written directory; a
non-empty directory not written by flodl-hf is never replaced.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

from ..files import ownership
from ..files.ownership import staged_output_dir
from ..quiet import quiet_transformers

__all__ = ["VerifyReport", "verify_model_dir", "export_model_dir", "MARKER_FILE", "DEFAULT_VERIFY_SENTENCES",
           "LONG_TEXT_FACTORS", "long_verify_texts", "recorded_settings", "trained_max_length", "push_output_dir"]

#: File that marks a directory as written by flodl-hf (its JSON has ``"generator": "flodl-hf"``).
MARKER_FILE = ownership.MARKER
_CARD_FILES = ("README.md", "metrics.json", "loss_curve.png")

DEFAULT_VERIFY_SENTENCES = (
    "I really enjoyed this, it was wonderful.",
    "This is the worst thing I have ever bought.",
    "The meeting is scheduled for Tuesday at noon.",
    "Not bad at all, though the ending felt rushed.",
)
LONG_TEXT_FACTORS = (2, 5)
"""Long verify texts are this many times the tokenizer's ``model_max_length``."""
NO_MAX_LENGTH = 10**8
"""A ``model_max_length`` at or above this is transformers' "not set" (1e30)."""


# --- verification -------------------------------------------------------------------------------------------

@dataclass
class VerifyReport:
    """Outcome of :func:`verify_model_dir`; ``ok`` is True only when every check passed."""

    path: str
    model_type: str = ""
    num_labels: int = 0
    labels: list = field(default_factory=list)
    missing_keys: list = field(default_factory=list)
    unexpected_keys: list = field(default_factory=list)
    mismatched_keys: list = field(default_factory=list)
    max_abs_diff: Optional[float] = None
    """Largest |transformers logit - head logit| over the test sentences (None: no head was compared)."""
    tokens_match: Optional[bool] = None
    sentences: list = field(default_factory=list)
    checks: list = field(default_factory=list)
    """Names of the input sets compared (sentences, long texts, sentence pairs, long sentence pairs)."""
    problems: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        """A few lines for a terminal."""
        lines = [f"{'OK' if self.ok else 'FAILED'}: {self.path}",
                 f"  model_type={self.model_type or '?'} num_labels={self.num_labels} labels={self.labels}",
                 f"  missing_keys={len(self.missing_keys)} unexpected_keys={len(self.unexpected_keys)} "
                 f"mismatched_keys={len(self.mismatched_keys)}"]
        if self.max_abs_diff is not None:
            lines.append(f"  head vs transformers on {', '.join(self.checks) or 'sentences'}: max_abs_diff="
                         f"{self.max_abs_diff:.3g} tokens_match={self.tokens_match}")
        lines.extend(f"  problem: {p}" for p in self.problems)
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"path": self.path, "ok": self.ok, "model_type": self.model_type, "num_labels": self.num_labels,
                "labels": self.labels, "missing_keys": self.missing_keys, "unexpected_keys": self.unexpected_keys,
                "mismatched_keys": self.mismatched_keys, "max_abs_diff": self.max_abs_diff,
                "tokens_match": self.tokens_match, "checks": self.checks, "problems": self.problems}


def _listing(keys: Sequence[str], limit: int = 5) -> str:
    keys = list(keys)
    more = f" (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def verify_model_dir(path: Union[str, Path], *, head_loader: Optional[Callable[[str], Any]] = None,
                     sentences: Sequence[str] = DEFAULT_VERIFY_SENTENCES, atol: float = 0.0,
                     long_texts: bool = True, pairs: bool = True) -> VerifyReport:
    """Load ``path`` with transformers alone and check it is a complete sequence classifier.

    Checks: config, weights and tokenizer load; zero missing / unexpected / mismatched keys; ``id2label`` covers
    every output; the logits are finite with one column per label. Inputs: ``sentences``; with ``long_texts``,
    texts of 2x and 5x the tokenizer's ``model_max_length`` (which must be set, so that ``pipeline(...,
    truncation=True)`` cuts them where training did); with ``pairs``, sentence pairs, short and long. With
    ``head_loader`` (e.g. ``AutoHeadForSequenceClassification.from_pretrained``), also compares the head's token ids
    and logits with transformers' on every input and requires ``max_abs_diff <= atol`` (0.0 on CPU fp32: the same
    weights, the same math).
    """
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = Path(path)
    report = VerifyReport(path=str(path), sentences=list(sentences))
    if not path.is_dir():
        raise FileNotFoundError(f"model directory not found: {path}")
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} is not a model directory (no config.json): give a directory written by "
                         "flodl-hf train / export or save_pretrained")
    try:
        # ignore_mismatched_sizes: a wrong shape is reported below by key instead of aborting the load.
        with quiet_transformers():
            model, info = AutoModelForSequenceClassification.from_pretrained(str(path), output_loading_info=True,
                                                                             ignore_mismatched_sizes=True)
            tokenizer = AutoTokenizer.from_pretrained(str(path))
    except Exception as exc:  # noqa: BLE001 - any loading failure is the verdict, reported in one line
        report.problems.append(f"transformers could not load it: {type(exc).__name__}: {exc}")
        return report
    from ..preflight import TOKENIZER_FILES

    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        report.problems.append("no tokenizer files (tokenizer.json, vocab.txt, ...): transformers built an empty or "
                               "default tokenizer")
    model.eval()
    _check_keys_and_labels(report, model, info)
    cases = _verify_cases(report, tokenizer, list(sentences), long_texts, pairs)
    if not cases:
        return report
    head = _load_head(report, head_loader, str(path)) if head_loader is not None else None
    diffs: list[float] = []
    for name, texts, text_pairs in cases:
        _check_case(report, name, texts, text_pairs, tokenizer, model, head, atol, diffs)
    if head is not None and diffs:
        report.max_abs_diff = max(diffs)
        if report.tokens_match is None:
            report.tokens_match = True
    return report


def _check_keys_and_labels(report: VerifyReport, model: Any, info: dict) -> None:
    config = model.config
    report.model_type = str(getattr(config, "model_type", ""))
    report.num_labels = int(config.num_labels)
    id2label = dict(getattr(config, "id2label", {}) or {})
    report.labels = [id2label.get(i, id2label.get(str(i), f"<missing {i}>")) for i in range(report.num_labels)]
    report.missing_keys = sorted(info.get("missing_keys", []))
    report.unexpected_keys = sorted(info.get("unexpected_keys", []))
    report.mismatched_keys = sorted(str(k[0]) if isinstance(k, tuple) else str(k)
                                    for k in info.get("mismatched_keys", []))
    if report.missing_keys:
        report.problems.append(f"{len(report.missing_keys)} missing key(s), freshly initialised by transformers: "
                               f"{_listing(report.missing_keys)}")
    if report.unexpected_keys:
        report.problems.append(f"{len(report.unexpected_keys)} unexpected key(s) ignored by transformers: "
                               f"{_listing(report.unexpected_keys)}")
    if report.mismatched_keys:
        report.problems.append(f"{len(report.mismatched_keys)} key(s) with the wrong shape: "
                               f"{_listing(report.mismatched_keys)}")
    if any(label.startswith("<missing") for label in report.labels):
        report.problems.append(f"config.id2label does not name every one of the {report.num_labels} outputs")


def long_verify_texts(tokenizer: Any, sentences: Sequence[str], limit: int,
                      factors: Sequence[int] = LONG_TEXT_FACTORS) -> list[str]:
    """Texts of about ``factor * limit`` tokens each (the sentences repeated), to check truncation."""
    base = " ".join(sentences) or "text"
    per_copy = max(1, len(tokenizer(base, add_special_tokens=False)["input_ids"]))
    return [" ".join([base] * (-(-factor * limit // per_copy))) for factor in factors]


def _verify_cases(report: VerifyReport, tokenizer: Any, sentences: list[str], long_texts: bool,
                  pairs: bool) -> list[tuple[str, list[str], Optional[list[str]]]]:
    """The named inputs to check: ``(name, texts, text_pairs or None)``."""
    if not sentences:
        return []
    cases: list[tuple[str, list[str], Optional[list[str]]]] = [("sentences", sentences, None)]
    long: list[str] = []
    if long_texts:
        limit = getattr(tokenizer, "model_max_length", None)
        if not isinstance(limit, int) or limit >= NO_MAX_LENGTH:
            report.problems.append(
                "the tokenizer has no model_max_length, so pipeline(..., truncation=True) does not truncate long "
                "texts as training did: re-save it with a flodl-hf head's save_pretrained, or run "
                "`flodl-hf export` on a flodl-hf output (it takes max_length from metrics.json)")
        else:
            long = long_verify_texts(tokenizer, sentences, limit)
            cases.append((f"long texts ({', '.join(f'{f}x' for f in LONG_TEXT_FACTORS)} model_max_length)", long,
                          None))
    if pairs:
        second = sentences[1:] + sentences[:1]
        cases.append(("sentence pairs", sentences, second))
        if long:
            cases.append(("long sentence pairs", long, [sentences[0]] * len(long)))
    report.checks = [name for name, _, _ in cases]
    return cases


def _load_head(report: VerifyReport, head_loader: Callable[[str], Any], path: str) -> Any:
    try:
        head = head_loader(path)
        _eval_mode(head)
        return head
    except Exception as exc:  # noqa: BLE001 - reported as a failed check
        report.problems.append(f"the flodl-hf head could not load or run it: {type(exc).__name__}: {exc}")
        return None


def _check_case(report: VerifyReport, name: str, texts: list[str], text_pairs: Optional[list[str]],
                tokenizer: Any, model: Any, head: Any, atol: float, diffs: list[float]) -> None:
    """transformers alone on one input set (what ``pipeline(..., truncation=True)`` computes), then the head."""
    import torch

    try:
        with torch.no_grad():
            enc = tokenizer(texts, text_pairs, padding=True, truncation=True, return_tensors="pt")
            logits = model(**enc).logits.float()
    except Exception as exc:  # noqa: BLE001 - e.g. an index error past the model's positions
        report.problems.append(f"{name}: transformers could not run them: {type(exc).__name__}: {exc}")
        return
    if tuple(logits.shape) != (len(texts), report.num_labels):
        report.problems.append(f"{name}: logits have shape {tuple(logits.shape)}, expected "
                               f"({len(texts)}, {report.num_labels})")
    if not torch.isfinite(logits).all():
        report.problems.append(f"{name}: the logits contain NaN or infinity")
    if head is not None:
        _compare_with_head(report, name, head, texts, text_pairs, enc, model, atol, diffs)


def _compare_with_head(report: VerifyReport, name: str, head: Any, texts: list[str],
                       text_pairs: Optional[list[str]], enc: Any, model: Any, atol: float,
                       diffs: list[float]) -> None:
    """Token ids (unpadded) must match transformers' tokenizer; logits must match transformers' model run on the
    head's own encoding (so padding choices cannot blur a weight difference)."""
    import torch

    try:
        with torch.no_grad():
            head_enc = head.encode(texts) if text_pairs is None else head.encode(texts, text_pairs)
            head_logits = head.forward(head_enc)
            head_logits = getattr(head_logits, "logits", head_logits).detach().float().cpu()
            inputs = {k: v.cpu() for k, v in dict(head_enc).items() if torch.is_tensor(v)}
            logits = model(**inputs).logits.float()
    except Exception as exc:  # noqa: BLE001 - reported as a failed check
        report.problems.append(f"{name}: the flodl-hf head could not run them: {type(exc).__name__}: {exc}")
        return
    if _same_tokens(inputs, enc) is False:
        report.tokens_match = False
        head_limit = getattr(head, "max_length", None)
        hint = ""
        if "long" in name and head_limit is not None:
            hint = (f" (the head truncates to max_length={head_limit}; is the tokenizer's model_max_length the "
                    "same? re-export with flodl-hf to save it)")
        report.problems.append(f"{name}: the head's tokenizer and transformers' AutoTokenizer give different token "
                               f"ids{hint}")
    if head_logits.shape != logits.shape:
        report.problems.append(f"{name}: head logits have shape {tuple(head_logits.shape)}, transformers' "
                               f"{tuple(logits.shape)}")
        return
    diff = float((head_logits - logits).abs().max())
    diffs.append(diff)
    if math.isnan(diff) or not diff <= atol:
        report.problems.append(f"{name}: head and transformers logits differ by up to {diff:.3g} (allowed {atol:g})")


def _eval_mode(head: Any) -> None:
    """Switch a head to eval mode (no dropout): its graph's module, or the head itself if it is a module."""
    graph = getattr(head, "graph", None)
    if callable(graph):
        graph().module.eval()
    elif hasattr(head, "eval"):
        head.eval()


def _same_tokens(head_enc: dict, enc: Any) -> Optional[bool]:
    """Compare the unpadded token ids of two encodings of the same sentences (None: nothing to compare)."""
    if "input_ids" not in head_enc:
        return None
    ours, theirs = head_enc["input_ids"], enc["input_ids"]
    our_mask = head_enc.get("attention_mask")
    their_mask = enc["attention_mask"]
    for row in range(theirs.shape[0]):
        a = ours[row] if our_mask is None else ours[row][our_mask[row].bool()]
        b = theirs[row][their_mask[row].bool()]
        if a.shape != b.shape or not bool((a == b).all()):
            return False
    return True


# --- export ---------------------------------------------------------------------------------------------------

def export_model_dir(source: Union[str, Path], output: Union[str, Path], *, overwrite: bool = False,
                     tokenizer: Optional[Union[str, Path]] = None, max_length: Optional[int] = None,
                     model_class: Any = None) -> Path:
    """Re-save ``source`` HF-canonically into ``output``: load it with transformers and ``save_pretrained`` the
    model (safetensors) and tokenizer; the card, metrics and loss curve are copied along. Written atomically.

    The tokenizer's ``model_max_length`` becomes ``max_length``; None: the ``max_length`` the flodl-hf run trained
    with (``metrics.json``), else the tokenizer's own. So ``pipeline(..., truncation=True)`` on the export truncates
    like ``flodl-hf predict``. A copied card's metadata is brought to the Hub conventions of ``flodl_hf.export.cards``.

    A ``source`` without tokenizer files is refused unless ``tokenizer`` names a directory to take it from (an
    export with an empty tokenizer would load and give meaningless predictions). ``model_class``: the transformers
    Auto class to load and re-save with (None: ``AutoModelForSequenceClassification``; the CLI passes another
    task's, see ``flodl_hf.export.verify_tasks.auto_model_class``). On N ranks every rank may call it: rank 0
    writes and the others wait until ``output`` is complete."""
    from ..distributed.main_writes import written_by_main

    return written_by_main(output, lambda: _export_model_dir(source, output, overwrite, tokenizer, max_length,
                                                             model_class))


def _export_model_dir(source: Union[str, Path], output: Union[str, Path], overwrite: bool,
                      tokenizer: Optional[Union[str, Path]], max_length: Optional[int], model_class: Any) -> Path:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model_class = AutoModelForSequenceClassification if model_class is None else model_class

    from ..preflight import check_model_dir

    source = Path(source)
    check_model_dir(source, tokenizer=tokenizer is None)
    if Path(output).resolve() == source.resolve():
        raise ValueError(f"--output {output} is the model directory itself: choose a new directory")
    with quiet_transformers():
        model, info = model_class.from_pretrained(str(source), output_loading_info=True)
    missing = sorted(info.get("missing_keys", []))
    if missing:
        raise ValueError(f"{source} lacks weights for {len(missing)} key(s) ({_listing(missing)}): an export would "
                         "save freshly initialised values; run `flodl-hf verify` on it for details")
    if max_length is None:
        max_length = trained_max_length(source)
    elif not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 2:
        raise ValueError(f"max_length={max_length!r} is invalid: use an integer >= 2 (tokens per text, special "
                         "tokens included), or None for the one training used")
    with quiet_transformers():
        loaded_tokenizer = AutoTokenizer.from_pretrained(str(tokenizer if tokenizer is not None else source))
    if max_length is not None:
        loaded_tokenizer.model_max_length = max_length
    with staged_output_dir(output, overwrite=overwrite, option="--output") as staging, quiet_transformers():
        model.save_pretrained(str(staging))
        loaded_tokenizer.save_pretrained(str(staging))
        for name in _CARD_FILES:
            if (source / name).is_file():
                shutil.copy2(source / name, staging / name)
        if (staging / "README.md").is_file():
            _upgrade_card(staging / "README.md")
    return Path(output)


def recorded_settings(directory: Union[str, Path]) -> dict:
    """The settings a flodl-hf run recorded in ``directory/metrics.json`` ({} without a readable record); a
    ``metrics.json`` that is not a sane file (``flodl_hf.files.reader``) is refused, naming ``--model``."""
    from ..files.reader import RefusedFile, read_json

    try:
        settings = read_json(Path(directory) / "metrics.json", "--model").get("settings")
    except RefusedFile:
        raise
    except (OSError, ValueError, AttributeError):
        return {}
    return settings if isinstance(settings, dict) else {}


def trained_max_length(directory: Union[str, Path]) -> Optional[int]:
    """The ``max_length`` a flodl-hf run trained with, from ``directory/metrics.json`` (None when not recorded)."""
    value = recorded_settings(directory).get("max_length")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 2 else None


def _upgrade_card(path: Path) -> None:
    """Bring a copied card to the current metadata conventions; a card that does not parse is copied as is."""
    from .cards import upgrade_card_metadata

    try:
        upgrade_card_metadata(path)
    except Exception:  # noqa: BLE001 - a user's hand-written card: leave it untouched rather than fail the export
        return


def push_output_dir(path: Union[str, Path], repo_id: str, **kwargs: Any) -> Any:
    """Upload a model directory to the Hub repository ``repo_id``: see :func:`flodl_hf.export.hub.push_output_dir`
    (keywords ``token``, ``private``, ``revision``, ``commit_message``, ``create_pr``) and
    :func:`flodl_hf.export.hub.plan_push` for what is sent."""
    from .hub import push_output_dir as push

    return push(path, repo_id, **kwargs)
