"""Placeholder until the data-path module lands: the default collate."""

from torch.utils.data import default_collate as collate

__all__ = ["collate"]
