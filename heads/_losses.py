"""Labels to tensors, label checks and the classification losses shared by every head.

It exists so that the loss semantics are defined once, checked before any forward pass, and testable without a
model. The problem kind follows transformers' ``config.problem_type``:

- ``"regression"`` (or unset with ``num_labels == 1``): MSE between logits and float targets.
- ``"single_label_classification"`` (or unset with ``num_labels > 1``): integer class ids -> cross-entropy with
  ``-100`` ignored; float targets of shape ``[B, num_labels]`` -> soft-label cross-entropy. (transformers would
  treat float targets with an unset ``problem_type`` as multi-label; we do not guess: set ``problem_type`` to
  ``"multi_label_classification"`` for that.)
- ``"multi_label_classification"``: BCE-with-logits against ``[B, num_labels]`` targets in [0, 1].

Every loss is the MEAN over the micro-batch's samples (for multi-label, over samples and labels; for cross-entropy
with ignored samples, over the samples that count). The engine relies on this: on N ranks it weights each rank's
gradient by its sample count to get exactly the mean gradient of the global batch.
"""

from __future__ import annotations

import numbers
from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F

__all__ = [
    "REGRESSION",
    "SINGLE_LABEL",
    "MULTI_LABEL",
    "PROBLEM_TYPES",
    "problem_type_of",
    "labels_to_tensor",
    "check_labels",
    "loss_from_logits",
    "loss_items",
]

REGRESSION = "regression"
SINGLE_LABEL = "single_label_classification"
MULTI_LABEL = "multi_label_classification"
PROBLEM_TYPES = (REGRESSION, SINGLE_LABEL, MULTI_LABEL)
IGNORE_INDEX = -100


def problem_type_of(config: Any) -> str:
    """The effective problem type of a config (``problem_type`` if set, else by ``num_labels``)."""
    problem_type = getattr(config, "problem_type", None)
    if problem_type is None:
        return REGRESSION if config.num_labels == 1 else SINGLE_LABEL
    if problem_type not in PROBLEM_TYPES:
        raise ValueError(
            f"config.problem_type={problem_type!r} is not supported: use one of "
            f"{', '.join(PROBLEM_TYPES)} or None"
        )
    return problem_type


def labels_to_tensor(labels: Sequence[Any]) -> Optional[torch.Tensor]:
    """Turn per-sample labels into one tensor: ints -> LongTensor ``[B]``; any float -> FloatTensor ``[B]``;
    lists / arrays / 1-d tensors (soft or multi-hot targets) -> FloatTensor ``[B, C]``. All None -> None."""
    if all(label is None for label in labels):
        return None
    kinds = set()
    for i, label in enumerate(labels):
        if label is None:
            raise ValueError(
                f"label at index {i} is None while other labels are set: give every item a label, "
                "or none (for prediction)"
            )
        if isinstance(label, torch.Tensor):
            kinds.add("vector" if label.dim() == 1 else "scalar" if label.dim() == 0 else "bad")
            if label.dim() > 1:
                raise ValueError(
                    f"label at index {i} is a {label.dim()}-d tensor: give a scalar or a 1-d vector"
                )
        elif isinstance(label, (bool, numbers.Integral)):
            kinds.add("int")
        elif isinstance(label, numbers.Real):
            kinds.add("float")
        elif hasattr(label, "__len__") and not isinstance(label, (str, bytes)):
            kinds.add("vector")
        else:
            raise ValueError(
                f"label at index {i} is {type(label).__name__} {label!r}: use an int class id, a float "
                "(regression), or a list of floats (soft or multi-label targets)"
            )
    if "vector" in kinds and len(kinds) > 1:
        raise ValueError("labels mix scalars and vectors: give every item a class id, or every item a vector")
    if kinds == {"vector"}:
        rows = [torch.as_tensor(label, dtype=torch.float32).reshape(-1) for label in labels]
        widths = {row.numel() for row in rows}
        if len(widths) != 1:
            raise ValueError(
                f"label vectors have different lengths {sorted(widths)}: give one value per label"
            )
        return torch.stack(rows)
    values = [label.item() if isinstance(label, torch.Tensor) else label for label in labels]
    if all(isinstance(v, (bool, numbers.Integral)) for v in values):
        return torch.tensor([int(v) for v in values], dtype=torch.long)
    return torch.tensor([float(v) for v in values], dtype=torch.float32)


def _shape(t: torch.Tensor) -> list[int]:
    return list(t.shape)


def check_labels(labels: torch.Tensor, batch: int, num_labels: int, problem_type: str) -> str:
    """Validate ``labels`` for a batch of ``batch`` samples before the forward pass; return the loss kind
    (``"ce"``, ``"soft_ce"``, ``"bce"`` or ``"mse"``). Raises ValueError naming the bad value or shape and the fix."""
    if not isinstance(labels, torch.Tensor):
        raise ValueError(f"labels must be a tensor, got {type(labels).__name__}")
    if labels.dim() == 0 or labels.shape[0] != batch:
        raise ValueError(
            f"labels of shape {_shape(labels)} do not match a batch of {batch} texts: give one label "
            f"per text (shape [{batch}] or [{batch}, {num_labels}])"
        )
    if problem_type == REGRESSION:
        if num_labels == 1:
            ok, want = (
                labels.dim() == 1 or (labels.dim() == 2 and labels.shape[1] == 1),
                f"[{batch}] or [{batch}, 1]",
            )
        else:
            ok, want = labels.dim() == 2 and labels.shape[1] == num_labels, f"[{batch}, {num_labels}]"
        if not ok or labels.dtype == torch.bool:
            raise ValueError(
                f"regression labels of shape {_shape(labels)} and dtype {labels.dtype} are wrong for "
                f"{num_labels} output(s): use float targets of shape {want}"
            )
        return "mse"
    if problem_type == MULTI_LABEL:
        if labels.dim() != 2 or labels.shape[1] != num_labels:
            raise ValueError(
                f"multi-label targets must have shape [{batch}, {num_labels}] (one 0/1 or probability "
                f"per label), got {_shape(labels)}"
            )
        if labels.is_floating_point() and bool(((labels < 0) | (labels > 1)).any()):
            bad = labels[(labels < 0) | (labels > 1)][0].item()
            raise ValueError(f"multi-label target {bad} is outside [0, 1]: give 0/1 flags or probabilities")
        return "bce"
    # single-label classification
    if labels.dim() == 1 and not labels.is_floating_point() and labels.dtype != torch.bool:
        bad_mask = (labels != IGNORE_INDEX) & ((labels < 0) | (labels >= num_labels))
        if bool(bad_mask.any()):
            index = int(bad_mask.nonzero()[0, 0])
            raise ValueError(
                f"label {int(labels[index])} at index {index} is out of range: valid class ids are "
                f"0..{num_labels - 1} (num_labels={num_labels}), or -100 to ignore a sample"
            )
        return "ce"
    if labels.dim() == 2 and labels.is_floating_point():
        if labels.shape[1] != num_labels:
            raise ValueError(
                f"soft-label targets of shape {_shape(labels)} do not match num_labels={num_labels}: "
                f"use shape [{batch}, {num_labels}]"
            )
        return "soft_ce"
    if labels.dim() == 1 and labels.is_floating_point():
        raise ValueError(
            f"float labels of shape {_shape(labels)} for a {num_labels}-label classifier: give integer "
            f"class ids (a LongTensor of shape [{batch}]) or probabilities of shape "
            f"[{batch}, {num_labels}]; for regression use num_labels=1"
        )
    raise ValueError(
        f"labels of shape {_shape(labels)} and dtype {labels.dtype} do not fit single-label "
        f"classification: give integer class ids of shape [{batch}] or float probabilities of shape "
        f"[{batch}, {num_labels}] (for multi-hot targets set config.problem_type="
        f"'{MULTI_LABEL}')"
    )


def loss_items(kind: str, labels: torch.Tensor, logits_shape: Sequence[int]) -> int:
    """What the loss of ``kind`` averages over: labelled samples for cross-entropy (``-100`` excluded), samples
    for soft labels, every (sample, label) or (sample, output) element for BCE and MSE. The engine weights each
    micro-batch's gradient by it (``Graph.loss_items``), so N ranks train exactly like one device."""
    if kind == "ce":
        return int((labels != IGNORE_INDEX).sum())
    if kind == "soft_ce":
        return int(labels.shape[0])
    if kind in ("bce", "mse"):
        count = 1
        for dim in logits_shape:
            count *= int(dim)
        return count
    raise ValueError(f"unknown loss kind {kind!r}")


def loss_from_logits(
    kind: str, logits: torch.Tensor, labels: torch.Tensor, labelled: Optional[bool] = None
) -> torch.Tensor:
    """The mean loss of ``kind`` (from :func:`check_labels`) over the batch, computed in float32.

    ``labelled``: whether any label is not ``-100`` (cross-entropy), when the caller already knows it (counted on
    the host); None: checked here."""
    logits = logits.float()
    if kind == "ce":
        if labelled is None:
            labelled = bool((labels != IGNORE_INDEX).any())
        if not labelled:
            return logits.sum() * 0.0  # every sample ignored: a zero loss that still has a graph
        return F.cross_entropy(logits, labels.long(), ignore_index=IGNORE_INDEX)
    if kind == "soft_ce":
        return F.cross_entropy(logits, labels.float())
    if kind == "bce":
        return F.binary_cross_entropy_with_logits(logits, labels.float())
    if kind == "mse":
        if logits.shape[-1] == 1 and labels.dim() == 1:
            logits = logits.squeeze(-1)
        return F.mse_loss(logits, labels.float().reshape(logits.shape))
    raise ValueError(f"unknown loss kind {kind!r}")
