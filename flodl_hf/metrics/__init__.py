"""The scores flodl-hf reports, pure Python (no scikit-learn, scipy or seqeval), one module per kind of task.

It exists so that ``train``, ``eval``, the model cards and user scripts compute every figure the same way, in one
place apart from the job that reports them (``flodl_hf.job``). Importing the package imports the classification
metrics and the loss-curve plot (the documented ``from flodl_hf.metrics import accuracy``); the others load on
demand. Each figure follows the library or official rule people trust for it, and is tested against it on seeded
random cases (``tests/unit/metrics/test_metrics_vs_libraries.py``; the libraries are in the ``dev`` extra only).

* ``classification``: accuracy, macro-F1, per-label scores, confusion matrix (or its non-zero cells); multi-label
  micro- / macro-F1 (scikit-learn's).
* ``regression``: Pearson and Spearman correlations (scipy.stats').
* ``entities``: entity precision / recall / F1 of IOB2 tags (seqeval's default mode), and word accuracy.
* ``squad``: SQuAD exact match and token F1 (the official v1.1 / v2.0 rules).
* ``curves``: the loss-curve PNG.
"""

from .classification import (accuracy, classification_summary, confusion_cells, confusion_matrix, macro_f1,
                             multi_label_summary, per_label_scores)
from .curves import plot_loss_curve

__all__ = ["accuracy", "macro_f1", "per_label_scores", "confusion_matrix", "confusion_cells",
           "classification_summary", "multi_label_summary", "plot_loss_curve"]
