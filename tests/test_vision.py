"""Image classification recipe: augmentations, data loading (folders, digits, IDX files) and its errors, checkpoints,
training end to end with the examples' flags (Orchid and a ViT baseline on grey IDX images), pipelines."""

import gzip
import io
import json
import math
import struct
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from transformers import AutoImageProcessor, AutoModelForImageClassification, pipeline

from orchid_hf import OrchidConfig, OrchidForImageClassification
from orchid_hf.arguments import ModelArguments
from orchid_hf.model_loading import check_head_size
from orchid_hf.vision import (
    EvalTransform,
    MixupCutmix,
    RandAugment,
    RandomErasing,
    TrainTransform,
    build_image_processor,
    decode_image,
    load_image_data,
    one_hot_smoothed,
    random_crop_flip,
    random_resized_crop_box,
    read_idx,
    soft_target_cross_entropy,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import train_image  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Mixup / CutMix and the loss
# ---------------------------------------------------------------------------------------------


def test_one_hot_smoothed_rows_sum_to_one():
    targets = one_hot_smoothed(torch.tensor([0, 3, 9]), 10, smoothing=0.1)
    torch.testing.assert_close(targets.sum(-1), torch.ones(3))
    assert targets[1, 3] == pytest.approx(0.91) and targets[1, 0] == pytest.approx(0.01)


def test_mixup_mixes_images_and_labels_with_the_same_weight():
    images = torch.randn(4, 3, 8, 8)
    labels = torch.tensor([0, 1, 2, 3])
    mixer = MixupCutmix(num_classes=5, mixup_alpha=0.8, cutmix_alpha=0.0, label_smoothing=0.0)
    for _ in range(10):
        mixed, targets = mixer(images, labels)
        torch.testing.assert_close(targets.sum(-1), torch.ones(4))
        lam = targets[0, 0].item()  # sample 0 (class 0) is mixed with sample 3 (class 3)
        assert 0 < lam < 1 and targets[0, 3].item() == pytest.approx(1 - lam, abs=1e-6)
        torch.testing.assert_close(mixed[0], lam * images[0] + (1 - lam) * images[3])
        assert targets[:, 4].abs().max() == 0


def test_cutmix_label_weight_is_the_pasted_area():
    # Image i is filled with the value i, so the share of its partner's pixels is measurable exactly.
    images = torch.arange(4, dtype=torch.float32).view(4, 1, 1, 1).expand(4, 3, 16, 16).contiguous()
    labels = torch.tensor([0, 1, 2, 3])
    mixer = MixupCutmix(num_classes=4, mixup_alpha=0.0, cutmix_alpha=1.0, label_smoothing=0.1)
    for _ in range(20):
        mixed, targets = mixer(images, labels)
        torch.testing.assert_close(targets.sum(-1), torch.ones(4))
        for i in range(4):
            partner = 3 - i
            pasted = (mixed[i] == partner).float().mean().item() if partner != i else 0.0
            # smoothed target: (1 - lam) * (1 - 0.1 + 0.025) + lam * 0.025 on the partner's class
            lam = 1 - pasted
            assert targets[i, partner].item() == pytest.approx((1 - lam) * 0.925 + lam * 0.025, abs=1e-5)
            assert targets[i, i].item() == pytest.approx(lam * 0.925 + (1 - lam) * 0.025, abs=1e-5)


def test_mixup_cutmix_needs_an_alpha():
    with pytest.raises(ValueError, match="not both 0"):
        MixupCutmix(num_classes=10, mixup_alpha=0.0, cutmix_alpha=0.0)


def test_soft_target_cross_entropy_equals_label_smoothing_on_one_hot_targets():
    logits, labels = torch.randn(6, 10), torch.randint(0, 10, (6,))
    smoothed = soft_target_cross_entropy(logits, one_hot_smoothed(labels, 10, 0.1))
    torch.testing.assert_close(smoothed, F.cross_entropy(logits, labels, label_smoothing=0.1))
    torch.testing.assert_close(soft_target_cross_entropy(logits, labels, 0.1), smoothed)


# ---------------------------------------------------------------------------------------------
# Image augmentations
# ---------------------------------------------------------------------------------------------


def test_random_erasing_box_stays_inside_the_image_and_within_the_area_range():
    erasing = RandomErasing(prob=1.0)
    for _ in range(200):
        out = erasing(torch.zeros(3, 32, 32))
        erased = out.abs().sum(0) > 0
        rows, cols = erased.any(1).nonzero().flatten(), erased.any(0).nonzero().flatten()
        height, width = rows.max() - rows.min() + 1, cols.max() - cols.min() + 1
        assert erased.sum() == height * width  # one filled rectangle
        # areas from 2% to 1/3 of the image, up to the rounding of the box sides to whole pixels
        area = (height * width).item() / 1024
        assert 0.02 - (height + width).item() / 1024 <= area <= 1 / 3 + (height + width).item() / 1024


def test_random_erasing_rate():
    erasing = RandomErasing(prob=0.25)
    erased = sum(bool((erasing(torch.zeros(3, 32, 32)) != 0).any()) for _ in range(2000))
    assert 0.21 < erased / 2000 < 0.29
    assert torch.equal(RandomErasing(prob=0.0)(torch.ones(3, 8, 8)), torch.ones(3, 8, 8))


def test_random_crop_returns_a_shifted_window_of_the_padded_image():
    image = torch.arange(3 * 32 * 32, dtype=torch.float32).view(3, 32, 32) + 1
    padded = F.pad(image, (4, 4, 4, 4))
    windows = {(t, left): padded[:, t : t + 32, left : left + 32] for t in range(9) for left in range(9)}
    flipped = 0
    for _ in range(30):
        out = random_crop_flip(image, padding=4, hflip=True)
        assert out.shape == image.shape
        plain = any(torch.equal(out, w) for w in windows.values())
        mirrored = any(torch.equal(out, w.flip(-1)) for w in windows.values())
        assert plain or mirrored
        flipped += mirrored and not plain
    assert 0 < flipped < 30
    assert torch.equal(random_crop_flip(image, padding=0, hflip=False), image)


def test_random_resized_crop_box_is_inside_and_of_plausible_size():
    for _ in range(100):
        left, top, right, bottom = random_resized_crop_box(64, 48)
        assert 0 <= left < right <= 64 and 0 <= top < bottom <= 48
        assert (right - left) * (bottom - top) >= 0.05 * 64 * 48


def test_randaugment_operations_keep_shape_dtype_and_meaning():
    image = torch.randint(0, 256, (3, 16, 16), dtype=torch.uint8)
    x = image.float()
    augment = RandAugment(num_layers=2, magnitude=9, magnitude_std=0.5)
    for op in RandAugment.OPS:
        out = augment.apply(op, x, 9.0)
        assert out.shape == x.shape and out.min() >= 0 and out.max() <= 255, op
    assert torch.equal(augment.apply("Invert", x, 5.0), 255 - x)
    assert torch.equal(augment.apply("Solarize", x, 10.0), 255 - x)  # threshold 0: every pixel inverted
    assert torch.equal(augment.apply("Solarize", x, 0.0), x)  # threshold 256: none
    assert (augment.apply("Posterize", x, 0.0) % 16 == 0).all()  # 4 bits kept
    stretched = augment.apply("AutoContrast", x * 0.5 + 20, 0.0)
    assert stretched.amin(dim=(1, 2)).eq(0).all() and stretched.amax(dim=(1, 2)).eq(255).all()
    dark = torch.randint(0, 50, (3, 64, 64)).float()  # PIL leaves images under 255 pixels alone
    assert augment.apply("Equalize", dark, 0.0).max() > 200  # a compressed histogram is spread out
    for op in ("Rotate", "ShearX", "TranslateY", "Brightness", "Sharpness"):  # magnitude 0: identity
        torch.testing.assert_close(augment.apply(op, x, 0.0), x, atol=1e-3, rtol=0)
    shifted = augment.apply("TranslateX", x, 10.0)  # 45% of 16 pixels: the left or right 7 columns are fill
    assert torch.equal(shifted[:, :, :7], augment.fill.view(3, 1, 1).expand(3, 16, 7)) or torch.equal(
        shifted[:, :, -7:], augment.fill.view(3, 1, 1).expand(3, 16, 7)
    )
    out = augment(image)
    assert out.dtype == torch.uint8 and out.shape == image.shape
    assert torch.equal(RandAugment(prob=0.0)(image), image)
    torch.manual_seed(3)
    first = augment(image)
    torch.manual_seed(3)
    assert torch.equal(augment(image), first)
    with pytest.raises(ValueError, match="magnitude"):
        RandAugment(magnitude=11)


def test_train_transform_without_augmentation_equals_the_saved_processor():
    """Training and the pipeline must see images the same way: resize, RGB conversion and normalisation."""
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (20, 20), dtype=np.uint8), mode="L") for _ in range(3)]
    images.append(Image.fromarray(rng.integers(0, 256, (12, 30, 3), dtype=np.uint8)))
    processor = build_image_processor(16, (0.5, 0.4, 0.3), (0.2, 0.25, 0.3))
    train = TrainTransform(processor)({"image": images, "label": [0, 1, 2, 3]})  # no augmentation at all
    evaluation = EvalTransform(processor)({"image": images, "label": [0, 1, 2, 3]})
    for a, b in zip(train["pixel_values"], evaluation["pixel_values"]):
        assert a.shape == (3, 16, 16)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    # A grey model takes grey images: one channel, the same processing.
    grey = build_image_processor(16, (0.5,), (0.2,), num_channels=1)
    train = TrainTransform(grey, num_channels=1)({"image": images[:3], "label": [0, 1, 2]})
    evaluation = EvalTransform(grey, num_channels=1)({"image": images[:3], "label": [0, 1, 2]})
    for a, b in zip(train["pixel_values"], evaluation["pixel_values"]):
        assert a.shape == (1, 16, 16)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


LEVELS = np.arange(256, dtype=np.uint8).reshape(16, 16)  # every 8-bit level once


def test_16_bit_float_and_wide_integer_images_keep_their_levels():
    """Images the recipe decodes are scaled to its 8-bit range by the range of their type, as torchvision's
    convert_image_dtype: 16-bit by 65535 / 255 = 257, floats in [0, 1] by 255; wider integers hold 8-bit values."""
    sixteen = LEVELS.astype(np.uint16) * 257
    png = io.BytesIO()
    Image.fromarray(sixteen).save(png, format="PNG")
    assert Image.open(io.BytesIO(png.getvalue())).mode == "I;16"
    floats = LEVELS / 255
    sources = {
        "16-bit PNG bytes": {"path": None, "bytes": png.getvalue()},
        "PIL I;16": Image.open(io.BytesIO(png.getvalue())),
        "uint16 array": sixteen,
        "big-endian uint16 array": sixteen.astype(">u2"),
        "float64 array": floats,
        "float32 array": floats.astype(np.float32),
        "PIL F": Image.fromarray(floats.astype(np.float32)),
        "PIL I": Image.fromarray(LEVELS.astype(np.int32)),
        "int64 list (a datasets Array2D row)": LEVELS.astype(np.int64).tolist(),
        "bool array": LEVELS >= 128,
    }
    for name, value in sources.items():
        expected = np.where(LEVELS >= 128, 255, 0) if name == "bool array" else LEVELS
        np.testing.assert_array_equal(np.array(decode_image(value, "L")), expected, err_msg=name)
        rgb = np.array(decode_image(value, "RGB"))
        assert rgb.shape == (16, 16, 3), name
        np.testing.assert_array_equal(rgb, np.repeat(expected[..., None], 3, axis=-1), err_msg=name)
    colour = np.stack([LEVELS, LEVELS.T, 255 - LEVELS], axis=-1)
    np.testing.assert_array_equal(np.array(decode_image(colour.astype(np.uint16) * 257, "RGB")), colour)
    np.testing.assert_array_equal(np.array(decode_image(colour / 255, "RGB")), colour)
    np.testing.assert_array_equal(np.array(decode_image(colour[..., :1], "L")), LEVELS)


@pytest.mark.parametrize(
    "value, message",
    [
        (LEVELS * 1.0, r"float image must lie in \[0, 1\], got values from 0.0 to 255.0"),
        (np.full((4, 4), np.nan), r"float image must lie in \[0, 1\], got values from nan to nan"),
        (Image.fromarray(np.full((4, 4), 2.0, dtype=np.float32)), r"image mode F: .*got values from 2.0 to 2.0"),
        (np.full((4, 4), 1000, dtype=np.int64), r"int64 image must hold 8-bit values 0..255, got values from 1000"),
        (Image.fromarray(np.full((4, 4), -3, dtype=np.int32)), r"image mode I: .*8-bit values 0..255, got .* -3 "),
        (np.zeros((4, 4, 2), dtype=np.uint8), r"image array must have shape \(height, width\) or \(height, width, "
                                              r"channels\) with 1, 3 or 4 channels last, got \(4, 4, 2\)"),
        (np.zeros((3, 8, 8), dtype=np.uint8), r"got \(3, 8, 8\)"),
        (np.array([["a"]]), r"image array of dtype <U1"),
    ],
)
def test_image_values_outside_the_range_of_their_type_are_refused_by_name(value, message):
    with pytest.raises(ValueError, match=message):
        decode_image(value, "RGB")


def test_transparency_is_composited_onto_white_as_the_image_processor_does():
    """RGBA, LA and palette images with a transparent colour: transparent pixels become white, as transformers'
    convert_to_rgb (which the saved image processor applies in pipelines) makes them, in training too."""
    from transformers.image_transforms import convert_to_rgb

    rng = np.random.default_rng(0)
    rgba = rng.integers(0, 256, (12, 12, 4), dtype=np.uint8)
    rgba[:6, :, 3] = 0  # the upper half transparent
    palette = Image.fromarray(rng.integers(0, 4, (12, 12), dtype=np.uint8), mode="L").convert("P")
    palette.putpalette([255, 0, 0, 0, 255, 0, 0, 0, 255, 9, 9, 9])
    palette.info["transparency"] = 1
    images = {
        "RGBA": Image.fromarray(rgba),
        "LA": Image.fromarray(rgba[..., [0, 3]], mode="LA"),
        "P with transparency": palette,
        "CMYK": Image.fromarray(rgba, mode="RGBA").convert("CMYK"),
        "RGBA array": rgba,
    }
    processor = build_image_processor(12, (0.5, 0.4, 0.3), (0.2, 0.25, 0.3))
    for name, image in images.items():
        expected = convert_to_rgb(Image.fromarray(image) if isinstance(image, np.ndarray) else image,
                                  return_numpy=True)  # fmt: skip
        np.testing.assert_array_equal(np.array(decode_image(image, "RGB")), expected, err_msg=name)
        grey = np.array(Image.fromarray(expected).convert("L"))
        np.testing.assert_array_equal(np.array(decode_image(image, "L")), grey, err_msg=name)
        if name != "RGBA array":  # the pipeline's processor and the recipe's evaluation see the same pixels
            pipeline_pixels = processor([image], return_tensors="pt")["pixel_values"][0]
            recipe_pixels = EvalTransform(processor)({"image": [image], "label": [0]})["pixel_values"][0]
            torch.testing.assert_close(recipe_pixels, pipeline_pixels, atol=1e-5, rtol=0)
    assert (np.array(decode_image(images["RGBA"], "RGB"))[:6] == 255).all()


# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("patch_size", [4, 2, 1])
def test_cifar_preset_runs_forward_and_backward_at_every_patch_size(patch_size, one_thread):
    config = OrchidConfig.from_preset("orchid-vit-cifar-s", patch_size=patch_size)
    model = OrchidForImageClassification(config)
    assert config.num_patches == (32 // patch_size) ** 2
    output = model(pixel_values=torch.randn(2, 3, 32, 32), labels=torch.tensor([1, 7]))
    output.loss.backward()
    assert output.logits.shape == (2, 10) and torch.isfinite(output.loss)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_initialization_lets_the_orchid_operator_contribute():
    config = OrchidConfig.from_preset("orchid-vit-cifar-s", image_size=8, patch_size=1, hidden_size=64)
    model = OrchidForImageClassification(config)
    mixer = model.orchid.encoder.layer[0].mixer
    x = torch.randn(4, 64, 64)
    assert mixer(x).pow(2).mean().sqrt() > 1e-3  # about 1e-7 with the depthwise kernels at normal(0.02)
    patches = model.orchid.embeddings.projection(torch.randn(4, 3, 8, 8))
    assert patches.std() > 0.1


# ---------------------------------------------------------------------------------------------
# Data loading and bad input
# ---------------------------------------------------------------------------------------------


def write_image_folder(root: Path, classes=("red", "green", "blue"), per_class=8, size=12) -> Path:
    colours = {"red": (200, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 200)}
    rng = np.random.default_rng(0)
    for name in classes:
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            noise = rng.integers(-30, 30, (size, size, 3))
            pixels = np.clip(np.array(colours[name]) + noise, 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


def test_digits_dataset_is_split_and_stratified():
    data = load_image_data("digits", train_val_split=0.2)
    train, evaluation = data.train, data.evaluation
    assert len(train) + len(evaluation) == 1797 and len(evaluation) == 360 and "held out" in data.eval_split
    counts = np.bincount(evaluation["label"], minlength=10)
    assert counts.min() >= 35
    image = decode_image(train[0]["image"])
    assert image.size == (8, 8) and image.mode == "RGB"
    assert len(data.mean_std[0]) == 1  # grey statistics of the training images


def test_empty_folder_is_a_clear_error(tmp_path):
    (tmp_path / "cats").mkdir()
    (tmp_path / "cats" / "notes.txt").write_text("no images here")
    with pytest.raises(ValueError, match=r"contains no images.*1 other files"):
        load_image_data(train_dir=str(tmp_path))


def test_folder_without_class_subfolders_is_a_clear_error(tmp_path):
    for i in range(3):
        Image.new("RGB", (4, 4)).save(tmp_path / f"{i}.png")
    with pytest.raises(ValueError, match="no class subfolders"):
        load_image_data(train_dir=str(tmp_path), cache_dir=str(tmp_path / "cache"))


def test_unreadable_image_is_named(tmp_path):
    root = write_image_folder(tmp_path / "images", per_class=2)
    bad = root / "red" / "broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n this is not a png")
    with pytest.raises(ValueError, match=r"1 of 7 images .* cannot be read: .*broken\.png"):
        load_image_data(train_dir=str(root), cache_dir=str(tmp_path / "cache"))
    # Without the check up front, decoding names the file when the batch that holds it is built.
    with pytest.raises(ValueError, match=r"cannot read image .*broken\.png"):
        decode_image({"path": str(bad), "bytes": None})


def test_too_few_images_to_hold_out_every_class_is_a_clear_error(tmp_path):
    root = write_image_folder(tmp_path / "images", per_class=1)
    with pytest.raises(ValueError, match=r"3 images cannot be split with train_val_split=0.15 .* all 3 classes"):
        load_image_data(train_dir=str(root), cache_dir=str(tmp_path / "cache"))


def test_hub_dataset_offline_fails_fast_and_says_what_to_do(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    start = time.perf_counter()
    with pytest.raises(ConnectionError, match=r"HF_HUB_OFFLINE.*--train_dir /path/to/folder"):
        load_image_data("cifar10")
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("name", ["no_such_dataset_here", "./missing/images"])
def test_unknown_dataset_is_a_clear_error(name, tmp_path):
    with pytest.raises(ValueError, match="is not a known dataset"):
        load_image_data(name)
    with pytest.raises(ValueError, match="is a local path; pass folders as --train_dir"):
        load_image_data(str(tmp_path))
    with pytest.raises(ValueError, match="image folder /no/such/folder does not exist"):
        load_image_data(train_dir="/no/such/folder")


def write_idx(path: Path, array: np.ndarray, compress: bool) -> None:
    """MNIST's IDX format: two zero bytes, type 0x08 (unsigned byte), the number of dimensions, the dimensions as
    big-endian int32, then the bytes."""
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if compress else data)


def write_idx_folder(root: Path, train: int = 48, test: int = 24, size: int = 28) -> Path:
    """Grey 28x28 images of three classes (a bright band in the left, middle or right third), gzip and plain."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    for split, count in (("train", train), ("t10k", test)):
        labels = np.arange(count) % 3
        images = rng.integers(0, 40, (count, size, size))
        for image, label in zip(images, labels):
            image[:, label * size // 3 : (label + 1) * size // 3] += 200
        write_idx(root / f"{split}-images-idx3-ubyte.gz", images, compress=True)
        write_idx(root / f"{split}-labels-idx1-ubyte", labels, compress=False)
    return root


def test_idx_files_are_read_gzipped_or_plain(tmp_path):
    root = write_idx_folder(tmp_path / "idx", train=6, test=3)
    images, labels = read_idx(root / "train-images-idx3-ubyte.gz"), read_idx(root / "train-labels-idx1-ubyte")
    assert images.shape == (6, 28, 28) and images.dtype == np.uint8 and labels.tolist() == [0, 1, 2, 0, 1, 2]
    assert images[0, :, :9].min() >= 200 and images[0, :, 10:].max() < 40
    data = load_image_data(train_dir=str(root))
    assert (len(data.train), len(data.evaluation), data.eval_split) == (6, 3, "test (t10k files)")
    assert data.label_names == ["0", "1", "2"] and decode_image(data.train[0]["image"], "L").size == (28, 28)
    named = load_image_data(train_dir=str(root), label_names=["left", "middle", "right"])
    assert named.train.features["label"].names == ["left", "middle", "right"]
    # Damaged or mismatched files say what is wrong, with the numbers.
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "train-images-idx3-ubyte").write_bytes(bytes([0, 0, 8, 3]) + struct.pack(">3I", 2, 4, 4) + b"x")
    with pytest.raises(ValueError, match=r"header gives shape \(2, 4, 4\) \(32 bytes of data\), but 1 bytes follow"):
        read_idx(tmp_path / "bad" / "train-images-idx3-ubyte")
    (tmp_path / "bad" / "not-idx").write_bytes(b"PK\x03\x04")
    with pytest.raises(ValueError, match="is not an IDX file: it starts with bytes"):
        read_idx(tmp_path / "bad" / "not-idx")
    write_idx(tmp_path / "bad" / "train-images-idx3-ubyte", np.zeros((2, 4, 4)), compress=False)
    write_idx(tmp_path / "bad" / "train-labels-idx1-ubyte", np.zeros(3), compress=False)
    with pytest.raises(ValueError, match=r"holds \(3,\) labels for the 2 images"):
        load_image_data(train_dir=str(tmp_path / "bad"))
    with pytest.raises(ValueError, match="labels up to 2, but --class_names gives 2 names"):
        load_image_data(train_dir=str(root), label_names=["a", "b"])


def test_checkpoint_with_other_label_count_needs_ignore_mismatched_sizes(tmp_path):
    config = OrchidConfig.from_preset("orchid-vit-cifar-s", image_size=8, patch_size=2, hidden_size=32,
                                      num_hidden_layers=1, intermediate_size=32, num_labels=10)
    OrchidForImageClassification(config).save_pretrained(tmp_path / "ckpt")
    names = ["a", "b", "c", "d", "e"]
    args = ModelArguments(model_name_or_path=str(tmp_path / "ckpt"))
    with pytest.raises(ValueError, match=r"classifies 10 labels, the data has 5 classes \(a, b, c, d, e\); "
                       "pass --ignore_mismatched_sizes"):  # fmt: skip
        check_head_size(args, 5, names)
    check_head_size(ModelArguments(model_name_or_path=str(tmp_path / "ckpt"), ignore_mismatched_sizes=True), 5)
    check_head_size(args, 10)


# ---------------------------------------------------------------------------------------------
# Training end to end
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_digits_training_learns_and_the_output_folder_works_in_a_pipeline(tmp_path, one_thread):
    out = tmp_path / "digits"
    args = [
        "--output_dir", str(out), "--config_overrides", "patch_size=2,num_hidden_layers=2", "--num_train_epochs", "2",
        "--per_device_train_batch_size", "16", "--learning_rate", "2e-3", "--warmup_steps", "10",
        "--crop_padding", "0", "--save_strategy", "no", "--eval_strategy", "no", "--disable_tqdm", "True",
        "--seed", "0",
    ]  # fmt: skip
    results = train_image.main(args)
    assert results["recipe"] == "orchid-vit-digits" and results["dataset"] == "digits"
    assert results["accuracy"] > 0.5, results["accuracy"]  # chance is 0.1
    saved = json.loads((out / "results.json").read_text())
    assert saved["accuracy"] == results["accuracy"] and len(saved["epoch_stats"]) == 2
    assert sum(map(sum, saved["confusion_matrix"])) == 360
    assert json.loads((out / "all_results.json").read_text())["eval_accuracy"] == results["accuracy"]
    assert (out / "confusion_matrix.png").stat().st_size > 1000
    assert (out / "preprocessor_config.json").is_file() and (out / "model.safetensors").is_file()
    assert "pipeline_tag: image-classification" in (out / "README.md").read_text()

    classifier = pipeline("image-classification", model=str(out), device="cpu")
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = [Image.fromarray(np.round(digits.images[i] * 255 / 16).astype(np.uint8), mode="L") for i in range(20)]
    predictions = classifier(images, top_k=1)
    assert {p[0]["label"] for p in predictions} <= {str(d) for d in range(10)}
    assert sum(p[0]["label"] == str(t) for p, t in zip(predictions, digits.target[:20])) >= 8


@pytest.mark.slow
def test_image_folder_training_writes_a_loadable_model_and_resumes(tmp_path, one_thread):
    root = write_image_folder(tmp_path / "colours")
    out = tmp_path / "run"
    common = [
        "--train_dir", str(root), "--per_device_train_batch_size", "8", "--train_val_split", "0.25",
        "--cache_dir", str(tmp_path / "cache"), "--disable_tqdm", "True",
    ]  # fmt: skip
    tiny = ["--config_overrides", "image_size=8,patch_size=4,hidden_size=32,num_hidden_layers=1"]
    results = train_image.main([*common, *tiny, "--num_train_epochs", "1", "--output_dir", str(out)])
    assert results["recipe"] == "orchid-vit-cifar-s"  # a folder gets the CIFAR recipe
    assert results["num_eval"] == 6 and results["num_train"] == 18 and math.isfinite(results["eval_loss"])
    assert results["steps"] == 3 and (out / "checkpoint-3").is_dir()
    model = OrchidForImageClassification.from_pretrained(out)
    assert model.config.id2label == {0: "blue", 1: "green", 2: "red"}
    prediction = pipeline("image-classification", model=str(out), device="cpu")(Image.new("RGB", (20, 20)))
    assert {p["label"] for p in prediction} <= {"blue", "green", "red"}

    resumed = train_image.main(
        [*common, *tiny, "--num_train_epochs", "2", "--resume_from_checkpoint", str(out / "checkpoint-3"),
         "--output_dir", str(tmp_path / "r")]
    )  # fmt: skip
    assert resumed["steps"] == 6 and len(resumed["epoch_stats"]) == 1  # only the second epoch ran

    # A new run that starts from this 3-class model on a 2-class folder must say so.
    two = write_image_folder(tmp_path / "two", classes=("red", "blue"), per_class=4)
    with pytest.raises(ValueError, match="classifies 3 labels, the data has 2 classes"):
        train_image.main(
            ["--train_dir", str(two), "--model_name_or_path", str(out), "--cache_dir", str(tmp_path / "cache"),
             "--output_dir", str(tmp_path / "run2")]
        )  # fmt: skip
    with pytest.raises(ValueError, match="a resumed run must keep its classifier"):
        train_image.main(
            ["--train_dir", str(two), *tiny, "--resume_from_checkpoint", str(out / "checkpoint-3"),
             "--cache_dir", str(tmp_path / "cache"), "--output_dir", str(tmp_path / "run3")]
        )  # fmt: skip
    # From the checkpoint with a new head, as run_image_classification fine-tunes.
    fine_tuned = train_image.main(
        ["--train_dir", str(two), "--model_name_or_path", str(out), "--ignore_mismatched_sizes", "--max_steps", "1",
         "--per_device_train_batch_size", "4", "--cache_dir", str(tmp_path / "cache"), "--output_dir",
         str(tmp_path / "run4"), "--disable_tqdm", "True", "--save_strategy", "no"]
    )  # fmt: skip
    assert fine_tuned["steps"] == 1 and fine_tuned["base_model"] is None


@pytest.mark.slow
def test_push_goes_through_trainer_with_the_card_and_the_processor(tmp_path, one_thread, monkeypatch):
    from tests.test_pretraining import FakeHub

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    hub = FakeHub()
    monkeypatch.setattr("transformers.trainer.hf_api", lambda: hub)
    root = write_image_folder(tmp_path / "colours", per_class=4)
    out = tmp_path / "run"
    train_image.main([
        "--train_dir", str(root), "--config_overrides", "image_size=8,patch_size=4,hidden_size=32,num_hidden_layers=1",
        "--max_steps", "1", "--per_device_train_batch_size", "4", "--train_val_split", "0.25", "--save_strategy", "no",
        "--cache_dir", str(tmp_path / "cache"), "--output_dir", str(out), "--disable_tqdm", "True",
        "--push_to_hub", "--hub_model_id", "me/orchid-colours", "--hub_strategy", "end",
    ])  # fmt: skip
    (create, repo_id, _), *uploads = hub.calls
    assert (create, repo_id) == ("create_repo", "me/orchid-colours")
    assert [call[1]["commit_message"] for call in uploads] == ["Model save", "Image classification"]
    pushed = set(uploads[-1][1]["files"])
    assert {"README.md", "preprocessor_config.json", "model.safetensors", "modeling_orchid.py"} <= pushed
    assert "all_results.json" in pushed and "checkpoint-*" in uploads[-1][1]["ignore_patterns"]
    card = (out / "README.md").read_text()
    assert "me/orchid-colours" in card and "model-index" in card  # the final card carries the accuracy


@pytest.mark.slow
def test_imagenet_recipe_trains_with_all_its_augmentations(tmp_path, one_thread):
    """RandomResizedCrop, RandAugment, random erasing and Mixup/CutMix in a real Trainer run (two steps)."""
    root = write_image_folder(tmp_path / "colours", size=24)
    results = train_image.main([
        "--train_dir", str(root), "--recipe", "orchid-vit-imagenet",
        "--config_overrides", "image_size=16,patch_size=4,hidden_size=32,num_hidden_layers=1",
        "--per_device_train_batch_size", "6", "--max_steps", "2", "--cache_dir", str(tmp_path / "cache"),
        "--output_dir", str(tmp_path / "run"), "--save_strategy", "no", "--eval_strategy", "no",
        "--disable_tqdm", "True",
    ])  # fmt: skip
    assert results["steps"] == 2 and math.isfinite(results["eval_loss"])
    augmentation = results["hyperparameters"]["augmentation"]
    assert augmentation["randaugment"] == "2,9,0.5" and augmentation["mixup_alpha"] == 0.8
    assert augmentation["random_erasing"] == 0.25 and augmentation["resample"] == "bicubic"


@pytest.mark.slow
def test_grey_idx_images_with_orchid_and_a_vit_baseline(tmp_path, one_thread):
    """Fashion-MNIST's layout: IDX files of grey 28x28 images, an Orchid-ViT with one input channel, and
    transformers' ViT trained by the same recipe on the same data; both saved folders classify grey images."""
    root = write_idx_folder(tmp_path / "idx")
    # Eight epochs (48 steps): with three, the accuracy of a one-layer model on 48 images depended on the seed.
    common = [
        "--train_dir", str(root), "--recipe", "orchid-vit-digits", "--num_train_epochs", "8",
        "--per_device_train_batch_size", "8", "--learning_rate", "3e-3", "--warmup_steps", "0",
        "--save_strategy", "no", "--disable_tqdm", "True", "--class_names", "left", "middle", "right",
    ]  # fmt: skip
    orchid = train_image.main([
        *common, "--config_overrides", "num_channels=1,image_size=28,patch_size=4,hidden_size=32,num_hidden_layers=1",
        "--output_dir", str(tmp_path / "orchid"),
    ])  # fmt: skip
    vit = train_image.main([
        *common, "--model_type", "vit", "--output_dir", str(tmp_path / "vit"), "--config_overrides",
        "num_channels=1,image_size=28,patch_size=4,hidden_size=32,num_hidden_layers=1,num_attention_heads=2,"
        "intermediate_size=64",
    ])  # fmt: skip
    for results, model_type in ((orchid, "orchid"), (vit, "vit")):
        assert results["model"]["model_type"] == model_type and results["model"]["num_channels"] == 1
        assert (results["num_train"], results["num_eval"], results["eval_split"]) == (48, 24, "test (t10k files)")
        assert results["accuracy"] > 0.5, (model_type, results["accuracy"])  # chance is 1/3; the bands are easy
        processor = json.loads((tmp_path / model_type / "preprocessor_config.json").read_text())
        assert processor["do_convert_rgb"] is False and len(processor["image_mean"]) == 1
        # The saved processor and model classify a grey image. (pipeline("image-classification") converts every
        # image to RGB, so it serves three-channel models only.)
        folder = str(tmp_path / model_type)
        model = AutoModelForImageClassification.from_pretrained(folder).eval()
        band = np.full((28, 28), 20, dtype=np.uint8)
        band[:, 19:] = 230
        inputs = AutoImageProcessor.from_pretrained(folder)(Image.fromarray(band, mode="L"), return_tensors="pt")
        assert inputs["pixel_values"].shape == (1, 1, 28, 28)
        with torch.no_grad():
            label = model.config.id2label[int(model(**inputs).logits.argmax(-1))]
        assert label in {"left", "middle", "right"}
    assert "Orchid" not in (tmp_path / "vit" / "README.md").read_text()  # the baseline gets Trainer's card
