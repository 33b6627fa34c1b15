"""GLUE fine-tuning (App. C.3, Tables C.1 and C.2) and classification of your own text, as transformers'
``run_glue.py`` does it: ``scripts/finetune_glue.py`` is the command line.

What the paper adds to run_glue: Table C.2's per-task hyperparameters as the defaults (``--recipe
orchid-bert-base-glue`` or ``orchid-bert-large-glue``), several tasks in one run (``--task_name mnli rte`` or
``all``), RTE, MRPC and STS-B started from the MNLI model (``--from_mnli``), mean pooling for QNLI-base, and the
results laid out as Table C.1. ``--do_predict`` writes GLUE's submission files. Metrics come from the metric modules
in ``orchid_hf.metrics`` (``evaluate.load`` of a local path; the Hub's ``glue`` metric gives the same numbers).
"""

from __future__ import annotations

import copy
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from .extras import require_extra

require_extra("datasets", "train")

import numpy as np  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    TrainingArguments,
    default_data_collator,
)

from .arguments import ModelArguments, RecipeArguments, parse_recipe_arguments  # noqa: E402
from .data_files import (  # noqa: E402
    DataFile,
    check_column_type,
    check_labels_present,
    fill_empty_text,
    locate,
    read_data_file,
    require_columns,
)
from .hub import from_pretrained, require_hub  # noqa: E402
from .metrics import load_metric  # noqa: E402
from .model_loading import build_model, check_head_size, checkpoint_label_names  # noqa: E402
from .optimization import describe_schedule, plan_for_model  # noqa: E402
from .recipes import list_recipes  # noqa: E402
from .runs import (  # noqa: E402
    STAGES,
    card_base_model,
    check_push,
    finish_run,
    setup_logging,
    start_run,
    train_and_save,
    write_json,
)
from .trainer import RecipeTrainer  # noqa: E402

logger = logging.getLogger(__name__)

GLUE_DATASET = "nyu-mll/glue"
DATA_EXTENSIONS = (".tsv", ".csv", ".jsonl", ".json", ".parquet")
TIMING_KEYS = ("runtime", "per_second", "preparation_time", "samples")


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


# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------


@dataclass
class TextModelArguments(ModelArguments):
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Tokenizer name or folder, if not the one saved with --model_name_or_path."}
    )


@dataclass
class GlueDataArguments:
    """What to train and evaluate on: GLUE tasks (Hub or local copies), or your own files."""

    task_name: list[str] | None = field(
        default=None,
        metadata={"help": f"GLUE task(s): {', '.join(ALL_TASKS)}, several, or all (MNLI first). Without it, "
                  "--train_file/--validation_file (or --dataset_name) hold your own classification data."},
    )  # fmt: skip
    dataset_name: str | None = field(
        default=None, metadata={"help": "Hub dataset (GLUE tasks: a copy with GLUE's configurations, nyu-mll/glue)."}
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Configuration of --dataset_name."})
    train_file: str | None = field(default=None, metadata={"help": "A csv/tsv/json(l)/parquet file of training data."})
    validation_file: str | None = field(default=None, metadata={"help": "The same for validation."})
    test_file: str | None = field(default=None, metadata={"help": "The same for --do_predict (labels not needed)."})
    data_dir: str | None = field(
        default=None,
        metadata={"help": "Local GLUE copies: DIR/<task>/<split>.tsv (or .csv/.jsonl/.json/.parquet), splits train, "
                  "validation (MNLI: validation_matched, validation_mismatched) and test (MNLI: test_matched, "
                  "test_mismatched; DIR/ax/test.tsv for AX)."},
    )  # fmt: skip
    text_column_names: str | None = field(
        default=None,
        metadata={"help": "Own data: the text column(s), 'text' or 'sentence1,sentence2'. Default: sentence1 and "
                  "sentence2, else sentence or text, else the first one or two text columns."},
    )  # fmt: skip
    label_column_name: str = field(default="label", metadata={"help": "Own data: the label column."})
    max_seq_length: int = field(default=128, metadata={"help": "Tokens per example; longer ones are truncated."})
    pad_to_max_length: bool = field(
        default=False, metadata={"help": "Pad every example to max_seq_length (default: pad each batch)."}
    )
    overwrite_cache: bool = field(default=False, metadata={"help": "Tokenize again instead of using the cache."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Use at most this many training examples."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "... evaluation examples."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "... test examples."})
    from_mnli: bool = field(
        default=False, metadata={"help": "Start RTE, MRPC and STS-B from the MNLI fine-tuned model."}
    )
    mnli_checkpoint: str | None = field(
        default=None, metadata={"help": "The MNLI model for --from_mnli (default: OUTPUT_DIR/mnli)."}
    )
    pooling: str | None = field(
        default=None,
        metadata={"help": "Orchid models: classify the first token or the mean of the real tokens (recipes: mean "
                  "for own data and QNLI-base, first for the other GLUE tasks). Without this flag, a checkpoint that "
                  "is already a sequence classifier keeps the pooling it was trained with.",
                  "choices": ["first", "mean"]},
    )  # fmt: skip

    def __post_init__(self):
        if isinstance(self.task_name, str):
            self.task_name = self.task_name.replace(",", " ").split()
        if self.max_seq_length < 2:
            raise ValueError(f"max_seq_length must be >= 2, got {self.max_seq_length}")

    def tasks(self) -> list[str | None]:
        """The GLUE tasks to run, MNLI first (RTE, MRPC and STS-B may start from it); [None] for own data."""
        if not self.task_name:
            if not (self.train_file or self.validation_file or self.test_file or self.dataset_name):
                raise ValueError(
                    "pass --task_name (GLUE: "
                    f"{', '.join(ALL_TASKS)} or all) or your own data with --train_file/--validation_file"
                )
            return [None]
        names = [name.lower() for name in self.task_name]
        names = list(ALL_TASKS) if names == ["all"] else names
        for name in names:
            get_task(name)
        if len(names) > 1 and (self.train_file or self.validation_file or self.test_file):
            raise ValueError(f"--train_file/--validation_file/--test_file hold one task, got --task_name {names}")
        return sorted(dict.fromkeys(names), key=ALL_TASKS.index)


DATACLASSES = (TextModelArguments, GlueDataArguments, RecipeArguments, TrainingArguments)


def _default_recipe(given: dict) -> str:
    """Own data (files, or a Hub dataset, without --task_name) gets the classification recipe; GLUE the base one."""
    own_files = any(given.get(f"{split}_file") for split in ("train", "validation", "test"))
    own_data = not given.get("task_name") and (own_files or given.get("dataset_name"))
    return "orchid-bert-classification" if own_data else "orchid-bert-base-glue"


def parse_args(argv: list[str] | None = None, task: str | None = None):
    """The command line with the recipe's defaults (and ``task``'s, for the GLUE recipes)."""
    return parse_recipe_arguments(
        DATACLASSES,
        argv,
        kind="text-classification",
        default_recipe=_default_recipe,
        task=task,
        description="GLUE fine-tuning and text classification. Recipes: "
        + ", ".join(list_recipes("text-classification")),
    )


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------

LOCAL_GLUE_HINT = (
    "Offline, pass local files: --data_dir DIR with DIR/<task>/train.tsv and DIR/<task>/validation.tsv (MNLI: "
    "validation_matched.tsv and validation_mismatched.tsv; .csv, .jsonl, .json and .parquet work too), or for one "
    "task --train_file and --validation_file, with GLUE's columns (e.g. sentence,label for SST-2)."
)


def load_data_file(path: str | Path, cache_dir: str | None = None, role: str = "data"):
    """One split from a .tsv/.csv/.json(l)/.parquet file (:func:`orchid_hf.data_files.read_data_file`). TSV is read
    without quote handling: GLUE's own files contain unbalanced quotes that are part of the text."""
    return read_data_file(DataFile(path, role), cache_dir, suffixes=DATA_EXTENSIONS)


def _local_file(data_dir: Path, task: str, split: str, required: bool = True) -> DataFile | None:
    candidates = [data_dir / task / f"{split}{ext}" for ext in DATA_EXTENSIONS]
    found = [path for path in candidates if path.is_file()]
    if not found:
        if not required:
            return None
        raise ValueError(f"no {split} file for {task}: looked for {', '.join(str(p) for p in candidates)}")
    return DataFile(found[0], split)


def load_glue_task(
    task: str,
    *,
    splits: tuple[str, ...] | None = None,
    data_dir: str | Path | None = None,
    files: dict[str, str] | None = None,
    dataset_name: str | None = GLUE_DATASET,
    cache_dir: str | None = None,
    token: str | None = None,
) -> dict:
    """``{split: Dataset}`` of a GLUE task from ``files`` (split -> file), ``data_dir`` or the Hub.

    splits: which splits (default: train and the validation splits); test splits need no labels.
    """
    spec = AX_TASK if task == "ax" else get_task(task)
    splits = splits or ("train", *spec.validation_splits)
    sources: dict[str, DataFile | str] = {}
    if files:
        sources = {split: DataFile(path, split) for split, path in files.items() if split in splits}
    elif data_dir is not None:
        sources = {split: _local_file(Path(data_dir), task, split) for split in splits}
    if sources:
        data = {split: read_data_file(source, cache_dir, DATA_EXTENSIONS) for split, source in sources.items()}
    else:
        from datasets import load_dataset

        name = dataset_name or GLUE_DATASET
        require_hub(name, what="dataset", how_to_local=LOCAL_GLUE_HINT)
        raw = load_dataset(name, task, cache_dir=cache_dir, token=token)
        missing = [split for split in splits if split not in raw]
        if missing:
            raise ValueError(f"{name} ({task}) has no split {missing}; it has {list(raw)}")
        data = {split: raw[split] for split in splits}
        sources = {split: f"{name} ({task}) {split} split" for split in splits}
    for split, dataset in data.items():
        source = sources[split]
        text = [key for key in spec.sentence_keys if key is not None]
        needed = text if split.startswith("test") else [*text, "label"]
        missing = [key for key in needed if key not in dataset.column_names]
        if missing:
            raise ValueError(
                f"{source}: {task} {split} data lacks the columns {missing} (it has {dataset.column_names}); "
                f"GLUE's {task} needs {needed}"
            )
        data[split] = fill_empty_text(dataset, source, text)
        if not split.startswith("test"):
            check_labels_present(dataset, source, "label")
            for index, label in enumerate(dataset["label"]):
                try:
                    _label_value(spec, label)
                except ValueError as error:
                    raise ValueError(f"{locate(source, index, len(dataset))}: {error}") from None
    return data


def _label_value(spec: GlueTask, label) -> int | float:
    """A label cell as the model's target: a class id (from a label name or an id) or, for STS-B, a float."""
    if spec.is_regression:
        try:
            return float(label)
        except (TypeError, ValueError):
            raise ValueError(f"{spec.name} label {label!r} is not a number") from None
    if isinstance(label, str):
        if label in spec.label_names:
            return spec.label_names.index(label)
        try:
            label = int(label)
        except ValueError:
            raise ValueError(
                f"{spec.name} label {label!r} is neither one of {list(spec.label_names)} nor a class id "
                f"0..{spec.num_labels - 1}"
            ) from None
    if isinstance(label, float) and label.is_integer():
        label = int(label)
    if not isinstance(label, (int, np.integer)) or not 0 <= label < spec.num_labels:
        raise ValueError(f"{spec.name} label {label!r} is outside 0..{spec.num_labels - 1}")
    return int(label)


def encode_labels(task: str, dataset, label_column: str = "label"):
    """Labels as class ids (names such as "entailment" are mapped) or floats for STS-B."""
    from datasets import ClassLabel, Value

    spec = get_task(task)
    labels = []
    for index, label in enumerate(dataset[label_column]):
        try:
            labels.append(_label_value(spec, label))
        except ValueError as error:
            raise ValueError(f"{task} data, row {index + 1}: {error}") from None
    feature = Value("float32") if spec.is_regression else ClassLabel(names=list(spec.label_names))
    return dataset.remove_columns(label_column).add_column("label", labels, feature=feature)


@dataclass
class TaskData:
    """Splits of one run, with what the model and the metric need to know about them."""

    name: str  # a GLUE task, or "own" for own data
    splits: dict  # split name -> Dataset (labels as ids or floats, in a "label" column)
    sentence_keys: tuple[str, str | None]
    label_names: list[str]  # empty for regression
    validation_splits: tuple[str, ...]
    test_splits: tuple[str, ...]

    @property
    def is_regression(self) -> bool:
        return not self.label_names


def _own_text_columns(data_args: GlueDataArguments, columns: list[str], dataset, source) -> tuple[str, str | None]:
    if data_args.text_column_names:
        names = [c.strip() for c in data_args.text_column_names.split(",") if c.strip()]
        if not 1 <= len(names) <= 2:
            raise ValueError(f"--text_column_names {data_args.text_column_names!r} must name one or two columns")
        return names[0], (names[1] if len(names) > 1 else None)
    if "sentence1" in columns and "sentence2" in columns:
        return "sentence1", "sentence2"
    for name in ("sentence", "text"):
        if name in columns:
            return name, None
    text = [
        c
        for c in columns
        if c != data_args.label_column_name
        and getattr(dataset.features[c], "dtype", None) in ("string", "large_string")
    ]
    if not text:
        raise ValueError(f"{source} has no text column among {columns}; name it with --text_column_names")
    return text[0], (text[1] if len(text) > 1 else None)


def load_own_data(
    data_args: GlueDataArguments,
    stages: set[str],
    cache_dir: str | None,
    token: str | None,
    model_labels: list[str] | None = None,
) -> TaskData:
    """Own classification data (run_glue's rules): a float label column means regression; otherwise the sorted
    distinct training labels are the classes. ``model_labels``: the classes of a trained classifier that is
    evaluated or predicts without training; every label of the data must be one of them."""
    from datasets import ClassLabel, Value

    if data_args.dataset_name:
        from datasets import load_dataset

        require_hub(data_args.dataset_name, what="dataset", how_to_local=LOCAL_GLUE_HINT)
        raw = dict(
            load_dataset(data_args.dataset_name, data_args.dataset_config_name, cache_dir=cache_dir, token=token)
        )
        sources = {split: f"{data_args.dataset_name} {split} split" for split in raw}
    else:
        files = {"train": data_args.train_file, "validation": data_args.validation_file, "test": data_args.test_file}
        sources = {split: DataFile(path, split) for split, path in files.items() if path}
        raw = {split: read_data_file(source, cache_dir, DATA_EXTENSIONS) for split, source in sources.items()}
    label = data_args.label_column_name
    if "train" not in raw and "do_train" in stages:
        raise ValueError("--do_train needs training data: pass --train_file")
    reference = next((split for split in ("train", "validation", "test") if split in raw), None)
    if reference is None:
        raise ValueError("no data: pass --train_file, --validation_file or --test_file")
    labelled = [split for split in ("train", "validation") if split in raw]
    for split in labelled:
        if label not in raw[split].column_names:
            raise ValueError(
                f"{sources[split]} has no label column {label!r} (columns {raw[split].column_names}); "
                "name it with --label_column_name"
            )
        check_labels_present(raw[split], sources[split], label)
        check_column_type(raw[split], sources[split], label, "label")
    sentence_keys = _own_text_columns(data_args, raw[reference].column_names, raw[reference], sources[reference])
    for split, dataset in raw.items():
        text = [key for key in sentence_keys if key is not None]
        require_columns(dataset, sources[split], text)
        raw[split] = fill_empty_text(dataset, sources[split], text)
    source = raw[labelled[0]] if labelled else None
    feature = source.features[label] if source is not None else None
    if model_labels:
        label_names, origin = list(model_labels), "the model's"
    elif isinstance(feature, ClassLabel):
        label_names = list(feature.names)
    elif feature is not None and feature.dtype.startswith("float"):
        label_names = []
    elif source is not None:
        distinct = set(source[label])
        numeric = all(isinstance(v, int) and not isinstance(v, bool) for v in distinct)
        label_names = [str(v) for v in sorted(distinct, key=int if numeric else str)]
    else:
        raise ValueError("--do_predict alone needs the labels of a model trained before: pass --validation_file too")
    if not model_labels:
        origin = "the training" if labelled and labelled[0] == "train" else "the validation"
    ids = {name: index for index, name in enumerate(label_names)}
    splits = {}
    for split, dataset in raw.items():
        if split == "test" or label not in dataset.column_names:
            splits[split] = dataset
            continue
        if not label_names:
            values, new_feature = [float(v) for v in dataset[label]], Value("float32")
        else:
            names = dataset.features[label].names if isinstance(dataset.features[label], ClassLabel) else None
            values = [str(names[v] if names else v) for v in dataset[label]]
            unknown = next((index for index, value in enumerate(values) if value not in ids), None)
            if unknown is not None:
                raise ValueError(
                    f"{locate(sources[split], unknown, len(dataset))}: label {values[unknown]!r} is not among "
                    f"{origin} labels {label_names}"
                )
            values, new_feature = [ids[v] for v in values], ClassLabel(names=label_names)
        splits[split] = dataset.remove_columns(label).add_column("label", values, feature=new_feature)
    return TaskData(
        "own", splits, sentence_keys, label_names, ("validation",) if "validation" in splits else (), ("test",)
    )


def load_task_data(task: str, data_args: GlueDataArguments, stages: set[str], cache_dir, token) -> TaskData:
    """The splits a GLUE run needs for its stages (train; validation; test, plus AX with MNLI)."""
    spec = get_task(task)
    wanted = []
    if "do_train" in stages:
        wanted.append("train")
    if "do_eval" in stages:
        wanted += list(spec.validation_splits)
    if "do_predict" in stages:
        wanted += list(spec.test_splits)
    files = None
    if data_args.train_file or data_args.validation_file or data_args.test_file:
        files = {"train": data_args.train_file, spec.validation_splits[0]: data_args.validation_file}
        files[spec.test_splits[0]] = data_args.test_file
        files = {split: path for split, path in files.items() if path}
        missing = [split for split in wanted if split not in files]
        # MNLI's second validation and test sets have no flag of their own: --data_dir or the Hub bring them.
        optional = {*spec.validation_splits[1:], *spec.test_splits[1:]}
        required = [split for split in missing if split not in optional]
        if required:
            raise ValueError(
                f"{task}: no file for the {', '.join(required)} split(s); pass --train_file, --validation_file and "
                "(for --do_predict) --test_file"
            )
        if missing:
            logger.info("%s: no file for %s, skipped (use --data_dir for them)", task, ", ".join(missing))
        wanted = [split for split in wanted if split in files]
    splits = load_glue_task(
        task, splits=tuple(wanted), data_dir=data_args.data_dir, files=files, dataset_name=data_args.dataset_name,
        cache_dir=cache_dir, token=token,
    )  # fmt: skip
    splits = {name: encode_labels(task, d) if not name.startswith("test") else d for name, d in splits.items()}
    test_splits = tuple(split for split in spec.test_splits if split in splits)
    if task == "mnli" and "do_predict" in stages and files is None:
        ax = _load_ax(data_args, cache_dir, token)
        if ax is not None:
            splits["ax"] = ax
            test_splits += ("ax",)
    return TaskData(
        task,
        splits,
        spec.sentence_keys,
        list(spec.label_names),
        tuple(split for split in spec.validation_splits if split in splits),
        test_splits,
    )


def _load_ax(data_args: GlueDataArguments, cache_dir, token):
    """GLUE's diagnostic set (AX), which the MNLI model predicts for the leaderboard; None where it is absent."""
    if data_args.data_dir is not None:
        source = _local_file(Path(data_args.data_dir), "ax", "test", required=False)
        if source is None:
            logger.info("no %s/ax/test file: AX.tsv is not written", data_args.data_dir)
            return None
        return load_glue_task("ax", splits=("test",), files={"test": str(source.path)}, cache_dir=cache_dir)["test"]
    return load_glue_task("ax", splits=("test",), dataset_name=data_args.dataset_name, cache_dir=cache_dir,
                          token=token)["test"]  # fmt: skip


def tokenize_splits(data: TaskData, tokenizer, data_args: GlueDataArguments, training_args: TrainingArguments) -> dict:
    """Tokenized splits (at most ``max_*_samples`` examples each); test splits keep their ``idx`` column."""
    first, second = data.sentence_keys
    padding = "max_length" if data_args.pad_to_max_length else False

    def tokenize(batch):
        texts = (batch[first],) if second is None else (batch[first], batch[second])
        return tokenizer(*texts, padding=padding, truncation=True, max_length=data_args.max_seq_length)

    tokenized = {}
    with training_args.main_process_first(desc="tokenizing"):
        for split, dataset in data.splits.items():
            keep = {"label", "idx"} if split in data.test_splits else {"label"}
            tokenized[split] = dataset.map(
                tokenize,
                batched=True,
                num_proc=data_args.preprocessing_num_workers,
                remove_columns=[c for c in dataset.column_names if c not in keep],
                load_from_cache_file=not data_args.overwrite_cache,
                desc=f"tokenizing {split}",
            )
    for split in tokenized:
        if split == "train":
            limit = data_args.max_train_samples
        elif split in data.test_splits:
            limit = data_args.max_predict_samples
        else:
            limit = data_args.max_eval_samples
        if limit is not None:
            tokenized[split] = tokenized[split].select(range(min(limit, len(tokenized[split]))))
    return tokenized


# ---------------------------------------------------------------------------------------------
# One run
# ---------------------------------------------------------------------------------------------


def metrics_function(data: TaskData):
    """A Trainer ``compute_metrics``: arg-max of the logits (or the score), then the task's metric module."""
    if data.name in GLUE_TASKS:
        metric = load_metric("glue", data.name)
    else:
        metric = load_metric("glue", "stsb") if data.is_regression else load_metric("accuracy")

    def compute(eval_prediction) -> dict[str, float]:
        logits = eval_prediction.predictions
        logits = logits[0] if isinstance(logits, tuple) else logits
        predictions = np.squeeze(logits, -1) if data.is_regression else np.argmax(logits, axis=-1)
        result = metric.compute(predictions=predictions, references=eval_prediction.label_ids)
        if len(result) > 1:
            result["combined_score"] = float(np.mean(list(result.values())))
        return result

    return compute


def write_predictions(trainer, data: TaskData, tokenized: dict, output_dir: Path, submission_dir: Path) -> dict:
    """Predict the test split(s): ``predict_results_<split>.txt`` (run_glue's format) in the run's folder, and for
    GLUE tasks the leaderboard file (``<TASK>.tsv``: index, prediction) in ``submission_dir``."""
    written = {}
    for split in data.test_splits:
        dataset = tokenized[split]
        index = dataset["idx"] if "idx" in dataset.column_names else list(range(len(dataset)))
        dataset = dataset.remove_columns([c for c in ("label", "idx") if c in dataset.column_names])
        logits = trainer.predict(dataset, metric_key_prefix="predict").predictions
        logits = logits[0] if isinstance(logits, tuple) else logits
        if data.is_regression:
            # The leaderboard takes similarity scores on STS-B's 0-5 scale.
            values = np.clip(np.squeeze(logits, -1), 0.0, 5.0)
            names = [f"{v:.3f}" for v in values]
        else:
            names = [data.label_names[i] for i in np.argmax(logits, axis=-1)]
        if not trainer.is_world_process_zero():
            continue
        label_file = output_dir / f"predict_results_{data.name}{'' if split == 'test' else '_' + split}.txt"
        label_file.write_text("index\tprediction\n" + "".join(f"{i}\t{n}\n" for i, n in zip(index, names)))
        written[split] = str(label_file)
        spec = AX_TASK if split == "ax" else GLUE_TASKS.get(data.name)
        if spec is None:
            continue
        if data.is_regression or spec.submits_label_names:
            submitted = names
        else:
            submitted = [str(i) for i in np.argmax(logits, axis=-1)]
        submission_dir.mkdir(parents=True, exist_ok=True)
        file_name = dict(spec.submission)["test" if split == "ax" else split]
        path = submission_dir / file_name
        path.write_text("index\tprediction\n" + "".join(f"{i}\t{p}\n" for i, p in zip(index, submitted)))
        written[file_name] = str(path)
    return written


def is_sequence_classifier(config) -> bool:
    """Whether a loaded config is that of a saved sequence classifier (its pooler and classifier trained)."""
    return any(name.endswith("ForSequenceClassification") for name in getattr(config, "architectures", None) or [])


def _set_pooling(pooling: str | None, explicit: frozenset[str]):
    """A ``prepare_config`` that sets an Orchid config's ``classifier_pooling``. ``--pooling`` always does; the
    recipe's value is for a new head, so a checkpoint that is already a sequence classifier keeps the pooling its
    pooler was trained with (a classifier evaluated, or trained further, is not silently changed)."""

    def prepare(config) -> None:
        if pooling is None:
            return
        given = "pooling" in explicit
        if hasattr(config, "classifier_pooling"):
            if given or not is_sequence_classifier(config):
                config.classifier_pooling = pooling
            elif config.classifier_pooling != pooling:
                logger.info("the checkpoint is a sequence classifier with %s pooling, which it keeps (the recipe's "
                            "is %s; --pooling sets it)", config.classifier_pooling, pooling)  # fmt: skip
        elif given:
            raise ValueError(f"--pooling applies to Orchid models; {config.model_type} pools as its class does")
        elif pooling != "first":
            logger.info("the recipe's %s pooling applies to Orchid models only; %s pools as its class does",
                        pooling, config.model_type)  # fmt: skip

    return prepare


def run_task(parsed, task: str | None, root: Path) -> dict:
    """Fine-tune, evaluate and predict one task (or own data) as run_glue does; returns its results."""
    model_args, data_args, _, _ = parsed
    explicit, recipe = parsed.explicit, parsed.recipe
    training_args, plan = start_run(parsed)
    output_dir = root / task if task else root
    training_args.output_dir = str(output_dir)
    if task and training_args.hub_model_id:
        training_args.hub_model_id = f"{training_args.hub_model_id}-{task}"
    stages = {stage for stage in STAGES if getattr(training_args, stage)}
    if not stages:
        raise ValueError("nothing to do: --do_train, --do_eval and --do_predict are all off")

    start, ignore_sizes = model_args.model_name_or_path, None
    if task in FROM_MNLI_TASKS and data_args.from_mnli and "do_train" in stages:
        start = data_args.mnli_checkpoint or str(root / "mnli")
        if not (Path(start) / "config.json").is_file():
            raise ValueError(f"--from_mnli: {task} starts from the MNLI model, but {start} holds no model")
        ignore_sizes = True  # MNLI's 3-way classifier is replaced
        logger.info("%s starts from the MNLI model %s (its classifier is replaced)", task, start)
    tokenizer_name = model_args.tokenizer_name or start
    if not tokenizer_name:
        raise ValueError("a new model needs a tokenizer: pass --tokenizer_name (a folder or Hub id)")
    tokenizer = from_pretrained(
        AutoTokenizer, tokenizer_name, what="tokenizer", how_to_local=LOCAL_GLUE_HINT,
        cache_dir=model_args.cache_dir, token=model_args.token, trust_remote_code=model_args.trust_remote_code,
    )  # fmt: skip

    if task:
        data = load_task_data(task, data_args, stages, model_args.cache_dir, model_args.token)
    else:
        # A trained classifier that only evaluates or predicts keeps its classes (run_glue's rule).
        model_labels = checkpoint_label_names(start) if start and "do_train" not in stages else None
        data = load_own_data(data_args, stages, model_args.cache_dir, model_args.token, model_labels)
    if "do_eval" in stages and not data.validation_splits:
        raise ValueError("--do_eval needs validation data: pass --validation_file")
    if "do_predict" in stages and not data.test_splits:
        raise ValueError("--do_predict needs test data: pass --test_file")

    num_labels = len(data.label_names) or 1
    labels = {}
    if data.label_names:
        labels = dict(id2label=dict(enumerate(data.label_names)),
                      label2id={name: i for i, name in enumerate(data.label_names)})  # fmt: skip
    model_args_for_task = copy.copy(model_args)
    model_args_for_task.model_name_or_path = start
    if ignore_sizes is None:
        check_head_size(model_args_for_task, num_labels, data.label_names)
    model = build_model(
        AutoModelForSequenceClassification, model_args_for_task, recipe,
        how_to_local="Pass the folder of a pretrained model (see scripts/pretrain_mlm.py).",
        new_model_defaults=dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id),
        ignore_mismatched_sizes=ignore_sizes, prepare_config=_set_pooling(data_args.pooling, explicit),
        num_labels=num_labels, problem_type="regression" if data.is_regression else "single_label_classification",
        finetuning_task=task, **labels,
    )  # fmt: skip
    plan = plan_for_model(plan, model)
    max_positions = getattr(model.config, "max_position_embeddings", None)
    if max_positions is not None and data_args.max_seq_length > max_positions:
        raise ValueError(
            f"max_seq_length={data_args.max_seq_length} exceeds the model's max_position_embeddings={max_positions}"
        )
    tokenized = tokenize_splits(data, tokenizer, data_args, training_args)

    result = {
        "task": task or "own data",
        "recipe": recipe.name,
        "model_type": model.config.model_type,
        "initialized_from": start or f"new {model.config.model_type} model",
        "learning_rate": training_args.learning_rate,
        "hyperparameters": {
            "learning_rate": describe_schedule(training_args),
            **plan.describe(),
            "epochs": training_args.num_train_epochs,
            "batch_size": training_args.per_device_train_batch_size,
            "pooling": getattr(model.config, "classifier_pooling", "first"),
            "max_seq_length": data_args.max_seq_length,
        },
        "world_size": training_args.world_size,
    }

    def card() -> None:
        _write_card(training_args, data_args, result, task)

    trainer = RecipeTrainer(
        model=model,
        args=training_args,
        train_dataset=tokenized.get("train") if "do_train" in stages else None,
        eval_dataset=tokenized[data.validation_splits[0]] if data.validation_splits else None,
        data_collator=default_data_collator if data_args.pad_to_max_length else DataCollatorWithPadding(tokenizer),
        processing_class=tokenizer,
        compute_metrics=metrics_function(data),
        optimizer_plan=plan,
        card_writer=card,
    )
    if "do_train" in stages:
        _, train_metrics = train_and_save(trainer, len(tokenized["train"]))
        result.update(train_runtime=train_metrics.get("train_runtime"), epochs_done=train_metrics.get("epoch"))
    if "do_eval" in stages:
        result["metrics"] = {}
        combined = {}
        for number, split in enumerate(data.validation_splits):
            metrics = trainer.evaluate(eval_dataset=tokenized[split])
            metrics["eval_samples"] = len(tokenized[split])
            names = [k[len("eval_"):] for k in metrics if k.startswith("eval_") and not k.endswith(TIMING_KEYS)]
            result["metrics"][split] = {name: metrics[f"eval_{name}"] for name in names}
            # run_glue's naming: MNLI's mismatched set gets the suffix _mm.
            metrics = {f"{k}_mm": v for k, v in metrics.items()} if number == 1 else metrics
            combined.update(metrics)
            trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", combined)
        if task:
            result["score"] = task_score(task, result["metrics"])
    if "do_predict" in stages:
        result["predictions"] = write_predictions(trainer, data, tokenized, output_dir, root / "submission")
    finish_run(trainer, result, f"Fine-tuned on {f'GLUE {task.upper()}' if task else 'own data'}")
    return result


def _write_card(training_args: TrainingArguments, data_args: GlueDataArguments, result: dict, task: str | None):
    from .cards import write_model_card

    from_hub = task is not None and data_args.data_dir is None and not data_args.train_file
    dataset_name = (data_args.dataset_name or GLUE_DATASET) if from_hub else "local files"
    results = [
        dict(
            task_type="text-classification",
            task_name=f"GLUE {task.upper()}" if task else "text classification",
            dataset_type=dataset_name if from_hub else (task or "local"),
            dataset_name=dataset_name,
            dataset_config=task if from_hub else None,
            dataset_split=split,
            metric_type=name,
            metric_value=round(100.0 * value, 2),
        )
        for split, values in result.get("metrics", {}).items()
        for name, value in values.items()
        if name in ("accuracy", "f1", "matthews_correlation", "pearson", "spearmanr")
    ]
    repo_id = training_args.hub_model_id if training_args.push_to_hub else None
    write_model_card(
        training_args.output_dir,
        task="text-classification",
        model_name=repo_id or Path(training_args.output_dir).name,
        repo_id=repo_id,
        datasets=[dataset_name] if from_hub else [],
        results=results,
        base_model=card_base_model(result["initialized_from"]),
        training={
            "task": f"GLUE {task.upper()}" if task else "text classification",
            "recipe": result["recipe"],
            "initialized from": result["initialized_from"],
            **{k.replace("_", " "): v for k, v in result["hyperparameters"].items()},
        },
        example_input=None,
    )


def _write_summary(summary: dict, output: Path) -> None:
    scores = {task: r["score"] for task, r in summary["tasks"].items() if "score" in r}
    if not scores:
        return
    summary["glue_average"] = glue_average(scores)
    model_name = Path(summary["model"]).name
    table = results_markdown(scores, model_name)
    summary["table"] = table
    write_json(output / "glue_results.json", summary)
    (output / "glue_results.md").write_text(
        f"# GLUE results: {model_name} ({summary['recipe']})\n\n{table}\n"
        "Scores in percent on the validation sets: Matthews correlation (CoLA), F1 (MRPC, QQP), Spearman "
        "correlation (STS-B), accuracy elsewhere (MNLI: matched / mismatched). The average is over the "
        "eight tasks of Table C.1, MNLI counted as the mean of m and mm, WNLI left out.\n"
    )


def main(argv: list[str] | None = None) -> dict:
    """Run the tasks of the command line; returns ``{"tasks": {task: results}, ...}`` (own data: task "own").

    For GLUE tasks, also writes ``glue_results.json`` and ``glue_results.md`` (Table C.1 layout) in the output
    folder, merged with the results of earlier runs of the same model into the same folder.
    """
    first = parse_args(argv)
    model_args, data_args, _, training_args = first
    setup_logging(training_args)
    tasks = data_args.tasks()
    check_push(training_args)
    if training_args.push_to_hub and len(tasks) > 1 and not training_args.hub_model_id:
        raise ValueError("--push_to_hub with several tasks needs --hub_model_id (each task goes to <id>-<task>)")
    root = Path(training_args.output_dir)
    model_name = model_args.model_name_or_path or f"new {model_args.model_type or 'orchid'} model"
    summary = {"model": model_name, "recipe": first.recipe.name, "tasks": {}}
    summary_path = root / "glue_results.json"
    if summary_path.is_file():
        previous = json.loads(summary_path.read_text())
        if previous.get("model") == summary["model"]:
            summary["tasks"] = previous.get("tasks", {})
    for task in tasks:
        parsed = parse_args(list(first.argv), task=task) if task else first
        result = run_task(parsed, task, root)
        summary["tasks"][task or "own"] = result
        if task and training_args.process_index == 0:
            _write_summary(summary, root)
    return summary


__all__ = [
    "ALL_TASKS",
    "AX_TASK",
    "GLUE_TASKS",
    "TABLE_TASKS",
    "GlueDataArguments",
    "GlueTask",
    "TextModelArguments",
    "encode_labels",
    "get_task",
    "glue_average",
    "load_glue_task",
    "load_own_data",
    "main",
    "parse_args",
    "results_markdown",
    "run_task",
    "task_score",
]
