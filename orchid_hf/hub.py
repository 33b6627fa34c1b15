"""Push a trained Orchid folder to the Hugging Face Hub and pull one back.

A pushed folder must load anywhere: safetensors weights, ``config.json`` (with its ``auto_map``), the
remote-code files that ``save_pretrained`` copies next to them, the tokenizer or image processor, and the
model card; a sentence-transformers folder also its ``modules.json``, the folders of its modules and the ONNX graphs
of its encoder (``onnx/``, as ``orchid_hf.embeddings.export_embedder_onnx`` writes them).
:func:`push_to_hub` refuses a folder that lacks any of them, and uploads only those files (never Trainer
checkpoints or optimizer states).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from huggingface_hub import HfApi, is_offline_mode, snapshot_download
from huggingface_hub.errors import LocalEntryNotFoundError

logger = logging.getLogger(__name__)


class HubUnavailableError(ValueError):
    """A Hugging Face Hub name was given while the Hub cannot be reached (``HF_HUB_OFFLINE``)."""


def hub_offline() -> bool:
    """huggingface_hub's own offline check (``HF_HUB_OFFLINE``, read when huggingface_hub is imported), so that this
    package, transformers and datasets agree on whether the Hub may be called."""
    return is_offline_mode()


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
    """``loader.from_pretrained(name_or_path, **kwargs)``; offline, a Hub name is looked up in the local cache only
    and a miss raises :class:`HubUnavailableError` with ``how_to_local`` instead of a network error."""
    if is_local_path(name_or_path) or not hub_offline():
        return loader.from_pretrained(name_or_path, **kwargs)
    try:
        return loader.from_pretrained(name_or_path, **{**kwargs, "local_files_only": True})
    except OSError as error:
        raise HubUnavailableError(
            f"{what} {name_or_path!r} is not a local folder and is not in the Hugging Face cache, and "
            f"HF_HUB_OFFLINE is set. {how_to_local}"
        ) from error

REMOTE_CODE_FILES = ("configuration_orchid.py", "modeling_orchid.py", "orchid_layers.py", "orchid_ops.py")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
IMAGE_PROCESSOR_FILES = ("preprocessor_config.json",)
OPTIONAL_FILES = ("generation_config.json", "results.json", "glue_results.json", "glue_results.md")
SENTENCE_TRANSFORMERS_FILES = ("modules.json", "config_sentence_transformers.json")
# The ONNX graphs of a sentence-transformers folder's root module, where its ONNX backend reads them, and their
# external weights (``.onnx.data`` as torch.onnx saves them, ``.onnx_data`` as optimum does) for graphs over 2 GB.
ONNX_FOLDER = "onnx"
ONNX_SUFFIXES = (".onnx", ".onnx.data", ".onnx_data")


def upload_file_list(folder: str | Path) -> list[str]:
    """The files of ``folder`` that make up a loadable model repository, as paths relative to it; ValueError naming
    what is missing.

    A sentence-transformers folder (one with ``modules.json``, as ``SentenceTransformer.save`` writes it) is uploaded
    whole: its configuration files, the Orchid model at its root with its ONNX graphs (``onnx/``), and the folder of
    every other module (pooling, dense layers, normalisation), so that ``SentenceTransformer(repo_id)`` builds the
    model that was saved.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"model folder {folder} does not exist")
    if (folder / "modules.json").is_file():
        files, missing = sentence_transformers_files(folder)
    else:
        files, missing = model_files(folder)
    if "README.md" not in {path.name for path in folder.iterdir() if path.is_file()}:
        missing.append("README.md (write one with orchid_hf.cards.write_model_card)")
    if missing:
        raise ValueError(f"{folder} cannot be pushed, it lacks: {'; '.join(missing)}")
    return sorted({"README.md", *files})


def model_files(folder: Path) -> tuple[list[str], list[str]]:
    """The files of the Orchid model saved in ``folder`` (weights, config, remote code, tokenizer or image
    processor, results), and what it lacks."""
    present = {path.name for path in folder.iterdir() if path.is_file()}
    missing = []
    if "config.json" not in present:
        missing.append("config.json")
    weights = sorted(name for name in present if name.endswith(".safetensors"))
    if "model.safetensors.index.json" in present:
        weights.append("model.safetensors.index.json")
    if not weights:
        missing.append("model.safetensors (weights; save with save_pretrained, which writes safetensors)")
    missing += [name for name in REMOTE_CODE_FILES if name not in present]
    is_vision = False
    if "config.json" in present:
        config = json.loads((folder / "config.json").read_text())
        is_vision = config.get("image_size") is not None
        if not config.get("auto_map"):
            missing.append("config.json 'auto_map' (needed by trust_remote_code=True)")
    if is_vision:
        processor = [name for name in IMAGE_PROCESSOR_FILES if name in present]
        if not processor:
            missing.append("preprocessor_config.json (save the image processor next to the model)")
    else:
        processor = [name for name in TOKENIZER_FILES if name in present]
        if "tokenizer.json" not in processor and "vocab.txt" not in processor:
            missing.append("tokenizer.json (save the tokenizer next to the model)")
    optional = [name for name in OPTIONAL_FILES if name in present]
    return ["config.json", *weights, *REMOTE_CODE_FILES, *processor, *optional], missing


def sentence_transformers_files(folder: Path) -> tuple[list[str], list[str]]:
    """The files of a sentence-transformers folder and what it lacks: ``modules.json`` and
    ``config_sentence_transformers.json``, the model files, module configuration (``sentence_*config.json``) and ONNX
    files (``onnx/*.onnx`` and their external data) of the module saved at the root, and every file in the folder of
    each other module."""
    modules = json.loads((folder / "modules.json").read_text())
    files = [name for name in SENTENCE_TRANSFORMERS_FILES if (folder / name).is_file()]
    missing = []
    for number, module in enumerate(modules):
        path = module.get("path", "")
        where = folder / path
        if not where.is_dir():
            missing.append(f"{path}/ (module {number} of modules.json, a {module.get('type')})")
        elif where == folder:
            model, lacks = model_files(folder)
            files += model + [p.name for p in folder.glob("sentence_*config.json")]
            files += [
                p.relative_to(folder).as_posix()
                for p in sorted((folder / ONNX_FOLDER).glob("*"))
                if p.is_file() and p.name.endswith(ONNX_SUFFIXES)
            ]
            missing += lacks
        else:
            files += [p.relative_to(folder).as_posix() for p in sorted(where.rglob("*")) if p.is_file()]
    return files, missing


def push_to_hub(
    folder: str | Path,
    repo_id: str,
    *,
    api: HfApi | None = None,
    private: bool = False,
    commit_message: str = "Upload Orchid model",
    revision: str | None = None,
    token: str | None = None,
) -> str:
    """Create ``repo_id`` (if needed) and upload the model files of ``folder``; returns the commit URL.

    ``api`` defaults to a new ``HfApi``; with the default, a set ``HF_HUB_OFFLINE`` raises at once.
    """
    files = upload_file_list(folder)
    if api is None:
        if hub_offline():
            raise HubUnavailableError(
                f"cannot push {folder} to {repo_id}: HF_HUB_OFFLINE is set. Unset it on a machine with Hub access."
            )
        api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    commit = api.upload_folder(
        repo_id=repo_id,
        folder_path=str(folder),
        repo_type="model",
        revision=revision,
        commit_message=commit_message,
        allow_patterns=files,
    )
    logger.info("pushed %d files of %s to %s", len(files), folder, repo_id)
    return getattr(commit, "commit_url", str(commit))


def pull_from_hub(
    repo_id: str,
    *,
    local_dir: str | Path | None = None,
    revision: str | None = None,
    token: str | None = None,
) -> Path:
    """Download a model repository (``snapshot_download``) and check that it holds a loadable Orchid folder.

    Offline, only the local cache is consulted; a miss raises :class:`HubUnavailableError`.
    """
    offline = hub_offline()
    try:
        path = snapshot_download(
            repo_id,
            revision=revision,
            local_dir=str(local_dir) if local_dir is not None else None,
            token=token,
            local_files_only=offline,
        )
    except LocalEntryNotFoundError as error:
        if offline:
            raise HubUnavailableError(
                f"{repo_id} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; copy the model "
                "folder to this machine and load it from its path instead"
            ) from error
        raise
    path = Path(path)
    upload_file_list(path)
    return path


__all__ = [
    "REMOTE_CODE_FILES",
    "SENTENCE_TRANSFORMERS_FILES",
    "HubUnavailableError",
    "from_pretrained",
    "hub_offline",
    "is_local_path",
    "pull_from_hub",
    "push_to_hub",
    "require_hub",
    "upload_file_list",
]
