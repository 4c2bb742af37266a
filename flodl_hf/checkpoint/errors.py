"""The exceptions of flodl-hf's checkpoint files, in one torch-free module.

It exists so that the CLI's early refusals (``flodl_hf.job.checkpoints`` reads a checkpoint's job plan before torch
is imported), the engine (``flodl_hf.checkpoint.graph_state``), the builder (``flodl_hf.builder.checkpoint``) and the lock
(``flodl_hf.files.dirlock``) raise the same types. All are ``ValueError`` subclasses, so the CLI prints them as one
``flodl-hf: error:`` line (exit 2) and a script can catch them as bad input:

* :class:`CheckpointError`: the base.
* :class:`ResumeError`: a checkpoint is missing, unreadable, damaged (checksum), a legacy pickle, from a newer
  flodl-hf, or does not fit the run that tries to resume from it.
* :class:`CheckpointWriteError`: writing a checkpoint failed (full disk, read-only or unwritable directory); the
  previous checkpoint is still complete and loadable.
* :class:`CheckpointLockedError`: another live run holds the lock of the directory (it is named).
"""

from __future__ import annotations

__all__ = ["CheckpointError", "ResumeError", "CheckpointWriteError", "CheckpointLockedError"]


class CheckpointError(ValueError):
    """A checkpoint could not be read or written; the message names the file, the problem and the fix."""


class ResumeError(CheckpointError):
    """A checkpoint is missing, unreadable, damaged, unsafe to open, or does not fit the run that tries to resume
    from it."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint write failed (no space, read-only or unwritable directory); the previous one is intact."""


class CheckpointLockedError(CheckpointError):
    """Another flodl-hf run is writing the same checkpoint or output directory."""
