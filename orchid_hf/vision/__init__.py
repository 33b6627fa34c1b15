"""Image classification with Orchid-ViT (Sec. 4.3 and App. C.4) and any other image model, by purpose:

| module | what |
|---|---|
| ``orchid_hf.vision.augment`` | augmentations in plain torch (crop, flip, RandAugment, erasing, Mixup/CutMix), loss |
| ``orchid_hf.vision.data`` | datasets: digits, Hub datasets, image folders, IDX files |
| ``orchid_hf.vision.transforms`` | image processor and the training/evaluation transforms |
| ``orchid_hf.vision.report`` | time and memory per epoch, confusion matrix, model card |
| ``orchid_hf.vision.train`` | the recipe (``scripts/train_image.py``) |

The recipes' values are in :mod:`orchid_hf.recipes`.
"""

from .augment import (
    MixupCutmix,
    RandAugment,
    RandomErasing,
    one_hot_smoothed,
    random_crop_flip,
    random_resized_crop_box,
    soft_target_cross_entropy,
)
from .data import ImageData, decode_image, load_digits_dataset, load_idx_folder, load_image_data, read_idx
from .report import confusion_matrix, plot_confusion_matrix
from .train import ImageClassificationTrainer, main, parse_args, train_image_classifier
from .transforms import EvalTransform, TrainTransform, build_image_processor, collate_images

__all__ = [
    "EvalTransform",
    "ImageClassificationTrainer",
    "ImageData",
    "MixupCutmix",
    "RandAugment",
    "RandomErasing",
    "TrainTransform",
    "build_image_processor",
    "collate_images",
    "confusion_matrix",
    "decode_image",
    "load_digits_dataset",
    "load_idx_folder",
    "load_image_data",
    "main",
    "one_hot_smoothed",
    "parse_args",
    "plot_confusion_matrix",
    "random_crop_flip",
    "random_resized_crop_box",
    "read_idx",
    "soft_target_cross_entropy",
    "train_image_classifier",
]
