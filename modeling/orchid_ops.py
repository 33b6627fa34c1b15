"""The operations of the Orchid layer, each a function of tensors: the transforms (DCT and FFT), the long and short
convolutions, and masks and the order of padded rows. ``modeling/orchid_layers.py`` builds the modules of the paper
from these.

Each fast operation has a plain reference beside it, named ``*_ref``, written the way the paper defines it (matrix
transforms, direct sums over lags); the tests compare the two. The references are slow and are never called by the
model.

This file depends only on torch and the standard library (SciPy, when installed, computes the DCT on the CPU), so
that it ships to the Hub as remote code.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

try:  # optional: the DCT on the CPU, see `dct`
    import scipy.fft as scipy_fft
except ImportError:
    scipy_fft = None

# ---------------------------------------------------------------------------------------------
# Transforms (App. C.2): the orthonormal DCT-II and the real FFT
# ---------------------------------------------------------------------------------------------


# Up to this transform length the DCT is a product with its matrix: one GEMM does a short transform's few
# multiply-adds faster than an FFT library's work per call (docs/performance.md, "Small inputs").
MATRIX_DCT_MAX_LENGTH = 128


def dct(x: torch.Tensor, dim: int = -1, n: int | None = None) -> torch.Tensor:
    """Orthonormal DCT-II along ``dim`` of ``x`` zero-padded to length ``n`` (default: its own length); equal to
    ``scipy.fft.dct(x, n=n, axis=dim, norm="ortho")``.

    Up to ``MATRIX_DCT_MAX_LENGTH`` it is a product with the DCT matrix. Longer, on the CPU (float32 or float64,
    eager) it runs through pocketfft, SciPy's FFT library, which computes the DCT natively; elsewhere, and without
    SciPy, through one real FFT of the same length (Makhoul, 1980), written for an exported graph in real arithmetic
    (:func:`_dct_in_graph`).
    """
    dim = dim % x.dim()
    n = x.shape[dim] if n is None else n
    if n < x.shape[dim]:
        raise ValueError(f"dct: n={n} is shorter than the input ({x.shape[dim]} samples along dim {dim})")
    if n <= MATRIX_DCT_MAX_LENGTH:
        matrix = transform_matrix(n, x.shape[dim], x.dtype, x.device)  # (n, L)
        return torch.matmul(matrix, x.movedim(dim, -2)).movedim(-2, dim)
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
    if x.shape[dim] <= MATRIX_DCT_MAX_LENGTH:
        matrix = transform_matrix(x.shape[dim], length, x.dtype, x.device).transpose(0, 1)
        return torch.matmul(matrix, x.movedim(dim, -2)).movedim(-2, dim)
    if uses_pocketfft(x):
        return PocketfftTransform.apply(x, dim, length, True)
    if is_exporting():
        return _idct_in_graph(x, dim, length)
    return _idct_by_fft(x.movedim(dim, -1)).movedim(-1, dim).narrow(dim, 0, length)


_TRANSFORM_MATRICES: dict[tuple, torch.Tensor] = {}


def transform_matrix(n: int, columns: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The first ``columns`` columns of the orthonormal DCT-II matrix of size n (:func:`dct_matrix`), computed in
    float64 and cast to ``dtype``: kept once per (n, dtype, device) in eager runs; under ``torch.compile`` and
    ``torch.export`` computed in the graph, at the (maybe symbolic) number of columns, since a cut of the whole
    matrix (a view) would tie an exported graph to one side of columns < n."""
    if torch.compiler.is_compiling():
        return dct_matrix(n, torch.float64, device, columns).to(dtype)
    key = (n, dtype, torch.device(device))
    if key not in _TRANSFORM_MATRICES:
        # Made outside inference mode, where the first call may come from: an inference tensor could not be used
        # by a later call that records autograd.
        with torch.inference_mode(False):
            _TRANSFORM_MATRICES[key] = dct_matrix(n, torch.float64, device).to(dtype)
    return _TRANSFORM_MATRICES[key].narrow(1, 0, columns)


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


# torch.jit.trace (and the ONNX exporter's legacy mode, dynamo=False, which runs it) records what Python reads of a
# tensor as constants: the rows' lengths and the padding layout of the one batch it traces, which would then be
# applied to every other batch. The dynamo-based tracers keep them as tensors or symbols.
JIT_TRACE_REFUSED = (
    "torch.jit.trace (also torch.onnx.export(..., dynamo=False)) would record the padding layout and the rows' "
    "lengths of the traced batch as constants and give wrong outputs for other masks and lengths; use "
    "torch.export.export, torch.onnx.export(..., dynamo=True) (orchid_hf.onnx.export_onnx) or torch.compile"
)


def refuse_jit_trace() -> None:
    """A ValueError (:data:`JIT_TRACE_REFUSED`) when called under ``torch.jit.trace``."""
    if torch.jit.is_tracing():
        raise ValueError(JIT_TRACE_REFUSED)


def is_traced() -> bool:
    """Whether the call is being compiled, exported or traced into a graph, where shapes may be symbolic and a branch
    on one would tie the graph to one side of it."""
    return torch.compiler.is_compiling() or is_exporting() or torch.jit.is_tracing()


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
    return gated_convolution(s1, v, s2, lambda u: long_convolution(u, multiplier, transform, n), mask, dtype)


def gated_convolution(
    s1: torch.Tensor,
    v: torch.Tensor,
    s2: torch.Tensor,
    convolve: Callable[[torch.Tensor], torch.Tensor],
    mask: torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """``s2 * convolve(s1 * v)``, the chain of order 1.5 of Sec. 3.3 for any long convolution ``convolve`` (along the
    sequence, or over a grid), with ``s1 * v`` in ``dtype`` and cleared where ``mask`` is False."""
    u = masked((s1 * v).to(dtype), mask)
    return convolve(u) * s2


# ---------------------------------------------------------------------------------------------
# Two dimensions: the transforms and the long convolution over a grid of patches
# ---------------------------------------------------------------------------------------------
# A grid is held as (B, rows, columns, C), channels last, its axes 1 and 2. Every 2-D transform is separable: the 1-D
# transform along each axis (the DCT of `dct`, or the real FFT along the columns and the complex FFT along the rows,
# torch.fft.rfftn), so a convolution over the whole grid costs O(HW log HW) whatever the kernel's extent (the FFT
# papers' 2-D convolution). The grid is mixed at its own size: images are all the same size, nothing is padded.

GRID_AXES = (1, 2)


def forward_transform_2d(x: torch.Tensor, transform: str) -> torch.Tensor:
    """The orthonormal transform T of App. C.2 over the grid of x (B, H, W, C): the 2-D DCT-II (real, (B, H, W, C)),
    equal to ``scipy.fft.dctn(x, axes=(1, 2), norm="ortho")``, or the 2-D real FFT (complex, (B, H, W // 2 + 1, C)),
    equal to ``numpy.fft.rfftn(x, axes=(1, 2), norm="ortho")``."""
    if transform == "dct":
        return dct(dct(x, GRID_AXES[0]), GRID_AXES[1])
    return torch.fft.rfftn(x, dim=GRID_AXES, norm="ortho")


def kernel_spectrum_2d(kernel: torch.Tensor, transform: str) -> torch.Tensor:
    """The multiplier that makes :func:`long_convolution_2d` convolve with ``kernel`` (H, W, C): :func:`kernel_spectrum`
    along each axis. ``"fft"``: the unnormalised 2-D real FFT, index (m, n) the lag (m mod H, n mod W) of a circular
    convolution on the torus. ``"dct"``: the cosine transform of the kernel's even extension along both axes, index
    (m, n) the lags (+-m, +-n) of a symmetric convolution (mirror images in both axes)."""
    if transform == "fft":
        return torch.fft.rfftn(kernel, dim=(0, 1))
    return kernel_spectrum(kernel_spectrum(kernel, "dct", dim=0), "dct", dim=1)


def long_convolution_2d(x: torch.Tensor, multiplier: torch.Tensor, transform: str) -> torch.Tensor:
    """:func:`long_convolution` over the grid of x (B, H, W, C), the transform of each axis in turn:
    ``T^-1(T(x) * H)`` with ``multiplier`` H (H, W, C) or (B, H, W, C) from :func:`kernel_spectrum_2d` (or
    H, W // 2 + 1 under the FFT).

    ``"fft"``: exactly the circular convolution on the torus, ``y[t, u] = sum_{s, v} h[(t - s) mod H, (u - v) mod W]
    x[s, v]``. ``"dct"``: the symmetric convolution of x extended by its mirror images along both axes."""
    if transform == "dct":
        rows, columns = GRID_AXES
        return idct(idct(dct(dct(x, rows), columns) * multiplier, columns), rows)
    return torch.fft.irfftn(torch.fft.rfftn(x, dim=GRID_AXES) * multiplier, s=x.shape[1:3], dim=GRID_AXES)


# Without autograd, the operator mixes a long input a block of channels at a time: every step between its projections
# acts on each channel alone, and a block whose (tokens, channels) tensors hold about this many numbers (2 MiB in
# float32) stays in the CPU's caches, where the whole width's tensors do not (`scripts/benchmark.py --profile 1x4096`
# shows the transforms, products and short convolutions gaining). Under autograd, blocks would only add copies.
CHANNEL_BLOCK_ELEMENTS = 2**19
MIN_CHANNEL_BLOCK = 32
ALL_CHANNELS = slice(None)


def of_channels(x: torch.Tensor, channels: slice | torch.Tensor, dim: int = -1) -> torch.Tensor:
    """x's ``channels`` (a slice or an index) along ``dim``; x itself for ``ALL_CHANNELS``, without an indexing op
    (an exported graph has no translation of one on a complex tensor)."""
    return x if channels is ALL_CHANNELS else x[(slice(None),) * (dim % x.dim()) + (channels,)]


def channel_blocks(channels: int, tokens: int) -> list[slice]:
    """Consecutive ranges of ``channels`` for ``tokens`` positions per channel, each of about
    ``CHANNEL_BLOCK_ELEMENTS`` numbers and at least ``MIN_CHANNEL_BLOCK`` channels; one range of all channels where
    that would make fewer than four blocks, which would gain little."""
    width = max(CHANNEL_BLOCK_ELEMENTS // tokens // MIN_CHANNEL_BLOCK * MIN_CHANNEL_BLOCK, MIN_CHANNEL_BLOCK)
    if 4 * width > channels:
        return [ALL_CHANNELS]
    return [slice(start, min(start + width, channels)) for start in range(0, channels, width)]


# ---------------------------------------------------------------------------------------------
# Masks and the order of padded rows
# ---------------------------------------------------------------------------------------------


def masked(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """x with the positions where ``mask`` (B, L, 1, bool) is False set to zero. A selection, not a product, so that
    NaN or inf at padded positions never reaches a real one (0 * NaN is NaN)."""
    return x if mask is None else x.masked_fill(~mask, 0.0)


def packing_order(real: torch.Tensor) -> torch.Tensor:
    """For each row of the boolean mask ``real`` (B, L), the positions of its real tokens in order followed by those
    of its padding, (B, L): ``gather_rows(x, order)`` puts every row's real tokens first.

    Each position's place in that order comes from running counts of real and padded positions, and the order is its
    inverse, written by one scatter: a sort would do the same, but its stable form has no ONNX translation."""
    real = real.bool()
    count = real.sum(dim=1, keepdim=True)
    place = torch.where(real, real.cumsum(dim=1) - 1, count + (~real).cumsum(dim=1) - 1)
    positions = torch.arange(real.shape[1], device=real.device).expand_as(place)
    return torch.empty_like(place).scatter_(1, place, positions)


def transform_length(length: int, lengths: tuple[int, ...]) -> int:
    """The transform length of a sequence of ``length`` real tokens: the shortest of ``lengths`` (ascending) that holds
    it."""
    return next((n for n in lengths if n >= length), lengths[-1])


@dataclass(frozen=True)
class RowGroup:
    """Rows of a batch mixed together at one transform length ``n``: ``rows`` (an index, or None for every row),
    cropped to their first ``length`` positions, which hold all their real tokens. ``select`` (B,), where given, marks
    the rows whose result this group gives: traced, every group runs on every row (see :class:`SequenceLayout`)."""

    n: int
    length: int
    rows: torch.Tensor | None = None
    select: torch.Tensor | None = None

    def take(self, x: torch.Tensor | None) -> torch.Tensor | None:
        """This group's part of x (B, L, ...): its rows, cropped to ``length`` positions (or fewer, where x has)."""
        if x is None:
            return None
        return (x if self.rows is None else x.index_select(0, self.rows))[:, : self.length]


@dataclass(frozen=True)
class SequenceLayout:
    """Where the real tokens of a padded batch are, and at which transform length each row is mixed: computed once per
    call from the attention mask (by ``OrchidModel`` for all its layers, or by an ``OrchidOperator`` called on its
    own).

    Orchid mixes each sequence through a transform from position 0, so the same tokens give the same outputs only if
    they start at position 0: rows padded on the left (or with holes) are gathered into ``order`` before mixing and
    scattered back after. ``mask`` (B, L, 1, bool) marks the real positions in that order.

    Each row is mixed at the shortest of the model's transform lengths that holds its real tokens, so that its cost
    follows its own length, and its output does not depend on the rest of the batch. ``groups`` are the rows of each
    transform length (:class:`RowGroup`). Eager, they are read from the mask's row lengths on the host, and each
    group is cropped to its longest row. Under ``torch.compile`` and ``torch.export``, where a graph cannot depend on
    values, every transform length up to the one that holds the padded length runs on every row, and each row takes
    the result of its own (about twice the work of the longest, in one graph); the rows are first zero-padded to
    ``padded_length``, so that every shape inside is fixed whatever the input's length. A row's real tokens give the
    same outputs either way: beyond them everything is zero."""

    mask: torch.Tensor | None = None
    order: torch.Tensor | None = None
    groups: tuple[RowGroup, ...] = ()
    padded_length: int | None = None

    @classmethod
    def from_mask(
        cls, attention_mask: torch.Tensor | None, lengths: tuple[int, ...], length: int | None = None
    ) -> SequenceLayout:
        """The layout of a batch of ``length`` positions whose ``attention_mask`` (B, L) holds only 0 and 1 (checked
        by the caller), for the transform lengths ``lengths`` (ascending). Eager, this reads values on the host once:
        each row's count of real tokens, and whether every row's real tokens come first (then ``order`` is None);
        compiled, the order is always taken (the identity for right padding)."""
        if attention_mask is None:
            if torch.compiler.is_compiling():
                return cls(None, None, *traced_groups(None, length, lengths))
            return cls(groups=(RowGroup(transform_length(length, lengths), length),))
        real = attention_mask.bool()
        length = real.shape[1]
        counts = real.sum(dim=1)
        if torch.compiler.is_compiling():
            order = packing_order(real)
            return cls(gather_rows(real, order).unsqueeze(-1), order, *traced_groups(counts, length, lengths))
        packed = (real[:, 1:] <= real[:, :-1]).all(dim=1)
        values = torch.cat([counts, packed.all().unsqueeze(0).long()]).tolist()  # the one read on the host
        counts_list, in_order = values[:-1], bool(values[-1])
        order = None if in_order else packing_order(real)
        mask = real.unsqueeze(-1) if order is None else gather_rows(real, order).unsqueeze(-1)
        return cls(mask, order, eager_groups(counts_list, length, lengths, real.device))

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, L, ...) with each row's real tokens first."""
        return x if self.order is None else gather_rows(x, self.order)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`pack`: x back in the caller's order."""
        return x if self.order is None else scatter_rows(x, self.order)


def eager_groups(counts: list[int], length: int, lengths: tuple[int, ...], device) -> tuple[RowGroup, ...]:
    """The rows of each transform length, from every row's count of real tokens: one group of all rows (no index)
    where they share one."""
    rungs = [transform_length(max(count, 1), lengths) for count in counts]
    groups = []
    for n in sorted(set(rungs)):
        members = [row for row, rung in enumerate(rungs) if rung == n]
        crop = min(max(max(counts[row] for row in members), 1), length)
        rows = None if len(members) == len(rungs) else torch.tensor(members, device=device)
        groups.append(RowGroup(n, crop, rows))
    return tuple(groups)


def traced_groups(counts: torch.Tensor | None, length, lengths: tuple[int, ...]) -> tuple[tuple[RowGroup, ...], int]:
    """Every transform length that a row of ``length`` positions may need, each over every row cropped or padded to
    it, selecting the rows whose own it is; and the length the rows are padded to first. With a length known when
    tracing, the lengths beyond the one that holds it are left out; with a symbolic one (a dynamic axis of an
    export), all of them run. ``counts``: each row's real tokens (None: every position is real)."""
    if isinstance(length, int):
        lengths = tuple(n for n in lengths if n <= transform_length(length, lengths))
    if counts is None or len(lengths) == 1:
        # One transform length holds every row; without a mask, each row is as long as the input.
        if len(lengths) == 1 or isinstance(length, int):
            return (RowGroup(lengths[-1], lengths[-1]),), lengths[-1]
        counts = torch.full((1,), length)
    bounds = torch.tensor(lengths, device=counts.device)
    # The first length that holds each row: the count of shorter ones (searchsorted, which has no ONNX translation).
    rung = bounds[(counts.clamp_min(1).unsqueeze(-1) > bounds).sum(-1).clamp_max(len(lengths) - 1)]
    return tuple(RowGroup(n, n, select=rung == n) for n in lengths), lengths[-1]


def gather_rows(x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """``x[b, order[b]]`` for each row b of x (B, L, ...)."""
    index = order.view(*order.shape, *([1] * (x.dim() - 2))).expand(*order.shape, *x.shape[2:])
    return torch.gather(x, 1, index)


def scatter_rows(x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`gather_rows`: ``out[b, order[b]] = x[b]``."""
    index = order.view(*order.shape, *([1] * (x.dim() - 2))).expand(*order.shape, *x.shape[2:])
    return torch.empty_like(x).scatter_(1, index, x)



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


def short_convolution(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, wrap: bool | torch.Tensor
) -> torch.Tensor:
    """The centred depthwise convolution of :class:`ShortConvolution`: around the circle where ``wrap`` (and the
    sequence is at least as long as the kernel's reach), else over zeros. ``wrap`` is one bool for all rows, or a
    (B,) bool tensor, a value per row (:func:`fills_transform`)."""
    pad = weight.shape[-1] // 2
    if pad == 0 or wrap is False:
        return depthwise_convolution(x, weight, bias, pad)
    if isinstance(wrap, torch.SymBool):  # traced with a dynamic length: a tensor, so that both sides are kept
        wrap = torch.full((1,), torch.sym_ite(wrap, 1, 0), dtype=torch.bool, device=x.device)
    if wrap is True:
        if pad > x.shape[1]:
            return depthwise_convolution(x, weight, bias, pad)
        return depthwise_convolution(torch.cat([x[:, x.shape[1] - pad :], x, x[:, :pad]], dim=1), weight, bias)
    return depthwise_convolution(circular_padding(x, pad, wrap), weight, bias)


def circular_padding(x: torch.Tensor, pad: int, wrap: torch.Tensor) -> torch.Tensor:
    """x (B, L, C) with ``pad`` samples added at either end of L: for the rows where ``wrap`` (B,) holds and
    ``pad <= L``, those of the other end (the circular branch of :func:`short_convolution`); zeros otherwise. Both
    ends are computed for every row and selected by tensor ops, so that a traced graph with a dynamic length keeps
    both sides of ``pad <= L``."""
    length = x.shape[1]
    select = wrap.view(-1, 1, 1) & (torch.full((), length, device=x.device) >= pad)
    tail = F.pad(x, [0, 0, pad, 0])[:, length:]  # the last pad samples (zeros first where L < pad)
    head = F.pad(x, [0, 0, 0, pad])[:, :pad]
    zero = x.new_zeros(())
    return torch.cat([torch.where(select, tail, zero), x, torch.where(select, head, zero)], dim=1)


def fills_transform(mask: torch.Tensor | None, n: int, length: int) -> bool | torch.Tensor:
    """Whether each row fills its transform length n, and so closes a circle of its own: with ``mask`` (B, L, 1)
    marking real positions, a (B,) bool tensor; without, every row is ``length`` long, one bool. A row shorter than n
    is zero-padded to it, and its circle closes over zeros: a short convolution must not wrap it onto its own end."""
    if mask is None:
        return length == n
    return mask.view(mask.shape[0], -1).sum(dim=1) == n


def short_convolution_2d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, wrap: bool) -> torch.Tensor:
    """The centred depthwise k x k convolution of :class:`ShortConvolution2d` over the grid of x (B, H, W, C), each
    channel with its own kernel (weight (C, 1, k, k), bias (C)): around the torus where ``wrap``, else over zeros. A
    2-D convolution on a channels-last view of x, as :func:`depthwise_convolution` runs the 1-D one."""
    pad = weight.shape[-1] // 2
    image = x.permute(0, 3, 1, 2)  # (B, C, H, W): a channels-last view, no copy
    if wrap and pad > 0:
        image = F.pad(image, (pad, pad, pad, pad), mode="circular")
        pad = 0
    return F.conv2d(image, weight, bias, padding=pad, groups=weight.shape[0]).permute(0, 2, 3, 1)


# ---------------------------------------------------------------------------------------------
# References: each fast operation above as the paper defines it (slow; for the tests)
# ---------------------------------------------------------------------------------------------


def dct_matrix(n: int, dtype: torch.dtype = torch.float64, device=None, columns: int | None = None) -> torch.Tensor:
    """The orthonormal DCT-II matrix C (n, n), or its first ``columns`` columns: ``C[k, t] = sqrt(2 / n)
    cos(pi (2t + 1) k / 2n)``, row 0 over sqrt 2."""
    k = torch.arange(n, dtype=dtype, device=device).unsqueeze(1)
    t = torch.arange(n if columns is None else columns, dtype=dtype, device=device).unsqueeze(0)
    scale = math.sqrt(2.0 / n) * (1.0 - (1.0 - math.sqrt(0.5)) * (k == 0).to(dtype))  # row 0: sqrt(1 / n)
    return scale * torch.cos(math.pi * (2 * t + 1) * k / (2 * n))


def dct_ref(x: torch.Tensor, dim: int = -1, n: int | None = None) -> torch.Tensor:
    """:func:`dct` as a matrix product with x zero-padded to n."""
    n = x.shape[dim] if n is None else n
    matrix = dct_matrix(n, x.dtype, x.device)[:, : x.shape[dim]]
    return torch.movedim(torch.tensordot(x, matrix, dims=([dim], [1])), -1, dim)


def idct_ref(x: torch.Tensor, dim: int = -1, length: int | None = None) -> torch.Tensor:
    """:func:`idct` as a product with the transposed matrix (the inverse of an orthonormal one), cut to length."""
    length = x.shape[dim] if length is None else length
    matrix = dct_matrix(x.shape[dim], x.dtype, x.device)[:, :length]
    return torch.movedim(torch.tensordot(x, matrix, dims=([dim], [0])), -1, dim)


def long_convolution_ref(x: torch.Tensor, multiplier: torch.Tensor, transform: str, n: int) -> torch.Tensor:
    """:func:`long_convolution` along axis 1 from its definition: under the DCT ``C^T diag(H) C x`` with matrices;
    under the FFT the circular convolution ``y[t] = sum_s h[(t - s) mod n] x[s]`` with ``h`` the kernel whose real
    FFT is H, as a direct sum over lags."""
    length = x.shape[1]
    if transform == "dct":
        return idct_ref(dct_ref(x, 1, n) * multiplier, 1, length)
    kernel = torch.fft.irfft(multiplier, n=n, dim=-2)  # (..., n, channels)
    t = torch.arange(length, device=x.device)
    lags = (t.unsqueeze(1) - t.unsqueeze(0)) % n  # (t, s)
    return torch.einsum("...tsc,bsc->btc", kernel[..., lags, :], x)


def gated_long_convolution_ref(s1, v, s2, multiplier, mask, transform: str, n: int, dtype) -> torch.Tensor:
    """:func:`gated_long_convolution` written with :func:`long_convolution_ref`."""
    u = (s1 * v).to(dtype)
    if mask is not None:
        u = torch.where(mask, u, torch.zeros_like(u))
    return long_convolution_ref(u, multiplier, transform, n) * s2


def short_convolution_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, wrap: bool) -> torch.Tensor:
    """:func:`short_convolution` as ``F.conv1d`` on the (B, C, L) layout, with circular or zero padding."""
    pad = weight.shape[-1] // 2
    signal = x.transpose(1, 2)
    if wrap and 0 < pad <= x.shape[1]:
        signal = F.pad(signal, (pad, pad), mode="circular")
        pad = 0
    return F.conv1d(signal, weight, bias, padding=pad, groups=weight.shape[0]).transpose(1, 2)



def long_convolution_2d_ref(x: torch.Tensor, multiplier: torch.Tensor, transform: str) -> torch.Tensor:
    """:func:`long_convolution_2d` from its definition: under the DCT the matrices of :func:`dct_ref` and
    :func:`idct_ref` along each axis; under the FFT the direct circular sum on the torus
    (:func:`circular_convolution_2d_ref`) with the kernel whose 2-D real FFT is ``multiplier``."""
    if transform == "dct":
        return idct_ref(idct_ref(dct_ref(dct_ref(x, 1), 2) * multiplier, 2), 1)
    kernel = torch.fft.irfftn(multiplier, s=x.shape[1:3], dim=(-3, -2))
    return circular_convolution_2d_ref(x, kernel)


def circular_convolution_2d_ref(x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """``y[b, t, u] = sum_{s, v} kernel[(t - s) mod H, (u - v) mod W] x[b, s, v]`` per channel, as a direct sum;
    x (B, H, W, C), kernel (H, W, C) or (B, H, W, C)."""
    batch, rows, columns, channels = x.shape
    r, c = torch.arange(rows, device=x.device), torch.arange(columns, device=x.device)
    row_lags = ((r[:, None] - r[None]) % rows)[:, :, None, None]  # (t, s, 1, 1)
    column_lags = ((c[:, None] - c[None]) % columns)[None, None]  # (1, 1, u, v)
    kernel = kernel.expand(batch, rows, columns, channels)
    return torch.einsum("btsuvc,bsvc->btuc", kernel[:, row_lags, column_lags], x)


def symmetric_convolution_2d_ref(x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """The symmetric convolution of x (B, H, W, C) with kernel (H, W, C) by its definition: x extended by its mirror
    images to (2H, 2W), the kernel extended evenly (lags 0 .. N-1, 0 at N, then N-1 .. 1 along each axis), their
    circular convolution, cut back to (H, W)."""
    rows, columns = x.shape[1:3]
    mirrored = torch.cat([x, x.flip(1)], 1)
    mirrored = torch.cat([mirrored, mirrored.flip(2)], 2)
    even = kernel
    for axis, size in ((0, rows), (1, columns)):
        zero = torch.zeros_like(even.narrow(axis, 0, 1))
        even = torch.cat([even, zero, even.narrow(axis, 1, size - 1).flip(axis)], axis)
    return circular_convolution_2d_ref(mirrored, even)[:, :rows, :columns]


def short_convolution_2d_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, wrap: bool) -> torch.Tensor:
    """:func:`short_convolution_2d` as a direct sum over the kernel's offsets, ``y[t, u] = b + sum_{i, j} w[i, j]
    x[t + i - k // 2, u + j - k // 2]``, reading x around the torus or as zeros outside the grid."""
    batch, rows, columns, channels = x.shape
    size = weight.shape[-1]
    pad = size // 2
    if wrap:
        padded = x[:, torch.arange(-pad, rows + pad) % rows][:, :, torch.arange(-pad, columns + pad) % columns]
    else:
        padded = F.pad(x, (0, 0, pad, pad, pad, pad))
    out = bias.expand(batch, rows, columns, channels).clone()
    for i in range(size):
        for j in range(size):
            out = out + weight[:, 0, i, j] * padded[:, i : i + rows, j : j + columns]
    return out
