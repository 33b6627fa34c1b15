"""``RecipeTrainer``: the Trainer of the three recipes, with the implicit filters' parameter group, this package's
model cards and a training clock that leaves out evaluation time."""

from __future__ import annotations

import logging
import time

from .extras import require_extra

require_extra("accelerate", "train")  # the Trainer needs it

from transformers import Trainer, TrainerCallback  # noqa: E402

from .optimization import OptimizerPlan, filter_parameter_names  # noqa: E402

logger = logging.getLogger(__name__)


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
      decay, as M2-BERT and the authors' layer give the filters a group of their own. The schedule scales every
      group by the same factor. Models without such parameters (BERT, ViT) keep Trainer's two groups.
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

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        # transformers' polynomial schedule divides by the steps left after the warm-up, so a warm-up fraction that
        # rounds up to every step (6% of a 1-step run) would divide by zero: the warm-up leaves one step.
        kind = str(getattr(self.args.lr_scheduler_type, "value", self.args.lr_scheduler_type))
        warmup = self.args.get_warmup_steps(num_training_steps)
        if self.lr_scheduler is None and kind == "polynomial" and 0 < num_training_steps <= warmup:
            logger.warning(
                f"warm-up of {warmup} steps in a run of {num_training_steps}: shortened to {num_training_steps - 1}, "
                "so that the polynomial decay has a step"
            )
            self.args.warmup_steps = num_training_steps - 1
        return super().create_scheduler(num_training_steps, optimizer)

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


__all__ = ["RecipeTrainer", "TrainingClock"]
