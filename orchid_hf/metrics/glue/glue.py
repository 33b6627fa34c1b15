"""GLUE's official metrics, offline: the metric module of ``evaluate.load("glue", task)`` without the Hub.

    import evaluate
    glue = evaluate.load("path/to/orchid_hf/metrics/glue", "mrpc")   # or orchid_hf.metrics.load_metric("glue", "mrpc")
    glue.compute(predictions=[1, 0, 1], references=[1, 1, 1])        # {'accuracy': 0.667, 'f1': 0.8}

Same configurations, input types, result names and values as the Hub's ``glue`` metric (which uses scikit-learn
and SciPy); here the classification metrics are computed with NumPy, the correlations with SciPy.
"""

import datasets
import evaluate
import numpy as np
from scipy.stats import pearsonr, spearmanr

_DESCRIPTION = """The official metric of each GLUE task: Matthews correlation (CoLA), accuracy and F1 of the positive
class (MRPC, QQP), Pearson and Spearman correlation (STS-B), accuracy elsewhere (SST-2, MNLI, QNLI, RTE, WNLI, HANS)."""

_KWARGS_DESCRIPTION = """
Args:
    predictions: predicted class ids, or for STS-B predicted similarity scores.
    references: true class ids, or for STS-B the gold scores.
Returns: depending on the configuration (the task)
    "accuracy": share of correct predictions;
    "f1": F1 score of class 1 (MRPC, QQP);
    "pearson", "spearmanr": correlations (STS-B);
    "matthews_correlation": Matthews correlation coefficient (CoLA).
Example:
    >>> glue = evaluate.load("orchid_hf/metrics/glue", "mrpc")
    >>> glue.compute(predictions=[0, 1], references=[0, 1])
    {'accuracy': 1.0, 'f1': 1.0}
"""

_CITATION = """@inproceedings{wang2019glue,
  title={{GLUE}: A Multi-Task Benchmark and Analysis Platform for Natural Language Understanding},
  author={Wang, Alex and Singh, Amanpreet and Michael, Julian and Hill, Felix and Levy, Omer and Bowman, Samuel R.},
  booktitle={International Conference on Learning Representations},
  year={2019}
}"""

CONFIGS = (
    "sst2", "mnli", "mnli_mismatched", "mnli_matched", "cola", "stsb", "mrpc", "qqp", "qnli", "rte", "wnli", "hans",
)  # fmt: skip


def accuracy(predictions: np.ndarray, references: np.ndarray) -> float:
    return float((predictions == references).mean())


def f1(predictions: np.ndarray, references: np.ndarray) -> float:
    """F1 of class 1; 0.0 when there is no positive prediction or reference at all (scikit-learn's default)."""
    true_positive = float(np.sum((predictions == 1) & (references == 1)))
    false_positive = float(np.sum((predictions == 1) & (references != 1)))
    false_negative = float(np.sum((predictions != 1) & (references == 1)))
    denominator = 2 * true_positive + false_positive + false_negative
    return 2 * true_positive / denominator if denominator else 0.0


def matthews_correlation(predictions: np.ndarray, references: np.ndarray) -> float:
    """Matthews correlation coefficient for any number of classes (Gorodkin's R_K); 0.0 when it is undefined."""
    classes, encoded = np.unique(np.concatenate([references, predictions]), return_inverse=True)
    true, predicted = encoded[: len(references)], encoded[len(references) :]
    confusion = np.zeros((len(classes), len(classes)), dtype=np.float64)
    np.add.at(confusion, (true, predicted), 1.0)
    true_sum, predicted_sum = confusion.sum(axis=1), confusion.sum(axis=0)
    correct, samples = np.trace(confusion), predicted_sum.sum()
    covariance = correct * samples - np.dot(true_sum, predicted_sum)
    variances = (samples**2 - np.dot(predicted_sum, predicted_sum)) * (samples**2 - np.dot(true_sum, true_sum))
    return float(covariance / np.sqrt(variances)) if variances else 0.0


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Glue(evaluate.Metric):
    def _info(self):
        if self.config_name not in CONFIGS:
            raise KeyError(f"the configuration must be one of the GLUE tasks {list(CONFIGS)}, got {self.config_name!r}")
        value = "float32" if self.config_name == "stsb" else "int64"
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value(value), "references": datasets.Value(value)}),
            codebase_urls=[],
            reference_urls=["https://gluebenchmark.com"],
            format="numpy",
        )

    def _compute(self, predictions, references):
        predictions, references = np.asarray(predictions), np.asarray(references)
        if self.config_name == "cola":
            return {"matthews_correlation": matthews_correlation(predictions, references)}
        if self.config_name == "stsb":
            return {
                "pearson": float(pearsonr(predictions, references)[0]),
                "spearmanr": float(spearmanr(predictions, references)[0]),
            }
        if self.config_name in ("mrpc", "qqp"):
            return {"accuracy": accuracy(predictions, references), "f1": f1(predictions, references)}
        return {"accuracy": accuracy(predictions, references)}
