"""GLUE fine-tuning of Orchid-BERT with the transformers Trainer (App. C.3, Tables C.1 and C.2).

The task table, the per-task hyperparameters of Table C.2 for the base and large models, the official
metric of each task computed offline with scikit-learn and scipy (``evaluate.load("glue")`` needs the
Hub), and the Table C.1 layout of the results. ``scripts/finetune_glue.py`` is the command line.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from accelerate import PartialState
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef
from transformers import (
    AutoModelForSequenceClassification,
    DataCollatorWithPadding,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    set_seed,
)

from .training import (
    ADAM_BETAS,
    ADAM_EPSILON,
    MAX_GRAD_NORM,
    OPTIMIZERS,
    WARMUP_FRACTION,
    HubUnavailableError,
    bf16_available,
    from_pretrained,
    hub_offline,
    load_tokenizer,
    require_hub,
    torch_weight_decay,
    write_json,
)

logger = logging.getLogger(__name__)

GLUE_DATASET = "nyu-mll/glue"
DATA_EXTENSIONS = (".tsv", ".csv", ".jsonl", ".json", ".parquet")


@dataclass(frozen=True)
class GlueTask:
    name: str
    sentence_keys: tuple[str, str | None]
    label_names: tuple[str, ...]  # empty for the regression task (STS-B)
    metrics: tuple[str, ...]
    validation_splits: tuple[str, ...] = ("validation",)

    @property
    def num_labels(self) -> int:
        return len(self.label_names) or 1

    @property
    def is_regression(self) -> bool:
        return not self.label_names


GLUE_TASKS: dict[str, GlueTask] = {
    task.name: task
    for task in (
        GlueTask("cola", ("sentence", None), ("unacceptable", "acceptable"), ("matthews_correlation",)),
        GlueTask("sst2", ("sentence", None), ("negative", "positive"), ("accuracy",)),
        GlueTask("mrpc", ("sentence1", "sentence2"), ("not_equivalent", "equivalent"), ("accuracy", "f1")),
        GlueTask("qqp", ("question1", "question2"), ("not_duplicate", "duplicate"), ("accuracy", "f1")),
        GlueTask("stsb", ("sentence1", "sentence2"), (), ("pearson", "spearmanr")),
        GlueTask(
            "mnli",
            ("premise", "hypothesis"),
            ("entailment", "neutral", "contradiction"),
            ("accuracy",),
            ("validation_matched", "validation_mismatched"),
        ),
        GlueTask("qnli", ("question", "sentence"), ("entailment", "not_entailment"), ("accuracy",)),
        GlueTask("rte", ("sentence1", "sentence2"), ("entailment", "not_entailment"), ("accuracy",)),
        GlueTask("wnli", ("sentence1", "sentence2"), ("not_entailment", "entailment"), ("accuracy",)),
    )
}
# Table C.1's columns, then WNLI, which the paper (like BERT) leaves out of the average.
TABLE_TASKS = ("mnli", "rte", "qnli", "qqp", "sst2", "stsb", "cola", "mrpc")
ALL_TASKS = (*TABLE_TASKS, "wnli")
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


@dataclass(frozen=True)
class TaskHyperparameters:
    optimizer: str  # "d-adamw" (Composer DecoupledAdamW) or "adamw" (torch), see training.torch_weight_decay
    learning_rate: float
    weight_decay: float
    epochs: float
    batch_size: int
    pooling: str = "first"  # "mean": average of the non-padding tokens
    from_mnli: bool = False  # start from the MNLI fine-tuned checkpoint (Izsak et al.)


def _table(size: str, rows: dict[str, tuple]) -> dict[str, TaskHyperparameters]:
    # Batch sizes are not in the paper; these are M2-BERT's GLUE jobs, whose hyperparameters the paper reuses.
    batch = {"mnli": 48, "rte": 16, "qnli": 16, "qqp": 16, "sst2": 16, "stsb": 32, "cola": 32, "mrpc": 32, "wnli": 32}
    return {
        task: TaskHyperparameters(
            optimizer=optimizer,
            learning_rate=lr,
            weight_decay=wd,
            epochs=epochs,
            batch_size=batch[task],
            pooling="mean" if (size, task) == ("base", "qnli") else "first",
            from_mnli=task in ("rte", "mrpc", "stsb"),
        )
        for task, (optimizer, lr, wd, epochs) in rows.items()
    }


# Table C.2. WNLI is not in it: BERT's usual settings (AdamW, lr 2e-5, weight decay 0.01, 3 epochs).
HYPERPARAMETERS: dict[str, dict[str, TaskHyperparameters]] = {
    "base": _table(
        "base",
        {
            "mnli": ("d-adamw", 5e-5, 5e-6, 3),
            "rte": ("adamw", 5e-5, 0.01, 6),
            "qnli": ("adamw", 5e-5, 1e-5, 10),
            "qqp": ("adamw", 3e-5, 0.01, 10),
            "sst2": ("d-adamw", 3e-5, 3e-6, 3),
            "stsb": ("adamw", 7e-5, 0.01, 10),
            "cola": ("d-adamw", 5e-5, 5e-6, 10),
            "mrpc": ("adamw", 5e-5, 0.01, 10),
            "wnli": ("adamw", 2e-5, 0.01, 3),
        },
    ),
    "large": _table(
        "large",
        {
            "mnli": ("d-adamw", 5e-5, 5e-6, 3),
            "rte": ("d-adamw", 1e-5, 1e-6, 3),
            "qnli": ("d-adamw", 5e-5, 1e-5, 10),
            "qqp": ("d-adamw", 3e-5, 3e-6, 5),
            "sst2": ("d-adamw", 3e-5, 3e-6, 3),
            "stsb": ("d-adamw", 7e-5, 3e-6, 10),
            "cola": ("adamw", 5e-5, 5e-6, 10),
            "mrpc": ("d-adamw", 8e-5, 8e-6, 10),
            "wnli": ("adamw", 2e-5, 0.01, 3),
        },
    ),
}


def get_task(name: str) -> GlueTask:
    if name not in GLUE_TASKS:
        raise ValueError(f"unknown GLUE task {name!r}; the tasks are {', '.join(ALL_TASKS)}")
    return GLUE_TASKS[name]


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------


def glue_metrics(task: str, predictions, labels) -> dict[str, float]:
    """The official metrics of a task, with the names of ``evaluate.load("glue", task)``.

    predictions: class ids, or for STS-B the predicted scores; labels: the references.
    """
    spec = get_task(task)
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if predictions.shape[0] != labels.shape[0]:
        raise ValueError(f"{predictions.shape[0]} predictions for {labels.shape[0]} labels")
    if spec.is_regression:
        predictions, labels = predictions.reshape(-1).astype(float), labels.reshape(-1).astype(float)
        return {
            "pearson": float(pearsonr(predictions, labels)[0]),
            "spearmanr": float(spearmanr(predictions, labels)[0]),
        }
    results = {}
    if "matthews_correlation" in spec.metrics:
        results["matthews_correlation"] = float(matthews_corrcoef(labels, predictions))
    if "accuracy" in spec.metrics:
        results["accuracy"] = float(accuracy_score(labels, predictions))
    if "f1" in spec.metrics:
        results["f1"] = float(f1_score(labels, predictions))
    return results


def metrics_function(task: str):
    """A Trainer ``compute_metrics`` for ``task``: arg-max of the logits (or the score for STS-B), then metrics."""
    spec = get_task(task)

    def compute(eval_prediction) -> dict[str, float]:
        logits = eval_prediction.predictions
        logits = logits[0] if isinstance(logits, tuple) else logits
        predictions = logits.reshape(-1) if spec.is_regression else logits.argmax(axis=-1)
        return glue_metrics(task, predictions, eval_prediction.label_ids)

    return compute


def task_score(task: str, metrics: dict[str, dict[str, float]]) -> float | list[float]:
    """The Table C.1 entry of a task, in percent: per-split metrics -> score (MNLI: [matched, mismatched])."""
    spec = get_task(task)
    key = SCORE_METRIC[task]
    scores = [100.0 * metrics[split][key] for split in spec.validation_splits]
    return scores if len(scores) > 1 else scores[0]


def glue_average(scores: dict[str, float | list[float]]) -> float | None:
    """Average of the Table C.1 tasks (MNLI as the mean of m and mm, WNLI left out); None if one is missing."""
    if any(task not in scores for task in TABLE_TASKS):
        return None
    values = [float(np.mean(scores[task])) for task in TABLE_TASKS]
    return float(np.mean(values))


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
# Data
# ---------------------------------------------------------------------------------------------


LOCAL_GLUE_HINT = (
    "Offline, pass local files with --data_dir DIR: DIR/<task>/train.tsv and DIR/<task>/validation.tsv "
    "(MNLI: validation_matched.tsv and validation_mismatched.tsv; .csv, .jsonl, .json and .parquet work too), "
    "with GLUE's columns (e.g. sentence,label for SST-2; premise,hypothesis,label for MNLI)."
)


def _local_split(data_dir: Path, task: str, split: str, cache_dir: str | None):
    from datasets import load_dataset

    folder = data_dir / task
    candidates = [folder / f"{split}{ext}" for ext in DATA_EXTENSIONS]
    found = [path for path in candidates if path.is_file()]
    if not found:
        raise ValueError(f"no {split} file for {task}: looked for {', '.join(str(p) for p in candidates)}")
    path = found[0]
    suffix = path.suffix
    if suffix in (".tsv", ".csv"):
        # QUOTE_NONE: GLUE's TSV files contain unbalanced quotes that are part of the text.
        extra = {"delimiter": "\t", "quoting": 3} if suffix == ".tsv" else {}
        return load_dataset("csv", data_files=str(path), split="train", cache_dir=cache_dir, **extra)
    builder = "json" if suffix in (".json", ".jsonl") else "parquet"
    return load_dataset(builder, data_files=str(path), split="train", cache_dir=cache_dir)


def load_glue_task(
    task: str, *, data_dir: str | Path | None = None, dataset_name: str = GLUE_DATASET, cache_dir: str | None = None
):
    """``{"train": Dataset, <validation split>: Dataset, ...}`` from local files or from the Hub."""
    spec = get_task(task)
    splits = ("train", *spec.validation_splits)
    if data_dir is not None:
        data = {split: _local_split(Path(data_dir), task, split, cache_dir) for split in splits}
    else:
        from datasets import load_dataset

        require_hub(dataset_name, what="dataset", how_to_local=LOCAL_GLUE_HINT)
        raw = load_dataset(dataset_name, task, cache_dir=cache_dir)
        data = {split: raw[split] for split in splits}
    for split, dataset in data.items():
        needed = [key for key in (*spec.sentence_keys, "label") if key is not None]
        missing = [key for key in needed if key not in dataset.column_names]
        if missing:
            raise ValueError(
                f"{task} {split} data lacks the columns {missing} (it has {dataset.column_names}); "
                f"GLUE's {task} needs {needed}"
            )
    return data


def encode_labels(task: str, dataset):
    """Labels as class ids (names such as "entailment" are mapped) or floats for STS-B."""
    from datasets import ClassLabel, Value

    spec = get_task(task)
    ids = {name: index for index, name in enumerate(spec.label_names)}

    def to_id(label):
        if isinstance(label, str):
            label = ids[label] if label in ids else int(label)
        if not 0 <= int(label) < spec.num_labels:
            raise ValueError(f"{task} label {label!r} is outside 0..{spec.num_labels - 1}")
        return int(label)

    if spec.is_regression:
        labels, feature = [float(label) for label in dataset["label"]], Value("float32")
    else:
        labels, feature = [to_id(label) for label in dataset["label"]], ClassLabel(names=list(spec.label_names))
    return dataset.remove_columns("label").add_column("label", labels, feature=feature)


def tokenize_task(task: str, dataset, tokenizer, max_seq_length: int):
    first, second = get_task(task).sentence_keys

    def tokenize(batch):
        texts = (batch[first],) if second is None else (batch[first], batch[second])
        return tokenizer(*texts, truncation=True, max_length=max_seq_length)

    keep = {"label"}
    return dataset.map(tokenize, batched=True, remove_columns=[c for c in dataset.column_names if c not in keep])


# ---------------------------------------------------------------------------------------------
# Fine-tuning
# ---------------------------------------------------------------------------------------------


@dataclass
class GlueArguments:
    model_name_or_path: str = field(metadata={"help": "Pretrained Orchid MLM (folder or Hub name)."})
    task: list[str] | None = field(default=None, metadata={"help": f"Tasks to run: {', '.join(ALL_TASKS)}."})
    all_tasks: bool = field(default=False, metadata={"help": "Run the whole suite (MNLI first)."})
    size: str = field(
        default="base", metadata={"help": "Which Table C.2 column sets the defaults.", "choices": ["base", "large"]}
    )
    data_dir: str | None = field(default=None, metadata={"help": "Local GLUE files: DIR/<task>/<split>.tsv."})
    dataset_name: str = field(default=GLUE_DATASET, metadata={"help": "Hub dataset with GLUE's configurations."})
    tokenizer_name: str | None = field(default=None, metadata={"help": "Defaults to the model's folder."})
    output_dir: str = field(default="outputs/glue")
    max_seq_length: int = field(default=128)
    from_mnli: bool = field(
        default=False, metadata={"help": "Start RTE, MRPC and STS-B from the MNLI fine-tuned checkpoint."}
    )
    mnli_checkpoint: str | None = field(
        default=None, metadata={"help": "The MNLI checkpoint for --from_mnli (default: OUTPUT_DIR/mnli)."}
    )
    optimizer: str | None = field(default=None, metadata={"help": "Override Table C.2.", "choices": list(OPTIMIZERS)})
    learning_rate: float | None = field(default=None, metadata={"help": "Override Table C.2."})
    weight_decay: float | None = field(default=None, metadata={"help": "Override Table C.2."})
    num_train_epochs: float | None = field(default=None, metadata={"help": "Override Table C.2."})
    per_device_train_batch_size: int | None = field(default=None, metadata={"help": "Override the batch size."})
    pooling: str | None = field(default=None, metadata={"help": "Override the pooling.", "choices": ["first", "mean"]})
    per_device_eval_batch_size: int = field(default=64)
    gradient_accumulation_steps: int = field(default=1)
    max_steps: int = field(default=-1, metadata={"help": "Stop after this many steps (for smoke tests)."})
    max_train_samples: int | None = field(default=None)
    max_eval_samples: int | None = field(default=None)
    seed: int = field(default=42)
    logging_steps: int = field(default=50)
    bf16: bool = field(default_factory=bf16_available, metadata={"help": "Default: on where the hardware has it."})
    use_cpu: bool = field(default=False)
    dataloader_num_workers: int = field(default=0)
    disable_tqdm: bool = field(default=False)
    cache_dir: str | None = field(default=None)
    save_model: bool = field(default=True, metadata={"help": "Save each fine-tuned model with its card."})
    push_to_hub: bool = field(default=False, metadata={"help": "Push each fine-tuned model (<hub_model_id>-<task>)."})
    hub_model_id: str | None = field(default=None)

    def tasks(self) -> list[str]:
        if self.all_tasks:
            names = list(ALL_TASKS)
        elif self.task:
            names = [name.lower() for name in self.task]
        else:
            raise ValueError("pass --task NAME [NAME ...] or --all_tasks")
        for name in names:
            get_task(name)
        # MNLI goes first so that RTE, MRPC and STS-B can start from it.
        return sorted(dict.fromkeys(names), key=lambda name: ALL_TASKS.index(name))

    def hyperparameters(self, task: str) -> TaskHyperparameters:
        if self.size not in HYPERPARAMETERS:
            raise ValueError(f"size must be one of {sorted(HYPERPARAMETERS)}, got {self.size!r}")
        base = HYPERPARAMETERS[self.size][task]
        overrides = {
            "optimizer": self.optimizer,
            "learning_rate": self.learning_rate,
            "weight_decay": self.weight_decay,
            "epochs": self.num_train_epochs,
            "batch_size": self.per_device_train_batch_size,
            "pooling": self.pooling,
        }
        values = {**asdict(base), **{k: v for k, v in overrides.items() if v is not None}}
        values["from_mnli"] = base.from_mnli and self.from_mnli
        return TaskHyperparameters(**values)


def training_arguments(args: GlueArguments, task: str, hp: TaskHyperparameters) -> TrainingArguments:
    return TrainingArguments(
        output_dir=str(Path(args.output_dir) / task),
        learning_rate=hp.learning_rate,
        weight_decay=torch_weight_decay(hp.optimizer, hp.weight_decay, hp.learning_rate),
        adam_beta1=ADAM_BETAS[0],
        adam_beta2=ADAM_BETAS[1],
        adam_epsilon=ADAM_EPSILON,
        optim="adamw_torch",
        lr_scheduler_type="linear",
        warmup_steps=WARMUP_FRACTION,
        max_grad_norm=MAX_GRAD_NORM,
        num_train_epochs=hp.epochs,
        max_steps=args.max_steps,
        per_device_train_batch_size=hp.batch_size,
        per_device_eval_batch_size=args.per_device_eval_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        eval_strategy="no",
        save_strategy="no",
        logging_steps=args.logging_steps,
        seed=args.seed,
        bf16=args.bf16,
        use_cpu=args.use_cpu,
        dataloader_num_workers=args.dataloader_num_workers,
        disable_tqdm=args.disable_tqdm,
        report_to="none",
        ddp_find_unused_parameters=False,
    )


def finetune_task(args: GlueArguments, task: str) -> dict:
    """Fine-tune and evaluate one task; returns its metrics, Table C.1 score and hyperparameters."""
    spec = get_task(task)
    hp = args.hyperparameters(task)
    start = args.model_name_or_path
    if hp.from_mnli:
        start = args.mnli_checkpoint or str(Path(args.output_dir) / "mnli")
        if not (Path(start) / "config.json").is_file():
            raise ValueError(f"--from_mnli: {task} starts from the MNLI checkpoint, but {start} holds no model")
    training_args = training_arguments(args, task, hp)
    tokenizer = load_tokenizer(args.tokenizer_name or start, how_to_local=LOCAL_GLUE_HINT)

    with training_args.main_process_first(desc=f"{task}: loading and tokenizing"):
        data = load_glue_task(task, data_dir=args.data_dir, dataset_name=args.dataset_name, cache_dir=args.cache_dir)
        data = {split: encode_labels(task, dataset) for split, dataset in data.items()}
        if args.max_train_samples is not None:
            data["train"] = data["train"].select(range(min(args.max_train_samples, len(data["train"]))))
        if args.max_eval_samples is not None:
            for split in spec.validation_splits:
                data[split] = data[split].select(range(min(args.max_eval_samples, len(data[split]))))
        data = {split: tokenize_task(task, dataset, tokenizer, args.max_seq_length) for split, dataset in data.items()}

    set_seed(args.seed)
    label_kwargs = {}
    if not spec.is_regression:
        label_kwargs = dict(
            id2label=dict(enumerate(spec.label_names)),
            label2id={name: index for index, name in enumerate(spec.label_names)},
        )
    model = from_pretrained(
        AutoModelForSequenceClassification,
        start,
        what="model",
        how_to_local="Pass the folder of a pretrained model (see scripts/pretrain_mlm.py).",
        num_labels=spec.num_labels,
        problem_type="regression" if spec.is_regression else "single_label_classification",
        classifier_pooling=hp.pooling,
        # A new classifier replaces the MLM head or MNLI's 3-way classifier.
        ignore_mismatched_sizes=True,
        **label_kwargs,
    )
    max_positions = getattr(model.config, "max_position_embeddings", None)
    if max_positions is not None and args.max_seq_length > max_positions:
        raise ValueError(
            f"max_seq_length={args.max_seq_length} exceeds the model's max_position_embeddings={max_positions}"
        )

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=data["train"],
        data_collator=DataCollatorWithPadding(tokenizer),
        processing_class=tokenizer,
        compute_metrics=metrics_function(task),
    )
    train_metrics = trainer.train().metrics
    metrics = {}
    for split in spec.validation_splits:
        evaluated = trainer.evaluate(eval_dataset=data[split], metric_key_prefix=split)
        metrics[split] = {name: evaluated[f"{split}_{name}"] for name in spec.metrics}
        metrics[split]["loss"] = evaluated[f"{split}_loss"]
    result = {
        "task": task,
        "metrics": metrics,
        "score": task_score(task, metrics),
        "hyperparameters": asdict(hp),
        "initialized_from": start,
        "train_runtime": train_metrics.get("train_runtime"),
        "epochs_done": train_metrics.get("epoch"),
        "world_size": training_args.world_size,
    }
    if args.save_model:
        trainer.save_model()
        if trainer.is_world_process_zero():
            _finish_task_folder(args, task, result, training_args)
    return result


def _finish_task_folder(args: GlueArguments, task: str, result: dict, training_args: TrainingArguments) -> None:
    from .cards import write_model_card

    folder = training_args.output_dir
    write_json(Path(folder) / "results.json", result)
    from_hub = args.data_dir is None
    dataset = args.dataset_name if from_hub else f"local {task} files"
    results = [
        dict(
            task_type="text-classification",
            task_name=f"GLUE {task.upper()}",
            dataset_type=args.dataset_name if from_hub else task,
            dataset_name=dataset,
            dataset_config=task if from_hub else None,
            dataset_split=split,
            metric_type=name,
            metric_value=round(100.0 * value, 2),
        )
        for split, values in result["metrics"].items()
        for name, value in values.items()
        if name != "loss"
    ]
    hp = result["hyperparameters"]
    repo_id = f"{args.hub_model_id}-{task}" if args.hub_model_id else None
    write_model_card(
        folder,
        task="text-classification",
        model_name=repo_id or f"{Path(args.model_name_or_path).name}-{task}",
        repo_id=repo_id,
        datasets=[args.dataset_name] if from_hub else [],
        results=results,
        base_model=result["initialized_from"] if not Path(result["initialized_from"]).exists() else None,
        training={
            "task": f"GLUE {task.upper()}",
            "initialized from": result["initialized_from"],
            "optimizer": hp["optimizer"],
            "learning rate": hp["learning_rate"],
            "weight decay": hp["weight_decay"],
            "epochs": hp["epochs"],
            "batch size": hp["batch_size"],
            "pooling": hp["pooling"],
            "sequence length": args.max_seq_length,
        },
        example_input=None,
    )
    if args.push_to_hub:
        from .hub import push_to_hub

        push_to_hub(folder, repo_id, commit_message=f"Orchid fine-tuned on GLUE {task}")


def run_glue(args: GlueArguments) -> dict:
    """Fine-tune every requested task, then write ``glue_results.json`` and ``glue_results.md`` (Table C.1
    layout) in the output folder, merged with the results of earlier runs into the same folder."""
    tasks = args.tasks()
    if args.push_to_hub:
        if not args.hub_model_id:
            raise ValueError("--push_to_hub needs --hub_model_id (each task goes to <hub_model_id>-<task>)")
        if hub_offline():
            raise HubUnavailableError("--push_to_hub: HF_HUB_OFFLINE is set, so the Hub cannot be reached")
    if args.max_seq_length < 2:
        raise ValueError(f"max_seq_length must be >= 2, got {args.max_seq_length}")
    output = Path(args.output_dir)
    summary_path = output / "glue_results.json"
    summary = {"model": args.model_name_or_path, "size": args.size, "tasks": {}}
    if summary_path.is_file():
        previous = json.loads(summary_path.read_text())
        if previous.get("model") == args.model_name_or_path:
            summary["tasks"] = previous.get("tasks", {})
    for task in tasks:
        summary["tasks"][task] = finetune_task(args, task)
        if PartialState().is_main_process:
            _write_summary(summary, output)
    return summary


def _write_summary(summary: dict, output: Path) -> None:
    scores = {task: result["score"] for task, result in summary["tasks"].items()}
    summary["glue_average"] = glue_average(scores)
    model_name = Path(summary["model"]).name
    table = results_markdown(scores, model_name)
    summary["table"] = table
    write_json(output / "glue_results.json", summary)
    (output / "glue_results.md").write_text(
        f"# GLUE results: {model_name} ({summary['size']} hyperparameters)\n\n{table}\n"
        "Scores in percent on the validation sets: Matthews correlation (CoLA), F1 (MRPC, QQP), Spearman "
        "correlation (STS-B), accuracy elsewhere (MNLI: matched / mismatched). The average is over the "
        "eight tasks of Table C.1, MNLI counted as the mean of m and mm, WNLI left out.\n"
    )


def build_parser() -> HfArgumentParser:
    return HfArgumentParser(GlueArguments)


def main(argv: list[str] | None = None) -> dict:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    (args,) = build_parser().parse_args_into_dataclasses(args=argv)
    return run_glue(args)


__all__ = [
    "ALL_TASKS",
    "GLUE_TASKS",
    "HYPERPARAMETERS",
    "TABLE_TASKS",
    "GlueArguments",
    "GlueTask",
    "TaskHyperparameters",
    "finetune_task",
    "glue_average",
    "glue_metrics",
    "load_glue_task",
    "main",
    "results_markdown",
    "run_glue",
    "task_score",
]
