"""Masked-LM heads: continue pre-training (domain adaptation) of any supported family, on one or many devices.

It exists so that masked-language-model training has the surface of the other task heads (``from_pretrained``,
``on_device``, ``graph``, ``encode``/``collate``, ``compute_loss``, ``head(**enc)``, ``save_pretrained``,
``push_to_hub``) plus what the task needs: ``collate`` masks the texts (seeded and rank-independent,
``heads._mlm_mask``), ``fill_mask`` agrees with ``transformers.pipeline("fill-mask")`` on the saved model, and
``perplexity`` scores held-out texts under fixed masks. A base checkpoint (e.g. sentence-transformers'
all-MiniLM-L6-v2, a ``BertModel``) loads with a fresh LM head whose decoder is tied to the word embeddings
(``heads._mlm_load``). The shared behaviour is :class:`~heads._mlm_head.MaskedLMHead`; here each family is a
short declaration (where its LM head lives, how it is applied), and ``AutoHeadForMaskedLM`` dispatches on
``config.model_type``.
"""

from __future__ import annotations

from typing import Any


from . import _mlm_logits
from ._auto import AutoHead
from ._mlm_head import MaskedLMHead
from ._mlm_load import LMLayout

__all__ = [
    "MaskedLMHead",
    "BertForMaskedLM",
    "DistilBertForMaskedLM",
    "RobertaForMaskedLM",
    "AlbertForMaskedLM",
    "XLMRobertaForMaskedLM",
    "DebertaV2ForMaskedLM",
    "AutoHeadForMaskedLM",
    "MASKED_LM_HEADS",
]


_BERT_STYLE = ("cls.predictions.bias", "cls.predictions.transform.dense.weight",
               "cls.predictions.transform.dense.bias", "cls.predictions.transform.LayerNorm.weight",
               "cls.predictions.transform.LayerNorm.bias")
_ROBERTA_STYLE = ("lm_head.bias", "lm_head.dense.weight", "lm_head.dense.bias", "lm_head.layer_norm.weight",
                  "lm_head.layer_norm.bias")


class BertForMaskedLM(MaskedLMHead, family="bert", own=_BERT_STYLE, decoder="cls.predictions.decoder.weight",
                      aliases=("cls.predictions.decoder.bias",), lm="cls"):
    """Masked-LM head around ``transformers.BertForMaskedLM`` (LM head ``cls.predictions.*``)."""


class DistilBertForMaskedLM(MaskedLMHead, family="distilbert", decoder="vocab_projector.weight",
                            lm=_mlm_logits.distilbert_lm,
                            own=("vocab_projector.bias", "vocab_transform.weight", "vocab_transform.bias",
                                 "vocab_layer_norm.weight", "vocab_layer_norm.bias")):
    """Masked-LM head around ``transformers.DistilBertForMaskedLM`` (``vocab_transform``, ``vocab_layer_norm``,
    ``vocab_projector``)."""


class RobertaForMaskedLM(MaskedLMHead, family="roberta", own=_ROBERTA_STYLE, decoder="lm_head.decoder.weight",
                         aliases=("lm_head.decoder.bias",), lm="lm_head"):
    """Masked-LM head around ``transformers.RobertaForMaskedLM`` (LM head ``lm_head.*``)."""


class AlbertForMaskedLM(MaskedLMHead, family="albert", decoder="predictions.decoder.weight",
                        own=("predictions.bias", "predictions.dense.weight", "predictions.dense.bias",
                             "predictions.LayerNorm.weight", "predictions.LayerNorm.bias"),
                        aliases=("predictions.decoder.bias",), lm="predictions"):
    """Masked-LM head around ``transformers.AlbertForMaskedLM`` (LM head ``predictions.*``)."""


class XLMRobertaForMaskedLM(MaskedLMHead, family="xlm-roberta", own=_ROBERTA_STYLE,
                            decoder="lm_head.decoder.weight", aliases=("lm_head.decoder.bias",), lm="lm_head"):
    """Masked-LM head around ``transformers.XLMRobertaForMaskedLM`` (LM head ``lm_head.*``)."""


_DEBERTA_V3_LAYOUT = LMLayout(
    ("lm_predictions.lm_head.bias", "lm_predictions.lm_head.dense.weight", "lm_predictions.lm_head.dense.bias",
     "lm_predictions.lm_head.LayerNorm.weight", "lm_predictions.lm_head.LayerNorm.bias"),
    "", "deberta.embeddings.word_embeddings.weight",
)


class DebertaV2ForMaskedLM(MaskedLMHead, family="deberta-v2", own=_BERT_STYLE,
                           decoder="cls.predictions.decoder.weight", aliases=("cls.predictions.decoder.bias",),
                           lm=_mlm_logits.deberta_v2_lm):
    """Masked-LM head around ``transformers.DebertaV2ForMaskedLM``: ``cls.predictions.*`` under ``config.legacy``
    (the default); with ``legacy=False`` (DeBERTa-v3's own layout) ``lm_predictions.lm_head.*``, which multiplies
    by the word embeddings without a decoder module."""

    @classmethod
    def layout_of(cls, config: Any) -> LMLayout:
        return cls.layout if getattr(config, "legacy", True) else _DEBERTA_V3_LAYOUT


MASKED_LM_HEADS: dict[str, type[MaskedLMHead]] = {
    cls.model_type: cls
    for cls in (BertForMaskedLM, DistilBertForMaskedLM, RobertaForMaskedLM, AlbertForMaskedLM,
                XLMRobertaForMaskedLM, DebertaV2ForMaskedLM)
}
"""``model_type`` -> masked-LM head class."""


class AutoHeadForMaskedLM(AutoHead):
    """Dispatch to the masked-LM head class of a checkpoint's or config's ``model_type``. Not instantiable."""

    head_classes = MASKED_LM_HEADS
    replica_call = ".on_device(config, None, device)"
