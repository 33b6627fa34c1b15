"""The data of a GLUE or own-data fine-tuning run (``orchid_hf.glue``): what to read (``GlueDataArguments``), GLUE
tasks from the Hub or local files, your own classification files, their labels as class ids or floats, the
tokenised splits, and the task's metric.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from .extras import require_extra

require_extra("datasets", "train")

import numpy as np  # noqa: E402
from transformers import TrainingArguments  # noqa: E402

from .data_files import (  # noqa: E402
    DataFile,
    check_column_type,
    check_labels_present,
    fill_empty_text,
    locate,
    read_data_file,
    require_columns,
)
from .glue_tasks import ALL_TASKS, AX_TASK, GLUE_TASKS, GlueTask, get_task  # noqa: E402
from .hub import require_hub  # noqa: E402
from .metrics import load_metric  # noqa: E402

logger = logging.getLogger(__name__)

GLUE_DATASET = "nyu-mll/glue"
DATA_EXTENSIONS = (".tsv", ".csv", ".jsonl", ".json", ".parquet")


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


LOCAL_GLUE_HINT = (
    "Offline, pass local files: --data_dir DIR with DIR/<task>/train.tsv and DIR/<task>/validation.tsv (MNLI: "
    "validation_matched.tsv and validation_mismatched.tsv; .csv, .jsonl, .json and .parquet work too), or for one "
    "task --train_file and --validation_file, with GLUE's columns (e.g. sentence,label for SST-2)."
)



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


__all__ = [
    "DATA_EXTENSIONS",
    "GLUE_DATASET",
    "LOCAL_GLUE_HINT",
    "GlueDataArguments",
    "TaskData",
    "encode_labels",
    "load_glue_task",
    "load_own_data",
    "load_task_data",
    "metrics_function",
    "tokenize_splits",
]
