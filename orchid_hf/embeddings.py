"""Orchid encoders as sentence-transformers models (text embeddings for similarity, retrieval and clustering).

``sentence_transformer(checkpoint)`` builds ``SentenceTransformer([Transformer, Pooling])`` (and ``Normalize`` with
``normalize=True``) from a saved Orchid folder (an ``OrchidModel``, or a task checkpoint such as ``OrchidForMaskedLM``,
whose encoder it takes) or from a model in memory. A saved ``SentenceTransformer`` folder loads with
``SentenceTransformer(path)`` once ``orchid_hf`` is imported, or with ``trust_remote_code=True`` without it (the model
code ships in the folder). Needs the ``embeddings`` extra: ``pip install "orchid-hf[embeddings]"``.

``export_embedder_onnx(folder)`` writes the ONNX graphs of a saved folder's encoder into ``folder/onnx/``, where
sentence-transformers' ONNX backend looks for them (needs the ``onnx`` extra).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .extras import require_extra
from .modeling import OrchidModel
from .onnx import export_onnx, quantize_int8

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

# sentence-transformers' Pooling modes. "cls" takes the first real token and "lasttoken" the last one, so they, like
# the means, do not depend on the side the tokenizer pads on.
POOLING_MODES = ("mean", "cls", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")


def unwrap_model(model):
    """The model inside ``torch.compile``'s wrapper and ``DataParallel``/``DistributedDataParallel``, which compute
    what it computes with the same weights; a ValueError for a peft model (its adapters are not in the base model's
    weights) and for any other module that is not a transformers model."""
    dynamo = sys.modules.get("torch._dynamo")  # torch.compile imports it: a compiled model means it is loaded
    while True:
        if dynamo is not None and isinstance(model, dynamo.eval_frame.OptimizedModule):
            model = model._orig_mod
        elif isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        else:
            break
    if hasattr(model, "peft_config"):
        raise ValueError(
            f"model is a peft model ({type(model).__name__}), whose adapters are not in its base model's weights: "
            "pass model.merge_and_unload() for the merged weights, or, to keep training the adapters, build the "
            "SentenceTransformer from the base model and add the adapter to it (SentenceTransformer.add_adapter)"
        )
    if not isinstance(model, (PreTrainedModel, str, os.PathLike)):
        raise ValueError(f"model must be an Orchid model, a folder or a Hub id, got {type(model).__name__}")
    return model


def sentence_transformer(
    model: str | Path | PreTrainedModel,
    tokenizer: str | Path | PreTrainedTokenizerBase | None = None,
    *,
    pooling: str = "mean",
    max_seq_length: int | None = None,
    normalize: bool = False,
    device: str | None = None,
    trust_remote_code: bool = False,
) -> SentenceTransformer:
    """A ``SentenceTransformer`` of an Orchid encoder: token embeddings, then ``pooling`` over the real tokens.

    model: a folder (or Hub id) with an Orchid checkpoint of any text head (only its encoder is used), or such a
        model in memory (also compiled, or in ``DataParallel``; a peft model must merge its adapters first).
    tokenizer: the tokenizer (object, folder or Hub id); by default the one saved with ``model``.
    pooling: one of ``POOLING_MODES``; ``"mean"`` averages the token embeddings over the attention mask.
    max_seq_length: inputs are truncated to this many tokens; by default the model's ``max_position_embeddings``
        (Orchid's cost grows as L log L, so whole documents usually fit).
    normalize: append a ``Normalize`` module, so that embeddings have unit length (dot product = cosine).
    trust_remote_code: load the model code from the checkpoint folder, for environments without ``orchid_hf``.
    """
    sentence_transformers = require_extra("sentence_transformers", "embeddings")
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    if pooling not in POOLING_MODES:
        raise ValueError(f"pooling must be one of {POOLING_MODES}, got {pooling!r}")
    model = unwrap_model(model)
    in_memory = isinstance(model, PreTrainedModel)
    config = model.config if in_memory else AutoConfig.from_pretrained(str(model), trust_remote_code=trust_remote_code)
    if config.model_type != "orchid":
        raise ValueError(f"model must be an Orchid checkpoint, got model_type={config.model_type!r}")
    if config.image_size is not None:
        raise ValueError("model is an image model (config.image_size is set); sentence embeddings need a text model")
    if max_seq_length is None:
        max_seq_length = config.max_position_embeddings
    if not 1 <= max_seq_length <= config.max_position_embeddings:
        raise ValueError(
            f"max_seq_length must lie in [1, max_position_embeddings={config.max_position_embeddings}], "
            f"got {max_seq_length}"
        )
    if in_memory and tokenizer is None:
        raise ValueError("a model in memory needs its tokenizer: pass tokenizer=")

    with tempfile.TemporaryDirectory() as staging:
        if in_memory or tokenizer is not None:
            # sentence-transformers loads the encoder and the tokenizer from one folder.
            folder = staging
            if not in_memory:
                model = AutoModel.from_pretrained(str(model), trust_remote_code=trust_remote_code)
            model.base_model.save_pretrained(folder)
            if not isinstance(tokenizer, PreTrainedTokenizerBase):
                tokenizer = AutoTokenizer.from_pretrained(str(tokenizer), trust_remote_code=trust_remote_code)
            tokenizer.save_pretrained(folder)
        else:
            folder = str(model)
        transformer = Transformer(
            folder,
            max_seq_length=max_seq_length,
            model_kwargs={"trust_remote_code": trust_remote_code},
            config_kwargs={"trust_remote_code": trust_remote_code},
            processor_kwargs={"trust_remote_code": trust_remote_code},
            # Concatenating the inputs without padding (for flash attention) would convolve one text with the
            # next: Orchid's sequence mixer is global.
            unpad_inputs=False,
        )
    modules = [transformer, Pooling(config.hidden_size, pooling_mode=pooling)]
    if normalize:
        modules.append(Normalize())
    return sentence_transformers.SentenceTransformer(modules=modules, device=device)


# Where sentence-transformers' ONNX backend finds the graphs of a folder: ``backend="onnx"`` loads ``ONNX_FILE``,
# and another file of ``onnx/`` with ``model_kwargs={"file_name": ...}``.
ONNX_FILE = "onnx/model.onnx"
ONNX_INT8_FILE = "onnx/model_qint8.onnx"


def root_encoder_config(folder: Path) -> AutoConfig:
    """The config of the Orchid text encoder saved at the root of the sentence-transformers folder ``folder``; a
    ValueError naming what the folder lacks or holds instead."""
    if not (folder / "modules.json").is_file():
        raise ValueError(
            f"{folder} is not a sentence-transformers folder: it has no modules.json (save the model with "
            "SentenceTransformer.save, e.g. sentence_transformer(checkpoint).save(folder))"
        )
    modules = json.loads((folder / "modules.json").read_text())
    if not any(module.get("path", "") == "" for module in modules):
        raise ValueError(
            f"{folder}: no module of its modules.json is saved at the folder's root, where SentenceTransformer.save "
            "writes the encoder (the Transformer module)"
        )
    if not (folder / "config.json").is_file():
        raise ValueError(f"{folder}: the module at its root is not a transformers model (no config.json)")
    config = AutoConfig.from_pretrained(str(folder))
    if config.model_type != "orchid":
        raise ValueError(
            f"{folder}: the module at its root is a {config.model_type!r} model, not an Orchid text model; "
            "export_embedder_onnx exports Orchid encoders"
        )
    if config.image_size is not None:
        raise ValueError(
            f"{folder}: the module at its root is an Orchid image model (config.image_size is set), not an Orchid "
            "text model"
        )
    return config


def export_embedder_onnx(folder: str | os.PathLike, *, int8: bool = True, verify: bool = True) -> list[Path]:
    """Write the ONNX graph of the Orchid encoder of a saved sentence-transformers folder to ``folder/onnx/model.onnx``
    and, with ``int8``, its dynamic int8 quantisation to ``folder/onnx/model_qint8.onnx``; returns the written paths.

    folder: a folder written by ``SentenceTransformer.save`` (for instance of ``sentence_transformer(...)``) whose
        root module, the Transformer module, holds an Orchid text encoder.
    int8: also write the int8 graph (:func:`orchid_hf.onnx.quantize_int8`: int8 weights for the projections and
        MLPs, activations quantised at each call); with ``int8=False`` an int8 file already there is left as it is.
    verify: check the float32 graph against PyTorch with ONNX Runtime on padded batches, and raise a ValueError where
        they differ (``export_onnx(..., verify=True)``).

    The graph is :func:`orchid_hf.onnx.export_onnx`'s graph of the ``OrchidModel``, in float32: inputs
    ``input_ids``, ``attention_mask`` (and ``token_type_ids`` where the model has token types), output
    ``last_hidden_state``, the names and layout of optimum's ``ORTModelForFeatureExtraction``. The modules after the
    encoder (pooling, normalisation) are not in the graph: a caller running it with ONNX Runtime pools
    ``last_hidden_state`` as the folder's Pooling module does (docs/embeddings.md shows the mean over the attention
    mask). ``SentenceTransformer(folder, backend="onnx")`` reads ``onnx/model.onnx``, and the int8 file with
    ``model_kwargs={"file_name": "onnx/model_qint8.onnx"}``; that backend needs optimum's ``optimum.onnxruntime``
    (the ``optimum-onnx`` package), whose release 0.1.0 requires transformers < 4.58, so with transformers 5 it loads
    no model. :func:`orchid_hf.hub.push_to_hub` uploads the ``onnx/`` files with the folder.

    Refused with a ValueError naming the problem: a folder without ``modules.json``, or one whose root module is not
    an Orchid text model. Needs the ``onnx`` extra: ``pip install "orchid-hf[onnx]"``.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder} does not exist or is not a folder")
    config = root_encoder_config(folder)
    # What sentence-transformers' Transformer module loads from the root (AutoModel), in float32, the dtype the graph
    # is exported in: weights saved in half precision become float32 exactly.
    model = OrchidModel.from_pretrained(str(folder), config=config, dtype=torch.float32).eval()
    path = export_onnx(model, folder / ONNX_FILE, verify=verify)
    if not int8:
        return [path]
    return [path, quantize_int8(path, folder / ONNX_INT8_FILE)]


__all__ = ["ONNX_FILE", "ONNX_INT8_FILE", "POOLING_MODES", "export_embedder_onnx", "sentence_transformer"]
