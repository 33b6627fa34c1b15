"""Pieces shared by the pretraining and GLUE recipes: the paper's optimizer settings, model configs from
presets or files, and Hub-name checks that fail at once when the Hub is out of reach."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from huggingface_hub import constants as hub_constants

OPTIMIZERS = ("d-adamw", "adamw")

# Optimizer settings shared by pretraining and GLUE fine-tuning (App. C.3; M2-BERT's GLUE jobs).
ADAM_BETAS = (0.9, 0.98)
ADAM_EPSILON = 1e-6
WARMUP_FRACTION = 0.06
MAX_GRAD_NORM = 1.0


class HubUnavailableError(ValueError):
    """A Hugging Face Hub name was given while the Hub cannot be reached (``HF_HUB_OFFLINE``)."""


def hub_offline() -> bool:
    """True when Hub access is switched off, read from the environment now as well as from huggingface_hub's
    import-time constant, so that setting ``HF_HUB_OFFLINE`` after the import is still respected."""
    env = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}
    return env or bool(hub_constants.HF_HUB_OFFLINE)


def is_local_path(name: str | os.PathLike) -> bool:
    return Path(name).expanduser().exists()


def require_hub(name: str, *, what: str, how_to_local: str) -> None:
    """Raise :class:`HubUnavailableError` at once when ``name`` is not a local path and the Hub is offline."""
    if not is_local_path(name) and hub_offline():
        raise HubUnavailableError(
            f"{what} {name!r} is a Hugging Face Hub name and is not a local path, but HF_HUB_OFFLINE is set, "
            f"so the Hub cannot be reached. {how_to_local}"
        )


def from_pretrained(loader, name_or_path: str, *, what: str, how_to_local: str, **kwargs):
    """``loader.from_pretrained(name_or_path)``; offline, a Hub name is looked up in the local cache only and
    a miss raises :class:`HubUnavailableError` with ``how_to_local`` instead of a network error."""
    if is_local_path(name_or_path) or not hub_offline():
        return loader.from_pretrained(name_or_path, **kwargs)
    try:
        return loader.from_pretrained(name_or_path, local_files_only=True, **kwargs)
    except OSError as error:
        raise HubUnavailableError(
            f"{what} {name_or_path!r} is not a local folder and is not in the Hugging Face cache, and "
            f"HF_HUB_OFFLINE is set. {how_to_local}"
        ) from error


def load_tokenizer(name_or_path: str, *, how_to_local: str):
    from transformers import AutoTokenizer

    return from_pretrained(AutoTokenizer, name_or_path, what="tokenizer", how_to_local=how_to_local)


def torch_weight_decay(optimizer: str, weight_decay: float, learning_rate: float) -> float:
    """The ``weight_decay`` to give ``torch.optim.AdamW`` so that it applies the paper's setting.

    torch's AdamW shrinks weights by ``lr_t * weight_decay`` per step. The paper's "D-AdamW" is
    Composer's ``DecoupledAdamW`` (the optimizer of M2-BERT, whose recipe the paper follows), which shrinks
    them by ``(lr_t / lr_peak) * weight_decay``: the decay follows the schedule but not the size of the
    learning rate. Both agree exactly when torch gets ``weight_decay / lr_peak``. "AdamW" in Table C.2 is
    torch's AdamW and keeps its value.
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
    if learning_rate <= 0:
        raise ValueError(f"learning_rate must be > 0, got {learning_rate}")
    return weight_decay / learning_rate if optimizer == "d-adamw" else weight_decay


def bf16_available() -> bool:
    """bf16 mixed precision is used by default where the hardware supports it (the paper trained in bf16)."""
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def parse_overrides(text: str | None) -> dict:
    """``"hidden_size=64,num_hidden_layers=2,transform=fft"`` -> dict, values parsed as JSON when they can be."""
    overrides = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"config_overrides items must look like key=value, got {item!r} in {text!r}")
        try:
            overrides[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key.strip()] = value.strip()
    return overrides


def load_model_config(name_or_path: str, overrides: dict | None = None):
    """An OrchidConfig from a preset name (``orchid-bert-base``), a ``config.json`` file or a model folder."""
    from .modeling import PRESETS, OrchidConfig

    overrides = dict(overrides or {})
    if name_or_path in PRESETS:
        return OrchidConfig.from_preset(name_or_path, **overrides)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(
            f"model config {name_or_path!r} is neither a preset ({', '.join(PRESETS)}) nor a config.json file "
            "or a folder holding one"
        )
    values = json.loads(path.read_text())
    for key in ("model_type", "auto_map", "architectures", "transformers_version"):
        values.pop(key, None)
    return OrchidConfig(**{**values, **overrides})


def write_json(path: str | Path, data) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


def run_cli(main: Callable[[list[str] | None], object]) -> None:
    """Run a script's ``main``; a Hub name given while offline ends with a one-line message, not a trace."""
    try:
        main(None)
    except HubUnavailableError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None


__all__ = [
    "ADAM_BETAS",
    "ADAM_EPSILON",
    "HubUnavailableError",
    "MAX_GRAD_NORM",
    "OPTIMIZERS",
    "WARMUP_FRACTION",
    "bf16_available",
    "hub_offline",
    "is_local_path",
    "from_pretrained",
    "load_model_config",
    "load_tokenizer",
    "parse_overrides",
    "require_hub",
    "run_cli",
    "torch_weight_decay",
]
