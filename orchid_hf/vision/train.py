"""Image classification (Sec. 4.3 and App. C.4) as transformers' ``run_image_classification.py`` does it:
``scripts/train_image.py`` is the command line.

The recipes of Table C.3 set the defaults (``--recipe orchid-vit-cifar-s``, ``orchid-vit-cifar-m``,
``orchid-vit-imagenet``, and ``orchid-vit-digits`` for the embedded digits); ``TrainingArguments`` and the
augmentation flags override them. Any image-classification model type trains through the same recipe
(``--model_type vit``, ``--model_name_or_path`` of a checkpoint), which is how baselines are compared.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..extras import require_extra

require_extra("PIL", "vision")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import (  # noqa: E402,E501
    AutoImageProcessor,
    AutoModelForImageClassification,
    TrainerCallback,
)

from ..arguments import ModelArguments, ParsedArguments, parse_recipe_arguments, recipe_dataclasses  # noqa: E402
from ..hub import from_pretrained  # noqa: E402
from ..metrics import load_metric  # noqa: E402
from ..model_loading import build_model, check_head_size, checkpoint_num_labels  # noqa: E402
from ..optimization import describe_schedule, plan_for_model  # noqa: E402
from ..recipes import IMAGE_RECIPE_FOR_DATASET, list_recipes  # noqa: E402
from ..runs import (  # noqa: E402
    card_base_model,
    finish_run,
    resolve_checkpoint,
    save_metrics,
    setup_logging,
    start_run,
    train_and_save,
)
from ..trainer import RecipeTrainer  # noqa: E402
from .augment import MixupCutmix, soft_target_cross_entropy  # noqa: E402
from .data import IMAGENET_MEAN_STD, load_image_data  # noqa: E402
from .report import EpochStatsCallback, confusion_matrix, peak_rss_mib, plot_confusion_matrix, write_image_model_card  # noqa: E402,E501
from .transforms import (  # noqa: E402
    RESAMPLE,
    EvalTransform,
    TrainTransform,
    build_image_processor,
    collate_images,
    parse_randaugment,
)

logger = logging.getLogger(__name__)

LOCAL_IMAGES_HINT = "Pass a local model folder, or train a new model (--model_type)."


@dataclass
class ImageModelArguments(ModelArguments):
    image_processor_name: str | None = field(
        default=None,
        metadata={"help": "Image processor name or folder (default: the one saved with --model_name_or_path, or one "
                  "built from the recipe)."},
    )  # fmt: skip


@dataclass
class ImageDataArguments:
    """Which images: a Hub dataset, the embedded digits, or folders."""

    dataset_name: str | None = field(
        default=None, metadata={"help": "digits (embedded, offline), cifar10, imagenet-1k, or a Hub id owner/name."}
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Configuration of the Hub dataset."})
    train_dir: str | None = field(
        default=None,
        metadata={"help": "A folder with one subfolder per class (optionally inside train/ and test/ folders), or a "
                  "folder of IDX files (train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], t10k-*)."},
    )  # fmt: skip
    validation_dir: str | None = field(default=None, metadata={"help": "The same for evaluation."})
    train_val_split: float = field(
        default=0.15, metadata={"help": "Share of the training images held out when there is no evaluation split."}
    )
    split_seed: int = field(default=0, metadata={"help": "Seed of the held-out split, kept apart from --seed."})
    image_column_name: str | None = field(default=None, metadata={"help": "Hub data: the image column."})
    label_column_name: str | None = field(default=None, metadata={"help": "Hub data: the class-label column."})
    class_names: list[str] | None = field(default=None, metadata={"help": "IDX files: the names of the classes."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Use at most this many training images."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "... evaluation images."})
    verify_images: bool = field(default=True, metadata={"help": "Open every image of a folder before training."})


@dataclass
class AugmentationArguments:
    """The recipe's augmentations and warmup (the recipe sets them; flags override)."""

    crop_padding: int = field(default=0, metadata={"help": "Random crop after zero-padding by this many pixels."})
    hflip: bool = field(default=False, metadata={"help": "Random horizontal flip."})
    random_resized_crop: bool = field(default=False, metadata={"help": "Inception's random resized crop."})
    randaugment: str = field(default="none", metadata={"help": "RandAugment 'layers,magnitude,std' (2,9,0.5) or none."})
    mixup_alpha: float = field(default=0.0, metadata={"help": "Mixup's Beta(alpha, alpha); 0: off."})
    cutmix_alpha: float = field(default=0.0, metadata={"help": "CutMix's Beta(alpha, alpha); 0: off."})
    random_erasing: float = field(default=0.0, metadata={"help": "Probability of random erasing."})
    resample: str = field(
        default="bilinear", metadata={"help": "Resizing filter.", "choices": ["bilinear", "bicubic"]}
    )
    warmup_epochs: float | None = field(
        default=None, metadata={"help": "Warmup in epochs, converted to --warmup_steps (not with --warmup_steps)."}
    )


DATACLASSES = recipe_dataclasses(ImageModelArguments, ImageDataArguments, AugmentationArguments)


def _default_recipe(given: dict) -> str:
    if given.get("dataset_name"):
        return IMAGE_RECIPE_FOR_DATASET.get(given["dataset_name"], "orchid-vit-cifar-s")
    if given.get("train_dir"):
        return "orchid-vit-cifar-s"
    return "orchid-vit-digits"


def parse_args(argv: list[str] | None = None) -> ParsedArguments:
    """The command line with the recipe's values as defaults (the recipe follows the dataset when not given)."""
    parsed = parse_recipe_arguments(
        DATACLASSES,
        argv,
        kind="image-classification",
        default_recipe=_default_recipe,
        description=f"Image classification. Recipes: {', '.join(list_recipes('image-classification'))}",
    )
    data_args, augmentation = parsed.data_args, parsed.augmentation_args
    # The recipe's dataset stands for "no data given": folders replace it.
    if "dataset_name" not in parsed.explicit and (data_args.train_dir or data_args.validation_dir):
        data_args.dataset_name = None
    if "warmup_steps" in parsed.explicit and "warmup_epochs" in parsed.explicit and augmentation.warmup_epochs:
        raise ValueError(
            "pass --warmup_steps or --warmup_epochs, not both: got "
            f"warmup_steps={parsed.training_args.warmup_steps} and warmup_epochs={augmentation.warmup_epochs}"
        )
    if "warmup_steps" in parsed.explicit:
        augmentation.warmup_epochs = None
    if augmentation.warmup_epochs is not None and augmentation.warmup_epochs < 0:
        raise ValueError(f"warmup_epochs must be >= 0, got {augmentation.warmup_epochs}")
    if not 0 <= data_args.train_val_split < 1:
        raise ValueError(f"train_val_split must be in [0, 1), got {data_args.train_val_split}")
    return parsed


class ImageClassificationTrainer(RecipeTrainer):
    """Trainer whose loss is cross-entropy with label smoothing (``--label_smoothing_factor``), or against
    Mixup/CutMix soft targets (already smoothed, timm's convention); the batch is mixed here, in training only, so
    evaluation sees the images as they are."""

    def __init__(self, *args, mixer: MixupCutmix | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.mixer = mixer

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs = dict(inputs)
        targets = inputs.pop("labels")
        pixel_values = inputs["pixel_values"]
        if model.training and self.mixer is not None:
            pixel_values, targets = self.mixer(pixel_values, targets)
        outputs = model(pixel_values=pixel_values)
        loss = soft_target_cross_entropy(outputs.logits, targets, self.args.label_smoothing_factor)
        return (loss, outputs) if return_outputs else loss


def _image_processor(model, model_args: ImageModelArguments, augmentation: AugmentationArguments, mean_std):
    """The processor saved with the model: a given or saved one, or the recipe's (size from the model's config,
    normalisation from the data)."""
    name = model_args.image_processor_name
    if name is None and model_args.model_name_or_path:
        if (Path(model_args.model_name_or_path) / "preprocessor_config.json").is_file():
            name = model_args.model_name_or_path
    if name is not None:
        return from_pretrained(
            AutoImageProcessor, name, what="image processor", how_to_local=LOCAL_IMAGES_HINT,
            cache_dir=model_args.cache_dir, token=model_args.token, trust_remote_code=model_args.trust_remote_code,
        )  # fmt: skip
    mean, std = mean_std or IMAGENET_MEAN_STD
    size, channels = getattr(model.config, "image_size", 224), getattr(model.config, "num_channels", 3)
    return build_image_processor(size, mean, std, RESAMPLE[augmentation.resample], channels)


def train_image_classifier(parsed: ParsedArguments, callbacks: Sequence[TrainerCallback] = ()) -> dict:
    """One run: train, evaluate on the held-out split, and write to ``output_dir`` the model, its image processor,
    ``all_results.json`` (the examples' metric files), ``results.json`` (per-class accuracy, confusion matrix,
    time and memory per epoch, the resolved recipe), ``confusion_matrix.csv``/``.png`` and the model card."""
    started = time.perf_counter()
    model_args, data_args, augmentation = parsed.model_args, parsed.data_args, parsed.augmentation_args
    training_args, plan = start_run(parsed)
    training_args.remove_unused_columns = False  # the transforms need the raw image column
    if "dataloader_pin_memory" not in parsed.explicit:
        training_args.dataloader_pin_memory = torch.cuda.is_available()

    with training_args.main_process_first(desc="loading the images"):
        data = load_image_data(
            data_args.dataset_name, data_args.dataset_config_name, data_args.train_dir, data_args.validation_dir,
            train_val_split=data_args.train_val_split, split_seed=data_args.split_seed, cache_dir=model_args.cache_dir,
            token=model_args.token, verify=data_args.verify_images, image_column=data_args.image_column_name,
            label_column=data_args.label_column_name, label_names=data_args.class_names,
        )  # fmt: skip
    train_ds, eval_ds, label_names = data.train, data.evaluation, data.label_names
    if data_args.max_train_samples:
        count = min(data_args.max_train_samples, len(train_ds))
        train_ds = train_ds.shuffle(seed=training_args.seed).select(range(count))
    if data_args.max_eval_samples:
        eval_ds = eval_ds.select(range(min(data_args.max_eval_samples, len(eval_ds))))

    checkpoint = resolve_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir)
    if checkpoint is not None and checkpoint_num_labels(checkpoint) not in (None, len(label_names)):
        raise ValueError(
            f"checkpoint {checkpoint} classifies {checkpoint_num_labels(checkpoint)} labels, the data has "
            f"{len(label_names)} classes; a resumed run must keep its classifier: start a new run with "
            "--model_name_or_path and --ignore_mismatched_sizes"
        )
    check_head_size(model_args, len(label_names), label_names)
    model = build_model(
        AutoModelForImageClassification, model_args, parsed.recipe, how_to_local=LOCAL_IMAGES_HINT,
        num_labels=len(label_names), id2label=dict(enumerate(label_names)),
        label2id={name: i for i, name in enumerate(label_names)},
    )  # fmt: skip
    plan = plan_for_model(plan, model)
    num_channels = getattr(model.config, "num_channels", 3)
    processor = _image_processor(model, model_args, augmentation, data.mean_std)
    train_ds.set_transform(
        TrainTransform(
            processor,
            crop_padding=augmentation.crop_padding,
            hflip=augmentation.hflip,
            random_resized_crop=augmentation.random_resized_crop,
            randaugment=parse_randaugment(augmentation.randaugment),
            random_erasing=augmentation.random_erasing,
            num_channels=num_channels,
        )
    )
    eval_ds.set_transform(EvalTransform(processor, num_channels))

    batch = training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps
    steps_per_epoch = max(1, math.ceil(len(train_ds) / (batch * training_args.world_size)))
    if augmentation.warmup_epochs is not None:
        training_args.warmup_steps = round(augmentation.warmup_epochs * steps_per_epoch)
        logger.info("%g warmup epochs -> warmup_steps=%d", augmentation.warmup_epochs, training_args.warmup_steps)
    mixer = None
    if augmentation.mixup_alpha > 0 or augmentation.cutmix_alpha > 0:
        mixer = MixupCutmix(
            len(label_names), augmentation.mixup_alpha, augmentation.cutmix_alpha,
            label_smoothing=training_args.label_smoothing_factor,
        )  # fmt: skip
    accuracy = load_metric("accuracy")
    epoch_stats = EpochStatsCallback()
    results: dict = {}
    trainer = ImageClassificationTrainer(
        model=model,
        args=training_args,
        train_dataset=train_ds if training_args.do_train else None,
        eval_dataset=eval_ds,
        data_collator=collate_images,
        processing_class=processor,
        compute_metrics=lambda p: accuracy.compute(predictions=np.argmax(p.predictions, -1), references=p.label_ids),
        callbacks=[epoch_stats, *callbacks],
        mixer=mixer,
        optimizer_plan=plan,
        card_writer=lambda: write_image_model_card(
            training_args.output_dir, results, training_args.hub_model_id if training_args.push_to_hub else None
        ),
    )
    rss_before_training = peak_rss_mib()
    output_dir = Path(training_args.output_dir)
    results.update(
        dataset=data_args.dataset_name or data_args.train_dir,
        hub_dataset=data.hub_id,
        eval_split=data.eval_split,
        num_train=len(train_ds),
        num_eval=len(eval_ds),
        recipe=parsed.recipe.name,
        base_model=card_base_model(model_args.model_name_or_path),
        num_parameters=sum(p.numel() for p in model.parameters()),
        model={
            k: getattr(model.config, k)
            for k in ("model_type", "image_size", "patch_size", "num_channels", "hidden_size", "num_hidden_layers")
            if hasattr(model.config, k)
        },
        hyperparameters={
            "learning rate": describe_schedule(training_args),
            **plan.describe(),
            "batch size": training_args.per_device_train_batch_size * training_args.world_size,
            "label smoothing": training_args.label_smoothing_factor,
            "augmentation": {k: v for k, v in vars(augmentation).items() if k != "warmup_epochs"},
        },
        output_dir=str(output_dir),
    )
    if training_args.do_train:
        train_output, _ = train_and_save(trainer, len(train_ds))
        results.update(
            steps=int(train_output.global_step),
            train_seconds=round(float(train_output.metrics["train_runtime"]), 2),
            peak_rss_mib_before_training=round(rss_before_training, 1),
            epoch_stats=epoch_stats.epochs,
        )
    results["epochs"] = float(trainer.state.epoch or 0)
    if training_args.do_eval:
        prediction = trainer.predict(eval_ds, metric_key_prefix="eval")
        metrics = dict(prediction.metrics, eval_samples=len(eval_ds), epoch=results["epochs"])
        save_metrics(trainer, "eval", metrics)
        matrix = confusion_matrix(prediction.label_ids, prediction.predictions.argmax(-1), len(label_names))
        results.update(
            accuracy=float(metrics["eval_accuracy"]),
            eval_loss=float(metrics["eval_loss"]),
            per_class_accuracy={n: float(matrix[i, i] / max(matrix[i].sum(), 1)) for i, n in enumerate(label_names)},
            # 1000 x 1000 for ImageNet: too big for the JSON; confusion_matrix.csv always has it.
            confusion_matrix=matrix.tolist() if len(label_names) <= 100 else "confusion_matrix.csv",
        )
        if trainer.is_world_process_zero():
            np.savetxt(output_dir / "confusion_matrix.csv", matrix, fmt="%d", delimiter=",")
            title = f"{results['dataset']}: accuracy {results['accuracy']:.4f} on {data.eval_split}"
            plot_confusion_matrix(matrix, label_names, output_dir / "confusion_matrix.png", title=title)
    results["total_seconds"] = round(time.perf_counter() - started, 2)
    finish_run(trainer, results, "Image classification")
    return results


def main(argv: list[str] | None = None) -> dict:
    parsed = parse_args(argv)
    setup_logging(parsed.training_args)
    return train_image_classifier(parsed)


__all__ = [
    "DATACLASSES",
    "AugmentationArguments",
    "ImageClassificationTrainer",
    "ImageDataArguments",
    "ImageModelArguments",
    "main",
    "parse_args",
    "train_image_classifier",
]
