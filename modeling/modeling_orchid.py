"""Orchid encoders for transformers: BERT-style text models and ViT-style image models whose attention is replaced by
the Orchid operator (Karami & Ghodsi, NeurIPS 2024, Sec. 4.2 and 4.3).

Layout, as in ``modeling_bert.py``: embeddings -> layers (sequence mixer, MLP) -> encoder -> pretrained base class ->
base model -> task heads. Inputs are checked once, where they enter (``OrchidModel`` and the heads); the layers take
a :class:`SequenceLayout` computed once per call and read no tensor value on the host.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator

import torch
from torch import nn
from torch.nn import BCEWithLogitsLoss, CrossEntropyLoss, MSELoss
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    ImageClassifierOutput,
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.modeling_utils import PreTrainedModel
from transformers.models.vit.modeling_vit import ViTAttention
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, logging
from transformers.utils.generic import can_return_tuple

from .configuration_orchid import BUILD_FIELDS, PROBLEM_TYPES, OrchidConfig
from .orchid_layers import (
    BlockDiagonalLinear,
    DerivedBuffers,
    FoldedFilter,
    ImplicitFilter,
    ImplicitFilter2d,
    OrchidOperator,
    OrchidOperator2d,
    ShortConvolution,
    Sin,
    changed_context,
    check_attention_mask,
    check_tensor,
    check_values,
    check_whole_values,
    mask_rule,
    refuse,
    value_range,
)
from .orchid_ops import SequenceLayout, is_traced, masked, refuse_jit_trace

logger = logging.get_logger(__name__)

# ---------------------------------------------------------------------------------------------
# Embeddings
# ---------------------------------------------------------------------------------------------


class OrchidEmbeddings(nn.Module):
    """Word, learned position and token-type embeddings, then LayerNorm and dropout (as BERT)."""

    def __init__(self, config: OrchidConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.max_positions = config.max_position_embeddings
        self.position_embeddings = (
            nn.Embedding(config.max_position_embeddings, config.hidden_size)
            if config.position_embedding_type == "absolute"
            else None
        )
        self.token_type_embeddings = (
            nn.Embedding(config.type_vocab_size, config.hidden_size) if config.type_vocab_size > 0 else None
        )
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The embeddings of a layout's tokens (:class:`SequenceLayout`). ``mask`` (B, L, 1, bool), where the tokens
        include padded positions (traced), marks the real ones: the word embeddings of the others are cleared, whether
        they come from ``input_ids`` or ``inputs_embeds``, since a caller's embeddings may hold NaN or inf at padded
        positions, which through the LayerNorms' gradients would otherwise reach the weights."""
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        inputs_embeds = masked(inputs_embeds, mask)
        batch, length = inputs_embeds.shape[:2]
        embeddings = inputs_embeds
        if self.position_embeddings is not None:
            if position_ids is None:
                position_ids = torch.arange(length, device=inputs_embeds.device).expand(batch, length)
            embeddings = embeddings + self.position_embeddings(position_ids)
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros(batch, length, dtype=torch.long, device=inputs_embeds.device)
            embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(embeddings))


def sinusoidal_position_embeddings_2d(grid_size: int, dim: int) -> torch.Tensor:
    """Fixed 2-D sin-cos position embeddings of a ``grid_size x grid_size`` patch grid, shape (grid**2, dim)."""
    quarter = dim // 4
    omega = 1.0 / 10000 ** (torch.arange(quarter, dtype=torch.float32, device="cpu") / max(quarter - 1, 1))
    grid = torch.arange(grid_size, device="cpu")
    rows, cols = torch.meshgrid(grid, grid, indexing="ij")
    row_angles = rows.flatten().float()[:, None] * omega[None]
    col_angles = cols.flatten().float()[:, None] * omega[None]
    return torch.cat([col_angles.sin(), col_angles.cos(), row_angles.sin(), row_angles.cos()], dim=1)


class OrchidPatchEmbeddings(DerivedBuffers):
    """Non-overlapping patches (a convolution with stride = patch size) plus fixed sinusoidal positions (a derived
    buffer: float32 and exact whatever the model's dtype, see :class:`DerivedBuffers`)."""

    def __init__(self, config: OrchidConfig):
        super().__init__()
        self.image_size = config.image_size
        self.num_channels = config.num_channels
        self.hidden_size = config.hidden_size
        self.grid_size = config.image_size // config.patch_size
        self.projection = nn.Conv2d(
            config.num_channels, config.hidden_size, kernel_size=config.patch_size, stride=config.patch_size
        )
        self.register_buffer("position_embeddings", self.derived_buffers()["position_embeddings"], persistent=False)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def derived_buffers(self) -> dict[str, torch.Tensor]:
        return {"position_embeddings": sinusoidal_position_embeddings_2d(self.grid_size, self.hidden_size)}

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        patches = self.projection(pixel_values.to(self.projection.weight.dtype)).flatten(2).transpose(1, 2)
        return self.dropout(patches + self.position_embeddings.to(patches.dtype))


# ---------------------------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------------------------


def feature_linear(in_features: int, out_features: int, num_blocks: int) -> nn.Module:
    """A dense ``nn.Linear``, or a block-diagonal layer of ``num_blocks`` ``nn.Linear`` blocks (Monarch of order 1)."""
    if num_blocks == 1:
        return nn.Linear(in_features, out_features)
    return BlockDiagonalLinear(in_features, out_features, num_blocks)


class OrchidMLP(nn.Module):
    """The dimension mixer: ``W2 act(W1 x)``, or the GLU ``W2 (act(W1 x) * W1' x)`` of M2-BERT, where W1 and W1' are
    the two halves of ``up_proj``."""

    def __init__(self, config: OrchidConfig):
        super().__init__()
        self.is_glu = config.mlp_type == "glu"
        up_features = 2 * config.intermediate_size if self.is_glu else config.intermediate_size
        self.up_proj = feature_linear(config.hidden_size, up_features, config.mlp_num_blocks)
        self.down_proj = feature_linear(config.intermediate_size, config.hidden_size, config.mlp_num_blocks)
        self.act = ACT2FN[config.hidden_act]
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = self.up_proj(hidden_states)
        if self.is_glu:
            gate, value = hidden_states.chunk(2, dim=-1)
            hidden_states = self.act(gate) * value
        else:
            hidden_states = self.act(hidden_states)
        return self.dropout(self.down_proj(hidden_states))


def sequence_mixer(config: OrchidConfig, layer_type: str) -> nn.Module:
    """The mixer of a layer of ``layer_type`` (``config.layer_types``): the Orchid operator along the sequence
    (``OrchidOperator``) or, for ``image_mixer="2d"``, over the patch grid (``OrchidOperator2d``); or transformers'
    ViT self-attention (``"full_attention"``), reused as it is."""
    if layer_type == "full_attention":
        return ViTAttention(config)
    if config.image_mixer == "2d":
        return OrchidOperator2d.from_config(config)
    return OrchidOperator.from_config(config)


class OrchidLayer(GradientCheckpointingLayer):
    """One block: a sequence mixer and the MLP, each with a residual connection and LayerNorm. The mixer is the Orchid
    operator, or in the layers that ``config.layer_types`` marks ``"full_attention"`` ViT's self-attention
    (:func:`sequence_mixer`).

    Post-norm (BERT, M2-BERT): ``x = LN(x + mixer(x)); x = LN(x + mlp(x))``.
    Pre-norm (ViT): ``x = x + mixer(LN(x)); x = x + mlp(LN(x))``.
    """

    def __init__(self, config: OrchidConfig, layer_type: str = "orchid"):
        super().__init__()
        self.pre_norm = config.pre_norm
        self.chunk_size_feed_forward = config.chunk_size_feed_forward
        self.mixer = sequence_mixer(config, layer_type)
        self.mixer_dropout = nn.Dropout(config.hidden_dropout_prob)
        self.mixer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = OrchidMLP(config)
        self.mlp_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor, layout: SequenceLayout) -> torch.Tensor:
        """``hidden_states``: the tokens of ``layout`` (:class:`SequenceLayout`, computed once per call by
        ``OrchidModel``), (1, T, d), or (B, L, d) where every position is a token."""
        mixer_input = self.mixer_norm(hidden_states) if self.pre_norm else hidden_states
        mixed = self.mixer_dropout(self.mix(mixer_input, layout))
        # Everything after the mixer acts on each token alone: runs of chunk_size_feed_forward tokens keep the MLP's
        # wide intermediate tensors small, where whole ones would take fresh pages from the operating system on every
        # call (`scripts/benchmark.py --parts model` times long inputs). Compiled or exported, one run: the compiler
        # plans the memory, and a branch on the token count would tie the graph to one side of it.
        size = self.chunk_size_feed_forward
        if size <= 0 or is_traced() or hidden_states.shape[0] * hidden_states.shape[1] <= size:
            return self.feed_forward(hidden_states, mixed)
        width = hidden_states.shape[-1]
        chunks = zip(hidden_states.reshape(-1, width).split(size), mixed.reshape(-1, width).split(size))
        return torch.cat([self.feed_forward(*chunk) for chunk in chunks]).view(hidden_states.shape)

    def feed_forward(self, hidden_states: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
        """The residual connection around the mixer, and the MLP with its own, with their LayerNorms."""
        if self.pre_norm:
            hidden_states = hidden_states + mixed
            return hidden_states + self.mlp(self.mlp_norm(hidden_states))
        hidden_states = self.mixer_norm(hidden_states + mixed)
        return self.mlp_norm(hidden_states + self.mlp(hidden_states))

    def mix(self, hidden_states: torch.Tensor, layout: SequenceLayout) -> torch.Tensor:
        """The mixer's output for ``hidden_states``."""
        if isinstance(self.mixer, OrchidOperator):
            return self.mixer(hidden_states, layout=layout)
        if isinstance(self.mixer, ViTAttention):
            return self.mixer(hidden_states)[0]  # the images of a batch have no padding: no attention mask
        return self.mixer(hidden_states)  # OrchidOperator2d, over the grid of patches it was built for


class OrchidEncoder(nn.Module):
    def __init__(self, config: OrchidConfig):
        super().__init__()
        self.layer = nn.ModuleList(OrchidLayer(config, layer_type) for layer_type in config.resolved_layer_types)
        # Pre-norm stacks end with a LayerNorm, as ViT does.
        self.final_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if config.pre_norm else None

    def forward(
        self, hidden_states: torch.Tensor, layout: SequenceLayout, output_hidden_states: bool = False
    ) -> BaseModelOutput:
        """``hidden_states``: the tokens of ``layout``; returns the batch's (B, L, d), zero at padded positions. Each
        hidden state returned is the one the next layer reads (its gradient reaches ``retain_grad()``)."""
        all_hidden_states = () if output_hidden_states else None
        for layer in self.layer:
            if output_hidden_states:
                all_hidden_states += (layout.restore(hidden_states),)
                hidden_states = layout.gather(all_hidden_states[-1])
            hidden_states = layer(hidden_states, layout)
        if output_hidden_states:
            all_hidden_states += (layout.restore(hidden_states),)
            hidden_states = layout.gather(all_hidden_states[-1])
        if self.final_norm is not None:
            hidden_states = self.final_norm(hidden_states)
        return BaseModelOutput(last_hidden_state=layout.restore(hidden_states), hidden_states=all_hidden_states)


# ---------------------------------------------------------------------------------------------
# Pretrained base
# ---------------------------------------------------------------------------------------------


class OrchidPreTrainedModel(PreTrainedModel):
    config_class = OrchidConfig
    config: OrchidConfig
    base_model_prefix = "orchid"
    supports_gradient_checkpointing = True
    _no_split_modules = ["OrchidLayer"]
    # The attention layers of hybrid image models (layer_types) are ViT's, which dispatch to SDPA like ViT's own.
    _supports_sdpa = True
    # The implicit filters' sine features of the lag and the conditioning network, which feeds the transforms, stay
    # in float32 when the model is loaded or built in half precision.
    _keep_in_fp32_modules_strict = ["static_filter", "residual_filter", "conditioning"]
    # The losses are means over the batch: Trainer divides them by its gradient accumulation steps itself (a forward
    # that takes **kwargs would otherwise make it expect num_items_in_batch to be used).
    accepts_loss_kwargs = False
    # The layer whose outputs are the classes, checked against config.num_labels (None: a head without one).
    num_labels_layer: str | None = None
    # The inputs a head takes: "text", "image", or None (OrchidModel takes either).
    modality: str | None = None

    def __init__(self, config: OrchidConfig, *inputs, **kwargs):
        super().__init__(config, *inputs, **kwargs)
        if self.modality is not None and config.is_vision != (self.modality == "image"):
            needs = "a text config (config.image_size must be None)" if self.modality == "text" else (
                "an image config (set image_size and patch_size)")
            raise ValueError(f"{type(self).__name__} needs {needs}")
        # A config edited since it was built (or given a loading override) meets the rules of construction again.
        config._check_values()
        # The settings this model is built from: see check_config_describes_model.
        self.built_settings = {name: getattr(self.config, name) for name in BUILD_FIELDS}

    def post_init(self):
        super().post_init()
        # Built under a half-precision default dtype (``from_config(config, dtype=torch.bfloat16)``), the modules that
        # from_pretrained keeps in float32 have been created in half precision: cast them back, as loading does.
        if torch.get_default_dtype() in (torch.float16, torch.bfloat16):
            for name, module in self.named_modules():
                if set(name.split(".")) & set(self._keep_in_fp32_modules_strict):
                    module.float()

    def check_config_describes_model(self) -> None:
        """A ValueError if the config no longer describes this model: a setting the model was built from has been
        edited since, or ``vocab_size`` or ``num_labels`` differ from the layers they size.

        The model in memory does not follow such an edit, but a copy saved and reloaded would be built from the edited
        config: the two would differ. ``save_pretrained`` refuses to write it. ``resize_token_embeddings`` changes
        ``vocab_size`` with the embeddings; the label names, ``problem_type``, ``pad_token_id`` and transformers'
        runtime switches (``return_dict``, ``output_hidden_states``, the dtype, ...) stay free to edit.
        """
        config = self.config
        for name, built in self.built_settings.items():
            current = getattr(config, name, None)
            if current != built:
                raise ValueError(
                    f"config.{name}={current!r} but this model was built with {name}={built!r}; a setting a model is "
                    "built from cannot change afterwards (the model in memory would not follow it, a saved and "
                    "reloaded copy would). Build a new model from the edited config, or set the value back."
                )
        if not config.is_vision:
            rows = self.get_input_embeddings().num_embeddings
            if config.vocab_size != rows:
                raise ValueError(
                    f"config.vocab_size={config.vocab_size} but the word embeddings have {rows} rows; "
                    "resize_token_embeddings changes both"
                )
        # peft wraps the layer it trains whole (modules_to_save); the wrapper passes out_features on.
        outputs = None if self.num_labels_layer is None else getattr(self, self.num_labels_layer).out_features
        if outputs is not None and config.num_labels != outputs:
            raise ValueError(
                f"config.num_labels={config.num_labels} but the {self.num_labels_layer} has {outputs} outputs; "
                "build a new model with num_labels set (from_pretrained(..., num_labels=n, "
                "ignore_mismatched_sizes=True) for a checkpoint), or replace the layer as well"
            )

    def get_position_embeddings(self) -> nn.Embedding:
        return self.base_model.get_position_embeddings()

    def resize_position_embeddings(self, new_num_position_embeddings: int) -> None:
        """:meth:`OrchidModel.resize_position_embeddings`: extend (or cut) the model's context."""
        self.base_model.resize_position_embeddings(new_num_position_embeddings)
        self.built_settings = {name: getattr(self.config, name) for name in BUILD_FIELDS}

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """``PreTrainedModel.from_pretrained``; ``max_position_embeddings=N`` other than the checkpoint's extends (or
        cuts) the loaded model's context to N tokens (:meth:`OrchidModel.resize_position_embeddings`). So does a
        ``config`` that ``OrchidConfig.from_pretrained(path, max_position_embeddings=N)`` extended, as the Auto classes
        pass it: the weights are loaded at the checkpoint's own context, then the model is resized."""
        positions = kwargs.pop("max_position_embeddings", None)
        config = kwargs.get("config")
        checkpoint = getattr(config, "_checkpoint_context", None)
        if checkpoint is not None:
            positions = config.max_position_embeddings if positions is None else positions
            kwargs["config"] = copy.deepcopy(config)
            del kwargs["config"]._checkpoint_context
            for name, value in checkpoint.items():
                setattr(kwargs["config"], name, value)
        loaded = super().from_pretrained(*args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded
        if positions is not None and positions != model.config.max_position_embeddings:
            model.resize_position_embeddings(positions)
        return loaded

    def save_pretrained(self, *args, **kwargs):
        """``PreTrainedModel.save_pretrained``, refusing a config that no longer describes the model
        (:meth:`check_config_describes_model`) and a copy made by ``optimize_for_inference``, whose folded filters
        have no weights to save."""
        if any(isinstance(module, FoldedFilter) for module in self.modules()):
            raise ValueError(
                "this copy was made by optimize_for_inference: its implicit filters are folded into buffers and have "
                "no weights to save; save the model it was made from"
            )
        self.check_config_describes_model()
        return super().save_pretrained(*args, **kwargs)

    @torch.no_grad()
    def _init_weights(self, module):
        """BERT's initialisation for projections, embeddings and norms (the block-diagonal MLP's blocks are
        ``nn.Linear`` and get it too; ``word_embedding_init_std``, when set, for the word embeddings); PyTorch's
        defaults inside the operator's short convolutions and implicit filters, whose scale the sine activations and
        decay rely on; the buffers derived from the config computed afresh (:class:`DerivedBuffers`)."""
        super()._init_weights(module)
        if isinstance(module, ShortConvolution):
            # With BERT's std 0.02 the gates s1, s2 and the value v would start near zero and their product, the
            # mixer's output, some 1e-7 of its input.
            init.kaiming_uniform_(module.weight, a=math.sqrt(5))
            bound = 1 / math.sqrt(module.fan_in)
            init.uniform_(module.bias, -bound, bound)
        elif isinstance(module, (ImplicitFilter, ImplicitFilter2d)):
            for layer in module.ffn:
                if isinstance(layer, nn.Linear):
                    init.kaiming_uniform_(layer.weight, a=math.sqrt(5))
                    if layer.bias is not None:
                        bound = 1 / math.sqrt(layer.in_features)
                        init.uniform_(layer.bias, -bound, bound)
                elif isinstance(layer, Sin):
                    init.constant_(layer.frequency, module.sin_frequency)
            init.normal_(module.skip)
        elif (
            self.config.word_embedding_init_std is not None
            and not self.config.is_vision
            and module is self.get_input_embeddings()
        ):
            init.normal_(module.weight, std=self.config.word_embedding_init_std)
            if module.padding_idx is not None:
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, OrchidPatchEmbeddings):
            # Xavier-uniform over the flattened patch (as MAE): with std 0.02 the image content of a few pixels per
            # patch would start many times weaker than the unit-scale sin-cos positions.
            weight = module.projection.weight
            fan_in, fan_out = weight[0].numel(), weight.shape[0]
            bound = math.sqrt(6.0 / (fan_in + fan_out))
            init.uniform_(weight, -bound, bound)
            init.zeros_(module.projection.bias)
        if isinstance(module, DerivedBuffers):
            for name, value in module.derived_buffers().items():
                init.copy_(getattr(module, name), value)


# ---------------------------------------------------------------------------------------------
# Base model
# ---------------------------------------------------------------------------------------------


def input_rules(vocab_size: int, type_vocab_size: int, max_positions: int) -> dict[str, tuple[int, int, str]]:
    """The values each integer input of a text model may hold, ``{name: (low, high, words)}`` with
    ``low <= value < high`` (:func:`check_whole_values`): the model checks its inputs by them
    (:meth:`OrchidModel.input_rules`), and an exported ONNX graph and its runner by the same (``orchid_hf.onnx``)."""
    sizes = {"input_ids": ("vocab_size", vocab_size), "position_ids": ("max_position_embeddings", max_positions)}
    if type_vocab_size > 0:
        sizes["token_type_ids"] = ("type_vocab_size", type_vocab_size)
    rules = {name: (0, size, f"{name} must lie in [0, {field}={size})") for name, (field, size) in sizes.items()}
    return {**rules, "attention_mask": mask_rule()}


# transformers' keyword arguments that ask an attention model for something an Orchid encoder has no part for, and
# would give a silently wrong result if ignored: None (or False) is accepted and means nothing here; anything else is a
# ValueError saying why.
UNSUPPORTED_KEYWORDS = {
    "output_attentions": "Orchid has no attention maps to return (its sequence mixer is a long convolution; the "
    "attention layers of hybrid image models do not return theirs); output_hidden_states=True gives the hidden states "
    "of every layer",
    "head_mask": "Orchid has no attention heads to mask",
    "encoder_hidden_states": "Orchid is an encoder without cross-attention",
    "encoder_attention_mask": "Orchid is an encoder without cross-attention",
    "past_key_values": "Orchid is an encoder and keeps no cache",
    "cache": "Orchid is an encoder and keeps no cache",
}


def check_keyword_arguments(kwargs: dict) -> None:
    """transformers' keyword arguments are taken as BERT takes them (``**kwargs: Unpack[TransformersKwargs]``) and
    ignored where they do not apply, except those that ask for what Orchid cannot give (``UNSUPPORTED_KEYWORDS``): a
    ValueError when they are set. A keyword that is neither (a misspelt ``attention_maskk=``) is ignored, as BERT
    ignores it, with a warning naming it once."""
    for name, value in kwargs.items():
        if name in UNSUPPORTED_KEYWORDS and value is not None and value is not False:
            given = f"{name}=True" if value is True else name
            raise ValueError(f"{given}: {UNSUPPORTED_KEYWORDS[name]}; pass None or leave it out")
    unknown = sorted(set(kwargs) - set(TransformersKwargs.__annotations__) - set(UNSUPPORTED_KEYWORDS) - {"use_cache"})
    if unknown:
        logger.warning_once(f"Orchid's forward ignores the keyword arguments {unknown}, which it does not take")


def packed_sequences(attention_mask, position_ids, kwargs: dict, shape: tuple[int, int], max_positions: int):
    """The starts and lengths of the sequences packed in the row of a batch of ``shape`` (1, T), as transformers'
    padding-free batches give them (``DataCollatorWithFlattening``): from ``cu_seq_lens_q`` (or ``_k``), from where
    ``seq_idx`` changes, or, as transformers tells them apart, from where the ``position_ids`` of a batch of one row
    without ``attention_mask`` restart at 0. None for a batch of separate rows, each no longer than
    ``max_positions``. Eager, one read on the host; compiled or exported, where a graph cannot depend on it, packed
    rows are refused (an assertion in the graph for position_ids that restart)."""
    cumulative = kwargs.get("cu_seq_lens_q", kwargs.get("cu_seq_lens_k"))
    seq_idx = kwargs.get("seq_idx")
    if cumulative is not None or seq_idx is not None:
        if attention_mask is not None or shape[0] != 1:
            raise ValueError(
                "sequences packed in one row (cu_seq_lens_q, cu_seq_lens_k, seq_idx) come as a batch of one row "
                f"without attention_mask; got a batch of {shape[0]}"
                + (" with an attention_mask" if attention_mask is not None else "")
            )
    elif attention_mask is not None or position_ids is None or shape[0] != 1:
        if shape[1] > max_positions:
            raise ValueError(f"the input has length {shape[1]} > max_position_embeddings={max_positions}")
        return None
    if is_traced():
        if cumulative is not None or seq_idx is not None:
            raise ValueError("sequences packed in one row are laid out on the host: run them eagerly (not compiled or "
                             "exported), or as a padded batch with an attention_mask")
        rule = "position_ids restart within the row (sequences packed in one row): run packed rows eagerly"
        check_values((position_ids[:, 1:] > position_ids[:, :-1]).all(), rule)
        return None
    length = shape[1]
    if cumulative is not None:
        check_tensor("cu_seq_lens_q", cumulative)
        bounds = cumulative.tolist()
        if bounds[0] != 0 or bounds[-1] != length or any(b <= a for a, b in zip(bounds, bounds[1:])):
            raise ValueError(f"cu_seq_lens_q must rise from 0 to the row's length {length}, got {bounds}")
        starts = bounds[:-1]
    else:
        if seq_idx is not None:
            check_tensor("seq_idx", seq_idx)
            first = torch.cat([torch.ones_like(seq_idx[0, :1], dtype=torch.bool), seq_idx[0, 1:] != seq_idx[0, :-1]])
        else:
            first = position_ids[0] == 0
        starts = [0] + [place for place, starts_here in enumerate(first.tolist()) if starts_here and place > 0]
    counts = [end - start for start, end in zip(starts, [*starts[1:], length])]
    if max(counts) > max_positions:
        what = "a packed sequence has" if len(counts) > 1 else "the input has length"
        raise ValueError(f"{what} {max(counts)} tokens > max_position_embeddings={max_positions} (lengths {counts})")
    return None if len(starts) == 1 else (starts, counts)


def refuse_packed_sequences(head: str, attention_mask, position_ids, kwargs: dict) -> None:
    """A ValueError where a head with one output per sequence gets sequences packed in one row (see
    :func:`packed_sequences`): ``DataCollatorWithFlattening`` packs token labels only, and a row of sequences would take
    one pooled output and one label."""
    flattened = any(kwargs.get(name) is not None for name in ("cu_seq_lens_q", "cu_seq_lens_k", "seq_idx"))
    if not flattened and attention_mask is None and position_ids is not None and position_ids.shape[0] == 1:
        flattened = bool((position_ids[0, 1:] <= position_ids[0, :-1]).any())  # read on the host: packed or not
    if flattened:
        raise ValueError(
            f"{head} gives one output per sequence, and takes sequences as rows of a padded batch with an "
            "attention_mask (DataCollatorWithPadding), not packed in one row (DataCollatorWithFlattening, which packs "
            "token labels only)"
        )


def token_positions(real: torch.Tensor) -> torch.Tensor:
    """The position of each token among the real tokens of its row, (B, L), from the mask ``real`` (B, L): 0, 1, ...
    for the real tokens wherever the padding is; each padded position gets the count of real tokens before it."""
    real = real.long()
    return real.cumsum(dim=1) - real


class OrchidModel(OrchidPreTrainedModel):
    """The bare Orchid encoder. Text configs embed ``input_ids`` (or take ``inputs_embeds``); vision configs
    (``image_size`` set) embed ``pixel_values`` as patches. Returns ``BaseModelOutput``."""

    _auto_class = "AutoModel"

    def __init__(self, config: OrchidConfig):
        super().__init__(config)
        self.is_vision = config.is_vision
        self.transform_lengths = config.resolved_transform_lengths(config.max_sequence_length)
        self.embeddings = OrchidPatchEmbeddings(config) if self.is_vision else OrchidEmbeddings(config)
        self.encoder = OrchidEncoder(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.projection if self.is_vision else self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        if self.is_vision:
            raise ValueError("an image model has no word embeddings to set")
        self.embeddings.word_embeddings = value

    def get_position_embeddings(self) -> nn.Embedding:
        if self.is_vision:
            raise ValueError("an image model's positions are fixed sin-cos embeddings of its patch grid")
        return self.embeddings.position_embeddings

    @torch.no_grad()
    def resize_position_embeddings(self, new_num_position_embeddings: int) -> None:
        """Take inputs up to ``new_num_position_embeddings`` tokens: the context extension of a text model.

        The learned position embeddings are copied over the new positions, the old rows repeated as long-document
        encoders extended BERT's (or cut, to one of the transform lengths: :func:`changed_context`); every operator
        keeps the transform lengths it had and gains the powers of two up to the new length (``transform_lengths``),
        and the implicit filters keep their lag scale (``filter_lag_scale``), so that their kernel at every lag stays
        as it was. An input no longer than the old length is therefore mixed exactly as before; longer ones see
        filters and positions that the model learns to use by training at the new length."""
        if self.is_vision:
            raise ValueError("an image model's positions are fixed sin-cos embeddings of its patch grid (image_size, "
                             "patch_size): it has no position embeddings to resize")
        if any(isinstance(module, FoldedFilter) for module in self.modules()):
            raise ValueError(
                "this copy was made by optimize_for_inference: its implicit filters are folded for the transform "
                "lengths it had; resize the model it was made from, then fold it again"
            )
        config = self.config
        # Checked before anything changes: a refused cut leaves the model as it was.
        lengths = changed_context(config.max_position_embeddings, self.transform_lengths, new_num_position_embeddings)
        old = self.embeddings.position_embeddings
        if old is not None:
            rows = torch.arange(new_num_position_embeddings, device=old.weight.device) % old.num_embeddings
            new = nn.Embedding(new_num_position_embeddings, old.embedding_dim, device=old.weight.device,
                               dtype=old.weight.dtype)
            new.weight.copy_(old.weight[rows])
            self.embeddings.position_embeddings = new
        self.embeddings.max_positions = new_num_position_embeddings
        for layer in self.encoder.layer:
            layer.mixer.resize(new_num_position_embeddings)
        config.filter_lag_scale = self.encoder.layer[0].mixer.static_filter.lag_scale
        config.transform_lengths = list(lengths)
        config.max_position_embeddings = new_num_position_embeddings
        self.transform_lengths = lengths
        for model in (self, *[m for m in self.modules() if isinstance(m, OrchidPreTrainedModel) and m is not self]):
            model.built_settings = {name: getattr(config, name) for name in BUILD_FIELDS}

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        pixel_values: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutput:
        r"""
        input_ids (`(batch, length)`), inputs_embeds (`(batch, length, hidden_size)`): text input, one of the two.
        attention_mask (`(batch, length)`): 1 for real tokens, 0 for padding (bool, integer or float). Padding never
            changes the outputs at real positions, on either side: the real tokens take positions 0, 1, ... wherever
            the padding is, every Orchid operator mixes each row with its real tokens first, and padded positions are
            set to zero before every mixing step.
        pixel_values (`(batch, num_channels, image_size, image_size)`): image input, for vision configs.
        output_hidden_states: also return the input of every layer and the final output.
        """
        check_keyword_arguments(kwargs)
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        text_inputs = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "token_type_ids": token_type_ids,
            "position_ids": position_ids,
            "inputs_embeds": inputs_embeds,
        }
        for name, value in {**text_inputs, "pixel_values": pixel_values}.items():
            if value is not None:
                check_tensor(name, value)
        if self.is_vision:
            given = [name for name, value in text_inputs.items() if value is not None]
            if given:
                raise ValueError(f"this is an image model (config.image_size is set): {given} do not apply to it")
            refuse(self._pixel_problems(pixel_values))
            hidden_states = self.embeddings(pixel_values)
            shape = hidden_states.shape[:2]
            layout = SequenceLayout.from_mask(None, self.transform_lengths, shape, hidden_states.device)
            return self.encoder(hidden_states, layout, output_hidden_states)
        if pixel_values is not None:
            raise ValueError("this is a text model (config.image_size is not set): pixel_values do not apply to it")
        refuse_jit_trace()
        shape = self._check_text_input(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        device = (input_ids if input_ids is not None else inputs_embeds).device
        packed = packed_sequences(attention_mask, position_ids, kwargs, shape, self.embeddings.max_positions)
        if packed is not None:
            starts, counts = packed
            layout = SequenceLayout.from_packed(starts, counts, self.transform_lengths, shape, device)
            if position_ids is None:  # each sequence's own positions
                start_of = torch.tensor([start for start, count in zip(starts, counts) for _ in range(count)],
                                        device=device)
                position_ids = (torch.arange(shape[1], device=device) - start_of).unsqueeze(0)
        else:
            real = None if attention_mask is None else attention_mask.bool()
            if real is not None and position_ids is None:
                position_ids = token_positions(real)
            layout = SequenceLayout.from_mask(real, self.transform_lengths, shape, device)
        tokens = [layout.gather(t) for t in (input_ids, token_type_ids, position_ids, inputs_embeds)]
        hidden_states = self.embeddings(*tokens, mask=layout.real)
        return self.encoder(hidden_states, layout, output_hidden_states)

    def input_rules(self) -> dict[str, tuple[int, int, str]]:
        """The values of a text model's integer inputs (:func:`input_rules`), by the sizes of its embeddings (which
        ``resize_token_embeddings`` and ``resize_position_embeddings`` change)."""
        if self.is_vision:
            return {}
        embeddings = self.embeddings
        types = 0 if embeddings.token_type_embeddings is None else embeddings.token_type_embeddings.num_embeddings
        return input_rules(embeddings.word_embeddings.num_embeddings, types, embeddings.max_positions)

    def _pixel_problems(self, pixel_values) -> Iterator[str]:
        embeddings = self.embeddings
        expected = (embeddings.num_channels, embeddings.image_size, embeddings.image_size)
        if pixel_values is None:
            yield "this is an image model (config.image_size is set): pass pixel_values"
            return
        if pixel_values.dim() != 4 or tuple(pixel_values.shape[1:]) != expected:
            yield (f"pixel_values must have shape (batch, {expected[0]}, {expected[1]}, {expected[2]}) "
                   f"(num_channels, image_size, image_size), got {tuple(pixel_values.shape)}")  # fmt: skip
        elif pixel_values.shape[0] == 0:
            yield "pixel_values has batch size 0"

    def _check_text_input(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds):
        """The input's (batch, length), or a ValueError naming what is wrong (the lengths of its sequences:
        :func:`packed_sequences`); the values of ids and masks by :func:`input_rules`."""
        refuse(self._text_problems(input_ids, token_type_ids, inputs_embeds))
        shape = tuple((input_ids if input_ids is not None else inputs_embeds).shape[:2])
        rules = self.input_rules()
        for name, ids in (("input_ids", input_ids), ("token_type_ids", token_type_ids), ("position_ids", position_ids)):
            if ids is not None:
                refuse(self._ids_problems(name, ids, shape))
                check_whole_values(ids, rules[name])
        if attention_mask is not None:
            check_attention_mask(attention_mask, shape)
        return shape

    def _text_problems(self, input_ids, token_type_ids, inputs_embeds) -> Iterator[str]:
        embeddings = self.embeddings
        if (input_ids is None) == (inputs_embeds is None):
            yield "pass exactly one of input_ids and inputs_embeds"
        elif inputs_embeds is not None:
            width, dtype = embeddings.word_embeddings.embedding_dim, embeddings.word_embeddings.weight.dtype
            if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != width:
                got = tuple(inputs_embeds.shape)
                yield f"inputs_embeds must have shape (batch, length, hidden_size={width}), got {got}"
            elif inputs_embeds.dtype != dtype:
                yield f"inputs_embeds has dtype {inputs_embeds.dtype}, the model's embeddings are {dtype}"
        elif input_ids.dim() != 2:
            yield f"input_ids must have shape (batch, length), got {tuple(input_ids.shape)}"
        shape = tuple((input_ids if input_ids is not None else inputs_embeds).shape[:2])
        if shape[0] == 0:
            yield f"the input has batch size 0 (shape {shape})"
        if shape[1] == 0:
            yield "the input is an empty sequence (length 0)"
        if token_type_ids is not None and embeddings.token_type_embeddings is None:
            yield "token_type_ids were given, but the model has no token types (type_vocab_size=0)"

    @staticmethod
    def _ids_problems(name: str, ids: torch.Tensor, shape: tuple[int, int]) -> Iterator[str]:
        if tuple(ids.shape) != tuple(shape):
            yield f"{name} has shape {tuple(ids.shape)}, the input has shape {tuple(shape)}"
        if not is_integer_tensor(ids):
            yield f"{name} must hold integer ids, got {ids.dtype}"


# ---------------------------------------------------------------------------------------------
# Heads
# ---------------------------------------------------------------------------------------------


def check_label_shape(labels: torch.Tensor, shape: tuple[int, ...], axes: str, name: str = "labels") -> None:
    """A ValueError unless ``labels`` is a tensor of ``shape``, whose axes ``axes`` names (e.g. ``"batch, length"``)."""
    check_tensor(name, labels)
    if tuple(labels.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(labels.shape)}, expected ({axes}) = {tuple(shape)}")


def check_classification_labels(
    labels: torch.Tensor,
    shape: tuple[int, ...],
    axes: str,
    num_classes: int,
    count_name: str = "num_labels",
    name: str = "labels",
    ignore_index: int | None = -100,
) -> torch.Tensor:
    """``labels`` as int64 class ids for ``CrossEntropyLoss``; a ValueError unless they are integer class ids (of any
    integer dtype) of ``shape`` (its axes named by ``axes``) in ``[0, num_classes)``, or ``ignore_index`` (positions
    without a loss, as ``CrossEntropyLoss`` reads -100). The message names the labels' range and
    ``count_name=num_classes``. Compiled, the range check is an assertion in the graph (:func:`check_values`)."""
    check_label_shape(labels, shape, axes, name)
    if not is_integer_tensor(labels):
        raise ValueError(f"{name} must hold integer class ids, got {labels.dtype}")
    labels = labels.long()
    if not labels.numel():
        return labels
    valid = (labels >= 0) & (labels < num_classes)
    counted = torch.ones_like(valid)
    if ignore_index is not None:
        counted = labels != ignore_index
        valid = valid | ~counted
    rule = f"{name} must lie in [0, {count_name}={num_classes})"
    if ignore_index is not None:
        rule += f" or be {ignore_index} (no loss)"
    check_values(valid, rule, lambda: f"{rule}, got {value_range(labels[counted])}")
    return labels


def is_integer_tensor(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` holds integers (any integer dtype, not bool)."""
    return not (tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool)


def resolve_problem_type(config: OrchidConfig, num_labels: int, labels: torch.Tensor) -> str:
    """``config.problem_type``, inferred and set on first use as BertForSequenceClassification does: regression for
    one label, single-label for integer labels (of any integer dtype), else multi-label. An unknown value is a
    ValueError."""
    if config.problem_type is None:
        if num_labels == 1:
            config.problem_type = "regression"
        elif is_integer_tensor(labels):
            config.problem_type = "single_label_classification"
        else:
            config.problem_type = "multi_label_classification"
    if config.problem_type not in PROBLEM_TYPES:
        raise ValueError(f"config.problem_type={config.problem_type!r} is not one of {PROBLEM_TYPES}")
    return config.problem_type


def classification_loss(config: OrchidConfig, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The loss of one prediction per example, ``logits`` (batch, num_labels), for ``config``'s problem type
    (:func:`resolve_problem_type`): MSE for regression, cross-entropy for single-label classes (-100: no loss),
    binary cross-entropy for multi-label targets in [0, 1]. Labels of another shape or range are a ValueError."""
    batch, num_labels = logits.shape
    check_tensor("labels", labels)
    problem_type = resolve_problem_type(config, num_labels, labels)
    one_per_example = problem_type == "single_label_classification" or (
        problem_type == "regression" and num_labels == 1
    )
    if one_per_example and tuple(labels.shape) == (batch, 1):  # (batch,), or (batch, 1) as many datasets give it
        labels = labels.view(batch)
    if problem_type == "regression":
        if num_labels == 1:
            check_label_shape(labels, (batch,), "batch,")
            return MSELoss()(logits.view(batch), labels.to(logits.dtype))
        check_label_shape(labels, (batch, num_labels), "batch, num_labels")
        return MSELoss()(logits, labels.to(logits.dtype))
    if problem_type == "single_label_classification":
        labels = check_classification_labels(labels, (batch,), "batch,", num_labels)
        return CrossEntropyLoss()(logits, labels)
    check_label_shape(labels, (batch, num_labels), "batch, num_labels")
    rule = "multi-label targets must lie in [0, 1]"
    check_values((labels >= 0) & (labels <= 1), rule, lambda: f"{rule}, got {value_range(labels)}")
    return BCEWithLogitsLoss()(logits, labels.to(logits.dtype))


def masked_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The cross-entropy of ``logits`` (batch, length, vocab) over the positions whose label is not -100, as
    ``CrossEntropyLoss()`` over all positions gives it, value and gradients alike. The log-softmax runs over the
    labelled positions only: over the others it would be computed and then ignored, and under 15% masking they are
    most of the positions."""
    labels = check_classification_labels(labels, logits.shape[:-1], "batch, length", logits.shape[-1], "vocab_size")
    loss_fct = CrossEntropyLoss()
    labels = labels.reshape(-1)
    labelled = labels != loss_fct.ignore_index
    return loss_fct(logits.reshape(-1, logits.shape[-1])[labelled], labels[labelled])


def on_real_tokens(head, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """``head`` (a per-token function) of the real tokens of ``hidden_states`` (B, L, d) only, as the encoder's
    per-token layers run (:class:`SequenceLayout`): (B, L, C) with zeros at the padded positions, so that a head such
    as the masked LM's projection to the vocabulary costs the real tokens, not the padded batch."""
    real = None if attention_mask is None else attention_mask.bool()
    layout = SequenceLayout.of_real_tokens(real, hidden_states.shape[:2])
    return layout.restore(head(layout.gather(hidden_states)))


class OrchidLMPredictionHead(nn.Module):
    """Dense -> activation -> LayerNorm -> decoder; the decoder weight is tied to the word embeddings."""

    def __init__(self, config: OrchidConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.LayerNorm(self.act(self.dense(hidden_states))))


class OrchidForMaskedLM(OrchidPreTrainedModel):
    modality = "text"
    _auto_class = "AutoModelForMaskedLM"
    _tied_weights_keys = {"lm_head.decoder.weight": "orchid.embeddings.word_embeddings.weight"}

    def __init__(self, config: OrchidConfig):
        super().__init__(config)
        self.orchid = OrchidModel(config)
        self.lm_head = OrchidLMPredictionHead(config)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head.decoder

    def set_output_embeddings(self, new_embeddings):
        self.lm_head.decoder = new_embeddings

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> MaskedLMOutput:
        r"""labels (`(batch, length)`): token ids to predict; -100 marks positions without a loss."""
        outputs = self.orchid(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            return_dict=True,
            **kwargs,
        )
        logits = on_real_tokens(self.lm_head, outputs.last_hidden_state, attention_mask)
        loss = None if labels is None else masked_lm_loss(logits, labels)
        return MaskedLMOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)


class OrchidSequencePooler(nn.Module):
    """The first real token, or the mean over real tokens (the paper's choice for some GLUE tasks), then dense + tanh.

    "First" is the first position whose mask is 1: the ``[CLS]`` token also when the batch is padded on the left.
    """

    def __init__(self, config: OrchidConfig):
        super().__init__()
        self.pooling = config.classifier_pooling
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        if attention_mask is None:
            pooled = hidden_states[:, 0] if self.pooling == "first" else hidden_states.mean(dim=1)
        elif self.pooling == "first":
            first = attention_mask.bool().int().argmax(dim=1)
            pooled = hidden_states[torch.arange(hidden_states.shape[0], device=first.device), first]
        else:
            real = attention_mask.bool().unsqueeze(-1)
            count = real.sum(dim=1).clamp_min(1).to(hidden_states.dtype)
            pooled = hidden_states.masked_fill(~real, 0.0).sum(dim=1) / count
        return self.activation(self.dense(pooled))


class OrchidForSequenceClassification(OrchidPreTrainedModel):
    modality = "text"
    _auto_class = "AutoModelForSequenceClassification"
    num_labels_layer = "classifier"

    def __init__(self, config: OrchidConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.orchid = OrchidModel(config)
        self.pooler = OrchidSequencePooler(config)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> SequenceClassifierOutput:
        r"""labels (`(batch,)`): class ids, float targets for regression (num_labels = 1), or multi-hot floats."""
        refuse_packed_sequences("OrchidForSequenceClassification", attention_mask, position_ids, kwargs)
        outputs = self.orchid(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            return_dict=True,
            **kwargs,
        )
        pooled = self.pooler(outputs.last_hidden_state, attention_mask)
        logits = self.classifier(self.dropout(pooled))
        loss = classification_loss(self.config, logits, labels) if labels is not None else None
        return SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)


class OrchidForTokenClassification(OrchidPreTrainedModel):
    modality = "text"
    _auto_class = "AutoModelForTokenClassification"
    num_labels_layer = "classifier"

    def __init__(self, config: OrchidConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.orchid = OrchidModel(config)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> TokenClassifierOutput:
        r"""labels (`(batch, length)`): a class id per token; -100 marks positions without a loss."""
        outputs = self.orchid(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            return_dict=True,
            **kwargs,
        )
        logits = on_real_tokens(lambda tokens: self.classifier(self.dropout(tokens)), outputs.last_hidden_state,
                                attention_mask)
        loss = None
        if labels is not None:
            labels = check_classification_labels(labels, logits.shape[:-1], "batch, length", logits.shape[-1])
            loss = CrossEntropyLoss()(logits.view(-1, logits.shape[-1]), labels.view(-1))
        return TokenClassifierOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)


class OrchidForImageClassification(OrchidPreTrainedModel):
    """Orchid-ViT: patch embeddings, Orchid blocks, global average pooling over patches, linear classifier."""

    modality = "image"
    _auto_class = "AutoModelForImageClassification"
    main_input_name = "pixel_values"
    num_labels_layer = "classifier"

    def __init__(self, config: OrchidConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.orchid = OrchidModel(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> ImageClassifierOutput:
        r"""labels (`(batch,)`): class ids (or multi-hot floats for multi-label problems)."""
        outputs = self.orchid(
            pixel_values=pixel_values,
            return_dict=True,
            **kwargs,
        )
        logits = self.classifier(outputs.last_hidden_state.mean(dim=1))
        loss = classification_loss(self.config, logits, labels) if labels is not None else None
        return ImageClassifierOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)


# ---------------------------------------------------------------------------------------------
# Question answering and multiple choice
# ---------------------------------------------------------------------------------------------


def span_loss(
    start_logits: torch.Tensor,
    end_logits: torch.Tensor,
    start_positions: torch.Tensor | None,
    end_positions: torch.Tensor | None,
) -> torch.Tensor | None:
    """The mean of the start and end cross-entropies, as BertForQuestionAnswering: positions are clamped to
    [0, length], and length (a position past the input, e.g. an answer cut off by truncation) is ignored."""
    if start_positions is None and end_positions is None:
        return None
    if start_positions is None or end_positions is None:
        given, missing = "start_positions", "end_positions"
        if start_positions is None:
            given, missing = missing, given
        raise ValueError(f"{given} was given without {missing}; the span loss needs both")
    batch, length = start_logits.shape
    positions = []
    for name, tensor in (("start_positions", start_positions), ("end_positions", end_positions)):
        check_tensor(name, tensor)
        if tensor.dim() > 1:  # (batch, 1), as data-parallel gathers give them
            tensor = tensor.squeeze(-1)
        if tuple(tensor.shape) != (batch,):
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected (batch,) = ({batch},)")
        if not is_integer_tensor(tensor):
            raise ValueError(f"{name} must hold integer positions, got {tensor.dtype}")
        positions.append(tensor.long().clamp(0, length))
    loss_fct = CrossEntropyLoss(ignore_index=length)
    return (loss_fct(start_logits, positions[0]) + loss_fct(end_logits, positions[1])) / 2


class OrchidForQuestionAnswering(OrchidPreTrainedModel):
    """Extractive question answering: a start and an end logit per token (BertForQuestionAnswering's head)."""

    modality = "text"
    _auto_class = "AutoModelForQuestionAnswering"

    def __init__(self, config: OrchidConfig):
        super().__init__(config)
        self.orchid = OrchidModel(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> QuestionAnsweringModelOutput:
        r"""start_positions, end_positions (`(batch,)`): the answer's first and last token. Positions past the
        input are clamped to its length and ignored in the loss, as in BERT."""
        refuse_packed_sequences("OrchidForQuestionAnswering", attention_mask, position_ids, kwargs)
        outputs = self.orchid(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            return_dict=True,
            **kwargs,
        )
        logits = self.qa_outputs(outputs.last_hidden_state)
        start_logits, end_logits = (part.squeeze(-1).contiguous() for part in logits.split(1, dim=-1))
        loss = span_loss(start_logits, end_logits, start_positions, end_positions)
        return QuestionAnsweringModelOutput(
            loss=loss, start_logits=start_logits, end_logits=end_logits, hidden_states=outputs.hidden_states
        )


def flatten_choices(name: str, tensor: torch.Tensor | None, dims: int) -> torch.Tensor | None:
    """``(batch, num_choices, ...)`` -> ``(batch * num_choices, ...)``; a ValueError for any other rank."""
    if tensor is None:
        return None
    check_tensor(name, tensor)
    if tensor.dim() != dims:
        shape = "(batch, num_choices, length" + (", hidden_size)" if dims == 4 else ")")
        raise ValueError(f"{name} must have shape {shape}, got {tuple(tensor.shape)}")
    return tensor.reshape(-1, *tensor.shape[2:])


class OrchidForMultipleChoice(OrchidPreTrainedModel):
    """One score per choice from each (context, choice) sequence, pooled as for sequence classification, and a
    cross-entropy over the choices (BertForMultipleChoice's head)."""

    modality = "text"
    _auto_class = "AutoModelForMultipleChoice"

    def __init__(self, config: OrchidConfig):
        super().__init__(config)
        self.orchid = OrchidModel(config)
        self.pooler = OrchidSequencePooler(config)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> MultipleChoiceModelOutput:
        r"""input_ids, attention_mask, token_type_ids, position_ids (`(batch, num_choices, length)`), inputs_embeds
        (`(batch, num_choices, length, hidden_size)`): every choice as one sequence.
        labels (`(batch,)`): the index of the right choice, in [0, num_choices)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        batch, num_choices = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
        attention_mask = flatten_choices("attention_mask", attention_mask, 3)
        position_ids = flatten_choices("position_ids", position_ids, 3)
        refuse_packed_sequences("OrchidForMultipleChoice", attention_mask, position_ids, kwargs)
        outputs = self.orchid(
            flatten_choices("input_ids", input_ids, 3),
            attention_mask=attention_mask,
            token_type_ids=flatten_choices("token_type_ids", token_type_ids, 3),
            position_ids=position_ids,
            inputs_embeds=flatten_choices("inputs_embeds", inputs_embeds, 4),
            return_dict=True,
            **kwargs,
        )
        pooled = self.pooler(outputs.last_hidden_state, attention_mask)
        logits = self.classifier(self.dropout(pooled)).view(batch, num_choices)
        loss = None
        if labels is not None:
            labels = check_classification_labels(labels, (batch,), "batch,", num_choices, "num_choices")
            loss = CrossEntropyLoss()(logits, labels)
        return MultipleChoiceModelOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)


__all__ = [
    "OrchidPreTrainedModel",
    "OrchidModel",
    "OrchidForMaskedLM",
    "OrchidForSequenceClassification",
    "OrchidForTokenClassification",
    "OrchidForImageClassification",
    "OrchidForQuestionAnswering",
    "OrchidForMultipleChoice",
]
