"""What an image-classification run reports besides its metrics: time and memory per epoch, the confusion matrix (CSV
and a figure) and the model card."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import numpy as np
import torch
from transformers import TrainerCallback

from ..extras import require_extra


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far (Linux reports KiB, macOS bytes); NaN on Windows."""
    try:
        import resource
    except ImportError:
        return float("nan")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if os.uname().sysname == "Darwin" else peak / 1024


class EpochStatsCallback(TrainerCallback):
    """Wall time (without evaluation), steps and peak memory of every epoch."""

    def __init__(self):
        self.epochs: list[dict] = []

    def on_epoch_begin(self, args, state, control, **kwargs):
        self._start, self._step = time.perf_counter(), state.global_step
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()

    def on_epoch_end(self, args, state, control, **kwargs):
        stats = {
            "epoch": round(state.epoch, 3),
            "seconds": round(time.perf_counter() - self._start, 2),
            "steps": state.global_step - self._step,
            "peak_rss_mib": round(peak_rss_mib(), 1),
        }
        if torch.cuda.is_available():
            stats["peak_cuda_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        self.epochs.append(stats)


def confusion_matrix(labels: Sequence[int], predictions: Sequence[int], num_classes: int) -> np.ndarray:
    """Counts of (true class, predicted class) pairs, shape (num_classes, num_classes)."""
    matrix = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(matrix, (np.asarray(labels, dtype=np.int64), np.asarray(predictions, dtype=np.int64)), 1)
    return matrix


def draw_confusion_matrix(
    axes, matrix, names: Sequence[str], title: str = "", fontsize: float = 10, rotation: float | None = None
):
    """One confusion matrix (rows: true class, columns: predicted) on the matplotlib Axes ``axes``: the counts in
    blue, each written in its cell (white above half the largest count), the class names as tick labels in
    ``fontsize`` points (the counts 2 points smaller), the predicted ones turned by ``rotation`` degrees (by default
    90 with more than 10 classes, else 0). With more than 30 classes the labels and counts are left out, as they
    would overlap. Returns the image that ``imshow`` made, for a colour bar."""
    matrix = np.asarray(matrix)
    n = len(names)
    shown = axes.imshow(matrix, cmap="Blues")
    axes.set(xlabel="predicted", ylabel="true", title=title)
    if n <= 30:
        if rotation is None:
            rotation = 90 if n > 10 else 0
        axes.set_xticks(range(n), labels=names, rotation=rotation, fontsize=fontsize)
        axes.set_yticks(range(n), labels=names, fontsize=fontsize)
        threshold = matrix.max() / 2 if matrix.size else 0
        for (row, col), count in np.ndenumerate(matrix):
            color = "white" if count > threshold else "black"
            axes.text(col, row, str(count), ha="center", va="center", fontsize=fontsize - 2, color=color)
    return shown


def plot_confusion_matrix(
    matrix: np.ndarray, label_names: Sequence[str], path: str | os.PathLike, title: str = ""
) -> None:
    """A confusion-matrix PNG (:func:`draw_confusion_matrix` with a colour bar), drawn without pyplot's global
    state."""
    require_extra("matplotlib", "plot")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    side = min(max(4.0, 0.45 * len(label_names) + 2), 14.0)
    figure = Figure(figsize=(side, side * 0.9))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    shown = draw_confusion_matrix(axes, matrix, label_names, title)
    figure.colorbar(shown, ax=axes, fraction=0.046, pad=0.04)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def write_image_model_card(output_dir: str, results: dict, repo_id: str | None = None) -> None:
    """``README.md`` of the output folder (``orchid_hf.cards``), with the accuracy in its model-index."""
    from ..cards import write_model_card

    hub_id = results.get("hub_dataset")
    dataset_name = hub_id or ("scikit-learn digits" if results["dataset"] == "digits" else results["dataset"])
    model = results["model"]
    write_model_card(
        output_dir,
        task="image-classification",
        model_name=repo_id,
        repo_id=repo_id,
        datasets=[hub_id] if hub_id else None,
        base_model=results.get("base_model"),
        results=[
            {
                "dataset_type": hub_id or "imagefolder",
                "dataset_name": dataset_name,
                "dataset_split": results["eval_split"],
                "metric_type": "accuracy",
                "metric_value": round(results["accuracy"], 4),
            }
        ]
        if "accuracy" in results
        else None,
        description=(
            f"An image classifier ({model['model_type']}, {results['num_parameters']:,} parameters) trained with "
            f"`scripts/train_image.py` (recipe `{results['recipe']}`) on {dataset_name}."
        ),
        training={
            "recipe": results["recipe"],
            "model": ", ".join(f"{k}={v}" for k, v in model.items()),
            **results["hyperparameters"],
            "epochs": results.get("epochs"),
            "training images": results["num_train"],
        },
        example_input='"digit.png"' if results["dataset"] == "digits" else None,
    )


__all__ = [
    "EpochStatsCallback",
    "confusion_matrix",
    "draw_confusion_matrix",
    "peak_rss_mib",
    "plot_confusion_matrix",
    "write_image_model_card",
]
