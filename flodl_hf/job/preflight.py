"""The validate-first checks of ``flodl-hf train``: every refusal that needs neither the data's rows nor the model
loaded, and the label-order check against a trained classifier.

It exists so that the job's own checks (output and checkpoint directories, their ownership and overlap with the
inputs, ``--resume``, the data source, devices, disk space) live with the job, built from the command-independent
checks of :mod:`flodl_hf.preflight`, which stays free of anything about the train job.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from ..preflight import (check_devices, check_disk_space, check_model_dir, classifier_trained, model_labels,
                         require_regular_file)

__all__ = ["check_train", "check_label_order", "is_main_process"]


def is_main_process() -> bool:
    """Rank 0 of a launched job, or a plain process (the only one that cleans up or marks directories)."""
    return os.environ.get("RANK", "0") in ("", "0")


def check_train(settings: Any, sources: Any) -> Path:
    """Every refusal of ``flodl-hf train`` that needs neither the data's rows nor the model loaded; returns the
    checkpoint directory. Call it before anything slow (torch is not imported unless --devices names a GPU)."""
    from ..files import ownership
    from .checkpoints import checkpoint_dir_for

    output = Path(settings.output_dir)
    ownership.writable_parent(output, "--output-dir")
    ownership.check_output_dir(output, settings.overwrite)
    checkpoint_dir = checkpoint_dir_for(settings.output_dir, settings.checkpoint_dir, settings.resume)
    ownership.writable_parent(checkpoint_dir, "--checkpoint-dir")
    inputs = [("--data", sources.data_path)] + ([] if sources.packaged_model else [("--model", sources.model_path)])
    if settings.eval_data is not None:
        inputs.append(("--eval-data", Path(settings.eval_data)))
    for option, source in (("--data", None if sources.packaged_data else sources.data_path),
                           ("--eval-data", settings.eval_data)):
        if source is not None:  # a FIFO would block its reader for ever, a symlink loop throws in every one
            require_regular_file(source, option, missing_ok=True)
    ownership.check_disjoint([("--output-dir", output), ("--checkpoint-dir", checkpoint_dir)], inputs)
    if settings.resume:  # the checkpoint resumed from is an input of the output (it may be the checkpoint dir)
        ownership.check_disjoint([("--output-dir", output)], [("--resume", Path(settings.resume))])
    resuming = bool(settings.resume) and checkpoint_dir.resolve() == Path(settings.resume).resolve()
    if settings.resume and not Path(settings.resume).exists():
        raise FileNotFoundError(f"--resume {settings.resume}: no such checkpoint directory: pass the directory an "
                                "interrupted flodl-hf train printed, or start afresh without --resume")
    ownership.claim_checkpoint_dir(checkpoint_dir, settings.overwrite, resuming, settings.report_to == "tensorboard")
    if not sources.packaged_model:
        check_model_dir(sources.model_path)
    if not sources.packaged_data and not Path(sources.data_path).exists() and sources.hub_id is None:
        raise FileNotFoundError(f"data file not found: {sources.data_path}: give an existing file, a saved datasets "
                                "directory or a Hub dataset id with --data")
    if settings.eval_data is not None and not Path(settings.eval_data).exists():
        from ..data.sources import looks_like_hub_id

        if not looks_like_hub_id(settings.eval_data):
            raise FileNotFoundError(f"--eval-data {settings.eval_data}: no such file or directory: give an "
                                    "existing file, a saved datasets directory or a Hub dataset id")
    check_devices(settings.devices)
    check_disk_space(Path(sources.model_path), [("--output-dir", output), ("--checkpoint-dir", checkpoint_dir)],
                     checkpoints=settings.checkpoint_every is not None)
    if is_main_process():
        for directory in {checkpoint_dir, Path(settings.resume or checkpoint_dir)}:
            ownership.remove_stale_temporaries(directory, [*ownership.CHECKPOINT_NAMES, "checkpoint.pt"])
        if output.absolute().name:  # an output swap a kill interrupted (.NAME.partial-*, .NAME.old-*)
            ownership.remove_stale_temporaries(output.absolute().parent, [output.absolute().name])
    return checkpoint_dir


def check_label_order(model: Any, labels: Sequence[str], given: bool) -> None:
    """Refuse labels that name a trained model's classes in another order (each id would mean another class)."""
    names = model_labels(model)
    if not names or classifier_trained(model) is not True:
        return
    if len(names) != len(labels):
        where = f"--labels {','.join(labels)}" if given else f"the data's {len(labels)} labels {list(labels)}"
        raise ValueError(f"--model {model} holds a trained {len(names)}-label classifier ({','.join(names)}), but "
                         f"{where} give {len(labels)}: fine-tune from the base checkpoint it came from (--model), "
                         f"or give data with its {len(names)} labels (--labels, --label-column)")
    if all(n == f"LABEL_{i}" for i, n in enumerate(names)):
        return
    if sorted(names) == sorted(labels) and list(names) != list(labels):
        where = f"--labels {','.join(labels)}" if given else f"the data's sorted labels {list(labels)}"
        raise ValueError(f"{where} order the classes differently from the model's trained classifier "
                         f"({','.join(names)}), so every id would mean another class: pass --labels "
                         f"{','.join(names)}")
