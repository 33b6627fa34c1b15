"""A floor for image classifiers: multinomial logistic regression on standardised pixels (scikit-learn), with the
same data loading, accuracy and confusion matrix as the recipe. ``scripts/image_baseline.py`` is the command line."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from orchid_hf.extras import require_extra
from orchid_hf.runs import write_json
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
    }  # fmt: skip
    write_json(output_dir / "results.json", results)
    np.savetxt(output_dir / "confusion_matrix.csv", matrix, fmt="%d", delimiter=",")
    title = f"logistic regression: accuracy {accuracy:.4f} on {len(test_x)} test images"
    plot_confusion_matrix(matrix, names, output_dir / "confusion_matrix.png", title=title)
    return results


__all__ = ["logistic_regression_baseline"]
