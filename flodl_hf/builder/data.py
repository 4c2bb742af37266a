"""The builder's data path: how a dataset reaches the worker processes, and how its items become a batch.

Why it exists: a worker is a spawned process, so the dataset must travel by pickling. Handed to
``torch.multiprocessing`` as it is, every tensor storage of the dataset is moved into shared memory in place
in the caller's process, one file descriptor each: a per-item dataset of a few thousand rows exhausts
``ulimit -n`` before a worker starts. :func:`pack_dataset` instead pickles the dataset ONCE, in the caller,
with the plain ``pickle`` module into one bytes blob (:class:`PackedDataset`): no shared memory, no
descriptors, the same blob for every worker, unpickled lazily in the worker on first access. A
``datasets.Dataset`` read from disk pickles as a memory map by file path; one built in memory pickles its
Arrow table.

The one departure from ``pickle.dumps(ds)``: a CPU tensor is written as its own bytes. Torch's default
reduction writes the tensor's whole underlying storage, so rows sliced from one tokenizer output
(``enc["input_ids"][i]``) would each carry every row (1,500 rows of 48 tokens: 1.7 GB instead of 2 MB).

:func:`collate` is the default ``collate_fn``: ``torch.utils.data.default_collate``, except that a column of
number lists (what a raw ``datasets.Dataset`` row holds for ``input_ids``) becomes one ``[B, L]`` tensor and
strings stay lists of strings.
"""

from __future__ import annotations

import io
import numbers
import pickle
from collections.abc import Mapping
from typing import Any, Optional, Sequence

import torch

__all__ = ["PackedDataset", "pack_dataset", "collate"]

_PROTOCOL = 5


def _tensor_from_bytes(data: bytes, dtype: torch.dtype, shape: tuple, requires_grad: bool) -> torch.Tensor:
    if len(data) == 0:
        out = torch.empty(shape, dtype=dtype)
    else:
        out = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)
    return out.requires_grad_(requires_grad) if requires_grad else out


class _CompactPickler(pickle.Pickler):
    """Plain pickle, but a dense CPU tensor is written as its own bytes (not its whole storage, not shared
    memory). Other objects, tensor subclasses and non-CPU tensors keep their default reduction."""

    def reducer_override(self, obj: Any) -> Any:
        if (
            type(obj) is torch.Tensor
            and obj.layout == torch.strided
            and obj.device.type == "cpu"
            and not obj.is_quantized
            and obj.grad_fn is None
        ):
            flat = obj.detach().contiguous().reshape(-1)
            data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
            return _tensor_from_bytes, (data, obj.dtype, tuple(obj.shape), obj.requires_grad)
        return NotImplemented


def _dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    _CompactPickler(buf, protocol=_PROTOCOL).dump(obj)
    return buf.getvalue()


class PackedDataset:
    """A dataset pickled once into one bytes blob; ``len()`` without unpickling, items unpickled lazily.

    Pickling a ``PackedDataset`` pickles only the blob (and the length), so sending it to N workers costs N
    copies of plain bytes and no file descriptors. The first ``ds[i]`` in a process unpickles the blob once.
    """

    def __init__(self, blob: bytes, length: int, type_name: str = "dataset") -> None:
        self._blob: Optional[bytes] = blob
        self._len = int(length)
        self._type_name = type_name
        self._ds: Any = None
        self._loaded = False

    @classmethod
    def _from_blob(cls, blob: bytes, length: int, type_name: str = "dataset") -> "PackedDataset":
        return cls(blob, length, type_name)

    def __reduce__(self) -> tuple:
        blob = _dumps(self._ds) if self._loaded else self._blob
        return (PackedDataset._from_blob, (blob, self._len, self._type_name))

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: Any) -> Any:
        return self.unwrap()[i]

    @property
    def nbytes(self) -> int:
        """Size of the packed blob (0 once it was unpickled in this process)."""
        return 0 if self._loaded else len(self._blob or b"")

    def unwrap(self) -> Any:
        """The user's dataset, unpickled on first use (the blob is then dropped)."""
        if not self._loaded:
            self._ds = pickle.loads(self._blob or b"")
            self._loaded, self._blob = True, None
        return self._ds

    def __repr__(self) -> str:
        state = "unpacked" if self._loaded else f"{self.nbytes} bytes"
        return f"PackedDataset({self._type_name}, {self._len} items, {state})"


def pack_dataset(ds: Any) -> PackedDataset:
    """Pickle ``ds`` once with plain pickle (protocol 5) into a :class:`PackedDataset`; ValueError if it
    cannot be pickled. A ``PackedDataset`` is returned as it is."""
    if isinstance(ds, PackedDataset):
        return ds
    name = type(ds).__name__
    try:
        blob = _dumps(ds)
    except Exception as exc:  # noqa: BLE001 - any pickling failure gets the same explanation
        raise ValueError(
            f"dataset of type {name} cannot be pickled ({type(exc).__name__}: {exc}). Builder workers are "
            "separate processes and receive the dataset by pickling: keep in it only data (tensors, lists, "
            "numbers, strings, a datasets.Dataset), not open files, locks, generators, lambdas or nested "
            "functions; or open such resources lazily in __getitem__"
        ) from exc
    return PackedDataset(blob, len(ds), name)


# -- collate -------------------------------------------------------------------------------------------------


def _is_number(v: object) -> bool:
    return isinstance(v, numbers.Number) and not isinstance(v, complex)


def _is_number_list(v: object) -> bool:
    return isinstance(v, (list, tuple)) and len(v) > 0 and all(_is_number(x) for x in v)


def _number_lists(name: str, values: Sequence[Sequence[numbers.Number]]) -> torch.Tensor:
    lengths = sorted({len(v) for v in values})
    if len(lengths) > 1:
        raise ValueError(
            f"column {name!r} holds lists of different lengths in one batch (lengths {lengths}): the "
            "default collate stacks them into one [batch, length] tensor. Pad to a fixed length when "
            "tokenizing, e.g. tokenizer(..., padding='max_length', max_length=N, truncation=True), or pad "
            "per batch with .collate_fn(DataCollatorWithPadding(tokenizer))"
        )
    flat = [x for v in values for x in v]
    if all(isinstance(x, bool) for x in flat):
        dtype = torch.bool
    elif all(isinstance(x, numbers.Integral) for x in flat):
        dtype = torch.int64
    else:
        dtype = torch.float32
    return torch.tensor(values, dtype=dtype)


def _column(name: str, values: list) -> Any:
    first = values[0]
    if isinstance(first, str) and all(isinstance(v, str) for v in values):
        return list(values)
    if isinstance(first, Mapping):
        return collate(values, _prefix=f"{name}.")
    if _is_number_list(first) and all(_is_number_list(v) for v in values):
        return _number_lists(name, values)
    return torch.utils.data.default_collate(values)


def collate(items: list, _prefix: str = "") -> Any:
    """The default ``collate_fn``: like ``torch.utils.data.default_collate``, but for dict items a column of
    number lists becomes one ``[B, L]`` tensor (int64 for ints, float32 for floats; ValueError naming the
    column if the lengths differ) and a column of strings stays a list of strings."""
    if not items or not isinstance(items[0], Mapping):
        return torch.utils.data.default_collate(items)
    first = items[0]
    out = {key: _column(f"{_prefix}{key}", [item[key] for item in items]) for key in first}
    try:
        return type(first)(out)
    except Exception:  # noqa: BLE001 - a Mapping type with another constructor: a plain dict will do
        return out
