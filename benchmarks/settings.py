"""The benchmark's settings: one dataclass, made from the command line and checked before anything is built or
written; bad values raise a ValueError that names the field and the value."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field

import torch

from benchmarks.candidates import CANDIDATES, modeling_folder

PARTS = ("operator", "model", "train")
MODES = ("forward", "forward_backward")
MODEL_SHAPES = ((8, 128), (1, 4096), (1, 16384))
TRAIN_SHAPES = ((8, 128), (32, 128), (1, 4096), (1, 16384))
QUICK_SHAPES = ((2, 32), (1, 128))  # the model and train parts' shapes with --quick
LENGTHS = tuple(2**k for k in range(10, 18))
QUICK_LENGTHS = (64, 128, 256)
EXPONENT_RANGE = (8192, 65536)  # the lengths the time-versus-length exponents are fitted over
MEMORY_LENGTH = 16384  # the length of the operator's memory ratios


@dataclass
class BenchmarkSettings:
    """What one run measures and how. ``quick``: tiny sizes; ``hidden``/``heads``: the operator's width (and the train
    part's operator level); ``layers``: the depth of the model and train parts' models; ``repeats`` timed rounds per
    point, at least ``min_repeats`` once ``point_budget_s`` is spent; ``max_call_s``: longer calls stop an operator's
    sweep or are timed once; ``rss``: also the peak RSS growth of a call (CPU only); ``compiled``: also time
    ``torch.compile`` of the plain model and operator (candidate ``orchid_compiled``); ``reference``: the model-code
    folder of candidate ``orchid_reference``."""

    quick: bool = False
    parts: list[str] = field(default_factory=lambda: ["operator", "model"])
    hidden: int = 768
    heads: int = 12
    lengths: list[int] = field(default_factory=lambda: list(LENGTHS))
    modes: list[str] = field(default_factory=lambda: list(MODES))
    model_modes: list[str] = field(default_factory=lambda: ["forward"])
    model_shapes: list[tuple[int, int]] = field(default_factory=lambda: list(MODEL_SHAPES))
    train_shapes: list[tuple[int, int]] = field(default_factory=lambda: list(TRAIN_SHAPES))
    train_checkpointing: bool = False
    compiled: bool = False
    layers: int = 12
    profile_shapes: list[tuple[int, int]] = field(default_factory=list)
    profile_train_shapes: list[tuple[int, int]] = field(default_factory=list)
    activation_shapes: list[tuple[int, int]] = field(default_factory=list)
    thread_scaling_shapes: list[tuple[int, int]] = field(default_factory=list)
    flop_shapes: list[tuple[int, int]] = field(default_factory=list)
    repeats: int = 7
    min_repeats: int = 3
    point_budget_s: float = 60.0
    max_call_s: float = 60.0
    threads: int = 1
    rss: bool = False
    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    reference: str | None = None
    exponent_range: tuple[int, int] = EXPONENT_RANGE
    memory_length: int = MEMORY_LENGTH

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> BenchmarkSettings:
        """The settings of a command line (``speed.parse_args``); a ValueError naming the first bad value."""
        quick = args.quick
        parts = parse_names(args.parts, "parts", PARTS)
        model_modes = parse_names(args.model_modes, "model_modes", MODES)
        check_device(args.device)
        for name in ("repeats", "threads", "layers"):
            value = getattr(args, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        for name in ("point_budget_s", "max_call_s"):
            if getattr(args, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(args, name)}")
        if args.thread_scaling and args.threads < 2:
            raise ValueError(f"thread_scaling compares 1 thread with --threads, which must be at least 2, got "
                             f"{args.threads}")
        lengths = parse_lengths(args.lengths) if args.lengths else list(QUICK_LENGTHS if quick else LENGTHS)
        default_shapes = QUICK_SHAPES if quick else None
        return cls(
            quick=quick,
            parts=parts,
            hidden=64 if quick else 768,
            heads=4 if quick else 12,
            lengths=lengths,
            model_modes=model_modes,
            model_shapes=parse_shapes(args.model_shapes) if args.model_shapes else list(default_shapes or MODEL_SHAPES),
            train_shapes=(parse_shapes(args.train_shapes, "train_shapes") if args.train_shapes
                          else list(default_shapes or TRAIN_SHAPES)),
            train_checkpointing=args.train_checkpointing,
            compiled=args.compiled,
            layers=args.layers if args.layers else (2 if quick else 12),
            profile_shapes=parse_shapes(args.profile, "profile") if args.profile else [],
            profile_train_shapes=parse_shapes(args.profile_train, "profile_train") if args.profile_train else [],
            activation_shapes=parse_shapes(args.activations, "activations") if args.activations else [],
            thread_scaling_shapes=(parse_shapes(args.thread_scaling, "thread_scaling") if args.thread_scaling
                                   else []),
            flop_shapes=parse_shapes(args.flops, "flops") if args.flops else [],
            repeats=args.repeats if args.repeats else (2 if quick else 7),
            min_repeats=2 if quick else 3,
            point_budget_s=args.point_budget_s,
            max_call_s=args.max_call_s,
            threads=args.threads,
            rss=args.rss and args.device == "cpu",
            device=args.device,
            dtype=getattr(torch, args.dtype),
            reference=str(modeling_folder(args.reference)) if args.reference else None,
            exponent_range=(lengths[0], lengths[-1]) if quick else EXPONENT_RANGE,
            memory_length=(lengths[-2] if len(lengths) > 1 else lengths[-1]) if quick else MEMORY_LENGTH,
        )

    def to_json(self) -> dict:
        """The settings as the JSON result's ``config``: tuples as lists, the dtype by name, and the candidates each
        part runs without a reference (``operator_impls``, ``model_impls``)."""
        config = {k: (list(v) if isinstance(v, tuple) else str(v) if isinstance(v, torch.dtype) else v)
                  for k, v in asdict(self).items()}
        plain = [name for name, c in CANDIDATES.items() if c.wanted is None and c.installed()]
        config["operator_impls"] = [name for name in plain if "operator" in CANDIDATES[name].tables]
        config["model_impls"] = [name for name in plain if "model" in CANDIDATES[name].tables]
        return config

    @property
    def worker_settings(self) -> dict:
        """What a worker process needs to know (JSON): threads, device, dtype and the reference."""
        return dict(threads=self.threads, device=self.device, dtype=str(self.dtype).split(".")[-1],
                    reference=self.reference)


def parse_lengths(text: str, name: str = "lengths") -> list[int]:
    """``"1024,4096"`` -> [1024, 4096]; a ValueError naming ``name`` for anything but positive integers."""
    try:
        values = [int(item) for item in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise ValueError(f"{name} must be comma-separated positive integers, e.g. 1024,4096; got {text!r}")
    return values


def parse_shapes(text: str, name: str = "model_shapes") -> list[tuple[int, int]]:
    """``"8x128,1x4096"`` -> [(8, 128), (1, 4096)]; a ValueError naming ``name`` for anything else."""
    shapes = []
    for item in text.split(","):
        sizes = item.split("x")
        if len(sizes) != 2 or not all(size.isdigit() and int(size) > 0 for size in sizes):
            raise ValueError(
                f"{name} must be comma-separated BxL with positive B and L, e.g. 8x128,1x4096; got {text!r}"
            )
        shapes.append((int(sizes[0]), int(sizes[1])))
    return shapes


def parse_names(text: str, name: str, allowed: tuple[str, ...]) -> list[str]:
    """``"a,b"`` -> ["a", "b"]; a ValueError naming ``name`` for an empty or unknown name."""
    names = text.split(",")
    if any(item not in allowed for item in names):  # "" and "model," leave an empty name
        raise ValueError(f"{name} must be comma-separated names from {allowed}, got {text!r}")
    return names


def check_device(device: str) -> None:
    """A ValueError for a device this machine cannot run, before anything is built or written."""
    if device == "cpu":
        return
    if not device.startswith("cuda"):
        raise ValueError(f"device must be cpu or cuda (optionally cuda:N), got {device!r}")
    if not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but this torch build sees no CUDA device")
