"""``flodl-hf convert-checkpoint --trust-pickle PATH``: turn a legacy pickle checkpoint into the safe format.

Why it exists: flodl-hf before checkpoint format 2 wrote ``checkpoint.pt`` (setup mode and ``flodl-hf train``) and
builder checkpoints with ``torch.save``, a pickle. Loading them now is refused, because opening a pickle can run
arbitrary code. A user who trusts such a file (they wrote it) converts it once, explicitly, with this command; the
loaders themselves never unpickle.

Even here the file is read with ``torch.load(weights_only=True)``, torch's restricted unpickler, and only the
globals a legacy flodl-hf checkpoint needs are allowed besides it (NumPy's array reconstruction, for the NumPy RNG
state). A file that asks for anything else is refused with the names it asked for, before anything is loaded.
``--trust-pickle`` is still required, because the restricted unpickler is a defence, not a proof.

The converted checkpoint is written beside the original (``checkpoint.json`` + ``checkpoint.0.safetensors`` in the
directory; ``NAME.json`` + ``NAME.0.safetensors`` next to a builder file ``NAME.pt``); the original is left as it
is, and an existing converted checkpoint is never replaced.
"""

from __future__ import annotations

from pathlib import Path
from typing import Union

from ..checkpoint.errors import ResumeError

__all__ = ["convert_legacy", "ALLOWED_GLOBALS"]

#: The globals a legacy flodl-hf checkpoint's pickle may name besides torch's own safe set.
ALLOWED_GLOBALS = ("numpy.ndarray", "numpy.dtype", "numpy.core.multiarray._reconstruct",
                   "numpy._core.multiarray._reconstruct", "numpy.dtypes.UInt32DType")


def _safe_globals() -> list:
    import numpy as np

    found = [np.ndarray, np.dtype]
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            found.append(__import__(module, fromlist=["_reconstruct"])._reconstruct)
            break
        except (ImportError, AttributeError):
            continue
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None and hasattr(dtypes, "UInt32DType"):
        found.append(dtypes.UInt32DType)
    return found


def _load_restricted(path: Path) -> dict:
    import torch

    try:
        wanted = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
    except Exception as exc:  # noqa: BLE001 - not a torch.save file at all
        raise ResumeError(f"{path} is not a legacy flodl-hf checkpoint ({type(exc).__name__}: {str(exc)[:200]}): "
                          "refused, nothing converted") from exc
    foreign = sorted(set(wanted) - set(ALLOWED_GLOBALS))
    if foreign:
        raise ResumeError(f"{path} asks to import {', '.join(foreign[:5])}, which no flodl-hf checkpoint needs: "
                          "refused without loading it (it may be malicious or from another program)")
    try:
        with torch.serialization.safe_globals(_safe_globals()):
            state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - the restricted unpickler's refusals have several types
        raise ResumeError(f"{path} could not be read by the restricted unpickler ({type(exc).__name__}: "
                          f"{str(exc)[:200]}): refused") from exc
    if not isinstance(state, dict):
        raise ResumeError(f"{path} is not a legacy flodl-hf checkpoint (it holds a {type(state).__name__})")
    return state


def convert_legacy(path: Union[str, Path], trust_pickle: bool = False) -> Path:
    """Convert the legacy checkpoint ``path`` (a directory holding ``checkpoint.pt``, or a ``.pt`` file);
    returns the new manifest. ValueError without ``trust_pickle``, or when the file is not a legacy checkpoint."""
    from ..files import dirlock
    from ..builder.checkpoint import CHECKPOINT_FORMAT, KIND as BUILDER_KIND
    from ..checkpoint.graph_state import CHECKPOINT_FILE, FORMAT, KIND as SETUP_KIND, LEGACY_FILE
    from ..checkpoint.format import looks_like_pickle, write_state

    path = Path(path)
    source = path / LEGACY_FILE if path.is_dir() else path
    if not trust_pickle:
        raise ValueError(f"convert-checkpoint reads {source}, a pickle, which can run code when opened: pass "
                         "--trust-pickle to confirm you trust where it came from")
    if not source.is_file():
        raise FileNotFoundError(f"no legacy checkpoint at {source}: give a checkpoint directory holding "
                                f"{LEGACY_FILE}, or a builder checkpoint file")
    with open(source, "rb") as fh:
        if not looks_like_pickle(fh.read(4)):
            raise ResumeError(f"{source} is not a legacy flodl-hf checkpoint (not a torch.save file): nothing to "
                              "convert")
    state = _load_restricted(source)
    if state.get("format") == 1 and "model" in state and "plan" in state:
        target, kind = source.parent / CHECKPOINT_FILE, SETUP_KIND
        state = dict(state, format=FORMAT)
    elif state.get("format") == "flodl-hf-builder/1" and "model" in state:
        target, kind = source.with_suffix(".json"), BUILDER_KIND
        state = dict(state, format=CHECKPOINT_FORMAT)
    else:
        raise ResumeError(f"{source} is not a legacy flodl-hf checkpoint (format {str(state.get('format'))[:40]!r}): "
                          "nothing to convert")
    if target.exists() or target.is_symlink():
        raise ValueError(f"{target} already exists (converted before?): resume from it, or move it away to convert "
                         "again")
    lock = dirlock.acquire(target.parent if kind == SETUP_KIND else target, "checkpoint",
                           "wait for the run writing it to finish")
    try:
        write_state(target, state, kind)
    finally:
        lock.release()
    return target
