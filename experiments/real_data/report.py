"""The real-data comparison of docs/results/real_data.md (``scripts/real_data.sh`` runs it,
``scripts/real_data_report.py`` reports it).

:func:`collect_runs` keeps one JSON file per run (what the tables and plots need, taken from the run folders that
the recipes write); :func:`render_report` makes the tables, the plots and the README's headline table from those
files alone, so the report can be rebuilt from the repository. Generated text goes between
``<!-- real-data:NAME -->`` and ``<!-- /real-data:NAME -->`` markers; everything else in the files is left as is.

Where a table or a headline compares two models, it gives the difference of their mean per-seed scores with its 95%
interval (:func:`difference_interval`), and says that one model beats the other only where that interval excludes
zero (:func:`comparison_words`); otherwise the two are level.
"""

from __future__ import annotations

import json
import math
import pickletools
import re
import statistics
import zipfile
from pathlib import Path

from benchmarks.harness import commit_text, machine_text, provenance, replace_block, table_lines, write_json

# Run folders of scripts/real_data.sh.
# pretrain-bert, or pretrain-bert-lr2e-4: a variant of a model's run (here another learning rate, which the tables'
# peak lr says), or pretrain-orchid-512-point-transforms: the recipe's run made by earlier code (PRETRAINING_VARIANTS).
PRETRAIN_RUN = re.compile(r"^pretrain-(?P<arch>[a-z]+)(-(?P<variant>.+))?$")
PRETRAINING_VARIANTS = {"512-point-transforms": "512-point transforms (earlier code)"}
# attribution-128-orchid-pretrained-s0, or attribution-128-orchid-pretrained-mean-pooling-s0: a variant (one
# fine-tuning setting changed, VARIANT_NAMES).
ATTRIBUTION_RUN = re.compile(
    r"^attribution-(?P<length>\d+)-(?P<arch>[a-z]+)-(?P<init>pretrained|scratch)(-(?P<variant>[a-z][a-z-]*))?"
    r"-s(?P<seed>\d+)$"
)
VARIANT_NAMES = {"mean-pooling": "mean pooling", "no-filter-group": "filters in the common parameter group"}
# pairs-128-orchid-pretrained-s0: the same-novel pair task, pairs of two passages of at most half the length.
PAIRS_RUN = re.compile(r"^pairs-(?P<length>\d+)-(?P<arch>[a-z]+)-(?P<init>pretrained|scratch)-s(?P<seed>\d+)$")
# grid-attribution-128-orchid-pretrained-mean-lr3e-4-s0 (a grid point: a pooling and a learning rate, scored on the
# validation chapters) and grid-attribution-128-orchid-pretrained-chosen-s1 (the chosen point with another seed,
# scored on the test chapters). Points of grids that had one pooling per architecture (the recipe's) have no pooling
# in their names; every run's pooling is read from its results.
GRID_RUN = re.compile(
    r"^grid-(?P<task>attribution|pairs)-(?P<length>\d+)-(?P<arch>[a-z]+)-(?P<init>pretrained|scratch)"
    r"-(((?P<pooling>first|mean)-)?lr(?P<lr>[0-9.e+-]+)|(?P<chosen>chosen))-s(?P<seed>\d+)$"
)
IMAGE_RUN = re.compile(r"^fashion-(?P<arch>[a-z]+)(-s(?P<seed>\d+))?$")
# floor-attribution-128: logistic regression on token frequencies for one of the grid's tasks.
FLOOR_RUN = re.compile(r"^floor-(?P<task>attribution|pairs)-(?P<length>\d+)$")
# probe-pairs-128-orchid-pretrained: logistic regression on a frozen model's features (scripts/pair_probe.py).
PROBE_RUN = re.compile(r"^probe-(?P<task>pairs)-(?P<length>\d+)-(?P<arch>[a-z]+)-(?P<init>pretrained|random)$")
# The long-context comparison: ctx-orchid-2048 (pretrained from scratch at 2048 tokens), ctx-orchid-128-base (the
# model that the extended runs start from), ctx-orchid-2048-extended (that model extended to 2048 tokens and trained
# on); ctx-eval-orchid-2048: scripts/long_context_eval.py on the model of ctx-orchid-2048.
CONTEXT_RUN = re.compile(r"^ctx-(?P<arch>[a-z]+)-(?P<length>\d+)(-(?P<start>base|extended))?$")
CONTEXT_EVAL_RUN = re.compile(r"^ctx-eval-(?P<model>[a-z]+-\d+(-base|-extended)?)$")
ARCH_NAMES = {"orchid": "Orchid", "bert": "BERT", "vit": "ViT", "logreg": "logistic regression"}
IMAGE_ORDER = {"orchid": 0, "vit": 1, "logreg": 2}  # rows and panels: Orchid, its baseline, the floor
RECORD_KINDS = ("pretraining", "attribution", "pairs", "grid", "floor", "probe", "image", "context", "context-eval")
BLOCKS = "real-data"  # the generated blocks of docs/results/real_data.md and the README: <!-- real-data:NAME -->
# The model each comparison measures Orchid against: BERT on text, ViT on images.
BASELINES = {"text": "bert", "image": "vit"}
CONFIDENCE = 0.95


# ---------------------------------------------------------------------------------------------
# Collecting: run folders -> one JSON per run
# ---------------------------------------------------------------------------------------------


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def embedding_parameters(folder: Path) -> int:
    """Parameters of the embedding tables (word, position, token type) in a saved model's safetensors file."""
    from safetensors import safe_open

    total = 0
    with safe_open(folder / "model.safetensors", "pt") as handle:
        for name in handle.keys():
            if ".embeddings." in name and name.endswith("_embeddings.weight"):
                shape = handle.get_slice(name).get_shape()
                total += int(shape[0]) * int(shape[1])
    return total


def training_seconds(folder: Path) -> float:
    """Training time of a Trainer run, evaluation left out: the last ``train_seconds`` of its log history."""
    history = _read(folder / "trainer_state.json")["log_history"]
    return max(entry["train_seconds"] for entry in history if "train_seconds" in entry)


def final_training_loss(folder: Path) -> float | None:
    """The training loss of a Trainer run's last logging step (the mean over its last ``logging_steps``), None where
    the run logged none: whether a model fitted its training set at all, which its validation score does not say."""
    losses = [entry["loss"] for entry in _read(folder / "trainer_state.json")["log_history"] if "loss" in entry]
    return losses[-1] if losses else None


def peak_learning_rate(folder: Path) -> float:
    """The run's --learning_rate, from the ``training_args.bin`` that Trainer saves with the model, which no JSON file
    of the run holds. That file is a pickle (in torch.save's zip archive), and loading a pickle can run any code, so it
    is never loaded: its opcodes are read as data (``pickletools.genops`` parses without building anything) and the
    float stored under the key ``learning_rate`` of the arguments' state is taken."""
    path = folder / "training_args.bin"
    data = path.read_bytes()
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            pickles = [name for name in archive.namelist() if name.rsplit("/", 1)[-1] == "data.pkl"]
            if len(pickles) != 1:
                raise ValueError(f"{path}: expected one data.pkl in the archive, found {pickles}")
            data = archive.read(pickles[0])
    key = None
    for opcode, value, _ in pickletools.genops(data):
        if opcode.name in ("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"):
            continue  # bookkeeping between a key and its value
        if key == "learning_rate" and opcode.name in ("BINFLOAT", "FLOAT"):
            return float(value)
        key = value if isinstance(value, str) and "UNICODE" in opcode.name else None
    raise ValueError(f"{path}: no float stored under 'learning_rate'")


def run_learning_rate(folder: Path, results: dict) -> float:
    """The run's --learning_rate: the ``learning_rate`` of its results.json, which the recipes write, or for runs
    made before they did, :func:`peak_learning_rate` of its training_args.bin."""
    if "learning_rate" in results:
        return float(results["learning_rate"])
    return peak_learning_rate(folder)


def pretraining_record(folder: Path, arch: str, variant: str | None = None) -> dict:
    results = _read(folder / "results.json")
    history = _read(folder / "trainer_state.json")["log_history"]
    init = results.get("init", {})
    curve = []
    if init:
        curve.append({"step": 0, "train_seconds": 0.0, "loss": init["init_loss"],
                      "masked_accuracy": init["init_masked_accuracy"]})  # fmt: skip
    for entry in history:
        if "eval_loss" in entry:
            curve.append({"step": entry["step"], "train_seconds": entry["train_seconds"], "loss": entry["eval_loss"],
                          "masked_accuracy": entry["eval_masked_accuracy"]})  # fmt: skip
    training_loss = [
        {"step": e["step"], "train_seconds": e["train_seconds"], "loss": e["loss"]} for e in history if "loss" in e
    ]
    embeddings = embedding_parameters(folder)
    config = _read(folder / "config.json")
    return {
        "kind": "pretraining",
        "arch": arch,
        "variant": variant,
        "learning_rate": run_learning_rate(folder, results),
        "model_type": results["model_type"],
        "config": {k: config.get(k) for k in ("hidden_size", "num_hidden_layers", "intermediate_size",
                                              "max_position_embeddings", "vocab_size", "num_attention_heads")},
        "num_parameters": results["num_parameters"],
        "num_parameters_without_embeddings": results["num_parameters"] - embeddings,
        "optimizer": results["optimizer"],
        "steps": history[-1]["step"] if history else 0,
        "train_seconds": training_seconds(folder),
        "eval": {"loss": results["eval"]["eval_loss"], "masked_accuracy": results["eval"]["eval_masked_accuracy"],
                 "blocks": results["eval"]["eval_samples"]},
        "curve": curve,
        "training_loss": training_loss,
    }  # fmt: skip


def attribution_record(folder: Path, match: re.Match, kind: str = "attribution") -> dict:
    """A fine-tuning run scored on the test chapters (its validation file is test.csv): ``attribution`` or
    ``pairs``."""
    results = _read(folder / "results.json")
    validation = results["metrics"]["validation"]
    record = {
        "kind": kind,
        "arch": match["arch"],
        "init": match["init"],
        "length": int(match["length"]),
        "seed": int(match["seed"]),
        "initialized_from": results["initialized_from"],
        "accuracy": validation["accuracy"],
        "eval_loss": validation.get("loss"),
        "train_seconds": training_seconds(folder),
        "epochs": results["epochs_done"],
        "hyperparameters": results["hyperparameters"],
    }
    if match.groupdict().get("variant"):
        record["variant"] = match["variant"]
    return record


def run_pooling(folder: Path, results: dict, named: str | None = None) -> str:
    """The pooling a fine-tuning run's classifier was trained with, from its results; a ``ValueError`` where the run's
    name says another (``named``)."""
    pooling = results["hyperparameters"]["pooling"]
    if named is not None and named != pooling:
        raise ValueError(f"{folder}: the name says {named} pooling, but the run's results say {pooling}")
    return pooling


def grid_record(folder: Path, match: re.Match) -> dict:
    """A grid point (scored on the validation chapters) or a run at the chosen point (scored on the test chapters)."""
    results = _read(folder / "results.json")
    run_pooling(folder, results, match["pooling"])
    return {
        "kind": "grid",
        "task": match["task"],
        "length": int(match["length"]),
        "arch": match["arch"],
        "init": match["init"],
        "seed": int(match["seed"]),
        "chosen": bool(match["chosen"]),
        "scored_on": "test" if match["chosen"] else "validation",
        "learning_rate": run_learning_rate(folder, results),
        "accuracy": results["metrics"]["validation"]["accuracy"],
        "initialized_from": results["initialized_from"],
        "train_seconds": training_seconds(folder),
        "final_train_loss": final_training_loss(folder),
        "epochs": results["epochs_done"],
        "hyperparameters": results["hyperparameters"],
    }


def floor_record(folder: Path, match: re.Match) -> dict:
    """The bag-of-words floor of a grid task (scripts/text_baseline.py): C chosen on the validation chapters,
    accuracy on the test chapters."""
    results = _read(folder / "results.json")
    return {
        "kind": "floor",
        "task": match["task"],
        "length": int(match["length"]),
        "accuracy": results["accuracy"],
        "chosen_C": results["chosen_C"],
        "validation_accuracy": results["validation_accuracy"],
        "majority_class_accuracy": results["majority_class_accuracy"],
        "train_seconds": results["train_seconds"],
    }


def probe_record(folder: Path, match: re.Match) -> dict:
    """A logistic regression on a frozen model's features for a grid task (scripts/pair_probe.py), per layer: C
    chosen on the validation chapters, accuracy on the test chapters."""
    results = _read(folder / "results.json")
    return {
        "kind": "probe",
        "task": match["task"],
        "length": int(match["length"]),
        "arch": match["arch"],
        "init": match["init"],
        "layers": {
            layer: {key: probe[key] for key in ("accuracy", "chosen_C", "validation_accuracy", "num_eval")}
            for layer, probe in results["layers"].items()
        },
    }


def best_grid_point(points: list[tuple[float, float]]) -> float:
    """The learning rate of the best (learning rate, validation accuracy) point: the highest accuracy, on ties the
    lowest learning rate."""
    if not points:
        raise ValueError("no grid point to choose from")
    return max(points, key=lambda point: (point[1], -point[0]))[0]


def best_pooled_point(points: dict[tuple[str, float], float]) -> tuple[str, float]:
    """The (pooling, learning rate) of the best point of a grid over both: the highest validation accuracy; on ties
    the lowest learning rate, then the first token (the pooling of BERT's own classifier)."""
    if not points:
        raise ValueError("no grid point to choose from")
    return max(points, key=lambda point: (points[point], -point[1], point[0] == "first"))


def choose_grid_point(runs_dir: str | Path, group: str, learning_rates: list[str], poolings: list[str]) -> str:
    """The grid point of ``group`` (e.g. ``grid-attribution-128-orchid-pretrained``) chosen on the validation
    chapters among ``poolings`` and ``learning_rates`` (as written in the run names, ``GROUP-POOLING-lrLR-s0``), by
    :func:`best_pooled_point`, as ``"POOLING LR"``; a ``ValueError`` naming the points that have not finished."""
    runs_dir = Path(runs_dir)
    folders = {(pooling, lr): runs_dir / f"{group}-{pooling}-lr{lr}-s0"
               for pooling in poolings for lr in learning_rates}  # fmt: skip
    missing = [str(folder) for folder in folders.values() if not (folder / "results.json").is_file()]
    if not folders or missing:
        raise ValueError(f"grid {group}: no finished run (results.json) in {missing or 'no grid point given'}")
    points = {}
    for (pooling, lr), folder in folders.items():
        results = _read(folder / "results.json")
        run_pooling(folder, results, pooling)
        points[(pooling, float(lr))] = results["metrics"]["validation"]["accuracy"]
    pooling, chosen = best_pooled_point(points)
    return f"{pooling} {next(lr for lr in learning_rates if float(lr) == chosen)}"


def image_record(folder: Path, match: re.Match) -> dict:
    results = _read(folder / "results.json")
    record = {
        "kind": "image",
        "arch": match["arch"],
        "seed": int(match["seed"] or results.get("seed", 0)),
        "accuracy": results["accuracy"],
        "num_parameters": results["num_parameters"],
        "num_train": results["num_train"],
        "num_eval": results["num_eval"],
        "eval_split": results["eval_split"],
        # A Trainer run's time without its evaluations; the logistic regression has no evaluation to leave out.
        "train_seconds": (
            training_seconds(folder) if (folder / "trainer_state.json").is_file() else results["train_seconds"]
        ),
        "per_class_accuracy": results["per_class_accuracy"],
        "confusion_matrix": results["confusion_matrix"],
        "model": results["model"],
    }
    for key in ("epochs", "steps", "hyperparameters"):
        if key in results:
            record[key] = results[key]
    return record


def time_report(path: Path) -> dict:
    """What GNU time's report (``/usr/bin/time -v -o PATH COMMAND``) says of a run: its command and peak memory (the
    maximum resident set size, in MiB); None for both where there is no report."""
    if not path.is_file():
        return {"command": None, "peak_memory_mib": None}
    fields = dict(line.strip().split(": ", 1) for line in path.read_text().splitlines() if ": " in line)
    if "Maximum resident set size (kbytes)" not in fields or "Command being timed" not in fields:
        raise ValueError(f"{path} is not a report of GNU time -v: no 'Maximum resident set size (kbytes)' or "
                         "'Command being timed' line")  # fmt: skip
    return {"command": fields["Command being timed"].strip('"'),
            "peak_memory_mib": int(fields["Maximum resident set size (kbytes)"]) / 1024}  # fmt: skip


def context_record(folder: Path, match: re.Match) -> dict:
    """A pretraining run of the long-context comparison: :func:`pretraining_record` with its block length, blocks a
    step, training tokens, the run it started from (None for a new model), and command and peak memory from the GNU
    time report beside its folder (``NAME.time``)."""
    record = pretraining_record(folder, match["arch"])
    results = _read(folder / "results.json")
    blocks = _read(folder / "trainer_state.json")["train_batch_size"]
    start = results["initialized_from"]
    record.update(
        kind="context",
        model=folder.name.removeprefix("ctx-"),
        length=int(results["max_seq_length"]),
        start=match["start"] or "scratch",
        initialized_from=None if start.startswith("new ") else Path(start).name,
        blocks_per_step=blocks,
        tokens=record["steps"] * blocks * int(results["max_seq_length"]),
        **time_report(folder.parent / f"{folder.name}.time"),
    )
    if int(match["length"]) != record["length"]:
        raise ValueError(f"{folder}: the run's name says {match['length']} tokens, its results.json "
                         f"max_seq_length {record['length']}")  # fmt: skip
    return record


def context_eval_record(folder: Path, match: re.Match) -> dict:
    """scripts/long_context_eval.py's results for the model of run ``ctx-MODEL``."""
    results = _read(folder / "results.json")
    keys = ("model_type", "max_position_embeddings", "tokens", "mlm_probability", "seed", "rare_below",
            "category_blocks", "evaluations")  # fmt: skip
    return {"kind": "context-eval", "model": match["model"], **{key: results[key] for key in keys}}


def collect_runs(
    runs_dir: str | Path, results_dir: str | Path, threads_per_run: int = 1, runs_at_a_time: int = 2
) -> list[str]:
    """One JSON per finished run of ``runs_dir`` (a run is finished when its folder has ``results.json``) in
    ``results_dir``, plus ``machine.json`` (:func:`sharing_record`); returns the run names collected. Every file
    records the commit and the machine of the tree that collects the runs (:func:`benchmarks.harness.provenance`):
    scripts/real_data.sh collects its runs where it ran them."""
    runs_dir, results_dir = Path(runs_dir), Path(results_dir)
    made = provenance(threads_per_run)
    collected = []
    for folder in sorted(p for p in runs_dir.iterdir() if (p / "results.json").is_file()):
        name = folder.name
        if match := PRETRAIN_RUN.match(name):
            record = pretraining_record(folder, match["arch"], match["variant"])
        elif match := ATTRIBUTION_RUN.match(name):
            record = attribution_record(folder, match)
        elif match := PAIRS_RUN.match(name):
            record = attribution_record(folder, match, "pairs")
        elif match := GRID_RUN.match(name):
            record = grid_record(folder, match)
        elif match := IMAGE_RUN.match(name):
            record = image_record(folder, match)
        elif match := FLOOR_RUN.match(name):
            record = floor_record(folder, match)
        elif match := PROBE_RUN.match(name):
            record = probe_record(folder, match)
        elif match := CONTEXT_EVAL_RUN.match(name):
            record = context_eval_record(folder, match)
        elif match := CONTEXT_RUN.match(name):
            record = context_record(folder, match)
        else:
            continue
        write_json(results_dir / f"{name}.json", {**record, **made})
        collected.append(name)
    if not collected:
        raise ValueError(f"{runs_dir} has no finished run (a folder with results.json) of scripts/real_data.sh")
    write_json(results_dir / "machine.json", sharing_record(made, threads_per_run, runs_at_a_time))
    return collected


def sharing_record(made: dict, threads_per_run: int, runs_at_a_time: int) -> dict:
    """``machine.json``: where the runs were collected (``made``, :func:`benchmarks.harness.provenance`) and how they
    shared the machine: ``threads_per_run`` threads each, ``runs_at_a_time`` at a time."""
    return {**made, "threads_per_run": threads_per_run, "runs_at_a_time": runs_at_a_time}


def machine_block(record: dict, how: str) -> str:
    """The machine of ``machine.json`` in a sentence, then ``how`` the runs shared it; with the commit where the file
    records one. A file written before machine.json recorded the commit holds the machine's description at its top
    level."""
    text = f"{machine_text(record.get('machine', record))}; {how}"
    return text if "commit" not in record else f"{text} Collected at {commit_text(record)}."


# ---------------------------------------------------------------------------------------------
# Rendering: JSON files -> tables, plots, README block
# ---------------------------------------------------------------------------------------------


def load_records(results_dir: str | Path) -> dict[str, list[dict]]:
    """The kept records by kind (``pretraining``, ``attribution``, ``pairs``, ``grid``, ``floor``, ``probe``,
    ``image``) and ``machine``."""
    records: dict[str, list[dict]] = {kind: [] for kind in (*RECORD_KINDS, "machine")}
    for path in sorted(Path(results_dir).glob("*.json")):
        record = _read(path)
        records["machine" if path.stem == "machine" else record["kind"]].append(record)
    return records


def _mean_and_runs(values: list[float], scale: float = 100.0, digits: int = 1) -> str:
    """The mean of the per-seed ``values`` and each of them: ``56.9 (57.0 / 51.3 / 62.4)``."""
    runs = " / ".join(f"{v * scale:.{digits}f}" for v in values)
    if len(values) == 1:
        return runs
    return f"{statistics.mean(values) * scale:.{digits}f} ({runs})"


# ---------------------------------------------------------------------------------------------
# Differences between two models, with their intervals
# ---------------------------------------------------------------------------------------------


def difference_interval(first: list[float], second: list[float], confidence: float = CONFIDENCE) -> dict:
    """The difference of two models' mean per-seed scores, ``first``'s minus ``second``'s, and its ``confidence``
    interval: Welch's t interval on the per-seed values (``difference``, ``low``, ``high``, ``confidence``, and
    Welch's ``degrees_of_freedom``).

    Welch's interval, not one paired by seed: a seed here fixes a fine-tuning run's initialisation and data order,
    but the two models start from weights of their own and take different paths through those batches, so a seed is
    no shared condition that would make their scores move together; and a comparison may have more seeds on one side.
    Welch's interval assumes neither pairing nor equal variances. Where neither side varies across its seeds the
    interval is the difference itself.

    A ValueError names a side with fewer than two scores (no variance to estimate) or a confidence outside (0, 1)."""
    from scipy.stats import t

    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence}")
    for name, values in (("first", first), ("second", second)):
        if len(values) < 2:
            raise ValueError(f"{name} has {len(values)} score(s) {list(values)}; an interval needs at least two seeds "
                             "per model")  # fmt: skip
    difference = statistics.mean(first) - statistics.mean(second)
    shares = [statistics.variance(values) / len(values) for values in (first, second)]
    spread = sum(shares)
    seeds = min(len(first), len(second))
    if spread == 0:
        return {"difference": difference, "low": difference, "high": difference, "confidence": confidence,
                "degrees_of_freedom": math.inf, "seeds": seeds}  # fmt: skip
    freedom = spread**2 / sum(share**2 / (len(values) - 1) for share, values in zip(shares, (first, second)))
    half_width = t.ppf(0.5 + confidence / 2, freedom) * math.sqrt(spread)
    return {"difference": difference, "low": difference - half_width, "high": difference + half_width,
            "confidence": confidence, "degrees_of_freedom": freedom, "seeds": seeds}  # fmt: skip


# The fewest seeds per model on which a stated difference rests.
MIN_SEEDS_FOR_A_DIFFERENCE = 3


def comparison_outcome(interval: dict) -> str:
    """``"beats"`` where the interval lies above zero, ``"beaten"`` where it lies below, ``"level"`` where it holds
    zero; ``"unsized"`` where either model has fewer than ``MIN_SEEDS_FOR_A_DIFFERENCE`` seeds, or neither varies
    across its seeds (runs that all give one constant prediction have no spread to size an interval by): no
    difference is stated."""
    if interval.get("seeds", 0) < MIN_SEEDS_FOR_A_DIFFERENCE or interval["low"] == interval["high"]:
        return "unsized"
    if interval["low"] > 0:
        return "beats"
    return "beaten" if interval["high"] < 0 else "level"


def comparison_words(first: str, second: str, interval: dict, scale: float = 100.0, digits: int = 1,
                     unit: str = "points") -> str:
    """A comparison in words: ``first`` beats ``second`` (or the other way round) only where the interval of the
    difference excludes zero; otherwise the two are level. Scores are shown times ``scale`` (percentage points)."""
    difference, low, high = (scale * interval[key] for key in ("difference", "low", "high"))
    share = f"{100 * interval['confidence']:g}%"
    outcome = comparison_outcome(interval)
    if outcome == "unsized":
        why = "no spread across seeds" if low == high else f"fewer than {MIN_SEEDS_FOR_A_DIFFERENCE} seeds"
        return f"no difference stated ({first} − {second}: {difference:+.{digits}f} {unit}; {why})"
    if outcome == "level":
        return (f"{first} and {second} are level ({first} − {second}: {difference:+.{digits}f} {unit}, {share} "
                f"interval {low:+.{digits}f} to {high:+.{digits}f})")
    winner, loser = (first, second) if difference > 0 else (second, first)
    return (f"{winner} beats {loser} by {abs(difference):.{digits}f} {unit} ({share} interval of {first} − {second}: "
            f"{low:+.{digits}f} to {high:+.{digits}f})")


def difference_cell(first: list[float], second: list[float] | None, scale: float = 100.0, digits: int = 1) -> str:
    """A table's cell of the difference of two models' per-seed scores (times ``scale``) and its interval, and
    whether the first ``beats`` the second, is ``beaten`` or ``level``; ``–`` where a side has fewer than two seeds
    or there is no second model."""
    if second is None or len(first) < 2 or len(second) < 2:
        return "–"
    interval = difference_interval(first, second)
    difference, low, high = (scale * interval[key] for key in ("difference", "low", "high"))
    outcome = comparison_outcome(interval)
    if outcome == "unsized":
        return f"{difference:+.{digits}f}, not sized"
    return f"{difference:+.{digits}f} ({low:+.{digits}f} to {high:+.{digits}f}), {outcome}"


def interval_note(baseline: str) -> str:
    """The note under a table with a column of differences (:func:`difference_cell`)."""
    return (f"Against {baseline}: the difference of the mean test accuracies in points, with its "
            f"{100 * CONFIDENCE:g}% interval (Welch's t interval on the per-seed accuracies); a model beats another "
            "only where the interval excludes zero, otherwise they are level; not sized with fewer than "
            f"{MIN_SEEDS_FOR_A_DIFFERENCE} seeds or no spread across them.")


def time_note(machine: dict) -> str:
    """The note under each table with training times: how the runs shared the machine (:func:`sharing_record`, as kept
    in machine.json)."""
    threads, jobs = machine.get("threads_per_run", 1), machine.get("runs_at_a_time", 2)
    on = "one thread" if threads == 1 else f"{threads} threads"
    beside = "alone" if jobs == 1 else "beside one other run" if jobs == 2 else f"beside {jobs - 1} other runs"
    return f"¹ Wall-clock training time with evaluation left out, each run on {on} {beside}."


def _mean_minutes(group: list[dict]) -> float:
    """The mean training time of the runs in ``group``, in minutes."""
    return statistics.mean(r["train_seconds"] for r in group) / 60


def _group(records: list[dict], *keys: str) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for record in sorted(records, key=lambda r: tuple(r.get(k, 0) for k in (*keys, "seed"))):
        groups.setdefault(tuple(record[k] for k in keys), []).append(record)
    return groups


def _pretraining_order(record: dict) -> tuple:
    return (record["arch"] != "orchid", record["arch"], record.get("variant") is not None, record.get("variant") or "")


def pretraining_name(record: dict) -> str:
    """A pretraining run's model, with the variant where its learning rate does not say it
    (:data:`PRETRAINING_VARIANTS`)."""
    name = ARCH_NAMES.get(record["arch"], record["arch"])
    variant = PRETRAINING_VARIANTS.get(record.get("variant"))
    return f"{name}, {variant}" if variant else name


def pretraining_table(records: list[dict]) -> str:
    header = ["model", "parameters", "without embeddings", "peak lr", "steps", "training time¹", "held-out MLM loss",
              "held-out masked-token accuracy"]
    rows = [[pretraining_name(r), f"{r['num_parameters'] / 1e6:.2f}M",
             f"{r['num_parameters_without_embeddings'] / 1e6:.2f}M", f"{r['learning_rate']:g}", r["steps"],
             f"{r['train_seconds'] / 60:.1f} min", f"{r['eval']['loss']:.3f}",
             f"{100 * r['eval']['masked_accuracy']:.1f}%"] for r in sorted(records, key=_pretraining_order)]
    return "\n".join(table_lines(header, rows))


def length_text(task: str, length: int) -> str:
    """The input of a task in words: a passage's tokens, or a pair's two passages (each at most half the length)."""
    return f"2 × {length // 2} tokens" if task == "pairs" else f"{length} tokens"


def task_text(task: str, length: int) -> str:
    return ("same novel, pairs of " if task == "pairs" else "novel attribution, ") + f"{length_text(task, length)}"


def attribution_table(records: list[dict], task: str = "attribution") -> str:
    """The runs scored on the test chapters, by length, start, model and variant (``task``: attribution or pairs);
    each model's difference from BERT of the same length and start (:func:`difference_cell`)."""
    baseline = BASELINES["text"]
    records = [{**r, "variant": r.get("variant") or ""} for r in records]  # "": the run as the recipe has it
    groups = _group(records, "length", "init", "arch", "variant")
    rows = []
    for (length, init, arch, variant), group in groups.items():
        model = ARCH_NAMES.get(arch, arch) + (f", {VARIANT_NAMES.get(variant, variant)}" if variant else "")
        versus = groups.get((length, init, baseline, ""))
        scores = [r["accuracy"] for r in group]
        rows.append([length_text(task, length), model, init, _mean_and_runs(scores),
                     difference_cell(scores, None if arch == baseline else [r["accuracy"] for r in versus or []]),
                     f"{_mean_minutes(group):.1f} min"])
    header = ["pair" if task == "pairs" else "passage", "model", "start", "test accuracy % (mean; seeds)",
              f"− {ARCH_NAMES[baseline]}, points (95% interval)", "training time¹ (mean)"]
    return "\n".join(table_lines(header, rows)) + "\n\n" + interval_note(ARCH_NAMES[baseline])


def grid_point(record: dict) -> tuple[str, float]:
    """The grid point a kept run was trained at: (pooling, learning rate)."""
    return record["hyperparameters"]["pooling"], record["learning_rate"]


def grid_choices(records: list[dict]) -> dict[tuple, dict]:
    """Per (task, length, init, arch): the grid points (``points``: (pooling, learning rate) -> validation accuracy),
    the point chosen on them (``chosen``: (pooling, learning rate), :func:`best_pooled_point`), and the runs at the
    chosen point scored on the test chapters (``runs``). A ``ValueError`` if those runs were trained at another
    point."""
    choices = {}
    groups = _group([r for r in records if not r["chosen"]], "task", "length", "init", "arch")
    for key, group in groups.items():
        points = {grid_point(r): r["accuracy"] for r in group}
        chosen = best_pooled_point(points)
        runs = [r for r in records if r["chosen"] and (r["task"], r["length"], r["init"], r["arch"]) == key]
        other = sorted({grid_point(r) for r in runs} - {chosen})
        if other:
            raise ValueError(
                f"grid {'-'.join(map(str, key))}: the runs at the chosen point used (pooling, learning rate) {other}, "
                f"but the grid's best on the validation chapters is {chosen}"
            )
        choices[key] = {"points": points, "chosen": chosen, "runs": sorted(runs, key=lambda r: r["seed"]),
                        "epochs": group[0]["hyperparameters"].get("epochs")}  # fmt: skip
    return choices


def point_text(choice: dict) -> str:
    """A grid's chosen point in words, ``mean, lr 0.001``, and ``(the grid's highest)`` or ``(the grid's lowest)``
    where its learning rate is at an end of the rates run with its pooling."""
    pooling, lr = choice["chosen"]
    rates = [rate for point_pooling, rate in choice["points"] if point_pooling == pooling]
    edge = " (the grid's highest)" if lr == max(rates) else " (the grid's lowest)" if lr == min(rates) else ""
    return f"{pooling}, lr {lr:g}{edge}"


def floor_note(floors: list[dict]) -> str:
    """The bag-of-words floor of each grid task, in a sentence."""
    described = [
        f"{task_text(f['task'], f['length'])} {100 * f['accuracy']:.1f}% (C {f['chosen_C']:g}; majority class "
        f"{100 * f['majority_class_accuracy']:.1f}%)"
        for f in sorted(floors, key=lambda f: (f["task"], f["length"]))
    ]
    grid = ", ".join(f"{c:g}" for c in sorted({float(c) for f in floors for c in f["validation_accuracy"]}))
    return (
        "The floor, a logistic regression on token frequencies (`scripts/text_baseline.py`, `run text-floor`; C among "
        f"{grid} chosen on the validation chapters, trained on the training chapters), on the test chapters: "
        f"{'; '.join(described)}."
    )


def probe_note(probes: list[dict]) -> str:
    """The frozen-feature probes of the grid's tasks, in a sentence per task."""
    layer_names = {"embeddings": "embeddings", "last": "last layer"}
    sentences = []
    for (task, length), group in _group(probes, "task", "length").items():
        described = [
            f"{ARCH_NAMES.get(p['arch'], p['arch'])} {p['init']} "
            + ", ".join(f"{layer_names.get(layer, layer)} {100 * probe['accuracy']:.1f}%"
                        for layer, probe in p["layers"].items())  # fmt: skip
            for p in sorted(group, key=lambda p: (p["arch"] != "orchid", p["init"] != "pretrained"))
        ]
        sentences.append(
            f"Frozen features, {task_text(task, length)} (`scripts/pair_probe.py`, `run pair-probe`: each passage "
            "encoded alone by the model, never fine-tuned, the mean of its real tokens at the embeddings and at the "
            "last layer; a logistic regression on the product and absolute difference of the two passages' "
            "standardised features, C chosen on the validation chapters), on the test chapters: "
            f"{'; '.join(described)}."
        )
    return "\n\n".join(sentences)


def grid_table(records: list[dict]) -> str:
    """Validation accuracy of every grid point (seed 0), a row per pooling, and test accuracy at the chosen point only.
    No training times: the grid's runs may share a machine many at a time (scripts/real_data.sh's JOBS), which makes
    their times no speed comparison; the attribution and pairs tables give those."""
    choices = grid_choices(records)
    baseline = BASELINES["text"]
    rates = sorted({lr for choice in choices.values() for _, lr in choice["points"]})
    header = ["task", "model", "start", "pooling", *(f"validation % at lr {lr:g}" for lr in rates), "chosen",
              "test % at the chosen point (mean; seeds)", f"test: − {ARCH_NAMES[baseline]}, points (95% interval)"]
    rows = []
    for (task, length, init, arch), choice in choices.items():
        scores = [r["accuracy"] for r in choice["runs"]]
        versus = choices.get((task, length, init, baseline))
        difference = difference_cell(scores, None if arch == baseline or versus is None else
                                     [r["accuracy"] for r in versus["runs"]])
        poolings = sorted({pooling for pooling, _ in choice["points"]}, key=lambda p: p != choice["chosen"][0])
        for pooling in poolings:
            cells = []
            for lr in rates:
                value = choice["points"].get((pooling, lr))
                text = "–" if value is None else f"{100 * value:.1f}"
                cells.append(f"**{text}**" if (pooling, lr) == choice["chosen"] else text)
            if pooling == choice["chosen"][0]:
                tested = [point_text(choice), _mean_and_runs(scores) if scores else "–", difference]
            else:
                tested = ["", "", ""]
            rows.append([task_text(task, length), ARCH_NAMES.get(arch, arch), init, pooling, *cells, *tested])
    # The epochs of most tasks, then the tasks trained for other numbers of epochs.
    tasks_by_epochs = {}
    for (task, length, _, _), choice in choices.items():
        if choice["epochs"] is not None:
            tasks_by_epochs.setdefault(choice["epochs"], {})[task_text(task, length)] = None
    common = max(tasks_by_epochs, key=lambda e: len(tasks_by_epochs[e]), default=None)
    others = [f"{e:g} for {', '.join(tasks)}" for e, tasks in tasks_by_epochs.items() if e != common]
    epochs = "" if common is None else f"{common:g} epochs" + (f" ({'; '.join(others)})" if others else "") + ", "
    note = (
        f"Each grid point (a pooling and a learning rate): {epochs}seed 0, trained on the training chapters and "
        "scored on the validation chapters; the best point (in bold; on ties the lowest learning rate, then the first "
        "token) trained again with each seed and scored on the test chapters, on the row of its pooling."
    )
    return "\n".join(table_lines(header, rows)) + "\n\n" + note + " " + interval_note(ARCH_NAMES[baseline])


def image_table(records: list[dict]) -> str:
    """Each image model's test accuracy (mean; seeds), its difference from ViT (:func:`difference_cell`) and its
    training time."""
    baseline = BASELINES["image"]
    groups = _group(records, "arch")
    versus = [r["accuracy"] for r in groups.get((baseline,), [])]
    rows = []
    for (arch,), group in sorted(groups.items(), key=lambda item: IMAGE_ORDER.get(item[0][0], 9)):
        scores = [r["accuracy"] for r in group]
        rows.append([ARCH_NAMES.get(arch, arch), f"{group[0]['num_parameters'] / 1e3:.0f}k",
                     _mean_and_runs(scores, digits=2),
                     difference_cell(scores, None if arch == baseline else versus, digits=2),
                     f"{_mean_minutes(group):.1f} min"])
    header = ["model", "parameters", "test accuracy % (mean; seeds)",
              f"− {ARCH_NAMES[baseline]}, points (95% interval)", "training time¹ (mean)"]
    return "\n".join(table_lines(header, rows)) + "\n\n" + interval_note(ARCH_NAMES[baseline])


def seeds_and_comparison(first: list[float], second: list[float], second_name: str, digits: int = 1) -> str:
    """A headline's seeds, and Orchid against ``second_name`` in words (:func:`comparison_words`) where both have at
    least two seeds."""
    seeds = f"{len(first)} seed{'s' if len(first) != 1 else ''}"
    if min(len(first), len(second)) < 2:
        return seeds
    return f"{seeds}, {comparison_words('Orchid', second_name, difference_interval(first, second), digits=digits)}"


def headline_table(records: dict[str, list[dict]]) -> str:
    """One line per comparison, for the README."""
    rows = table_lines(["real data", "Orchid", "baseline", "details"], [])
    pretraining = {r["arch"]: r for r in records["pretraining"] if not r.get("variant")}
    if {"orchid", "bert"} <= set(pretraining):
        o, b = pretraining["orchid"], pretraining["bert"]
        rows.append(
            f"| Austen MLM pretraining, held-out masked-token accuracy | {100 * o['eval']['masked_accuracy']:.1f}% "
            f"| BERT {100 * b['eval']['masked_accuracy']:.1f}% | same steps and data order; "
            f"{o['train_seconds'] / 60:.0f} vs {b['train_seconds'] / 60:.0f} min of training |"
        )
    rows.extend(context_headline(records["context"], records["context-eval"]))
    pretrained = [r for r in records["attribution"] if r["init"] == "pretrained" and not r.get("variant")]
    groups = _group(pretrained, "length", "arch")
    for length in sorted({key[0] for key in groups}):
        o, b = groups.get((length, "orchid")), groups.get((length, "bert"))
        if o and b:
            scores = [[r["accuracy"] for r in g] for g in (o, b)]
            time = [_mean_minutes(g) for g in (o, b)]
            rows.append(
                f"| novel attribution, {length}-token passages, pretrained | {100 * statistics.mean(scores[0]):.1f}% | "
                f"BERT {100 * statistics.mean(scores[1]):.1f}% | {seeds_and_comparison(*scores, 'BERT')}; "
                f"fine-tuning {time[0]:.1f} vs {time[1]:.1f} min |"
            )
    pairs = _group([r for r in records["pairs"] if r["init"] == "pretrained"], "length", "arch")
    for length in sorted({key[0] for key in pairs}):
        o, b = pairs.get((length, "orchid")), pairs.get((length, "bert"))
        if o and b:
            scores = [[r["accuracy"] for r in g] for g in (o, b)]
            rows.append(
                f"| {task_text('pairs', length)}, pretrained | {100 * statistics.mean(scores[0]):.1f}% | BERT "
                f"{100 * statistics.mean(scores[1]):.1f}% | {seeds_and_comparison(*scores, 'BERT')}; fine-tuning "
                f"{_mean_minutes(o):.1f} vs {_mean_minutes(b):.1f} min |"
            )
    choices = grid_choices(records["grid"]) if records["grid"] else {}
    floors = {(f["task"], f["length"]): f["accuracy"] for f in records["floor"]}
    for (task, length, init, arch), orchid in choices.items():
        bert = choices.get((task, length, init, "bert"))
        if arch != "orchid" or not orchid["runs"] or not (bert and bert["runs"]):
            continue
        # A comparison stands only where both models chose between both poolings.
        if not all(len({pooling for pooling, _ in c["points"]}) == 2 for c in (orchid, bert)):
            continue
        scores = [[r["accuracy"] for r in choice["runs"]] for choice in (orchid, bert)]
        floor = f"; bag of words {100 * floors[(task, length)]:.1f}%" if (task, length) in floors else ""
        rows.append(
            f"| {task_text(task, length)}, {init}, pooling and lr chosen on validation chapters | "
            f"{100 * statistics.mean(scores[0]):.1f}% | BERT {100 * statistics.mean(scores[1]):.1f}% | "
            f"{seeds_and_comparison(*scores, 'BERT')}; chosen: {point_text(orchid)} vs {point_text(bert)}{floor} |"
        )
    images = _group(records["image"], "arch")
    if ("orchid",) in images and ("vit",) in images:
        o, v = images[("orchid",)], images[("vit",)]
        floor = images.get(("logreg",))
        floor_text = f"; logistic regression {100 * floor[0]['accuracy']:.2f}%" if floor else ""
        time = [_mean_minutes(g) for g in (o, v)]
        scores = [[r["accuracy"] for r in g] for g in (o, v)]
        rows.append(
            f"| Fashion-MNIST test accuracy | {100 * statistics.mean(scores[0]):.2f}% | "
            f"ViT {100 * statistics.mean(scores[1]):.2f}% | {seeds_and_comparison(*scores, 'ViT', digits=2)}; "
            f"training {time[0]:.0f} vs {time[1]:.0f} min{floor_text} |"
        )
    return "\n".join(rows)


def context_headline(training: list[dict], evals: list[dict]) -> list[str]:
    """The README's line of the long-context comparison: Orchid and BERT trained from scratch at the longest length
    both were trained at, each read at that length."""
    runs = {r["model"]: r for r in training if r["start"] == "scratch"}
    read = {}
    for record in evals:
        for entry in record["evaluations"]:
            if "categories" in entry and not entry["one_transform_length"]:
                read[(record["model"], entry["length"])] = entry["categories"]
    both = [n for n in sorted({r["length"] for r in runs.values()}, reverse=True)
            if all(f"{arch}-{n}" in runs and (f"{arch}-{n}", n) in read for arch in ("orchid", "bert"))]  # fmt: skip
    if not both:
        return []
    length = both[0]
    o, b = runs[f"orchid-{length}"], runs[f"bert-{length}"]
    co, cb = read[(f"orchid-{length}", length)], read[(f"bert-{length}", length)]
    memory = (f"; peak memory {o['peak_memory_mib']:,.0f} vs {b['peak_memory_mib']:,.0f} MiB"
              if o["peak_memory_mib"] and b["peak_memory_mib"] else "")  # fmt: skip

    def percent(category: dict) -> str:
        return "–" if category["accuracy"] is None else f"{100 * category['accuracy']:.1f}%"

    return [
        f"| Austen MLM at {length:,} tokens of context, *Persuasion* held out, masked-token accuracy | "
        f"{percent(co['all'])} | BERT {percent(cb['all'])} | same tokens; tokens found only further back "
        f"{percent(co['far'])} vs {percent(cb['far'])}; {o['train_seconds'] / 60:.0f} vs "
        f"{b['train_seconds'] / 60:.0f} min of training{memory} |"
    ]


def plot_pretraining(records: list[dict], path: str | Path) -> None:
    """Held-out loss and masked-token accuracy against steps and against training time."""
    from orchid_hf.extras import require_extra

    require_extra("matplotlib", "plot")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 7))
    FigureCanvasAgg(figure)
    axes = figure.subplots(2, 2)
    for record in sorted(records, key=_pretraining_order):
        label = f"{pretraining_name(record)}, lr {record['learning_rate']:g}"
        steps = [p["step"] for p in record["curve"]]
        minutes = [p["train_seconds"] / 60 for p in record["curve"]]
        for row, metric in enumerate(("loss", "masked_accuracy")):
            values = [p[metric] * (100 if metric == "masked_accuracy" else 1) for p in record["curve"]]
            axes[row][0].plot(steps, values, marker="o", markersize=3, label=label)
            axes[row][1].plot(minutes, values, marker="o", markersize=3, label=label)
    for row, name in enumerate(("held-out MLM loss", "held-out masked-token accuracy (%)")):
        axes[row][0].set(xlabel="step", ylabel=name)
        axes[row][1].set(xlabel="training time (min, evaluation excluded)", ylabel=name)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.legend()
    figure.suptitle("Masked-LM pretraining on five Austen novels, evaluated on Persuasion")
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def plot_confusion_matrices(records: list[dict], path: str | Path) -> None:
    """The confusion matrix of each image model (first seed), side by side."""
    from orchid_hf.extras import require_extra

    require_extra("matplotlib", "plot")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from orchid_hf.vision.report import draw_confusion_matrix

    groups = sorted(_group(records, "arch").items(), key=lambda item: IMAGE_ORDER.get(item[0][0], 9))
    chosen = [group[0] for _, group in groups]
    figure = Figure(figsize=(6 * len(chosen), 5.6))
    FigureCanvasAgg(figure)
    for index, record in enumerate(chosen):
        name = ARCH_NAMES.get(record["arch"], record["arch"])
        seed = "" if record["arch"] == "logreg" else f" (seed {record['seed']})"  # lbfgs: no seed to speak of
        title = f"{name}{seed}: {100 * record['accuracy']:.2f}%"
        ax = figure.add_subplot(1, len(chosen), index + 1)
        names = list(record["per_class_accuracy"])
        draw_confusion_matrix(ax, record["confusion_matrix"], names, title, fontsize=8, rotation=90)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


# ---------------------------------------------------------------------------------------------
# The long-context comparison (docs/results/long_context.md)
# ---------------------------------------------------------------------------------------------

START_ORDER = {"scratch": 0, "base": 1, "extended": 2}
CATEGORY_TEXT = {
    "all": "every masked token",
    "local": "its token unmasked elsewhere in its {short}-token block",
    "far": "its token unmasked elsewhere in its {long}-token block but not in its {short}-token block",
    "absent": "its token nowhere else unmasked in either block",
    "rare": "its token seen fewer than {rare} times in the training novels",
    "far, rare": "far and rare",
}


def _context_name(record: dict) -> str:
    """A training run's model in words: architecture, context and how it was trained."""
    name = f"{ARCH_NAMES.get(record['arch'], record['arch'])} {record['length']}"
    if record["start"] == "extended":
        return f"{name}, extended"
    return f"{name}, {record['steps']} steps (start of the extended)" if record["start"] == "base" else name


def _context_order(record: dict) -> tuple:
    return (record["arch"] != "orchid", record["arch"], START_ORDER[record["start"]], record["length"])


def context_runs(records: list[dict]) -> list[dict]:
    """The training runs in table order, each with its totals: an extended run's ``total`` steps, tokens and
    training time add those of the run it started from (``parts`` lists both runs), and its peak memory is the
    higher of the two."""
    by_name = {r["model"]: r for r in records}
    runs = []
    for record in sorted(records, key=_context_order):
        parts = [record]
        if record["initialized_from"]:
            start = by_name.get(record["initialized_from"].removeprefix("ctx-"))
            if start is None:
                raise ValueError(f"run ctx-{record['model']} started from {record['initialized_from']}, which has "
                                 "no record")  # fmt: skip
            parts.insert(0, start)
        memory = [p["peak_memory_mib"] for p in parts]
        runs.append({
            **record,
            "parts": parts,
            "total_steps": sum(p["steps"] for p in parts),
            "total_tokens": sum(p["tokens"] for p in parts),
            "total_seconds": sum(p["train_seconds"] for p in parts),
            "total_peak_memory_mib": None if None in memory else max(memory),
        })  # fmt: skip
    return runs


def context_training_table(records: list[dict]) -> str:
    """Steps, tokens, training time and peak memory of every pretraining run of the long-context comparison, with the
    recipe's own held-out evaluation at the end of training."""
    header = ["model", "context", "steps", "blocks a step", "training tokens", "training time¹", "peak memory²",
              "recipe's held-out loss / accuracy³"]
    rows = []
    for run in context_runs(records):
        parts = run["parts"]
        steps = " + ".join(f"{p['steps']} at {p['length']}" for p in parts) if len(parts) > 1 else f"{run['steps']}"
        blocks = " / ".join(f"{p['blocks_per_step']} × {p['length']}" for p in parts)
        time = f"{run['total_seconds'] / 60:.1f} min"
        if len(parts) > 1:
            time += " (" + " + ".join(f"{p['train_seconds'] / 60:.1f}" for p in parts) + ")"
        memory = run["total_peak_memory_mib"]
        rows.append([_context_name(run), run["length"], steps, blocks, f"{run['total_tokens'] / 1e6:.2f}M", time,
                     "–" if memory is None else f"{memory:,.0f} MiB",
                     f"{run['eval']['loss']:.3f} / {100 * run['eval']['masked_accuracy']:.1f}%"])
    return "\n".join(table_lines(header, rows))


def _context_evaluations(evals: list[dict]) -> list[tuple[str, dict, list[dict]]]:
    """``(model, one transform length, evaluations)`` rows: each model's evaluations as trained, then (for Orchid)
    those with one transform length, as a row of their own."""
    rows = []
    for record in evals:
        for one_length in (False, True):
            entries = [e for e in record["evaluations"] if e["one_transform_length"] == one_length]
            if entries:
                rows.append((record["model"], one_length, entries))
    return rows


def check_same_masks(evals: list[dict]) -> dict[str, int]:
    """The masked tokens per category, which every evaluation must share (the same text, masks and blocks); a
    ``ValueError`` naming the model whose counts differ."""
    counts = None
    for record in evals:
        for entry in record["evaluations"]:
            if "categories" not in entry:
                continue
            these = {name: c["count"] for name, c in entry["categories"].items()}
            if counts is None:
                counts, first = these, record["model"]
            elif these != counts:
                raise ValueError(f"the evaluations of {first} and {record['model']} (length {entry['length']}) "
                                 f"score different masked tokens: {counts} against {these}")  # fmt: skip
    return counts or {}


def context_accuracy_table(training: list[dict], evals: list[dict], category: str = "all") -> str:
    """Held-out accuracy (and loss) of the masked tokens of ``category`` for every model at every length it read:
    one row per model, and a row of its own for an Orchid model read with one transform length."""
    names = {r["model"]: r for r in context_runs(training)}
    lengths = sorted({e["length"] for r in evals for e in r["evaluations"]})
    rows = []

    def order(row):
        run = names.get(row[0])
        return (*(_context_order(run) if run else (True, row[0], 9, 0)), row[1])

    for model, one_length, entries in sorted(_context_evaluations(evals), key=order):
        run = names.get(model)
        name = _context_name(run) if run else model
        if one_length:
            name += ", one transform length"
        cells = []
        for length in lengths:
            entry = next((e for e in entries if e["length"] == length), None)
            if entry is None or "categories" not in entry:
                cells.append("–")
                continue
            value = entry["categories"][category]
            if value["accuracy"] is None:  # no masked token of this category at this length
                cells.append("–")
                continue
            mark = "*" if "without training" in entry["how"] else ""
            cells.append(f"{100 * value['accuracy']:.1f}{mark} ({value['loss']:.2f})")
        trained = run["length"] if run else next(r["max_position_embeddings"] for r in evals if r["model"] == model)
        rows.append([name, trained, *cells])
    return "\n".join(table_lines(["model", "trained at", *(f"{length} tokens" for length in lengths)], rows))


def context_counts_note(evals: list[dict]) -> str:
    """How many masked tokens each category holds, and what the categories are."""
    counts = check_same_masks(evals)
    record = evals[0]
    short, long = record["category_blocks"]
    described = [
        f"{name} ({CATEGORY_TEXT[name].format(short=short, long=long, rare=record['rare_below'])}): {counts[name]:,}"
        for name in CATEGORY_TEXT if name in counts
    ]
    return (
        f"The held-out text: {record['tokens']:,} tokens of *Persuasion*, {100 * record['mlm_probability']:.0f}% of "
        f"them masked once (seed {record['seed']}) for every model and length. Masked tokens per category: "
        + "; ".join(described) + "."
    )


def context_commands(records: list[dict]) -> str:
    """The command of every pretraining run, as GNU time recorded it."""
    lines = [f"# {_context_name(r)}\n{r['command']}" for r in sorted(records, key=_context_order) if r["command"]]
    return "```bash\n" + "\n".join(lines) + "\n```" if lines else ""


def plot_context(training: list[dict], evals: list[dict], path: str | Path) -> None:
    """Held-out accuracy against the context length read, one line per model, for every masked token, the far ones
    and the far rare ones; untrained extensions as open markers."""
    from orchid_hf.extras import require_extra

    require_extra("matplotlib", "plot")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = {r["model"]: r for r in context_runs(training)}
    categories = ("all", "far", "far, rare")
    figure = Figure(figsize=(15, 4.8))
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(categories))
    rows = [row for row in _context_evaluations(evals) if not row[1]]
    rows.sort(key=lambda row: _context_order(names[row[0]]) if row[0] in names else (True, row[0], 9, 0))
    for index, (model, _, entries) in enumerate(rows):
        run = names.get(model)
        label = _context_name(run) if run else model
        read = [e for e in entries if "categories" in e]
        # One colour per model in every panel (the open markers would otherwise advance the colour cycle).
        color = f"C{index % 10}"
        for ax, category in zip(axes, categories):
            xs = [e["length"] for e in read]
            # A category without tokens at some length has no accuracy there: a gap in its line.
            ys = [float("nan") if (acc := e["categories"][category]["accuracy"]) is None else 100 * acc for e in read]
            (line,) = ax.plot(xs, ys, marker="o", label=label, color=color,
                              linestyle="--" if run and run["arch"] != "orchid" else "-")  # fmt: skip
            untrained = [(x, y) for x, y, e in zip(xs, ys, read) if "without training" in e["how"]]
            if untrained:
                ax.plot(*zip(*untrained), marker="o", linestyle="none", markerfacecolor="white",
                        markeredgecolor=line.get_color(), markersize=8)  # fmt: skip
    for ax, category in zip(axes, categories):
        ax.set_xscale("log", base=2)
        lengths = sorted({e["length"] for r in evals for e in r["evaluations"]})
        ax.set_xticks(lengths, [str(length) for length in lengths])
        ax.set(xlabel="context read (tokens)", ylabel="held-out masked-token accuracy (%)",
               title={"all": "every masked token", "far": "far: seen only in the longest block",
                      "far, rare": "far and rare in training"}[category])  # fmt: skip
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    figure.suptitle("Masked LM on Persuasion (held out), by the context each model reads; open markers: Orchid "
                    "extended without training")  # fmt: skip
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def render_context_report(records: dict[str, list[dict]], report: str | Path) -> dict[str, str]:
    """Fill the ``context-training``, ``context-accuracy`` and ``context-commands`` blocks of ``report`` and draw
    its plot next to it, from the long-context records; returns the blocks."""
    report = Path(report)
    training, evals = records["context"], records["context-eval"]
    blocks = {}
    if training:
        blocks["context-training"] = (
            f"{context_training_table(training)}\n\n¹ Wall-clock training time with evaluation left out (the "
            "recipe's `train_seconds`). An extended model's steps, tokens and time add those of the model it started "
            "from.\n\n² Peak memory of the whole process (GNU time's maximum resident set "
            "size), the highest of both runs for an extended model.\n\n³ The recipe's evaluation at the end of "
            "training, on the first held-out blocks of the model's own length (its own masks)."
        )
        blocks["context-commands"] = context_commands(training)
    if evals:
        plot = report.parent / "long_context.png"
        plot_context(training, evals, plot)
        tables = [
            f"{title}\n\n{context_accuracy_table(training, evals, category)}"
            for title, category in (("Every masked token: accuracy % (loss)", "all"),
                                    ("Far tokens: accuracy % (loss)", "far"),
                                    ("Far and rare tokens: accuracy % (loss)", "far, rare"))
        ]  # fmt: skip
        blocks["context-accuracy"] = (
            "\n\n".join(tables) + "\n\n* Orchid extended to the length without training (docs/model.md, \"Context "
            "extension\"); – not read (BERT's positions stop at its training length).\n\n"
            f"{context_counts_note(evals)}\n\n![accuracy by context]({plot.name})"
        )
    text = report.read_text()
    for name, content in blocks.items():
        text = replace_block(text, BLOCKS, name, content)
    report.write_text(text)
    return blocks


def render_report(
    results_dir: str | Path,
    report: str | Path,
    readme: str | Path | None = None,
    context_report: str | Path | None = None,
) -> dict[str, str]:
    """Fill the blocks of ``report`` (``pretraining``, ``attribution``, ``pairs``, ``grid``, ``images``,
    ``machine``, ``headline``; each only where there are records for it), the ``headline`` block of ``readme``
    and those of ``context_report`` (:func:`render_context_report`, where there are long-context records) from the
    records in ``results_dir``; draw the plots next to the reports. Returns the generated blocks."""
    records = load_records(results_dir)
    if not any(records[kind] for kind in RECORD_KINDS):
        raise ValueError(f"{results_dir} holds no records: run scripts/real_data_report.py --runs first")
    report = Path(report)
    blocks = {"headline": headline_table(records)}
    note = time_note(records["machine"][0] if records["machine"] else {})
    if records["pretraining"]:
        plot = report.parent / "real_data_pretraining.png"
        plot_pretraining(records["pretraining"], plot)
        table = pretraining_table(records["pretraining"])
        blocks["pretraining"] = f"{table}\n\n{note}\n\n![pretraining curves]({plot.name})"
    if records["attribution"]:
        blocks["attribution"] = f"{attribution_table(records['attribution'])}\n\n{note}"
    if records["pairs"]:
        blocks["pairs"] = f"{attribution_table(records['pairs'], 'pairs')}\n\n{note}"
    grid = [grid_table(records["grid"])] if records["grid"] else []
    if records["floor"]:
        grid.append(floor_note(records["floor"]))
    if records["probe"]:
        grid.append(probe_note(records["probe"]))
    if grid:
        blocks["grid"] = "\n\n".join(grid)
    if records["image"]:
        plot = report.parent / "real_data_confusion.png"
        plot_confusion_matrices(records["image"], plot)
        blocks["images"] = f"{image_table(records['image'])}\n\n{note}\n\n![confusion matrices]({plot.name})"
    if records["machine"]:
        machine = records["machine"][0]
        blocks["machine"] = machine_block(
            machine, f"every run on {machine['threads_per_run']} thread, {machine['runs_at_a_time']} runs at a time."
        )
    text = report.read_text()
    for name, content in blocks.items():
        text = replace_block(text, BLOCKS, name, content)
    report.write_text(text)
    if readme is not None:
        readme = Path(readme)
        readme.write_text(replace_block(readme.read_text(), BLOCKS, "headline", blocks["headline"]))
    if context_report is not None and (records["context"] or records["context-eval"]):
        blocks.update(render_context_report(records, context_report))
    return blocks


__all__ = [
    "best_grid_point",
    "best_pooled_point",
    "choose_grid_point",
    "collect_runs",
    "comparison_outcome",
    "comparison_words",
    "context_runs",
    "difference_cell",
    "difference_interval",
    "embedding_parameters",
    "grid_choices",
    "headline_table",
    "load_records",
    "render_context_report",
    "render_report",
]
