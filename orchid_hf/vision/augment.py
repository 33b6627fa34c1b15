"""Image augmentations of the paper's recipes, in plain torch (no PIL, no torchvision): the random crop and flip of
the CIFAR recipe; the random resized crop, RandAugment, random erasing and Mixup/CutMix of the ImageNet (T2T-ViT)
recipe; and the loss against soft targets.

They follow timm's definitions, which the paper's pipeline uses, without depending on timm (which needs
torchvision); kornia's versions differ from the recipe (see docs/image_classification.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F


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


__all__ = [
    "MixupCutmix",
    "RandAugment",
    "RandomErasing",
    "one_hot_smoothed",
    "random_crop_flip",
    "random_resized_crop_box",
    "soft_target_cross_entropy",
]
