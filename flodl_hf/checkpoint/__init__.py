"""Checkpoints: the safe on-disk format, how a run's state is split into it, and what a resume continues from.

It exists as a package so that every writer of a checkpoint (setup mode, ``flodl-hf train``, the builder, the
converter) shares one format and one set of resume rules instead of each keeping its own.

``errors`` (the exception types), ``tree`` (state <-> tensors + JSON, no pickle) and ``format`` (the manifest +
safetensors pair, written atomically) are torch-light and serve every writer: setup mode, ``flodl-hf train`` and
the builder. ``position`` (where an epoch stands, in samples) and ``elastic`` (what N ranks' checkpoint gives each of
M ranks) are the rules of a resume on another device count; ``graph_state`` saves and restores a ``Graph``.
Nothing is imported here, so reading a checkpoint's manifest costs no torch import.
"""

__all__: list[str] = []
