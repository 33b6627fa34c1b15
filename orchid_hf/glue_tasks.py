"""The GLUE tasks (their columns, labels, metrics and submission files) and Table C.1's layout of the results:
one score per task, the average of the paper's eight tasks, and the Markdown table."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GlueTask:
    name: str
    sentence_keys: tuple[str, str | None]
    label_names: tuple[str, ...]  # empty for the regression task (STS-B)
    metrics: tuple[str, ...]
    validation_splits: tuple[str, ...] = ("validation",)
    # Test split -> GLUE submission file. The leaderboard wants label names for the NLI tasks, 0/1 elsewhere.
    submission: tuple[tuple[str, str], ...] = ()
    submits_label_names: bool = False

    @property
    def num_labels(self) -> int:
        return len(self.label_names) or 1

    @property
    def is_regression(self) -> bool:
        return not self.label_names

    @property
    def test_splits(self) -> tuple[str, ...]:
        return tuple(split for split, _ in self.submission)


NLI_LABELS = ("entailment", "neutral", "contradiction")
GLUE_TASKS: dict[str, GlueTask] = {
    task.name: task
    for task in (
        GlueTask("cola", ("sentence", None), ("unacceptable", "acceptable"), ("matthews_correlation",),
                 submission=(("test", "CoLA.tsv"),)),
        GlueTask("sst2", ("sentence", None), ("negative", "positive"), ("accuracy",),
                 submission=(("test", "SST-2.tsv"),)),
        GlueTask("mrpc", ("sentence1", "sentence2"), ("not_equivalent", "equivalent"), ("accuracy", "f1"),
                 submission=(("test", "MRPC.tsv"),)),
        GlueTask("qqp", ("question1", "question2"), ("not_duplicate", "duplicate"), ("accuracy", "f1"),
                 submission=(("test", "QQP.tsv"),)),
        GlueTask("stsb", ("sentence1", "sentence2"), (), ("pearson", "spearmanr"), submission=(("test", "STS-B.tsv"),)),
        GlueTask("mnli", ("premise", "hypothesis"), NLI_LABELS, ("accuracy",),
                 ("validation_matched", "validation_mismatched"),
                 submission=(("test_matched", "MNLI-m.tsv"), ("test_mismatched", "MNLI-mm.tsv")),
                 submits_label_names=True),
        GlueTask("qnli", ("question", "sentence"), ("entailment", "not_entailment"), ("accuracy",),
                 submission=(("test", "QNLI.tsv"),), submits_label_names=True),
        GlueTask("rte", ("sentence1", "sentence2"), ("entailment", "not_entailment"), ("accuracy",),
                 submission=(("test", "RTE.tsv"),), submits_label_names=True),
        GlueTask("wnli", ("sentence1", "sentence2"), ("not_entailment", "entailment"), ("accuracy",),
                 submission=(("test", "WNLI.tsv"),)),
    )
}  # fmt: skip
# GLUE's diagnostic set: no training data, predicted with the MNLI model, submitted as AX.tsv.
AX_TASK = GlueTask("ax", ("premise", "hypothesis"), NLI_LABELS, (), (), (("test", "AX.tsv"),), True)
# Table C.1's columns, then WNLI, which the paper (like BERT) leaves out of the average.
TABLE_TASKS = ("mnli", "rte", "qnli", "qqp", "sst2", "stsb", "cola", "mrpc")
ALL_TASKS = (*TABLE_TASKS, "wnli")
# Tasks that start from the MNLI fine-tuned model with --from_mnli (Izsak et al.'s protocol, used by the paper).
FROM_MNLI_TASKS = ("rte", "mrpc", "stsb")
# The metric Table C.1 reports per task (MNLI: matched / mismatched accuracy).
SCORE_METRIC = {
    "cola": "matthews_correlation",
    "stsb": "spearmanr",
    "mrpc": "f1",
    "qqp": "f1",
    "sst2": "accuracy",
    "qnli": "accuracy",
    "rte": "accuracy",
    "wnli": "accuracy",
    "mnli": "accuracy",
}
TABLE_HEADERS = {"mnli": "MNLI (m / mm)", "sst2": "SST2", "stsb": "STS-B", "cola": "CoLA"}


def get_task(name: str) -> GlueTask:
    if name not in GLUE_TASKS:
        raise ValueError(f"unknown GLUE task {name!r}; the tasks are {', '.join(ALL_TASKS)}")
    return GLUE_TASKS[name]


# ---------------------------------------------------------------------------------------------
# Table C.1
# ---------------------------------------------------------------------------------------------


def task_score(task: str, metrics: dict[str, dict[str, float]]) -> float | list[float]:
    """The Table C.1 entry of a task, in percent: per-split metrics -> score (MNLI: [matched, mismatched])."""
    spec = get_task(task)
    key = SCORE_METRIC[task]
    scores = [100.0 * metrics[split][key] for split in spec.validation_splits if split in metrics]
    return scores if len(scores) > 1 else scores[0]


def glue_average(scores: dict[str, float | list[float]]) -> float | None:
    """Average of the Table C.1 tasks (MNLI as the mean of m and mm, WNLI left out); None if one is missing."""
    if any(task not in scores for task in TABLE_TASKS):
        return None
    return float(np.mean([float(np.mean(scores[task])) for task in TABLE_TASKS]))


def results_markdown(scores: dict[str, float | list[float]], model_name: str) -> str:
    """A Markdown table laid out like Table C.1 (WNLI appended when present)."""
    tasks = [*TABLE_TASKS, *(("wnli",) if "wnli" in scores else ())]

    def cell(task: str) -> str:
        if task not in scores:
            return "–"
        value = scores[task]
        return " / ".join(f"{v:.2f}" for v in value) if isinstance(value, list) else f"{value:.2f}"

    average = glue_average(scores)
    header = ["Model", *(TABLE_HEADERS.get(task, task.upper()) for task in tasks), "Average"]
    row = [model_name, *(cell(task) for task in tasks), f"{average:.2f}" if average is not None else "–"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), "| " + " | ".join(row) + " |"]
    return "\n".join(lines) + "\n"


__all__ = [
    "ALL_TASKS",
    "AX_TASK",
    "FROM_MNLI_TASKS",
    "GLUE_TASKS",
    "SCORE_METRIC",
    "TABLE_TASKS",
    "GlueTask",
    "get_task",
    "glue_average",
    "results_markdown",
    "task_score",
]
