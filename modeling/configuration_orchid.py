"""Orchid model configuration."""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Iterator
from dataclasses import fields
from typing import ClassVar

from transformers.activations import ACT2FN
from transformers.configuration_utils import PreTrainedConfig

from .orchid_layers import (
    BOOLEAN,
    FILTER_WINDOWS,
    NON_NEGATIVE_INTEGER,
    POSITIVE_INTEGER,
    POSITIVE_NUMBER,
    PROBABILITY,
    SETTING_RULES,
    OperatorSettings,
    Rule,
    changed_context,
    check_rules,
    default_transform_lengths,
    one_of,
    or_none,
    refuse,
)

MLP_TYPES = ("mlp", "glu")
# Learned absolute positions (BERT's "absolute"), or none: the long convolution's filters and the DCT's boundaries
# already tell where a token stands.
POSITION_EMBEDDING_TYPES = ("absolute", "none")
CLASSIFIER_POOLINGS = ("first", "mean")
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")
IMAGE_MIXERS = ("1d", "2d")
# The mixers a layer may have (layer_types): the Orchid operator, or transformers' ViT self-attention under the name
# transformers gives global attention in its configs ("attention" is renamed to it by PreTrainedConfig itself).
LAYER_TYPES = ("orchid", "full_attention")
# The short forms of layer_types: Hyena N-D's stacks (Sec. 4 of that paper), each for any number of layers; where the
# layers are odd, the first kind gets the extra one.
LAYER_PATTERNS = ("orchid", "attention", "orchid-first", "attention-first", "alternate")
# Keyword arguments PreTrainedConfig takes besides its fields (it turns them into attributes or drops them).
TRANSFORMERS_KEYWORDS = (
    "num_labels", "torch_dtype", "name_or_path", "output_attentions", "attn_implementation", "experts_implementation",
    "auto_map", "finetuning_task",  # the last as run_glue and orchid_hf.glue set it
)
# The fields a model reads when it is built. Edited on a built model's config, one would change nothing in memory but
# change the model saved and reloaded: the models refuse to run or save after such an edit
# (OrchidPreTrainedModel.check_config_unchanged). Not here: vocab_size (resize_token_embeddings changes it with the
# embeddings; checked against them), num_labels (checked against the classifier), pad_token_id, the initialisation,
# the label names and transformers' runtime switches.
BUILD_FIELDS = (
    *(field.name for field in fields(OperatorSettings)),
    "hidden_size", "num_hidden_layers", "intermediate_size", "hidden_act", "hidden_dropout_prob",
    "max_position_embeddings", "position_embedding_type", "type_vocab_size", "layer_norm_eps", "pre_norm",
    "mlp_type", "mlp_num_blocks", "classifier_pooling", "classifier_dropout", "image_size", "patch_size",
    "num_channels", "image_mixer", "filter_window", "layer_types", "num_attention_heads",
    "attention_probs_dropout_prob", "qkv_bias",
)  # fmt: skip

# The fields that change when a text model's context is extended (OrchidModel.resize_position_embeddings).
CONTEXT_FIELDS = ("max_position_embeddings", "transform_lengths", "filter_lag_scale")

# The CIFAR-10 models of Table 4.5 / C.3 differ only in width. As for ImageNet (Sec. 4.3), the MLPs are block-diagonal
# (4 blocks, width ratio 4, as ViT) and each layer has a residual long convolution. The paper gives neither the MLP's
# nor the implicit filter's width for CIFAR: a filter of width 40 (with the authors' two inner layers) brings
# Orchid-s at 4x4 patches to 730K parameters, the paper's 735K. The paper's other CIFAR counts cannot all be met
# (docs/model.md, "Parameter counts").
CIFAR_VIT = dict(
    image_size=32,
    patch_size=4,
    num_channels=3,
    num_hidden_layers=6,
    mlp_type="mlp",
    mlp_num_blocks=4,
    short_conv_size=3,
    conditioning_time_kernel_size=3,
    conditioning_freq_kernel_size=3,
    filter_emb_dim=5,
    filter_width=40,
    residual_long_conv=True,
    pre_norm=True,
    hidden_dropout_prob=0.0,
    layer_norm_eps=1e-6,
    tie_word_embeddings=False,
    num_labels=10,
)

# Orchid-BERT's text settings (Sec. 4.2): BERT's vocabulary and sequence length, block-diagonal GLU MLPs, short
# convolutions of 3, and a residual long convolution.
BERT_TEXT = dict(
    vocab_size=30522,
    max_position_embeddings=128,
    mlp_type="glu",
    mlp_num_blocks=4,
    short_conv_size=3,
    filter_emb_dim=5,
    residual_long_conv=True,
)

# The model sizes of the paper (Sec. 4.2, 4.3; Tables 4.4, 4.5, C.3). Parameter counts in the paper:
# bert-base 77M, bert-large 254M, vit-cifar-s 735K, vit-cifar-m 2.0M, vit-imagenet 48M.
PRESETS: dict[str, dict] = {
    "orchid-bert-base": dict(BERT_TEXT, hidden_size=768, num_hidden_layers=12, intermediate_size=3072),
    "orchid-bert-large": dict(BERT_TEXT, hidden_size=1536, num_hidden_layers=12, intermediate_size=6144),
    # orchid-bert-base for long text: without a position table, which a long model learns slowly and the filters'
    # lags make unneeded (docs/results/long_context.md, "What makes a model built for 2,048 tokens learn less"), and
    # with word embeddings from N(0, 0.3^2), with which the text settings learn associative recall and BERT's 0.02
    # does not (docs/model.md, "orchid-recall").
    "orchid-bert-long": dict(
        BERT_TEXT, hidden_size=768, num_hidden_layers=12, intermediate_size=3072, max_position_embeddings=2048,
        position_embedding_type="none", word_embedding_init_std=0.3,
    ),  # fmt: skip
    "orchid-vit-cifar-s": dict(CIFAR_VIT, hidden_size=128, intermediate_size=512),
    "orchid-vit-cifar-m": dict(CIFAR_VIT, hidden_size=220, intermediate_size=880),
    # Orchid-s with the 2-D operator over the patch grid, and the hybrid of Hyena N-D's best stack ("Hyena first"):
    # 2-D Orchid layers first, then transformers' ViT self-attention (4 heads of 32), the same width and MLPs.
    "orchid-vit-2d-s": dict(CIFAR_VIT, hidden_size=128, intermediate_size=512, image_mixer="2d"),
    "orchid-vit-2d-hybrid-s": dict(
        CIFAR_VIT, hidden_size=128, intermediate_size=512, image_mixer="2d", layer_types="orchid-first",
        num_attention_heads=4,
    ),  # fmt: skip
    # The synthetic-task model of App. C.1: 2 blocks of width 64, short convolutions of length 3 in time and
    # frequency. Pre-norm blocks, no dropout and word embeddings drawn from N(0, 1) let it learn associative recall
    # (docs/results/associative_recall.md); vocab_size and max_position_embeddings are the task's.
    "orchid-recall": dict(
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        short_conv_size=3,
        conditioning_time_kernel_size=3,
        conditioning_freq_kernel_size=3,
        pre_norm=True,
        hidden_dropout_prob=0.0,
        word_embedding_init_std=1.0,
        type_vocab_size=0,
        pad_token_id=None,
    ),
    "orchid-vit-imagenet": dict(
        image_size=224,
        patch_size=16,
        num_channels=3,
        hidden_size=768,
        num_hidden_layers=12,
        intermediate_size=3072,
        mlp_type="mlp",
        mlp_num_blocks=4,
        short_conv_size=5,
        conditioning_time_kernel_size=5,
        conditioning_freq_kernel_size=5,
        filter_emb_dim=33,
        residual_long_conv=True,
        pre_norm=True,
        hidden_dropout_prob=0.0,
        layer_norm_eps=1e-6,
        tie_word_embeddings=False,
        num_labels=1000,
    ),
}

# Every class of modeling_orchid.py, so that a saved folder loads with any Auto class through remote code.
AUTO_MAP = {
    "AutoConfig": "configuration_orchid.OrchidConfig",
    "AutoModel": "modeling_orchid.OrchidModel",
    "AutoModelForMaskedLM": "modeling_orchid.OrchidForMaskedLM",
    "AutoModelForSequenceClassification": "modeling_orchid.OrchidForSequenceClassification",
    "AutoModelForTokenClassification": "modeling_orchid.OrchidForTokenClassification",
    "AutoModelForImageClassification": "modeling_orchid.OrchidForImageClassification",
    "AutoModelForQuestionAnswering": "modeling_orchid.OrchidForQuestionAnswering",
    "AutoModelForMultipleChoice": "modeling_orchid.OrchidForMultipleChoice",
}


# The rule of each field of OrchidConfig besides the operator's settings (SETTING_RULES): checked where a config is
# built, and again after transformers sets the overrides of from_pretrained.
FIELD_RULES: dict[str, Rule] = {
    "vocab_size": POSITIVE_INTEGER,
    "hidden_size": POSITIVE_INTEGER,
    "num_hidden_layers": POSITIVE_INTEGER,
    "intermediate_size": POSITIVE_INTEGER,
    "hidden_act": Rule("an activation transformers knows (ACT2FN), e.g. 'gelu', 'gelu_new', 'relu', 'silu'",
                       lambda value: isinstance(value, str) and value in ACT2FN),
    "hidden_dropout_prob": PROBABILITY,
    "max_position_embeddings": POSITIVE_INTEGER,
    "position_embedding_type": one_of(POSITION_EMBEDDING_TYPES),
    "type_vocab_size": NON_NEGATIVE_INTEGER,
    "initializer_range": POSITIVE_NUMBER,
    "word_embedding_init_std": or_none(POSITIVE_NUMBER),
    "layer_norm_eps": POSITIVE_NUMBER,
    "pre_norm": BOOLEAN,
    "mlp_type": one_of(MLP_TYPES),
    "mlp_num_blocks": POSITIVE_INTEGER,
    "classifier_pooling": one_of(CLASSIFIER_POOLINGS),
    "classifier_dropout": or_none(PROBABILITY),
    "image_size": or_none(POSITIVE_INTEGER),
    "patch_size": or_none(POSITIVE_INTEGER),
    "num_channels": POSITIVE_INTEGER,
    "image_mixer": one_of(IMAGE_MIXERS),
    "filter_window": or_none(one_of(FILTER_WINDOWS)),
    "layer_types": or_none(Rule(
        f"a list of {LAYER_TYPES} (one per layer) or one of {LAYER_PATTERNS}",
        lambda value: isinstance(value, (list, tuple)) and all(kind in LAYER_TYPES for kind in value),
    )),
    "num_attention_heads": POSITIVE_INTEGER,
    "attention_probs_dropout_prob": PROBABILITY,
    "chunk_size_feed_forward": NON_NEGATIVE_INTEGER,
}


class OrchidConfig(PreTrainedConfig, OperatorSettings):
    r"""Configuration of an Orchid encoder: BERT-style for text, ViT-style for images.

    A config with ``image_size`` set describes a vision model (patch embeddings, sequence length
    ``(image_size / patch_size) ** 2``); otherwise a text model (word, position and token-type embeddings,
    sequence length up to ``max_position_embeddings``). ``OrchidConfig.from_preset(name)`` gives the paper's
    sizes; the names are in ``OrchidConfig.preset_names()``. ``position_embedding_type``: ``"absolute"`` (learned
    positions, as BERT) or ``"none"`` (no position embeddings; the long convolution's filters place the tokens).

    Sequence mixer: the fields of ``OperatorSettings`` (``transform``, ``conditioning``, ``short_conv_size``, the
    conditioning network's and the implicit filters' sizes, ``residual_long_conv``; documented there), passed to
    every layer's ``OrchidOperator`` as they are.

    Dimension mixer: ``mlp_type`` ``"mlp"`` or ``"glu"``, with ``mlp_num_blocks`` block-diagonal blocks (1 is dense).
    ``initializer_range`` is the standard deviation of BERT's initialisation; ``word_embedding_init_std``, when set,
    replaces it for the word embeddings (the ``orchid-recall`` preset draws them from N(0, 1), see docs/model.md).
    ``pre_norm`` puts LayerNorm before each sublayer (ViT) instead of after the residual (BERT).
    ``chunk_size_feed_forward`` (transformers' field, read as BERT reads it): everything after each layer's mixer (the
    residual sums, the LayerNorms and the MLP) acts on each token alone and runs on runs of this many tokens, so that
    the MLP's wide intermediate tensors stay small on long inputs; 0 runs all tokens at once.
    ``classifier_pooling``: ``"first"`` real token or ``"mean"`` over real tokens for sequence classification. The
    default stays ``"first"`` (a config.json without the field gets it); the recipe for one's own data sets ``"mean"``
    for a new head (docs/model.md, "Pooling").

    Image models: ``image_mixer`` ``"1d"`` mixes the patches as one sequence, row after row (the paper's Orchid-ViT),
    ``"2d"`` over their grid (``OrchidOperator2d``), whose implicit filters have the window ``filter_window``
    (``"dimensional"``, the default, or ``"symmetric"``; 2-D only). ``layer_types`` gives each layer's mixer,
    ``"orchid"`` or ``"full_attention"`` (transformers' ViT self-attention, with ``num_attention_heads``,
    ``attention_probs_dropout_prob`` and ``qkv_bias``), as a list of ``num_hidden_layers`` entries or a short form of
    ``LAYER_PATTERNS`` (``"orchid-first"``: Orchid for the first half of the layers, attention for the rest); None is
    Orchid in every layer.
    """

    model_type = "orchid"
    # save_pretrained copies this file and the modeling files next to the weights (remote code).
    _auto_class: ClassVar[str | None] = "AutoConfig"

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    max_position_embeddings: int = 128
    position_embedding_type: str = "absolute"
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    word_embedding_init_std: float | None = None
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0
    tie_word_embeddings: bool = True
    pre_norm: bool = False
    mlp_type: str = "glu"
    mlp_num_blocks: int = 4
    classifier_pooling: str = "first"
    classifier_dropout: float | None = None
    image_size: int | None = None
    patch_size: int | None = None
    num_channels: int = 3
    image_mixer: str = "1d"
    filter_window: str | None = None
    layer_types: list[str] | None = None
    num_attention_heads: int = 4
    attention_probs_dropout_prob: float = 0.0
    qkv_bias: bool = True
    chunk_size_feed_forward: int = 1024

    def __post_init__(self, **kwargs):
        kwargs.setdefault("auto_map", dict(AUTO_MAP))
        # The short form first: PreTrainedConfig renames legacy entries of a layer_types list, and would split a string.
        if isinstance(self.layer_types, str):
            self.layer_types = layer_pattern(self.layer_types, self.num_hidden_layers)
        # transformers keeps unknown keywords as attributes on purpose (custom fields; keys of configs saved by other
        # versions), so a misspelt field cannot be an error here: it is a warning naming the field meant.
        for name in kwargs:
            if not self.is_field_name(name):
                closest = self.closest_field(name)
                if closest is not None:
                    warnings.warn(
                        f"OrchidConfig got {name!r}, which is not one of its fields; did you mean {closest!r}? "
                        f"It is kept as an attribute and changes nothing in the model.",
                        UserWarning,
                        stacklevel=4,
                    )
        super().__post_init__(**kwargs)
        self._check_values()

    @classmethod
    def field_names(cls) -> list[str]:
        return [field.name for field in fields(cls)]

    @classmethod
    def is_field_name(cls, name: str) -> bool:
        """Whether ``name`` is a field of the config or a keyword transformers' config takes besides its fields."""
        return name in cls.field_names() or name in TRANSFORMERS_KEYWORDS

    @classmethod
    def closest_field(cls, name: str) -> str | None:
        matches = difflib.get_close_matches(name, cls.field_names() + list(TRANSFORMERS_KEYWORDS), n=1, cutoff=0.8)
        return matches[0] if matches else None

    @classmethod
    def preset_names(cls) -> list[str]:
        return list(PRESETS)

    @classmethod
    def from_preset(cls, name: str, **overrides) -> OrchidConfig:
        """The configuration of a named model of the paper, with any field overridden."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; available presets: {', '.join(PRESETS)}")
        for key in overrides:
            if not cls.is_field_name(key):
                closest = cls.closest_field(key)
                hint = f"; did you mean {closest!r}?" if closest else " (OrchidConfig.field_names() lists them)"
                raise ValueError(f"{key!r} is not a field of OrchidConfig{hint}")
        return cls(**{**PRESETS[name], **overrides})

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        """``PreTrainedConfig.from_dict``, with the rules of construction also for the overrides that transformers
        sets afterwards (``from_pretrained(path, layer_norm_eps=...)``): a short form of ``layer_types`` is expanded
        and every field is checked again.

        A config saved before ``transform_lengths`` existed reads as one transform length, the longest input (the
        length such models were trained at). Where ``max_position_embeddings`` is given anew for a text model, the
        context is extended (or cut) as :meth:`OrchidModel.resize_position_embeddings` does it
        (:func:`changed_context`, the filters' lag scale kept); the config then remembers the checkpoint's own
        context, so that ``from_pretrained`` with it (an Auto class, remote code) loads the weights at their size and
        resizes the model."""
        config_dict = dict(config_dict)
        saved = config_dict.get("max_position_embeddings", cls.max_position_embeddings)
        if config_dict.get("image_size") is not None:
            saved = (config_dict["image_size"] // config_dict.get("patch_size", 1)) ** 2
        if "transform_lengths" not in config_dict:
            config_dict["transform_lengths"] = [saved]
        wanted = kwargs.get("max_position_embeddings")
        checkpoint = None
        if wanted is not None and wanted != saved and config_dict.get("image_size") is None:
            checkpoint = {name: config_dict.get(name) for name in CONTEXT_FIELDS}
            checkpoint["max_position_embeddings"] = saved
            lengths = config_dict["transform_lengths"]
            lengths = default_transform_lengths(saved) if lengths is None else tuple(lengths)
            config_dict["max_position_embeddings"] = wanted
            config_dict["filter_lag_scale"] = config_dict.get("filter_lag_scale") or saved
            config_dict["transform_lengths"] = list(changed_context(saved, lengths, wanted))
        loaded = super().from_dict(config_dict, **kwargs)
        config = loaded[0] if isinstance(loaded, tuple) else loaded
        if isinstance(config.layer_types, str):
            config.layer_types = layer_pattern(config.layer_types, config.num_hidden_layers)
        config._check_values()
        if checkpoint is not None:
            config._checkpoint_context = checkpoint
        return loaded

    def to_dict(self) -> dict:
        output = super().to_dict()
        output.pop("_checkpoint_context", None)  # what from_pretrained loads first: not a setting of the model
        return output

    @property
    def is_vision(self) -> bool:
        return self.image_size is not None

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def resolved_layer_types(self) -> list[str]:
        """Each layer's mixer: ``layer_types``, or Orchid in every layer."""
        return list(self.layer_types) if self.layer_types is not None else ["orchid"] * self.num_hidden_layers

    @property
    def max_sequence_length(self) -> int:
        """Transform length of every Orchid operator: the number of patches, or max_position_embeddings."""
        return self.num_patches if self.is_vision else self.max_position_embeddings

    def _check_values(self) -> None:
        """A ValueError naming the first field that is out of range (:data:`FIELD_RULES`, the operator's
        ``SETTING_RULES``), and its value; or the first rule between fields that is broken (:meth:`field_problems`)."""
        check_rules("OrchidConfig", vars(self), {**SETTING_RULES, **FIELD_RULES})
        refuse(self.field_problems())

    def field_problems(self) -> Iterator[str]:
        """The rules between fields: what is wrong, in words."""
        for name in ("hidden_size", "intermediate_size"):
            if getattr(self, name) % self.mlp_num_blocks:
                blocks = self.mlp_num_blocks
                yield f"OrchidConfig.{name}={getattr(self, name)} must be divisible by mlp_num_blocks={blocks}"
        if self.pad_token_id is not None and not self.is_vision and not 0 <= self.pad_token_id < self.vocab_size:
            yield f"OrchidConfig.pad_token_id={self.pad_token_id} is outside vocab_size={self.vocab_size}"
        if self.is_vision:
            if self.patch_size is None or self.image_size % self.patch_size:
                yield f"OrchidConfig.patch_size={self.patch_size} must divide image_size={self.image_size}"
            elif self.hidden_size % 4:
                yield (f"OrchidConfig.hidden_size={self.hidden_size} must be divisible by 4 for the 2-D sinusoidal "
                       "position embeddings of image models")  # fmt: skip
        elif self.patch_size is not None:
            yield f"OrchidConfig.patch_size={self.patch_size} is set but image_size is not"
        yield from self.mixer_problems()
        if self.num_labels is not None and self.num_labels < 1:
            yield f"OrchidConfig.num_labels must be >= 1, got {self.num_labels}"
        if self.problem_type is not None and self.problem_type not in PROBLEM_TYPES:
            yield f"OrchidConfig.problem_type={self.problem_type!r} is not one of {PROBLEM_TYPES}"
        if not (self.is_vision and self.patch_size is None):
            grid = (self.image_size // self.patch_size,) * 2 if self.image_mixer == "2d" and self.is_vision else None
            length_name = "the number of patches" if self.is_vision else "max_position_embeddings"
            yield from self.setting_problems("OrchidConfig", self.max_sequence_length, grid, length_name)

    def mixer_problems(self) -> Iterator[str]:
        """The rules of the image mixer, the filters' window and the layer types."""
        if self.image_mixer == "2d" and not self.is_vision:
            yield ("OrchidConfig.image_mixer='2d' mixes a grid of patches: it needs an image config (image_size and "
                   "patch_size)")  # fmt: skip
        if self.filter_window is not None and self.image_mixer != "2d":
            yield (f"OrchidConfig.filter_window={self.filter_window!r} is the window of the 2-D filters: it needs "
                   f"image_mixer='2d', got image_mixer={self.image_mixer!r}")  # fmt: skip
        types = self.layer_types
        if types is None:
            return
        if len(types) != self.num_hidden_layers:
            yield f"OrchidConfig.layer_types has {len(types)} entries, num_hidden_layers={self.num_hidden_layers}"
        if "full_attention" in types:
            if not self.is_vision:
                yield ("OrchidConfig.layer_types has attention layers, which image models have (ViT's self-attention "
                       "without an attention mask); a text config (image_size None) cannot have them")  # fmt: skip
            if self.hidden_size % self.num_attention_heads:
                yield (f"OrchidConfig.num_attention_heads={self.num_attention_heads} must divide "
                       f"hidden_size={self.hidden_size}")  # fmt: skip

    def validate(self) -> None:
        """PreTrainedConfig's validation, which ``save_pretrained`` runs: each of its validators, with this class's
        own ``validate_layer_type`` (transformers' allows only transformers' layer names, which "orchid" is not)."""
        for name in dir(PreTrainedConfig):
            if name.startswith("validate_") and callable(getattr(PreTrainedConfig, name)):
                getattr(self, name)()

    def validate_layer_type(self) -> None:
        """``layer_types`` with Orchid's layer types: the config's own checks (:meth:`_check_values`)."""
        self._check_values()


def layer_pattern(name: str, num_layers: int) -> list[str]:
    """The ``layer_types`` of a short form (``LAYER_PATTERNS``) for ``num_layers`` layers."""
    check_rules("OrchidConfig", {"layer_types": name, "num_hidden_layers": num_layers},
                {"layer_types": one_of(LAYER_PATTERNS), "num_hidden_layers": POSITIVE_INTEGER})  # fmt: skip
    first = (num_layers + 1) // 2
    orchid, attention = "orchid", "full_attention"
    patterns = {
        "orchid": [orchid] * num_layers,
        "attention": [attention] * num_layers,
        "orchid-first": [orchid] * first + [attention] * (num_layers - first),
        "attention-first": [attention] * first + [orchid] * (num_layers - first),
        "alternate": [orchid if index % 2 == 0 else attention for index in range(num_layers)],
    }
    return patterns[name]


__all__ = ["OrchidConfig", "PRESETS"]
