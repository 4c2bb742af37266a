"""The builder's messages as bytes, for the c10d store: JSON for the structure, safetensors for the tensors.

Why it exists: across machines a worker's reports, the coordinator's commands and a model state travel through
the torch.distributed store, which holds bytes. Encoding them with pickle would make every rank unpickle what any
other host wrote; instead a message is the checkpoint format's encoding (``flodl_hf.checkpoint.tree``: tuples,
integer keys and tensors kept exactly, anything else refused), so nothing here is ever unpickled. A model's
:class:`~flodl_hf.builder.state.Layout` (a dataclass) travels as a tagged tuple and is rebuilt on arrival, and
bytes (a packed optimizer state) as a tagged ``uint8`` tensor.

Layout of one message: 8 bytes (little-endian length of the JSON part), the JSON, then the safetensors bytes
(absent when the message holds no tensor: most messages are a few numbers).
"""

from __future__ import annotations

import json
import struct
from typing import Any

from .state import Entry, Layout

__all__ = ["encode", "decode"]

_LAYOUT = "__flodl_layout__"
_BYTES = "__flodl_bytes__"


def _lift(value: Any) -> Any:
    """``value`` with every Layout replaced by a plain tagged tuple (the tree encoder knows no dataclasses)."""
    if isinstance(value, Layout):
        return (_LAYOUT, tuple((e.key, tuple(e.shape), e.dtype, e.kind, e.alias_of) for e in value.entries))
    if isinstance(value, (bytes, bytearray)):  # e.g. a packed optimizer state: a uint8 tensor
        import torch

        data = torch.frombuffer(bytearray(value), dtype=torch.uint8) if value else torch.zeros(0, dtype=torch.uint8)
        return (_BYTES, data)
    if isinstance(value, tuple):
        return tuple(_lift(v) for v in value)
    if isinstance(value, list):
        return [_lift(v) for v in value]
    if isinstance(value, dict):
        return {k: _lift(v) for k, v in value.items()}
    return value


def _lower(value: Any) -> Any:
    if isinstance(value, tuple):
        if len(value) == 2 and value[0] == _BYTES:
            return value[1].numpy().tobytes()
        if len(value) == 2 and value[0] == _LAYOUT:
            return Layout(tuple(Entry(k, tuple(int(n) for n in shape), dtype, kind, alias)
                                for k, shape, dtype, kind, alias in value[1]))
        return tuple(_lower(v) for v in value)
    if isinstance(value, list):
        return [_lower(v) for v in value]
    if isinstance(value, dict):
        return {k: _lower(v) for k, v in value.items()}
    return value


def encode(msg: Any) -> bytes:
    """``msg`` (tuples, lists, dicts, numbers, strings, None, tensors, Layouts) as bytes."""
    from ..checkpoint.tree import encode as encode_tree

    tree, tensors = encode_tree(_lift(msg))
    head = json.dumps(tree, separators=(",", ":")).encode("utf-8")
    blob = b""
    if tensors:
        from safetensors.torch import save

        blob = save(tensors)
    return struct.pack("<Q", len(head)) + head + blob


def decode(data: bytes) -> Any:
    """The message :func:`encode` wrote (tensors on the CPU)."""
    from ..checkpoint.tree import decode as decode_tree

    (n,) = struct.unpack_from("<Q", data, 0)
    tree = json.loads(data[8 : 8 + n].decode("utf-8"))
    tensors: dict = {}
    if len(data) > 8 + n:
        from safetensors.torch import load

        tensors = load(bytes(data[8 + n :]))
    return _lower(decode_tree(tree, tensors, "a builder message"))
