"""Task heads to fine-tune: text classification, token classification, extractive QA and masked LM, for six
model families, each with auto dispatch on ``config.model_type``.

It exists to give the training loop one surface for every family (``from_pretrained``, ``on_device``,
``config``, ``labels``, ``encode``, ``collate``, ``compute_loss``, ``predict``, ``graph``, ``save_pretrained``,
``push_to_hub``), which also keeps a transformers user's habits (``head(**enc)``, sentence pairs, ``pipeline``
agreeing with ``predict``). Importing it only defines classes. Files:

- ``_base.py``: SequenceClassificationHead, the shared behaviour.
- ``_inputs.py``: checks and parsing of texts, sentence pairs, collate items, label names, lengths.
- ``_encode.py``: tokenising texts and pairs like transformers does; ranking outputs into predictions.
- ``_run.py``: ``head(**enc)`` (a ``SequenceClassifierOutput``) and ``predict``.
- ``_load.py``: the steps of ``from_pretrained`` (and the saved ``max_length``).
- ``_hub.py``: transformers' ``from_pretrained`` keywords; ``push_to_hub``.
- ``_io.py``: strict checkpoint loading and the error types.
- ``_save.py``: atomic saving; the tokenizer saved with the head's ``max_length``.
- ``_losses.py``: labels to tensors, label checks, the losses.
- ``bert.py``, ``distilbert.py``, ``roberta.py``, ``albert.py``, ``xlm_roberta.py``, ``deberta_v2.py``: families.
- ``auto.py``: AutoHeadForSequenceClassification and SUPPORTED_MODEL_TYPES.
- ``_task.py``: TaskHead, what every task head shares; ``families.py``: each family's task-independent facts.
- ``token_classification.py`` (+ ``_token_classification_*.py``): token classification heads, six families and
  AutoHeadForTokenClassification.
- ``question_answering.py`` (+ ``_qa_*.py``): extractive QA heads, six families and AutoHeadForQuestionAnswering.
- ``masked_lm.py`` (+ ``_mlm_*.py``): masked-LM heads for the six families and AutoHeadForMaskedLM.
"""

from ._base import SequenceClassificationHead
from ._io import CheckpointError, CheckpointNotFoundError
from .albert import AlbertForSequenceClassification
from .auto import SUPPORTED_MODEL_TYPES, AutoHeadForSequenceClassification
from .bert import BertForSequenceClassification
from .deberta_v2 import DebertaV2ForSequenceClassification
from .distilbert import DistilBertForSequenceClassification
from .masked_lm import (
    AlbertForMaskedLM,
    AutoHeadForMaskedLM,
    BertForMaskedLM,
    DebertaV2ForMaskedLM,
    DistilBertForMaskedLM,
    MaskedLMHead,
    RobertaForMaskedLM,
    XLMRobertaForMaskedLM,
)
from .question_answering import (
    AlbertForQuestionAnswering,
    AutoHeadForQuestionAnswering,
    BertForQuestionAnswering,
    DebertaV2ForQuestionAnswering,
    DistilBertForQuestionAnswering,
    QuestionAnsweringHead,
    RobertaForQuestionAnswering,
    XLMRobertaForQuestionAnswering,
)
from .roberta import RobertaForSequenceClassification
from .token_classification import (
    AlbertForTokenClassification,
    AutoHeadForTokenClassification,
    BertForTokenClassification,
    DebertaV2ForTokenClassification,
    DistilBertForTokenClassification,
    RobertaForTokenClassification,
    TokenClassificationHead,
    XLMRobertaForTokenClassification,
)
from .xlm_roberta import XLMRobertaForSequenceClassification

__all__ = [
    "AlbertForMaskedLM",
    "AutoHeadForMaskedLM",
    "BertForMaskedLM",
    "DebertaV2ForMaskedLM",
    "DistilBertForMaskedLM",
    "MaskedLMHead",
    "RobertaForMaskedLM",
    "XLMRobertaForMaskedLM",
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
    "AlbertForTokenClassification",
    "AutoHeadForTokenClassification",
    "BertForTokenClassification",
    "DebertaV2ForTokenClassification",
    "DistilBertForTokenClassification",
    "RobertaForTokenClassification",
    "TokenClassificationHead",
    "XLMRobertaForTokenClassification",
    "AlbertForQuestionAnswering",
    "AutoHeadForQuestionAnswering",
    "BertForQuestionAnswering",
    "DebertaV2ForQuestionAnswering",
    "DistilBertForQuestionAnswering",
    "QuestionAnsweringHead",
    "RobertaForQuestionAnswering",
    "XLMRobertaForQuestionAnswering",
]
