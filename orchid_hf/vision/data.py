"""Image datasets of the image-classification recipe: scikit-learn's digits (offline), Hub datasets (CIFAR-10,
ImageNet-1K, any dataset with an image and a class-label column), folders with one subfolder per class, and folders
of IDX files (MNIST, Fashion-MNIST).

Every loader returns an :class:`ImageData`: training and evaluation splits with columns ``image`` and ``label`` (a
``ClassLabel``), the class names, and the images' own normalisation where the recipe computes it. Images stay
undecoded (files, bytes or pixel arrays) until a batch needs them.
"""

from __future__ import annotations

import gzip
import io
import math
import os
import re
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..extras import require_extra

require_extra("PIL", "vision")
require_extra("datasets", "train")

import numpy as np  # noqa: E402
from PIL import Image, UnidentifiedImageError  # noqa: E402

from ..hub import hub_offline  # noqa: E402

# Short names for the Hub datasets of the paper.
HUB_ALIASES = {
    "cifar10": "uoft-cs/cifar10",
    "imagenet-1k": "ILSVRC/imagenet-1k",
    "imagenet": "ILSVRC/imagenet-1k",
}
EVAL_SPLIT_NAMES = ("validation", "valid", "val", "test")
CIFAR10_MEAN_STD = ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))
IMAGENET_MEAN_STD = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


@dataclass
class ImageData:
    train: object  # datasets.Dataset
    evaluation: object
    eval_split: str
    label_names: list[str]
    source: str  # what the data is, for results and model cards
    hub_id: str | None = None  # the Hub dataset, where it came from the Hub
    mean_std: tuple[tuple[float, ...], tuple[float, ...]] | None = None  # per channel; None: ImageNet's


# ---------------------------------------------------------------------------------------------
# Decoding and checking images
# ---------------------------------------------------------------------------------------------


def decode_image(value, mode: str = "RGB") -> Image.Image:
    """A PIL image in ``mode`` (``"RGB"`` or ``"L"``), 8 bits per channel as the recipe and its image processor
    work, from a PIL image, a datasets ``{"bytes", "path"}`` record or a pixel array (height, width[, channels])
    (:func:`eight_bit_array` says how other types are scaled); a file that cannot be decoded raises ValueError naming
    it. Transparent pixels become white, as transformers' ``convert_to_rgb`` (the saved image processor) has it."""
    if isinstance(value, Image.Image):
        return _convert(value, mode)
    if isinstance(value, (np.ndarray, list)):
        return _convert(image_from_array(np.asarray(value), "image array"), mode)
    path, data = value.get("path"), value.get("bytes")
    source = path if data is None else io.BytesIO(data)
    where = repr(path) if path else f"given as {len(data or b'')} bytes"
    unreadable = (OSError, UnidentifiedImageError, ValueError, SyntaxError)
    try:
        image = Image.open(source)
    except unreadable as error:
        raise ValueError(f"cannot read image {where}: {error}") from error
    with image:
        try:
            image.load()
        except unreadable as error:
            raise ValueError(f"cannot read image {where}: {error}") from error
        return _convert(image, mode, f"image {where}")


# PIL modes whose pixels are not 8-bit: 16-bit and 32-bit integers, 32-bit floats.
WIDE_MODES = ("I", "F", "I;16", "I;16L", "I;16B", "I;16N")


def _convert(image: Image.Image, mode: str, what: str = "image") -> Image.Image:
    if image.mode in WIDE_MODES:
        image = image_from_array(np.asarray(image), f"{what} mode {image.mode}")
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        image = image.convert("RGBA")
        image = Image.alpha_composite(Image.new("RGBA", image.size, (255, 255, 255, 255)), image)
    return image.convert(mode)


def eight_bit_array(array: np.ndarray, what: str = "image") -> np.ndarray:
    """``array`` as uint8, scaled by the range of its type as torchvision's ``convert_image_dtype`` does: uint8 as
    it is, bool as 0 and 255, uint16 (16-bit images) divided by 257 (65535 -> 255), floats in [0, 1] times 255;
    other integer types must already hold 8-bit values. Anything else is a ValueError naming ``what``, the type and
    the values found."""
    kind = np.dtype(array.dtype)
    if kind == np.uint8:
        return array
    if kind == np.bool_:
        return array.astype(np.uint8) * 255
    if kind.kind not in "uif":
        raise ValueError(f"{what} of dtype {kind} holds no pixel values; pass uint8, uint16, bool or float pixels")
    low, high = (array.min(), array.max()) if array.size else (0, 0)
    if kind.kind == "u" and kind.itemsize == 2:  # either byte order (PIL's I;16B gives big-endian)
        return np.round(array / 257).astype(np.uint8)
    if kind.kind == "f":
        if not (np.isfinite(low) and np.isfinite(high) and 0 <= low and high <= 1):
            raise ValueError(
                f"{what}: a float image must lie in [0, 1], got values from {low} to {high}; scale it to [0, 1], or "
                "pass 8-bit values as uint8"
            )
        return np.round(array * 255).astype(np.uint8)
    if not 0 <= low <= high <= 255:
        raise ValueError(
            f"{what}: a {kind} image must hold 8-bit values 0..255, got values from {low} to {high}; pass 16-bit "
            "images as uint16 (or PIL mode I;16), others scaled to 0..255"
        )
    return array.astype(np.uint8)


def image_from_array(array: np.ndarray, what: str = "image array") -> Image.Image:
    """A PIL image of a pixel array (height, width) or (height, width, channels) with 1, 3 or 4 channels last,
    through :func:`eight_bit_array`."""
    if not (array.ndim == 2 or (array.ndim == 3 and array.shape[-1] in (1, 3, 4))):
        raise ValueError(
            f"{what} must have shape (height, width) or (height, width, channels) with 1, 3 or 4 channels last, "
            f"got {tuple(array.shape)}"
        )
    array = eight_bit_array(array, what)
    return Image.fromarray(array[..., 0] if array.ndim == 3 and array.shape[-1] == 1 else array)


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


# ---------------------------------------------------------------------------------------------
# IDX files (MNIST's format)
# ---------------------------------------------------------------------------------------------

# IDX type codes: the data that follows the big-endian header.
IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
IDX_FILE = re.compile(r"^(?P<split>train|t10k)-(?P<kind>images|labels)[-.]idx(?P<ndim>[13])-ubyte(\.gz)?$")


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """The array in an IDX file (gzip-compressed or plain): two zero bytes, a type code, the number of dimensions,
    each dimension as a big-endian int32, then the data."""
    path = Path(path)
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (EOFError, OSError, zlib.error) as error:
            raise ValueError(f"{path} is not a complete gzip file ({error}); download it again") from None
    if len(data) < 4 or data[:2] != b"\x00\x00" or data[2] not in IDX_DTYPES:
        raise ValueError(
            f"{path} is not an IDX file: it starts with bytes {list(data[:4])}, expected 0, 0, a type code "
            f"({', '.join(hex(c) for c in IDX_DTYPES)}) and the number of dimensions"
        )
    dtype, ndim = np.dtype(IDX_DTYPES[data[2]]), data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(f"IDX file {path} is {len(data)} bytes long, shorter than its {header}-byte header")
    shape = struct.unpack(f">{ndim}I", data[4:header])
    expected = math.prod(shape) * dtype.itemsize
    if len(data) - header != expected:
        raise ValueError(
            f"IDX file {path}: its header gives shape {shape} ({expected} bytes of data), but {len(data) - header} "
            "bytes follow"
        )
    return np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)


def find_idx_files(folder: str | os.PathLike) -> dict[str, dict[str, Path]]:
    """``{"train": {"images": path, "labels": path}, "t10k": {...}}`` for the IDX files in ``folder``."""
    found: dict[str, dict[str, Path]] = {}
    for path in sorted(Path(folder).iterdir()) if Path(folder).is_dir() else []:
        match = IDX_FILE.match(path.name)
        if match and path.is_file():
            found.setdefault(match["split"], {})[match["kind"]] = path
    return found


def _idx_split(files: dict[str, Path], folder: Path, split: str):
    missing = [kind for kind in ("images", "labels") if kind not in files]
    if missing:
        raise ValueError(f"{folder} has {split} IDX files without {split}-{missing[0]}-idx*-ubyte[.gz]")
    images, labels = read_idx(files["images"]), read_idx(files["labels"])
    if images.ndim != 3 or images.dtype != np.uint8:
        raise ValueError(
            f"{files['images']} must hold uint8 images (count, height, width), got {images.dtype} {images.shape}"
        )
    if labels.ndim != 1 or len(labels) != len(images):
        raise ValueError(
            f"{files['labels']} holds {labels.shape} labels for the {len(images)} images of {files['images']}"
        )
    return images, labels.astype(np.int64)


def load_idx_arrays(folder: str | os.PathLike) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{"train": (images, labels), "test": (images, labels)}`` from a folder of IDX files
    (``train-images-idx3-ubyte[.gz]``, ``train-labels-idx1-ubyte[.gz]``, and ``t10k-*`` for "test" where present)."""
    folder = Path(folder)
    files = find_idx_files(folder)
    if "train" not in files:
        raise ValueError(f"{folder} has no train-images-idx3-ubyte[.gz] and train-labels-idx1-ubyte[.gz] files")
    splits = {"train": _idx_split(files["train"], folder, "train")}
    if "t10k" in files:
        splits["test"] = _idx_split(files["t10k"], folder, "t10k")
    return splits


def load_idx_folder(folder: str | os.PathLike, label_names: Sequence[str] | None = None) -> ImageData:
    """A folder of IDX files (:func:`load_idx_arrays`) as datasets: the t10k files, where present, are the
    evaluation split. Class names: ``label_names``, or the label values."""
    import datasets

    folder = Path(folder)
    splits = load_idx_arrays(folder)
    train_images = splits["train"][0]
    num_classes = int(max(labels.max() for _, labels in splits.values())) + 1
    if min(labels.min() for _, labels in splits.values()) < 0:
        raise ValueError(f"{folder}: IDX labels must be >= 0")
    names = list(label_names) if label_names else [str(i) for i in range(num_classes)]
    if len(names) < num_classes:
        raise ValueError(f"{folder} has labels up to {num_classes - 1}, but --class_names gives {len(names)} names")
    height, width = train_images.shape[1:]
    features = datasets.Features(
        {"image": datasets.Array2D(shape=(height, width), dtype="uint8"), "label": datasets.ClassLabel(names=names)}
    )
    data = {
        split: datasets.Dataset.from_dict({"image": images, "label": labels}, features=features)
        for split, (images, labels) in splits.items()
    }
    pixels = train_images.astype(np.float64) / 255
    return ImageData(
        data["train"],
        data.get("test"),
        "test (t10k files)" if "test" in data else "",
        names,
        source=f"IDX files in {folder}",
        mean_std=((float(pixels.mean()),), (float(pixels.std()),)),
    )


# ---------------------------------------------------------------------------------------------
# The other sources
# ---------------------------------------------------------------------------------------------


def load_digits_dataset(split_seed: int = 0, eval_fraction: float = 0.2) -> ImageData:
    """scikit-learn's 1797 handwritten digits (8x8, 17 grey levels) with a stratified held-out split."""
    import datasets

    load_digits = require_extra("sklearn.datasets", "vision").load_digits
    digits = load_digits()
    pixels = np.round(digits.images * (255 / 16)).astype(np.uint8)
    names = [str(d) for d in range(10)]
    features = datasets.Features(
        {"image": datasets.Array2D(shape=(8, 8), dtype="uint8"), "label": datasets.ClassLabel(names=names)}
    )
    dataset = datasets.Dataset.from_dict({"image": pixels, "label": digits.target.tolist()}, features=features)
    split = dataset.train_test_split(test_size=eval_fraction, seed=split_seed, stratify_by_column="label")
    train_pixels = np.asarray(split["train"]["image"], dtype=np.float64) / 255
    return ImageData(
        split["train"],
        split["test"],
        "test (held out)",
        names,
        source="digits",
        mean_std=((float(train_pixels.mean()),), (float(train_pixels.std()),)),
    )


def _hold_out(train, eval_fraction: float, seed: int, name: str):
    """A stratified held-out split with at least one image per class on each side."""
    num_classes = train.features["label"].num_classes
    held = max(math.ceil(eval_fraction * len(train)), num_classes) if eval_fraction > 0 else 0
    if held == 0 or len(train) - held < num_classes:
        raise ValueError(
            f"{name} has no evaluation split, and its {len(train)} images cannot be split with train_val_split="
            f"{eval_fraction} into held-out and training sets that each have all {num_classes} classes; add "
            "images, pass --train_val_split, or give an evaluation folder (--validation_dir)"
        )
    split = train.train_test_split(test_size=held, seed=seed, stratify_by_column="label")
    return split["train"], split["test"]


def _load_image_folder(train_dir: str, validation_dir: str | None, cache_dir: str | None, verify: bool):
    import datasets

    folders = [train_dir, *([validation_dir] if validation_dir else [])]
    for folder in folders:
        if not Path(folder).is_dir():
            raise ValueError(f"image folder {folder} does not exist")
        files = image_files(folder)
        if not files:
            others = sum(1 for p in Path(folder).rglob("*") if p.is_file())
            raise ValueError(
                f"image folder {folder} contains no images (searched all subfolders; {others} other files found). "
                f"Expected one subfolder per class, e.g. {folder}/cat/1.png, {folder}/dog/2.jpg"
            )
        if verify:
            verify_images(files, folder)
    if validation_dir is None:
        # A train_dir with train/ and test/ (or validation/) folders gives both splits.
        splits = datasets.load_dataset("imagefolder", data_dir=train_dir, cache_dir=cache_dir)
    else:
        data_files = {"train": os.path.join(train_dir, "**"), "validation": os.path.join(validation_dir, "**")}
        splits = datasets.load_dataset("imagefolder", data_files=data_files, cache_dir=cache_dir)
    if "label" not in splits["train"].features:
        raise ValueError(
            f"image folder {train_dir}: found images but no class subfolders; put each class's images in its own "
            "subfolder (the subfolder name is the label)"
        )
    return splits


def _load_hub_dataset(name: str, config: str | None, cache_dir: str | None, token: str | None):
    if hub_offline():
        raise ConnectionError(
            f"dataset {name!r} is on the Hugging Face Hub, but HF_HUB_OFFLINE=1 is set, so it cannot be downloaded. "
            "Pass an image folder instead, --train_dir /path/to/folder (one subfolder per class, optionally inside "
            "train/ and test/ folders, or IDX files), or use --dataset_name digits, which ships with scikit-learn"
        )
    import datasets

    return datasets.load_dataset(name, config, cache_dir=cache_dir, token=token)


def _standard_columns(splits, name: str, image_column: str | None, label_column: str | None):
    """Renames the image column to ``image`` and the class column to ``label``; checks that there is one."""
    import datasets

    features = splits["train"].features
    if image_column is None:
        image_column = next((k for k, v in features.items() if isinstance(v, datasets.Image)), None)
    if label_column is None:
        label_columns = [k for k, v in features.items() if isinstance(v, datasets.ClassLabel)]
        label_column = next((k for k in ("label", "labels", "fine_label") if k in label_columns), None)
        label_column = label_column or (label_columns[0] if label_columns else None)
    if image_column not in features or label_column not in features:
        raise ValueError(
            f"dataset {name}: need an image column and a class-label column (--image_column_name, "
            f"--label_column_name), found {dict(features)}"
        )
    if not isinstance(features[label_column], datasets.ClassLabel):
        raise ValueError(f"dataset {name}: column {label_column!r} is {features[label_column]}, not a ClassLabel")
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


def load_image_data(
    dataset_name: str | None = None,
    dataset_config_name: str | None = None,
    train_dir: str | None = None,
    validation_dir: str | None = None,
    *,
    train_val_split: float = 0.15,
    split_seed: int = 0,
    cache_dir: str | None = None,
    token: str | None = None,
    verify: bool = True,
    image_column: str | None = None,
    label_column: str | None = None,
    label_names: Sequence[str] | None = None,
) -> ImageData:
    """The training and evaluation images of a run.

    ``dataset_name``: ``digits``, ``cifar10``, ``imagenet-1k`` or a Hub id. ``train_dir``: a folder with one
    subfolder per class (optionally inside ``train/`` and ``test/`` or ``validation/`` folders), or a folder of
    IDX files; ``validation_dir`` likewise for evaluation. Without an evaluation split, a stratified
    ``train_val_split`` of the training images is held out.
    """
    import datasets

    if train_dir is None and validation_dir is not None:
        raise ValueError("--validation_dir needs --train_dir")
    if train_dir is not None and find_idx_files(train_dir):
        data = load_idx_folder(train_dir, label_names)
        if validation_dir is not None:
            data.evaluation = load_idx_folder(validation_dir, data.label_names).train
            data.eval_split = f"IDX files in {validation_dir}"
        elif data.evaluation is None:
            data.train, data.evaluation = _hold_out(data.train, train_val_split, split_seed, train_dir)
            data.eval_split = "test (held out)"
        return data
    if train_dir is None and dataset_name == "digits":
        return load_digits_dataset(split_seed, train_val_split)
    hub_id = None
    if train_dir is not None:
        splits, name = _load_image_folder(train_dir, validation_dir, cache_dir, verify), train_dir
    elif dataset_name is None:
        raise ValueError("pass --dataset_name (digits, cifar10, imagenet-1k or a Hub id) or --train_dir (a folder)")
    elif Path(dataset_name).exists():
        raise ValueError(f"--dataset_name {dataset_name!r} is a local path; pass folders as --train_dir")
    elif dataset_name in HUB_ALIASES or re.fullmatch(r"[\w.-]+/[\w.-]+", dataset_name):
        hub_id = HUB_ALIASES.get(dataset_name, dataset_name)
        splits, name = _load_hub_dataset(hub_id, dataset_config_name, cache_dir, token), hub_id
    else:
        raise ValueError(
            f"--dataset_name {dataset_name!r} is not a known dataset; pass digits, cifar10, imagenet-1k or a Hub id "
            "like owner/name, or a folder as --train_dir"
        )
    splits = _standard_columns(splits, name, image_column, label_column)
    eval_name = next((s for s in EVAL_SPLIT_NAMES if s in splits and _has_labels(splits[s])), None)
    train = splits["train"]
    if eval_name is None:
        train, evaluation = _hold_out(train, train_val_split, split_seed, name)
        eval_name = "test (held out)"
    else:
        evaluation = splits[eval_name]
    train = train.cast_column("image", datasets.Image(decode=False))
    evaluation = evaluation.cast_column("image", datasets.Image(decode=False))
    known = {"uoft-cs/cifar10": CIFAR10_MEAN_STD}
    return ImageData(
        train, evaluation, eval_name, list(train.features["label"].names), name, hub_id, known.get(hub_id)
    )


__all__ = [
    "HUB_ALIASES",
    "IMAGENET_MEAN_STD",
    "ImageData",
    "decode_image",
    "eight_bit_array",
    "find_idx_files",
    "image_from_array",
    "image_files",
    "load_digits_dataset",
    "load_idx_arrays",
    "load_idx_folder",
    "load_image_data",
    "read_idx",
    "verify_images",
]
