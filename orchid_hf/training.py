"""What the three recipes share: their command line (``HfArgumentParser`` over ``TrainingArguments`` and the recipe's
own dataclasses, JSON/YAML config files, recipe defaults), the model they train (Orchid or any Auto class), the
paper's decoupled weight decay, the implicit filters' parameter group, and how results are written.

The command line follows transformers' examples (``run_mlm.py``, ``run_glue.py``, ``run_image_classification.py``):
the same flag names, ``TrainingArguments`` in full, and a single ``.json``/``.yaml`` argument read as a config file.
The values of the selected recipe (:mod:`orchid_hf.recipes`) are the defaults; flags override them.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .extras import require_extra

require_extra("accelerate", "train")  # the Trainer needs it

import torch  # noqa: E402
from transformers import HfArgumentParser, Trainer, TrainerCallback, TrainingArguments  # noqa: E402
from transformers.trainer_utils import get_last_checkpoint  # noqa: E402

from .hub import HubUnavailableError, from_pretrained, hub_offline, is_local_path  # noqa: E402
from .recipes import EXCLUSIVE_DECAYS, Recipe, get_recipe  # noqa: E402

logger = logging.getLogger(__name__)

CONFIG_FILE_SUFFIXES = (".json", ".yaml", ".yml")
# Parameters whose names contain these belong to the network of an Orchid operator's implicit (static or residual)
# long filter: the layers to which M2-BERT gives an optimizer group of their own (not the filter's skip term D).
FILTER_PARAMETER_MARKERS = (".static_filter.ffn.", ".residual_filter.ffn.")
STAGES = ("do_train", "do_eval", "do_predict")


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
    """The parsed dataclasses (in the order given), the recipe, and the fields the user set explicitly."""

    values: tuple
    recipe: Recipe
    explicit: frozenset[str]
    argv: tuple[str, ...]

    def __iter__(self):
        return iter(self.values)


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
    dataclass_types: Sequence[type],
    argv: Sequence[str] | None,
    *,
    kind: str,
    default_recipe: str | Callable[[dict[str, Any]], str],
    task: str | None = None,
    description: str | None = None,
) -> ParsedArguments:
    """Parse a recipe's command line like transformers' examples, with the recipe's values as defaults.

    argv: the arguments (``sys.argv[1:]`` when None); a single ``.json``/``.yaml`` argument is a config file whose
    keys are the flag names. default_recipe: the recipe used when ``--recipe`` is not given, or a function of the
    values given (names to values) that picks one. task: also apply the recipe's values for this task.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = HfArgumentParser(dataclass_types, description=description)
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
    return ParsedArguments(tuple(values), recipe, frozenset(explicit), tuple(argv))


# ---------------------------------------------------------------------------------------------
# Weight decay and the learning-rate schedule
# ---------------------------------------------------------------------------------------------


def decoupled_to_torch_weight_decay(decoupled_weight_decay: float, learning_rate: float) -> float:
    """The ``weight_decay`` of torch's AdamW that applies a decoupled weight decay.

    torch's AdamW shrinks the weights by ``lr_t * weight_decay`` per step. The paper's "D-AdamW" is Composer's
    ``DecoupledAdamW`` (the optimizer of M2-BERT, whose recipe the paper follows), which shrinks them by
    ``(lr_t / lr_peak) * weight_decay``: the decay follows the schedule but not the size of the learning rate.
    The two agree exactly when torch gets ``weight_decay / lr_peak``.
    """
    if decoupled_weight_decay < 0:
        raise ValueError(f"decoupled_weight_decay must be >= 0, got {decoupled_weight_decay}")
    if learning_rate <= 0:
        raise ValueError(
            f"a decoupled weight decay needs learning_rate > 0 to be converted, got learning_rate={learning_rate}"
        )
    return decoupled_weight_decay / learning_rate


def resolve_weight_decay(
    weight_decay: float | None,
    decoupled_weight_decay: float | None,
    learning_rate: float,
    explicit: frozenset[str] | set[str],
    names: tuple[str, str] = ("weight_decay", "decoupled_weight_decay"),
) -> tuple[float | None, float | None]:
    """The one place where a weight decay is chosen: ``(torch AdamW weight decay, decoupled value or None)``.

    ``weight_decay`` keeps Trainer's meaning; ``decoupled_weight_decay`` is converted. A value the user gave beats a
    recipe default of the other one; the user giving both is an error.
    """
    torch_name, decoupled_name = names
    if torch_name in explicit and decoupled_name in explicit and decoupled_weight_decay is not None:
        raise ValueError(
            f"pass --{torch_name} (torch AdamW's meaning, as in Trainer) or --{decoupled_name} (the paper's decoupled "
            f"value, converted to {torch_name} = {decoupled_name} / learning rate), not both: got "
            f"{torch_name}={weight_decay} and {decoupled_name}={decoupled_weight_decay}"
        )
    if torch_name in explicit or decoupled_weight_decay is None:
        return weight_decay, None
    return decoupled_to_torch_weight_decay(decoupled_weight_decay, learning_rate), decoupled_weight_decay


@dataclass(frozen=True)
class OptimizerPlan:
    """The optimizer settings of a run once recipe defaults and flags are resolved (for logs and cards)."""

    weight_decay: float  # torch AdamW's
    decoupled_weight_decay: float | None
    filter_learning_rate: float | None  # None: no filter group
    filter_weight_decay: float | None  # torch AdamW's
    filter_decoupled_weight_decay: float | None

    def describe(self) -> dict[str, Any]:
        described = {"weight decay": _describe_decay(self.weight_decay, self.decoupled_weight_decay)}
        if self.filter_learning_rate is not None:
            described["implicit filters"] = (
                f"lr {self.filter_learning_rate:g}, weight decay "
                f"{_describe_decay(self.filter_weight_decay, self.filter_decoupled_weight_decay)}"
            )
        return described


def plan_for_model(plan: OptimizerPlan, model: torch.nn.Module) -> OptimizerPlan:
    """``plan`` without its filter group where the model has no implicit filters (a BERT or ViT baseline)."""
    if plan.filter_learning_rate is None or filter_parameter_names(model):
        return plan
    return OptimizerPlan(plan.weight_decay, plan.decoupled_weight_decay, None, None, None)


def _describe_decay(torch_value: float | None, decoupled: float | None) -> str:
    if decoupled is None:
        return f"{torch_value:g}"
    return f"{decoupled:g} decoupled (torch AdamW weight_decay={torch_value:g})"


def resolve_optimizer(
    training_args: TrainingArguments, recipe_args: RecipeArguments, explicit: frozenset[str]
) -> OptimizerPlan:
    """Apply the weight-decay rule and the schedule's end point to ``training_args`` (in place), and return the
    resolved settings, the filter group's included."""
    lr = training_args.learning_rate
    weight_decay, decoupled = resolve_weight_decay(
        training_args.weight_decay, recipe_args.decoupled_weight_decay, lr, explicit
    )
    training_args.weight_decay = weight_decay
    if decoupled is not None:
        logger.info("decoupled weight decay %g at peak lr %g -> torch AdamW weight_decay=%g", decoupled, lr,
                    weight_decay)  # fmt: skip

    filter_lr = filter_decay = filter_decoupled = None
    if recipe_args.filter_param_group and (
        recipe_args.filter_learning_rate is not None
        or recipe_args.filter_weight_decay is not None
        or recipe_args.filter_decoupled_weight_decay is not None
    ):
        filter_lr = recipe_args.filter_learning_rate if recipe_args.filter_learning_rate is not None else lr
        if filter_lr < 0:
            raise ValueError(f"filter_learning_rate must be >= 0, got {filter_lr}")
        filter_decay, filter_decoupled = resolve_weight_decay(
            recipe_args.filter_weight_decay,
            recipe_args.filter_decoupled_weight_decay,
            filter_lr,
            explicit,
            names=EXCLUSIVE_DECAYS[1],
        )
        if filter_decay is None:
            filter_decay = weight_decay

    _apply_min_lr_ratio(training_args, recipe_args, explicit)
    return OptimizerPlan(weight_decay, decoupled, filter_lr, filter_decay, filter_decoupled)


def _apply_min_lr_ratio(training_args: TrainingArguments, recipe_args: RecipeArguments, explicit) -> None:
    ratio = recipe_args.min_lr_ratio
    if ratio is None:
        return
    kwargs = dict(training_args.lr_scheduler_kwargs or {})
    if "lr_end" in kwargs:
        if "min_lr_ratio" in explicit:
            raise ValueError(
                f"pass --min_lr_ratio or an lr_end in --lr_scheduler_kwargs, not both: got min_lr_ratio={ratio} and "
                f"lr_end={kwargs['lr_end']}"
            )
        return
    if str(getattr(training_args.lr_scheduler_type, "value", training_args.lr_scheduler_type)) != "polynomial":
        if "min_lr_ratio" in explicit:
            raise ValueError(
                f"--min_lr_ratio {ratio} needs --lr_scheduler_type polynomial, got {training_args.lr_scheduler_type}"
            )
        return
    if not 0 <= ratio < 1:
        raise ValueError(f"min_lr_ratio must be in [0, 1), got {ratio}")
    # Linear decay to the ratio: transformers' polynomial schedule with power 1, which scales every parameter
    # group by the same factor (the filter group too).
    training_args.lr_scheduler_kwargs = {"power": 1.0, **kwargs, "lr_end": ratio * training_args.learning_rate}


def describe_schedule(training_args: TrainingArguments) -> str:
    """The learning-rate schedule in words, for logs and model cards."""
    kind = getattr(training_args.lr_scheduler_type, "value", training_args.lr_scheduler_type)
    warmup = training_args.warmup_steps
    warmup = f"{warmup:.0%} of the steps" if 0 < warmup < 1 else f"{int(warmup)} steps"
    then = {"linear": "linear decay to 0", "cosine": "cosine decay to 0", "constant_with_warmup": "constant"}
    text = f"peak {training_args.learning_rate:g}, linear warmup over {warmup}, then {then.get(kind, kind)}"
    kwargs = training_args.lr_scheduler_kwargs or {}
    if kind == "polynomial" and kwargs.get("power", 1.0) == 1.0:
        text = text.replace("then polynomial", f"then linear decay to {kwargs.get('lr_end', 1e-7):g}")
    elif kwargs:
        text += f" {kwargs}"
    return text


def bf16_available() -> bool:
    """bf16 mixed precision is the default where the hardware supports it (the paper trained in bf16)."""
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


# ---------------------------------------------------------------------------------------------
# Trainer with the implicit filters' parameter group and our model cards
# ---------------------------------------------------------------------------------------------


def filter_parameter_names(model: torch.nn.Module) -> list[str]:
    """Names of the trainable parameters of the Orchid operators' implicit filters (empty for other models)."""
    return [
        name
        for name, parameter in model.named_parameters()
        if parameter.requires_grad and any(marker in f".{name}" for marker in FILTER_PARAMETER_MARKERS)
    ]


class TrainingClock(TrainerCallback):
    """Seconds of training, evaluation excluded (``RecipeTrainer`` adds them to every log entry as
    ``train_seconds``, so learning curves can be drawn against wall time as well as steps). A run resumed from a
    checkpoint continues from the time its log history ends with."""

    def __init__(self):
        self.start: float | None = None
        self.evaluation_seconds = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        earlier = [entry["train_seconds"] for entry in state.log_history if "train_seconds" in entry]
        # Starting earlier[-1] seconds in the past continues the resumed run's clock.
        self.start, self.evaluation_seconds = time.perf_counter() - (earlier[-1] if earlier else 0.0), 0.0

    def add_to(self, logs: dict) -> None:
        if self.start is None:
            return
        # "<prefix>_runtime" is the duration of the evaluation this entry reports; "train_runtime" is not one.
        self.evaluation_seconds += sum(v for k, v in logs.items() if k.endswith("_runtime") and k != "train_runtime")
        logs["train_seconds"] = round(time.perf_counter() - self.start - self.evaluation_seconds, 3)


class RecipeTrainer(Trainer):
    """``Trainer`` with three additions.

    - ``optimizer_plan.filter_learning_rate`` set: the implicit-filter parameters of an Orchid model form a third
      parameter group (after Trainer's decayed and undecayed groups) with their own peak learning rate and weight
      decay, as M2-BERT trains its filters. The schedule scales every group by the same factor. Models without
      such parameters (BERT, ViT) keep Trainer's two groups.
    - ``card_writer``: writes ``README.md`` in place of Trainer's generic card, also when ``push_to_hub`` does.
    - every log entry of a training run (losses, evaluations) carries ``train_seconds`` (:class:`TrainingClock`).
    """

    def __init__(self, *args, optimizer_plan: OptimizerPlan | None = None, card_writer=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.optimizer_plan = optimizer_plan
        self.card_writer = card_writer
        self.training_clock = TrainingClock()
        self.add_callback(self.training_clock)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        self.training_clock.add_to(logs)
        super().log(logs, start_time)

    def create_optimizer(self, model=None):
        plan = self.optimizer_plan
        opt_model = self.model if model is None else model
        if self.optimizer is not None or plan is None or plan.filter_learning_rate is None:
            return super().create_optimizer(model)
        filters = set(filter_parameter_names(opt_model))
        if not filters:
            logger.info("no implicit-filter parameters (not an Orchid model): Trainer's two parameter groups")
            return super().create_optimizer(model)
        decay = set(self.get_decay_parameter_names(opt_model))
        named = [(n, p) for n, p in opt_model.named_parameters() if p.requires_grad]
        others = [(n, p) for n, p in named if n not in filters]
        groups = [
            {"params": [p for n, p in others if n in decay], "weight_decay": self.args.weight_decay},
            {"params": [p for n, p in others if n not in decay], "weight_decay": 0.0},
            {
                "params": [p for n, p in named if n in filters],
                "weight_decay": plan.filter_weight_decay,
                "lr": plan.filter_learning_rate,
            },
        ]
        if self.optimizer_cls_and_kwargs is not None:
            optimizer_cls, optimizer_kwargs = self.optimizer_cls_and_kwargs
        else:
            optimizer_cls, optimizer_kwargs = self.get_optimizer_cls_and_kwargs(self.args, opt_model)
        unsupported = {"params", "model", "optimizer_dict"} & set(optimizer_kwargs)
        if unsupported:
            raise ValueError(
                f"--optim {self.args.optim} builds its own parameter groups, so the implicit filters cannot have one; "
                "pass --filter_param_group False"
            )
        self.optimizer = optimizer_cls(groups, **optimizer_kwargs)
        logger.info(
            "parameter groups: %d decayed, %d undecayed, %d implicit-filter tensors at lr %g, weight decay %g",
            *(len(group["params"]) for group in groups),
            plan.filter_learning_rate,
            plan.filter_weight_decay,
        )
        return self.optimizer

    def create_model_card(self, **kwargs):
        # The card template describes Orchid; other models (baselines) get Trainer's own card.
        if self.card_writer is None or getattr(self.model.config, "model_type", None) != "orchid":
            return super().create_model_card(**kwargs)
        if self.is_world_process_zero():
            self.card_writer()


# ---------------------------------------------------------------------------------------------
# Models: Orchid presets, any model type, any checkpoint
# ---------------------------------------------------------------------------------------------


def parse_overrides(text: str | None) -> dict:
    """``"hidden_size=64,num_hidden_layers=2,transform=fft"`` -> dict, values parsed as JSON when they can be."""
    overrides = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"config_overrides items must look like key=value, got {item!r} in {text!r}")
        try:
            overrides[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key.strip()] = value.strip()
    return overrides


def load_config(name_or_path: str, model_args: ModelArguments | None = None, *, how_to_local: str = "", **updates):
    """A config from an Orchid preset name, a ``config.json``, a folder or a Hub id, with ``updates`` applied."""
    from transformers import CONFIG_MAPPING, AutoConfig

    from .modeling import PRESETS, OrchidConfig

    if name_or_path in PRESETS:
        return OrchidConfig.from_preset(name_or_path, **updates)
    path = Path(name_or_path).expanduser()
    if path.is_file():
        values = json.loads(path.read_text())
        model_type = values.get("model_type")
        if model_type not in CONFIG_MAPPING:
            raise ValueError(f"config file {path} has model_type {model_type!r}, which transformers does not know")
        return CONFIG_MAPPING[model_type].from_dict({**values, **updates})
    hub_kwargs = model_args.hub_kwargs() if model_args is not None else {}
    hint = f"{how_to_local} Orchid presets: {', '.join(PRESETS)}.".strip()
    return from_pretrained(AutoConfig, name_or_path, what="config", how_to_local=hint, **hub_kwargs, **updates)


def new_config(model_args: ModelArguments, recipe: Recipe, *, defaults: dict | None = None, **updates):
    """The config of a model trained from scratch: ``--model_type`` (orchid: the recipe's preset) with
    ``defaults`` (values the data implies, e.g. the vocabulary size), ``--config_overrides`` and ``updates``."""
    from transformers import CONFIG_MAPPING

    from .modeling import OrchidConfig

    model_type = model_args.model_type or "orchid"
    values = {**(defaults or {}), **parse_overrides(model_args.config_overrides), **updates}
    if model_type == "orchid":
        if recipe.preset is None:
            raise ValueError(f"recipe {recipe.name!r} has no Orchid preset; pass --config_name")
        return OrchidConfig.from_preset(recipe.preset, **{**recipe.model_overrides, **values})
    if model_type not in CONFIG_MAPPING:
        known = ", ".join(sorted(k for k in CONFIG_MAPPING if k in ("bert", "roberta", "vit", "deit", "orchid")))
        raise ValueError(f"unknown --model_type {model_type!r}; use orchid or a transformers model type ({known}, ...)")
    return CONFIG_MAPPING[model_type](**values)


def build_model(
    auto_class,
    model_args: ModelArguments,
    recipe: Recipe,
    *,
    how_to_local: str,
    new_model_defaults: dict | None = None,
    ignore_mismatched_sizes: bool | None = None,
    prepare_config: Callable | None = None,
    **config_updates,
):
    """The model of a run, as transformers' examples build it.

    With ``--model_name_or_path``: its weights, with its config (or ``--config_name``) updated by
    ``config_updates``. Otherwise a new model from ``--config_name`` or ``--model_type`` (see :func:`new_config`).
    ``prepare_config(config)`` may change the config (whatever its model type) before the model is built.
    """
    if model_args.model_name_or_path:
        if model_args.config_name:
            config = load_config(model_args.config_name, model_args, how_to_local=how_to_local, **config_updates)
        else:
            from transformers import AutoConfig

            config = from_pretrained(
                AutoConfig, model_args.model_name_or_path, what="model", how_to_local=how_to_local,
                **model_args.hub_kwargs(), **config_updates,
            )  # fmt: skip
        if prepare_config is not None:
            prepare_config(config)
        ignore = model_args.ignore_mismatched_sizes if ignore_mismatched_sizes is None else ignore_mismatched_sizes
        return from_pretrained(
            auto_class, model_args.model_name_or_path, what="model", how_to_local=how_to_local, config=config,
            ignore_mismatched_sizes=ignore, **model_args.hub_kwargs(),
        )  # fmt: skip
    if model_args.config_name:
        from .modeling import PRESETS

        defaults = new_model_defaults if model_args.config_name in PRESETS else {}
        config = load_config(
            model_args.config_name, model_args, how_to_local=how_to_local, **{**(defaults or {}), **config_updates}
        )
    else:
        config = new_config(model_args, recipe, defaults=new_model_defaults, **config_updates)
    if prepare_config is not None:
        prepare_config(config)
    return auto_class.from_config(config, trust_remote_code=model_args.trust_remote_code)


def checkpoint_num_labels(path: str) -> int | None:
    """The number of labels of a saved classifier's head, or None where the folder holds no classification head."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        return None
    config = json.loads(config_file.read_text())
    if not any("Classification" in name for name in config.get("architectures") or []):
        return None
    return len(config["id2label"]) if config.get("id2label") else config.get("num_labels")


def check_head_size(model_args: ModelArguments, num_labels: int, label_names: Sequence[str] = ()) -> None:
    """A checkpoint whose classifier has another number of labels needs ``--ignore_mismatched_sizes``."""
    if not model_args.model_name_or_path or model_args.ignore_mismatched_sizes:
        return
    saved = checkpoint_num_labels(model_args.model_name_or_path)
    if saved is not None and saved != num_labels:
        names = ", ".join(map(str, list(label_names)[:10])) + (", ..." if len(label_names) > 10 else "")
        raise ValueError(
            f"checkpoint {model_args.model_name_or_path} classifies {saved} labels, the data has {num_labels} "
            f"classes{f' ({names})' if names else ''}; pass --ignore_mismatched_sizes to replace its classifier"
        )


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------


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


def finish_run(trainer: Trainer, commit_message: str) -> None:
    """Write the model card and, with ``--push_to_hub``, push the output folder through Trainer (which follows
    ``--hub_strategy``, ``--hub_model_id``, ``--hub_private_repo``, ...). An Orchid folder is first checked for
    everything a loadable repository needs (:func:`orchid_hf.hub.upload_file_list`)."""
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
    "FILTER_PARAMETER_MARKERS",
    "ModelArguments",
    "OptimizerPlan",
    "ParsedArguments",
    "RecipeArguments",
    "RecipeTrainer",
    "TrainingClock",
    "bf16_available",
    "build_model",
    "check_head_size",
    "check_push",
    "decoupled_to_torch_weight_decay",
    "describe_schedule",
    "filter_parameter_names",
    "finish_run",
    "load_config",
    "new_config",
    "parse_overrides",
    "parse_recipe_arguments",
    "plan_for_model",
    "resolve_checkpoint",
    "resolve_optimizer",
    "resolve_stages",
    "resolve_weight_decay",
    "run_cli",
    "save_metrics",
    "setup_logging",
    "write_json",
]
