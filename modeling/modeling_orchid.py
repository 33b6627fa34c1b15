"""Orchid encoders for transformers: BERT-style text models and ViT-style image models whose attention
is replaced by the Orchid operator (Karami & Ghodsi, NeurIPS 2024, Sec. 4.2 and 4.3).

Layout, as in ``modeling_bert.py``: embeddings -> layers (sequence mixer, MLP) -> encoder -> pretrained base
class -> base model -> task heads.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

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
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.modeling_utils import PreTrainedModel
from transformers.utils.generic import can_return_tuple

from .configuration_orchid import OrchidConfig
from .orchid_layers import (
    ALL_CHANNELS,
    ONEDNN_ACTIVATIONS,
    BlockDiagonalLinear,
    ImplicitLongFilter,
    Linear,
    OrchidOperator,
    Sin,
    linear_rows,
    onednn_linear,
    onednn_linear_applies,
)

# ---------------------------------------------------------------------------------------------
# Embeddings
# ---------------------------------------------------------------------------------------------


# Without autograd, the embeddings' LayerNorm runs on chunks of tokens of about this many elements (4 MiB in float32).
EMBEDDING_CHUNK_ELEMENTS = 2**20


class OrchidEmbeddings(nn.Module):
    """Word, learned position and token-type embeddings, then LayerNorm and dropout (as BERT)."""

    def __init__(self, config: OrchidConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
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
    ) -> torch.Tensor:
        length = (input_ids if inputs_embeds is None else inputs_embeds).shape[1]
        # The default positions and token types as rows of their tables, with no lookup.
        if position_ids is None:
            positions = self.position_embeddings.weight[:length]
        else:
            positions = self.position_embeddings(position_ids)
        if inputs_embeds is None:
            # In place on the lookup's fresh output, whose backward needs only the ids: at (1, 16384) each
            # sequence-sized tensor avoided is a fresh 48 MiB mapping.
            embeddings = self.word_embeddings(input_ids).add_(positions)
        else:
            embeddings = inputs_embeds + positions  # never in place on the caller's tensor
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                embeddings.add_(self.token_type_embeddings.weight[0])
            else:
                embeddings.add_(self.token_type_embeddings(token_type_ids))
        return self.dropout(self._layer_norm(embeddings))

    def _layer_norm(self, embeddings: torch.Tensor) -> torch.Tensor:
        """The LayerNorm; without autograd on chunks of tokens, each written back over its input."""
        if torch.is_grad_enabled() or torch.compiler.is_compiling():
            return self.LayerNorm(embeddings)
        tokens = embeddings.view(-1, embeddings.shape[-1])
        rows = max(1, EMBEDDING_CHUNK_ELEMENTS // tokens.shape[-1])
        for start in range(0, tokens.shape[0], rows):
            tokens[start : start + rows] = self.LayerNorm(tokens[start : start + rows])
        return embeddings


def sinusoidal_position_embeddings_2d(grid_size: int, dim: int) -> torch.Tensor:
    """Fixed 2-D sin-cos position embeddings of a ``grid_size x grid_size`` patch grid, shape (grid**2, dim)."""
    quarter = dim // 4
    omega = 1.0 / 10000 ** (torch.arange(quarter, dtype=torch.float32, device="cpu") / max(quarter - 1, 1))
    grid = torch.arange(grid_size, device="cpu")
    rows, cols = torch.meshgrid(grid, grid, indexing="ij")
    row_angles = rows.flatten().float()[:, None] * omega[None]
    col_angles = cols.flatten().float()[:, None] * omega[None]
    return torch.cat([col_angles.sin(), col_angles.cos(), row_angles.sin(), row_angles.cos()], dim=1)


class OrchidPatchEmbeddings(nn.Module):
    """Non-overlapping patches (a convolution with stride = patch size) plus fixed sinusoidal positions."""

    def __init__(self, config: OrchidConfig):
        super().__init__()
        self.image_size = config.image_size
        self.num_channels = config.num_channels
        self.grid_size = config.image_size // config.patch_size
        self.projection = nn.Conv2d(
            config.num_channels, config.hidden_size, kernel_size=config.patch_size, stride=config.patch_size
        )
        self.register_buffer(
            "position_embeddings",
            sinusoidal_position_embeddings_2d(self.grid_size, config.hidden_size),
            persistent=False,
        )
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        expected = (self.num_channels, self.image_size, self.image_size)
        if pixel_values.dim() != 4 or tuple(pixel_values.shape[1:]) != expected:
            raise ValueError(
                f"pixel_values must have shape (batch, {expected[0]}, {expected[1]}, {expected[2]}) "
                f"(num_channels, image_size, image_size), got {tuple(pixel_values.shape)}"
            )
        patches = self.projection(pixel_values.to(self.projection.weight.dtype)).flatten(2).transpose(1, 2)
        return self.dropout(patches + self.position_embeddings.to(patches.dtype))


# ---------------------------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------------------------


def orchid_operator_from_config(config: OrchidConfig) -> OrchidOperator:
    """The sequence mixer of one layer, from the config's operator fields."""
    return OrchidOperator(
        d_model=config.hidden_size,
        max_len=config.max_sequence_length,
        transform=config.transform,
        conditioning=config.conditioning,
        conditioning_activation=config.conditioning_activation,
        short_conv_size=config.short_conv_size,
        conditioning_time_kernel_size=config.conditioning_time_kernel_size,
        conditioning_freq_kernel_size=config.conditioning_freq_kernel_size,
        conditioning_time_layers=config.conditioning_time_layers,
        conditioning_freq_layers=config.conditioning_freq_layers,
        data_dependent=config.data_dependent,
        filter_emb_dim=config.filter_emb_dim,
        filter_width=config.filter_width,
        filter_depth=config.filter_depth,
        filter_sin_frequency=config.filter_sin_frequency,
        filter_decay=config.filter_decay,
        filter_spectrum=config.filter_spectrum,
        residual_long_conv=config.residual_long_conv,
    )


def feature_linear(in_features: int, out_features: int, num_blocks: int) -> nn.Module:
    """A dense layer, or a block-diagonal one with ``num_blocks`` blocks (Monarch of order 1)."""
    if num_blocks == 1:
        return Linear(in_features, out_features)
    return BlockDiagonalLinear(in_features, out_features, num_blocks)


# In-place versions of activations, used where no gradient is recorded: the GLU then updates the
# up-projection's output instead of allocating two more tensors of its size.
INPLACE_ACTIVATIONS = {
    "gelu": torch.ops.aten.gelu_,
    "gelu_pytorch_tanh": lambda x: torch.ops.aten.gelu_(x, approximate="tanh"),
    "relu": torch.relu_,
    "silu": lambda x: nn.functional.silu(x, inplace=True),
}


# Without autograd the MLP runs on chunks of tokens whose up-projection holds about this many numbers (32 MiB in
# float32; the fused path holds one block's piece of it at a time), and at least this many tokens, so GEMMs stay
# efficient.
MLP_CHUNK_ELEMENTS = 2**23
MLP_MIN_CHUNK_TOKENS = 256


class OrchidMLP(nn.Module):
    """The dimension mixer: ``W2 act(W1 x)``, or the GLU ``W2 (act(W1 x) * W1' x)`` of M2-BERT."""

    def __init__(self, config: OrchidConfig):
        super().__init__()
        self.is_glu = config.mlp_type == "glu"
        self.intermediate_size = config.intermediate_size
        up_features = 2 * config.intermediate_size if self.is_glu else config.intermediate_size
        self.up_proj = feature_linear(config.hidden_size, up_features, config.mlp_num_blocks)
        self.down_proj = feature_linear(config.intermediate_size, config.hidden_size, config.mlp_num_blocks)
        self.hidden_act = config.hidden_act
        self.act = ACT2FN[config.hidden_act]
        # The fused path needs oneDNN to know the activation (see _fused_mix_features).
        self.fusable = config.hidden_act in ONEDNN_ACTIVATIONS
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        tokens = hidden_states.reshape(-1, hidden_states.shape[-1])
        chunks = self.token_chunks(tokens.shape[0])
        if torch.is_grad_enabled() or torch.compiler.is_compiling() or len(chunks) == 1:
            return self._mix_features(hidden_states)
        # Without autograd, chunks of tokens keep the (tokens x intermediate) tensors small enough for the allocator
        # to reuse their memory: at (1, 16384) the whole up-projection would be a fresh 400 MB mapping per layer.
        out = torch.cat([self._mix_features(tokens[chunk]) for chunk in chunks])
        return out.view(*hidden_states.shape[:-1], out.shape[-1])

    def token_chunks(self, num_tokens: int) -> list[slice]:
        """Equal runs of tokens whose up-projection holds about ``MLP_CHUNK_ELEMENTS`` numbers, each at least
        ``MLP_MIN_CHUNK_TOKENS`` long; a single run when there are fewer than two chunks' worth."""
        size = max(MLP_MIN_CHUNK_TOKENS, MLP_CHUNK_ELEMENTS // self.up_proj.out_features)
        count = max(1, num_tokens // size)
        size = -(-num_tokens // count)
        return [slice(start, min(start + size, num_tokens)) for start in range(0, num_tokens, size)]

    def _mix_features(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.fusable and onednn_linear_applies(hidden_states, self.up_proj.weight):
            return self.dropout(self._fused_mix_features(hidden_states))
        hidden_states = self.up_proj(hidden_states)
        if self.is_glu:
            gate, value = hidden_states.chunk(2, dim=-1)
            # Looked up here, not kept: a module holding a torch op or a lambda could not be pickled.
            inplace_act = INPLACE_ACTIVATIONS.get(self.hidden_act)
            if inplace_act is not None and not torch.is_grad_enabled() and not torch.compiler.is_compiling():
                # A strided view into the up-projection's output; the down-projection reads it as it is.
                hidden_states = inplace_act(gate).mul_(value)
            else:
                hidden_states = self.act(gate) * value
        else:
            hidden_states = self.act(hidden_states)
        return self.dropout(self.down_proj(hidden_states))

    def _fused_mix_features(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The same without autograd, in oneDNN calls that add the bias and apply the activation while the GEMMs
        write their outputs. The intermediate features come in pieces, one per block of down_proj (a GLU gate piece
        times the value piece at the same place of the second half), each inside one block of up_proj, so that
        every GEMM reads a contiguous input: oneDNN copies a strided one on every call."""
        width = self.intermediate_size
        num_blocks = getattr(self.down_proj, "num_blocks", 1)
        piece = width // num_blocks
        block_inputs: dict[int, torch.Tensor] = {}  # up_proj's input slices, each copied once

        def up(start: int, activation: str | None = None) -> torch.Tensor:
            inputs, weight, bias = self.up_proj.output_slice(hidden_states, start, start + piece)
            if not inputs.is_contiguous():
                if inputs.data_ptr() not in block_inputs:
                    block_inputs[inputs.data_ptr()] = inputs.contiguous()
                inputs = block_inputs[inputs.data_ptr()]
            return onednn_linear(inputs, weight, bias, activation=activation)

        outputs = []
        for k, start in enumerate(range(0, width, piece)):
            activated = up(start, self.hidden_act)
            if self.is_glu:
                # In place on the fresh gate: measured faster than oneDNN's binary post-op for the product.
                activated.mul_(up(width + start))
            if num_blocks == 1:
                return onednn_linear(activated, *linear_rows(self.down_proj, ALL_CHANNELS))
            outputs.append(onednn_linear(activated, *self.down_proj.block_parameters(k)))
        return torch.cat(outputs, dim=-1)


def forward_hooks_on(modules: Iterable[nn.Module]) -> bool:
    """Whether a forward hook or pre-hook is registered globally or on any of ``modules``: the inference paths that
    write outputs over memory or call modules once per chunk of tokens stand aside for them."""
    if nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks:
        return True
    return any(module._forward_hooks or module._forward_pre_hooks for module in modules)


class OrchidLayer(GradientCheckpointingLayer):
    """One block: Orchid sequence mixer and MLP, each with a residual connection and LayerNorm.

    Post-norm (BERT, M2-BERT): ``x = LN(x + mixer(x)); x = LN(x + mlp(x))``.
    Pre-norm (ViT): ``x = x + mixer(LN(x)); x = x + mlp(LN(x))``.
    """

    # Inference runs everything after the mixer on chunks of tokens (see _forward_in_chunks); False turns it off.
    chunked_inference = True

    def __init__(self, config: OrchidConfig):
        super().__init__()
        self.pre_norm = config.pre_norm
        self.mixer = orchid_operator_from_config(config)
        self.mixer_dropout = nn.Dropout(config.hidden_dropout_prob)
        self.mixer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = OrchidMLP(config)
        self.mlp_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(
        self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``out``: a tensor like ``hidden_states`` that nothing reads any more, whose memory the output may take
        (see :meth:`OrchidOperator.forward`)."""
        if self._runs_in_chunks(hidden_states):
            return self._forward_in_chunks(hidden_states, attention_mask, out)
        if self.pre_norm:
            mixed = self.mixer(self.mixer_norm(hidden_states), attention_mask)
            hidden_states = hidden_states + self.mixer_dropout(mixed)
            return hidden_states + self.mlp(self.mlp_norm(hidden_states))
        hidden_states = self.mixer_norm(hidden_states + self.mixer_dropout(self.mixer(hidden_states, attention_mask)))
        return self.mlp_norm(hidden_states + self.mlp(hidden_states))

    def writes_into_out(self, hidden_states: torch.Tensor) -> bool:
        """Whether :meth:`forward` writes its output into a lent ``out``: in token chunks, with the operator's channel
        groups written into one output."""
        return self._runs_in_chunks(hidden_states) and self.mixer.writes_groups_into_one_output(hidden_states.shape[0])

    def _runs_in_chunks(self, hidden_states: torch.Tensor) -> bool:
        """Inference (no autograd, eval mode, not compiling) on more than one chunk of tokens (for one, the plain
        path is the same without the copies), with no hooks that would see the mixer's output change or the
        later modules called once per chunk."""
        if not self.chunked_inference or torch.is_grad_enabled() or self.training or torch.compiler.is_compiling():
            return False
        if len(self.mlp.token_chunks(hidden_states.shape[:-1].numel())) == 1:
            return False
        return not forward_hooks_on((self.mixer, self.mixer_dropout, self.mixer_norm, self.mlp, self.mlp_norm))

    def _forward_in_chunks(
        self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """:meth:`forward` for inference. Everything after the mixer acts on each token alone, so it runs on chunks
        of tokens written over the mixer's output, a fresh tensor that becomes the layer's output. A chunk's
        tensors stay in cache and reuse each other's memory, where the whole-sequence path allocates five more
        tensors of the input's size (two sums, two LayerNorm outputs, the MLP's output): at (1, 16384) each is a
        fresh 48 MiB mapping whose first touch costs about as much as the pass that fills it."""
        mixer_input = self.mixer_norm(hidden_states) if self.pre_norm else hidden_states
        # `out` only when lent: operators of other versions, which the benchmark times side by side, lack it.
        lent = {} if out is None else {"out": out}
        out = self.mixer(mixer_input, attention_mask, **lent)
        tokens = out.view(-1, out.shape[-1])
        inputs = hidden_states.reshape(-1, hidden_states.shape[-1])
        for chunk in self.mlp.token_chunks(tokens.shape[0]):
            hidden = inputs[chunk] + tokens[chunk]
            if self.pre_norm:
                tokens[chunk] = self.mlp(self.mlp_norm(hidden)).add_(hidden)
            else:
                hidden = self.mixer_norm(hidden)
                tokens[chunk] = self.mlp_norm(self.mlp(hidden).add_(hidden))
        return out


class OrchidEncoder(nn.Module):
    # Without autograd, each layer's output may take the memory of the output of the layer before last (see
    # _may_reuse_outputs); False turns it off.
    reuse_outputs = True

    def __init__(self, config: OrchidConfig):
        super().__init__()
        self.layer = nn.ModuleList(OrchidLayer(config) for _ in range(config.num_hidden_layers))
        # Pre-norm stacks end with a LayerNorm, as ViT does.
        self.final_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if config.pre_norm else None

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> BaseModelOutput:
        all_hidden_states = (hidden_states,) if output_hidden_states else None
        reuse = not output_hidden_states and self._may_reuse_outputs(hidden_states)
        spare = None  # the output of the layer before last, which nothing reads once the last layer has run
        for index, layer in enumerate(self.layer):
            layer_input = hidden_states
            hidden_states = layer(hidden_states, attention_mask, out=spare)
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
            # The encoder's own input is the caller's, never reused.
            spare = layer_input if reuse and index > 0 and layer_input is not hidden_states else None
        if self.final_norm is not None:
            hidden_states = self.final_norm(hidden_states)
        return BaseModelOutput(last_hidden_state=hidden_states, hidden_states=all_hidden_states)

    def _may_reuse_outputs(self, hidden_states: torch.Tensor) -> bool:
        """Whether a layer may write its output into the memory of the output of the layer before last: without
        autograd, which keeps the layers' outputs for backward, and without hooks in the layers, which could keep
        them or views of them; and only where the layers write into lent memory at all (else lending would only
        keep it allocated). On long inputs this spares a fresh mapping of the output's size per layer (48 MiB at
        (1, 16384), whose first touch costs about as much as the pass that fills it)."""
        if not self.reuse_outputs or torch.is_grad_enabled() or torch.compiler.is_compiling():
            return False
        if len(self.layer) < 3 or not self.layer[0].writes_into_out(hidden_states):
            return False
        return not forward_hooks_on(self.layer.modules())


# ---------------------------------------------------------------------------------------------
# Pretrained base
# ---------------------------------------------------------------------------------------------


class OrchidPreTrainedModel(PreTrainedModel):
    config_class = OrchidConfig
    config: OrchidConfig
    base_model_prefix = "orchid"
    supports_gradient_checkpointing = True
    _no_split_modules = ["OrchidLayer"]

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """``PreTrainedModel.from_pretrained``, refusing checkpoints that lack weights of the encoder itself.

        A new task head may be initialised (an MLM checkpoint loaded into a classifier), but a missing
        encoder tensor means a corrupt or mismatched checkpoint, and a half-loaded model would be silently wrong.
        """
        output_loading_info = kwargs.pop("output_loading_info", False)
        model, loading_info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        is_base_model = model.base_model is model
        missing = sorted(
            key
            for key in loading_info["missing_keys"]
            if is_base_model or key.startswith(f"{cls.base_model_prefix}.")
        )
        if missing:
            raise ValueError(
                f"the checkpoint lacks {len(missing)} weight(s) of the Orchid encoder, e.g. {missing[:3]}; "
                "it is truncated, corrupt or of another architecture"
            )
        return (model, loading_info) if output_loading_info else model

    @torch.no_grad()
    def _init_weights(self, module):
        """BERT's initialisation for projections, embeddings and norms; PyTorch's defaults inside the operator's
        short convolutions and implicit filters, whose scale the sine activations and decay rely on."""
        super()._init_weights(module)
        if isinstance(module, BlockDiagonalLinear):
            init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Conv1d) and module.groups == module.in_channels:
            # The operator's depthwise short convolutions. Initialised here, on the Conv1d itself: transformers
            # skips _init_weights for custom-code modules without parameters of their own, like ShortConv1d.
            # With BERT's std 0.02 the gates s1, s2 and the value v would start near zero and their product,
            # the mixer's output, some 1e-7 of its input.
            init.kaiming_uniform_(module.weight, a=math.sqrt(5))
            if module.bias is not None:
                bound = 1 / math.sqrt(module.kernel_size[0])
                init.uniform_(module.bias, -bound, bound)
        elif isinstance(module, ImplicitLongFilter):
            for layer in module.ffn:
                if isinstance(layer, nn.Linear):
                    init.kaiming_uniform_(layer.weight, a=math.sqrt(5))
                    if layer.bias is not None:
                        bound = 1 / math.sqrt(layer.in_features)
                        init.uniform_(layer.bias, -bound, bound)
                elif isinstance(layer, Sin):
                    init.constant_(layer.frequency, module.sin_frequency)
            init.normal_(module.skip)
            init.copy_(module.lag_features, module.make_lag_features())
            init.copy_(module.envelope, module.make_envelope())
        elif isinstance(module, OrchidPatchEmbeddings):
            # Xavier-uniform over the flattened patch (as MAE): with std 0.02 the image content of a few
            # pixels per patch would start many times weaker than the unit-scale sin-cos positions.
            weight = module.projection.weight
            fan_in, fan_out = weight[0].numel(), weight.shape[0]
            bound = math.sqrt(6.0 / (fan_in + fan_out))
            init.uniform_(weight, -bound, bound)
            init.zeros_(module.projection.bias)
            init.copy_(
                module.position_embeddings,
                sinusoidal_position_embeddings_2d(module.grid_size, module.position_embeddings.shape[-1]),
            )


# ---------------------------------------------------------------------------------------------
# Base model
# ---------------------------------------------------------------------------------------------


class OrchidModel(OrchidPreTrainedModel):
    """The bare Orchid encoder. Text configs embed ``input_ids`` (or take ``inputs_embeds``); vision configs
    (``image_size`` set) embed ``pixel_values`` as patches. Returns ``BaseModelOutput``."""
    _auto_class = "AutoModel"

    def __init__(self, config: OrchidConfig):
        super().__init__(config)
        self.embeddings = OrchidPatchEmbeddings(config) if config.is_vision else OrchidEmbeddings(config)
        self.encoder = OrchidEncoder(config)
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.projection if self.config.is_vision else self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        if self.config.is_vision:
            raise ValueError("an image model has no word embeddings to set")
        self.embeddings.word_embeddings = value

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
    ) -> BaseModelOutput:
        r"""
        input_ids (`(batch, length)`), inputs_embeds (`(batch, length, hidden_size)`): text input, one of the two.
        attention_mask (`(batch, length)`): 1 for real tokens, 0 for padding. Padding never changes the outputs
            at real positions: every Orchid operator zeroes it before mixing.
        pixel_values (`(batch, num_channels, image_size, image_size)`): image input, for vision configs.
        output_hidden_states: also return the input of every layer and the final output.
        """
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        if self.config.is_vision:
            if pixel_values is None:
                raise ValueError("this is an image model (config.image_size is set): pass pixel_values")
            hidden_states = self.embeddings(pixel_values)
            attention_mask = None
        else:
            self._check_text_input(input_ids, inputs_embeds, attention_mask)
            hidden_states = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)
        return self.encoder(hidden_states, attention_mask, output_hidden_states)

    def _check_text_input(self, input_ids, inputs_embeds, attention_mask) -> None:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids and inputs_embeds")
        shape = tuple(input_ids.shape if input_ids is not None else inputs_embeds.shape[:-1])
        if len(shape) != 2:
            raise ValueError(f"input_ids must have shape (batch, length), got {shape}")
        if shape[1] == 0:
            raise ValueError("the input is an empty sequence (length 0)")
        if shape[1] > self.config.max_position_embeddings:
            raise ValueError(
                f"the input has length {shape[1]} > max_position_embeddings={self.config.max_position_embeddings}"
            )
        if attention_mask is not None and tuple(attention_mask.shape) != shape:
            raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}, the input has shape {shape}")


# ---------------------------------------------------------------------------------------------
# Heads
# ---------------------------------------------------------------------------------------------


def classification_loss(config: OrchidConfig, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Regression, single-label or multi-label loss, the problem type inferred as BertForSequenceClassification does."""
    if config.problem_type is None:
        if config.num_labels == 1:
            config.problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            config.problem_type = "single_label_classification"
        else:
            config.problem_type = "multi_label_classification"
    if config.problem_type == "regression":
        return MSELoss()(logits.squeeze(-1), labels.squeeze(-1).to(logits.dtype))
    if config.problem_type == "single_label_classification":
        return CrossEntropyLoss()(logits.view(-1, config.num_labels), labels.view(-1))
    return BCEWithLogitsLoss()(logits, labels.to(logits.dtype))


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
    _auto_class = "AutoModelForMaskedLM"
    _tied_weights_keys = {"lm_head.decoder.weight": "orchid.embeddings.word_embeddings.weight"}

    def __init__(self, config: OrchidConfig):
        super().__init__(config)
        if config.is_vision:
            raise ValueError("OrchidForMaskedLM needs a text config (config.image_size must be None)")
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
        output_hidden_states: bool | None = None,
    ) -> MaskedLMOutput:
        r"""labels (`(batch, length)`): token ids to predict; -100 marks positions without a loss."""
        outputs = self.orchid(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_hidden_states=output_hidden_states,
        )
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            loss = CrossEntropyLoss()(logits.view(-1, self.config.vocab_size), labels.view(-1))
        return MaskedLMOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)


class OrchidSequencePooler(nn.Module):
    """The first token, or the mean over real tokens (the paper's choice for some GLUE tasks), then dense + tanh."""

    def __init__(self, config: OrchidConfig):
        super().__init__()
        self.pooling = config.classifier_pooling
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        if self.pooling == "first":
            pooled = hidden_states[:, 0]
        elif attention_mask is None:
            pooled = hidden_states.mean(dim=1)
        else:
            weights = attention_mask.to(hidden_states.dtype).unsqueeze(-1)
            pooled = (hidden_states * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1.0)
        return self.activation(self.dense(pooled))


class OrchidForSequenceClassification(OrchidPreTrainedModel):
    _auto_class = "AutoModelForSequenceClassification"
    def __init__(self, config: OrchidConfig):
        super().__init__(config)
        if config.is_vision:
            raise ValueError("OrchidForSequenceClassification needs a text config (config.image_size must be None)")
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
        output_hidden_states: bool | None = None,
    ) -> SequenceClassifierOutput:
        r"""labels (`(batch,)`): class ids, float targets for regression (num_labels = 1), or multi-hot floats."""
        outputs = self.orchid(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_hidden_states=output_hidden_states,
        )
        pooled = self.pooler(outputs.last_hidden_state, attention_mask)
        logits = self.classifier(self.dropout(pooled))
        loss = classification_loss(self.config, logits, labels) if labels is not None else None
        return SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)


class OrchidForTokenClassification(OrchidPreTrainedModel):
    _auto_class = "AutoModelForTokenClassification"
    def __init__(self, config: OrchidConfig):
        super().__init__(config)
        if config.is_vision:
            raise ValueError("OrchidForTokenClassification needs a text config (config.image_size must be None)")
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
        output_hidden_states: bool | None = None,
    ) -> TokenClassifierOutput:
        r"""labels (`(batch, length)`): a class id per token; -100 marks positions without a loss."""
        outputs = self.orchid(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_hidden_states=output_hidden_states,
        )
        logits = self.classifier(self.dropout(outputs.last_hidden_state))
        loss = None
        if labels is not None:
            loss = CrossEntropyLoss()(logits.view(-1, self.num_labels), labels.view(-1))
        return TokenClassifierOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)


class OrchidForImageClassification(OrchidPreTrainedModel):
    """Orchid-ViT: patch embeddings, Orchid blocks, global average pooling over patches, linear classifier."""
    _auto_class = "AutoModelForImageClassification"

    main_input_name = "pixel_values"

    def __init__(self, config: OrchidConfig):
        super().__init__(config)
        if not config.is_vision:
            raise ValueError("OrchidForImageClassification needs an image config (set image_size and patch_size)")
        self.num_labels = config.num_labels
        self.orchid = OrchidModel(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
    ) -> ImageClassifierOutput:
        r"""labels (`(batch,)`): class ids (or multi-hot floats for multi-label problems)."""
        outputs = self.orchid(pixel_values=pixel_values, output_hidden_states=output_hidden_states)
        logits = self.classifier(outputs.last_hidden_state.mean(dim=1))
        loss = classification_loss(self.config, logits, labels) if labels is not None else None
        return ImageClassifierOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)


__all__ = [
    "OrchidPreTrainedModel",
    "OrchidModel",
    "OrchidForMaskedLM",
    "OrchidForSequenceClassification",
    "OrchidForTokenClassification",
    "OrchidForImageClassification",
]
