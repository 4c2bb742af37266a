"""The order of ``TrainSettings``' refusals: a task's own refusals (its unsupported options, then a
``--metric-for-best`` it does not report) come before the checks every task shares, as they did before the job
became one pipeline; text classification checks its metric after the problem type the metric depends on."""

from __future__ import annotations

import pytest

from flodl_hf.job.settings import TrainSettings


@pytest.mark.parametrize("task", ["token-classification", "question-answering", "fill-mask"])
def test_a_tasks_unknown_metric_is_named_before_the_shared_checks(task):
    with pytest.raises(ValueError, match=rf"--metric-for-best bogus is not a metric of --task {task}"):
        TrainSettings(task=task, metric_for_best="bogus", early_stopping_patience=2)


def test_question_answering_refuses_the_memory_probe_before_the_metric():
    with pytest.raises(ValueError, match="--max-micro-batch auto is not supported with --task question-answering"):
        TrainSettings(task="question-answering", metric_for_best="bogus", max_micro_batch="auto")


def test_text_classification_checks_its_metric_after_the_problem_type():
    with pytest.raises(ValueError, match="problem_type='nope' is invalid"):
        TrainSettings(problem_type="nope", metric_for_best="bogus")
    with pytest.raises(ValueError, match="bogus"):
        TrainSettings(problem_type="regression", metric_for_best="bogus")
