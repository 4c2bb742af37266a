"""The train job, one pipeline for every task (eval and predict score through its task plug-ins), one concern per
module.

It exists so that the job's settings can be followed through its code in one place, apart from the engine
(``Trainer``, ``Graph``, El Che, the builder): the engine never imports this package, nor do ``data``,
``export`` and ``files``; only the CLI (``flodl_hf.cli``, the composition root) and the examples do. It never
imports ``heads``: the head classes are passed in. Importing the package imports none of its modules.

* ``settings``: ``TrainSettings``, every option of a job (``task`` included), validated at construction.
* ``run``: ``run_train``, the orchestration: settings -> data -> head -> loop -> evaluation -> output directory.
* ``tasks``: the task plug-ins (text classification, token classification, question answering, fill-mask): what
  differs per task, behind one interface.
* ``preflight``: the job's validate-first checks (paths, ownership, ``--resume``, devices, disk, label order).
* ``schedule``: ``TrainerSchedule``, transformers' schedule kept on the run's sample position (and the earlier
  ``LinearSchedule``).
* ``optim``: the job's AdamW (fused where torch has the kernel).
* ``loop``: the training loop (checkpoints, Ctrl-C, divergence, periodic evaluation, early stopping);
  ``interrupt``: its Ctrl-C / SIGTERM handling.
* ``checkpoints``: the checkpoint directory, the plan a resume must match, resuming.
* ``evaluate``: the best periodic evaluation's weights.
* ``outputs``: the run's metrics.json fields, the model card's training table, the loss curve, TensorBoard, and
  writing the output directory in one atomic swap.
"""

__all__: list = []
