"""From stored images to model inputs: the saved image processor (evaluation and pipelines) and the training
transform (the same processing with the recipe's augmentations)."""

from __future__ import annotations

from collections.abc import Sequence

from ..extras import require_extra

require_extra("PIL", "vision")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from transformers import ViTImageProcessorPil  # noqa: E402

from .augment import RandAugment, RandomErasing, random_crop_flip, random_resized_crop_box  # noqa: E402
from .data import decode_image  # noqa: E402

RESAMPLE = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


def image_mode(num_channels: int) -> str:
    """The PIL mode images are decoded to for a model with ``num_channels`` input channels."""
    if num_channels not in (1, 3):
        raise ValueError(f"this recipe feeds grey (1) or RGB (3) images, the model takes {num_channels} channels")
    return "L" if num_channels == 1 else "RGB"


def fit_channels(values: Sequence[float], num_channels: int) -> tuple[float, ...]:
    """Per-channel statistics for ``num_channels``: grey statistics repeated, RGB ones averaged for a grey model."""
    values = tuple(float(v) for v in values)
    if len(values) == num_channels:
        return values
    if len(values) == 1:
        return values * num_channels
    return (float(np.mean(values)),) * num_channels


def build_image_processor(
    image_size: int,
    mean: Sequence[float],
    std: Sequence[float],
    resample: int = Image.Resampling.BILINEAR,
    num_channels: int = 3,
) -> ViTImageProcessorPil:
    """Resize to ``image_size`` squared, scale to [0, 1], normalise. RGB models convert every input to RGB first, so
    grey-scale and RGBA images work in ``pipeline("image-classification")`` too; grey models take grey images."""
    return ViTImageProcessorPil(
        do_resize=True,
        size={"height": image_size, "width": image_size},
        resample=int(resample),
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=list(fit_channels(mean, num_channels)),
        image_std=list(fit_channels(std, num_channels)),
        do_convert_rgb=num_channels == 3,
    )


def parse_randaugment(text: str | None) -> tuple[int, float, float] | None:
    """``"layers,magnitude,std"`` (``"2,9,0.5"``) -> tuple; ``none`` or empty -> None."""
    if text is None or text.lower() in ("none", "off", ""):
        return None
    try:
        layers, magnitude, std = (float(part) for part in text.split(","))
    except ValueError as error:
        raise ValueError(f"--randaugment must be 'layers,magnitude,std' like 2,9,0.5 or none, got {text!r}") from error
    return int(layers), magnitude, std


class TrainTransform:
    """Batch transform for ``Dataset.set_transform``: decode, resize (or random-resized crop), random crop with
    padding and flip, RandAugment, normalise, random erasing. Mixup/CutMix run later, on whole batches, in the
    trainer. Without augmentations it computes exactly what the image processor does."""

    def __init__(
        self,
        processor,
        *,
        crop_padding: int = 0,
        hflip: bool = False,
        random_resized_crop: bool = False,
        randaugment: tuple[int, float, float] | None = None,
        random_erasing: float = 0.0,
        num_channels: int = 3,
    ):
        self.size = processor.size["height"]
        self.resample = processor.resample
        self.mode = image_mode(num_channels)
        self.mean = torch.tensor(processor.image_mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(processor.image_std, dtype=torch.float32).view(-1, 1, 1)
        self.crop_padding, self.hflip, self.random_resized_crop = crop_padding, hflip, random_resized_crop
        self.randaugment = None
        if randaugment is not None:
            layers, magnitude, magnitude_std = randaugment
            fill = tuple(round(255 * m) for m in processor.image_mean)
            self.randaugment = RandAugment(int(layers), magnitude, magnitude_std, fill=fill)
        self.erasing = RandomErasing(random_erasing) if random_erasing > 0 else None

    def image_tensor(self, value) -> torch.Tensor:
        image = decode_image(value, self.mode)
        box = random_resized_crop_box(*image.size) if self.random_resized_crop else None
        if image.size != (self.size, self.size) or box is not None:
            image = image.resize((self.size, self.size), self.resample, box=box)
        pixels = np.array(image, dtype=np.uint8)
        pixels = pixels[:, :, None] if pixels.ndim == 2 else pixels
        return torch.from_numpy(pixels).permute(2, 0, 1).contiguous()

    def __call__(self, batch: dict) -> dict:
        pixel_values = []
        for value in batch["image"]:
            image = random_crop_flip(self.image_tensor(value), self.crop_padding, self.hflip)
            if self.randaugment is not None:
                image = self.randaugment(image)
            image = (image.to(torch.float32) / 255 - self.mean) / self.std
            if self.erasing is not None:
                image = self.erasing(image)
            pixel_values.append(image)
        return {"pixel_values": pixel_values, "labels": batch["label"]}


class EvalTransform:
    """Batch transform for evaluation: exactly what the saved image processor (and so the pipeline) does."""

    def __init__(self, processor, num_channels: int = 3):
        self.processor = processor
        self.mode = image_mode(num_channels)

    def __call__(self, batch: dict) -> dict:
        images = [decode_image(value, self.mode) for value in batch["image"]]
        pixel_values = self.processor(images, return_tensors="pt")["pixel_values"]
        return {"pixel_values": list(pixel_values), "labels": batch["label"]}


def collate_images(examples: list[dict]) -> dict:
    return {
        "pixel_values": torch.stack([e["pixel_values"] for e in examples]),
        "labels": torch.tensor([e["labels"] for e in examples], dtype=torch.long),
    }


__all__ = [
    "RESAMPLE",
    "EvalTransform",
    "TrainTransform",
    "build_image_processor",
    "collate_images",
    "fit_channels",
    "image_mode",
    "parse_randaugment",
]
