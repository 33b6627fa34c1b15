"""Named training recipes: every default value of the three recipe scripts, in one place per recipe.

A recipe is a set of argument defaults (``TrainingArguments`` fields and the scripts' own fields), the Orchid preset a
model built from scratch starts from, and where the values come from. A script's ``--recipe NAME`` selects one; any
flag given on the command line (or in a JSON/YAML config file) overrides the recipe's value. The GLUE recipes also
hold Table C.2's per-task values.

>>> from orchid_hf.recipes import get_recipe, list_recipes
>>> list_recipes("mlm")
['orchid-bert-base-mlm', 'orchid-bert-large-mlm']
>>> get_recipe("orchid-bert-base-mlm").defaults()["learning_rate"]
0.0008
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

KINDS = ("mlm", "text-classification", "image-classification")


@dataclass(frozen=True)
class Recipe:
    """Defaults of one recipe.

    name: what ``--recipe`` takes. kind: the script it belongs to (``mlm``: ``scripts/pretrain_mlm.py``,
    ``text-classification``: ``scripts/finetune_glue.py``, ``image-classification``: ``scripts/train_image.py``).
    arguments: argument defaults. tasks: per-task defaults on top of ``arguments`` (GLUE). preset and
    model_overrides: the Orchid config of a model built from scratch (``--model_type orchid``, the default); other
    model types start from their own config class's defaults. source: where the values come from.
    """

    name: str
    kind: str
    description: str
    source: str
    arguments: MappingProxyType
    preset: str | None = None
    model_overrides: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    tasks: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))

    def defaults(self, task: str | None = None) -> dict[str, Any]:
        """The argument defaults, with those of ``task`` on top where the recipe has per-task values."""
        values = dict(self.arguments)
        if task is not None:
            if task not in self.tasks:
                raise ValueError(f"recipe {self.name!r} has no values for task {task!r}; it has {sorted(self.tasks)}")
            values.update(self.tasks[task])
        return values


_RECIPES: dict[str, Recipe] = {}


def register_recipe(
    name: str,
    *,
    kind: str,
    description: str,
    source: str,
    arguments: dict[str, Any],
    preset: str | None = None,
    model_overrides: dict[str, Any] | None = None,
    tasks: dict[str, dict[str, Any]] | None = None,
) -> Recipe:
    """Add a recipe to the registry (a name may be registered once)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if name in _RECIPES:
        raise ValueError(f"a recipe named {name!r} is already registered")
    for task, values in {None: arguments, **(tasks or {})}.items():
        merged = {**arguments, **values}
        for torch_name, decoupled_name in EXCLUSIVE_DECAYS:
            if merged.get(torch_name) is not None and merged.get(decoupled_name) is not None:
                where = f"task {task!r} of " if task else ""
                raise ValueError(f"{where}recipe {name!r} sets both {torch_name} and {decoupled_name}")
    recipe = Recipe(
        name=name,
        kind=kind,
        description=description,
        source=source,
        arguments=MappingProxyType(dict(arguments)),
        preset=preset,
        model_overrides=MappingProxyType(dict(model_overrides or {})),
        tasks=MappingProxyType({task: MappingProxyType(dict(values)) for task, values in (tasks or {}).items()}),
    )
    _RECIPES[name] = recipe
    return recipe


def get_recipe(name: str, kind: str | None = None) -> Recipe:
    """The recipe called ``name``; ValueError listing the available ones (of ``kind``) otherwise."""
    recipe = _RECIPES.get(name)
    if recipe is None or (kind is not None and recipe.kind != kind):
        names = ", ".join(list_recipes(kind))
        raise ValueError(f"unknown recipe {name!r}; the {kind or 'available'} recipes are {names}")
    return recipe


def list_recipes(kind: str | None = None) -> list[str]:
    """Names of the registered recipes, of one kind or all, sorted."""
    return sorted(name for name, recipe in _RECIPES.items() if kind is None or recipe.kind == kind)


# Pairs of fields of which a recipe or a user sets at most one: weight decay in torch AdamW's (Trainer's) meaning,
# and the paper's decoupled value (see orchid_hf.optimization.resolve_weight_decay).
EXCLUSIVE_DECAYS = (
    ("weight_decay", "decoupled_weight_decay"),
    ("filter_weight_decay", "filter_decoupled_weight_decay"),
)

# ---------------------------------------------------------------------------------------------
# MLM pretraining (App. C.3; M2-BERT's pretraining configuration, whose recipe the paper follows)
# ---------------------------------------------------------------------------------------------

# Optimizer settings shared by pretraining and GLUE fine-tuning (App. C.3, M2-BERT's GLUE jobs).
BERT_OPTIMIZER = dict(adam_beta1=0.9, adam_beta2=0.98, adam_epsilon=1e-6, optim="adamw_torch", max_grad_norm=1.0)
# The implicit long-convolution filters train in a parameter group of their own at lr 1e-3 (M2-BERT's
# ``long_conv_kernel_learning_rate``, the authors' ConvKernel_Static's ``lr``) without weight decay (the authors'
# ConvKernel_Static's ``wd=0``). M2-BERT's ``hyena_wd: 0.1`` goes to Composer's DecoupledAdamW, which scales the
# filters by (1 - 0.1 lr_t / 1e-3) at every step: the static and residual kernels are gone after a hundred steps
# (docs/training.md, "The implicit filters' parameter group").
FILTER_LEARNING_RATE = 1e-3
FILTER_WEIGHT_DECAY = 0.0

MLM_ARGUMENTS = dict(
    dataset_name="allenai/c4",
    dataset_config_name="en",
    streaming=True,
    tokenizer_name="bert-base-uncased",
    max_seq_length=128,
    mlm_probability=0.3,
    learning_rate=8e-4,
    **BERT_OPTIMIZER,
    decoupled_weight_decay=1e-5,
    filter_learning_rate=FILTER_LEARNING_RATE,
    filter_decoupled_weight_decay=FILTER_WEIGHT_DECAY,
    # Linear warmup over 6% of the steps, then linear decay to 0.02x the peak (M2's linear_decay_with_warmup,
    # alpha_f 0.02): transformers' polynomial schedule with power 1 ending at min_lr_ratio x learning_rate.
    lr_scheduler_type="polynomial",
    min_lr_ratio=0.02,
    warmup_steps=0.06,
    max_steps=70_000,
    per_device_train_batch_size=128,
    per_device_eval_batch_size=128,
    bf16="auto",
    eval_strategy="steps",
    eval_steps=2000,
    save_steps=2000,
    save_total_limit=3,
    logging_steps=100,
    # Every parameter takes part in every step; DDP need not search the graph for unused ones.
    ddp_find_unused_parameters=False,
)
MLM_SOURCE = (
    "Orchid paper App. C.3; HazyResearch/m2 bert/yamls/pretrain/monarch-mixer-pretrain-786dim-80m-parameters.yaml "
    "(schedule alpha_f 0.02, filter lr 1e-3); the filters without weight decay, as Karami-m/orchid's ConvKernel_Static"
)
register_recipe(
    "orchid-bert-base-mlm",
    kind="mlm",
    description="Orchid-BERT-base masked-LM pretraining on C4: 70k steps at a global batch of 4096, sequence 128",
    source=MLM_SOURCE,
    arguments=MLM_ARGUMENTS,
    preset="orchid-bert-base",
)
register_recipe(
    "orchid-bert-large-mlm",
    kind="mlm",
    description="Orchid-BERT-large masked-LM pretraining on C4, the base recipe with the large preset",
    source=MLM_SOURCE,
    arguments=MLM_ARGUMENTS,
    preset="orchid-bert-large",
)

# ---------------------------------------------------------------------------------------------
# GLUE fine-tuning (Table C.2)
# ---------------------------------------------------------------------------------------------

GLUE_ARGUMENTS = dict(
    dataset_name="nyu-mll/glue",
    max_seq_length=128,
    **BERT_OPTIMIZER,
    lr_scheduler_type="linear",
    warmup_steps=0.06,
    filter_learning_rate=FILTER_LEARNING_RATE,
    per_device_eval_batch_size=64,
    logging_steps=50,
    eval_strategy="no",
    save_strategy="no",
    bf16="auto",
    ddp_find_unused_parameters=False,
)
# Batch sizes are not in the paper; these are M2-BERT's GLUE jobs, whose hyperparameters the paper reuses.
GLUE_BATCH_SIZES = dict(mnli=48, rte=16, qnli=16, qqp=16, sst2=16, stsb=32, cola=32, mrpc=32, wnli=32)


def _glue_tasks(size: str, rows: dict[str, tuple[str, float, float, float]]) -> dict[str, dict[str, Any]]:
    """Table C.2's rows as per-task argument defaults. D-AdamW is Composer's DecoupledAdamW: its weight decay is
    the decoupled value; AdamW is torch's, whose weight decay is Trainer's. The filters' decay (none) is given in the
    same meaning as the task's."""
    tasks = {}
    for task, (optimizer, lr, decay, epochs) in rows.items():
        decay_name = "decoupled_weight_decay" if optimizer == "d-adamw" else "weight_decay"
        filter_decay_name = "filter_decoupled_weight_decay" if optimizer == "d-adamw" else "filter_weight_decay"
        tasks[task] = {
            "learning_rate": lr,
            decay_name: decay,
            filter_decay_name: FILTER_WEIGHT_DECAY,
            "num_train_epochs": epochs,
            "per_device_train_batch_size": GLUE_BATCH_SIZES[task],
            "pooling": "mean" if (size, task) == ("base", "qnli") else "first",
        }
    return tasks


# Table C.2. WNLI is not in it: BERT's usual settings (AdamW, lr 2e-5, weight decay 0.01, 3 epochs).
GLUE_TABLE_C2 = {
    "base": {
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
    "large": {
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
}
GLUE_SOURCE = (
    "Orchid paper Table C.2; batch sizes and the filter group from HazyResearch/m2 "
    "bert/yamls/finetune-glue/monarch-mixer-finetune-glue-768dim-80m-parameters.yaml"
)
for _size in ("base", "large"):
    register_recipe(
        f"orchid-bert-{_size}-glue",
        kind="text-classification",
        description=f"GLUE fine-tuning of Orchid-BERT-{_size}, Table C.2's per-task hyperparameters",
        source=GLUE_SOURCE,
        arguments=GLUE_ARGUMENTS,
        preset=f"orchid-bert-{_size}",
        tasks=_glue_tasks(_size, GLUE_TABLE_C2[_size]),
    )
# Own classification data (--train_file/--validation_file or --dataset_name without a GLUE task): the base recipe's
# common values with MRPC's row, the same optimizer family BERT fine-tuning uses (AdamW, lr 5e-5, weight decay 0.01).
# Orchid pools the mean of the real tokens: its long convolutions start close to the identity and masked-LM
# pretraining puts no loss on the [CLS] position, so the first token carries less of the text than the mean does
# (docs/model.md, "Pooling"; measured in docs/results/real_data.md). Other models pool as their class does.
register_recipe(
    "orchid-bert-classification",
    kind="text-classification",
    description="Sentence or sentence-pair classification of your own data: AdamW, lr 5e-5, 3 epochs, mean pooling",
    source="BERT's fine-tuning settings with the optimizer of Table C.2's AdamW tasks; mean pooling as the paper's "
    "QNLI-base (App. C.3), chosen for own data by docs/results/real_data.md",
    arguments={
        **GLUE_ARGUMENTS,
        "dataset_name": None,
        "learning_rate": 5e-5,
        "weight_decay": 0.01,
        "filter_weight_decay": FILTER_WEIGHT_DECAY,
        "num_train_epochs": 3,
        "per_device_train_batch_size": 32,
        "pooling": "mean",
    },
    preset="orchid-bert-base",
)

# ---------------------------------------------------------------------------------------------
# Image classification (App. C.4, Table C.3)
# ---------------------------------------------------------------------------------------------

IMAGE_ARGUMENTS = dict(
    # The paper's "Adam with its standard setting" and weight decay 0.05, the DeiT/T2T-ViT value, which those
    # pipelines apply decoupled (AdamW): an L2 term of 0.05 in Adam's gradient would outweigh the loss gradient.
    optim="adamw_torch",
    adam_beta1=0.9,
    adam_beta2=0.999,
    weight_decay=0.05,
    label_smoothing_factor=0.1,
    eval_strategy="epoch",
    save_strategy="epoch",
    save_total_limit=1,
    logging_strategy="epoch",
)
CIFAR_ARGUMENTS = dict(
    IMAGE_ARGUMENTS,
    dataset_name="cifar10",
    # Table C.3's tuned base learning rates are 1e-3, 5e-3 and 1e-2; the text's 3e-4 lies outside them. The
    # smallest of the three is the default; --learning_rate 5e-3 or 1e-2 runs the rest of the grid.
    learning_rate=1e-3,
    lr_scheduler_type="constant_with_warmup",
    warmup_steps=500,
    per_device_train_batch_size=512,
    per_device_eval_batch_size=512,
    num_train_epochs=500,
    crop_padding=4,
    hflip=True,
)
CIFAR_SOURCE = "Orchid paper App. C.4 and Table C.3 (CIFAR-10 column)"
register_recipe(
    "orchid-vit-cifar-s",
    kind="image-classification",
    description="Orchid-s (6 layers, hidden 128) on CIFAR-10, patch 4 (--config_overrides patch_size=2 or 1)",
    source=CIFAR_SOURCE,
    arguments=CIFAR_ARGUMENTS,
    preset="orchid-vit-cifar-s",
)
register_recipe(
    "orchid-vit-cifar-m",
    kind="image-classification",
    description="Orchid-m (6 layers, hidden 220) on CIFAR-10",
    source=CIFAR_SOURCE,
    arguments=CIFAR_ARGUMENTS,
    preset="orchid-vit-cifar-m",
)
register_recipe(
    "orchid-vit-imagenet",
    kind="image-classification",
    description="Orchid-ViT-base on ImageNet-1K with the T2T-ViT augmentations (AugMix not implemented)",
    source="Orchid paper App. C.4 and Table C.3 (ImageNet-1k column)",
    arguments=dict(
        IMAGE_ARGUMENTS,
        dataset_name="imagenet-1k",
        learning_rate=1e-3,
        lr_scheduler_type="cosine",
        warmup_epochs=10,
        per_device_train_batch_size=1024,
        per_device_eval_batch_size=1024,
        num_train_epochs=300,
        random_resized_crop=True,
        hflip=True,
        randaugment="2,9,0.5",
        mixup_alpha=0.8,
        cutmix_alpha=1.0,
        random_erasing=0.25,
        resample="bicubic",
    ),
    preset="orchid-vit-imagenet",
)
# The embedded default: a 3-layer, width-64 Orchid-ViT on 8x8 digits with one pixel per patch (64 tokens).
# One-pixel shifts are the only augmentation: a flipped digit is another digit.
register_recipe(
    "orchid-vit-digits",
    kind="image-classification",
    description="a small Orchid-ViT on scikit-learn's 8x8 digits, offline, a few minutes on a CPU",
    source="this project (the CIFAR recipe's optimizer with a cosine schedule, sized for 1,437 training images)",
    arguments=dict(
        IMAGE_ARGUMENTS,
        dataset_name="digits",
        learning_rate=2e-3,
        lr_scheduler_type="cosine",
        warmup_epochs=2,
        per_device_train_batch_size=64,
        per_device_eval_batch_size=64,
        num_train_epochs=25,
        crop_padding=1,
        train_val_split=0.2,
    ),
    preset="orchid-vit-cifar-s",
    model_overrides=dict(image_size=8, patch_size=1, hidden_size=64, num_hidden_layers=3, intermediate_size=128),
)
# Image datasets whose recipe is picked when --recipe is not given.
IMAGE_RECIPE_FOR_DATASET = {
    "digits": "orchid-vit-digits",
    "cifar10": "orchid-vit-cifar-s",
    "uoft-cs/cifar10": "orchid-vit-cifar-s",
    "imagenet-1k": "orchid-vit-imagenet",
    "imagenet": "orchid-vit-imagenet",
    "ILSVRC/imagenet-1k": "orchid-vit-imagenet",
}

__all__ = [
    "EXCLUSIVE_DECAYS",
    "GLUE_TABLE_C2",
    "IMAGE_RECIPE_FOR_DATASET",
    "KINDS",
    "Recipe",
    "get_recipe",
    "list_recipes",
    "register_recipe",
]
