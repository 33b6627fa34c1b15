"""The model a recipe trains: an Orchid preset, any transformers model type or config, or a checkpoint (folder or
Hub id), as transformers' examples build it; and the check that a checkpoint's classifier fits the data."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from .arguments import ModelArguments
from .hub import from_pretrained
from .recipes import Recipe


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


def load_config(name_or_path: str, model_args: ModelArguments | None = None, *, how_to_local: str = "", **updates):
    """A config from an Orchid preset name, a ``config.json``, a folder or a Hub id, with ``updates`` applied."""
    from transformers import CONFIG_MAPPING, AutoConfig

    from .modeling import PRESETS, OrchidConfig

    if name_or_path in PRESETS:
        return OrchidConfig.from_preset(name_or_path, **updates)
    path = Path(name_or_path).expanduser()
    if path.is_file():
        values = json.loads(path.read_text())
        model_type = values.get("model_type")
        if model_type not in CONFIG_MAPPING:
            raise ValueError(f"config file {path} has model_type {model_type!r}, which transformers does not know")
        return CONFIG_MAPPING[model_type].from_dict({**values, **updates})
    hub_kwargs = model_args.hub_kwargs() if model_args is not None else {}
    hint = f"{how_to_local} Orchid presets: {', '.join(PRESETS)}.".strip()
    return from_pretrained(AutoConfig, name_or_path, what="config", how_to_local=hint, **hub_kwargs, **updates)


def new_config(model_args: ModelArguments, recipe: Recipe, *, defaults: dict | None = None, **updates):
    """The config of a model trained from scratch: ``--model_type`` (orchid: the recipe's preset) with
    ``defaults`` (values the data implies, e.g. the vocabulary size), ``--config_overrides`` and ``updates``."""
    from transformers import CONFIG_MAPPING

    from .modeling import OrchidConfig

    model_type = model_args.model_type or "orchid"
    values = {**(defaults or {}), **parse_overrides(model_args.config_overrides), **updates}
    if model_type == "orchid":
        if recipe.preset is None:
            raise ValueError(f"recipe {recipe.name!r} has no Orchid preset; pass --config_name")
        return OrchidConfig.from_preset(recipe.preset, **{**recipe.model_overrides, **values})
    if model_type not in CONFIG_MAPPING:
        known = ", ".join(sorted(k for k in CONFIG_MAPPING if k in ("bert", "roberta", "vit", "deit", "orchid")))
        raise ValueError(f"unknown --model_type {model_type!r}; use orchid or a transformers model type ({known}, ...)")
    return CONFIG_MAPPING[model_type](**values)


def build_model(
    auto_class,
    model_args: ModelArguments,
    recipe: Recipe,
    *,
    how_to_local: str,
    new_model_defaults: dict | None = None,
    ignore_mismatched_sizes: bool | None = None,
    prepare_config: Callable | None = None,
    **config_updates,
):
    """The model of a run, as transformers' examples build it.

    With ``--model_name_or_path``: its weights, with its config (or ``--config_name``) updated by
    ``config_updates``. Otherwise a new model from ``--config_name`` or ``--model_type`` (see :func:`new_config`).
    ``prepare_config(config)`` may change the config (whatever its model type) before the model is built.
    """
    if model_args.model_name_or_path:
        if model_args.config_name:
            config = load_config(model_args.config_name, model_args, how_to_local=how_to_local, **config_updates)
        else:
            from transformers import AutoConfig

            config = from_pretrained(
                AutoConfig, model_args.model_name_or_path, what="model", how_to_local=how_to_local,
                **model_args.hub_kwargs(), **config_updates,
            )  # fmt: skip
        if prepare_config is not None:
            prepare_config(config)
        ignore = model_args.ignore_mismatched_sizes if ignore_mismatched_sizes is None else ignore_mismatched_sizes
        return from_pretrained(
            auto_class, model_args.model_name_or_path, what="model", how_to_local=how_to_local, config=config,
            ignore_mismatched_sizes=ignore, **model_args.hub_kwargs(),
        )  # fmt: skip
    if model_args.config_name:
        from .modeling import PRESETS

        defaults = new_model_defaults if model_args.config_name in PRESETS else {}
        config = load_config(
            model_args.config_name, model_args, how_to_local=how_to_local, **{**(defaults or {}), **config_updates}
        )
    else:
        config = new_config(model_args, recipe, defaults=new_model_defaults, **config_updates)
    if prepare_config is not None:
        prepare_config(config)
    return auto_class.from_config(config, trust_remote_code=model_args.trust_remote_code)


def _classifier_config(path: str) -> dict | None:
    """The saved config of a folder holding a classification head, else None."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        return None
    config = json.loads(config_file.read_text())
    if not any("Classification" in name for name in config.get("architectures") or []):
        return None
    return config


def checkpoint_num_labels(path: str) -> int | None:
    """The number of labels of a saved classifier's head, or None where the folder holds no classification head."""
    config = _classifier_config(path)
    if config is None:
        return None
    return len(config["id2label"]) if config.get("id2label") else config.get("num_labels")


def checkpoint_label_names(path: str) -> list[str] | None:
    """The label names of a saved classifier, in class-id order; None where the folder holds no classification
    head or its labels have transformers' placeholder names (LABEL_0, LABEL_1, ...)."""
    config = _classifier_config(path)
    id2label = (config or {}).get("id2label") or {}
    names = [str(id2label[key]) for key in sorted(id2label, key=int)]
    if not names or names == [f"LABEL_{index}" for index in range(len(names))]:
        return None
    return names


def check_head_size(model_args: ModelArguments, num_labels: int, label_names: Sequence[str] = ()) -> None:
    """A checkpoint whose classifier has another number of labels needs ``--ignore_mismatched_sizes``."""
    if not model_args.model_name_or_path or model_args.ignore_mismatched_sizes:
        return
    saved = checkpoint_num_labels(model_args.model_name_or_path)
    if saved is not None and saved != num_labels:
        names = ", ".join(map(str, list(label_names)[:10])) + (", ..." if len(label_names) > 10 else "")
        raise ValueError(
            f"checkpoint {model_args.model_name_or_path} classifies {saved} labels, the data has {num_labels} "
            f"classes{f' ({names})' if names else ''}; pass --ignore_mismatched_sizes to replace its classifier"
        )


__all__ = [
    "build_model",
    "check_head_size",
    "checkpoint_label_names",
    "checkpoint_num_labels",
    "load_config",
    "new_config",
    "parse_overrides",
]
