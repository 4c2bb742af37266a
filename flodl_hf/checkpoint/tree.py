"""Split a checkpoint's state into tensors and JSON, and join them back exactly, without pickle.

It exists because a checkpoint's state is a nested mix (a model's ``state_dict``, an optimizer's ``state_dict``
with integer keys and tuples such as ``betas``, Python's ``random.getstate()`` tuple, NumPy's RNG state with its
``uint32`` array, plain dicts of positions and histories) and the safe file format stores only two things: tensors
(safetensors) and JSON. :func:`encode` walks the tree once: every tensor (and NumPy array) is replaced by a
reference to a safetensors key; whatever JSON cannot say natively is written as a tagged object:

* ``{"__tensor__": "model/classifier.weight"}``: the tensor stored under that key;
* ``{"__ndarray__": "rng/0/numpy/1", "dtype": "uint32"}``: a NumPy array (stored as a tensor, dtype restored);
* ``{"__tuple__": [...]}``: a tuple (``random.setstate`` and optimizers' ``betas`` need tuples back);
* ``{"__dict__": [[key, value], ...]}``: a dict whose keys are not all strings (optimizer state is keyed by
  parameter index), or that uses one of these tag names as a key.

:func:`decode` reverses it and refuses anything else: an unknown tag, a reference to a missing tensor, a dtype
outside a fixed list, a tree nested deeper than :data:`MAX_DEPTH`. Floats keep every bit (JSON floats are written
with ``repr``; NaN and infinities as Python's ``NaN`` / ``Infinity``), so a resumed run matches an uninterrupted
one exactly. Values of any other type are refused when the checkpoint is written, naming where they are.
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any

from .errors import CheckpointError, ResumeError

if TYPE_CHECKING:
    import torch

__all__ = ["encode", "decode", "MAX_DEPTH"]

TENSOR, NDARRAY, TUPLE, DICT = "__tensor__", "__ndarray__", "__tuple__", "__dict__"
_TAGS = (TENSOR, NDARRAY, TUPLE, DICT)
#: Deepest nesting accepted (a checkpoint's state is about 6 deep; a hostile file may nest thousands).
MAX_DEPTH = 64
#: NumPy dtypes an array may be restored as (never ``object``).
_NUMPY_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
                 "float32", "float64")


def _join(path: str, key: Any) -> str:
    return f"{path}/{key}" if path else str(key)


class _Encoder:
    def __init__(self) -> None:
        import torch  # here, not at import: decode (reading a manifest's job plan) needs no torch

        self.torch = torch
        self.tensors: dict[str, torch.Tensor] = {}
        self._storages: set[tuple[int, str]] = set()

    def _key(self, path: str) -> str:
        key, n = path or "tensor", 1
        while key in self.tensors:
            n += 1
            key = f"{path}#{n}"
        return key

    def _store(self, tensor: "torch.Tensor", path: str) -> str:
        if tensor.layout != self.torch.strided:
            raise CheckpointError(f"cannot store the {tensor.layout} tensor at {path!r} in a checkpoint: convert it "
                                  "to a dense tensor (.to_dense()) first")
        t = tensor.detach().to("cpu").contiguous()
        storage = (t.untyped_storage().data_ptr(), str(t.device))
        if storage in self._storages and t.numel():
            t = t.clone()  # safetensors refuses tensors sharing memory (tied weights): store a copy
        self._storages.add(storage)
        key = self._key(path)
        self.tensors[key] = t
        return key

    def encode(self, value: Any, path: str, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise CheckpointError(f"checkpoint state nests deeper than {MAX_DEPTH} levels at {path!r}")
        if value is None or isinstance(value, bool):
            return None if value is None else bool(value)
        if isinstance(value, str):
            return str(value)
        if isinstance(value, self.torch.Tensor):
            return {TENSOR: self._store(value, path)}
        if isinstance(value, numbers.Integral):
            return int(value)
        if isinstance(value, numbers.Real):
            return float(value)
        mod = type(value).__module__
        if mod == "numpy" and type(value).__name__ == "ndarray":
            dtype = str(value.dtype)
            if dtype not in _NUMPY_DTYPES:
                raise CheckpointError(f"cannot store a NumPy array of dtype {dtype} at {path!r} in a checkpoint: "
                                      f"use one of {', '.join(_NUMPY_DTYPES)}")
            wide = value.astype("int64") if dtype in ("uint16", "uint32") else value
            return {NDARRAY: self._store(self.torch.from_numpy(wide.copy()), path), "dtype": dtype}
        if isinstance(value, tuple):
            return {TUPLE: [self.encode(v, _join(path, i), depth + 1) for i, v in enumerate(value)]}
        if isinstance(value, list):
            return [self.encode(v, _join(path, i), depth + 1) for i, v in enumerate(value)]
        if isinstance(value, dict):
            if all(type(k) is str for k in value) and not any(k in _TAGS for k in value):
                return {k: self.encode(v, _join(path, k), depth + 1) for k, v in value.items()}
            return {DICT: [[self.encode(k, _join(path, "<key>"), depth + 1), self.encode(v, _join(path, k), depth + 1)]
                           for k, v in value.items()]}
        raise CheckpointError(f"cannot store a value of type {type(value).__name__} at {path!r} in a checkpoint "
                              "(only tensors, NumPy arrays, numbers, strings, None, lists, tuples and dicts): convert "
                              "it to one of those first")


def encode(tree: Any) -> tuple[Any, dict[str, "torch.Tensor"]]:
    """``(json_tree, tensors)``: the JSON-able tree with tagged references, and the tensors by key (CPU,
    contiguous, no shared memory: ready for ``safetensors.torch.save_file``). CheckpointError names a value that
    cannot be stored."""
    encoder = _Encoder()
    return encoder.encode(tree, "", 0), encoder.tensors


def _bad(where: str, what: str) -> ResumeError:
    return ResumeError(f"{where}: {what}; the checkpoint is damaged or was not written by flodl-hf: start afresh, "
                       "or resume from another checkpoint")


def _decode(value: Any, tensors: dict, where: str, depth: int, used: set) -> Any:
    if depth > MAX_DEPTH:
        raise _bad(where, f"its state nests deeper than {MAX_DEPTH} levels")
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, list):
        return [_decode(v, tensors, where, depth + 1, used) for v in value]
    if not isinstance(value, dict):
        raise _bad(where, f"a value of type {type(value).__name__}")
    tags = [k for k in value if k in _TAGS]
    if not tags:
        return {k: _decode(v, tensors, where, depth + 1, used) for k, v in value.items()}
    tag = tags[0]
    allowed = {NDARRAY, "dtype"} if tag == NDARRAY else {tag}
    if len(tags) > 1 or set(value) != allowed:
        raise _bad(where, f"a malformed {tag} entry {sorted(value)[:4]}")
    body = value[tag]
    if tag in (TENSOR, NDARRAY):
        if not isinstance(body, str) or body not in tensors:
            raise _bad(where, f"a reference to tensor {str(body)[:80]!r}, which its tensors file does not hold")
        used.add(body)
        if tag == TENSOR:
            return tensors[body]
        dtype = value["dtype"]
        if dtype not in _NUMPY_DTYPES:
            raise _bad(where, f"a NumPy dtype {str(dtype)[:40]!r} outside {list(_NUMPY_DTYPES)}")
        return tensors[body].numpy().astype(dtype)
    if not isinstance(body, list):
        raise _bad(where, f"a {tag} entry holding a {type(body).__name__}, not a list")
    if tag == TUPLE:
        return tuple(_decode(v, tensors, where, depth + 1, used) for v in body)
    out = {}
    for pair in body:
        if not isinstance(pair, list) or len(pair) != 2:
            raise _bad(where, "a __dict__ entry that is not a [key, value] pair")
        key = _decode(pair[0], tensors, where, depth + 1, used)
        if not isinstance(key, (str, int, float, bool, tuple, type(None))):
            raise _bad(where, f"a dict key of type {type(key).__name__}")
        out[key] = _decode(pair[1], tensors, where, depth + 1, used)
    return out


def decode(json_tree: Any, tensors: dict[str, "torch.Tensor"], where: str) -> Any:
    """The state :func:`encode` was given (tuples, integer keys, NumPy arrays restored); ``where`` (the file)
    is named in the ResumeError that refuses a malformed tree."""
    try:
        return _decode(json_tree, tensors, where, 0, set())
    except RecursionError:
        raise _bad(where, "its state nests too deeply") from None
