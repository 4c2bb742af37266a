"""The model card and Hub upload of an extractive question-answering head.

It exists because the shared card (``flodl_hf.export.cards.write_basic_card``) describes a text classifier by its labels,
and a QA model has none: this card states the task (``pipeline_tag: question-answering``), how long its windows are,
and how to use it with transformers (``AutoModelForQuestionAnswering``) or flodl-hf (``head.answer``). The upload
itself goes through the shared :mod:`flodl_hf.export.hub` functions, so the offline and token checks are the same.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Optional, Union

__all__ = ["QA_PIPELINE_TAG", "write_qa_card", "write_qa_push_dir", "push_qa_head"]

QA_PIPELINE_TAG = "question-answering"


def write_qa_card(directory: Union[str, Path], *, model_name: str, model_type: Optional[str], max_length: int,
                  doc_stride: int, filename: str = "README.md") -> Path:
    """A short card for a QA head pushed without a training run's scores; parsed back (strict metadata) to check."""
    from huggingface_hub import ModelCard, ModelCardData

    from flodl_hf.export.cards import FLODL_TAG, LIBRARY_NAME

    tags = [FLODL_TAG, QA_PIPELINE_TAG] + ([model_type] if model_type else [])
    data = ModelCardData(library_name=LIBRARY_NAME, pipeline_tag=QA_PIPELINE_TAG, tags=tags, model_name=model_name)
    text = (
        f"---\n{data.to_yaml()}\n---\n\n# {model_name}\n\n"
        "An extractive question-answering model fine-tuned with [flodl-hf](https://pypi.org/project/flodl-hf/): "
        "it points at the answer span inside a context. Question and context are encoded question first; a long "
        f"context is read in windows of {max_length} tokens overlapping by {doc_stride}.\n\n"
        "## How to use\n\n```python\nimport torch\nfrom transformers import AutoModelForQuestionAnswering, "
        "AutoTokenizer\n\n"
        f'tokenizer = AutoTokenizer.from_pretrained("{model_name}")\n'
        f'model = AutoModelForQuestionAnswering.from_pretrained("{model_name}")\n'
        'enc = tokenizer("Who wrote it?", "It was written by Ada.", return_tensors="pt")\n'
        "out = model(**enc)\n"
        "start, end = int(out.start_logits.argmax()), int(out.end_logits.argmax())\n"
        "print(tokenizer.decode(enc.input_ids[0, start : end + 1]))\n```\n\n"
        "With flodl-hf, `AutoHeadForQuestionAnswering.from_pretrained(path).answer(question, context)` returns the "
        "answer text, its character span and score over all windows.\n"
    )
    path = Path(directory) / filename
    ModelCard(text).save(path)
    card = ModelCard.load(path, ignore_metadata_errors=False)
    if card.data.get("pipeline_tag") != QA_PIPELINE_TAG or FLODL_TAG not in (card.data.get("tags") or []):
        raise ValueError(f"{path}: the written model card does not state its task and tag")
    return path


def write_qa_push_dir(head: Any, directory: Union[str, Path], *, name: str) -> Path:
    """What ``push_to_hub`` uploads: ``head.save_pretrained(directory)`` plus the QA card."""
    if head.tokenizer is None:
        raise ValueError(
            "this head has no tokenizer, so the pushed model could not be used: set head.tokenizer = "
            "AutoTokenizer.from_pretrained(...) first"
        )
    out = head.save_pretrained(directory)
    write_qa_card(out, model_name=name, model_type=str(getattr(head.config(), "model_type", "")) or None,
                  max_length=head.max_length, doc_stride=head.stride())
    return out


def push_qa_head(head: Any, repo_id: str, *, card: Any = None, token: Optional[str] = None,
                 private: Optional[bool] = None, revision: Optional[str] = None,
                 commit_message: str = "Upload question-answering model trained with flodl-hf",
                 create_pr: bool = False) -> Any:
    """Check access, write the head and its card to a temporary directory, and push it (``flodl_hf.export.hub``)."""
    from flodl_hf.export.hub import check_push_access, check_repo_id, push_output_dir

    if card is not None:
        raise ValueError(
            "card= takes a classifier's CardInfo (labels and classification scores), which a question-answering "
            "head has none of: push without card= (a question-answering card is written)"
        )
    check_repo_id(repo_id)
    check_push_access(repo_id, token)
    with tempfile.TemporaryDirectory(prefix="flodl-hf-push-") as tmp:
        out = write_qa_push_dir(head, Path(tmp) / "model", name=repo_id.split("/")[-1])
        return push_output_dir(out, repo_id, token=token, private=private, revision=revision,
                               commit_message=commit_message, create_pr=create_pr)
