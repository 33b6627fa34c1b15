"""The metric modules (evaluate.Metric subclasses) against values computed by hand, through evaluate.load(path)."""

import math

import evaluate
import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr

from orchid_hf.metrics import METRICS, load_metric, metric_path


@pytest.fixture(scope="module")
def glue():
    """One loaded module per GLUE configuration, loaded by path as a user would."""
    path = str(metric_path("glue"))
    return lambda task: evaluate.load(path, task, keep_in_memory=True)


def test_modules_load_by_path_without_the_hub():
    for name in METRICS:
        assert (metric_path(name) / f"{name}.py").is_file()
    module = evaluate.load(str(metric_path("accuracy")), keep_in_memory=True)
    assert isinstance(module, evaluate.Metric)
    assert module.compute(predictions=[0, 1, 2, 2], references=[0, 1, 2, 0]) == {"accuracy": 0.75}
    with pytest.raises(ValueError, match="unknown metric 'bleu'; the metrics are glue, accuracy, masked_lm"):
        metric_path("bleu")


def test_glue_classification_metrics_by_hand(glue):
    predictions, labels = [1, 1, 0, 0, 1, 0], [1, 0, 0, 0, 1, 1]
    # TP=2, FP=1, TN=2, FN=1: accuracy 4/6, F1 = 2TP / (2TP + FP + FN) = 4/6.
    assert glue("mrpc").compute(predictions=predictions, references=labels) == pytest.approx(
        {"accuracy": 4 / 6, "f1": 4 / 6}
    )
    assert glue("qqp").compute(predictions=predictions, references=labels) == pytest.approx(
        {"accuracy": 4 / 6, "f1": 4 / 6}
    )
    # Matthews: (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (4 - 1) / sqrt(3*3*3*3) = 1/3.
    assert glue("cola").compute(predictions=predictions, references=labels) == pytest.approx(
        {"matthews_correlation": 1 / 3}
    )
    for task in ("sst2", "qnli", "rte", "wnli", "mnli", "mnli_matched", "mnli_mismatched", "hans"):
        assert glue(task).compute(predictions=predictions, references=labels) == pytest.approx({"accuracy": 4 / 6})
    # Three classes: Gorodkin's R_K from the confusion matrix [[2, 1, 0], [0, 2, 0], [1, 0, 1]].
    predictions, labels = [0, 0, 1, 1, 1, 2, 0], [0, 0, 0, 1, 1, 2, 2]
    confusion = np.array([[2, 1, 0], [0, 2, 0], [1, 0, 1]], dtype=float)
    t, p, c, n = confusion.sum(1), confusion.sum(0), np.trace(confusion), confusion.sum()
    expected = (c * n - t @ p) / math.sqrt((n * n - p @ p) * (n * n - t @ t))
    assert glue("cola").compute(predictions=predictions, references=labels)["matthews_correlation"] == pytest.approx(
        expected
    )
    # Degenerate cases give 0.0, as scikit-learn does: one predicted class, no positive at all.
    assert glue("cola").compute(predictions=[1, 1, 1], references=[0, 1, 1]) == {"matthews_correlation": 0.0}
    assert glue("mrpc").compute(predictions=[0, 0], references=[0, 0]) == {"accuracy": 1.0, "f1": 0.0}
    with pytest.raises(KeyError, match="must be one of the GLUE tasks"):
        glue("squad")


def test_glue_regression_metrics_by_hand(glue):
    scores, gold = np.array([1.0, 2.0, 3.0, 4.0]), np.array([2.0, 4.0, 6.0, 8.5])
    result = glue("stsb").compute(predictions=scores, references=gold)
    assert result["spearmanr"] == pytest.approx(1.0)  # the same order
    centred_x, centred_y = scores - scores.mean(), gold - gold.mean()
    by_hand = (centred_x @ centred_y) / math.sqrt((centred_x @ centred_x) * (centred_y @ centred_y))
    assert result["pearson"] == pytest.approx(by_hand, rel=1e-6) and result["pearson"] < 1.0
    assert result["pearson"] == pytest.approx(pearsonr(scores, gold)[0], rel=1e-6)
    shuffled = np.array([3.0, 1.0, 4.0, 2.0])
    assert glue("stsb").compute(predictions=shuffled, references=gold)["spearmanr"] == pytest.approx(
        spearmanr(shuffled, gold)[0]
    )


def test_accuracy_options():
    accuracy = load_metric("accuracy")
    assert accuracy.compute(predictions=[1, 0, 1], references=[1, 1, 1], normalize=False) == {"accuracy": 2.0}
    weighted = accuracy.compute(predictions=[1, 0, 1], references=[1, 1, 1], sample_weight=[1.0, 2.0, 1.0])
    assert weighted == {"accuracy": 0.5}
    with pytest.raises(ValueError, match="2 weights for 3 predictions"):
        accuracy.compute(predictions=[1, 0, 1], references=[1, 1, 1], sample_weight=[1.0, 2.0])


def test_masked_lm_metric_by_hand():
    masked_lm = load_metric("masked_lm")
    # Three scored tokens (two right), one unscored whose loss must not count.
    result = masked_lm.compute(
        predictions=[5, 7, 9, 4], references=[5, 8, 9, -100], losses=[0.1, 2.3, 0.6, 50.0]
    )
    assert result["masked_accuracy"] == pytest.approx(2 / 3) and result["masked_tokens"] == 3
    assert result["perplexity"] == pytest.approx(math.exp((0.1 + 2.3 + 0.6) / 3))
    # Batches add up to the same numbers.
    masked_lm.add_batch(predictions=[5, 7], references=[5, 8], losses=[0.1, 2.3])
    masked_lm.add_batch(predictions=[9, 4], references=[9, -100], losses=[0.6, 50.0])
    assert masked_lm.compute() == pytest.approx(result)
    empty = masked_lm.compute(predictions=[1], references=[-100], losses=[0.0])
    assert empty["masked_tokens"] == 0 and math.isnan(empty["masked_accuracy"])


def test_glue_metric_agrees_with_scikit_learn(glue):
    """The Hub's glue module computes F1 and Matthews with scikit-learn; ours gives the same numbers."""
    from sklearn.metrics import f1_score, matthews_corrcoef

    rng = np.random.default_rng(0)
    for _ in range(5):
        labels, predictions = rng.integers(0, 2, 40), rng.integers(0, 2, 40)
        assert glue("mrpc").compute(predictions=predictions, references=labels)["f1"] == pytest.approx(
            f1_score(labels, predictions)
        )
        labels, predictions = rng.integers(0, 3, 40), rng.integers(0, 3, 40)
        assert glue("cola").compute(predictions=predictions, references=labels)[
            "matthews_correlation"
        ] == pytest.approx(matthews_corrcoef(labels, predictions))
