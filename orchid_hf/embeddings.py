"""Orchid encoders as sentence-transformers models (text embeddings for similarity, retrieval and clustering).

``sentence_transformer(checkpoint)`` builds ``SentenceTransformer([Transformer, Pooling])`` (and ``Normalize`` with
``normalize=True``) from a saved Orchid folder (an ``OrchidModel``, or a task checkpoint such as ``OrchidForMaskedLM``,
whose encoder it takes) or from a model in memory. A saved ``SentenceTransformer`` folder loads with
``SentenceTransformer(path)`` once ``orchid_hf`` is imported, or with ``trust_remote_code=True`` without it (the model
code ships in the folder). Needs the ``embeddings`` extra: ``pip install "orchid-hf[embeddings]"``.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from torch import nn
from transformers import AutoConfig, AutoModel, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .extras import require_extra

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


__all__ = ["POOLING_MODES", "sentence_transformer"]
