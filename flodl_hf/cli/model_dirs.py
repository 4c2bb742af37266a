"""``flodl-hf export``, ``verify`` and ``convert-checkpoint``: the commands that check or rewrite what is on disk
rather than train or run a model.

It exists to join the checks of ``flodl_hf.export`` (a text classifier: :func:`flodl_hf.export.verify_model_dir`;
the other tasks: :func:`flodl_hf.export.verify_tasks.verify_task_dir`) with the head loaders of the composition
root (``flodl_hf.cli.head_classes``), and to run the legacy checkpoint conversion (``flodl_hf.cli.convert``), which
knows both the setup and the builder checkpoint formats.
"""

from __future__ import annotations

import argparse
import json

from ..export.tasks import TEXT_CLASSIFICATION
from .head_classes import head_class, load_head
from .parser import PROG
from .routing import verified_task

__all__ = ["verify", "cmd_export", "cmd_verify", "cmd_convert"]


def verify(path: str, as_json: bool = False) -> int:
    """Verify the model directory ``path`` as its task's; print the report; 0 when it passed, else 1."""
    task = verified_task(path)
    if task == TEXT_CLASSIFICATION:
        from ..export import verify_model_dir

        report = verify_model_dir(path, head_loader=load_head)
    else:
        from ..export.verify_tasks import verify_task_dir

        cls = head_class(task)
        report = verify_task_dir(path, task, head_loader=lambda p: load_head(p, task, cls))
    print(json.dumps(report.to_dict(), indent=2) if as_json else report.summary())
    return 0 if report.ok else 1


def _check_task_layer(path: str, task: str, command: str, option: str) -> None:
    """A directory whose config.json names a task head but whose weights lack that head's layer is refused (a base
    model, naming no task, is verified as a text classifier and reported there). ``verify`` of weights that hold
    another task's layer reports both key sets instead (architectures that disagree with the weights, exit 1)."""
    from ..export.tasks import TASKS, task_of_model_dir
    from ..preflight import check_task_layer, task_layer_trained

    try:
        named, _ = task_of_model_dir(path)
    except (OSError, ValueError, AttributeError, TypeError):
        return
    if named is None:
        return
    if command == "verify" and any(task_layer_trained(path, other) for other in TASKS if other != task):
        return
    check_task_layer(path, task, command, option)


def cmd_export(args: argparse.Namespace) -> int:
    """``flodl-hf export``: re-save HF-canonically, then verify."""
    from ..export import export_model_dir
    from ..export.verify_tasks import auto_model_class
    from ..files.ownership import check_disjoint, check_output_dir, writable_parent
    from ..preflight import check_model_dir

    check_model_dir(args.model, tokenizer=args.tokenizer is None)
    task = verified_task(args.model)
    _check_task_layer(args.model, task, "export", "--model")
    if args.tokenizer is not None:
        check_model_dir(args.tokenizer, "--tokenizer", tokenizer=False)
    writable_parent(args.output, "--output")
    check_output_dir(args.output, args.overwrite, "--output")
    check_disjoint([("--output", args.output)], [("--model", args.model)]
                   + ([("--tokenizer", args.tokenizer)] if args.tokenizer else []))
    out = export_model_dir(args.model, args.output, overwrite=args.overwrite, tokenizer=args.tokenizer,
                           model_class=None if task == TEXT_CLASSIFICATION else auto_model_class(task))
    print(f"flodl-hf: exported {args.model} to {out}")
    return verify(str(out))


def cmd_verify(args: argparse.Namespace) -> int:
    """``flodl-hf verify DIR``."""
    from ..preflight import check_model_dir

    check_model_dir(args.model, "DIR", tokenizer=False)  # a missing tokenizer is a verify finding, not bad input
    _check_task_layer(args.model, verified_task(args.model), "verify", "DIR")
    return verify(args.model, args.json)


def cmd_convert(args: argparse.Namespace) -> int:
    """``flodl-hf convert-checkpoint --trust-pickle PATH``."""
    from .convert import convert_legacy

    print(f"{PROG}: converted {args.path} to {convert_legacy(args.path, args.trust_pickle)}")
    return 0
