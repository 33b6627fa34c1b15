"""Building blocks of Orchid (Karami & Ghodsi, NeurIPS 2024): transforms, the data-dependent long
convolution operator, and block-diagonal linear layers.

Section and equation numbers refer to the paper. Every sequence-mixing step runs along the sequence
axis, per channel. Tensors in the operator keep the transformers layout ``(batch, length, channels)``
at the boundary and work internally in ``(batch, channels, length)``, the layout that both
``torch.fft`` (last axis) and depthwise ``Conv1d`` want, so the input is transposed once per call.

This file depends only on torch and the standard library so that it can ship to the Hub as remote code.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

TRANSFORMS = ("dct", "fft")
CONDITIONINGS = ("abs", "xcorr")
CONDITIONING_ACTIVATIONS = ("identity", "sigmoid", "tanh", "softsign", "softshrink")


# ---------------------------------------------------------------------------------------------
# Transforms
# ---------------------------------------------------------------------------------------------


def dct(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal DCT-II along the last axis, equal to ``scipy.fft.dct(x, norm="ortho")``.

    Computed with one real FFT of the same length (Makhoul, 1980): the even-indexed samples followed by
    the odd-indexed ones reversed, transformed, then rotated by ``exp(-i pi k / 2N)``.
    """
    n = x.shape[-1]
    v = torch.cat([x[..., ::2], x[..., 1::2].flip(-1)], dim=-1)
    half = torch.fft.rfft(v, dim=-1)
    # Full spectrum of the real signal v from its half: V[N - k] = conj(V[k]).
    tail = half[..., 1 : (n + 1) // 2].flip(-1).conj()
    spectrum = torch.cat([half, tail], dim=-1)
    k = torch.arange(n, device=x.device, dtype=x.dtype)
    twiddle = torch.polar(torch.ones_like(k), -math.pi * k / (2 * n))
    out = (spectrum * twiddle).real * math.sqrt(2.0 / n)
    return torch.cat([out[..., :1] / math.sqrt(2.0), out[..., 1:]], dim=-1)


def idct(x: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`dct` (orthonormal DCT-III), equal to ``scipy.fft.idct(x, norm="ortho")``."""
    n = x.shape[-1]
    scaled = torch.cat([x[..., :1] * math.sqrt(2.0), x[..., 1:]], dim=-1) * math.sqrt(n / 2.0)
    # V[k] = (X[k] - i X[N - k]) exp(i pi k / 2N), with X[N] = 0; only k <= N/2 is needed for irfft.
    m = n // 2 + 1
    k = torch.arange(m, device=x.device, dtype=x.dtype)
    mirrored = torch.cat([torch.zeros_like(scaled[..., :1]), scaled.flip(-1)[..., : m - 1]], dim=-1)
    spectrum = torch.complex(scaled[..., :m], -mirrored) * torch.polar(torch.ones_like(k), math.pi * k / (2 * n))
    v = torch.fft.irfft(spectrum, n=n, dim=-1)
    out = torch.empty_like(v)
    out[..., ::2] = v[..., : (n + 1) // 2]
    out[..., 1::2] = v.flip(-1)[..., : n // 2]
    return out


def forward_transform(x: torch.Tensor, transform: str) -> torch.Tensor:
    """Orthonormal transform T of App. C.2 along the last axis: DCT-II (real) or real FFT (complex)."""
    if transform == "dct":
        return dct(x)
    return torch.fft.rfft(x, dim=-1, norm="ortho")


def long_convolution(x: torch.Tensor, kernel: torch.Tensor, transform: str) -> torch.Tensor:
    """Global convolution of ``x`` (..., N) with a time-domain ``kernel`` broadcastable to it.

    ``"fft"``: exact circular convolution, ``y[t] = sum_s kernel[(t - s) mod N] x[s]`` (Sec. 3.2).
    ``"dct"``: the product in the DCT domain, the even-symmetric counterpart of App. C.2.
    """
    n = x.shape[-1]
    return apply_spectrum(x, kernel_spectrum(kernel, transform), transform, n)


def kernel_spectrum(kernel: torch.Tensor, transform: str) -> torch.Tensor:
    """The multiplier that makes :func:`apply_spectrum` convolve with ``kernel`` (Listing 1, ``h_0_f``)."""
    if transform == "dct":
        return dct(kernel)
    # Unnormalised forward FFT paired with the unnormalised inverse: exactly circular convolution.
    return torch.fft.rfft(kernel, dim=-1)


def apply_spectrum(x: torch.Tensor, spectrum: torch.Tensor, transform: str, n: int) -> torch.Tensor:
    """``T^-1( T(x) * spectrum )``: the O(N log N) long convolution in the transform domain."""
    if transform == "dct":
        return idct(dct(x) * spectrum)
    return torch.fft.irfft(torch.fft.rfft(x, dim=-1) * spectrum, n=n, dim=-1)


# ---------------------------------------------------------------------------------------------
# Short convolutions
# ---------------------------------------------------------------------------------------------


class ShortConv1d(nn.Module):
    """Depthwise Conv1d along the sequence, centred (a bidirectional encoder sees both neighbours).

    ``padding_mode="circular"`` keeps the convolution exactly shift-equivariant on the circle, which the
    FFT path needs for Sec. 3.2; ``"zeros"`` suits the DCT path and the frequency axis.
    """

    def __init__(self, channels: int, kernel_size: int, padding_mode: str = "zeros", bias: bool = True):
        super().__init__()
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"short convolution kernel_size must be a positive odd number, got {kernel_size}")
        self.kernel_size = kernel_size
        self.padding_mode = padding_mode
        self.conv = nn.Conv1d(channels, channels, kernel_size, groups=channels, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, C, N)
        pad = self.kernel_size // 2
        if pad:
            if self.padding_mode == "circular" and x.shape[-1] >= pad:
                x = F.pad(x, (pad, pad), mode="circular")
            else:
                x = F.pad(x, (pad, pad))
        # Weights follow the input's dtype: the conditioning network runs in float32 inside bf16 models.
        weight = self.conv.weight.to(x.dtype)
        bias = None if self.conv.bias is None else self.conv.bias.to(x.dtype)
        return F.conv1d(x, weight, bias, groups=self.conv.groups)


class ShortConvStack(nn.Module):
    """``depth`` depthwise convolutions in a row (App. C.1 uses 1, and 3 for the hardest recall task).

    With a mask, masked positions are zeroed before each convolution, so that padding never leaks into
    real positions.
    """

    def __init__(self, channels: int, kernel_size: int, depth: int, padding_mode: str):
        super().__init__()
        self.layers = nn.ModuleList(ShortConv1d(channels, kernel_size, padding_mode) for _ in range(depth))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x if mask is None else x * mask)
        return x


# ---------------------------------------------------------------------------------------------
# Static implicit filter h0 = FFN(PosEmb(t))  (Remark 3.2; Hyena / CKConv)
# ---------------------------------------------------------------------------------------------


class Sin(nn.Module):
    """``sin(w * x)`` with a learnable frequency per feature, as in Hyena's implicit filters."""

    def __init__(self, dim: int, frequency: float = 1.0):
        super().__init__()
        self.frequency = nn.Parameter(torch.full((dim,), float(frequency)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.frequency * x)


def circular_lags(n: int) -> torch.Tensor:
    """Signed lag of each index of a circular kernel of length n: 0, 1, ..., then -n/2 ... -1."""
    index = torch.arange(n, dtype=torch.float32, device="cpu")
    return torch.where(index <= n // 2, index, index - n)


def lag_embedding(n: int, emb_dim: int) -> torch.Tensor:
    """PosEmb(t) of Remark 3.2: the lag itself and ``(emb_dim - 1) / 2`` sinusoid pairs, shape (n, emb_dim)."""
    lags = circular_lags(n)
    t = (lags / max(n, 1)).unsqueeze(-1)  # in [-1/2, 1/2]
    bands = (emb_dim - 1) // 2
    # Built on the CPU explicitly: transformers may construct the model under a meta-device context.
    frequencies = torch.linspace(1e-4, bands - 1, bands, device="cpu").unsqueeze(0)
    angle = 2 * math.pi * t * frequencies
    features = [t, torch.cos(angle), torch.sin(angle)]
    if 1 + 2 * bands < emb_dim:
        features.append(torch.zeros(n, emb_dim - 1 - 2 * bands, device="cpu"))
    return torch.cat(features, dim=-1)


class ImplicitLongFilter(nn.Module):
    """A static long kernel ``h0 = FFN(PosEmb(t)) * decay(t)`` over the circular lags of the transform.

    The FFN is ``Linear -> Sin -> (Linear -> Sin) x depth -> Linear`` (Hyena's implicit filter); the
    exponential decay ``exp(-|t| * rate_c)`` spans fast to slow rates across channels, so that some
    channels stay local and others reach the whole sequence. The lag is signed and circular: the kernel
    looks both ways, as a bidirectional encoder should. ``skip`` is Hyena's ``D`` term, ``y += D * x``.
    """

    def __init__(
        self,
        channels: int,
        length: int,
        emb_dim: int = 5,
        width: int = 64,
        depth: int = 1,
        sin_frequency: float = 1.0,
        decay: bool = True,
        fast_decay_pct: float = 0.3,
        slow_decay_pct: float = 1.5,
        decay_target: float = 1e-2,
    ):
        super().__init__()
        if emb_dim < 1 or width < 1:
            raise ValueError(f"implicit filter needs emb_dim >= 1 and width >= 1, got {emb_dim} and {width}")
        self.channels = channels
        self.length = length
        self.emb_dim = emb_dim
        self.sin_frequency = sin_frequency
        self.decay = decay
        self.decay_rates = (
            math.log(1 / decay_target) / slow_decay_pct,
            math.log(1 / decay_target) / fast_decay_pct,
        )
        layers: list[nn.Module] = [nn.Linear(emb_dim, width), Sin(width, sin_frequency)]
        for _ in range(depth):
            layers += [nn.Linear(width, width), Sin(width, sin_frequency)]
        layers.append(nn.Linear(width, channels, bias=False))
        self.ffn = nn.Sequential(*layers)
        self.skip = nn.Parameter(torch.randn(channels))
        self.register_buffer("lag_features", self.make_lag_features(), persistent=False)
        self.register_buffer("envelope", self.make_envelope(), persistent=False)

    def make_lag_features(self) -> torch.Tensor:
        return lag_embedding(self.length, self.emb_dim)

    def make_envelope(self) -> torch.Tensor:
        """exp(-|t| * rate_c), (length, channels); |t| is the lag over the kernel length, so the decay
        profile does not depend on max_len."""
        if not self.decay:
            return torch.ones(self.length, self.channels, device="cpu")
        rates = torch.linspace(*self.decay_rates, self.channels, device="cpu")
        return torch.exp(-circular_lags(self.length).abs().unsqueeze(-1) / max(self.length, 1) * rates)

    def forward(self) -> torch.Tensor:
        """The kernel in the time domain, shape (channels, length)."""
        return (self.ffn(self.lag_features) * self.envelope).transpose(0, 1)

    def spectrum(self, transform: str, dtype: torch.dtype) -> torch.Tensor:
        """The multiplier of ``h0 * x + skip * x`` in ``dtype``: both transforms are linear and orthogonal up
        to scale, so the skip term is the constant ``skip`` added to the kernel's spectrum."""
        return kernel_spectrum(self().to(dtype), transform) + self.skip.to(dtype)[:, None]


# ---------------------------------------------------------------------------------------------
# Conditioning network h_theta (Sec. 3.2, Eq. 2-4)
# ---------------------------------------------------------------------------------------------


def magnitude_activation(name: str, magnitude: torch.Tensor) -> torch.Tensor:
    """sigma of Eq. 4, applied to the magnitude of the spectrum."""
    if name == "identity":
        return magnitude
    if name == "sigmoid":
        return torch.sigmoid(magnitude)
    if name == "tanh":
        return torch.tanh(magnitude)
    if name == "softsign":
        return F.softsign(magnitude)
    return F.softshrink(magnitude)


class ConditioningNetwork(nn.Module):
    """h_theta^F(u): a shift-invariant kernel computed from the sequence u, directly in the transform domain.

    ``"abs"``   (Type I, Eq. 2):   ``Conv1d_freq( |T(Conv1d_time(u))| )``
    ``"xcorr"`` (Type II, Eq. 4):  ``Conv1d_freq( conj(T(Conv1d_k(u))) * sigma(T(Conv1d_q(u))) )``,
    with sigma applied to the magnitude and the phase kept. Removing the phase (Type I) or cancelling it
    in a cross-correlation (Type II) makes the kernel invariant to circular shifts of u, hence the long
    convolution shift-equivariant (Sec. 3.2, App. B). ``time_layers = 0`` or ``freq_layers = 0`` give the
    spectral-only and spatial-only ablations of App. C.2.
    """

    def __init__(
        self,
        channels: int,
        transform: str,
        conditioning: str = "abs",
        activation: str = "identity",
        time_kernel_size: int = 3,
        freq_kernel_size: int = 3,
        time_layers: int = 1,
        freq_layers: int = 1,
    ):
        super().__init__()
        self.transform = transform
        self.conditioning = conditioning
        self.activation = activation
        time_padding = "circular" if transform == "fft" else "zeros"
        self.time_conv = ShortConvStack(channels, time_kernel_size, time_layers, time_padding)
        if conditioning == "xcorr":
            self.query_conv = ShortConvStack(channels, time_kernel_size, time_layers, time_padding)
        self.freq_conv = ShortConvStack(channels, freq_kernel_size, freq_layers, "zeros")

    def forward(self, u: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """u: (B, C, N) float32 with masked positions zero. Returns the spectrum, (B, C, N or N//2+1)."""
        key = self._time_features(self.time_conv, u, mask)
        key_spectrum = forward_transform(key, self.transform)
        if self.conditioning == "abs":
            return self.freq_conv(key_spectrum.abs())
        query_spectrum = forward_transform(self._time_features(self.query_conv, u, mask), self.transform)
        if self.activation != "identity":
            magnitude = query_spectrum.abs()
            query_spectrum = query_spectrum * (
                magnitude_activation(self.activation, magnitude) / magnitude.clamp_min(1e-12)
            )
        product = key_spectrum.conj() * query_spectrum
        if torch.is_complex(product):
            # Real depthwise convolution over frequency, on the real and imaginary parts alike.
            return torch.complex(self.freq_conv(product.real), self.freq_conv(product.imag))
        return self.freq_conv(product)

    @staticmethod
    def _time_features(stack: ShortConvStack, u: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        features = stack(u, mask)
        return features if mask is None else features * mask


# ---------------------------------------------------------------------------------------------
# The Orchid operator (Sec. 3.3, App. D)
# ---------------------------------------------------------------------------------------------


class OrchidOperator(nn.Module):
    """Orchid sequence mixer: ``y = out_proj( s2 * (h * (s1 * v)) [+ h_res * x] )`` with ``h = h0 + h_theta(v)``.

    1. ``in_proj`` maps d -> 3d, a centred depthwise short convolution follows, and the result splits into
       the gates s1, s2 and the value v (the chain of order 1.5 of Sec. 3.3).
    2. The kernel is the static implicit filter h0 (Remark 3.2) plus the data-dependent kernel
       h_theta(v) (Eq. 2, or Eq. 3/4), or h_theta(u) of another sequence u (Remark 3.3).
    3. The long convolution runs in the transform domain in O(N log N): orthonormal DCT-II (the paper's
       choice) or the real FFT (exact circular convolution).
    4. A residual long convolution of the block input with a second static filter (App. C.3, from M2).

    The transform length N is ``max_len`` whatever the input length: shorter inputs are zero-padded
    inside, and positions where ``attention_mask`` is 0 are zeroed before every sequence-mixing step.
    A sequence's output therefore does not depend on how much padding its batch has. Transforms run in
    float32 even under autocast, since ``torch.fft`` has no bfloat16.
    """

    def __init__(
        self,
        d_model: int,
        max_len: int,
        transform: str = "dct",
        conditioning: str = "abs",
        conditioning_activation: str = "identity",
        short_conv_size: int = 3,
        conditioning_time_kernel_size: int = 3,
        conditioning_freq_kernel_size: int = 3,
        conditioning_time_layers: int = 1,
        conditioning_freq_layers: int = 1,
        data_dependent: bool = True,
        filter_emb_dim: int = 5,
        filter_width: int = 64,
        filter_depth: int = 1,
        filter_sin_frequency: float = 1.0,
        filter_decay: bool = True,
        residual_long_conv: bool = True,
        bias: bool = True,
    ):
        super().__init__()
        if d_model < 1:
            raise ValueError(f"d_model must be >= 1, got {d_model}")
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        if transform not in TRANSFORMS:
            raise ValueError(f"transform must be one of {TRANSFORMS}, got {transform!r}")
        if conditioning not in CONDITIONINGS:
            raise ValueError(f"conditioning must be one of {CONDITIONINGS}, got {conditioning!r}")
        if conditioning_activation not in CONDITIONING_ACTIVATIONS:
            raise ValueError(
                f"conditioning_activation must be one of {CONDITIONING_ACTIVATIONS}, got {conditioning_activation!r}"
            )
        if conditioning_time_layers < 0 or conditioning_freq_layers < 0:
            raise ValueError(
                "conditioning_time_layers and conditioning_freq_layers must be >= 0, got "
                f"{conditioning_time_layers} and {conditioning_freq_layers}"
            )
        self.d_model = d_model
        self.max_len = max_len
        self.transform = transform
        self.data_dependent = data_dependent
        short_padding = "circular" if transform == "fft" else "zeros"

        self.in_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.short_conv = ShortConv1d(3 * d_model, short_conv_size, short_padding)
        self.static_filter = ImplicitLongFilter(
            d_model, max_len, filter_emb_dim, filter_width, filter_depth, filter_sin_frequency, filter_decay
        )
        self.conditioning = (
            ConditioningNetwork(
                d_model,
                transform,
                conditioning,
                conditioning_activation,
                conditioning_time_kernel_size,
                conditioning_freq_kernel_size,
                conditioning_time_layers,
                conditioning_freq_layers,
            )
            if data_dependent
            else None
        )
        self.residual_filter = (
            ImplicitLongFilter(
                d_model, max_len, filter_emb_dim, filter_width, filter_depth, filter_sin_frequency, filter_decay
            )
            if residual_long_conv
            else None
        )
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self._spectrum_cache: dict = {}

    def forward(
        self,
        x: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        conditioning_input: torch.Tensor | None = None,
        conditioning_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x: (B, L, d); attention_mask: (B, L) with 1 for real tokens; returns (B, L, d).

        ``conditioning_input`` u (B, L_u, d), L_u <= max_len, makes the kernel h_theta(u) instead of
        h_theta(v) (Remark 3.3); ``conditioning_mask`` (B, L_u) marks its real positions.
        """
        batch, length = self._check_input("x", x, attention_mask)
        mask = self._padded_mask(attention_mask, batch, length, x)  # (B, 1, N) or None

        projected = self._to_channels_first(self.in_proj(x))  # (B, 3d, N), zero past L
        projected = self._masked(projected, mask)
        gated = self.short_conv(projected)
        s1, s2, v = gated.split(self.d_model, dim=1)

        # Transforms in float32 at least: torch.fft has no bfloat16, and fp16 only for powers of two.
        compute_dtype = torch.promote_types(x.dtype, torch.float32)
        with torch.autocast(device_type=x.device.type, enabled=False):
            spectrum = self._filter_spectrum("static", self.static_filter, compute_dtype)
            if self.conditioning is not None:
                spectrum = spectrum + self._data_spectrum(
                    x, projected, mask, conditioning_input, conditioning_mask, compute_dtype
                )
            y = apply_spectrum(self._masked((s1 * v).to(compute_dtype), mask), spectrum, self.transform, self.max_len)
            y = y.to(s2.dtype) * s2
            if self.residual_filter is not None:
                block_input = self._masked(self._to_channels_first(x).to(compute_dtype), mask)
                residual_spectrum = self._filter_spectrum("residual", self.residual_filter, compute_dtype)
                y = y + apply_spectrum(block_input, residual_spectrum, self.transform, self.max_len).to(y.dtype)
            y = self._masked(y, mask)

        y = y[..., :length].transpose(1, 2)
        return self.out_proj(y.to(x.dtype))

    # -- helpers, in the order forward uses them --------------------------------------------------

    def _check_input(self, name: str, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[int, int]:
        if x.dim() != 3:
            raise ValueError(f"{name} must have shape (batch, length, {self.d_model}), got {tuple(x.shape)}")
        batch, length, features = x.shape
        if features != self.d_model:
            raise ValueError(f"{name} has {features} features but the operator has d_model={self.d_model}")
        if length == 0:
            raise ValueError(f"{name} is an empty sequence (length 0); the operator needs 1 <= length <= max_len")
        if length > self.max_len:
            raise ValueError(f"{name} has length {length} > max_len={self.max_len}")
        if mask is not None and tuple(mask.shape) != (batch, length):
            raise ValueError(
                f"attention mask for {name} has shape {tuple(mask.shape)}, expected (batch, length) = "
                f"{(batch, length)}"
            )
        return batch, length

    def _padded_mask(
        self, attention_mask: torch.Tensor | None, batch: int, length: int, like: torch.Tensor
    ) -> torch.Tensor | None:
        """(B, 1, N) mask in the dtype of ``like``; None when every position is real and N == L."""
        if attention_mask is None:
            if length == self.max_len:
                return None
            attention_mask = torch.ones(batch, length, device=like.device)
        mask = attention_mask.to(like.dtype).unsqueeze(1)
        return F.pad(mask, (0, self.max_len - length))

    def _to_channels_first(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, C) -> (B, C, N), zero-padded to the transform length."""
        return F.pad(x.transpose(1, 2), (0, self.max_len - x.shape[1]))

    @staticmethod
    def _masked(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return x if mask is None else x * mask.to(x.dtype)

    def _filter_spectrum(self, name: str, long_filter: ImplicitLongFilter, dtype: torch.dtype) -> torch.Tensor:
        """T(h0) of a static filter, (d, N or N//2+1). Without gradients it is computed once and reused
        until a parameter of the filter changes."""
        if torch.is_grad_enabled():
            return long_filter.spectrum(self.transform, dtype)
        key = (dtype, *self._cache_key(long_filter))
        cached = self._spectrum_cache.get(name)
        if cached is None or cached[0] != key:
            cached = (key, long_filter.spectrum(self.transform, dtype))
            self._spectrum_cache[name] = cached
        return cached[1]

    def _data_spectrum(self, x, projected, mask, conditioning_input, conditioning_mask, dtype) -> torch.Tensor:
        """h_theta^F of v, or of the cross-conditioning sequence u projected like v (Remark 3.3)."""
        if conditioning_input is None:
            source, source_mask = projected[:, 2 * self.d_model :], mask
        else:
            batch, length = self._check_input("conditioning_input", conditioning_input, conditioning_mask)
            if batch != x.shape[0]:
                raise ValueError(f"conditioning_input has batch size {batch}, x has {x.shape[0]}")
            weight, bias = self.in_proj.weight[2 * self.d_model :], None
            if self.in_proj.bias is not None:
                bias = self.in_proj.bias[2 * self.d_model :]
            # Zero-padded to the transform length, which Remark 3.3 reads as interpolation in frequency.
            source = self._to_channels_first(F.linear(conditioning_input, weight, bias))
            source_mask = self._padded_mask(conditioning_mask, batch, length, source)
            source = self._masked(source, source_mask)
        return self.conditioning(source.to(dtype), None if source_mask is None else source_mask.to(dtype))

    @staticmethod
    def _cache_key(module: nn.Module) -> tuple:
        # In-place updates (optimizer steps, load_state_dict) bump a tensor's version counter.
        return tuple((p.data_ptr(), p._version, p.device, p.dtype) for p in module.parameters())

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, max_len={self.max_len}, transform={self.transform!r}"


# ---------------------------------------------------------------------------------------------
# Block-diagonal linear layer (Monarch of order 1; Dao et al. 2022)
# ---------------------------------------------------------------------------------------------


class BlockDiagonalLinear(nn.Module):
    """``y = blockdiag(W_1, ..., W_b) x + bias``: b independent dense maps on equal slices of the features.

    It has 1/b of a dense layer's parameters and FLOPs; the BERT and ImageNet models use b = 4 in their MLPs.
    """

    def __init__(self, in_features: int, out_features: int, num_blocks: int = 4, bias: bool = True):
        super().__init__()
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if in_features % num_blocks or out_features % num_blocks:
            raise ValueError(
                f"in_features={in_features} and out_features={out_features} must both be divisible by "
                f"num_blocks={num_blocks}"
            )
        self.in_features = in_features
        self.out_features = out_features
        self.num_blocks = num_blocks
        self.weight = nn.Parameter(torch.empty(num_blocks, out_features // num_blocks, in_features // num_blocks))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # The same fan-in scaling nn.Linear uses, with the fan-in of one block.
        bound = 1 / math.sqrt(self.in_features // self.num_blocks)
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"expected {self.in_features} input features, got {x.shape[-1]}")
        leading = x.shape[:-1]
        blocks = x.reshape(-1, self.num_blocks, self.in_features // self.num_blocks).transpose(0, 1)
        y = torch.bmm(blocks, self.weight.transpose(1, 2)).transpose(0, 1).reshape(*leading, self.out_features)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, num_blocks={self.num_blocks}"
