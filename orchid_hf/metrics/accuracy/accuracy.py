"""Accuracy, offline: the metric module of ``evaluate.load("accuracy")`` without the Hub.

    import evaluate
    accuracy = evaluate.load("path/to/orchid_hf/metrics/accuracy")   # or orchid_hf.metrics.load_metric("accuracy")
    accuracy.compute(predictions=[0, 1, 1], references=[0, 1, 0])    # {'accuracy': 0.667}

Same inputs, options and result as the Hub's ``accuracy`` metric, computed with NumPy.
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = "Accuracy: the share of predictions equal to their references (weighted with sample_weight)."

_KWARGS_DESCRIPTION = """
Args:
    predictions: predicted class ids.
    references: true class ids.
    normalize (bool, default True): the share of correct predictions; False: their number (or weight).
    sample_weight (list of float, optional): a weight per example.
Returns:
    "accuracy": float.
Example:
    >>> accuracy = evaluate.load("orchid_hf/metrics/accuracy")
    >>> accuracy.compute(predictions=[0, 1, 2, 2], references=[0, 1, 2, 0])
    {'accuracy': 0.75}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Accuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}),
            format="numpy",
        )

    def _compute(self, predictions, references, normalize=True, sample_weight=None):
        correct = (np.asarray(predictions) == np.asarray(references)).astype(np.float64)
        weights = np.ones_like(correct) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        if weights.shape != correct.shape:
            raise ValueError(f"sample_weight has {weights.shape[0]} weights for {correct.shape[0]} predictions")
        total = float(np.dot(correct, weights))
        return {"accuracy": total / float(weights.sum()) if normalize else total}
