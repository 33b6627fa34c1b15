"""How a recipe runs, the same for all three: the start (stages, optimizer settings, threads, seed), logging,
training with checkpoints, metric files, ``results.json``, the model card and the push, and the command line's
one-line errors.

A recipe's driver (``orchid_hf.glue.run_task``, ``orchid_hf.pretraining.main``,
``orchid_hf.vision.train.train_image_classifier``) is :func:`start_run`, its own data, model and
:class:`~orchid_hf.trainer.RecipeTrainer`, :func:`train_and_save`, its own evaluation, and :func:`finish_run`.
"""

from __future__ import annotations

import copy
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import TrainingArguments, set_seed
from transformers.trainer_utils import get_last_checkpoint

from .arguments import ParsedArguments
from .hub import HubUnavailableError, hub_offline, is_local_path
from .optimization import resolve_optimizer

if TYPE_CHECKING:
    from transformers import Trainer
    from transformers.trainer_utils import TrainOutput

STAGES = ("do_train", "do_eval", "do_predict")


def start_run(parsed: ParsedArguments, default_stages: Sequence[str] = ("do_train", "do_eval")):
    """The start of every run: a copy of the parsed ``TrainingArguments`` (the parsed values can build another run
    unchanged) with the stages resolved (:func:`resolve_stages`) and the optimizer settings applied
    (:func:`orchid_hf.optimization.resolve_optimizer`); an offline ``--push_to_hub`` stopped; ``--threads`` and the
    seed set. Returns ``(training_args, optimizer plan)``."""
    training_args = copy.copy(parsed.training_args)
    recipe_args = parsed.recipe_args
    resolve_stages(training_args, parsed.explicit, default_stages)
    plan = resolve_optimizer(training_args, recipe_args, parsed.explicit)
    check_push(training_args)
    if recipe_args.threads:
        torch.set_num_threads(recipe_args.threads)
    set_seed(training_args.seed)
    return training_args, plan


def resolve_stages(training_args: TrainingArguments, explicit: frozenset[str], default: Sequence[str]) -> None:
    """``--do_train``/``--do_eval``/``--do_predict`` as in the examples: with any of them given, exactly those run;
    with none, the recipe runs ``default``."""
    if not explicit & set(STAGES):
        for stage in STAGES:
            setattr(training_args, stage, stage in default)


def resolve_checkpoint(value: str | None, output_dir: str) -> str | None:
    """``--resume_from_checkpoint``: a checkpoint folder, or ``last``/``True`` for the newest one in ``output_dir``."""
    if value in (None, "", "False", "false"):
        return None
    if value in ("last", "True", "true"):
        last = get_last_checkpoint(output_dir) if Path(output_dir).is_dir() else None
        if last is None:
            raise ValueError(f"--resume_from_checkpoint {value}: no checkpoint-* folder in {output_dir}")
        return last
    if not Path(value).is_dir():
        raise ValueError(f"--resume_from_checkpoint {value} is not a folder")
    return value


def check_push(training_args: TrainingArguments) -> None:
    """``--push_to_hub`` while offline stops before any work (Trainer would fail when it creates the repository)."""
    if training_args.push_to_hub and hub_offline():
        raise HubUnavailableError(
            f"--push_to_hub {training_args.hub_model_id or Path(training_args.output_dir).name}: HF_HUB_OFFLINE is "
            "set, so the Hub cannot be reached; drop --push_to_hub to train offline and push the output folder later "
            "with orchid_hf.hub.push_to_hub"
        )


def setup_logging(training_args: TrainingArguments) -> None:
    """Log lines as the examples print them. ``--log_level`` sets transformers' and datasets' verbosity; this
    package's own messages (what the recipe resolved) are shown on the main process unless it is ``warning`` or
    above."""
    import transformers

    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    if training_args.log_level == "passive":
        logging.getLogger("orchid_hf").setLevel(logging.INFO if training_args.should_log else logging.WARNING)
        return
    level = training_args.get_process_log_level()
    logging.getLogger("orchid_hf").setLevel(level)
    transformers.utils.logging.set_verbosity(level)
    try:
        import datasets

        datasets.utils.logging.set_verbosity(level)
    except ImportError:
        pass


def save_metrics(trainer: Trainer, split: str, metrics: dict, combined: bool = True) -> None:
    """``trainer.log_metrics`` and ``save_metrics`` (``<split>_results.json`` and ``all_results.json``)."""
    trainer.log_metrics(split, metrics)
    trainer.save_metrics(split, metrics, combined=combined)


def train_and_save(trainer: Trainer, num_samples: int | None = None) -> tuple[TrainOutput, dict]:
    """Train (resuming from ``--resume_from_checkpoint``), then save the model, the train metrics (with
    ``train_samples``) and the trainer state, as the examples do; returns Trainer's output and the metrics."""
    args = trainer.args
    output = trainer.train(resume_from_checkpoint=resolve_checkpoint(args.resume_from_checkpoint, args.output_dir))
    metrics = dict(output.metrics)
    if num_samples is not None:
        metrics["train_samples"] = num_samples
    trainer.save_model()
    save_metrics(trainer, "train", metrics)
    trainer.save_state()
    return output, metrics


def finish_run(trainer: Trainer, results: dict, commit_message: str) -> None:
    """The end of every run: ``results.json`` in the output folder and, after training, the model card and, with
    ``--push_to_hub``, the push through Trainer (which follows ``--hub_strategy``, ``--hub_model_id``,
    ``--hub_private_repo``, ...). An Orchid folder is first checked for everything a loadable repository needs
    (:func:`orchid_hf.hub.upload_file_list`)."""
    if trainer.is_world_process_zero():
        write_json(Path(trainer.args.output_dir) / "results.json", results)
    if not trainer.args.do_train:
        return
    trainer.create_model_card()
    if not trainer.args.push_to_hub:
        return
    if trainer.is_world_process_zero() and getattr(trainer.model.config, "model_type", None) == "orchid":
        from .hub import upload_file_list

        upload_file_list(trainer.args.output_dir)
    trainer.push_to_hub(commit_message=commit_message)


def write_json(path: str | Path, data) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def card_base_model(name: str | None) -> str | None:
    """A model card's ``base_model`` must be a Hub id, not a local folder."""
    return name if name and not is_local_path(name) else None


def run_cli(main: Callable[[list[str] | None], object]) -> None:
    """Run a script's ``main``; bad input, a Hub name while offline and a missing extra end with a one-line
    message naming what to change, not a trace."""
    try:
        main(None)
    except HubUnavailableError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except (ValueError, ImportError, ConnectionError) as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(1) from None


__all__ = [
    "STAGES",
    "card_base_model",
    "check_push",
    "finish_run",
    "resolve_checkpoint",
    "resolve_stages",
    "run_cli",
    "save_metrics",
    "setup_logging",
    "start_run",
    "train_and_save",
    "write_json",
]
