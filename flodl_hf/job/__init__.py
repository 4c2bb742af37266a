"""The ``flodl-hf train`` job, one concern per module.

It exists so that the job's settings can be followed through its code in one place, apart from the engine
(``Trainer``, ``Graph``, El Che, the builder): the engine never imports this package, and only the CLI
(``flodl_hf.cli``, the composition root) and the examples do. Importing the package imports none of its modules.

* ``settings``: ``TrainSettings``, every option of a job, validated at construction.
* ``run``: ``run_train``, the orchestration: settings -> data -> head -> loop -> evaluation -> output directory.
* ``preflight``: the job's validate-first checks (paths, ownership, ``--resume``, devices, disk, label order).
* ``schedule``: ``LinearSchedule``, the warmup-then-decay learning rate.
* ``loop``: the training loop (checkpoints, Ctrl-C, divergence, periodic evaluation, early stopping).
* ``checkpoints``: the checkpoint directory, the plan a resume must match, resuming.
* ``evaluate``: scoring a head on held-out data, and the best evaluation's weights.
* ``problems``: problem types (single-label, multi-label, regression) and their metrics.
* ``outputs``: ``metrics.json``, the model card's training table, the loss curve, TensorBoard, and writing the
  output directory in one atomic swap.
"""
