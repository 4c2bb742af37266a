"""``flodl_hf.job.schedule_check``: the LR schedule evaluated at every micro-step before the model loads. Each of
transformers' schedules with its example keywords passes for runs of many lengths; schedules whose keywords slipped
past the domains (called directly here) are refused at the micro-step where the LR leaves [0, --lr]; keywords that
keep the LR inside it but train wrong are refused by their domains."""

from __future__ import annotations

import json

import pytest

from flodl_hf.job.schedule import KWARGS_EXAMPLES, SCHEDULES
from flodl_hf.job.schedule_check import check_keywords, check_schedule


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("total, warmup", [(1, 0), (2, 1), (7, 3), (50, 5), (301, 0)])
def test_every_schedule_with_its_example_passes(name, total, warmup):
    example = KWARGS_EXAMPLES[name]
    kwargs = json.loads(example) if example else None
    if name == "warmup_stable_decay":
        kwargs = {"num_decay_steps": max(1, total // 2)}
    if name == "constant":
        warmup = 0
    if example:
        check_keywords(name, kwargs, 5e-5, example)
    check_schedule(name, kwargs, 5e-5, total, warmup, "--warmup-steps")


@pytest.mark.parametrize("name, kwargs, said", [
    ("polynomial", {"lr_end": -0.001}, "(negative)"),
    ("cosine_with_min_lr", {"min_lr_rate": 1e6}, "above the peak"),
])
def test_an_lr_outside_zero_to_peak_is_refused_at_its_step(name, kwargs, said):
    with pytest.raises(ValueError) as excinfo:
        check_schedule(name, kwargs, 1e-3, 20, 2, "--warmup-steps")
    text = str(excinfo.value)
    assert said in text and "at micro-step" in text and "of 20" in text and "\n" not in text, text


def test_a_warmup_longer_than_the_run_is_refused():
    with pytest.raises(ValueError, match="--warmup-ratio gives a warmup of 21 micro-steps, longer than the run's 20"):
        check_schedule("linear", None, 1e-3, 20, 21, "--warmup-ratio")
    check_schedule("linear", None, 1e-3, 20, 20, "--warmup-ratio")  # as long as the run: the peak on its last step


@pytest.mark.parametrize("name, kwargs, said", [
    ("cosine", {"num_cycles": float("nan")}, "num_cycles=NaN is invalid"),  # its LR: 0 after the warmup
    ("cosine_with_min_lr", {"min_lr_rate": -3.0}, "min_lr_rate=-3.0 is invalid"),  # its LR: 0 for half the run
    ("cosine", {"last_epoch": 3}, "'last_epoch' is not a keyword of --lr-scheduler-type cosine"),
])
def test_keywords_outside_their_domain_are_refused(name, kwargs, said):
    """What leaves the LR inside [0, --lr] but trains wrong is caught by the keyword's domain."""
    with pytest.raises(ValueError) as excinfo:
        check_keywords(name, kwargs, 1e-3, KWARGS_EXAMPLES[name])
    assert said in str(excinfo.value) and "--lr-scheduler-kwargs '" in str(excinfo.value), str(excinfo.value)
