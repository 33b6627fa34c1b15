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

import contextlib
import math
from collections.abc import Callable, Iterator
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
    ``scipy.fft.dct(x, n=n, axis=dim, norm="ortho")``, through the backend :func:`dct_backend` chooses."""
    dim = dim % x.dim()
    n = x.shape[dim] if n is None else n
    backend = dct_backend(x, n)
    if backend == "matrix":
        matrix = transform_matrix(n, x.shape[dim], x.dtype, x.device)  # (n, L)
        return torch.matmul(matrix, x.movedim(dim, -2)).movedim(-2, dim)
    if backend == "pocketfft":
        return PocketfftTransform.apply(x, dim, n, False)
    return makhoul_dct(zero_padded(x, dim, n), dim)


def idct(x: torch.Tensor, dim: int = -1, length: int | None = None) -> torch.Tensor:
    """The first ``length`` samples (default: all) of the orthonormal inverse DCT (DCT-III) along ``dim``; equal to
    ``scipy.fft.idct(x, axis=dim, norm="ortho")`` cut to ``length``, through the backend :func:`dct_backend`
    chooses."""
    dim = dim % x.dim()
    length = x.shape[dim] if length is None else length
    backend = dct_backend(x, x.shape[dim])
    if backend == "matrix":
        matrix = transform_matrix(x.shape[dim], length, x.dtype, x.device).transpose(0, 1)
        return torch.matmul(matrix, x.movedim(dim, -2)).movedim(-2, dim)
    if backend == "pocketfft":
        return PocketfftTransform.apply(x, dim, length, True)
    return makhoul_idct(x, dim, length)


def dct_backend(x: torch.Tensor, n: int) -> str:
    """How :func:`dct` and :func:`idct` compute a transform of length n on tensors like x: ``"matrix"``, a product
    with the DCT matrix, up to ``MATRIX_DCT_MAX_LENGTH``; ``"pocketfft"``, SciPy's FFT library, which computes the DCT
    natively, on the CPU in float32 or float64 outside a traced graph where SciPy is installed; ``"fft"`` otherwise:
    one real FFT of the same length (Makhoul, 1980; :func:`makhoul_dct`)."""
    if n <= MATRIX_DCT_MAX_LENGTH:
        return "matrix"
    if scipy_fft is not None and x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64):
        return "fft" if is_traced() else "pocketfft"
    return "fft"


def transform_matrix(n: int, columns: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The first ``columns`` columns of the orthonormal DCT-II matrix of size n (:func:`dct_matrix`), computed in
    float64 and cast to ``dtype`` (:func:`constants`)."""
    matrix = constants(("dct_matrix", n, dtype, torch.device(device)), lambda: dct_matrix(n, torch.float64, device))
    return matrix.narrow(1, 0, columns).to(dtype)


_CONSTANTS: dict[tuple, object] = {}


def constants(key: tuple, build: Callable[[], object]):
    """``build()``: the fixed tensors of a transform (its matrix, Makhoul's indices and weights). In eager runs kept
    once per ``key``, made outside inference mode (the first call may come from it, and an inference tensor could
    not serve a later call that records autograd); compiled or exported, made in the graph, which holds them as its
    own constants rather than reading a dictionary of the module."""
    if is_traced():
        return build()
    if key not in _CONSTANTS:
        with torch.inference_mode(False):
            _CONSTANTS[key] = build()
    return _CONSTANTS[key]


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
    """x zero-padded at the end of ``dim`` to length ``n`` >= its length (x itself at that length). Traced, the lengths
    here are fixed (each group of sequences has its transform length, :class:`SequenceLayout`)."""
    if n == x.shape[dim]:
        return x
    return F.pad(x, [0, 0] * (x.dim() - 1 - dim) + [0, n - x.shape[dim]])


def is_exporting() -> bool:
    """Whether the call is being traced by ``torch.export`` (and so for ONNX)."""
    exporting = getattr(torch.compiler, "is_exporting", None)  # torch >= 2.5
    return exporting is not None and exporting()


_TRACING_FOR_ONNX = False


@contextlib.contextmanager
def tracing_for_onnx() -> Iterator[None]:
    """Around a ``torch.export`` trace whose program goes to ``torch.onnx.export`` (as ``orchid_hf.onnx.export_onnx``
    traces): the traced layout runs each transform length on its own rows (:meth:`SequenceLayout.traced`), as it
    does under ``torch.onnx.export`` of the model itself."""
    global _TRACING_FOR_ONNX
    before, _TRACING_FOR_ONNX = _TRACING_FOR_ONNX, True
    try:
        yield
    finally:
        _TRACING_FOR_ONNX = before


def is_tracing_for_onnx() -> bool:
    """Whether the graph being traced goes to ONNX: :func:`tracing_for_onnx`, or ``torch.onnx.export``."""
    return _TRACING_FOR_ONNX or torch.onnx.is_in_onnx_export()


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


def makhoul_constants(n: int, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    """The fixed tensors of :func:`makhoul_dct` and :func:`makhoul_idct` for length n (:func:`constants`): Makhoul's
    reordering (the even-indexed samples, then the odd-indexed ones reversed) and its inverse, the index of each
    output's spectrum sample (V[N - k] = conj(V[k]) for the upper half), the weights of its real and imaginary parts,
    and the rotation of the inverse, computed in Python (a graph then holds them as constants, rather than ops the
    exporter would trace and fold on every call)."""
    return constants(("makhoul", n, dtype, torch.device(device)), lambda: _makhoul_constants(n, dtype, device))


def _makhoul_constants(n: int, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    order = list(range(0, n, 2)) + list(range(1, n, 2))[::-1]
    weights = []  # (n, 2): output k's weights of Re V[k] and Im V[k]; the mirror's imaginary part changes sign
    for k in range(n):
        angle, scale, sign = math.pi * k / (2 * n), math.sqrt((1.0 if k == 0 else 2.0) / n), -1 if k > n // 2 else 1
        weights.append([math.cos(angle) * scale, math.sin(angle) * sign * scale])
    half = n // 2 + 1
    scales = [math.sqrt(float(n) if k == 0 else n / 2.0) for k in range(half)]
    return {
        "order": torch.tensor(order, device=device),
        "inverse": torch.tensor(sorted(range(n), key=order.__getitem__), device=device),
        "spectrum_index": torch.tensor([n - k if k > n // 2 else k for k in range(n)], device=device),
        "weights": torch.tensor(weights, dtype=dtype, device=device),
        "mirror_index": torch.tensor([n - k for k in range(half)], device=device),
        "cos": torch.tensor([math.cos(math.pi * k / (2 * n)) * scales[k] for k in range(half)], dtype=dtype,
                            device=device),
        "sin": torch.tensor([math.sin(math.pi * k / (2 * n)) * scales[k] for k in range(half)], dtype=dtype,
                            device=device),
    }  # fmt: skip


def _along(values: torch.Tensor, x: torch.Tensor, dim: int) -> torch.Tensor:
    """``values`` (n, ...) shaped to broadcast against x along ``dim`` (its trailing axes after the first kept)."""
    return values.view(values.shape[0], *([1] * (x.dim() - 1 - dim)), *values.shape[1:])


def makhoul_dct(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Orthonormal DCT-II along ``dim`` with one real FFT of the same length (Makhoul, 1980), in real arithmetic:
    Makhoul's reordering as one gather, the real FFT along ``dim`` itself (no transposes), and output k as
    ``Re V[k] cos(pi k / 2N) + Im V[k] sin(pi k / 2N)``, scaled, with V[k] of the upper half read from its mirror
    V[N - k] = conj(V[k]): one gather of the half spectrum's real and imaginary parts and one weighted sum, in the
    ops that an exported graph (ONNX) has."""
    constants = makhoul_constants(x.shape[dim], x.dtype, x.device)
    half = torch.view_as_real(torch.fft.rfft(x.index_select(dim, constants["order"]), dim=dim))
    spectrum = half.index_select(dim, constants["spectrum_index"])
    return (spectrum * _along(constants["weights"], x, dim)).sum(-1)


def makhoul_idct(x: torch.Tensor, dim: int, length: int) -> torch.Tensor:
    """The first ``length`` samples of the orthonormal DCT-III (the inverse of :func:`makhoul_dct`) along ``dim``: with
    X[N] = 0 and a = pi k / 2N, the half spectrum ``V[k] = (X[k] - i X[N - k]) exp(i a)`` of Makhoul's reordered
    signal in real arithmetic (X[N - k] as one gather), its inverse real FFT along ``dim``, and the reordering undone
    and the samples cut by one gather (a cut of its own, a view, would tie an exported graph to one side of
    length < N)."""
    n = x.shape[dim]
    constants = makhoul_constants(n, x.dtype, x.device)
    cos, sin = _along(constants["cos"], x, dim), _along(constants["sin"], x, dim)
    head = x.narrow(dim, 0, n // 2 + 1)
    # X[N - k]; at k = 0 the zero appended after the last sample, whatever its scale.
    mirror = zero_padded(x, dim, n + 1).index_select(dim, constants["mirror_index"])
    spectrum = torch.complex(head * cos + mirror * sin, head * sin - mirror * cos)
    v = torch.fft.irfft(spectrum, n=n, dim=dim)
    # v[i] holds y[order[i]]: y is v read at the inverse permutation.
    return v.index_select(dim, constants["inverse"][:length])


def forward_transform(x: torch.Tensor, transform: str, n: int, dim: int = 1) -> torch.Tensor:
    """The orthonormal transform T of App. C.2 along ``dim`` of x zero-padded to n: the DCT-II (real, n samples) or
    the real FFT (complex, n // 2 + 1 samples)."""
    if transform == "dct":
        return dct(x, dim, n)
    return torch.fft.rfft(zero_padded(x, dim, n), dim=dim, norm="ortho")


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
    spectrum = torch.fft.rfft(zero_padded(x, dim, n), dim=dim) * multiplier
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


def orchid_convolutions(s1, v, s2, kernel, x, residual, mask, transform: str, n: int, dtype) -> torch.Tensor:
    """The long convolutions between the operator's projections: ``s2 * (h * (s1 * v))``, the chain of order 1.5 with
    the multiplier ``kernel`` (:func:`gated_long_convolution`), plus ``h_res * x``, the residual long convolution of
    the block input x with the multiplier ``residual`` (App. C.3; none where it is None)."""
    y = gated_long_convolution(s1, v, s2, kernel, mask, transform, n, dtype)
    return y if residual is None else y + long_convolution(x.to(dtype), residual, transform, n)


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


# Without autograd, the long convolutions of a long input run a block of channels at a time: they act on each channel
# alone, and a block whose (tokens, channels) tensors hold about this many numbers (2 MiB in float32) stays in the
# CPU's caches, where the whole width's tensors do not (`scripts/benchmark.py --profile 1x4096` shows the transforms
# and products gaining). Under autograd, blocks would only add copies.
CHANNEL_BLOCK_ELEMENTS = 2**19
MIN_CHANNEL_BLOCK = 32


def in_channel_blocks(fn: Callable[..., torch.Tensor], *tensors: torch.Tensor | None) -> torch.Tensor:
    """``fn(*tensors)``, where fn acts on each channel (the last axis of each tensor, None passed as it is) alone.
    Without autograd and outside a traced graph, on blocks of at least ``MIN_CHANNEL_BLOCK`` channels whose part of
    the first tensor holds about ``CHANNEL_BLOCK_ELEMENTS`` numbers, the results joined; on all channels at once where
    that would make fewer than four blocks, which would gain little."""
    first = tensors[0]
    channels = first.shape[-1]
    width = max(CHANNEL_BLOCK_ELEMENTS // max(first.numel() // channels, 1) // MIN_CHANNEL_BLOCK * MIN_CHANNEL_BLOCK,
                MIN_CHANNEL_BLOCK)  # fmt: skip
    if torch.is_grad_enabled() or is_traced() or 4 * width > channels:
        return fn(*tensors)
    blocks = range(0, channels, width)
    return torch.cat([fn(*(t if t is None else t[..., i : i + width] for t in tensors)) for i in blocks], dim=-1)


# ---------------------------------------------------------------------------------------------
# Sequences of a batch: the tokens the per-token layers see, and the groups mixed at each transform length
# ---------------------------------------------------------------------------------------------


def masked(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """x with the positions where ``mask`` (bool, broadcastable) is False set to zero. A selection, not a product,
    so that NaN or inf at padded positions never reaches a real one (0 * NaN is NaN)."""
    return x if mask is None else x.masked_fill(~mask, 0.0)


def transform_length(length: int, lengths: tuple[int, ...]) -> int:
    """The transform length of a sequence of ``length`` real tokens: the shortest of ``lengths`` (ascending) that holds
    it."""
    return next((n for n in lengths if n >= length), lengths[-1])


def packing_order(real: torch.Tensor) -> torch.Tensor:
    """For each row of the boolean mask ``real`` (B, L), the positions of its real tokens in order followed by those
    of its padding, (B, L). Each position's place in that order comes from running counts of real and padded
    positions, and the order is its inverse, written by one scatter: a sort would do the same, but its stable form
    has no ONNX translation."""
    count = real.sum(dim=1, keepdim=True)
    place = torch.where(real, real.cumsum(dim=1) - 1, count + (~real).cumsum(dim=1) - 1)
    positions = torch.arange(real.shape[1], device=real.device).expand_as(place)
    return torch.empty_like(place).scatter_(1, place, positions)


@dataclass(frozen=True)
class SequenceGroup:
    """The sequences mixed together at transform length ``n``, as rows (G, L) of their tokens: ``index`` holds, for
    each row and position, the place of its token among the layout's tokens, and the count of tokens (one past the
    last) where the sequence has ended (or, traced, where the row is another group's); ``mask`` (G, L, 1) marks the
    tokens. ``index`` None: every row of a batch without padding, the tokens being its rows, ``shape`` (B, L)."""

    n: int
    index: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    shape: tuple[int, int] | None = None

    def take(self, tokens: torch.Tensor) -> torch.Tensor:
        """This group's rows (G, L, C) of ``tokens`` (T, C), zero beyond each sequence."""
        if self.index is None:
            return tokens.view(*self.shape, tokens.shape[-1])
        rows = tokens.index_select(0, self.index.masked_fill(~self.mask[..., 0], 0).flatten())
        return masked(rows.view(*self.index.shape, tokens.shape[-1]), self.mask)


@dataclass(frozen=True)
class SequenceLayout:
    """Where the sequences of a batch are, computed once per call (by ``OrchidModel`` for all its layers, or by an
    ``OrchidOperator`` called on its own): the tokens that the per-token layers (embeddings, projections, MLP, norms)
    see, and the groups of sequences mixed at each transform length (:class:`SequenceGroup`).

    Each sequence is mixed at the shortest of the model's transform lengths that holds it, zero-padded to it and from
    its first token, so that its output depends neither on the padding of its batch nor on the other sequences in
    it, and its cost follows its own length. Eager, the tokens are the real tokens of a padded batch (``tokens``, their
    places in the flattened batch; padding on either side, or none), or every token of sequences packed in a row
    (``from_packed``); the groups are read from the sequences' lengths on the host, once, each cropped to its
    longest sequence. Under ``torch.compile`` and ``torch.export``, where a graph cannot depend on values, the tokens
    are every position of the batch (``real`` marks the real ones) and each row keeps the result of its own transform
    length: compiled or in a ``torch.export`` program, every transform length up to the one that holds the padded
    length runs on every row (about twice the work of the longest, with fixed shapes inside); exported to ONNX, each
    runs on its own rows only (:meth:`traced`). The same outputs at the real positions."""

    shape: tuple[int, int]
    groups: tuple[SequenceGroup, ...]
    tokens: torch.Tensor | None = None
    real: torch.Tensor | None = None

    @classmethod
    def from_mask(
        cls,
        real: torch.Tensor | None,
        lengths: tuple[int, ...],
        shape: tuple[int, int],
        device: torch.device,
        rung_counts: torch.Tensor | None = None,
    ) -> SequenceLayout:
        """The layout of a padded batch of ``shape`` (B, L) on ``device`` whose real positions ``real`` (B, L, bool)
        marks (None: all), for the transform lengths ``lengths`` (ascending). ``rung_counts`` (B,): the lengths that
        choose each row's transform length, where another sequence shares it (the operator's cross-conditioning); by
        default the rows' own. Eager, this reads the rows' lengths on the host, once."""
        if is_traced():
            return cls.traced(real, lengths, shape, device, rung_counts)
        batch, length = shape
        if real is None and rung_counts is None:
            return cls(shape, (SequenceGroup(transform_length(length, lengths), shape=shape),))
        rows = torch.ones(shape, dtype=torch.bool, device=device) if real is None else real
        counts = rows.sum(dim=1)
        values = torch.cat([counts, counts if rung_counts is None else rung_counts]).tolist()  # the one host read
        counts_list, rungs = values[:batch], [transform_length(max(count, 1), lengths) for count in values[batch:]]
        if all(count == length for count in counts_list) and len(set(rungs)) == 1:
            return cls(shape, (SequenceGroup(rungs[0], shape=shape),))
        # Row after row, each row's real tokens in order; their count is known, so no second read on the host.
        tokens = torch.nonzero_static(rows.flatten(), size=sum(counts_list)).squeeze(1)
        starts = [sum(counts_list[:row]) for row in range(batch)]
        return cls(shape, sequence_groups(starts, counts_list, rungs, device), tokens)

    @classmethod
    def of_real_tokens(cls, real: torch.Tensor | None, shape: tuple[int, int]) -> SequenceLayout:
        """The real tokens of a padded batch of ``shape`` (B, L), marked by ``real`` (B, L, bool; None: all), without
        groups: the layout of per-token layers that follow the encoder (the heads). In a graph, every position."""
        if real is None:
            return cls(shape, ())
        if is_traced():
            return cls(shape, (), real=real.unsqueeze(-1))
        count = int(real.sum())  # the one host read
        if count == real.numel():
            return cls(shape, ())
        return cls(shape, (), torch.nonzero_static(real.flatten(), size=count).squeeze(1))

    @classmethod
    def pair(cls, real, shape, source_real, source_shape, lengths, device) -> tuple[SequenceLayout, SequenceLayout]:
        """The layouts of a batch and of another whose rows share its rows' transform lengths (the operator's
        cross-conditioning, Remark 3.3): each row at the length that holds the longer of its two sequences."""
        counts = [torch.full(size[:1], size[1], device=device) if mask is None else mask.sum(1)
                  for mask, size in ((real, shape), (source_real, source_shape))]  # fmt: skip
        longer = torch.maximum(*counts)
        return (cls.from_mask(real, lengths, shape, device, longer),
                cls.from_mask(source_real, lengths, source_shape, device, longer))  # fmt: skip

    @classmethod
    def from_packed(cls, starts: list[int], counts: list[int], lengths: tuple[int, ...], shape, device):
        """The layout of sequences packed one after the other in a row of ``shape`` (1, T) (transformers' padding-free
        batches), starting at ``starts`` with ``counts`` tokens each: every token is real."""
        rungs = [transform_length(count, lengths) for count in counts]
        return cls(shape, sequence_groups(starts, counts, rungs, device))

    @classmethod
    def traced(cls, real, lengths, shape, device, rung_counts=None) -> SequenceLayout:
        """:meth:`from_mask` in a graph: every position a token, each row's tokens gathered from the front by tensor ops
        (:func:`packing_order`), every group with its mask, so that whether a row fills its transform length is a
        tensor (:func:`fills_transform`), never a branch on a traced length. The transform lengths beyond the one
        that holds the length are left out where the length is known when tracing.

        Compiled or exported with ``torch.export``, every transform length runs on every row, each row keeping its own
        result: a graph of fixed shapes. Traced for ONNX (:func:`is_tracing_for_onnx`), each transform length runs on
        its own rows only, which the graph finds (``nonzero``; none where no row needs it), so that ONNX Runtime pays
        for each row's own transform length, as eager PyTorch does. A ``torch.export`` program keeps the assertions
        its tracing made on those row counts (an FFT of no rows is one), and would fail where a length has no row; the
        ONNX exporter leaves them out of the graph, and ONNX Runtime computes a length of no rows as nothing."""
        batch, length = shape
        if isinstance(length, int):
            lengths = tuple(n for n in lengths if n <= transform_length(length, lengths))
        rows = torch.ones(batch, length, dtype=torch.bool, device=device) if real is None else real
        counts = rows.sum(dim=1)
        bounds = torch.tensor(lengths, device=device)
        # The first length that holds each row: the count of shorter ones (searchsorted has no ONNX translation).
        chooser = counts if rung_counts is None else rung_counts
        rung = bounds[(chooser.clamp_min(1).unsqueeze(-1) > bounds).sum(-1).clamp_max(len(lengths) - 1)]
        # A fixed width, at least the length: one pad op whatever the (maybe symbolic) length.
        order = F.pad(packing_order(rows), [0, lengths[-1] - length])
        groups = []
        for n in lengths:
            own = rung == n
            members = own.nonzero().squeeze(1) if is_tracing_for_onnx() else torch.arange(batch, device=device)
            own = own.index_select(0, members)
            mask = (torch.arange(n, device=device) < counts.index_select(0, members).unsqueeze(1)) & own.unsqueeze(1)
            index = torch.where(mask, members.unsqueeze(1) * length + order.index_select(0, members)[:, :n],
                                batch * length)  # fmt: skip
            groups.append(SequenceGroup(n, index, mask.unsqueeze(-1)))
        return cls(shape, tuple(groups), real=None if real is None else real.unsqueeze(-1))

    @property
    def num_tokens(self) -> int:
        return self.shape[0] * self.shape[1] if self.tokens is None else self.tokens.shape[0]

    def gather(self, x: torch.Tensor | None) -> torch.Tensor | None:
        """The tokens of x (B, L, ...): (1, T, ...), or x itself where every position is a token."""
        if x is None or self.tokens is None:
            return x
        return x.reshape(-1, *x.shape[2:]).index_select(0, self.tokens).unsqueeze(0)

    def restore(self, tokens: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`gather`: (B, L, C) with the tokens at their places and zeros at padded ones."""
        if self.tokens is None:
            return masked(tokens, self.real)
        batch, length = self.shape
        flat = tokens.reshape(-1, tokens.shape[-1])
        return flat.new_zeros(batch * length, flat.shape[-1]).index_copy(0, self.tokens, flat).view(batch, length, -1)

    def join(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """The tokens (T, C) of each group's rows ``parts`` (G, L, C), in the order of ``groups``."""
        if len(parts) == 1 and self.groups[0].index is None:
            return parts[0].reshape(-1, parts[0].shape[-1])
        total = self.num_tokens
        out = parts[0].new_zeros(total + 1, parts[0].shape[-1])  # a last row for the places that hold no token
        for group, part in zip(self.groups, parts):
            out.index_add_(0, group.index.flatten(), part.flatten(0, 1))
        return out.narrow(0, 0, total)


def sequence_groups(starts: list[int], counts: list[int], rungs: list[int], device) -> tuple[SequenceGroup, ...]:
    """The groups of sequences of ``counts`` tokens starting at ``starts`` among the tokens, by transform length
    ``rungs``; each cropped to its longest sequence."""
    total = sum(counts)
    groups = []
    for n in sorted(set(rungs)):
        members = [index for index, rung in enumerate(rungs) if rung == n]
        width = max(max(counts[index] for index in members), 1)
        begin = torch.tensor([starts[index] for index in members], device=device).unsqueeze(1)
        ends = torch.tensor([counts[index] for index in members], device=device).unsqueeze(1)
        mask = torch.arange(width, device=device) < ends
        index = torch.where(mask, begin + torch.arange(width, device=device), total)
        groups.append(SequenceGroup(n, index, mask.unsqueeze(-1)))
    return tuple(groups)


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
