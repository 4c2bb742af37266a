"""Distributed runtime: process-group bootstrap and launch, collectives, El Che gradient windows, manual Ddp.

Nothing here runs on import; ``Trainer.setup*`` calls :func:`init_context` which decides, once, whether this
process is one rank of many.
"""

from .context import DistContext, init_context, shutdown
from .ddp import Ddp

__all__ = ["DistContext", "init_context", "shutdown", "Ddp"]
