"""Floors for the real-data comparison, logistic regressions (scikit-learn): on standardised pixels for images,
with the same data loading, accuracy and confusion matrix as the recipe (``scripts/image_baseline.py``); on token
frequencies for the novels' text tasks (``scripts/text_baseline.py``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchmarks.harness import provenance, write_json
from orchid_hf.extras import require_extra
from orchid_hf.vision.data import load_idx_arrays
from orchid_hf.vision.report import confusion_matrix, plot_confusion_matrix


def logistic_regression_baseline(
    train_dir: str | Path,
    output_dir: str | Path,
    class_names: Sequence[str] | None = None,
    max_iter: int = 200,
    C: float = 1.0,
    seed: int = 0,
    max_train_samples: int | None = None,
) -> dict:
    """Fit on the training IDX files of ``train_dir``, evaluate on its t10k files; write ``results.json``,
    ``confusion_matrix.csv`` and ``confusion_matrix.png`` to ``output_dir`` (the keys and files of
    ``scripts/train_image.py``) and return the results. ``seed`` only orders the training images (lbfgs on this
    convex problem reaches the same solution from any order)."""
    require_extra("sklearn", "vision")
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    if max_iter < 1:
        raise ValueError(f"max_iter must be >= 1, got {max_iter}")
    splits = load_idx_arrays(train_dir)
    if "test" not in splits:
        raise ValueError(f"{train_dir} has no t10k-images/t10k-labels IDX files to evaluate on")
    (train_x, train_y), (test_x, test_y) = splits["train"], splits["test"]
    order = np.random.default_rng(seed).permutation(len(train_x))[:max_train_samples]
    train_x, train_y = train_x[order], train_y[order]
    num_classes = int(max(train_y.max(), test_y.max())) + 1
    names = list(class_names) if class_names else [str(i) for i in range(num_classes)]
    if len(names) != num_classes:
        raise ValueError(f"class_names gives {len(names)} names, but the labels have {num_classes} classes")

    started = time.perf_counter()
    scaler = StandardScaler().fit(train_x.reshape(len(train_x), -1).astype(np.float64))
    model = LogisticRegression(max_iter=max_iter, C=C)
    model.fit(scaler.transform(train_x.reshape(len(train_x), -1)), train_y)
    train_seconds = time.perf_counter() - started
    predictions = model.predict(scaler.transform(test_x.reshape(len(test_x), -1)))
    matrix = confusion_matrix(test_y, predictions, num_classes)
    accuracy = float(np.trace(matrix) / matrix.sum())
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    results = {
        "dataset": str(train_dir),
        "eval_split": "test (t10k files)",
        "model": {"model_type": "logistic-regression", "C": C, "max_iter": max_iter,
                  "iterations": int(np.max(model.n_iter_))},
        "num_parameters": int(model.coef_.size + model.intercept_.size),
        "num_train": len(train_x),
        "num_eval": len(test_x),
        "seed": seed,
        "accuracy": accuracy,
        "per_class_accuracy": {n: float(matrix[i, i] / max(matrix[i].sum(), 1)) for i, n in enumerate(names)},
        "confusion_matrix": matrix.tolist(),
        "train_seconds": round(train_seconds, 2),
        **provenance(),
    }  # fmt: skip
    write_json(output_dir / "results.json", results)
    np.savetxt(output_dir / "confusion_matrix.csv", matrix, fmt="%d", delimiter=",")
    title = f"logistic regression: accuracy {accuracy:.4f} on {len(test_x)} test images"
    plot_confusion_matrix(matrix, names, output_dir / "confusion_matrix.png", title=title)
    return results


def read_task_csv(path: Path) -> tuple[list[tuple[str, ...]], list[str]]:
    """The texts (one or two per row: ``sentence`` or ``sentence1``, ``sentence2``) and labels of a task file of
    scripts/prepare_novels.py."""
    import csv

    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        raise ValueError(f"{path} has no rows")
    columns = ("sentence",) if "sentence" in rows[0] else ("sentence1", "sentence2")
    missing = [c for c in (*columns, "label") if c not in rows[0]]
    if missing:
        raise ValueError(f"{path} lacks the column(s) {missing}; it has {list(rows[0])}")
    return [tuple(row[c] for c in columns) for row in rows], [row["label"] for row in rows]


def token_frequency_features(texts: list[tuple[str, ...]], tokenizer):
    """Sparse features of each row: the frequencies of the tokenizer's tokens in a passage (x 100, each row summing
    to 100); for a pair of passages a and b, which tokens both contain beside which only one of them contains (0 or
    1 each), which a linear model can weigh into "same novel or not" (the counts of a and b side by side could not:
    sharing a name is evidence whichever name it is)."""
    from scipy.sparse import csr_matrix, hstack

    def frequencies(column: list[str]):
        ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in column]
        rows = np.repeat(np.arange(len(ids)), [len(i) for i in ids])
        columns = np.fromiter((t for i in ids for t in i), dtype=np.int64, count=len(rows))
        counts = csr_matrix((np.ones(len(rows)), (rows, columns)), shape=(len(ids), len(tokenizer)))
        totals = np.maximum(np.asarray(counts.sum(1)).ravel(), 1)
        return csr_matrix(counts.multiply(100.0 / totals[:, None]))

    columns = [frequencies([row[k] for row in texts]) for k in range(len(texts[0]))]
    if len(columns) == 1:
        return columns[0]
    a, b = ((column > 0).astype(np.float64) for column in columns)
    return hstack([a.multiply(b), abs(a - b)]).tocsr()


def check_logistic_settings(C: Sequence[float], max_iter: int) -> None:
    """A ``ValueError`` for a choice of C or an iteration cap that no logistic regression can take."""
    if max_iter < 1:
        raise ValueError(f"max_iter must be >= 1, got {max_iter}")
    if not C or min(C) <= 0:
        raise ValueError(f"C must be one or more positive numbers, got {list(C)}")


def choose_and_score(features: dict, labels: dict, C: Sequence[float], max_iter: int) -> dict:
    """A logistic regression fitted on ``features["train"]`` once per value of ``C``, the value that scores best on
    ``features["validation"]`` chosen (on ties the smallest), and that model scored on ``features["test"]``, as the
    grid of scripts/real_data.sh treats the neural models: the validation accuracies, the chosen C, the test
    accuracy, the majority class's test accuracy, the example counts and the fitting time."""
    from sklearn.linear_model import LogisticRegression

    check_logistic_settings(C, max_iter)
    started = time.perf_counter()
    models, validation = {}, {}
    for c in sorted(C):
        models[c] = LogisticRegression(C=c, max_iter=max_iter).fit(features["train"], labels["train"])
        validation[c] = float((models[c].predict(features["validation"]) == labels["validation"]).mean())
    chosen = max(sorted(C), key=lambda c: (validation[c], -c))
    train_seconds = time.perf_counter() - started
    _, counts = np.unique(labels["test"], return_counts=True)
    return {
        "validation_accuracy": {f"{c:g}": validation[c] for c in sorted(C)},
        "chosen_C": chosen,
        "accuracy": float((models[chosen].predict(features["test"]) == labels["test"]).mean()),
        "majority_class_accuracy": float(counts.max() / counts.sum()),
        "num_train": len(labels["train"]),
        "num_eval": len(labels["test"]),
        "train_seconds": round(train_seconds, 2),
    }


def text_logistic_regression_baseline(
    task_dir: str | Path,
    tokenizer_name: str | Path,
    output_dir: str | Path,
    C: Sequence[float] = (0.1, 1.0, 10.0),
    max_iter: int = 1000,
) -> dict:
    """Fit on ``train.csv`` of ``task_dir`` once per value of ``C``, choose the value that scores best on
    ``validation.csv`` (on ties the smallest), and score that model on ``test.csv``, as the grid of
    scripts/real_data.sh treats the neural models; write ``results.json`` to ``output_dir`` and return it."""
    require_extra("sklearn", "vision")
    from transformers import AutoTokenizer

    check_logistic_settings(C, max_iter)
    task_dir = Path(task_dir)
    splits = {name: read_task_csv(task_dir / f"{name}.csv") for name in ("train", "validation", "test")}
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_name))
    features = {name: token_frequency_features(texts, tokenizer) for name, (texts, _) in splits.items()}
    labels = {name: np.asarray(values) for name, (_, values) in splits.items()}
    results = {
        "task_dir": str(task_dir),
        "model": {"model_type": "logistic-regression", "max_iter": max_iter,
                  "features": "token frequencies" if len(splits["train"][0][0]) == 1
                  else "tokens both passages contain, and tokens only one contains"},
        **choose_and_score(features, labels, C, max_iter),
        **provenance(),
    }  # fmt: skip
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    write_json(output_dir / "results.json", results)
    return results


__all__ = [
    "check_logistic_settings",
    "choose_and_score",
    "logistic_regression_baseline",
    "read_task_csv",
    "text_logistic_regression_baseline",
    "token_frequency_features",
]
