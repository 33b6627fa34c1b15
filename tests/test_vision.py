"""Image classification recipe: augmentations, data loading and its errors, checkpoints, training, pipeline."""

import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from transformers import pipeline

from orchid_hf import OrchidConfig, OrchidForImageClassification
from orchid_hf.vision import (
    RECIPES,
    EvalTransform,
    ImageTrainingConfig,
    MixupCutmix,
    RandAugment,
    RandomErasing,
    TrainTransform,
    build_image_processor,
    decode_image,
    load_classifier_checkpoint,
    load_image_dataset,
    one_hot_smoothed,
    random_crop_flip,
    random_resized_crop_box,
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
    recipe = RECIPES["orchid-vit-digits"].__class__(preset="orchid-vit-cifar-s")  # no augmentation at all
    train = TrainTransform(processor, recipe)({"image": images, "label": [0, 1, 2, 3]})
    evaluation = EvalTransform(processor)({"image": images, "label": [0, 1, 2, 3]})
    for a, b in zip(train["pixel_values"], evaluation["pixel_values"]):
        assert a.shape == (3, 16, 16)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


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
    train, evaluation, split = load_image_dataset("digits", eval_fraction=0.2)
    assert len(train) + len(evaluation) == 1797 and len(evaluation) == 360 and "held out" in split
    counts = np.bincount(evaluation["label"], minlength=10)
    assert counts.min() >= 35
    image = decode_image(train[0]["image"])
    assert image.size == (8, 8) and image.mode == "RGB"


def test_empty_folder_is_a_clear_error(tmp_path):
    (tmp_path / "cats").mkdir()
    (tmp_path / "cats" / "notes.txt").write_text("no images here")
    with pytest.raises(ValueError, match=r"contains no images.*1 other files"):
        load_image_dataset(str(tmp_path))


def test_folder_without_class_subfolders_is_a_clear_error(tmp_path):
    for i in range(3):
        Image.new("RGB", (4, 4)).save(tmp_path / f"{i}.png")
    with pytest.raises(ValueError, match="no class subfolders"):
        load_image_dataset(str(tmp_path), cache_dir=str(tmp_path / "cache"))


def test_unreadable_image_is_named(tmp_path):
    root = write_image_folder(tmp_path / "images", per_class=2)
    bad = root / "red" / "broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n this is not a png")
    with pytest.raises(ValueError, match=r"1 of 7 images .* cannot be read: .*broken\.png"):
        load_image_dataset(str(root), cache_dir=str(tmp_path / "cache"))
    # Without the check up front, decoding names the file when the batch that holds it is built.
    with pytest.raises(ValueError, match=r"cannot read image .*broken\.png"):
        decode_image({"path": str(bad), "bytes": None})


def test_too_few_images_to_hold_out_every_class_is_a_clear_error(tmp_path):
    root = write_image_folder(tmp_path / "images", per_class=1)
    with pytest.raises(ValueError, match=r"3 images cannot be split with eval_fraction=0.1 .* all 3 classes"):
        load_image_dataset(str(root), cache_dir=str(tmp_path / "cache"))


def test_hub_dataset_offline_fails_fast_and_says_what_to_do(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    start = time.perf_counter()
    with pytest.raises(ConnectionError, match=r"HF_HUB_OFFLINE.*--dataset /path/to/folder"):
        load_image_dataset("cifar10")
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("name", ["no_such_dataset_here", "/no/such/folder", "./missing/images"])
def test_unknown_dataset_or_missing_folder_is_a_clear_error(name):
    with pytest.raises(ValueError, match="neither an existing folder nor a known dataset"):
        load_image_dataset(name)


def test_checkpoint_with_other_label_count_needs_reinit_head(tmp_path):
    config = OrchidConfig.from_preset("orchid-vit-cifar-s", image_size=8, patch_size=2, hidden_size=32,
                                      num_hidden_layers=1, intermediate_size=32, num_labels=10)
    OrchidForImageClassification(config).save_pretrained(tmp_path / "ckpt")
    names = ["a", "b", "c", "d", "e"]
    with pytest.raises(ValueError, match=r"classifies 10 labels, the dataset has 5 classes.*--reinit_head"):
        load_classifier_checkpoint(str(tmp_path / "ckpt"), names)
    with pytest.raises(ValueError, match="resumed run must keep its classifier"):
        load_classifier_checkpoint(str(tmp_path / "ckpt"), names, reinit_head=True, resuming=True)
    model = load_classifier_checkpoint(str(tmp_path / "ckpt"), names, reinit_head=True)
    assert model.classifier.out_features == 5 and model.config.id2label[4] == "e"
    same = load_classifier_checkpoint(str(tmp_path / "ckpt"), [str(i) for i in range(10)])
    assert same.config.num_labels == 10
    with pytest.raises(ValueError, match="has no config.json"):
        load_classifier_checkpoint(str(tmp_path), names)


# ---------------------------------------------------------------------------------------------
# Recipes and training
# ---------------------------------------------------------------------------------------------


def test_recipes_follow_the_paper():
    cifar, imagenet = RECIPES["orchid-vit-cifar-s"], RECIPES["orchid-vit-imagenet"]
    assert (cifar.learning_rate, cifar.warmup_steps, cifar.lr_scheduler) == (3e-4, 500, "constant_with_warmup")
    assert (cifar.batch_size, cifar.epochs, cifar.weight_decay, cifar.label_smoothing) == (512, 500, 0.05, 0.1)
    assert cifar.crop_padding == 4 and cifar.hflip and cifar.mixup_alpha == 0
    assert (imagenet.learning_rate, imagenet.warmup_epochs, imagenet.lr_scheduler) == (1e-3, 10, "cosine")
    assert (imagenet.batch_size, imagenet.epochs, imagenet.weight_decay) == (1024, 300, 0.05)
    assert imagenet.randaugment == (2, 9.0, 0.5) and (imagenet.mixup_alpha, imagenet.cutmix_alpha) == (0.8, 1.0)
    assert imagenet.random_erasing == 0.25 and imagenet.label_smoothing == 0.1
    recipe = ImageTrainingConfig(dataset="cifar10", patch_size=2, learning_rate=1e-3, randaugment="none").recipe()
    assert recipe.preset == "orchid-vit-cifar-s" and recipe.model_overrides == {"patch_size": 2}
    assert recipe.learning_rate == 1e-3 and recipe.randaugment is None and recipe.warmup_steps == 500
    assert ImageTrainingConfig().recipe_name() == "orchid-vit-digits"
    assert ImageTrainingConfig(preset="orchid-vit-imagenet").dataset_name() == "imagenet-1k"
    assert ImageTrainingConfig(dataset="/data/pets").recipe_name() == "orchid-vit-cifar-s"
    with pytest.raises(ValueError, match="cannot change the architecture"):
        ImageTrainingConfig(init_from="somewhere", patch_size=2).recipe()
    with pytest.raises(ValueError, match="unknown preset"):
        ImageTrainingConfig(preset="orchid-vit-huge").recipe()


def test_digits_training_learns_and_the_output_folder_works_in_a_pipeline(tmp_path, one_thread):
    out = tmp_path / "digits"
    args = [
        "--output_dir", str(out), "--patch_size", "2", "--num_hidden_layers", "2", "--epochs", "2",
        "--batch_size", "16", "--learning_rate", "2e-3", "--warmup_steps", "10", "--crop_padding", "0",
        "--save_strategy", "no",
        "--eval_each_epoch", "False", "--disable_tqdm", "True", "--seed", "0",
    ]
    results = train_image.main(args)
    assert results["accuracy"] > 0.5, results["accuracy"]  # chance is 0.1
    saved = json.loads((out / "results.json").read_text())
    assert saved["accuracy"] == results["accuracy"] and len(saved["epoch_stats"]) == 2
    assert sum(map(sum, saved["confusion_matrix"])) == 360
    assert (out / "confusion_matrix.png").stat().st_size > 1000
    assert (out / "preprocessor_config.json").is_file() and (out / "model.safetensors").is_file()

    classifier = pipeline("image-classification", model=str(out), device="cpu")
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = [Image.fromarray(np.round(digits.images[i] * 255 / 16).astype(np.uint8), mode="L") for i in range(20)]
    predictions = classifier(images, top_k=1)
    assert {p[0]["label"] for p in predictions} <= {str(d) for d in range(10)}
    assert sum(p[0]["label"] == str(t) for p, t in zip(predictions, digits.target[:20])) >= 8


def test_image_folder_training_writes_a_loadable_model_and_resumes(tmp_path, one_thread):
    root = write_image_folder(tmp_path / "colours")
    out = tmp_path / "run"
    common = [
        "--dataset", str(root), "--preset", "orchid-vit-cifar-s", "--batch_size", "8", "--eval_fraction", "0.25",
        "--cache_dir", str(tmp_path / "cache"), "--disable_tqdm", "True",
    ]
    tiny = ["--image_size", "8", "--patch_size", "4", "--hidden_size", "32", "--num_hidden_layers", "1"]
    results = train_image.main([*common, *tiny, "--epochs", "1", "--output_dir", str(out)])
    assert results["num_eval"] == 6 and results["num_train"] == 18 and math.isfinite(results["eval_loss"])
    assert results["steps"] == 3 and (out / "checkpoint-3").is_dir()
    model = OrchidForImageClassification.from_pretrained(out)
    assert model.config.id2label == {0: "blue", 1: "green", 2: "red"}
    prediction = pipeline("image-classification", model=str(out), device="cpu")(Image.new("RGB", (20, 20)))
    assert {p["label"] for p in prediction} <= {"blue", "green", "red"}

    resumed = train_image.main(
        [*common, "--epochs", "2", "--resume_from", str(out / "checkpoint-3"), "--output_dir", str(tmp_path / "r")]
    )
    assert resumed["steps"] == 6 and len(resumed["epoch_stats"]) == 1  # only the second epoch ran

    # A new run that starts from this 3-class model on a 2-class folder must say so.
    two = write_image_folder(tmp_path / "two", classes=("red", "blue"), per_class=4)
    with pytest.raises(ValueError, match="classifies 3 labels, the dataset has 2 classes"):
        train_image.main(
            ["--dataset", str(two), "--init_from", str(out), "--cache_dir", str(tmp_path / "cache"),
             "--output_dir", str(tmp_path / "run2")]
        )


def test_imagenet_recipe_trains_with_all_its_augmentations(tmp_path, one_thread):
    """RandomResizedCrop, RandAugment, random erasing and Mixup/CutMix in a real Trainer run (two steps)."""
    root = write_image_folder(tmp_path / "colours", size=24)
    results = train_image.main([
        "--dataset", str(root), "--preset", "orchid-vit-imagenet", "--image_size", "16", "--patch_size", "4",
        "--hidden_size", "32", "--num_hidden_layers", "1", "--batch_size", "6", "--max_steps", "2",
        "--cache_dir", str(tmp_path / "cache"), "--output_dir", str(tmp_path / "run"), "--save_strategy", "no",
        "--eval_each_epoch", "False", "--disable_tqdm", "True",
    ])
    assert results["steps"] == 2 and math.isfinite(results["eval_loss"])
    recipe = results["recipe"]
    assert recipe["randaugment"] == (2, 9.0, 0.5) and recipe["mixup_alpha"] == 0.8 and recipe["random_erasing"] == 0.25
