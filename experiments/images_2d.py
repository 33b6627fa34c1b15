"""The report of scripts/images_2d.sh: ViT, Orchid 1-D, Orchid 2-D and the 2-D hybrid on Fashion-MNIST.

A run is the output folder of scripts/train_image.py (``results.json``, ``all_results.json``) or of
scripts/image_baseline.py; its name says what it is: ``pPATCH-MODEL-lrLR-s0`` (a grid point, scored on the validation
split of the training images), ``pPATCH-MODEL-chosen-sSEED`` (the chosen learning rate, scored on the test images),
``logreg`` (the floor). :func:`collect_runs` keeps one JSON per finished run; :func:`render_report` makes the tables
of docs/results/images_2d.md and the README's line from those JSONs alone. Each model is compared with ViT at its patch
size by the difference of their mean per-seed accuracies and its 95% interval (``experiments/real_data/report.py``).
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from benchmarks.harness import provenance, replace_block, table_lines, write_json
from experiments.real_data.report import (
    best_grid_point,
    comparison_words,
    difference_cell,
    difference_interval,
    interval_note,
    machine_block,
    sharing_record,
)

GRID_RUN = re.compile(r"^p(?P<patch>\d+)-(?P<model>[a-z0-9-]+?)-lr(?P<lr>[0-9.e-]+)-s(?P<seed>\d+)$")
CHOSEN_RUN = re.compile(r"^p(?P<patch>\d+)-(?P<model>[a-z0-9-]+?)-chosen-s(?P<seed>\d+)$")
MODELS = {
    "vit": "ViT (transformers)",
    "orchid-1d": "Orchid 1-D (patches as one sequence)",
    "orchid-2d": "Orchid 2-D (over the patch grid)",
    "orchid-2d-hybrid": "Orchid 2-D hybrid (2-D first, then attention)",
}
BLOCKS = "images-2d"  # the generated blocks of docs/results/images_2d.md and the README: <!-- images-2d:NAME -->
BASELINE = "vit"  # the model every other one is compared with


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def run_record(folder: Path) -> dict | None:
    """The record of one finished run (None for a folder that is not a run of scripts/images_2d.sh)."""
    name = folder.name
    results = _read(folder / "results.json")
    if name == "logreg":
        return {"kind": "floor", "name": name, "accuracy": results["accuracy"], "num_eval": results["num_eval"],
                "train_seconds": results["train_seconds"]}  # fmt: skip
    match = GRID_RUN.match(name) or CHOSEN_RUN.match(name)
    if match is None:
        return None
    record = {
        "kind": "grid" if "lr" in match.groupdict() else "test",
        "name": name,
        "patch": int(match["patch"]),
        "model": match["model"],
        "seed": int(match["seed"]),
        "accuracy": results["accuracy"],
        "eval_split": results["eval_split"],
        "num_train": results["num_train"],
        "num_eval": results["num_eval"],
        "num_parameters": results["num_parameters"],
        "steps": results["steps"],
        "epochs": results["epochs"],
        # Training alone: the runs evaluate only after training (--eval_strategy no).
        "train_seconds": results["train_seconds"],
        "train_images_per_second": results["num_train"] * results["epochs"] / results["train_seconds"],
        "hyperparameters": results["hyperparameters"],
    }
    if record["kind"] == "grid":
        record["learning_rate"] = match["lr"]
    metrics = folder / "all_results.json"
    if metrics.is_file():
        evaluation = _read(metrics)
        record["eval_images_per_second"] = evaluation["eval_samples"] / evaluation["eval_runtime"]
    return record


def collect_runs(
    runs_dir: str | Path, results_dir: str | Path, threads_per_run: int = 1, runs_at_a_time: int = 2
) -> list[str]:
    """One JSON per finished run of ``runs_dir`` (a folder with results.json) in ``results_dir``, and
    ``machine.json`` (how the runs shared the machine); each records the commit and the machine of the tree that
    collects the runs (:func:`benchmarks.harness.provenance`); returns the run names kept."""
    runs_dir, results_dir = Path(runs_dir), Path(results_dir)
    made = provenance(threads_per_run)
    kept = []
    for folder in sorted(p for p in runs_dir.iterdir() if (p / "results.json").is_file()):
        record = run_record(folder)
        if record is not None:
            write_json(results_dir / f"{folder.name}.json", {**record, **made})
            kept.append(folder.name)
    if not kept:
        raise ValueError(f"{runs_dir} has no finished run (a folder with results.json) of scripts/images_2d.sh")
    write_json(results_dir / "machine.json", sharing_record(made, threads_per_run, runs_at_a_time))
    return kept


def choose_learning_rate(records: list[dict], patch: int, model: str, learning_rates: list[str]) -> str:
    """The learning rate of ``model`` at ``patch`` whose grid point scores best on the validation split (on ties the
    lowest); a ValueError naming the points that have not finished."""
    points = {r["learning_rate"]: r for r in records if r["kind"] == "grid" and (r["patch"], r["model"]) == (
        patch, model)}  # fmt: skip
    missing = [lr for lr in learning_rates if lr not in points]
    if not learning_rates or missing:
        raise ValueError(f"grid p{patch}-{model}: no finished run for the learning rates {missing or learning_rates}")
    chosen = best_grid_point([(float(lr), points[lr]["accuracy"]) for lr in learning_rates])
    return next(lr for lr in learning_rates if float(lr) == chosen)


def runs_in(runs_dir: str | Path) -> list[dict]:
    """The records of the finished runs in ``runs_dir`` (read from the run folders)."""
    folders = sorted(p for p in Path(runs_dir).iterdir() if (p / "results.json").is_file())
    return [r for r in map(run_record, folders) if r is not None]


def load_records(results_dir: str | Path) -> list[dict]:
    return [_read(path) for path in sorted(Path(results_dir).glob("*.json")) if path.name != "machine.json"]


def _percent(values: list[float]) -> str:
    return " / ".join(f"{100 * v:.2f}" for v in values)


def _test_accuracies(records: list[dict], patch: int, model: str) -> list[float]:
    """The test accuracies of ``model`` at ``patch``, by seed."""
    runs = sorted((r for r in records if r["kind"] == "test" and (r["patch"], r["model"]) == (patch, model)),
                  key=lambda r: r["seed"])  # fmt: skip
    return [r["accuracy"] for r in runs]


def test_table(records: list[dict], learning_rates: list[str]) -> str:
    """Per patch size and model: the chosen learning rate, the test accuracy of each seed and their mean, the
    difference from ViT at that patch size with its interval, and the speed of training and evaluation."""
    tests = [r for r in records if r["kind"] == "test"]
    seeds = " / ".join(str(seed) for seed in sorted({r["seed"] for r in tests}))
    header = ["patches", "model", "parameters", "learning rate (chosen)", f"test accuracy, seeds {seeds} (%)", "mean",
              "− ViT, points (95% interval)", "training time", "training images/s", "test images/s"]
    rows = []
    ends = (min(learning_rates, key=float), max(learning_rates, key=float))  # a choice there may lie beyond the grid
    for patch in sorted({r["patch"] for r in tests}, reverse=True):
        tokens = (28 // patch) ** 2
        baseline = _test_accuracies(records, patch, BASELINE)
        for model in MODELS:
            runs = [r for r in tests if (r["patch"], r["model"]) == (patch, model)]
            if not runs:
                continue
            lr = choose_learning_rate(records, patch, model, learning_rates)
            accuracies = _test_accuracies(records, patch, model)
            rows.append([
                f"{patch}x{patch} ({tokens} tokens)", MODELS[model], f"{runs[0]['num_parameters']:,}",
                lr + (" (the grid's edge)" if lr in ends else ""),
                _percent(accuracies), f"**{100 * statistics.mean(accuracies):.2f}**",
                difference_cell(accuracies, None if model == BASELINE or not baseline else baseline, digits=2),
                f"{statistics.mean(r['train_seconds'] for r in runs) / 60:.1f} min",
                f"{statistics.mean(r['train_images_per_second'] for r in runs):.0f}",
                f"{statistics.mean(r.get('eval_images_per_second', float('nan')) for r in runs):.0f}",
            ])  # fmt: skip
    return "\n".join(table_lines(header, rows)) + "\n\n" + interval_note("ViT at the same patch size")


def grid_table(records: list[dict], learning_rates: list[str]) -> str:
    """The validation accuracy of every grid point."""
    rows = []
    grid = [r for r in records if r["kind"] == "grid"]
    for patch in sorted({r["patch"] for r in grid}, reverse=True):
        for model in MODELS:
            points = {r["learning_rate"]: r["accuracy"] for r in grid if (r["patch"], r["model"]) == (patch, model)}
            if points:
                cells = [f"{100 * points[lr]:.2f}" if lr in points else "—" for lr in learning_rates]
                rows.append([f"{patch}x{patch}", MODELS[model], *cells])
    return "\n".join(table_lines(["patches", "model", *(f"lr {lr}" for lr in learning_rates)], rows))


def headline(records: list[dict], learning_rates: list[str]) -> str:
    """The README's line: the 2-D model against the others at each patch size, and against ViT in words where both
    have two seeds or more."""
    tests = [r for r in records if r["kind"] == "test"]
    patches = sorted({r["patch"] for r in tests}, reverse=True)

    def mean(model: str) -> str:
        values = []
        for patch in patches:
            runs = _test_accuracies(records, patch, model)
            values.append(f"{100 * statistics.mean(runs):.2f}%" if runs else "—")
        return " / ".join(values)

    comparisons = []
    for patch in patches:
        orchid, vit = _test_accuracies(records, patch, "orchid-2d"), _test_accuracies(records, patch, BASELINE)
        if min(len(orchid), len(vit)) >= 2:
            words = comparison_words("Orchid 2-D", "ViT", difference_interval(orchid, vit), digits=2)
            comparisons.append(f"{patch}x{patch}: {words}")
    floor = [r for r in records if r["kind"] == "floor"]
    floor_text = f"; logistic regression {100 * floor[0]['accuracy']:.2f}%" if floor else ""
    compared = "".join(f"; {text}" for text in comparisons)
    train = tests[0]["num_train"] if tests else 0
    counts = sorted({len(_test_accuracies(records, patch, model)) for patch in patches for model in MODELS} - {0})
    seeds = "0" if not counts else str(counts[0]) if counts[0] == counts[-1] else f"{counts[0]}-{counts[-1]}"
    epochs = tests[0].get("epochs", 1) if tests else 1  # records kept before the field: one pass
    passes = "one pass" if epochs == 1 else f"{epochs:g} passes"
    return "\n".join(table_lines(["images in two dimensions", "Orchid 2-D", "baselines", "details"], [[
        f"Fashion-MNIST test accuracy, {' / '.join(f'{p}x{p}' for p in patches)} patches, lr chosen on validation",
        mean("orchid-2d"), f"ViT {mean('vit')}; Orchid 1-D {mean('orchid-1d')}; 2-D hybrid {mean('orchid-2d-hybrid')}",
        f"{seeds} seeds; {train:,} training images each, {passes}{floor_text}{compared}",
    ]]))  # fmt: skip


def render_report(
    results_dir: str | Path,
    report: str | Path,
    learning_rates: list[str],
    readme: str | Path | None = None,
    prefix: str = "",
) -> dict[str, str]:
    """Fill the blocks ``test``, ``grid``, ``floor``, ``machine`` of ``report`` and ``headline`` of ``readme`` from
    the records in ``results_dir``, each name after ``prefix`` (a second set of runs on the same page takes its
    own); returns the blocks by their names without the prefix."""
    records = load_records(results_dir)
    if not records:
        raise ValueError(f"{results_dir} holds no records: run scripts/images_2d_report.py --runs first")
    blocks = {"test": test_table(records, learning_rates), "grid": grid_table(records, learning_rates)}
    floor = [r for r in records if r["kind"] == "floor"]
    if floor:
        floor = floor[0]
        blocks["floor"] = (
            f"Logistic regression on standardised pixels (all 60,000 training images): "
            f"**{100 * floor['accuracy']:.2f}%** on the {floor['num_eval']:,} test images, fitted in "
            f"{floor['train_seconds']:.0f} s."
        )
    machine_file = Path(results_dir) / "machine.json"
    if machine_file.is_file():
        machine = _read(machine_file)
        blocks["machine"] = machine_block(
            machine, f"every run on {machine['threads_per_run']} thread(s), {machine['runs_at_a_time']} run(s) at a "
            "time: times compare the models with each other, not with other machines."
        )
    text = Path(report).read_text()
    for name, content in blocks.items():
        text = replace_block(text, BLOCKS, prefix + name, content)
    Path(report).write_text(text)
    if readme is not None:
        blocks["headline"] = headline(records, learning_rates)
        text = replace_block(Path(readme).read_text(), BLOCKS, prefix + "headline", blocks["headline"])
        Path(readme).write_text(text)
    return blocks
