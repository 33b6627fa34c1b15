"""The optimizer of a run: the paper's decoupled weight decay converted to torch AdamW's, the implicit filters'
parameter group (M2-BERT's), the end point of the learning-rate schedule, and the resolved settings in words."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from transformers import TrainingArguments

from .arguments import RecipeArguments
from .recipes import EXCLUSIVE_DECAYS

logger = logging.getLogger(__name__)

# Parameters whose names contain these belong to the network of an Orchid operator's implicit (static or residual)
# long filter: the layers to which M2-BERT gives an optimizer group of their own (not the filter's skip term D).
FILTER_PARAMETER_MARKERS = (".static_filter.ffn.", ".residual_filter.ffn.")


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


def filter_parameter_names(model: torch.nn.Module) -> list[str]:
    """Names of the trainable parameters of the Orchid operators' implicit filters (empty for other models)."""
    return [
        name
        for name, parameter in model.named_parameters()
        if parameter.requires_grad and any(marker in f".{name}" for marker in FILTER_PARAMETER_MARKERS)
    ]


__all__ = [
    "FILTER_PARAMETER_MARKERS",
    "OptimizerPlan",
    "decoupled_to_torch_weight_decay",
    "describe_schedule",
    "filter_parameter_names",
    "plan_for_model",
    "resolve_optimizer",
    "resolve_weight_decay",
]
