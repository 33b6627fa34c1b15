"""The recipes' command line: ``HfArgumentParser`` over ``TrainingArguments`` and the recipe's own dataclasses, a
JSON/YAML config file, the recipe's values as defaults, and which values the user gave.

The command line follows transformers' examples (``run_mlm.py``, ``run_glue.py``, ``run_image_classification.py``):
the same flag names, ``TrainingArguments`` in full, and a single ``.json``/``.yaml`` argument read as a config file.
The values of the selected recipe (:mod:`orchid_hf.recipes`) are the defaults; flags override them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import HfArgumentParser, TrainingArguments

from .recipes import Recipe, get_recipe

CONFIG_FILE_SUFFIXES = (".json", ".yaml", ".yml")


# ---------------------------------------------------------------------------------------------
# Arguments shared by the recipes
# ---------------------------------------------------------------------------------------------


@dataclass
class ModelArguments:
    """Which model to train: weights to start from, a config, or a model type built from scratch."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Start from these weights (a folder or Hub id, Orchid or any other model). Leave unset to "
                  "train a new model (--model_type, --config_name)."},
    )  # fmt: skip
    model_type: str | None = field(
        default=None,
        metadata={"help": "Train a new model of this type: orchid (default: the recipe's preset), bert, vit, or any "
                  "transformers model type. --config_overrides changes its config."},
    )  # fmt: skip
    config_name: str | None = field(
        default=None,
        metadata={"help": "Config of a new model, or of --model_name_or_path if not its own: an Orchid preset "
                  "(orchid-bert-base, orchid-vit-cifar-s, ...), a config.json, a folder or a Hub id."},
    )  # fmt: skip
    config_overrides: str | None = field(
        default=None,
        metadata={"help": "Config fields of a model trained from scratch, e.g. 'hidden_size=64,num_hidden_layers=2'; "
                  "not with --config_name or --model_name_or_path."},
    )  # fmt: skip
    cache_dir: str | None = field(default=None, metadata={"help": "Where Hub downloads and datasets caches go."})
    model_revision: str = field(default="main", metadata={"help": "Branch, tag or commit of a Hub model."})
    token: str | None = field(default=None, metadata={"help": "Hugging Face token for private models and datasets."})
    trust_remote_code: bool = field(
        default=False, metadata={"help": "Allow model code from the Hub (not needed for Orchid with orchid_hf)."}
    )
    ignore_mismatched_sizes: bool = field(
        default=False, metadata={"help": "Load a checkpoint whose head has another size (the head is re-initialised)."}
    )

    def __post_init__(self):
        if self.config_overrides and (self.config_name or self.model_name_or_path):
            given = "--config_name" if self.config_name else "--model_name_or_path"
            raise ValueError(
                f"--config_overrides can't be used in combination with --config_name or --model_name_or_path: it "
                f"changes the config of a model trained from scratch (--model_type); got --config_overrides "
                f"{self.config_overrides!r} with {given} {self.config_name or self.model_name_or_path!r}"
            )

    def hub_kwargs(self) -> dict[str, Any]:
        return dict(
            cache_dir=self.cache_dir,
            revision=self.model_revision,
            token=self.token,
            trust_remote_code=self.trust_remote_code,
        )


@dataclass
class RecipeArguments:
    """The recipe, and the optimizer settings ``TrainingArguments`` has no field for."""

    recipe: str | None = field(
        default=None, metadata={"help": "Named recipe whose values are the defaults (see orchid_hf.recipes)."}
    )
    decoupled_weight_decay: float | None = field(
        default=None,
        metadata={"help": "The paper's decoupled weight decay (D-AdamW, Composer's DecoupledAdamW: weights shrink by "
                  "lr_t / learning_rate x this per step), converted to --weight_decay = this / learning_rate. Not "
                  "with --weight_decay, which keeps Trainer's (torch AdamW's) meaning."},
    )  # fmt: skip
    filter_param_group: bool = field(
        default=True,
        metadata={"help": "Give the implicit long-convolution filters of Orchid models their own learning rate and "
                  "weight decay (--filter_learning_rate, --filter_[decoupled_]weight_decay)."},
    )  # fmt: skip
    filter_learning_rate: float | None = field(
        default=None, metadata={"help": "Peak learning rate of the implicit filters (Orchid models only)."}
    )
    filter_weight_decay: float | None = field(
        default=None, metadata={"help": "Weight decay of the implicit filters, in torch AdamW's meaning."}
    )
    filter_decoupled_weight_decay: float | None = field(
        default=None,
        metadata={"help": "Weight decay of the implicit filters in the decoupled meaning, converted with "
                  "--filter_learning_rate."},
    )  # fmt: skip
    min_lr_ratio: float | None = field(
        default=None,
        metadata={"help": "With --lr_scheduler_type polynomial: end the decay at this fraction of --learning_rate "
                  "(sets lr_scheduler_kwargs lr_end; not with an lr_end of your own)."},
    )  # fmt: skip
    threads: int | None = field(default=None, metadata={"help": "torch.set_num_threads for this run."})


# ---------------------------------------------------------------------------------------------
# Parsing: HfArgumentParser + recipe defaults + which values the user gave
# ---------------------------------------------------------------------------------------------


@dataclass
class ParsedArguments:
    """A recipe's parsed command line: each dataclass by its role, the recipe, the fields the user set explicitly and
    the arguments as given."""

    model_args: ModelArguments
    data_args: Any
    recipe_args: RecipeArguments
    training_args: TrainingArguments
    recipe: Recipe
    explicit: frozenset[str]
    argv: tuple[str, ...]
    augmentation_args: Any = None  # the image recipe's augmentations


def recipe_dataclasses(model: type, data: type, augmentation: type | None = None) -> dict[str, type]:
    """The dataclasses of a recipe's command line, by the field of :class:`ParsedArguments` that holds each, in the
    order ``--help`` lists them: the model's, the data's, the augmentations' (images), the recipe's and
    ``TrainingArguments``."""
    classes = {"model_args": model, "data_args": data}
    if augmentation is not None:
        classes["augmentation_args"] = augmentation
    return {**classes, "recipe_args": RecipeArguments, "training_args": TrainingArguments}


def _read_config_file(path: str) -> dict[str, Any]:
    text = Path(path).read_text(encoding="utf-8")
    if path.endswith(".json"):
        values = json.loads(text)
    else:
        import yaml  # a dependency of transformers

        values = yaml.safe_load(text)
    if not isinstance(values, dict):
        raise ValueError(f"config file {path} must hold a mapping of argument names to values, got {type(values)}")
    return values


def _explicit_fields(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """The dataclass fields set by ``--flag`` tokens in ``argv`` (abbreviations resolved as argparse does)."""
    options = parser._option_string_actions
    explicit = set()
    for token in argv:
        if not token.startswith("--"):
            continue
        name = token.split("=", 1)[0]
        if name in options:
            explicit.add(options[name].dest)
            continue
        dests = {options[option].dest for option in options if option.startswith(name)}
        if len(dests) == 1:
            explicit.update(dests)
    explicit.discard("help")
    return explicit


def recipe_defaults(recipe: Recipe, task: str | None = None) -> dict[str, Any]:
    """The recipe's argument defaults with the ``bf16="auto"`` marker resolved for this machine."""
    values = recipe.defaults(task)
    if values.get("bf16") == "auto":
        values["bf16"] = bf16_available()
    return values


def parse_recipe_arguments(
    dataclass_types: dict[str, type],
    argv: Sequence[str] | None,
    *,
    kind: str,
    default_recipe: str | Callable[[dict[str, Any]], str],
    task: str | None = None,
    description: str | None = None,
) -> ParsedArguments:
    """Parse a recipe's command line like transformers' examples, with the recipe's values as defaults.

    dataclass_types: the dataclasses by role (:func:`recipe_dataclasses`). argv: the arguments (``sys.argv[1:]``
    when None); a single ``.json``/``.yaml`` argument is a config file whose keys are the flag names.
    default_recipe: the recipe used when ``--recipe`` is not given, or a function of the values given (names to
    values) that picks one. task: also apply the recipe's values for this task."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = HfArgumentParser(list(dataclass_types.values()), description=description)
    file_values = None
    if len(argv) == 1 and argv[0].endswith(CONFIG_FILE_SUFFIXES) and not argv[0].startswith("-"):
        file_values = _read_config_file(argv[0])
        explicit = set(file_values)
        given = dict(file_values)
    else:
        explicit = _explicit_fields(parser, argv)
        # The values given, to pick the recipe (--help waits for the second pass, which shows the recipe's values).
        namespace, _ = parser.parse_known_args([arg for arg in argv if arg not in ("-h", "--help")])
        given = {name: getattr(namespace, name) for name in explicit if hasattr(namespace, name)}
    name = given.get("recipe") or (default_recipe(given) if callable(default_recipe) else default_recipe)
    recipe = get_recipe(name, kind)
    defaults = recipe_defaults(recipe, task if task in recipe.tasks else None)
    defaults["recipe"] = recipe.name
    if file_values is not None:
        values = parser.parse_dict({**defaults, **file_values})
    else:
        parser.set_defaults(**defaults)
        values = parser.parse_args_into_dataclasses(args=argv)
    return ParsedArguments(
        **dict(zip(dataclass_types, values)), recipe=recipe, explicit=frozenset(explicit), argv=tuple(argv)
    )


def bf16_available() -> bool:
    """bf16 mixed precision is the default where the hardware supports it (the paper trained in bf16)."""
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


__all__ = [
    "CONFIG_FILE_SUFFIXES",
    "ModelArguments",
    "ParsedArguments",
    "RecipeArguments",
    "bf16_available",
    "parse_recipe_arguments",
    "recipe_dataclasses",
    "recipe_defaults",
]
