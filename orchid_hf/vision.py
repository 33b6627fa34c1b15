"""Image classification with Orchid-ViT (Sec. 4.3 and App. C.4 of the Orchid paper): data, augmentations,
recipes and a Trainer-based training function.

Datasets: ``digits`` (scikit-learn's 8x8 handwritten digits, shipped inside scikit-learn, no network),
``cifar10`` (``uoft-cs/cifar10``), ``imagenet-1k`` (``ILSVRC/imagenet-1k``), any other Hub dataset with an
image and a class-label column, or a local folder with one subfolder per class (``imagefolder``).

Augmentations are small plain-torch versions of the ones in the paper's recipes (random crop and flip for
CIFAR; random resized crop, RandAugment, Mixup/CutMix and random erasing for ImageNet). timm, which the
paper's pipeline uses, requires torchvision, which has no CPU build on our machines; see
``docs/image_classification.md`` for why kornia was not used either.

Every image is converted to RGB (grey-scale images are replicated over three channels), so the saved
``ViTImageProcessorPil`` and the model accept any image ``PIL`` can open.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, UnidentifiedImageError
from transformers import Trainer, TrainerCallback, TrainingArguments, ViTImageProcessorPil, set_seed
from transformers.image_utils import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from transformers.utils import logging

from .modeling import OrchidConfig, OrchidForImageClassification

logger = logging.get_logger(__name__)

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)

# Short names for the Hub datasets of the paper.
HUB_ALIASES = {
    "cifar10": "uoft-cs/cifar10",
    "imagenet-1k": "ILSVRC/imagenet-1k",
    "imagenet": "ILSVRC/imagenet-1k",
}
EVAL_SPLIT_NAMES = ("validation", "valid", "val", "test")


# ---------------------------------------------------------------------------------------------
# Recipes (App. C.4, Table C.3)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageRecipe:
    """Model preset and training settings of one experiment.

    The paper's optimiser is Adam (0.9, 0.999) with weight decay 0.05; we use the decoupled form (AdamW), the
    form the T2T-ViT/DeiT pipelines it follows use with that value: L2 decay of 0.05 folded into Adam's
    gradient would outweigh the loss gradient.
    """

    preset: str
    model_overrides: dict = field(default_factory=dict)
    dataset: str = "digits"
    learning_rate: float = 3e-4
    weight_decay: float = 0.05
    adam_betas: tuple[float, float] = (0.9, 0.999)
    lr_scheduler: str = "constant_with_warmup"
    warmup_steps: int | None = None
    warmup_epochs: float | None = None
    label_smoothing: float = 0.1
    batch_size: int = 512
    epochs: float = 500
    # Augmentation.
    random_resized_crop: bool = False
    crop_padding: int = 0
    hflip: bool = False
    randaugment: tuple[int, float, float] | None = None  # (layers, magnitude, magnitude std)
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    random_erasing: float = 0.0
    resample: int = Image.Resampling.BILINEAR
    eval_fraction: float = 0.1


RECIPES: dict[str, ImageRecipe] = {
    # CIFAR-10: 500 warmup steps, then constant. Patch 4 was tuned over lr 1e-3, 5e-3, 1e-2 (Table C.3).
    "orchid-vit-cifar-s": ImageRecipe(
        preset="orchid-vit-cifar-s", dataset="cifar10", warmup_steps=500, crop_padding=4, hflip=True
    ),
    "orchid-vit-cifar-m": ImageRecipe(
        preset="orchid-vit-cifar-m", dataset="cifar10", warmup_steps=500, crop_padding=4, hflip=True
    ),
    # ImageNet-1K: 10 warmup epochs then cosine; T2T-ViT augmentations (AugMix is not implemented).
    "orchid-vit-imagenet": ImageRecipe(
        preset="orchid-vit-imagenet",
        dataset="imagenet-1k",
        learning_rate=1e-3,
        lr_scheduler="cosine",
        warmup_epochs=10,
        batch_size=1024,
        epochs=300,
        random_resized_crop=True,
        hflip=True,
        randaugment=(2, 9.0, 0.5),
        mixup_alpha=0.8,
        cutmix_alpha=1.0,
        random_erasing=0.25,
        resample=Image.Resampling.BICUBIC,
    ),
    # The embedded default: a 3-layer, width-64 Orchid-ViT on 8x8 digits with one pixel per patch (64 tokens).
    # One-pixel shifts are the only augmentation: flipped digits are different digits.
    "orchid-vit-digits": ImageRecipe(
        preset="orchid-vit-cifar-s",
        model_overrides=dict(
            image_size=8, patch_size=1, hidden_size=64, num_hidden_layers=3, intermediate_size=128
        ),
        dataset="digits",
        learning_rate=2e-3,
        lr_scheduler="cosine",
        warmup_epochs=2,
        batch_size=64,
        epochs=25,
        crop_padding=1,
        eval_fraction=0.2,
    ),
}
DEFAULT_RECIPE_FOR_DATASET = {
    "digits": "orchid-vit-digits",
    "uoft-cs/cifar10": "orchid-vit-cifar-s",
    "ILSVRC/imagenet-1k": "orchid-vit-imagenet",
}


# ---------------------------------------------------------------------------------------------
# Augmentations (plain torch)
# ---------------------------------------------------------------------------------------------


def _uniform(low: float, high: float) -> float:
    return low + (high - low) * torch.rand(()).item()


def _randint(high: int) -> int:
    """A random integer in [0, high)."""
    return int(torch.randint(high, ()).item())


def random_resized_crop_box(
    width: int, height: int, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)
) -> tuple[int, int, int, int]:
    """The (left, top, right, bottom) box of Inception's random-resized crop (as torchvision draws it)."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * _uniform(*scale)
        aspect = math.exp(_uniform(*log_ratio))
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            top, left = _randint(height - h + 1), _randint(width - w + 1)
            return left, top, left + w, top + h
    # Fallback: the largest centred crop with an aspect ratio inside `ratio`.
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        w, h = round(height * ratio[1]), height
    else:
        w, h = width, height
    left, top = (width - w) // 2, (height - h) // 2
    return left, top, left + w, top + h


def random_crop_flip(image: torch.Tensor, padding: int = 0, hflip: bool = False) -> torch.Tensor:
    """Zero-pad by ``padding`` pixels, crop back to the original size at a random offset, then flip
    horizontally with probability 1/2. ``image``: (channels, height, width)."""
    if padding > 0:
        height, width = image.shape[-2:]
        padded = F.pad(image, (padding, padding, padding, padding))
        top, left = _randint(2 * padding + 1), _randint(2 * padding + 1)
        image = padded[..., top : top + height, left : left + width]
    if hflip and torch.rand(()) < 0.5:
        image = image.flip(-1)
    return image


def _grayscale(image: torch.Tensor) -> torch.Tensor:
    """ITU-R 601-2 luma (PIL's "L" conversion) of a float (3, H, W) image, shape (1, H, W)."""
    if image.shape[0] == 1:
        return image
    r, g, b = image[0], image[1], image[2]
    return (0.299 * r + 0.587 * g + 0.114 * b).unsqueeze(0)


def _blend(degenerate: torch.Tensor, image: torch.Tensor, factor: float) -> torch.Tensor:
    """PIL's ImageEnhance: ``degenerate + factor * (image - degenerate)``, clipped to [0, 255]."""
    return (degenerate + factor * (image - degenerate)).clamp(0, 255)


def _affine(image: torch.Tensor, theta: Sequence[Sequence[float]], fill: torch.Tensor) -> torch.Tensor:
    """Resample a square image with an affine map given in normalised [-1, 1] coordinates (output -> input);
    pixels that come from outside the image get ``fill``."""
    matrix = torch.tensor(theta, dtype=image.dtype).unsqueeze(0)
    grid = F.affine_grid(matrix, [1, *image.shape], align_corners=False)
    with_mask = torch.cat([image, torch.ones_like(image[:1])]).unsqueeze(0)
    warped = F.grid_sample(with_mask, grid, mode="bilinear", padding_mode="zeros", align_corners=False)[0]
    inside = warped[-1:]
    return warped[:-1] + (1 - inside) * fill.view(-1, 1, 1)


def _equalize(image: torch.Tensor) -> torch.Tensor:
    """Per-channel histogram equalisation with PIL's look-up table (ImageOps.equalize)."""
    out = []
    for channel in image.round().long():
        hist = torch.bincount(channel.flatten(), minlength=256).to(torch.float64)
        nonzero = hist[hist > 0]
        step = torch.div(nonzero[:-1].sum(), 255, rounding_mode="floor")
        if step == 0:
            out.append(channel.to(image.dtype))
            continue
        lut = torch.div(
            torch.cumsum(hist, 0) + torch.div(step, 2, rounding_mode="floor"), step, rounding_mode="floor"
        )
        lut = F.pad(lut, (1, 0))[:-1].clamp(0, 255)
        out.append(lut[channel].to(image.dtype))
    return torch.stack(out)


def _sharpness(image: torch.Tensor, factor: float) -> torch.Tensor:
    """PIL's ImageEnhance.Sharpness: blend with the SMOOTH-filtered image; borders stay as they are."""
    kernel = torch.tensor([[1.0, 1.0, 1.0], [1.0, 5.0, 1.0], [1.0, 1.0, 1.0]], dtype=image.dtype) / 13
    channels = image.shape[0]
    smooth = F.conv2d(image.unsqueeze(0), kernel.expand(channels, 1, 3, 3), groups=channels)[0]
    degenerate = image.clone()
    degenerate[:, 1:-1, 1:-1] = smooth
    return _blend(degenerate, image, factor)


def _signed(value: float) -> float:
    return value if torch.rand(()) < 0.5 else -value


class RandAugment:
    """RandAugment as in timm's ``rand-m{magnitude}-mstd{std}-inc1`` (the T2T-ViT pipeline the paper uses),
    on uint8 (channels, H, W) tensors of square images.

    Each call applies ``num_layers`` operations drawn with replacement from the 15 below, each with probability
    ``prob``, at a magnitude drawn from N(magnitude, magnitude_std) and clipped to [0, 10]. The magnitude maps
    to a strength as in timm's "increasing" variants (a larger magnitude is always a stronger change).
    """

    OPS = (
        "AutoContrast",
        "Equalize",
        "Invert",
        "Rotate",
        "Posterize",
        "Solarize",
        "SolarizeAdd",
        "Color",
        "Contrast",
        "Brightness",
        "Sharpness",
        "ShearX",
        "ShearY",
        "TranslateX",
        "TranslateY",
    )
    MAX_MAGNITUDE = 10.0

    def __init__(
        self,
        num_layers: int = 2,
        magnitude: float = 9.0,
        magnitude_std: float = 0.5,
        prob: float = 0.5,
        fill: Sequence[float] = (124, 116, 104),
        ops: Sequence[str] | None = None,
    ):
        if num_layers < 0 or not 0 <= magnitude <= self.MAX_MAGNITUDE or magnitude_std < 0:
            raise ValueError(
                f"RandAugment needs num_layers >= 0, 0 <= magnitude <= {self.MAX_MAGNITUDE} and magnitude_std >= 0, "
                f"got {num_layers}, {magnitude}, {magnitude_std}"
            )
        unknown = set(ops or ()) - set(self.OPS)
        if unknown:
            raise ValueError(f"unknown RandAugment operations {sorted(unknown)}; available: {self.OPS}")
        self.num_layers, self.prob = num_layers, prob
        self.magnitude, self.magnitude_std = magnitude, magnitude_std
        self.fill = torch.tensor(fill, dtype=torch.float32)
        self.ops = tuple(ops or self.OPS)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        x = image.to(torch.float32)
        for _ in range(self.num_layers):
            op = self.ops[_randint(len(self.ops))]
            if torch.rand(()) >= self.prob:
                continue
            magnitude = self.magnitude
            if self.magnitude_std > 0:
                magnitude = magnitude + self.magnitude_std * torch.randn(()).item()
            x = self.apply(op, x, min(max(magnitude, 0.0), self.MAX_MAGNITUDE))
        return x.round().clamp(0, 255).to(torch.uint8)

    def apply(self, op: str, x: torch.Tensor, magnitude: float) -> torch.Tensor:
        """One operation on a float image with values in [0, 255]."""
        level = magnitude / self.MAX_MAGNITUDE
        fill = self.fill[: x.shape[0]] if x.shape[0] <= len(self.fill) else self.fill[:1].expand(x.shape[0])
        if op == "AutoContrast":
            low = x.amin(dim=(1, 2), keepdim=True)
            high = x.amax(dim=(1, 2), keepdim=True)
            scale = torch.where(high > low, 255.0 / (high - low).clamp_min(1e-6), torch.ones_like(high))
            return torch.where(high > low, ((x - low) * scale).clamp(0, 255), x)
        if op == "Equalize":
            return _equalize(x)
        if op == "Invert":
            return 255.0 - x
        if op == "Rotate":
            angle = math.radians(_signed(30.0 * level))
            cos, sin = math.cos(angle), math.sin(angle)
            return _affine(x, [[cos, -sin, 0.0], [sin, cos, 0.0]], fill)
        if op == "Posterize":
            shift = 8 - (4 - int(level * 4))  # keep 4 bits at magnitude 0, none at 10
            return ((x.round().to(torch.int64) >> shift) << shift).to(x.dtype)
        if op == "Solarize":
            threshold = 256 - int(level * 256)
            return torch.where(x >= threshold, 255.0 - x, x)
        if op == "SolarizeAdd":
            return torch.where(x < 128, (x + int(level * 110)).clamp(max=255), x)
        if op in ("Color", "Contrast", "Brightness", "Sharpness"):
            factor = 1.0 + _signed(0.9 * level)
            if op == "Color":
                return _blend(_grayscale(x).expand_as(x), x, factor)
            if op == "Contrast":
                return _blend(_grayscale(x).mean().round().expand_as(x), x, factor)
            if op == "Brightness":
                return _blend(torch.zeros_like(x), x, factor)
            return _sharpness(x, factor)
        if op in ("ShearX", "ShearY"):
            shear = _signed(0.3 * level)
            theta = (
                [[1.0, shear, 0.0], [0.0, 1.0, 0.0]]
                if op == "ShearX"
                else [[1.0, 0.0, 0.0], [shear, 1.0, 0.0]]
            )
            return _affine(x, theta, fill)
        if op in ("TranslateX", "TranslateY"):
            shift = 2 * _signed(0.45 * level)  # a fraction of the image size, in [-1, 1] coordinates
            theta = (
                [[1.0, 0.0, shift], [0.0, 1.0, 0.0]]
                if op == "TranslateX"
                else [[1.0, 0.0, 0.0], [0.0, 1.0, shift]]
            )
            return _affine(x, theta, fill)
        raise ValueError(f"unknown RandAugment operation {op!r}")


class RandomErasing:
    """Random erasing (Zhong et al.) as timm's ``RandomErasing(mode="pixel")``: with probability ``prob``, one
    rectangle covering a fraction ``area`` of the image, with aspect ratio in ``aspect``, is replaced with
    per-pixel N(0, 1) noise. Applied to normalised (channels, H, W) images."""

    def __init__(self, prob: float = 0.25, area=(0.02, 1 / 3), aspect=(0.3, 1 / 0.3), max_attempts: int = 10):
        if not 0 <= prob <= 1 or not 0 < area[0] <= area[1] <= 1:
            raise ValueError(
                f"RandomErasing needs 0 <= prob <= 1 and 0 < area[0] <= area[1] <= 1, got {prob}, {area}"
            )
        self.prob, self.area, self.max_attempts = prob, area, max_attempts
        self.log_aspect = (math.log(aspect[0]), math.log(aspect[1]))

    def sample_box(self, height: int, width: int) -> tuple[int, int, int, int] | None:
        """(top, left, box height, box width), or None when no box fits in ``max_attempts`` draws."""
        for _ in range(self.max_attempts):
            target = height * width * _uniform(*self.area)
            aspect = math.exp(_uniform(*self.log_aspect))
            h, w = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
            if 0 < h < height and 0 < w < width:
                return _randint(height - h + 1), _randint(width - w + 1), h, w
        return None

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        if self.prob == 0 or torch.rand(()) >= self.prob:
            return image
        box = self.sample_box(*image.shape[-2:])
        if box is None:
            return image
        top, left, h, w = box
        image = image.clone()
        image[:, top : top + h, left : left + w] = torch.randn(image.shape[0], h, w, dtype=image.dtype)
        return image


def one_hot_smoothed(labels: torch.Tensor, num_classes: int, smoothing: float = 0.0) -> torch.Tensor:
    """One-hot targets with ``smoothing`` spread uniformly over all classes (rows sum to 1)."""
    off = smoothing / num_classes
    targets = torch.full((labels.shape[0], num_classes), off, device=labels.device)
    return targets.scatter_(1, labels.view(-1, 1), 1.0 - smoothing + off)


class MixupCutmix:
    """Batch-wise Mixup (Zhang et al.) and CutMix (Yun et al.) as timm's ``Mixup(mode="batch")``.

    Each batch is mixed with its reverse. With both alphas > 0, CutMix is chosen with probability
    ``switch_prob``; the mixing weight is drawn from Beta(alpha, alpha) (CutMix corrects it to the pasted
    box's exact area). Returns the mixed images and soft targets (label-smoothed, rows sum to 1).
    """

    def __init__(
        self,
        num_classes: int,
        mixup_alpha: float = 0.8,
        cutmix_alpha: float = 1.0,
        prob: float = 1.0,
        switch_prob: float = 0.5,
        label_smoothing: float = 0.1,
    ):
        if mixup_alpha < 0 or cutmix_alpha < 0 or mixup_alpha + cutmix_alpha == 0:
            raise ValueError(
                f"MixupCutmix needs alphas >= 0, not both 0, got mixup_alpha={mixup_alpha}, cutmix_alpha={cutmix_alpha}"
            )
        self.num_classes, self.mixup_alpha, self.cutmix_alpha = num_classes, mixup_alpha, cutmix_alpha
        self.prob, self.switch_prob, self.label_smoothing = prob, switch_prob, label_smoothing

    def cutmix_box(self, height: int, width: int, lam: float) -> tuple[int, int, int, int]:
        """(top, bottom, left, right) of a box of area about (1 - lam) of the image, clipped to it."""
        ratio = math.sqrt(1 - lam)
        cut_h, cut_w = int(height * ratio), int(width * ratio)
        cy, cx = _randint(height), _randint(width)
        top, bottom = min(max(cy - cut_h // 2, 0), height), min(max(cy + cut_h // 2, 0), height)
        left, right = min(max(cx - cut_w // 2, 0), width), min(max(cx + cut_w // 2, 0), width)
        return top, bottom, left, right

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lam = 1.0
        if torch.rand(()) < self.prob:
            use_cutmix = self.mixup_alpha == 0 or (
                self.cutmix_alpha > 0 and torch.rand(()) < self.switch_prob
            )
            alpha = self.cutmix_alpha if use_cutmix else self.mixup_alpha
            lam = float(torch.distributions.Beta(alpha, alpha).sample())
            partner = images.flip(0)
            if use_cutmix:
                height, width = images.shape[-2:]
                top, bottom, left, right = self.cutmix_box(height, width, lam)
                images = images.clone()
                images[..., top:bottom, left:right] = partner[..., top:bottom, left:right]
                lam = 1.0 - (bottom - top) * (right - left) / (height * width)
            else:
                images = images * lam + partner * (1.0 - lam)
        targets = one_hot_smoothed(labels, self.num_classes, self.label_smoothing)
        targets = targets * lam + targets.flip(0) * (1.0 - lam)
        return images, targets


def soft_target_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, label_smoothing: float = 0.0
) -> torch.Tensor:
    """Cross-entropy against class ids (with label smoothing) or against soft targets (already smoothed)."""
    if targets.dim() == 1:
        return F.cross_entropy(logits.float(), targets, label_smoothing=label_smoothing)
    return -(targets * F.log_softmax(logits.float(), dim=-1)).sum(-1).mean()


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def decode_image(value, mode: str = "RGB") -> Image.Image:
    """A PIL image, in ``mode``, from a PIL image or a datasets ``{"bytes", "path"}`` record; a file that cannot
    be decoded raises ValueError naming it."""
    if isinstance(value, Image.Image):
        return value.convert(mode)
    path, data = value.get("path"), value.get("bytes")
    source = path if data is None else io.BytesIO(data)
    where = repr(path) if path else f"given as {len(data or b'')} bytes"
    try:
        with Image.open(source) as image:
            image.load()
            return image.convert(mode)
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as error:
        raise ValueError(f"cannot read image {where}: {error}") from error


def image_files(folder: str | os.PathLike) -> list[Path]:
    from datasets.packaged_modules.imagefolder.imagefolder import ImageFolder

    extensions = {ext.lower() for ext in ImageFolder.EXTENSIONS}
    return sorted(p for p in Path(folder).rglob("*") if p.is_file() and p.suffix.lower() in extensions)


def verify_images(paths: Sequence[str | os.PathLike], folder: str, max_listed: int = 5) -> None:
    """Opens every file and checks it (PIL ``verify``); raises ValueError listing the unreadable ones."""
    from tqdm.auto import tqdm

    bad = []
    for path in tqdm(paths, desc="checking images", disable=len(paths) < 5000):
        try:
            with Image.open(path) as image:
                image.verify()
        except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as error:
            bad.append(f"{path} ({error})")
    if bad:
        listed = "; ".join(bad[:max_listed]) + (
            f"; and {len(bad) - max_listed} more" if len(bad) > max_listed else ""
        )
        raise ValueError(
            f"{len(bad)} of {len(paths)} images in {folder} cannot be read: {listed}. Remove or replace them "
            "(or pass --verify_images False to skip this check and fail on the first unreadable image in training)"
        )


def load_digits_dataset(split_seed: int = 0, eval_fraction: float = 0.2):
    """scikit-learn's 1797 handwritten digits (8x8, 17 grey levels) as a DatasetDict with a stratified
    held-out split: ``train`` and ``test`` with columns ``image`` (grey-scale PIL) and ``label``."""
    import datasets
    from sklearn.datasets import load_digits

    digits = load_digits()
    pixels = np.round(digits.images * (255 / 16)).astype(np.uint8)
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=[str(d) for d in range(10)])}
    )
    dataset = datasets.Dataset.from_dict(
        {"image": [Image.fromarray(p, mode="L") for p in pixels], "label": digits.target.tolist()},
        features=features,
    )
    return dataset.train_test_split(test_size=eval_fraction, seed=split_seed, stratify_by_column="label")


def _hub_offline() -> bool:
    from huggingface_hub import constants

    # The constant is read once at import; the variable may have been set since.
    from_env = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    return bool(constants.HF_HUB_OFFLINE) or from_env


def load_image_dataset(
    name_or_path: str,
    cache_dir: str | None = None,
    eval_fraction: float = 0.1,
    split_seed: int = 0,
    verify: bool = True,
):
    """``(train, eval, eval_split_name)``: two datasets with columns ``image`` (not decoded: ``{"bytes", "path"}``)
    and ``label`` (a ClassLabel).

    ``name_or_path``: ``digits``; a local folder with one subfolder per class (and optionally ``train/``,
    ``test/`` or ``validation/`` split folders above them); or a Hub dataset (``cifar10``, ``imagenet-1k`` or
    ``owner/name``). Without an evaluation split, a stratified ``eval_fraction`` of the training set is held out.
    """
    import datasets

    if name_or_path == "digits":
        splits = load_digits_dataset(split_seed, eval_fraction)
        train, evaluation, eval_name = splits["train"], splits["test"], "test (held out)"
    else:
        if Path(name_or_path).is_dir():
            splits = _load_image_folder(name_or_path, cache_dir, verify)
        elif Path(name_or_path).exists():
            raise ValueError(
                f"--dataset {name_or_path!r} is a file; pass a folder with one subfolder per class"
            )
        elif name_or_path in HUB_ALIASES or re.fullmatch(r"[\w.-]+/[\w.-]+", name_or_path):
            splits = _load_hub_dataset(HUB_ALIASES.get(name_or_path, name_or_path), cache_dir)
        else:
            raise ValueError(
                f"--dataset {name_or_path!r} is neither an existing folder nor a known dataset; pass digits, "
                "cifar10, imagenet-1k, a Hub name like owner/name, or a folder of images with one subfolder per class"
            )
        splits = _standard_columns(splits, name_or_path)
        eval_name = next((s for s in EVAL_SPLIT_NAMES if s in splits and _has_labels(splits[s])), None)
        train = splits["train"]
        if eval_name is None:
            train, evaluation = _hold_out(train, eval_fraction, split_seed, name_or_path)
            eval_name = "test (held out)"
        else:
            evaluation = splits[eval_name]
    train = train.cast_column("image", datasets.Image(decode=False))
    evaluation = evaluation.cast_column("image", datasets.Image(decode=False))
    return train, evaluation, eval_name


def _hold_out(train, eval_fraction: float, seed: int, name: str):
    """A stratified held-out split with at least one image per class on each side."""
    num_classes = train.features["label"].num_classes
    held = max(math.ceil(eval_fraction * len(train)), num_classes) if eval_fraction > 0 else 0
    if held == 0 or len(train) - held < num_classes:
        raise ValueError(
            f"{name} has no evaluation split, and its {len(train)} images cannot be split with eval_fraction="
            f"{eval_fraction} into held-out and training sets that each have all {num_classes} classes; add "
            "images, pass --eval_fraction, or provide train/ and test/ folders"
        )
    split = train.train_test_split(test_size=held, seed=seed, stratify_by_column="label")
    return split["train"], split["test"]


def _load_image_folder(folder: str, cache_dir: str | None, verify: bool):
    import datasets

    files = image_files(folder)
    if not files:
        others = sum(1 for p in Path(folder).rglob("*") if p.is_file())
        raise ValueError(
            f"image folder {folder} contains no images (searched all subfolders; {others} other files found). "
            f"Expected one subfolder per class, e.g. {folder}/cat/1.png, {folder}/dog/2.jpg"
        )
    if verify:
        verify_images(files, folder)
    splits = datasets.load_dataset("imagefolder", data_dir=folder, cache_dir=cache_dir)
    if "label" not in splits["train"].features:
        raise ValueError(
            f"image folder {folder}: found {len(files)} images but no class subfolders; put each class's images "
            "in its own subfolder (the subfolder name is the label)"
        )
    return splits


def _load_hub_dataset(name: str, cache_dir: str | None):
    if _hub_offline():
        raise ConnectionError(
            f"dataset {name!r} is on the Hugging Face Hub, but HF_HUB_OFFLINE=1 is set, so it cannot be downloaded. "
            "Pass an image folder instead, --dataset /path/to/folder (one subfolder per class, optionally inside "
            "train/ and test/ folders), or use --dataset digits, which ships with scikit-learn"
        )
    import datasets

    return datasets.load_dataset(name, cache_dir=cache_dir)


def _standard_columns(splits, name: str):
    """Renames the image column to ``image`` and the class column to ``label``; checks that there is one."""
    import datasets

    features = splits["train"].features
    image_column = next((k for k, v in features.items() if isinstance(v, datasets.Image)), None)
    label_columns = [k for k, v in features.items() if isinstance(v, datasets.ClassLabel)]
    label_column = next((k for k in ("label", "labels", "fine_label") if k in label_columns), None)
    label_column = label_column or (label_columns[0] if label_columns else None)
    if image_column is None or label_column is None:
        raise ValueError(
            f"dataset {name}: need an image column and a class-label column, found {dict(features)}"
        )
    num_classes = features[label_column].num_classes
    if num_classes < 2:
        raise ValueError(
            f"dataset {name}: found {num_classes} class ({features[label_column].names}); need at least 2"
        )
    keep = {image_column: "image", label_column: "label"}
    splits = splits.select_columns(list(keep))
    return splits.rename_columns({k: v for k, v in keep.items() if k != v})


def _has_labels(split) -> bool:
    """False for splits whose labels are all -1 (ImageNet's test set)."""
    labels = split.select(range(min(len(split), 1000)))["label"]
    return len(split) > 0 and any(label >= 0 for label in labels)


# ---------------------------------------------------------------------------------------------
# Transforms
# ---------------------------------------------------------------------------------------------


def build_image_processor(
    image_size: int, mean: Sequence[float], std: Sequence[float], resample: int = Image.Resampling.BILINEAR
) -> ViTImageProcessorPil:
    """Resize to ``image_size`` squared, scale to [0, 1], normalise; RGB conversion first, so grey-scale and
    RGBA inputs work in ``pipeline("image-classification")`` too."""
    return ViTImageProcessorPil(
        do_resize=True,
        size={"height": image_size, "width": image_size},
        resample=int(resample),
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=list(mean),
        image_std=list(std),
        do_convert_rgb=True,
    )


def dataset_mean_std(name: str, train) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel normalisation: the digits' own grey-level statistics, CIFAR-10's, or ImageNet's."""
    if name == "digits":
        pixels = np.stack([np.asarray(decode_image(v, "L"), dtype=np.float64) / 255 for v in train["image"]])
        return (float(pixels.mean()),) * 3, (float(pixels.std()),) * 3
    if HUB_ALIASES.get(name, name) == "uoft-cs/cifar10":
        return CIFAR10_MEAN, CIFAR10_STD
    return tuple(IMAGENET_DEFAULT_MEAN), tuple(IMAGENET_DEFAULT_STD)


class TrainTransform:
    """Batch transform for ``Dataset.set_transform``: decode, RGB, resize (or random-resized crop), random crop
    with padding and flip, RandAugment, normalise, random erasing. Mixup/CutMix run later, on whole batches,
    in :class:`ImageClassificationTrainer`."""

    def __init__(self, processor: ViTImageProcessorPil, recipe: ImageRecipe):
        self.size = processor.size["height"]
        self.resample = processor.resample
        self.mean = torch.tensor(processor.image_mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(processor.image_std, dtype=torch.float32).view(-1, 1, 1)
        self.recipe = recipe
        self.randaugment = None
        if recipe.randaugment is not None:
            layers, magnitude, magnitude_std = recipe.randaugment
            fill = tuple(round(255 * m) for m in processor.image_mean)
            self.randaugment = RandAugment(int(layers), magnitude, magnitude_std, fill=fill)
        self.erasing = RandomErasing(recipe.random_erasing) if recipe.random_erasing > 0 else None

    def image_tensor(self, value) -> torch.Tensor:
        image = decode_image(value)
        box = random_resized_crop_box(*image.size) if self.recipe.random_resized_crop else None
        if image.size != (self.size, self.size) or box is not None:
            image = image.resize((self.size, self.size), self.resample, box=box)
        return torch.from_numpy(np.array(image, dtype=np.uint8)).permute(2, 0, 1).contiguous()

    def __call__(self, batch: dict) -> dict:
        pixel_values = []
        for value in batch["image"]:
            image = random_crop_flip(self.image_tensor(value), self.recipe.crop_padding, self.recipe.hflip)
            if self.randaugment is not None:
                image = self.randaugment(image)
            image = (image.to(torch.float32) / 255 - self.mean) / self.std
            if self.erasing is not None:
                image = self.erasing(image)
            pixel_values.append(image)
        return {"pixel_values": pixel_values, "labels": batch["label"]}


class EvalTransform:
    """Batch transform for evaluation: exactly what the saved image processor (and so the pipeline) does."""

    def __init__(self, processor: ViTImageProcessorPil):
        self.processor = processor

    def __call__(self, batch: dict) -> dict:
        images = [decode_image(value) for value in batch["image"]]
        pixel_values = self.processor(images, return_tensors="pt")["pixel_values"]
        return {"pixel_values": list(pixel_values), "labels": batch["label"]}


def collate_images(examples: list[dict]) -> dict:
    return {
        "pixel_values": torch.stack([e["pixel_values"] for e in examples]),
        "labels": torch.tensor([e["labels"] for e in examples], dtype=torch.long),
    }


# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------


def load_classifier_checkpoint(
    path: str, label_names: Sequence[str], reinit_head: bool = False, resuming: bool = False
) -> OrchidForImageClassification:
    """An Orchid image classifier from a saved folder, checked against the dataset's classes.

    A different number of classes is an error unless ``reinit_head`` (then the classifier is re-initialised
    for the new classes); when ``resuming`` an interrupted run, the head must match.
    """
    if not (Path(path) / "config.json").is_file():
        raise ValueError(
            f"checkpoint {path} has no config.json; pass a folder written by save_pretrained or Trainer"
        )
    config = OrchidConfig.from_pretrained(path)
    if not config.is_vision:
        raise ValueError(
            f"checkpoint {path} is a text model (image_size is not set); an image classifier is needed"
        )
    if config.num_channels != 3:
        raise ValueError(
            f"checkpoint {path} takes {config.num_channels}-channel images; this recipe feeds RGB (3)"
        )
    labels = {
        "num_labels": len(label_names),
        "id2label": dict(enumerate(label_names)),
        "label2id": {name: i for i, name in enumerate(label_names)},
    }
    if config.num_labels != len(label_names):
        if resuming or not reinit_head:
            hint = (
                "a resumed run must keep its classifier; start a new run with --init_from and --reinit_head"
                if resuming
                else "pass --reinit_head to replace the classifier with a new one for these classes"
            )
            raise ValueError(
                f"checkpoint {path} classifies {config.num_labels} labels, the dataset has {len(label_names)} "
                f"classes ({', '.join(map(str, label_names[:10]))}{', ...' if len(label_names) > 10 else ''}); {hint}"
            )
        logger.warning(
            f"re-initialising the classifier of {path}: {config.num_labels} -> {len(label_names)} labels"
        )
        return OrchidForImageClassification.from_pretrained(path, ignore_mismatched_sizes=True, **labels)
    if [config.id2label[i] for i in range(config.num_labels)] != list(label_names):
        logger.warning(
            f"checkpoint {path} has label names {config.id2label}; using the dataset's {label_names}"
        )
    return OrchidForImageClassification.from_pretrained(path, **labels)


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------


@dataclass
class ImageTrainingConfig:
    """Options of ``scripts/train_image.py``. ``None`` means: the recipe's value."""

    dataset: str | None = field(
        default=None,
        metadata={
            "help": "digits (embedded), cifar10, imagenet-1k, a Hub name owner/name, or a folder "
            "with one subfolder per class; default: the preset's dataset, or digits"
        },
    )
    preset: str | None = field(
        default=None, metadata={"help": f"recipe: {', '.join(RECIPES)}; default: the dataset's recipe"}
    )
    output_dir: str | None = field(default=None, metadata={"help": "default: outputs/<preset>"})
    image_size: int | None = field(default=None, metadata={"help": "model input size (images are resized)"})
    patch_size: int | None = field(default=None, metadata={"help": "4, 2 or 1 on CIFAR (Table 4.5)"})
    hidden_size: int | None = None
    num_hidden_layers: int | None = None
    epochs: float | None = None
    max_steps: int = field(default=-1, metadata={"help": "stop after this many steps (overrides epochs)"})
    batch_size: int | None = None
    learning_rate: float | None = None
    weight_decay: float | None = None
    lr_scheduler: str | None = field(
        default=None, metadata={"help": "constant_with_warmup, cosine, linear, ..."}
    )
    warmup_steps: int | None = None
    warmup_epochs: float | None = None
    label_smoothing: float | None = None
    crop_padding: int | None = None
    hflip: bool | None = None
    randaugment: str | None = field(
        default=None, metadata={"help": "'layers,magnitude,std' (e.g. 2,9,0.5) or none"}
    )
    mixup_alpha: float | None = None
    cutmix_alpha: float | None = None
    random_erasing: float | None = None
    eval_fraction: float | None = field(
        default=None, metadata={"help": "held-out share when there is no eval split"}
    )
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    init_from: str | None = field(default=None, metadata={"help": "start from this saved model's weights"})
    reinit_head: bool = field(
        default=False, metadata={"help": "with --init_from: new classifier for other classes"}
    )
    resume_from: str | None = field(
        default=None, metadata={"help": "resume this Trainer checkpoint-N folder"}
    )
    seed: int = 42
    split_seed: int = field(
        default=0, metadata={"help": "seed of the held-out split, kept apart from --seed"}
    )
    num_workers: int = 0
    threads: int | None = field(default=None, metadata={"help": "torch.set_num_threads"})
    use_cpu: bool = False
    bf16: bool = False
    save_strategy: str = field(
        default="epoch", metadata={"help": "epoch, steps or no (checkpoints for --resume_from)"}
    )
    eval_each_epoch: bool = True
    logging_steps: int = field(default=0, metadata={"help": "0: log once per epoch"})
    verify_images: bool = field(
        default=True, metadata={"help": "open every image of a folder before training"}
    )
    cache_dir: str | None = None
    disable_tqdm: bool = False

    def dataset_name(self) -> str:
        """``dataset``, or the preset's own dataset, or the embedded digits."""
        return self.dataset or (RECIPES[self.preset].dataset if self.preset in RECIPES else "digits")

    def recipe_name(self) -> str:
        """``preset``, or the recipe of the dataset (a folder or another Hub dataset gets orchid-vit-cifar-s)."""
        dataset = HUB_ALIASES.get(self.dataset_name(), self.dataset_name())
        return self.preset or DEFAULT_RECIPE_FOR_DATASET.get(dataset, "orchid-vit-cifar-s")

    def recipe(self) -> ImageRecipe:
        """The recipe with this config's overrides applied."""
        name = self.recipe_name()
        if name not in RECIPES:
            raise ValueError(f"unknown preset {name!r}; available: {', '.join(RECIPES)}")
        recipe = RECIPES[name]
        overrides = {}
        for f in fields(ImageRecipe):
            value = getattr(self, f.name, None)
            if value is not None and f.name not in ("preset", "model_overrides", "dataset", "randaugment"):
                overrides[f.name] = value
        if self.warmup_steps is not None:
            overrides["warmup_epochs"] = None
        elif self.warmup_epochs is not None:
            overrides["warmup_steps"] = None
        if self.randaugment is not None:
            overrides["randaugment"] = _parse_randaugment(self.randaugment)
        model_overrides = {
            k: getattr(self, k) for k in ("image_size", "patch_size", "hidden_size", "num_hidden_layers")
        }
        model_overrides = {k: v for k, v in model_overrides.items() if v is not None}
        if model_overrides and (self.init_from or self.resume_from):
            raise ValueError(
                f"{', '.join('--' + k for k in model_overrides)} cannot change the architecture of a saved model "
                f"({self.init_from or self.resume_from}); drop them"
            )
        overrides["model_overrides"] = {**recipe.model_overrides, **model_overrides}
        return ImageRecipe(**{**asdict(recipe), **overrides})


def _parse_randaugment(text: str) -> tuple[int, float, float] | None:
    if text.lower() in ("none", "off", ""):
        return None
    try:
        layers, magnitude, std = (float(part) for part in text.split(","))
    except ValueError as error:
        raise ValueError(
            f"--randaugment must be 'layers,magnitude,std' like 2,9,0.5 or none, got {text!r}"
        ) from error
    return int(layers), magnitude, std


class ImageClassificationTrainer(Trainer):
    """Trainer whose loss is cross-entropy with label smoothing, or against Mixup/CutMix soft targets; the
    batch is mixed here, in training only, so evaluation sees the images as they are."""

    def __init__(self, *args, mixer: MixupCutmix | None = None, label_smoothing: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.mixer = mixer
        self.label_smoothing = label_smoothing

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs = dict(inputs)
        targets = inputs.pop("labels")
        pixel_values = inputs["pixel_values"]
        if model.training and self.mixer is not None:
            pixel_values, targets = self.mixer(pixel_values, targets)
        outputs = model(pixel_values=pixel_values)
        loss = soft_target_cross_entropy(outputs.logits, targets, self.label_smoothing)
        return (loss, outputs) if return_outputs else loss


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far (Linux reports KiB, macOS bytes); NaN on Windows."""
    try:
        import resource
    except ImportError:
        return float("nan")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if os.uname().sysname == "Darwin" else peak / 1024


class EpochStatsCallback(TrainerCallback):
    """Wall time (without evaluation), steps and peak memory of every epoch."""

    def __init__(self):
        self.epochs: list[dict] = []

    def on_epoch_begin(self, args, state, control, **kwargs):
        self._start, self._step = time.perf_counter(), state.global_step
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()

    def on_epoch_end(self, args, state, control, **kwargs):
        stats = {
            "epoch": round(state.epoch, 3),
            "seconds": round(time.perf_counter() - self._start, 2),
            "steps": state.global_step - self._step,
            "peak_rss_mib": round(peak_rss_mib(), 1),
        }
        if torch.cuda.is_available():
            stats["peak_cuda_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        self.epochs.append(stats)


def plot_confusion_matrix(
    matrix: np.ndarray, label_names: Sequence[str], path: str | os.PathLike, title: str = ""
):
    """A confusion-matrix PNG (rows: true class, columns: predicted), drawn without pyplot's global state."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n = len(label_names)
    side = min(max(4.0, 0.45 * n + 2), 14.0)
    figure = Figure(figsize=(side, side * 0.9))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    shown = axes.imshow(matrix, cmap="Blues")
    figure.colorbar(shown, ax=axes, fraction=0.046, pad=0.04)
    axes.set(xlabel="predicted", ylabel="true", title=title)
    if n <= 30:  # with more classes, tick labels and counts would overlap
        axes.set_xticks(range(n), labels=label_names, rotation=90 if n > 10 else 0)
        axes.set_yticks(range(n), labels=label_names)
        threshold = matrix.max() / 2 if matrix.size else 0
        for (row, col), count in np.ndenumerate(matrix):
            axes.text(
                col,
                row,
                str(count),
                ha="center",
                va="center",
                fontsize=8,
                color="white" if count > threshold else "black",
            )
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def write_image_model_card(output_dir: str, results: dict) -> bool:
    """``README.md`` of the output folder through ``orchid_hf.cards``; False where that module is missing."""
    try:
        from .cards import write_model_card
    except ImportError:
        logger.warning("orchid_hf.cards is not available; no model card written")
        return False
    recipe = results["recipe"]
    hub_name = HUB_ALIASES.get(results["dataset"], results["dataset"])
    on_hub = "/" in hub_name and not Path(results["dataset"]).exists()
    dataset_name = (
        hub_name if on_hub else ("scikit-learn digits" if results["dataset"] == "digits" else "image folder")
    )
    write_model_card(
        output_dir,
        task="image-classification",
        datasets=[hub_name] if on_hub else None,
        results=[
            {
                "dataset_type": hub_name if on_hub else results["dataset"],
                "dataset_name": dataset_name,
                "dataset_split": results["eval_split"],
                "metric_type": "accuracy",
                "metric_value": round(results["accuracy"], 4),
            }
        ],
        description=(
            f"Orchid-ViT ({results['num_parameters']:,} parameters, {results['sequence_length']} patches per image) "
            f"trained with `scripts/train_image.py` on {dataset_name}."
        ),
        training={
            "preset": recipe["preset"],
            "model": ", ".join(f"{k}={v}" for k, v in results["model_config"].items()),
            "optimizer": f"AdamW {tuple(recipe['adam_betas'])}, weight decay {recipe['weight_decay']}",
            "learning rate": f"{recipe['learning_rate']} ({recipe['lr_scheduler']})",
            "batch size": recipe["batch_size"],
            "epochs": results["epochs"],
            "label smoothing": recipe["label_smoothing"],
            "training images": results["num_train"],
        },
        example_input='"digit.png"' if results["dataset"] == "digits" else None,
    )
    return True


def train_image_classifier(
    config: ImageTrainingConfig, progress_callbacks: Sequence[TrainerCallback] = ()
) -> dict:
    """Trains, evaluates on the held-out split and writes to ``output_dir``: the model, its image processor,
    ``results.json`` (accuracy, per-epoch time and memory, the recipe) and ``confusion_matrix.png``."""
    from sklearn.metrics import confusion_matrix

    started = time.perf_counter()
    if config.threads:
        torch.set_num_threads(config.threads)
    recipe = config.recipe()
    dataset = config.dataset_name()
    output_dir = config.output_dir or os.path.join("outputs", config.recipe_name())
    set_seed(config.seed)

    train_ds, eval_ds, eval_split = load_image_dataset(
        dataset, config.cache_dir, recipe.eval_fraction, config.split_seed, config.verify_images
    )
    label_names = train_ds.features["label"].names
    if config.max_train_samples:
        train_ds = train_ds.shuffle(seed=config.seed).select(
            range(min(config.max_train_samples, len(train_ds)))
        )
    if config.max_eval_samples:
        eval_ds = eval_ds.select(range(min(config.max_eval_samples, len(eval_ds))))

    if config.init_from or config.resume_from:
        model = load_classifier_checkpoint(
            config.resume_from or config.init_from,
            label_names,
            config.reinit_head,
            resuming=bool(config.resume_from),
        )
    else:
        model_config = OrchidConfig.from_preset(
            recipe.preset,
            **{
                **recipe.model_overrides,
                "num_labels": len(label_names),
                "id2label": dict(enumerate(label_names)),
                "label2id": {n: i for i, n in enumerate(label_names)},
            },
        )
        model = OrchidForImageClassification(model_config)
    mean, std = dataset_mean_std(dataset, train_ds)
    processor = build_image_processor(model.config.image_size, mean, std, recipe.resample)
    train_ds.set_transform(TrainTransform(processor, recipe))
    eval_ds.set_transform(EvalTransform(processor))

    steps_per_epoch = max(1, math.ceil(len(train_ds) / recipe.batch_size))
    if recipe.warmup_steps is not None:
        warmup = recipe.warmup_steps
    else:  # a float < 1 is a ratio of all training steps in transformers 5
        warmup = min((recipe.warmup_epochs or 0) / recipe.epochs, 0.999) if recipe.epochs else 0
    args = TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=recipe.batch_size,
        per_device_eval_batch_size=recipe.batch_size,
        num_train_epochs=recipe.epochs,
        max_steps=config.max_steps,
        learning_rate=recipe.learning_rate,
        weight_decay=recipe.weight_decay,
        adam_beta1=recipe.adam_betas[0],
        adam_beta2=recipe.adam_betas[1],
        optim="adamw_torch",
        lr_scheduler_type=recipe.lr_scheduler,
        warmup_steps=warmup,
        eval_strategy="epoch" if config.eval_each_epoch else "no",
        save_strategy=config.save_strategy,
        save_total_limit=1,
        logging_strategy="steps" if config.logging_steps else "epoch",
        logging_steps=config.logging_steps or steps_per_epoch,
        remove_unused_columns=False,  # the transforms need the raw image column
        dataloader_num_workers=config.num_workers,
        dataloader_pin_memory=torch.cuda.is_available(),
        use_cpu=config.use_cpu,
        bf16=config.bf16,
        seed=config.seed,
        report_to="none",
        disable_tqdm=config.disable_tqdm,
    )
    mixer = None
    if recipe.mixup_alpha > 0 or recipe.cutmix_alpha > 0:
        mixer = MixupCutmix(
            len(label_names), recipe.mixup_alpha, recipe.cutmix_alpha, label_smoothing=recipe.label_smoothing
        )
    epoch_stats = EpochStatsCallback()
    trainer = ImageClassificationTrainer(
        model=model,
        args=args,
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        data_collator=collate_images,
        processing_class=processor,
        compute_metrics=_accuracy,
        callbacks=[epoch_stats, *progress_callbacks],
        mixer=mixer,
        label_smoothing=recipe.label_smoothing,
    )
    rss_before_training = peak_rss_mib()
    train_output = trainer.train(resume_from_checkpoint=config.resume_from)
    trainer.save_model(output_dir)

    prediction = trainer.predict(eval_ds, metric_key_prefix="eval")
    predicted = prediction.predictions.argmax(-1)
    matrix = confusion_matrix(prediction.label_ids, predicted, labels=list(range(len(label_names))))
    accuracy = float(prediction.metrics["eval_accuracy"])
    results = {
        "dataset": dataset,
        "eval_split": eval_split,
        "num_train": len(train_ds),
        "num_eval": len(eval_ds),
        "accuracy": accuracy,
        "eval_loss": float(prediction.metrics["eval_loss"]),
        "epochs": float(trainer.state.epoch or 0),
        "steps": int(train_output.global_step),
        "train_seconds": round(float(train_output.metrics["train_runtime"]), 2),
        "total_seconds": round(time.perf_counter() - started, 2),
        "threads": torch.get_num_threads(),
        "sequence_length": model.config.num_patches,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "peak_rss_mib_before_training": round(rss_before_training, 1),
        "epoch_stats": epoch_stats.epochs,
        "per_class_accuracy": {
            name: float(matrix[i, i] / max(matrix[i].sum(), 1)) for i, name in enumerate(label_names)
        },
        # 1000 x 1000 for ImageNet: too big for the JSON; confusion_matrix.csv always has it.
        "confusion_matrix": matrix.tolist() if len(label_names) <= 100 else "confusion_matrix.csv",
        "recipe": asdict(recipe),
        "model_config": {
            k: getattr(model.config, k)
            for k in ("image_size", "patch_size", "hidden_size", "num_hidden_layers", "intermediate_size")
        },
        "output_dir": output_dir,
    }
    plot_confusion_matrix(
        matrix,
        label_names,
        Path(output_dir) / "confusion_matrix.png",
        title=f"{dataset}: accuracy {accuracy:.4f} on {eval_split}",
    )
    np.savetxt(Path(output_dir) / "confusion_matrix.csv", matrix, fmt="%d", delimiter=",")
    (Path(output_dir) / "results.json").write_text(json.dumps(results, indent=1, default=str))
    results["model_card"] = write_image_model_card(output_dir, results)
    return results


def _accuracy(eval_prediction) -> dict:
    logits, labels = eval_prediction.predictions, eval_prediction.label_ids
    return {"accuracy": float((np.asarray(logits).argmax(-1) == np.asarray(labels)).mean())}


__all__ = [
    "RECIPES",
    "EvalTransform",
    "ImageClassificationTrainer",
    "ImageRecipe",
    "ImageTrainingConfig",
    "MixupCutmix",
    "RandAugment",
    "RandomErasing",
    "TrainTransform",
    "build_image_processor",
    "decode_image",
    "load_classifier_checkpoint",
    "load_digits_dataset",
    "load_image_dataset",
    "one_hot_smoothed",
    "plot_confusion_matrix",
    "random_crop_flip",
    "random_resized_crop_box",
    "soft_target_cross_entropy",
    "train_image_classifier",
]
