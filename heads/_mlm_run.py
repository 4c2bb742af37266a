"""Running a masked-LM head: its inputs and labels checked, ``head(**enc)``, ``fill_mask``, ``perplexity``, the push.

It exists to keep ``heads.masked_lm`` to the head's surface while each behaviour is written once: collate items
and label tensors are checked with messages naming the index and the fix; ``fill_mask`` reproduces
``transformers.pipeline("fill-mask")``'s postprocessing (scores, tokens, decoded sequences, one list per mask);
``perplexity`` sums the masked cross-entropy over fixed masks; ``push`` writes a fill-mask model card.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import torch

from . import _inputs, _mlm_mask

__all__ = ["item_texts", "check_labels", "call_output", "fill_mask", "perplexity", "write_card", "push",
           "PIPELINE_TAG"]

PIPELINE_TAG = "fill-mask"


def item_texts(items: Sequence[Any]) -> list[str]:
    """The texts of collate items: strings, or dicts with ``text``; a label is refused (a masked LM makes its own)."""
    if isinstance(items, (str, bytes)):
        raise ValueError("collate takes a list of items, got a single string: wrap it in a list")
    texts = []
    for i, item in enumerate(items):
        if isinstance(item, Mapping):
            if "text" not in item:
                raise ValueError(f"item at index {i} has keys {sorted(item)} but no 'text': give a dict with 'text'")
            extra = sorted({"label", "labels", "text_pair"} & set(item))
            if extra:
                raise ValueError(
                    f"item at index {i} has {extra}: a masked-LM item is one text (collate masks it and makes the "
                    "labels); drop those keys"
                )
            item = item["text"]
        if not isinstance(item, str):
            raise ValueError(
                f"item at index {i} is {type(item).__name__} ({item!r:.60}): a masked-LM item is a string or a "
                "dict with 'text'"
            )
        texts.append(item)
    return texts


def check_labels(labels: Any, shape: tuple[int, ...], vocab_size: int) -> torch.Tensor:
    """``labels`` as an integer tensor of ``shape`` whose values are token ids in ``[0, vocab_size)`` or -100."""
    labels = torch.as_tensor(labels)
    if labels.dtype.is_floating_point or labels.dtype == torch.bool or labels.is_complex():
        raise ValueError(f"masked-LM labels have dtype {labels.dtype}: give integer token ids (-100: not predicted)")
    if tuple(labels.shape) != shape:
        raise ValueError(
            f"masked-LM labels have shape {list(labels.shape)} but input_ids {list(shape)}: give one label per "
            "token (the labels collate returns with this encoding)"
        )
    labels = labels.cpu() if labels.device.type != "cpu" else labels
    bad = (labels != _mlm_mask.IGNORE_INDEX) & ((labels < 0) | (labels >= vocab_size))
    if bool(bad.any()):
        where = [int(i) for i in bad.nonzero()[0]]
        raise ValueError(
            f"masked-LM label {int(labels[tuple(where)])} at {where} is not a token id: use 0..{vocab_size - 1} "
            "(the vocabulary) or -100 for a token that is not predicted"
        )
    return labels.long()


def call_output(head: Any, enc: Optional[Mapping[str, Any]], labels: Any, inputs: dict[str, Any]) -> Any:
    """``MaskedLMOutput(logits=..., loss=...)`` for ``head(enc)`` or ``head(**inputs)``."""
    from transformers.modeling_outputs import MaskedLMOutput

    if enc is not None and inputs:
        raise ValueError(f"got an encoding and keyword inputs {sorted(inputs)}: call head(**enc) or head(enc)")
    if enc is not None and not isinstance(enc, Mapping):
        raise ValueError(f"head(...) got a {type(enc).__name__}: pass the dict that encode()/collate() returns")
    batch = dict(enc) if enc is not None else dict(inputs)
    if labels is None:
        labels = batch.get("labels")
    batch.pop("labels", None)
    unknown = sorted(set(batch) - set(head.input_names) - {"token_type_ids"})
    if unknown:
        raise ValueError(
            f"unknown model inputs {unknown}: a {type(head).__name__} takes {', '.join(head.input_names)} (and "
            "labels)"
        )
    if labels is None:
        return MaskedLMOutput(logits=head.forward(batch))
    loss, logits = head._loss_and_logits(batch, labels)
    return MaskedLMOutput(loss=loss, logits=logits)


class _EvalMode:
    """Eval mode without gradients for the block; every module's mode restored afterwards."""

    def __init__(self, head: Any) -> None:
        self.module = head.graph().module

    def __enter__(self) -> None:
        self.modes = [(m, m.training) for m in self.module.modules()]
        self.module.eval()
        self.no_grad = torch.no_grad()
        self.no_grad.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.no_grad.__exit__(*exc)
        for m, training in self.modes:
            m.training = training


def _check_positive(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}={value!r} is invalid: use an integer >= 1")
    return value


def _fill_one(tokenizer: Any, ids: torch.Tensor, logits: torch.Tensor, masks: torch.Tensor, top_k: int) -> Any:
    """The pipeline's postprocess for one text: ``ids`` its real tokens, ``logits`` theirs, ``masks`` positions."""
    probs = logits[masks].float().softmax(dim=-1)
    values, predictions = probs.topk(min(top_k, probs.shape[-1]))
    single = len(masks) == 1
    pad = tokenizer.pad_token_id
    result = []
    for i, (row_values, row_predictions) in enumerate(zip(values.tolist(), predictions.tolist())):
        row = []
        for score, token in zip(row_values, row_predictions):
            tokens = ids.clone()
            tokens[masks[i]] = token
            if pad is not None:
                tokens = tokens[tokens != pad]
            sequence = tokenizer.decode(tokens.tolist(), skip_special_tokens=single)
            row.append({"score": score, "token": token, "token_str": tokenizer.decode([token]), "sequence": sequence})
        result.append(row)
    return result[0] if single else result


def _no_mask(text: str, index: int, mask: str, max_length: int) -> None:
    cut = f" within its first {max_length} tokens (the head's max_length)" if mask in text else ""
    raise ValueError(
        f"fill_mask text at index {index} ({text!r:.80}) has no mask token {mask!r}{cut}: write {mask} where a "
        f"word should be predicted, e.g. 'the movie was {mask}'"
    )


def fill_mask(head: Any, text_or_texts: Union[str, Sequence[str]], top_k: int, batch_size: int = 32) -> list[Any]:
    """What ``head.fill_mask`` returns (see its docstring)."""
    single = isinstance(text_or_texts, str)
    texts = [text_or_texts] if single else _inputs.check_texts(text_or_texts, "fill_mask")
    top_k = _check_positive(top_k, "top_k")
    tokenizer = head._require_tokenizer()
    mask_id, mask = tokenizer.mask_token_id, tokenizer.mask_token
    if mask_id is None:
        raise ValueError(f"the tokenizer of this {type(head).__name__} has no mask token: fill_mask needs one")
    results: list[Any] = []
    with _EvalMode(head):
        for start in range(0, len(texts), batch_size):
            enc = head.encode(texts[start : start + batch_size])
            ids, real = enc["input_ids"].cpu(), enc["attention_mask"].cpu().bool()
            rows = [ids[r][real[r]] for r in range(ids.shape[0])]
            for r, row in enumerate(rows):
                if not bool((row == mask_id).any()):
                    _no_mask(texts[start + r], start + r, mask, head.max_length)
            logits = head.forward(enc).float().cpu()
            for r, row in enumerate(rows):
                masks = (row == mask_id).nonzero().squeeze(1)
                results.append(_fill_one(tokenizer, row, logits[r][real[r]], masks, top_k))
    return results[0] if single else results


def perplexity(head: Any, texts: Sequence[str], batch_size: int, seed: int) -> float:
    """What ``head.perplexity`` returns (see its docstring)."""
    texts = _inputs.check_texts(texts, "perplexity")
    if not texts:
        raise ValueError("perplexity got no texts: give at least one held-out text")
    batch_size = _check_positive(batch_size, "batch_size")
    total, count = 0.0, 0
    with _EvalMode(head):
        for start in range(0, len(texts), batch_size):
            enc, labels = head._masked_batch(texts[start : start + batch_size], seed, 0)
            n = int((labels != _mlm_mask.IGNORE_INDEX).sum())
            if n == 0:
                continue
            logits = head.forward(enc).float()
            labels = labels.to(logits.device)
            total += float(torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=_mlm_mask.IGNORE_INDEX,
                reduction="sum",
            ))
            count += n
    if count == 0:
        raise ValueError("perplexity found no maskable token in texts (only special tokens?): give real texts")
    return math.exp(total / count)


def write_card(directory: Path, *, model_name: str, model_type: Optional[str], max_length: int, mask: str) -> Path:
    """A short fill-mask model card (the metadata conventions of ``flodl_hf.export.cards``), checked after writing."""
    from huggingface_hub import ModelCard, ModelCardData

    from flodl_hf.export.cards import FLODL_TAG, LIBRARY_NAME, check_model_card

    tags = [FLODL_TAG, PIPELINE_TAG] + ([model_type] if model_type else [])
    data = ModelCardData(library_name=LIBRARY_NAME, pipeline_tag=PIPELINE_TAG, tags=tags, model_name=model_name)
    name = str(model_name).replace("|", "\\|").replace("\n", " ")
    text = (f"---\n{data.to_yaml()}\n---\n\n# {name}\n\n"
            f"A masked language model trained with [flodl-hf](https://pypi.org/project/flodl-hf/). Texts were "
            f"truncated to {max_length} tokens in training.\n\n"
            "## How to use\n\n```python\nfrom transformers import pipeline\n\n"
            f'unmasker = pipeline("fill-mask", model="{name}")\n'
            f'unmasker("The movie was {mask}.")\n```\n')
    path = Path(directory) / "README.md"
    ModelCard(text).save(path)
    check_model_card(path, scores=False)
    return path


def write_push_dir(head: Any, directory: Union[str, Path], *, name: str) -> Path:
    """What :func:`push` uploads: ``head.save_pretrained(directory)`` plus a fill-mask card."""
    tokenizer = head.tokenizer
    if tokenizer is None:
        raise ValueError("this head has no tokenizer, so the pushed model could not be used: set head.tokenizer")
    out = head.save_pretrained(directory)
    write_card(out, model_name=name, model_type=str(getattr(head.config(), "model_type", "")) or None,
               max_length=head.max_length, mask=str(tokenizer.mask_token))
    return out


def push(head: Any, repo_id: str, *, card: Any = None, token: Optional[str] = None, private: Optional[bool] = None,
         revision: Optional[str] = None, commit_message: str = "Upload masked LM trained with flodl-hf",
         create_pr: bool = False) -> Any:
    """``head.push_to_hub``: the offline and token checks run before anything is written."""
    from flodl_hf.export.hub import check_push_access, check_repo_id, push_output_dir

    if card is not None:
        raise ValueError("card=... describes a classifier's evaluation: a masked-LM head pushes its own short "
                         "fill-mask card; drop card")
    check_repo_id(repo_id)
    check_push_access(repo_id, token)
    with tempfile.TemporaryDirectory(prefix="flodl-hf-push-") as tmp:
        out = write_push_dir(head, Path(tmp) / "model", name=repo_id.split("/")[-1])
        return push_output_dir(out, repo_id, token=token, private=private, revision=revision,
                               commit_message=commit_message, create_pr=create_pr)
