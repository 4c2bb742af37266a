"""Task heads: text classifiers to fine-tune, one module per model family plus auto dispatch.

It exists to give the training loop one surface for every family (``from_pretrained``, ``on_device``,
``config``, ``labels``, ``encode``, ``collate``, ``compute_loss``, ``predict``, ``graph``, ``save_pretrained``).
Importing it only defines classes. Files:

- ``_base.py``: SequenceClassificationHead, the shared behaviour.
- ``_inputs.py``: checks and parsing of texts, collate items, label names, lengths.
- ``_io.py``: strict checkpoint loading and the error types.
- ``_save.py``: atomic saving.
- ``_losses.py``: labels to tensors, label checks, the losses.
- ``bert.py``, ``distilbert.py``, ``roberta.py``, ``albert.py``, ``xlm_roberta.py``, ``deberta_v2.py``: families.
- ``auto.py``: AutoHeadForSequenceClassification and SUPPORTED_MODEL_TYPES.
"""

from ._base import SequenceClassificationHead
from ._io import CheckpointError, CheckpointNotFoundError
from .albert import AlbertForSequenceClassification
from .auto import SUPPORTED_MODEL_TYPES, AutoHeadForSequenceClassification
from .bert import BertForSequenceClassification
from .deberta_v2 import DebertaV2ForSequenceClassification
from .distilbert import DistilBertForSequenceClassification
from .roberta import RobertaForSequenceClassification
from .xlm_roberta import XLMRobertaForSequenceClassification

__all__ = [
    "AlbertForSequenceClassification",
    "AutoHeadForSequenceClassification",
    "BertForSequenceClassification",
    "CheckpointError",
    "CheckpointNotFoundError",
    "DebertaV2ForSequenceClassification",
    "DistilBertForSequenceClassification",
    "RobertaForSequenceClassification",
    "SUPPORTED_MODEL_TYPES",
    "SequenceClassificationHead",
    "XLMRobertaForSequenceClassification",
]
