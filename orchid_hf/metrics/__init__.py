"""Metric modules of the recipes, written as ``evaluate.Metric`` subclasses and loaded with ``evaluate.load(path)``,
so they work without the Hub:

| name | what | the Hub module it matches |
|---|---|---|
| ``glue`` | GLUE's official metric per task (configuration = task) | ``evaluate.load("glue", task)`` |
| ``accuracy`` | accuracy (images, own classification data) | ``evaluate.load("accuracy")`` |
| ``masked_lm`` | masked-token accuracy and perplexity | (none) |

>>> from orchid_hf.metrics import load_metric, metric_path
>>> load_metric("glue", "cola").compute(predictions=[1, 0], references=[1, 0])
{'matthews_correlation': 1.0}
>>> import evaluate; evaluate.load(str(metric_path("accuracy")))  # the same module, by path
"""

from __future__ import annotations

from pathlib import Path

from ..extras import require_extra

METRICS_DIR = Path(__file__).resolve().parent
METRICS = ("glue", "accuracy", "masked_lm")


def metric_path(name: str) -> Path:
    """The folder of a metric module (``evaluate.load`` takes it, or the ``<name>.py`` file inside it)."""
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; the metrics are {', '.join(METRICS)}")
    return METRICS_DIR / name


def load_metric(name: str, config_name: str | None = None, **kwargs):
    """``evaluate.load`` of one of the metric modules above, kept in memory (no cache files are written)."""
    evaluate = require_extra("evaluate", "train")
    kwargs.setdefault("keep_in_memory", True)
    return evaluate.load(str(metric_path(name)), config_name, **kwargs)


__all__ = ["METRICS", "METRICS_DIR", "load_metric", "metric_path"]
