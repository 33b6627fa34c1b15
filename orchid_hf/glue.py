"""GLUE fine-tuning (App. C.3, Tables C.1 and C.2) and classification of your own text, as transformers'
``run_glue.py`` does it: ``scripts/finetune_glue.py`` is the command line.

What the paper adds to run_glue: Table C.2's per-task hyperparameters as the defaults (``--recipe
orchid-bert-base-glue`` or ``orchid-bert-large-glue``), several tasks in one run (``--task_name mnli rte`` or
``all``), RTE, MRPC and STS-B started from the MNLI model (``--from_mnli``), mean pooling for QNLI-base, and the
results laid out as Table C.1. ``--do_predict`` writes GLUE's submission files. Metrics come from the metric modules
in ``orchid_hf.metrics`` (``evaluate.load`` of a local path; the Hub's ``glue`` metric gives the same numbers).

This module holds the command line and the run; the task registry and Table C.1 are in :mod:`orchid_hf.glue_tasks`,
the data, labels, tokenisation and metrics in :mod:`orchid_hf.glue_data` (their public names are importable from
here too).
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

from .arguments import ModelArguments, ParsedArguments, parse_recipe_arguments, recipe_dataclasses  # noqa: E402
from .glue_data import (  # noqa: E402
    GLUE_DATASET,
    LOCAL_GLUE_HINT,
    GlueDataArguments,
    TaskData,
    encode_labels,
    load_glue_task,
    load_own_data,
    load_task_data,
    metrics_function,
    tokenize_splits,
)
from .glue_tasks import (  # noqa: E402
    ALL_TASKS,
    AX_TASK,
    FROM_MNLI_TASKS,
    GLUE_TASKS,
    TABLE_TASKS,
    GlueTask,
    get_task,
    glue_average,
    results_markdown,
    task_score,
)
from .hub import from_pretrained  # noqa: E402
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

TIMING_KEYS = ("runtime", "per_second", "preparation_time", "samples")


# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------


@dataclass
class TextModelArguments(ModelArguments):
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Tokenizer name or folder, if not the one saved with --model_name_or_path."}
    )


DATACLASSES = recipe_dataclasses(TextModelArguments, GlueDataArguments)


def _default_recipe(given: dict) -> str:
    """Own data (files, or a Hub dataset, without --task_name) gets the classification recipe; GLUE the base one."""
    own_files = any(given.get(f"{split}_file") for split in ("train", "validation", "test"))
    own_data = not given.get("task_name") and (own_files or given.get("dataset_name"))
    return "orchid-bert-classification" if own_data else "orchid-bert-base-glue"


def parse_args(argv: list[str] | None = None, task: str | None = None) -> ParsedArguments:
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
# One run
# ---------------------------------------------------------------------------------------------


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


def run_task(parsed: ParsedArguments, task: str | None, root: Path) -> dict:
    """Fine-tune, evaluate and predict one task (or own data) as run_glue does; returns its results."""
    model_args, data_args = parsed.model_args, parsed.data_args
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
    model_args, data_args, training_args = first.model_args, first.data_args, first.training_args
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
