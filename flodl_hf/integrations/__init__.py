"""El Che inside the trainers people already use: keep your script, add your other GPU.

Why it exists: most Hugging Face fine-tuning runs through `transformers.Trainer`. ``ElCheTrainer`` is that Trainer
with El Che's unequal per-rank shares of each batch and one-process exactness; a script changes its import and
class name only. Importing this package imports transformers (the integration is a Trainer subclass).
"""

from __future__ import annotations

from .arguments import MIN_TRANSFORMERS, ElCheArguments
from .state import PLAN_FILE, STATE_FILE
from .trainer import ElCheTrainer

__all__ = ["MIN_TRANSFORMERS", "PLAN_FILE", "STATE_FILE", "ElCheArguments", "ElCheTrainer"]
