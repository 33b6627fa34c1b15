"""The Orchid layer (Karami & Ghodsi, *Orchid: Flexible and Data-Dependent Convolution for Sequence Modeling*,
NeurIPS 2024), in the order of the paper: transforms, the short convolution, the static implicit filter (Remark 3.2),
the conditioning network (Sec. 3.2, Eq. 2-4), the operator (Sec. 3.3 and Listing 1), and the block-diagonal linear
layer of the MLPs. Section and equation numbers refer to that paper.

Every module here is plain PyTorch: each projection and convolution is a module that is called, and nothing derived
from a parameter outlives a call, so hooks, peft, quantisation, pruning, fused optimizers and ``.data`` edits see the
model as it is. Activations keep the transformers layout ``(batch, length, channels)``; every sequence-mixing step
acts along axis 1, on each channel alone.

This file depends only on torch and the standard library (SciPy, when installed, computes the DCT on the CPU), so
that it ships to the Hub as remote code.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

try:  # optional: the DCT on the CPU, see `dct`
    import scipy.fft as scipy_fft
except ImportError:
    scipy_fft = None

TRANSFORMS = ("dct", "fft")
CONDITIONINGS = ("abs", "xcorr")
CONDITIONING_ACTIVATIONS = ("identity", "sigmoid", "tanh", "softsign", "softshrink")
# How the static filter's multiplier is formed under the DCT: the paper's Listing 1, ``dct(h0)``, or the spectrum of
# a convolution with h0 (see ImplicitFilter). Under the FFT both are the exact circular convolution.
FILTER_SPECTRA = ("listing1", "convolution")


# ---------------------------------------------------------------------------------------------
# Transforms (App. C.2): the orthonormal DCT-II and the real FFT
# ---------------------------------------------------------------------------------------------


def dct(x: torch.Tensor, dim: int = -1, n: int | None = None) -> torch.Tensor:
    """Orthonormal DCT-II along ``dim`` of ``x`` zero-padded to length ``n`` (default: its own length); equal to
    ``scipy.fft.dct(x, n=n, axis=dim, norm="ortho")``.

    On the CPU (float32 or float64, eager) it runs through pocketfft, SciPy's FFT library, which computes the DCT
    natively; elsewhere, and without SciPy, through one real FFT of the same length (Makhoul, 1980), written for an
    exported graph in real arithmetic (:func:`_dct_in_graph`).
    """
    dim = dim % x.dim()
    n = x.shape[dim] if n is None else n
    if n < x.shape[dim]:
        raise ValueError(f"dct: n={n} is shorter than the input ({x.shape[dim]} samples along dim {dim})")
    if uses_pocketfft(x):
        return PocketfftTransform.apply(x, dim, n, False)
    if is_exporting():
        return _dct_in_graph(zero_padded(x, dim, n), dim)
    return _dct_by_fft(zero_padded(x, dim, n).movedim(dim, -1)).movedim(-1, dim)


def idct(x: torch.Tensor, dim: int = -1, length: int | None = None) -> torch.Tensor:
    """The first ``length`` samples (default: all) of the orthonormal inverse DCT (DCT-III) along ``dim``; equal to
    ``scipy.fft.idct(x, axis=dim, norm="ortho")`` cut to ``length``."""
    dim = dim % x.dim()
    length = x.shape[dim] if length is None else length
    if uses_pocketfft(x):
        return PocketfftTransform.apply(x, dim, length, True)
    if is_exporting():
        return _idct_in_graph(x, dim, length)
    return _idct_by_fft(x.movedim(dim, -1)).movedim(-1, dim).narrow(dim, 0, length)


def uses_pocketfft(x: torch.Tensor) -> bool:
    """Whether :func:`dct` and :func:`idct` run through SciPy's pocketfft for tensors like ``x``: on the CPU, in
    float32 or float64, outside ``torch.compile``, with SciPy installed."""
    return (
        scipy_fft is not None
        and x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.float64)
        and not torch.compiler.is_compiling()
    )


def _pocketfft(x: torch.Tensor, dim: int, size: int, inverse: bool) -> torch.Tensor:
    """The orthonormal DCT-II (or, ``inverse``, DCT-III) of size ``size`` along ``dim`` of x zero-padded to it.

    The result is a tensor that torch allocates and pocketfft overwrites in place, so that torch's memory profiler
    counts it like any other tensor."""
    out = x.new_empty(*x.shape[:dim], size, *x.shape[dim + 1 :])
    out.narrow(dim, 0, x.shape[dim]).copy_(x)
    out.narrow(dim, x.shape[dim], size - x.shape[dim]).zero_()
    return pocketfft_in_place(out, dim, inverse)


def pocketfft_in_place(out: torch.Tensor, dim: int, inverse: bool) -> torch.Tensor:
    """The orthonormal DCT-II (or, ``inverse``, DCT-III) along ``dim`` of the CPU tensor ``out``, written over it."""
    array = out.detach().numpy()
    transform = scipy_fft.idct if inverse else scipy_fft.dct
    result = transform(array, type=2, axis=dim, norm="ortho", overwrite_x=True, workers=torch.get_num_threads())
    if result.ctypes.data != array.ctypes.data:  # SciPy may decline to work in place
        out.copy_(torch.from_numpy(result))
    return out


class PocketfftTransform(torch.autograd.Function):
    """:func:`dct` (``inverse=False``: x zero-padded to ``size``) or :func:`idct` (``inverse=True``: the first
    ``size`` samples) through pocketfft, with its gradient. The DCT is orthonormal, so the gradient of the padded DCT
    is the inverse DCT cut to the input's length, and the gradient of the cut inverse is the DCT of the gradient
    padded back; each backward calls the other direction through this Function, so double backward works too."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int, size: int, inverse: bool) -> torch.Tensor:
        ctx.dim, ctx.inverse, ctx.input_length = dim, inverse, x.shape[dim]
        if not inverse:
            return _pocketfft(x, dim, size, inverse=False)
        signal = _pocketfft(x, dim, x.shape[dim], inverse=True)
        # A copy when cut, not a view: autograd forbids in-place updates of views made inside a Function.
        return signal if size == x.shape[dim] else signal.narrow(dim, 0, size).contiguous()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return PocketfftTransform.apply(grad, ctx.dim, ctx.input_length, not ctx.inverse), None, None, None


def zero_padded(x: torch.Tensor, dim: int, n: int) -> torch.Tensor:
    """x zero-padded at the end of ``dim`` to length ``n`` >= its length (x itself at that length).

    Compiled or exported, always one pad op, whose size may be zero: a branch on the length, or the padding inside
    ``torch.fft.rfft(x, n=n)``, would tie a graph traced with a dynamic length to one side of ``length < n``, and an
    exported model (ONNX) to the example's length."""
    if torch.compiler.is_compiling():
        return F.pad(x, [0, 0] * (x.dim() - 1 - dim) + [0, n - x.shape[dim]])
    if n == x.shape[dim]:
        return x
    return torch.cat([x, x.new_zeros(*x.shape[:dim], n - x.shape[dim], *x.shape[dim + 1 :])], dim)


def rfft_padded(x: torch.Tensor, n: int, dim: int, norm: str | None = None) -> torch.Tensor:
    """``torch.fft.rfft(x, n=n, dim=dim, norm=norm)`` for n >= the length of x along ``dim``, padded by
    :func:`zero_padded` when compiled or exported."""
    if torch.compiler.is_compiling():
        return torch.fft.rfft(zero_padded(x, dim, n), dim=dim, norm=norm)
    return torch.fft.rfft(x, n=n, dim=dim, norm=norm)


def _dct_by_fft(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal DCT-II along the last axis with one real FFT of the same length (Makhoul, 1980): the even-indexed
    samples followed by the odd-indexed ones reversed, transformed, then rotated by ``exp(-i pi k / 2N)``."""
    n = x.shape[-1]
    v = torch.cat([x[..., ::2], x[..., 1::2].flip(-1)], dim=-1)
    half = torch.fft.rfft(v, dim=-1)
    # Full spectrum of the real signal v from its half: V[N - k] = conj(V[k]).
    spectrum = torch.cat([half, half[..., 1 : (n + 1) // 2].flip(-1).conj()], dim=-1)
    k = torch.arange(n, device=x.device, dtype=x.dtype)
    out = (spectrum * torch.polar(torch.ones_like(k), -math.pi * k / (2 * n))).real * math.sqrt(2.0 / n)
    return torch.cat([out[..., :1] / math.sqrt(2.0), out[..., 1:]], dim=-1)


def _idct_by_fft(x: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`_dct_by_fft` (orthonormal DCT-III) along the last axis."""
    n = x.shape[-1]
    scaled = torch.cat([x[..., :1] * math.sqrt(2.0), x[..., 1:]], dim=-1) * math.sqrt(n / 2.0)
    # V[k] = (X[k] - i X[N - k]) exp(i pi k / 2N), with X[N] = 0; only k <= N/2 is needed for irfft.
    m = n // 2 + 1
    k = torch.arange(m, device=x.device, dtype=x.dtype)
    mirrored = torch.cat([torch.zeros_like(scaled[..., :1]), scaled.flip(-1)[..., : m - 1]], dim=-1)
    spectrum = torch.complex(scaled[..., :m], -mirrored) * torch.polar(torch.ones_like(k), math.pi * k / (2 * n))
    v = torch.fft.irfft(spectrum, n=n, dim=-1)
    # Undo Makhoul's reordering: y[2j] = v[j], y[2j + 1] = v[n - 1 - j].
    return torch.stack([v[..., : (n + 1) // 2], v.flip(-1)[..., : (n + 1) // 2]], dim=-1).flatten(-2)[..., :n]


def is_exporting() -> bool:
    """Whether the call is being traced by ``torch.export`` (and so for ONNX)."""
    exporting = getattr(torch.compiler, "is_exporting", None)  # torch >= 2.5
    return exporting is not None and exporting()


def _makhoul_order(n: int) -> list[int]:
    """Makhoul's reordering as an index: the even-indexed samples, then the odd-indexed ones reversed."""
    return list(range(0, n, 2)) + list(range(1, n, 2))[::-1]


def _constant(values: list, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``values`` as a tensor on ``like``'s device (in ``like``'s dtype unless ``dtype``). Traced, a constant of the
    graph: computed here in Python rather than by ops in the graph, which the exporter would trace, translate and
    fold on every call of a transform."""
    return torch.tensor(values, dtype=like.dtype if dtype is None else dtype, device=like.device)


def _along(values: torch.Tensor, x: torch.Tensor, dim: int) -> torch.Tensor:
    """``values`` (n, ...) shaped to broadcast against x along ``dim`` (its trailing axes after the first kept)."""
    return values.view(values.shape[0], *([1] * (x.dim() - 1 - dim)), *values.shape[1:])


def _dct_in_graph(x: torch.Tensor, dim: int) -> torch.Tensor:
    """:func:`_dct_by_fft` along ``dim``, in the form an exported graph takes (``torch.export``, ONNX): Makhoul's
    reordering as one gather, the real FFT along ``dim`` itself (no transposes), and output k as
    ``Re V[k] cos(pi k / 2N) + Im V[k] sin(pi k / 2N)``, scaled, with V[k] of the upper half read from its mirror
    V[N - k] = conj(V[k]): one gather of the half spectrum's real and imaginary parts and one weighted sum, where
    the complex steps (the full spectrum, the rotation, the real part) would each be several ops in real pairs."""
    n = x.shape[dim]
    half = torch.view_as_real(torch.fft.rfft(x.index_select(dim, _constant(_makhoul_order(n), x, torch.long)), dim=dim))
    # (n, 2): the weights of each output's real and imaginary part; the mirror's imaginary part changes sign.
    weights = []
    for k in range(n):
        angle, scale, sign = math.pi * k / (2 * n), math.sqrt((1.0 if k == 0 else 2.0) / n), -1 if k > n // 2 else 1
        weights.append([math.cos(angle) * scale, math.sin(angle) * sign * scale])
    spectrum = half.index_select(dim, _constant([n - k if k > n // 2 else k for k in range(n)], x, torch.long))
    return (spectrum * _along(_constant(weights, x), x, dim)).sum(-1)


def _idct_in_graph(x: torch.Tensor, dim: int, length: int) -> torch.Tensor:
    """The first ``length`` samples of :func:`_idct_by_fft` along ``dim``, in the form an exported graph takes: with
    X[N] = 0 and a = pi k / 2N, the half spectrum ``V[k] = (X[k] - i X[N - k]) exp(i a)`` of Makhoul's reordered
    signal in real arithmetic (X[N - k] as one gather), its inverse real FFT along ``dim``, and the reordering undone
    and the samples cut by one gather (a cut of its own, a view, would tie the graph to one side of length < N)."""
    n = x.shape[dim]
    m = n // 2 + 1
    scales = [math.sqrt(float(n) if k == 0 else n / 2.0) for k in range(m)]
    cos = _along(_constant([math.cos(math.pi * k / (2 * n)) * scales[k] for k in range(m)], x), x, dim)
    sin = _along(_constant([math.sin(math.pi * k / (2 * n)) * scales[k] for k in range(m)], x), x, dim)
    head = x.narrow(dim, 0, m)
    # X[N - k]; at k = 0 the zero appended after the last sample, whatever its scale.
    mirror = zero_padded(x, dim, n + 1).index_select(dim, _constant([n - k for k in range(m)], x, torch.long))
    spectrum = torch.complex(head * cos + mirror * sin, head * sin - mirror * cos)
    v = torch.fft.irfft(spectrum, n=n, dim=dim)
    # v[i] holds y[order[i]]: y is v read at the inverse permutation.
    order = _makhoul_order(n)
    inverse = sorted(range(n), key=order.__getitem__)
    return v.index_select(dim, _constant(inverse, x, torch.long)[:length])


def forward_transform(x: torch.Tensor, transform: str, n: int, dim: int = 1) -> torch.Tensor:
    """The orthonormal transform T of App. C.2 along ``dim`` of x zero-padded to n: the DCT-II (real, n samples) or
    the real FFT (complex, n // 2 + 1 samples)."""
    if transform == "dct":
        return dct(x, dim, n)
    return rfft_padded(x, n, dim, norm="ortho")


def kernel_spectrum(kernel: torch.Tensor, transform: str, dim: int = 0) -> torch.Tensor:
    """The multiplier that makes :func:`long_convolution` convolve with ``kernel``, whose samples lie along ``dim``.

    ``"fft"``: the unnormalised real FFT, which the unnormalised inverse in :func:`long_convolution` turns into exactly
    a circular convolution; index m of the kernel is the lag m mod N.
    ``"dct"``: the cosine transform of the kernel's even extension, ``H[k] = h[0] + 2 sum_m h[m] cos(pi k m / N)``,
    which makes the product in the DCT domain a symmetric convolution (Martucci, 1994); index m is the lag +-m.
    """
    if transform == "fft":
        return torch.fft.rfft(kernel, dim=dim)
    n = kernel.shape[dim]
    # h[0] .. h[N-1], 0, h[N-1] .. h[1]: real and even over 2N samples, so its real FFT is real.
    zero = torch.zeros_like(kernel.narrow(dim, 0, 1))
    extension = torch.cat([kernel, zero, kernel.narrow(dim, 1, n - 1).flip(dim)], dim)
    return torch.fft.rfft(extension, dim=dim).real.narrow(dim, 0, n)


def long_convolution(x: torch.Tensor, multiplier: torch.Tensor, transform: str, n: int, dim: int = 1) -> torch.Tensor:
    """The global convolution ``T^-1(T(x) * H)`` in O(N log N) along ``dim`` of x zero-padded to n: the first
    ``x.shape[dim]`` samples.

    ``"fft"``: with ``H = kernel_spectrum(h, "fft")``, exactly the circular convolution
    ``y[t] = sum_s h[(t - s) mod N] x[s]`` (Sec. 3.2).
    ``"dct"``: with ``H = kernel_spectrum(h, "dct")``, the symmetric convolution, x extended by its mirror image
    instead of periodically: ``y[t] = sum_s x[s] (h[|t - s|] + h[t + s + 1])``, where the second term, the reflection
    at the start of the sequence, reads ``h[2N - m]`` for lags m > N and 0 at m = N.
    """
    length = x.shape[dim]
    if transform == "dct":
        return idct(dct(x, dim, n) * multiplier, dim, length)
    spectrum = rfft_padded(x, n, dim) * multiplier
    return torch.fft.irfft(spectrum, n=n, dim=dim).narrow(dim, 0, length)


def gated_long_convolution(
    s1: torch.Tensor,
    v: torch.Tensor,
    s2: torch.Tensor,
    multiplier: torch.Tensor,
    mask: torch.Tensor | None,
    transform: str,
    n: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The chain of order 1.5 of Sec. 3.3, ``s2 * (h * (s1 * v))``, with the long convolution of
    :func:`long_convolution` by ``multiplier`` in ``dtype``; ``s1 * v`` is cleared where ``mask`` (B, L, 1) is False."""
    u = masked((s1 * v).to(dtype), mask)
    return long_convolution(u, multiplier, transform, n) * s2


def recomputed_in_backward(function, *args):
    """``function(*args)``, keeping only ``args`` for backward and recomputing what ``function`` computed from them
    when backward needs it (a non-reentrant :func:`torch.utils.checkpoint.checkpoint`); without autograd, a plain call.

    The operator runs its long convolutions through this. Written out, autograd keeps the transform of each input and
    the convolution before its gate, each the size of an activation (padded to the transform length); their inputs are
    kept anyway (the gates by the short convolution's backward, the block input by ``in_proj``'s), and one transform
    recomputes each. Nothing inside is a module, so no hook fires twice."""
    if torch.is_grad_enabled() and any(isinstance(arg, torch.Tensor) and arg.requires_grad for arg in args):
        return checkpoint(function, *args, use_reentrant=False, preserve_rng_state=False)
    return function(*args)


# ---------------------------------------------------------------------------------------------
# Masks and channel groups
# ---------------------------------------------------------------------------------------------

# Every step between the operator's projections acts on each channel alone. On long inputs the operator runs them for
# groups of channels in turn, each group's tensors holding about this many numbers (2 MiB in float32) and at least
# MIN_CHANNEL_GROUP channels: small tensors stay in cache and reuse freed memory, where sequence-sized ones (48 MiB at
# 16K tokens and width 768) would take fresh pages from the operating system on every call.
CHANNEL_GROUP_ELEMENTS = 2**19
MIN_CHANNEL_GROUP = 32
ALL_CHANNELS = slice(None)


def gate_channels(channels: slice, d_model: int, device: torch.device) -> slice | torch.Tensor:
    """The channels of a (3 d_model)-wide tensor, such as in_proj's output, that hold the gates s1, s2 and the value v
    of ``channels``: all of them, or an index of the three runs."""
    if channels == ALL_CHANNELS:
        return ALL_CHANNELS
    index = torch.arange(channels.start, channels.stop, device=device)
    return torch.cat([index, index + d_model, index + 2 * d_model])


def channel_groups(channels: int, tokens: int) -> list[slice]:
    """Consecutive ranges of ``channels`` whose (tokens, group) tensors hold about ``CHANNEL_GROUP_ELEMENTS`` numbers;
    all channels at once where that would make fewer than four groups, which would save little."""
    width = max(CHANNEL_GROUP_ELEMENTS // tokens // MIN_CHANNEL_GROUP * MIN_CHANNEL_GROUP, MIN_CHANNEL_GROUP)
    if 4 * width > channels:
        return [ALL_CHANNELS]
    return [slice(start, min(start + width, channels)) for start in range(0, channels, width)]


def check_values(valid: torch.Tensor, message: str, eager_message: Callable[[], str] | None = None) -> None:
    """A ValueError unless every element of the boolean tensor ``valid`` is True: with ``eager_message()`` (which may
    read the offending values) or ``message``.

    Under torch.compile and torch.export a graph cannot raise on data, and reading a value (``.item()``, ``bool()``)
    would break the graph or stop the export. There the check is an assertion inside the graph
    (``torch._assert_async``), which stops the run with a RuntimeError carrying ``message``; on a GPU it is a
    device-side assertion."""
    if torch.compiler.is_compiling():
        torch._assert_async(valid.all(), message)
    elif not bool(valid.all()):
        raise ValueError(eager_message() if eager_message is not None else message)


def value_range(values: torch.Tensor) -> str:
    """"values from LOW to HIGH" of a non-empty tensor, for error messages (eager only: it reads the values)."""
    return f"values from {values.min().item()} to {values.max().item()}"


def check_attention_mask(attention_mask: torch.Tensor, shape: tuple[int, int], name: str = "attention_mask"):
    """A ValueError unless ``attention_mask`` has ``shape`` and holds only 0 and 1 (bool, integer or float); compiled
    and exported, an assertion in the graph (:func:`check_values`), so that a mask is never misread."""
    if tuple(attention_mask.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(attention_mask.shape)}, expected (batch, length) = {tuple(shape)}")
    if attention_mask.dtype == torch.bool or not attention_mask.numel():
        return
    binary = (attention_mask == 0) | (attention_mask == 1)
    rule = f"{name} must hold 1 for real tokens and 0 for padding (bool, integer or float)"
    additive = "additive masks (0 / -10000 or -inf) are not accepted"
    check_values(
        binary, f"{rule}; {additive}", lambda: f"{rule}, got {value_range(attention_mask[~binary])}; {additive}"
    )


def front_packing_order(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """For each row, the positions of its real tokens in order followed by its padding, (B, L); None when every row
    already has its real tokens first (right padding or none).

    Orchid mixes each sequence through a transform of fixed length from position 0, so the same tokens give the same
    outputs only if they start at position 0: rows padded on the left (or with holes) are gathered into this order
    before mixing and scattered back after."""
    if attention_mask is None:
        return None
    real = attention_mask.bool()
    # Under torch.compile the order is always taken (the identity for right padding): a graph cannot branch on data.
    if not torch.compiler.is_compiling() and bool((real[:, 1:] <= real[:, :-1]).all()):
        return None
    # A stable sort of "is padding" keeps the real tokens, then the padding, each in their order.
    return torch.sort((~real).to(torch.uint8), dim=1, stable=True).indices


def gather_rows(x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """``x[b, order[b]]`` for each row b of x (B, L, ...)."""
    index = order.view(*order.shape, *([1] * (x.dim() - 2))).expand(*order.shape, *x.shape[2:])
    return torch.gather(x, 1, index)


def scatter_rows(x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`gather_rows`: ``out[b, order[b]] = x[b]``."""
    index = order.view(*order.shape, *([1] * (x.dim() - 2))).expand(*order.shape, *x.shape[2:])
    return torch.empty_like(x).scatter_(1, index, x)


def masked(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """x with the positions where ``mask`` (B, L, 1, bool) is False set to zero. A selection, not a product, so that
    NaN or inf at padded positions never reaches a real one (0 * NaN is NaN)."""
    return x if mask is None else x.masked_fill(~mask, 0.0)


# ---------------------------------------------------------------------------------------------
# Short convolution
# ---------------------------------------------------------------------------------------------


def depthwise_convolution(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, padding: int = 0) -> torch.Tensor:
    """x (B, L, C) convolved along L, each channel with its own kernel (weight (C, 1, k), bias (C)), with ``padding``
    zeros at either end. It runs as a 2-D depthwise convolution of height 1 on a channels-last view of x, which oneDNN
    computes without transposing the activations."""
    image = x.transpose(1, 2).unsqueeze(2)  # (B, C, 1, L): a channels-last view, no copy
    out = F.conv2d(image, weight.unsqueeze(2), bias, padding=(0, padding), groups=weight.shape[0])
    return out.squeeze(2).transpose(1, 2)


def short_convolution(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, wrap: bool) -> torch.Tensor:
    """The centred depthwise convolution of :class:`ShortConvolution`: around the circle where ``wrap`` (and the
    sequence is at least as long as the kernel's reach), else over zeros."""
    pad = weight.shape[-1] // 2
    if isinstance(wrap, torch.SymBool) and pad > 0:
        return depthwise_convolution(traced_circular_padding(x, pad, wrap), weight, bias)
    if wrap and 0 < pad <= x.shape[1]:
        return depthwise_convolution(torch.cat([x[:, x.shape[1] - pad :], x, x[:, :pad]], dim=1), weight, bias)
    return depthwise_convolution(x, weight, bias, pad)


def traced_circular_padding(x: torch.Tensor, pad: int, wrap: torch.SymBool) -> torch.Tensor:
    """x (B, L, C) with ``pad`` samples added at either end of L: those of the other end where ``wrap`` and
    ``pad <= L`` (the circular branch of :func:`short_convolution`), zeros otherwise.

    Traced with a dynamic length (``torch.export``, ONNX), ``wrap`` (length == transform length) is symbolic, and a
    branch on it would tie the graph to one side: here both ends are computed for any length and one is selected."""
    length = x.shape[1]
    wraps = torch.sym_ite(wrap, 1, 0) * torch.sym_ite(pad <= length, 1, 0)
    select = torch.full((), wraps, dtype=torch.bool, device=x.device)
    tail = F.pad(x, [0, 0, pad, 0])[:, length:]  # the last pad samples (zeros first where L < pad)
    head = F.pad(x, [0, 0, 0, pad])[:, :pad]
    zero = x.new_zeros(())
    return torch.cat([torch.where(select, tail, zero), x, torch.where(select, head, zero)], dim=1)


class ShortConvolution(nn.Module):
    """Depthwise convolution along the sequence, centred (a bidirectional encoder sees both neighbours), on
    ``(batch, length, channels)`` inputs. Its parameters have the shapes of ``nn.Conv1d(channels, channels, k,
    groups=channels)``.

    ``circular=True`` wraps around the sequence, which keeps the convolution exactly shift-equivariant on the circle
    (the FFT path, Sec. 3.2); otherwise it pads with zeros (the DCT path, and the frequency axis).
    """

    def __init__(self, channels: int, kernel_size: int, circular: bool = False):
        super().__init__()
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"short convolution kernel_size must be a positive odd number, got {kernel_size}")
        self.channels = channels
        self.kernel_size = kernel_size
        self.circular = circular
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size))
        self.bias = nn.Parameter(torch.empty(channels))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # nn.Conv1d's initialisation: a fan-in of kernel_size per channel.
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        bound = 1 / math.sqrt(self.kernel_size)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(
        self, x: torch.Tensor, wrap: bool = True, channels: slice | torch.Tensor = ALL_CHANNELS
    ) -> torch.Tensor:
        """x: (B, L, C) -> (B, L, C). ``wrap=False`` pads with zeros even when circular: a sequence shorter than the
        transform is zero-padded to it, so its circle closes over zeros. ``channels`` (a slice or an index) says which
        of the layer's channels x holds (the operator mixes long inputs a group of channels at a time)."""
        # The weights follow the input's dtype: the conditioning network runs in float32 inside bf16 models.
        weight, bias = self.weight[channels].to(x.dtype), self.bias[channels].to(x.dtype)
        return short_convolution(x, weight, bias, self.circular and wrap)

    def extra_repr(self) -> str:
        return f"channels={self.channels}, kernel_size={self.kernel_size}, circular={self.circular}"


class ShortConvolutionStack(nn.Module):
    """``depth`` short convolutions in a row (App. C.1 uses 1, and 3 for the hardest recall task). Masked positions
    are zeroed before each one, so that padding never reaches a real position."""

    def __init__(self, channels: int, kernel_size: int, depth: int, circular: bool = False):
        super().__init__()
        self.layers = nn.ModuleList(ShortConvolution(channels, kernel_size, circular) for _ in range(depth))

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, wrap: bool = True, channels: slice = ALL_CHANNELS
    ) -> torch.Tensor:
        for layer in self.layers:
            x = layer(masked(x, mask), wrap, channels)
        return masked(x, mask)


# ---------------------------------------------------------------------------------------------
# Static implicit filter h0 = FFN(PosEmb(t)) (Remark 3.2; Hyena, CKConv)
# ---------------------------------------------------------------------------------------------


class Sin(nn.Module):
    """``sin(w * x)`` with a learnable frequency per feature, as in Hyena's implicit filters."""

    def __init__(self, dim: int, frequency: float = 1.0):
        super().__init__()
        self.frequency = nn.Parameter(torch.full((dim,), float(frequency)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.frequency * x)


def kernel_lags(n: int, layout: str) -> torch.Tensor:
    """The lag of each index of a length-n kernel, as :func:`kernel_spectrum` reads it. ``"fft"``: the signed lags of
    a circular kernel, 0, 1, ..., then -n/2 ... -1. ``"dct"``: 0 .. n-1, each standing for +-m of an even kernel."""
    index = torch.arange(n, dtype=torch.float32, device="cpu")
    if layout == "dct":
        return index
    return torch.where(index <= n // 2, index, index - n)


def lag_embedding(n: int, emb_dim: int, layout: str) -> torch.Tensor:
    """PosEmb(t) of Remark 3.2: the lag over n and ``(emb_dim - 1) / 2`` sinusoid pairs, shape (n, emb_dim)."""
    t = (kernel_lags(n, layout) / max(n, 1)).unsqueeze(-1)  # in [-1/2, 1/2] (FFT layout) or [0, 1) (DCT layout)
    bands = (emb_dim - 1) // 2
    # Built on the CPU explicitly: transformers may construct the model under a meta-device context.
    frequencies = torch.linspace(1e-4, bands - 1, bands, dtype=torch.float32, device="cpu").unsqueeze(0)
    angle = 2 * math.pi * t * frequencies
    features = [t, torch.cos(angle), torch.sin(angle)]
    if 1 + 2 * bands < emb_dim:
        features.append(torch.zeros(n, emb_dim - 1 - 2 * bands, dtype=torch.float32, device="cpu"))
    return torch.cat(features, dim=-1)


class DerivedBuffers(nn.Module):
    """A module with buffers computed from its settings (:meth:`derived_buffers`): neither learned nor saved, and kept
    exact, in float32 on the module's device, through every cast. ``.to(torch.bfloat16).to(torch.float32)`` would
    otherwise leave them rounded to bfloat16 in memory while a saved and reloaded copy recomputes them exactly, and
    the two would give different outputs. Whoever reads such a buffer casts it to the dtype it computes in."""

    def derived_buffers(self) -> dict[str, torch.Tensor]:
        """Each derived buffer's name and its exact value (float32, on the CPU)."""
        raise NotImplementedError

    def reset_derived_buffers(self) -> None:
        for name, value in self.derived_buffers().items():
            setattr(self, name, value.to(getattr(self, name).device))

    def _apply(self, fn, recurse=True):
        # .to(), .half(), .cuda(), to_empty() and the like cast parameters and buffers alike: recompute these after.
        super()._apply(fn, recurse)
        self.reset_derived_buffers()
        return self


class ImplicitFilter(DerivedBuffers):
    """A static long kernel ``h0 = FFN(PosEmb(t)) * decay(t)`` over the lags of the transform (Remark 3.2), and its
    multiplier in the transform domain.

    The FFN is ``Linear -> Sin -> (Linear -> Sin) x depth -> Linear`` (Hyena's implicit filter); the exponential decay
    ``exp(-|t| * rate_c)`` spans fast to slow rates across channels, so that some channels stay local and others reach
    the whole sequence. The kernel looks both ways, as a bidirectional encoder should: under the FFT its lags are
    signed and circular, under the DCT they are 0 .. N-1 of an even kernel (:func:`kernel_lags`). ``skip`` is Hyena's
    ``D`` term, ``y += D * x``, whose multiplier is the constant D under both transforms.

    ``spectrum="listing1"`` takes ``dct(h0)`` as the multiplier under the DCT instead, as the paper's Listing 1 and
    the authors' code do, with h0 on the same lags 0 .. N-1 and its decay falling along them, as the authors lay it
    out. That is not the spectrum of a convolution with h0 (an impulse multiplies frequency k by
    ``sqrt(2/N) cos(pi k / 2N)``, ``1 / sqrt(N)`` in root mean square), but it is the parameterisation the paper's
    results were obtained with (docs/model.md).
    """

    def __init__(
        self,
        channels: int,
        length: int,
        transform: str = "dct",
        emb_dim: int = 5,
        width: int = 128,
        depth: int = 2,
        sin_frequency: float = 1.0,
        decay: bool = True,
        spectrum: str = "listing1",
        fast_decay_pct: float = 0.3,
        slow_decay_pct: float = 1.5,
        decay_target: float = 1e-2,
    ):
        super().__init__()
        self.channels = channels
        self.length = length
        self.transform = transform
        self.listing1 = transform == "dct" and spectrum == "listing1"
        self.emb_dim = emb_dim
        self.sin_frequency = sin_frequency
        self.decay = decay
        self.decay_rates = (math.log(1 / decay_target) / slow_decay_pct, math.log(1 / decay_target) / fast_decay_pct)
        layers: list[nn.Module] = [nn.Linear(emb_dim, width), Sin(width, sin_frequency)]
        for _ in range(depth):
            layers += [nn.Linear(width, width), Sin(width, sin_frequency)]
        layers.append(nn.Linear(width, channels, bias=False))
        self.ffn = nn.Sequential(*layers)
        self.skip = nn.Parameter(torch.randn(channels))
        self.register_buffer("lag_features", self.make_lag_features(), persistent=False)
        self.register_buffer("envelope", self.make_envelope(), persistent=False)

    def derived_buffers(self) -> dict[str, torch.Tensor]:
        return {"lag_features": self.make_lag_features(), "envelope": self.make_envelope()}

    def make_lag_features(self) -> torch.Tensor:
        return lag_embedding(self.length, self.emb_dim, self.transform)

    def make_envelope(self) -> torch.Tensor:
        """``exp(-|t| * rate_c)``, (length, channels); |t| is the lag over the kernel length, so the decay profile
        does not depend on max_len."""
        if not self.decay:
            return torch.ones(self.length, self.channels, dtype=torch.float32, device="cpu")
        rates = torch.linspace(*self.decay_rates, self.channels, dtype=torch.float32, device="cpu")
        lags = kernel_lags(self.length, self.transform).abs().unsqueeze(-1)
        return torch.exp(-lags / max(self.length, 1) * rates)

    def forward(self) -> torch.Tensor:
        """The kernel h0 in the time domain, (length, channels), in the filter's dtype."""
        return self.lag_response() * self.envelope.to(self.skip.dtype)

    def lag_response(self) -> torch.Tensor:
        """FFN(PosEmb(t)), (length, channels): the kernel before its decay, from one call of the FFN."""
        # The skip parameter tells the filter's dtype; the constant features follow it.
        return self.ffn(self.lag_features.to(self.skip.dtype))

    def spectrum(
        self, dtype: torch.dtype, response: torch.Tensor | None = None, channels: slice = ALL_CHANNELS
    ) -> torch.Tensor:
        """The multiplier of ``h0 * x + skip * x`` for ``channels`` in ``dtype``: (length, channels) under the DCT,
        (length // 2 + 1, channels) under the FFT. ``response`` is :meth:`lag_response` of these channels: the operator
        computes it once for all channels, and decays and transforms it a group of channels at a time."""
        response = self.lag_response()[:, channels] if response is None else response
        kernel = (response * self.envelope[:, channels].to(response.dtype)).to(dtype)
        if self.listing1:
            multiplier = dct(kernel, dim=0)
        else:
            multiplier = kernel_spectrum(kernel, self.transform, dim=0)
        return multiplier + self.skip[channels].to(dtype)

    def extra_repr(self) -> str:
        return f"channels={self.channels}, length={self.length}, transform={self.transform!r}"


# ---------------------------------------------------------------------------------------------
# Conditioning network h_theta (Sec. 3.2, Eq. 2-4)
# ---------------------------------------------------------------------------------------------


def magnitude_activation(name: str, magnitude: torch.Tensor) -> torch.Tensor:
    """sigma of Eq. 4, applied to the magnitude of a spectrum."""
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

    ``"abs"``   (Type I, Eq. 2):  ``Conv1d_freq( |T(Conv1d_time(u))| )``
    ``"xcorr"`` (Type II, Eq. 4): ``Conv1d_freq( conj(T(Conv1d_k(u))) * sigma(T(Conv1d_q(u))) )``,
    with sigma applied to the magnitude and the phase kept. Removing the phase (Type I) or cancelling it in a
    cross-correlation (Type II) makes the kernel invariant to circular shifts of u under the FFT, hence the long
    convolution shift-equivariant (Sec. 3.2, App. B); a DCT coefficient's magnitude depends on where the signal lies,
    so under the DCT the kernel moves with u. ``time_layers = 0`` or ``freq_layers = 0`` give the spectral-only and
    spatial-only ablations of App. C.2.
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
        circular = transform == "fft"
        self.time_conv = ShortConvolutionStack(channels, time_kernel_size, time_layers, circular)
        if conditioning == "xcorr":
            self.query_conv = ShortConvolutionStack(channels, time_kernel_size, time_layers, circular)
        self.freq_conv = ShortConvolutionStack(channels, freq_kernel_size, freq_layers)

    def forward(
        self, u: torch.Tensor, n: int, mask: torch.Tensor | None = None, channels: slice = ALL_CHANNELS
    ) -> torch.Tensor:
        """u: (B, L, C), mask (B, L, 1) or None; the spectrum of the kernel for transform length n >= L: (B, n, C)
        for the DCT, (B, n // 2 + 1, C) complex for the FFT. Each channel is independent: ``channels`` says which of
        the network's channels u holds."""
        wrap = u.shape[1] == n  # a shorter sequence is zero-padded to n: its circle closes over zeros
        key = forward_transform(self.time_conv(u, mask, wrap, channels), self.transform, n)
        if self.conditioning == "abs":
            return self.frequency_convolution(key.abs(), channels)
        query = forward_transform(self.query_conv(u, mask, wrap, channels), self.transform, n)
        return self.frequency_convolution(cross_spectrum(key, query, self.activation), channels)

    def frequency_convolution(self, spectrum: torch.Tensor, channels: slice = ALL_CHANNELS) -> torch.Tensor:
        """Conv1d_freq: a real convolution over frequency, on the real and imaginary parts alike of a complex
        spectrum."""
        if torch.is_complex(spectrum):
            real = self.freq_conv(spectrum.real, channels=channels)
            return torch.complex(real, self.freq_conv(spectrum.imag, channels=channels))
        return self.freq_conv(spectrum, channels=channels)


def cross_spectrum(key: torch.Tensor, query: torch.Tensor, activation: str) -> torch.Tensor:
    """``conj(key) * sigma(query)`` of Eq. 4, sigma acting on the query's magnitude and keeping its phase."""
    if activation != "identity":
        magnitude = query.abs()
        query = query * (magnitude_activation(activation, magnitude) / magnitude.clamp_min(1e-12))
    return key.conj() * query


# ---------------------------------------------------------------------------------------------
# The Orchid operator (Sec. 3.3, App. D Listing 1)
# ---------------------------------------------------------------------------------------------


@dataclass
class OperatorSettings:
    """The settings of an Orchid operator, with the defaults of the paper. ``OrchidConfig`` carries these same fields,
    and ``OrchidOperator.from_config`` passes them on.

    transform: ``"dct"`` (orthonormal DCT-II, the paper's choice) or ``"fft"`` (circular convolution).
    conditioning: ``"abs"`` (Type I, Eq. 2) or ``"xcorr"`` (Type II, Eq. 3/4).
    conditioning_activation: sigma of Eq. 4 for ``"xcorr"``: identity, sigmoid, tanh, softsign, softshrink.
    data_dependent: False keeps only the static kernel h0 (the Hyena / CKConv baseline).
    short_conv_size: kernel of the depthwise convolution after the input projection (odd).
    conditioning_time_kernel_size / conditioning_freq_kernel_size: kernels of the conditioning network's convolutions
        in time and in frequency; conditioning_time_layers / conditioning_freq_layers their depth.
    filter_emb_dim, filter_width, filter_depth, filter_sin_frequency, filter_decay: the static implicit filter
        h0 = FFN(PosEmb(t)) (Remark 3.2).
    filter_spectrum: under the DCT, ``"listing1"`` multiplies by ``dct(h0)`` as Listing 1 does; ``"convolution"`` by
        the spectrum of a symmetric convolution with h0 (docs/model.md).
    residual_long_conv: add a second static long convolution of the block input (App. C.3).
    """

    transform: str = "dct"
    conditioning: str = "abs"
    conditioning_activation: str = "identity"
    data_dependent: bool = True
    short_conv_size: int = 3
    conditioning_time_kernel_size: int = 3
    conditioning_freq_kernel_size: int = 3
    conditioning_time_layers: int = 1
    conditioning_freq_layers: int = 1
    filter_emb_dim: int = 5
    filter_width: int = 128
    filter_depth: int = 2
    filter_sin_frequency: float = 1.0
    filter_decay: bool = True
    filter_spectrum: str = "listing1"
    residual_long_conv: bool = True

    def check_settings(self, owner: str = "OrchidOperator") -> None:
        """A ValueError naming the first setting that is out of range, and its value."""
        choices = {
            "transform": TRANSFORMS,
            "conditioning": CONDITIONINGS,
            "conditioning_activation": CONDITIONING_ACTIVATIONS,
            "filter_spectrum": FILTER_SPECTRA,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{owner}.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        for name in ("data_dependent", "filter_decay", "residual_long_conv"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{owner}.{name} must be True or False, got {getattr(self, name)!r}")
        for name in ("short_conv_size", "conditioning_time_kernel_size", "conditioning_freq_kernel_size"):
            value = getattr(self, name)
            if not is_integer(value) or value < 1 or value % 2 == 0:
                raise ValueError(f"{owner}.{name} must be a positive odd integer (centred), got {value!r}")
        for name in ("filter_emb_dim", "filter_width"):
            value = getattr(self, name)
            if not is_integer(value) or value < 1:
                raise ValueError(f"{owner}.{name} must be a positive integer, got {value!r}")
        for name in ("filter_depth", "conditioning_time_layers", "conditioning_freq_layers"):
            value = getattr(self, name)
            if not is_integer(value) or value < 0:
                raise ValueError(f"{owner}.{name} must be a non-negative integer, got {value!r}")
        frequency = self.filter_sin_frequency
        if not isinstance(frequency, (int, float)) or isinstance(frequency, bool) or not math.isfinite(frequency):
            raise ValueError(f"{owner}.filter_sin_frequency must be a finite number, got {frequency!r}")
        if self.data_dependent and self.conditioning_time_layers + self.conditioning_freq_layers == 0:
            raise ValueError(
                f"{owner}.conditioning_time_layers and conditioning_freq_layers are both 0; the conditioning network "
                "needs at least one convolution (or set data_dependent=False)"
            )


def is_integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class OrchidOperator(nn.Module):
    """The Orchid sequence mixer: ``y = out_proj( s2 * (h * (s1 * v)) [+ h_res * x] )`` with ``h = h0 + h_theta(v)``.

    1. ``in_proj`` maps d -> 3d, a centred depthwise short convolution follows, and the result splits into the gates
       s1, s2 and the value v (the chain of order 1.5 of Sec. 3.3).
    2. The kernel is the static implicit filter h0 (Remark 3.2) plus the data-dependent kernel h_theta(v) (Eq. 2, or
       Eq. 3/4), or h_theta(u) of another sequence u (Remark 3.3). The conditioning network reads v before the short
       convolution, as Listing 1 does.
    3. The long convolution runs in the transform domain in O(N log N): the orthonormal DCT-II (the paper's choice) or
       the real FFT (exact circular convolution).
    4. A residual long convolution of the block input with a second static filter (App. C.3, from M2-BERT).

    The transform length N is ``max_len`` whatever the input length: shorter inputs are zero-padded, and positions
    where ``attention_mask`` is 0 are set to zero before every sequence-mixing step, so that a sequence's output does
    not depend on the padding of its batch. Rows padded on the left are moved to the front and back
    (:func:`front_packing_order`). Transforms run in float32 at least, also under autocast and in bf16 models:
    ``torch.fft`` has no bfloat16.
    """

    def __init__(self, d_model: int, max_len: int, bias: bool = True, **settings):
        super().__init__()
        if not is_integer(d_model) or d_model < 1:
            raise ValueError(f"OrchidOperator.d_model must be a positive integer, got {d_model!r}")
        if not is_integer(max_len) or max_len < 1:
            raise ValueError(f"OrchidOperator.max_len must be a positive integer, got {max_len!r}")
        names = [field.name for field in fields(OperatorSettings)]
        unknown = sorted(set(settings) - set(names))
        if unknown:
            closest = difflib.get_close_matches(unknown[0], names, n=1, cutoff=0.8)
            hint = f"; did you mean {closest[0]!r}?" if closest else f"; the settings are {names}"
            raise ValueError(f"OrchidOperator got unknown settings {unknown}{hint}")
        self.settings = OperatorSettings(**settings)
        self.settings.check_settings()
        s = self.settings
        if s.short_conv_size > max_len:
            raise ValueError(f"OrchidOperator.short_conv_size={s.short_conv_size} is longer than max_len={max_len}")
        self.d_model = d_model
        self.max_len = max_len
        self.transform = s.transform

        self.in_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.short_conv = ShortConvolution(3 * d_model, s.short_conv_size, circular=s.transform == "fft")
        filter_settings = dict(
            transform=s.transform,
            emb_dim=s.filter_emb_dim,
            width=s.filter_width,
            depth=s.filter_depth,
            sin_frequency=s.filter_sin_frequency,
            decay=s.filter_decay,
            spectrum=s.filter_spectrum,
        )
        self.static_filter = ImplicitFilter(d_model, max_len, **filter_settings)
        self.conditioning = None
        if s.data_dependent:
            self.conditioning = ConditioningNetwork(
                d_model,
                s.transform,
                s.conditioning,
                s.conditioning_activation,
                s.conditioning_time_kernel_size,
                s.conditioning_freq_kernel_size,
                s.conditioning_time_layers,
                s.conditioning_freq_layers,
            )
        self.residual_filter = ImplicitFilter(d_model, max_len, **filter_settings) if s.residual_long_conv else None
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    @classmethod
    def from_config(cls, config) -> OrchidOperator:
        """The sequence mixer of one layer of a model: width ``hidden_size``, transform length
        ``config.max_sequence_length``, and the config's operator settings (the fields of :class:`OperatorSettings`)."""
        settings = {field.name: getattr(config, field.name) for field in fields(OperatorSettings)}
        return cls(config.hidden_size, config.max_sequence_length, **settings)

    def forward(
        self,
        x: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        conditioning_input: torch.Tensor | None = None,
        conditioning_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x: (B, L, d), 1 <= L <= max_len; attention_mask: (B, L), 1 for real tokens and 0 for padding; returns
        (B, L, d).

        ``conditioning_input`` u (B, L_u, d), L_u <= max_len, makes the kernel h_theta(u) instead of h_theta(v)
        (Remark 3.3); ``conditioning_mask`` (B, L_u) marks its real positions.
        """
        self._check_inputs(x, attention_mask, conditioning_input, conditioning_mask)
        order = front_packing_order(attention_mask)
        if order is not None:
            x, attention_mask = gather_rows(x, order), gather_rows(attention_mask, order)
        y = self._mix(x, attention_mask, conditioning_input, conditioning_mask)
        return y if order is None else scatter_rows(y, order)

    def _mix(
        self,
        x: torch.Tensor,
        attention_mask: torch.Tensor | None,
        conditioning_input: torch.Tensor | None,
        conditioning_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        n, d = self.max_len, self.d_model
        mask = None if attention_mask is None else attention_mask.bool().unsqueeze(-1)  # (B, L, 1)
        # Transforms in float32 at least: torch.fft has no bfloat16, and float16 only for powers of two on CUDA.
        compute_dtype = torch.promote_types(x.dtype, torch.float32)
        # Padded positions are cleared first: a NaN there would otherwise reach the weights' gradients through in_proj.
        x = masked(x, mask)
        projected = masked(self.in_proj(x), mask)
        # A sequence shorter than the transform is zero-padded to it: its circle closes over zeros.
        wrap = x.shape[1] == n
        if self.conditioning is not None:
            if conditioning_input is None:
                # h_theta reads v before the short convolution (Listing 1).
                source, source_mask = projected[..., 2 * d :], mask
            else:
                source, source_mask = self._project_value(conditioning_input, conditioning_mask)
        with torch.autocast(device_type=x.device.type, enabled=False):
            static = self.static_filter.lag_response()
            residual = None if self.residual_filter is None else self.residual_filter.lag_response()
        # From here on every step acts on each channel alone. Without autograd, long inputs run a group of channels at
        # a time (see channel_groups). Under autograd every group's intermediates are kept for backward anyway, so
        # groups would save no memory, only add copies (each group's gates) and, in backward, the joining of the
        # groups' gradients: all channels go at once. Both ways give the same results.
        groups = [ALL_CHANNELS] if torch.is_grad_enabled() else channel_groups(d, x.shape[0] * n)
        pieces = {"x": x, "gates": projected.unflatten(-1, (3, d)), "static": static, "residual": residual}
        if self.conditioning is not None:
            pieces["source"] = source
        if len(groups) == 1:
            pieces = {name: (tensor,) for name, tensor in pieces.items() if tensor is not None}
        else:
            # Split at once: the backward of one split joins the groups' gradients in one pass.
            sizes = [len(range(d)[channels]) for channels in groups]
            pieces = {name: tensor.split(sizes, dim=-1) for name, tensor in pieces.items() if tensor is not None}
        outputs = []
        for index, channels in enumerate(groups):
            group = {name: split[index] for name, split in pieces.items()}
            # s1, s2 and v of these channels, through the short convolution.
            gated = self.short_conv(group["gates"].flatten(-2), wrap, gate_channels(channels, d, x.device))
            s1, s2, v = gated.chunk(3, dim=-1)
            with torch.autocast(device_type=x.device.type, enabled=False):
                # The kernel h = h0 + h_theta in the transform domain (Remark 3.2).
                kernel = self.static_filter.spectrum(compute_dtype, group["static"], channels)
                if self.conditioning is not None:
                    kernel = kernel + self.conditioning(group["source"].to(compute_dtype), n, source_mask, channels)
                # y = s2 * (h * (s1 * v)), the chain of order 1.5 (Sec. 3.3).
                y = recomputed_in_backward(
                    gated_long_convolution, s1, v, s2, kernel, mask, self.transform, n, compute_dtype
                )
                if residual is not None:
                    multiplier = self.residual_filter.spectrum(compute_dtype, group["residual"], channels)
                    block_input = group["x"].to(compute_dtype)
                    y = y + recomputed_in_backward(long_convolution, block_input, multiplier, self.transform, n)
                outputs.append(masked(y, mask).to(x.dtype))
        return self.out_proj(outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-1))

    def _project_value(
        self, conditioning_input: torch.Tensor, conditioning_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The cross-conditioning sequence u projected like v (Remark 3.3), zero-padded to the transform length,
        which Remark 3.3 reads as interpolation in frequency; and its mask (B, L_u, 1)."""
        order = front_packing_order(conditioning_mask)
        if order is not None:
            conditioning_input = gather_rows(conditioning_input, order)
            conditioning_mask = gather_rows(conditioning_mask, order)
        mask = None if conditioning_mask is None else conditioning_mask.bool().unsqueeze(-1)
        # The in_proj module is called whole, so that its hooks and adapters act here as well; v is its last third.
        return masked(self.in_proj(conditioning_input)[..., 2 * self.d_model :], mask), mask

    def _check_inputs(
        self,
        x: torch.Tensor,
        attention_mask: torch.Tensor | None,
        conditioning_input: torch.Tensor | None,
        conditioning_mask: torch.Tensor | None,
    ) -> None:
        """A ValueError unless the arguments of :meth:`forward` fit this operator and each other."""
        batch, _ = self._check_input("x", x, attention_mask)
        if conditioning_input is not None:
            if self.conditioning is None:
                raise ValueError("conditioning_input needs the data-dependent kernel (data_dependent=True)")
            conditioning_batch, _ = self._check_input("conditioning_input", conditioning_input, conditioning_mask)
            if conditioning_batch != batch:
                raise ValueError(f"conditioning_input has batch size {conditioning_batch}, x has {batch}")

    def _check_input(self, name: str, x: torch.Tensor, mask: torch.Tensor | None) -> tuple[int, int]:
        if x.dim() != 3:
            raise ValueError(f"{name} must have shape (batch, length, {self.d_model}), got {tuple(x.shape)}")
        batch, length, features = x.shape
        if features != self.d_model:
            raise ValueError(f"{name} has {features} features but the operator has d_model={self.d_model}")
        if batch == 0:
            raise ValueError(f"{name} has batch size 0")
        if length == 0:
            raise ValueError(f"{name} is an empty sequence (length 0); the operator needs 1 <= length <= max_len")
        if length > self.max_len:
            raise ValueError(f"{name} has length {length} > max_len={self.max_len}")
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {x.dtype}")
        if mask is not None:
            check_attention_mask(mask, (batch, length), f"attention mask for {name}")
        return batch, length

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, max_len={self.max_len}, transform={self.transform!r}"


# ---------------------------------------------------------------------------------------------
# Block-diagonal linear layer (Monarch of order 1; Dao et al. 2022)
# ---------------------------------------------------------------------------------------------


class BlockDiagonalLinear(nn.Module):
    """``y = blockdiag(W_1, ..., W_b) x + bias``: b independent dense maps on equal slices of the features, each an
    ``nn.Linear`` (``blocks[i]``), so that hooks, peft LoRA, dynamic quantisation and pruning act on every block.

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
        self.blocks = nn.ModuleList(
            nn.Linear(in_features // num_blocks, out_features // num_blocks, bias=bias) for _ in range(num_blocks)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"expected {self.in_features} input features, got {x.shape[-1]}")
        # Flat (tokens, features): each block then reads its slice of the features in place, with its bias added by
        # the GEMM (a 2-D input takes nn.Linear's fused addmm). The outputs are joined by stacking them on a new axis,
        # which torch copies several times faster than a concatenation along the last axis of 2-D tensors.
        pieces = x.reshape(-1, self.in_features).chunk(self.num_blocks, dim=-1)
        out = torch.stack([block(piece) for block, piece in zip(self.blocks, pieces)], dim=-2)
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, num_blocks={self.num_blocks}"


class GatedActivation(torch.autograd.Function):
    """The GLU of M2-BERT's MLP, ``act(gate) * value`` with ``gate, value = hidden.chunk(2, -1)``, saving only
    ``hidden`` for backward.

    Written out by autograd, the GLU saves ``act(gate)`` as well (half the size of ``hidden``), and the gradients of
    the two halves are joined by a concatenation in backward. Here the backward recomputes ``act(gate)``, which costs
    one elementwise pass, and writes both halves of the gradient into one tensor. The results equal the written-out
    GLU's, gradients included; double backward works (a ``create_graph`` backward is differentiable).

    ``act`` is the MLP's activation module; it is called as a module in forward, so its hooks fire once per call, and
    its ``forward`` is called directly when backward recomputes it.
    """

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, act: nn.Module) -> torch.Tensor:
        ctx.act = act
        ctx.save_for_backward(hidden)
        gate, value = hidden.chunk(2, dim=-1)
        return act(gate) * value

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (hidden,) = ctx.saved_tensors
        gate, value = hidden.chunk(2, dim=-1)
        if torch.is_grad_enabled():  # backward(create_graph=True): build the gradient from differentiable steps
            activated = ctx.act.forward(gate)
            (grad_gate,) = torch.autograd.grad(activated, gate, grad * value, create_graph=True)
            return torch.cat([grad_gate, grad * activated], dim=-1), None
        with torch.enable_grad():
            leaf = gate.detach().requires_grad_(True)
            activated = ctx.act.forward(leaf)
        grad_hidden = torch.empty_like(hidden, memory_format=torch.contiguous_format)
        grad_gate, grad_value = grad_hidden.chunk(2, dim=-1)
        torch.mul(grad, activated.detach(), out=grad_value)
        (local,) = torch.autograd.grad(activated, leaf, grad * value)
        grad_gate.copy_(local)
        return grad_hidden, None
