"""El Che, the cadence scheduler: how much of every step each device takes, and how long a window runs.

It exists as a package so that the scheduler's rules live apart from the runtime that applies them (setup mode's
``distributed.window``, the builder's coordinator): both feed it measured times and read back a split and an anchor.

The scheduler core is pure Python and deterministic (``scheduler``: ``ElChe``; ``split``: the integer split by
speed; ``goodput``: the window rule; ``noise_scale``: the gradient noise scale it reads; ``lr_scaling``: the opt-in
AdaScale LR rule; ``plan_record``: the plan a run followed, recorded and replayed), so it is unit-tested on
numbers alone and imports without torch. Beside it sit the two torch-side pieces El Che needs on a device:
``partition`` (which samples of an epoch's permutation each rank takes) and ``memory_probe`` (the largest
micro-batch a device can train). Nothing is imported here, so ``import flodl_hf.elche.scheduler`` stays torch-free.
"""

__all__: list[str] = []
