"""Building blocks of Orchid (Karami & Ghodsi, NeurIPS 2024): transforms, the data-dependent long
convolution operator, and block-diagonal linear layers.

Section and equation numbers refer to the paper. Every sequence-mixing step runs along the sequence
axis, per channel. The operator keeps the transformers layout ``(batch, length, channels)`` throughout:
its projections are row-major GEMMs in that layout, its depthwise convolutions run as channels-last
oneDNN convolutions, and its transforms act on axis 1, so no activation is ever transposed. On the CPU the
DCT runs through pocketfft, SciPy's FFT library, which computes it natively (``dct_algorithm``). Elsewhere, or
without SciPy, it is a single GEMM with the orthonormal DCT matrix up to ``MATMUL_DCT_MAX_LEN`` (at N = 128 one GEMM
beats an FFT wrapped in the reorderings and twiddles of Makhoul's algorithm), and beyond it one real FFT of length N.
Without gradients, intermediate tensors are updated in place, which on CPU also saves the page faults of fresh large
allocations. On long inputs the per-channel steps run for groups of channels in turn
(``OrchidOperator.channel_groups``), so that their tensors stay small.

The functions ``dct``, ``idct``, ``long_convolution``, ``kernel_spectrum`` and ``apply_spectrum`` act on
the last axis; the ``*_seq`` functions are their counterparts along the sequence axis.

This file depends only on torch and the standard library, and uses SciPy when it is installed, so that it can ship
to the Hub as remote code.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable, Hashable

import torch
import torch.nn.functional as F
from torch import nn

try:  # optional: the DCT on the CPU (see dct_algorithm)
    import scipy.fft as scipy_fft
except ImportError:
    scipy_fft = None

TRANSFORMS = ("dct", "fft")
CONDITIONINGS = ("abs", "xcorr")
CONDITIONING_ACTIVATIONS = ("identity", "sigmoid", "tanh", "softsign", "softshrink")
# How the static filter's multiplier is formed under the DCT: the paper's Listing 1, ``dct(h0)``, or the spectrum
# of a convolution with h0 (see ImplicitLongFilter). Under the FFT both are the exact circular convolution.
FILTER_SPECTRA = ("listing1", "convolution")


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

    ``"fft"``: exact circular convolution, ``y[t] = sum_s kernel[(t - s) mod N] x[s]`` (Sec. 3.2); index n of
    the kernel is the lag n mod N.
    ``"dct"``: symmetric convolution, the DCT's counterpart (App. C.2; Martucci, 1994). Index m of the kernel is
    the lag +-m of an even kernel, and x is extended by its mirror image instead of periodically:
    ``y[t] = sum_s x[s] (kernel[|t - s|] + kernel[t + s + 1])``, where the second term, the reflection at the
    start of the sequence, only reaches lags up to N - 1 (``kernel[m]`` reads ``kernel[2N - m]`` for m > N and 0
    at m = N).
    """
    n = x.shape[-1]
    return apply_spectrum(x, kernel_spectrum(kernel, transform), transform, n)


def kernel_spectrum(kernel: torch.Tensor, transform: str, dim: int = -1) -> torch.Tensor:
    """The multiplier that makes :func:`apply_spectrum` convolve with ``kernel`` (Listing 1, ``h_0_f``), the
    kernel's samples along ``dim``.

    ``"fft"``: the unnormalised real FFT, paired with the unnormalised inverse: exactly circular convolution.
    ``"dct"``: the cosine transform of the kernel's even extension, ``H[k] = h[0] + 2 sum_m h[m] cos(pi k m / N)``.
    Listing 1 multiplies by ``dct(h0)`` instead, which is not the spectrum of a convolution: an impulse
    ``h0 = (1, 0, ...)`` would scale the signal by 1 / sqrt(2N) instead of keeping it.
    """
    if transform == "fft":
        return torch.fft.rfft(kernel, dim=dim)
    n = kernel.shape[dim]
    # h[0] .. h[N-1], 0, h[N-1] .. h[1]: real and even over 2N samples, so its real FFT is real.
    zero = torch.zeros_like(kernel.narrow(dim, 0, 1))
    extension = torch.cat([kernel, zero, kernel.narrow(dim, 1, n - 1).flip(dim)], dim)
    return torch.fft.rfft(extension, dim=dim).real.narrow(dim, 0, n)


def apply_spectrum(x: torch.Tensor, spectrum: torch.Tensor, transform: str, n: int) -> torch.Tensor:
    """``T^-1( T(x) * spectrum )``: the O(N log N) long convolution in the transform domain."""
    if transform == "dct":
        return idct(dct(x) * spectrum)
    return torch.fft.irfft(torch.fft.rfft(x, dim=-1) * spectrum, n=n, dim=-1)


# ---------------------------------------------------------------------------------------------
# Linear layers without autograd: oneDNN's fused linear on CPU
# ---------------------------------------------------------------------------------------------

# Without autograd, float32 linear layers on CPU run through oneDNN's linear, the kernel behind torch.compile's
# CPU linear fusions: it adds the bias, and optionally an activation, while the GEMM writes its output, where
# F.linear first broadcasts the bias into the output and an activation is one more pass. Its float32 GEMMs also
# ran 5-15% faster than MKL's on the benchmark machine (docs/performance.md). False uses F.linear everywhere.
ONEDNN_LINEAR = True
# transformers' names of the activations oneDNN can apply in the GEMM's pass: (post-op, algorithm).
ONEDNN_ACTIVATIONS = {
    "gelu": ("gelu", "none"),
    "gelu_pytorch_tanh": ("gelu", "tanh"),
    "relu": ("relu", ""),
    "silu": ("swish", ""),
    "swish": ("swish", ""),
}


# oneDNN's GEMMs read a weight in a blocked layout of their own, into which they repack a plain (out, in) weight on
# every call. Without autograd a weight is packed once per version and kept (``packed_rows``): the GEMMs of
# orchid-bert-base ran 4-6% faster (docs/performance.md). The packed copies take as much memory as the weights they
# copy, at most twice that per weight (``PACKED_ROWS_LIMIT``). False never packs.
PACK_WEIGHTS = True
# Any batch above a handful gets the same packed layout, which then serves every batch size.
_PACKING_BATCH = 1024


def _linear_check_operands() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A small x, weight and bias on which the oneDNN ops are checked against F.linear before they are used."""
    x = torch.linspace(-1.0, 1.0, 12).view(3, 4)
    return x, torch.linspace(-2.0, 2.0, 20).view(5, 4), torch.linspace(0.0, 1.0, 5)


@functools.cache
def _onednn_linear_op():
    """``torch.ops.mkldnn._linear_pointwise`` if this build of torch has it and it computes F.linear, else None."""
    try:
        op = torch.ops.mkldnn._linear_pointwise
        with torch.no_grad():
            x, weight, bias = _linear_check_operands()
            works = torch.allclose(op(x, weight, bias, "none", [], ""), F.linear(x, weight, bias), atol=1e-5)
    except (AttributeError, RuntimeError):
        return None
    return op if works else None


@functools.cache
def _pack_op():
    """``torch.ops.mkldnn._reorder_linear_weight`` if this build of torch has it and oneDNN's linear computes F.linear
    with the weight it packs, else None."""
    linear_op = _onednn_linear_op()
    if linear_op is None:
        return None
    try:
        op = torch.ops.mkldnn._reorder_linear_weight
        with torch.no_grad():
            x, weight, bias = _linear_check_operands()
            packed = op(weight, _PACKING_BATCH)
            works = torch.allclose(linear_op(x, packed, bias, "none", [], ""), F.linear(x, weight, bias), atol=1e-5)
    except (AttributeError, RuntimeError):
        return None
    return op if works else None


def onednn_linear_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :func:`onednn_linear` can compute ``x W^T``: CPU float32, no autograd, autocast or compilation."""
    return (
        ONEDNN_LINEAR
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and not torch.is_grad_enabled()
        and not torch.compiler.is_compiling()
        and not torch.is_autocast_enabled("cpu")
        and _onednn_linear_op() is not None
    )


def onednn_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, activation: str | None = None
) -> torch.Tensor:
    """``act(x W^T + b)`` in one oneDNN call; only where :func:`onednn_linear_applies`. ``activation`` is a key of
    ``ONEDNN_ACTIVATIONS``, or None for none."""
    post_op, algorithm = ONEDNN_ACTIVATIONS[activation] if activation is not None else ("none", "")
    return _onednn_linear_op()(x, weight, bias, post_op, [], algorithm)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear``, through oneDNN where :func:`onednn_linear_applies`."""
    if onednn_linear_applies(x, weight):
        return onednn_linear(x, weight, bias)
    return F.linear(x, weight, bias)


def parameter_state(parameter: torch.Tensor) -> tuple:
    """What tells a parameter's values apart from before an update: in-place updates (optimizer steps,
    ``load_state_dict``) bump its version counter, and moving it changes its memory."""
    return parameter.data_ptr(), parameter._version, parameter.device, parameter.dtype


# id(parameter) -> (parameter state, {rows key: packed rows}), dropped with the parameter. Kept outside the modules,
# which thus hold no oneDNN tensors: those can be neither copied nor pickled.
_PACKED_WEIGHTS: dict[int, tuple[tuple, dict]] = {}
# A parameter's packed copies hold at most this many times its numbers; beyond, they are dropped and packed anew.
PACKED_ROWS_LIMIT = 2


def packs_weights(parameter: torch.Tensor) -> bool:
    """Whether :func:`packed_rows` packs this linear layer's weight: where oneDNN multiplies by it (CPU float32, no
    autograd, autocast or compilation), unless it is an inference tensor, which has no version counter."""
    return (
        PACK_WEIGHTS
        and onednn_linear_applies(parameter, parameter)
        and not parameter.is_inference()
        and _pack_op() is not None
    )


def packed_rows(parameter: torch.Tensor, key: Hashable, rows: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``rows()``, rows of ``parameter`` (a linear layer's weight) that ``key`` names, in the layout oneDNN's GEMMs
    read: packed once per version of the parameter where :func:`packs_weights`, else ``rows()`` as it is."""
    if not packs_weights(parameter):
        return rows()
    state = parameter_state(parameter)
    entry = _PACKED_WEIGHTS.get(id(parameter))
    if entry is None:
        weakref.finalize(parameter, _PACKED_WEIGHTS.pop, id(parameter), None)
    if entry is None or entry[0] != state:
        entry = _PACKED_WEIGHTS[id(parameter)] = (state, {})
    packs = entry[1]
    packed = packs.get(key)
    if packed is None:
        weight = rows()
        if sum(p.numel() for p in packs.values()) + weight.numel() > PACKED_ROWS_LIMIT * parameter.numel():
            packs.clear()
        with torch.no_grad():
            packed = packs[key] = _pack_op()(weight.contiguous(), _PACKING_BATCH)
    return packed


def linear_rows(layer: nn.Linear, rows: slice | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Weight and bias of the outputs ``rows`` (a slice or an index tensor) of a linear layer; the weight packed
    where :func:`packs_weights`."""
    bias = None if layer.bias is None else layer.bias[rows]
    if not packs_weights(layer.weight):
        return layer.weight[rows], bias
    key = (rows.start, rows.stop, rows.step) if isinstance(rows, slice) else tuple(rows.tolist())
    return packed_rows(layer.weight, key, lambda: layer.weight[rows]), bias


class Linear(nn.Linear):
    """``nn.Linear`` that runs through :func:`linear`: oneDNN without autograd on CPU (with its weight packed),
    F.linear otherwise."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, *linear_rows(self, ALL_CHANNELS))

    def output_slice(
        self, x: torch.Tensor, start: int, stop: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The input, weight rows and bias that give output features [start, stop)."""
        return x, *linear_rows(self, slice(start, stop))


# ---------------------------------------------------------------------------------------------
# The same transforms along axis 1 of (batch, length, channels) tensors: the operator's layout
# ---------------------------------------------------------------------------------------------

# Where pocketfft does not apply (see dct_algorithm), the DCT up to this length is one GEMM with the N x N matrix:
# 2 N flops per sample, which at N = 128 costs less than an FFT wrapped in reorderings and twiddles. Beyond it,
# Makhoul's algorithm with one real FFT.
MATMUL_DCT_MAX_LEN = 128
# On the CPU, in eager mode, float32 or float64, the DCT and its inverse run through pocketfft (SciPy's FFT library),
# which computes them natively, a few channels at a time in one pass along each: a DCT-domain convolution of 16
# channels at N = 16384 ran 1.6x faster than Makhoul's algorithm around torch's real FFT (its reordering, twiddles
# and copies are separate passes over memory), and at N = 128 faster than the GEMM (docs/performance.md, round 9).
# False, or no SciPy, keeps the DCT in torch.
POCKETFFT_DCT = True

_CONSTANTS: dict = {}


def _constant(key: tuple, build):
    """A value that depends only on ``key`` (length, dtype, device), built once and shared by all layers."""
    if torch.compiler.is_compiling():
        return build()  # traced into the graph instead of read from a Python dict
    value = _CONSTANTS.get(key)
    if value is None:
        # Never inference tensors: a constant may later be saved for backward by a training step.
        with torch.inference_mode(False), torch.no_grad():
            value = _CONSTANTS[key] = build()
    return value


def dct_matrix(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The orthonormal DCT-II matrix D (n, n), ``D[k, t] = s_k cos(pi (2t + 1) k / 2n)``: dct(x) = D x."""

    def build():
        k = torch.arange(n, dtype=torch.float64, device="cpu").unsqueeze(1)
        t = torch.arange(n, dtype=torch.float64, device="cpu").unsqueeze(0)
        matrix = torch.cos(math.pi * (2 * t + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
        matrix[0] /= math.sqrt(2.0)
        return matrix.to(device=device, dtype=dtype)

    return _constant(("dct_matrix", n, dtype, device), build)


def sequence_matmul(
    matrix: torch.Tensor,
    x: torch.Tensor,
    multiply: torch.Tensor | None = None,
    accumulate: torch.Tensor | None = None,
) -> torch.Tensor:
    """``matrix @ x[b]`` for x (B, K, C) and matrix (M, K): (B, M, C), times ``multiply`` (M, C) or (B, M, C), or
    added to ``accumulate`` (B, M, C); in place without gradients."""
    grad = torch.is_grad_enabled()
    if accumulate is not None:
        matrix = matrix.expand(x.shape[0], -1, -1)
        return torch.baddbmm(accumulate, matrix, x) if grad else accumulate.baddbmm_(matrix, x)
    out = torch.matmul(matrix, x)
    if multiply is None:
        return out
    return out * multiply if grad else out.mul_(multiply)


def _makhoul_constants(n: int, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    """Index maps and twiddles of the FFT-based DCT along axis 1.

    Reading Makhoul's reordered input time-reversed conjugates its FFT, which turns the imaginary parts that
    the DCT needs with a minus sign into plus signs: then ``Z = rfft(...) * twiddle`` holds the DCT in
    *pairs*, ``Re Z[k] = X[k]`` and ``Im Z[k] = X[n - k]`` (``Im Z[0] = 0``), and the inverse transform starts
    from exactly that pair form. A product with a DCT-domain multiplier H is then an in-place product of
    the real and imaginary parts with ``H[k]`` and ``H[n - k]``, with no reordering in between.
    """

    def build():
        half = n // 2 + 1
        t = torch.arange(n, device="cpu")
        # Makhoul's reordering v = (x0, x2, x4, ..., x5, x3, x1), read time-reversed: v[(-t) mod n].
        order = torch.cat([torch.arange(0, n, 2), torch.arange(1, n, 2).flip(0)])
        k = torch.arange(half, dtype=torch.float64, device="cpu")
        scale = torch.full((half,), math.sqrt(2.0 / n), dtype=torch.float64)
        scale[0] = math.sqrt(1.0 / n)
        # Inverse: V[k] = (X[k] - i X[n - k]) exp(i pi k / 2n) c_k = conj((X[k] + i X[n - k]) conj(w_k));
        # the irfft of a conjugate is the time-reversed signal, which the final reordering undoes.
        inverse_scale = torch.full((half,), math.sqrt(n / 2.0), dtype=torch.float64)
        inverse_scale[0] = math.sqrt(float(n))
        j = torch.arange(n)
        complex_dtype = torch.complex128 if dtype == torch.float64 else torch.complex64
        rows = torch.arange(half)
        forward_twiddle = torch.polar(scale, math.pi * k / (2 * n))
        inverse_twiddle = torch.polar(inverse_scale, -math.pi * k / (2 * n))
        return {
            "gather": order[(-t) % n].to(device),
            "forward_twiddle": forward_twiddle.to(device, complex_dtype).unsqueeze(-1),
            "inverse_twiddle": inverse_twiddle.to(device, complex_dtype).unsqueeze(-1),
            # Rows of the (half, 2) pair layout, flattened, that hold X[0], ..., X[n - 1].
            "natural": torch.cat([2 * rows, 2 * (n - torch.arange(half, n)) + 1]).to(device),
            # Rows of X that make the pair layout: (X[k], X[n - k]); X[n] does not exist and meets Im Z[0] = 0.
            "pairs": torch.stack([rows, (n - rows) % n], dim=1).reshape(-1).to(device),
            # y[2j] = v[j] = v_reversed[-j], y[2j + 1] = v[n - 1 - j] = v_reversed[j + 1].
            "unorder": torch.where(j % 2 == 0, (-(j // 2)) % n, j // 2 + 1).to(device),
        }

    return _constant(("makhoul", n, dtype, device), build)


def dct_algorithm(x: torch.Tensor, n: int) -> str:
    """How the DCT of length n runs on tensors like x: ``"pocketfft"`` (SciPy, on the CPU, float32 or float64,
    not under torch.compile), else ``"matmul"`` (one GEMM with the DCT matrix, up to ``MATMUL_DCT_MAX_LEN``) or
    ``"makhoul"`` (one real FFT in pair form)."""
    eager_cpu = x.device.type == "cpu" and not torch.compiler.is_compiling()
    if POCKETFFT_DCT and scipy_fft is not None and eager_cpu and x.dtype in (torch.float32, torch.float64):
        return "pocketfft"
    return "matmul" if n <= MATMUL_DCT_MAX_LEN else "makhoul"


def _pocketfft_transform(x: torch.Tensor, n: int, inverse: bool, in_place: bool = False) -> torch.Tensor:
    """The orthonormal DCT-II (or, ``inverse``, DCT-III) along axis 1 of x (B, L, C) zero-padded to n, (B, n, C).

    pocketfft transforms a tensor of torch's own in place: x itself when ``in_place`` (a fresh tensor of length n
    that nothing else reads), else a padded copy, so that the result is counted like any tensor's memory."""
    if in_place and x.shape[1] == n:
        out = x
    else:
        out = x.new_empty(x.shape[0], n, *x.shape[2:])
        out[:, : x.shape[1]] = x
        out[:, x.shape[1] :].zero_()
    array = out.detach().numpy()
    transform = scipy_fft.idct if inverse else scipy_fft.dct
    result = transform(array, type=2, axis=1, norm="ortho", overwrite_x=True, workers=torch.get_num_threads())
    if result.ctypes.data != array.ctypes.data:  # SciPy may decline to work in place
        out.copy_(torch.from_numpy(result))
    return out


class PocketfftDCT(torch.autograd.Function):
    """:func:`dct_seq` through pocketfft: x (B, L, C) -> (B, n, C). The DCT is orthonormal, so the gradient of the
    zero-padded transform is the inverse transform cut to L."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, n: int) -> torch.Tensor:
        ctx.length = x.shape[1]
        return _pocketfft_transform(x, n, inverse=False)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return PocketfftIDCT.apply(grad, ctx.length), None


class PocketfftIDCT(torch.autograd.Function):
    """The first ``length`` samples of the inverse DCT through pocketfft: (B, n, C) -> (B, length, C); its gradient
    is the DCT of the zero-padded gradient."""

    @staticmethod
    def forward(ctx, spectrum: torch.Tensor, length: int) -> torch.Tensor:
        ctx.n = spectrum.shape[1]
        # A copy when cut, not a view: autograd forbids in-place updates of views made inside a Function.
        return _pocketfft_transform(spectrum, ctx.n, inverse=True)[:, :length].contiguous()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return PocketfftDCT.apply(grad, ctx.n), None


def _pocketfft_dct(x: torch.Tensor, n: int, in_place: bool = False) -> torch.Tensor:
    """``in_place`` without autograd transforms ``x`` itself (see :func:`_pocketfft_transform`)."""
    if torch.is_grad_enabled():
        return PocketfftDCT.apply(x, n)
    return _pocketfft_transform(x, n, inverse=False, in_place=in_place)


def _pocketfft_idct(spectrum: torch.Tensor, length: int, in_place: bool = False) -> torch.Tensor:
    """``in_place`` without autograd transforms ``spectrum`` itself (see :func:`_pocketfft_transform`)."""
    if torch.is_grad_enabled():
        return PocketfftIDCT.apply(spectrum, length)
    return _pocketfft_transform(spectrum, spectrum.shape[1], inverse=True, in_place=in_place)[:, :length]


def _select_rows(x: torch.Tensor, index: torch.Tensor, rows: int) -> torch.Tensor:
    """``x.index_select(1, index)`` for x (B, R, ...), as one gather of rows of the flattened tensor: on CPU
    a gather along axis 0 copies whole rows and runs several times faster than one along axis 1."""
    batch = x.shape[0]
    flat = x.reshape(batch * x.shape[1], *x.shape[2:])
    if batch > 1:
        index = (index + rows * torch.arange(batch, device=index.device).unsqueeze(1)).reshape(-1)
    return flat.index_select(0, index).view(batch, -1, *x.shape[2:])


def _makhoul_pairs(x: torch.Tensor, n: int) -> torch.Tensor:
    """Z (B, n // 2 + 1, C) complex with ``Re Z[k] = dct(x)[k]``, ``Im Z[k] = dct(x)[n - k]`` (see above)."""
    c = _makhoul_constants(n, x.dtype, x.device)
    if x.shape[1] < n:
        x = F.pad(x, (0, 0, 0, n - x.shape[1]))
    # In place even under autograd: rfft keeps no output and the twiddle is a constant.
    return torch.fft.rfft(_select_rows(x, c["gather"], n), dim=1).mul_(c["forward_twiddle"])


def _pairs_to_natural(z: torch.Tensor, n: int, magnitude: bool = False) -> torch.Tensor:
    """The DCT (B, n, C) in natural order from its pair form (or its magnitude, at no extra pass)."""
    c = _makhoul_constants(n, z.real.dtype, z.device)
    batch, half, channels = z.shape
    if torch.is_grad_enabled():
        parts = torch.view_as_real(z).transpose(2, 3)
        parts = (parts.abs() if magnitude else parts).contiguous()
    else:
        parts = z.real.new_empty(batch, half, 2, channels)
        source = torch.view_as_real(z).transpose(2, 3)
        if magnitude:
            torch.abs(source, out=parts)
        else:
            parts.copy_(source)
    return _select_rows(parts.view(batch, 2 * half, channels), c["natural"], 2 * half)


def to_pairs(spectrum: torch.Tensor, n: int) -> torch.Tensor:
    """A DCT-domain multiplier (..., n, C) in pair form (..., n // 2 + 1, 2, C): rows H[k] and H[n - k]."""
    c = _makhoul_constants(n, spectrum.dtype, spectrum.device)
    squeeze = spectrum.dim() == 2
    pairs = _select_rows(spectrum.unsqueeze(0) if squeeze else spectrum, c["pairs"], n)
    pairs = pairs.view(pairs.shape[0], n // 2 + 1, 2, spectrum.shape[-1])
    return pairs[0] if squeeze else pairs


# MKL writes a real FFT's output along axis 1 channel by channel, n numbers apart. For n a power of two every
# channel's row then falls into the same cache sets, and the row-major copy or gather that follows ran 3-6x
# slower than with a row pitch of n + 16.
FFT_ROW_PADDING = 16


def irfft_seq(spectrum: torch.Tensor, n: int) -> torch.Tensor:
    """``torch.fft.irfft(spectrum, n, dim=1)`` for spectrum (B, n // 2 + 1, C): (B, n, C). Without autograd on the
    CPU it comes back row-major: the channels are written ``n + FFT_ROW_PADDING`` apart, then copied into rows
    (``FFT_ROW_PADDING = 0`` turns this off)."""
    plain = torch.is_grad_enabled() or torch.compiler.is_compiling() or spectrum.device.type != "cpu"
    if plain or not FFT_ROW_PADDING:
        return torch.fft.irfft(spectrum, n=n, dim=1)
    batch, _, channels = spectrum.shape
    out = spectrum.real.new_empty(batch, channels, n + FFT_ROW_PADDING)[..., :n].transpose(1, 2)
    return torch.fft.irfft(spectrum, n=n, dim=1, out=out).contiguous()


def _pairs_inverse(z: torch.Tensor, n: int, length: int) -> torch.Tensor:
    """First ``length`` samples of the inverse DCT of the pair form ``z``; z is updated in place."""
    c = _makhoul_constants(n, z.real.dtype, z.device)
    z[:, :1].imag.zero_()  # the DCT has no X[n]; exact already, but irfft must not see rounding there
    signal = irfft_seq(z.mul_(c["inverse_twiddle"]), n)
    return _select_rows(signal, c["unorder"][:length], n)


def dct_seq(x: torch.Tensor, n: int, magnitude: bool = False, in_place: bool = False) -> torch.Tensor:
    """Orthonormal DCT-II along axis 1 of ``x`` (B, L, C), zero-padded to length n >= L: (B, n, C).
    ``magnitude=True`` returns its absolute value. ``in_place`` says that x is fresh and read by nothing else, so
    that without autograd the result may be written over it."""
    algorithm = dct_algorithm(x, n)
    if algorithm == "makhoul":
        return _pairs_to_natural(_makhoul_pairs(x, n), n, magnitude)
    if algorithm == "pocketfft":
        out = _pocketfft_dct(x, n, in_place)
    else:
        out = sequence_matmul(dct_matrix(n, x.dtype, x.device)[:, : x.shape[1]], x)
    if not magnitude:
        return out
    return out.abs() if torch.is_grad_enabled() else out.abs_()


def idct_seq(spectrum: torch.Tensor, length: int, accumulate: torch.Tensor | None = None) -> torch.Tensor:
    """First ``length`` samples of the orthonormal inverse DCT along axis 1 of ``spectrum`` (B, n, C).

    With ``accumulate`` (B, length, C) the result is added to it (in place when gradients are off)."""
    n = spectrum.shape[1]
    algorithm = dct_algorithm(spectrum, n)
    if algorithm == "matmul":
        inverse = dct_matrix(n, spectrum.dtype, spectrum.device)[:, :length].T  # D^T = D^-1
        return sequence_matmul(inverse, spectrum, accumulate=accumulate)
    if algorithm == "pocketfft":
        signal = _pocketfft_idct(spectrum, length)
    else:
        z = torch.view_as_complex(to_pairs(spectrum, n).transpose(2, 3).contiguous())
        signal = _pairs_inverse(z, n, length)
    if accumulate is None:
        return signal
    return accumulate + signal if torch.is_grad_enabled() else accumulate.add_(signal)


def transform_seq(
    x: torch.Tensor, n: int, transform: str, magnitude: bool = False, in_place: bool = False
) -> torch.Tensor:
    """The orthonormal transform T along axis 1 (see :func:`forward_transform`), zero-padded to length n;
    its absolute value with ``magnitude=True``. ``in_place`` as in :func:`dct_seq`."""
    if transform == "dct":
        return dct_seq(x, n, magnitude, in_place)
    spectrum = torch.fft.rfft(x, n=n, dim=1, norm="ortho")
    return spectrum.abs() if magnitude else spectrum


def prepare_multiplier(spectrum: torch.Tensor, transform: str, n: int) -> torch.Tensor:
    """A spectrum as :func:`convolve_seq` consumes it: unchanged, or in pair form for Makhoul's FFT-based DCT."""
    if transform == "dct" and dct_algorithm(spectrum, n) == "makhoul":
        return to_pairs(spectrum, n)
    return spectrum


def transform_layout(multiplier: torch.Tensor, transform: str, n: int) -> torch.Tensor:
    """A multiplier (..., C) in the memory layout of :func:`transform_seq`'s outputs, so that their product reads
    both in step: channel by channel as torch's real FFT returns them (see :data:`FFT_ROW_PADDING`), row-major for
    the DCT by pocketfft or GEMM. Against a row-major multiplier, a group of channels' product ran up to 4x slower."""
    if not transforms_channel_by_channel(multiplier, transform, n):
        return multiplier
    return multiplier.movedim(-1, 0).contiguous().movedim(0, -1)


def transforms_channel_by_channel(x: torch.Tensor, transform: str, n: int) -> bool:
    """Whether :func:`transform_seq` returns its output for tensors like x channel by channel (through torch's real
    FFT) rather than row-major (the DCT by pocketfft or GEMM)."""
    return not (transform == "dct" and dct_algorithm(x, n) != "makhoul")


def convolve_seq(
    x: torch.Tensor,
    multiplier: torch.Tensor,
    transform: str,
    n: int,
    accumulate: torch.Tensor | None = None,
    prepared: bool = False,
    in_place: bool = False,
) -> torch.Tensor:
    """``T^-1(T(x) * spectrum)`` along axis 1 for ``x`` (B, L, C) zero-padded to n; returns its first L
    samples, added to ``accumulate`` if given. The spectrum is (n, C) or (B, n, C) for the DCT and
    (n // 2 + 1, C) or (B, n // 2 + 1, C) for the FFT, as :func:`kernel_spectrum` gives per channel;
    ``prepared=True`` when it already went through :func:`prepare_multiplier`. ``in_place`` as in
    :func:`dct_seq`."""
    length = x.shape[1]
    grad = torch.is_grad_enabled()
    if not prepared:
        multiplier = prepare_multiplier(multiplier, transform, n)
    algorithm = dct_algorithm(x, n) if transform == "dct" else None
    if algorithm == "matmul":
        product = sequence_matmul(dct_matrix(n, x.dtype, x.device)[:, :length], x, multiply=multiplier)
        return idct_seq(product, length, accumulate)
    if algorithm == "pocketfft":
        product = _pocketfft_dct(x, n, in_place)
        product = product * multiplier if grad else product.mul_(multiplier)
        signal = _pocketfft_idct(product, length, in_place=True)
    elif algorithm == "makhoul":
        z = _makhoul_pairs(x, n)
        # Real parts times H[k], imaginary parts times H[n - k]: both operands walk their channels with unit
        # (or 2) stride, where a (half, C, 2) view of the pairs would stride by C and run several times slower.
        low, high = multiplier.select(-2, 0), multiplier.select(-2, 1)
        if grad:
            z = torch.complex(z.real * low, z.imag * high)
        else:
            z.real.mul_(low)
            z.imag.mul_(high)
        signal = _pairs_inverse(z, n, length)
    else:
        product = torch.fft.rfft(x, n=n, dim=1)
        product = product * multiplier if grad else product.mul_(multiplier)
        signal = torch.fft.irfft(product, n=n, dim=1)[:, :length]
    if accumulate is None:
        return signal
    return accumulate + signal if grad else accumulate.add_(signal)


# ---------------------------------------------------------------------------------------------
# Short convolutions
# ---------------------------------------------------------------------------------------------

# The operator mixes groups of channels of about this many elements per (B, N, group) tensor in turn
# (2 MiB in float32), and never fewer channels than the minimum, which keeps the GEMMs and vector loops wide.
# Without autograd, inputs of at least LONG_INPUT_TOKENS (B x N) run each group's transforms on halves of its
# channels, and its short convolution in place: no group's tensors are kept for backward, so this lowers the peak
# (at (1, 16384) from 66 to 59 MiB, the output's 48 included), while the input projection still reads the input
# once per full-size group.
CHANNEL_GROUP_ELEMENTS = 2**19
MIN_CHANNEL_GROUP = 32
LONG_INPUT_TOKENS = 8192
# The in-place short convolution works on chunks of positions of about this many elements.
SHORT_CONV_CHUNK_ELEMENTS = 2**18
# The in-place output projection works on chunks of tokens of about this many elements (4 MiB in float32): GEMMs
# of 1,365 tokens at d = 768 ran 6% faster than of 682, and the peak of a call comes earlier, while groups mix.
PROJECTION_CHUNK_ELEMENTS = 2**20

# Every step between the operator's projections acts on each channel alone, so its modules accept a subset
# of their channels: a slice, or an index tensor for the three gates of the input projection.
Channels = slice | torch.Tensor
ALL_CHANNELS = slice(None)


class ShortConv1d(nn.Module):
    """Depthwise Conv1d along the sequence, centred (a bidirectional encoder sees both neighbours).

    ``padding_mode="circular"`` keeps the convolution exactly shift-equivariant on the circle, which the
    FFT path needs for Sec. 3.2; ``"zeros"`` suits the DCT path and the frequency axis. Inputs are
    (B, L, C): the convolution runs as a channels-last 2-D depthwise convolution of height 1, which oneDNN
    computes in one pass without transposing the activations.
    """

    def __init__(self, channels: int, kernel_size: int, padding_mode: str = "zeros", bias: bool = True):
        super().__init__()
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"short convolution kernel_size must be a positive odd number, got {kernel_size}")
        self.kernel_size = kernel_size
        self.padding_mode = padding_mode
        self.conv = nn.Conv1d(channels, channels, kernel_size, groups=channels, bias=bias)

    def forward(self, x: torch.Tensor, wrap: bool = True, channels: Channels = ALL_CHANNELS) -> torch.Tensor:
        """x: (B, L, C) -> (B, L, C). ``wrap=False`` pads with zeros even in circular mode: a sequence shorter
        than the transform is zero-padded to it, so its circle closes over zeros. ``channels`` (a slice or an
        index tensor) says which of the layer's channels x holds."""
        pad = self.kernel_size // 2
        weight, bias = self._weights(x, channels)
        if self._wraps(x, wrap):
            return self._convolve(torch.cat([x[:, x.shape[1] - pad :], x, x[:, :pad]], dim=1), weight, bias, 0)
        return self._convolve(x, weight, bias, pad)

    def forward_in_place(self, x: torch.Tensor, wrap: bool = True, channels: Channels = ALL_CHANNELS) -> torch.Tensor:
        """:meth:`forward` written over x, without autograd, in chunks of positions: the output never exists
        beside its input. A chunk's output is written back after the next chunk, whose border it overwrites,
        has been computed."""
        pad = self.kernel_size // 2
        length = x.shape[1]
        chunk = max(SHORT_CONV_CHUNK_ELEMENTS // (x.shape[0] * x.shape[2]), pad + 1)
        if length <= chunk:
            return x.copy_(self(x, wrap, channels))
        weight, bias = self._weights(x, channels)
        if self._wraps(x, wrap):
            before, after = x[:, length - pad :].clone(), x[:, :pad].clone()
        else:
            before = after = x.new_zeros(x.shape[0], pad, x.shape[2])
        pending = None
        for start in range(0, length, chunk):
            stop = min(start + chunk, length)
            window = [x[:, max(start - pad, 0) : min(stop + pad, length)]]
            if start == 0:
                window.insert(0, before)
            if stop == length:
                window.append(after)
            out = self._convolve(torch.cat(window, dim=1) if len(window) > 1 else window[0], weight, bias, 0)
            if pending is not None:
                x[:, pending[0]] = pending[1]
            pending = (slice(start, stop), out)
        x[:, pending[0]] = pending[1]
        return x

    def _weights(self, x: torch.Tensor, channels: Channels) -> tuple[torch.Tensor, torch.Tensor | None]:
        # Weights follow the input's dtype: the conditioning network runs in float32 inside bf16 models.
        weight = self.conv.weight[channels].to(x.dtype).unsqueeze(2)  # (C, 1, 1, k)
        bias = None if self.conv.bias is None else self.conv.bias[channels].to(x.dtype)
        return weight, bias

    def _wraps(self, x: torch.Tensor, wrap: bool) -> bool:
        pad = self.kernel_size // 2
        return pad > 0 and wrap and self.padding_mode == "circular" and x.shape[1] >= pad

    @staticmethod
    def _convolve(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, pad: int) -> torch.Tensor:
        image = x.transpose(1, 2).unsqueeze(2)  # (B, C, 1, L): a channels-last view, no copy
        out = F.conv2d(image, weight, bias, padding=(0, pad), groups=weight.shape[0])
        return out.squeeze(2).transpose(1, 2)


class ShortConvStack(nn.Module):
    """``depth`` depthwise convolutions in a row (App. C.1 uses 1, and 3 for the hardest recall task).

    With a mask (B, L, 1), masked positions are zeroed before each convolution, so that padding never
    leaks into real positions.
    """

    def __init__(self, channels: int, kernel_size: int, depth: int, padding_mode: str):
        super().__init__()
        self.layers = nn.ModuleList(ShortConv1d(channels, kernel_size, padding_mode) for _ in range(depth))

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, wrap: bool = True, channels: Channels = ALL_CHANNELS
    ) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x if mask is None else x * mask, wrap, channels)
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


def kernel_lags(n: int, transform: str) -> torch.Tensor:
    """The lag of each index of a length-n kernel, as :func:`kernel_spectrum` reads it. FFT: the signed lags of a
    circular kernel, 0, 1, ..., then -n/2 ... -1. DCT: 0 .. n-1, each standing for +-m of an even kernel."""
    index = torch.arange(n, dtype=torch.float32, device="cpu")
    if transform == "dct":
        return index
    return torch.where(index <= n // 2, index, index - n)


def lag_embedding(n: int, emb_dim: int, transform: str) -> torch.Tensor:
    """PosEmb(t) of Remark 3.2: the lag itself and ``(emb_dim - 1) / 2`` sinusoid pairs, shape (n, emb_dim)."""
    t = (kernel_lags(n, transform) / max(n, 1)).unsqueeze(-1)  # in [-1/2, 1/2] (FFT) or [0, 1) (DCT)
    bands = (emb_dim - 1) // 2
    # Built on the CPU explicitly: transformers may construct the model under a meta-device context.
    frequencies = torch.linspace(1e-4, bands - 1, bands, device="cpu").unsqueeze(0)
    angle = 2 * math.pi * t * frequencies
    features = [t, torch.cos(angle), torch.sin(angle)]
    if 1 + 2 * bands < emb_dim:
        features.append(torch.zeros(n, emb_dim - 1 - 2 * bands, device="cpu"))
    return torch.cat(features, dim=-1)


class ImplicitLongFilter(nn.Module):
    """A static long kernel ``h0 = FFN(PosEmb(t)) * decay(t)`` over the lags of the transform (Remark 3.2).

    The FFN is ``Linear -> Sin -> (Linear -> Sin) x depth -> Linear`` (Hyena's implicit filter); the
    exponential decay ``exp(-|t| * rate_c)`` spans fast to slow rates across channels, so that some
    channels stay local and others reach the whole sequence. The kernel looks both ways, as a bidirectional
    encoder should: under the FFT its lags are signed and circular, under the DCT they are 0 .. N-1 of an
    even kernel (:func:`kernel_lags`). ``skip`` is Hyena's ``D`` term, ``y += D * x``.

    ``spectrum="listing1"`` reproduces the authors' code under the DCT instead: the kernel laid out on circular
    lags, and ``dct(h0)`` as the multiplier. That is not the spectrum of a convolution with h0 (an impulse is
    scaled by 1 / sqrt(2N), and the taps at negative lags couple each position with its mirror image), but it is
    the parameterisation the paper's results were obtained with.
    """

    def __init__(
        self,
        channels: int,
        length: int,
        transform: str = "dct",
        emb_dim: int = 5,
        width: int = 64,
        depth: int = 1,
        sin_frequency: float = 1.0,
        decay: bool = True,
        fast_decay_pct: float = 0.3,
        slow_decay_pct: float = 1.5,
        decay_target: float = 1e-2,
        spectrum: str = "listing1",
    ):
        super().__init__()
        if spectrum not in FILTER_SPECTRA:
            raise ValueError(f"filter spectrum must be one of {FILTER_SPECTRA}, got {spectrum!r}")
        if emb_dim < 1 or width < 1:
            raise ValueError(f"implicit filter needs emb_dim >= 1 and width >= 1, got {emb_dim} and {width}")
        if transform not in TRANSFORMS:
            raise ValueError(f"transform must be one of {TRANSFORMS}, got {transform!r}")
        self.channels = channels
        self.length = length
        self.transform = transform
        self.listing1 = transform == "dct" and spectrum == "listing1"
        self.lag_layout = "fft" if self.listing1 else transform  # which transform's lags index the kernel
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
        return lag_embedding(self.length, self.emb_dim, self.lag_layout)

    def make_envelope(self) -> torch.Tensor:
        """exp(-|t| * rate_c), (length, channels); |t| is the lag over the kernel length, so the decay
        profile does not depend on max_len."""
        if not self.decay:
            return torch.ones(self.length, self.channels, device="cpu")
        rates = torch.linspace(*self.decay_rates, self.channels, device="cpu")
        lags = kernel_lags(self.length, self.lag_layout).abs().unsqueeze(-1)
        return torch.exp(-lags / max(self.length, 1) * rates)

    def forward(self) -> torch.Tensor:
        """The kernel in the time domain, shape (channels, length)."""
        return self.kernel_seq().transpose(0, 1)

    def hidden_features(self) -> torch.Tensor:
        """The FFN's features before its last layer, (length, width)."""
        return self.ffn[:-1](self.lag_features)

    def kernel_seq(self, channels: slice = ALL_CHANNELS, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """The kernel of the given channels in the operator's layout, (length, channels). The FFN's last layer
        maps its hidden features to each channel alone, so a slice of channels needs only its rows; ``hidden``
        passes :meth:`hidden_features` computed once for several slices."""
        hidden = self.hidden_features() if hidden is None else hidden
        return F.linear(hidden, self.ffn[-1].weight[channels]) * self.envelope[:, channels]

    def spectrum(self, dtype: torch.dtype) -> torch.Tensor:
        """The multiplier of ``h0 * x + skip * x`` in ``dtype``, (channels, length or length // 2 + 1): the
        skip term is an impulse of height ``skip``, whose spectrum is that constant under both transforms."""
        return self.spectrum_seq(dtype).transpose(0, 1)

    def spectrum_seq(
        self, dtype: torch.dtype, channels: slice = ALL_CHANNELS, hidden: torch.Tensor | None = None
    ) -> torch.Tensor:
        """:meth:`spectrum` transposed, (length or length // 2 + 1, channels): the operator's layout, for all
        channels or a slice of them (``hidden`` as in :meth:`kernel_seq`)."""
        kernel = self.kernel_seq(channels, hidden).to(dtype)
        skip = self.skip[channels].to(dtype)
        if self.listing1:
            return dct_seq(kernel.unsqueeze(0), self.length)[0] + skip
        return kernel_spectrum(kernel, self.transform, dim=0) + skip


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

    def forward(
        self, u: torch.Tensor, n: int, mask: torch.Tensor | None = None, channels: Channels = ALL_CHANNELS
    ) -> torch.Tensor:
        """u: (B, L, C) with masked positions zero, mask (B, L, 1) or None; the spectrum of the kernel for
        transform length n >= L, (B, n, C) for the DCT and (B, n // 2 + 1, C) for the FFT. Each channel is
        independent: ``channels`` says which of the network's channels u holds."""
        wrap = u.shape[1] == n  # a shorter sequence is zero-padded to n: its circle closes over zeros
        # The time features are new tensors, which the transforms may overwrite, unless there is no layer to make them.
        fresh = mask is not None or len(self.time_conv.layers) > 0
        key = self._time_features(self.time_conv, u, mask, wrap, channels)
        if self.conditioning == "abs":
            spectrum = transform_seq(key, n, self.transform, magnitude=True, in_place=fresh)
            return self.freq_conv(spectrum, channels=channels)
        key_spectrum = transform_seq(key, n, self.transform, in_place=fresh)
        query = self._time_features(self.query_conv, u, mask, wrap, channels)
        query_spectrum = transform_seq(query, n, self.transform, in_place=fresh)
        if self.activation != "identity":
            magnitude = query_spectrum.abs()
            query_spectrum = query_spectrum * (
                magnitude_activation(self.activation, magnitude) / magnitude.clamp_min(1e-12)
            )
        product = key_spectrum.conj() * query_spectrum
        if torch.is_complex(product):
            # Real depthwise convolution over frequency, on the real and imaginary parts alike.
            real = self.freq_conv(product.real, channels=channels)
            return torch.complex(real, self.freq_conv(product.imag, channels=channels))
        return self.freq_conv(product, channels=channels)

    @staticmethod
    def _time_features(
        stack: ShortConvStack, u: torch.Tensor, mask: torch.Tensor | None, wrap: bool, channels: Channels
    ) -> torch.Tensor:
        features = stack(u, mask, wrap, channels)
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
        filter_spectrum: str = "listing1",
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
        if filter_spectrum not in FILTER_SPECTRA:
            raise ValueError(f"filter_spectrum must be one of {FILTER_SPECTRA}, got {filter_spectrum!r}")
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

        self.in_proj = Linear(d_model, 3 * d_model, bias=bias)
        self.short_conv = ShortConv1d(3 * d_model, short_conv_size, short_padding)
        filter_settings = (transform, filter_emb_dim, filter_width, filter_depth, filter_sin_frequency, filter_decay)
        long_filter = functools.partial(
            ImplicitLongFilter, d_model, max_len, *filter_settings, spectrum=filter_spectrum
        )
        self.static_filter = long_filter()
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
        self.residual_filter = long_filter() if residual_long_conv else None
        self.out_proj = Linear(d_model, d_model, bias=bias)
        self._spectrum_cache: dict = {}

    def forward(
        self,
        x: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        conditioning_input: torch.Tensor | None = None,
        conditioning_mask: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x: (B, L, d); attention_mask: (B, L) with 1 for real tokens; returns (B, L, d).

        ``conditioning_input`` u (B, L_u, d), L_u <= max_len, makes the kernel h_theta(u) instead of
        h_theta(v) (Remark 3.3); ``conditioning_mask`` (B, L_u) marks its real positions.

        ``out``, a tensor like x that nothing reads any more, lends its memory to the result where the channel
        groups are written into one output (without autograd, on long inputs); the result is then ``out``. The
        encoder passes the output of the layer before last, so that each layer does not map fresh memory.
        """
        batch, length = self._check_input("x", x, attention_mask)
        if out is not None and (out.shape != x.shape or out.dtype != x.dtype or out.device != x.device):
            raise ValueError(
                f"out must be like x: got {tuple(out.shape)} {out.dtype} on {out.device}, x is {tuple(x.shape)} "
                f"{x.dtype} on {x.device}"
            )
        if out is not None and out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
            raise ValueError("out shares its memory with x, which every channel group reads")
        if conditioning_input is not None:
            conditioning_batch, _ = self._check_input("conditioning_input", conditioning_input, conditioning_mask)
            if conditioning_batch != batch:
                raise ValueError(f"conditioning_input has batch size {conditioning_batch}, x has {batch}")
        mask = self._mask(attention_mask, x.dtype)  # (B, L, 1) or None
        # Transforms in float32 at least: torch.fft has no bfloat16, and fp16 only for powers of two.
        compute_dtype = torch.promote_types(x.dtype, torch.float32)
        with torch.autocast(device_type=x.device.type, enabled=False):
            # Multipliers in the layout the convolution consumes (pairs for the FFT-based DCT).
            static = self._filter_spectrum("static", self.static_filter, compute_dtype)
            residual = None
            if self.residual_filter is not None:
                residual = self._filter_spectrum("residual", self.residual_filter, compute_dtype)
        # Everything between the two projections acts on each channel alone. Groups of channels whose
        # intermediates stay small run one after the other: their tensors stay in cache, and the allocator
        # reuses their memory instead of mapping fresh pages (a 16K x 768 float32 tensor is 48 MiB).
        groups = self.channel_groups(batch)
        mix = functools.partial(
            self._mix_channels,
            x,
            mask=mask,
            static=static,
            residual=residual,
            conditioning_input=conditioning_input,
            conditioning_mask=conditioning_mask,
            compute_dtype=compute_dtype,
        )
        if not self.writes_groups_into_one_output(batch):
            y = mix(groups[0]) if len(groups) == 1 else torch.cat([mix(channels) for channels in groups], dim=-1)
        else:  # each group written into place, so the groups' outputs never exist twice
            y = out if out is not None and out.dtype == compute_dtype else x.new_empty(x.shape, dtype=compute_dtype)
            for channels in groups:
                mix(channels, out=y)
            if y.dtype == x.dtype:
                return self._project_out_in_place(y)
        return self.out_proj(y.to(x.dtype))

    def _project_out_in_place(self, y: torch.Tensor) -> torch.Tensor:
        """``out_proj(y)`` written over y, a few tokens at a time (it acts on each token alone), so that the
        output never exists beside its input: on long inputs it is the largest tensor of a call."""
        tokens = y.view(-1, self.d_model)
        rows = max(1, PROJECTION_CHUNK_ELEMENTS // self.d_model)
        for start in range(0, tokens.shape[0], rows):
            chunk = tokens[start : start + rows]
            chunk.copy_(self.out_proj(chunk))
        return y

    def writes_groups_into_one_output(self, batch: int) -> bool:
        """Whether :meth:`forward` writes its channel groups into one output (and so into a lent ``out``): without
        autograd or compilation, with more than one group."""
        grad = torch.is_grad_enabled() or torch.compiler.is_compiling()
        return not grad and len(self.channel_groups(batch)) > 1

    def channel_groups(self, batch: int) -> list[slice]:
        """Consecutive channel ranges of about ``CHANNEL_GROUP_ELEMENTS / (batch * max_len)`` channels."""
        width = CHANNEL_GROUP_ELEMENTS // (batch * self.max_len) // MIN_CHANNEL_GROUP * MIN_CHANNEL_GROUP
        width = max(width, MIN_CHANNEL_GROUP)
        if 4 * width > self.d_model:  # fewer than four groups would save little and cost the copies
            return [ALL_CHANNELS]
        return [slice(start, min(start + width, self.d_model)) for start in range(0, self.d_model, width)]

    def transform_parts(self, width: int, batch: int) -> list[slice]:
        """The runs of a group's ``width`` channels whose transforms run together: halves without autograd from
        ``LONG_INPUT_TOKENS`` on (see ``CHANNEL_GROUP_ELEMENTS``), else the whole group."""
        if torch.is_grad_enabled() or torch.compiler.is_compiling() or batch * self.max_len < LONG_INPUT_TOKENS:
            return [slice(0, width)]
        half = max(-(-width // 2), 1)
        return [slice(start, min(start + half, width)) for start in range(0, width, half)]

    def _mix_channels(
        self,
        x: torch.Tensor,
        channels: slice,
        mask: torch.Tensor | None,
        static: torch.Tensor,
        residual: torch.Tensor | None,
        conditioning_input: torch.Tensor | None,
        conditioning_mask: torch.Tensor | None,
        compute_dtype: torch.dtype,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """``s2 * (h * (s1 * v)) [+ h_res * x]`` for the given channels, masked: (B, L, channels). Without autograd
        it can write into ``out[..., channels]`` instead (and returns None), a part of the channels at a time."""
        n = self.max_len
        # A sequence shorter than the transform is zero-padded to it (inside the transforms, never
        # materialised): its circle closes over zeros, so circular padding becomes zero padding.
        wrap = x.shape[1] == n
        # In-place updates below touch only fresh tensors that no backward formula keeps; products with
        # tensors that need gradients stay out of place while autograd records.
        grad = torch.is_grad_enabled()
        rows = self._projection_rows(channels)  # in_proj's rows of s1, s2 and v for these channels
        projected = self._masked(linear(x, *linear_rows(self.in_proj, rows)), mask, inplace=True)
        width = projected.shape[-1] // 3
        first = range(self.d_model)[channels].start
        parts = self.transform_parts(width, x.shape[0]) if out is not None else [slice(0, width)]
        parts_channels = [slice(first + part.start, first + part.stop) for part in parts]  # the layer's channels
        # The kernels first: h_theta reads v before the short convolution, and building them before the
        # convolution's output exists lowers the peak memory of a call by about a quarter.
        spectra = []
        with torch.autocast(device_type=x.device.type, enabled=False):
            for part, part_channels in zip(parts, parts_channels):
                # v of this part, sliced in the call: a view kept in a variable would keep all of `projected`.
                spectra.append(
                    self._kernel_multiplier(
                        projected[..., 2 * width + part.start : 2 * width + part.stop],
                        part_channels,
                        static,
                        mask,
                        conditioning_input,
                        conditioning_mask,
                        compute_dtype,
                    )
                )
        if len(parts) > 1:
            gated = self.short_conv.forward_in_place(projected, wrap, rows)
        else:
            gated = self.short_conv(projected, wrap, rows)
        del projected
        for part, part_channels in zip(parts, parts_channels):
            spectrum = spectra.pop(0)  # dropped once used: the next part's transforms reuse its memory
            s1, s2, v = [gated[..., k * width + part.start : k * width + part.stop] for k in range(3)]
            with torch.autocast(device_type=x.device.type, enabled=False):
                # The gated tensor is fresh: without autograd the product goes into s1's place.
                u = self._masked((s1 * v if grad else s1.mul_(v)).to(compute_dtype), mask, inplace=True)
                y = convolve_seq(u, spectrum, self.transform, n, prepared=True, in_place=not grad)
                del u, spectrum
                y = y * s2 if grad else y.mul_(s2)
                if residual is not None:
                    # Never in place: x is the caller's. A group's channels are a strided view of x, which the
                    # transform's first step (a gather or a GEMM) reads as it is.
                    block_input = self._masked(x[..., part_channels].to(compute_dtype), mask)
                    y = convolve_seq(
                        block_input, residual[..., part_channels], self.transform, n, accumulate=y, prepared=True
                    )
                y = self._masked(y, mask, inplace=True)
            if out is None:
                return y
            out[..., part_channels] = y
            del y
        return None

    def _kernel_multiplier(
        self,
        value: torch.Tensor,
        channels: slice,
        static: torch.Tensor,
        mask: torch.Tensor | None,
        conditioning_input: torch.Tensor | None,
        conditioning_mask: torch.Tensor | None,
        compute_dtype: torch.dtype,
    ) -> torch.Tensor:
        """The multiplier of h = h0 + h_theta for these channels, from v before the short convolution."""
        spectrum = static[..., channels]
        if self.conditioning is None:
            return spectrum
        data = self._data_spectrum(value, mask, channels, conditioning_input, conditioning_mask, compute_dtype)
        data = prepare_multiplier(data, self.transform, self.max_len)
        # The frequency convolution or gather that made `data` keeps its input, not its output.
        return data.add_(spectrum) if data.dtype == spectrum.dtype else data + spectrum

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

    @staticmethod
    def _mask(attention_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
        """(B, L, 1) in ``dtype``, broadcasting over channels; None when every position is real."""
        return None if attention_mask is None else attention_mask.to(dtype).unsqueeze(-1)

    @staticmethod
    def _masked(x: torch.Tensor, mask: torch.Tensor | None, inplace: bool = False) -> torch.Tensor:
        """Masked positions set to zero; ``inplace`` only for a fresh tensor that its producer does not keep."""
        if mask is None:
            return x
        return x.mul_(mask) if inplace else x * mask.to(x.dtype)

    def _filter_spectrum(self, name: str, long_filter: ImplicitLongFilter, dtype: torch.dtype) -> torch.Tensor:
        """T(h0) + skip of a static filter, (N or N//2+1, d), prepared for convolve_seq. Without gradients
        it is computed once and reused until a parameter of the filter changes: eval mode pays for the
        filter's FFN and transform once, not on every call. It is then built a channel group at a time, which at
        (1, 16384) lowers a first call's peak from 240.6 to 164.6 MiB."""
        # The residual's multiplier (and the static one without a data-dependent part to meet first) multiplies
        # the transform's output directly: in its layout.
        direct = name == "residual" or self.conditioning is None
        # Not cached under autograd or compilation, nor for parameters made under inference_mode: those have no
        # version counter to tell their updates apart.
        made_in_inference = (p.is_inference() for p in long_filter.parameters())
        if torch.is_grad_enabled() or torch.compiler.is_compiling() or any(made_in_inference):
            return self._build_filter_spectrum(long_filter, [ALL_CHANNELS], dtype, direct)
        key = (dtype, MATMUL_DCT_MAX_LEN, POCKETFFT_DCT, *map(parameter_state, long_filter.parameters()))
        cached = self._spectrum_cache.get(name)
        if cached is None or cached[0] != key:
            cached = (key, self._build_filter_spectrum(long_filter, self.channel_groups(batch=1), dtype, direct))
            self._spectrum_cache[name] = cached
        return cached[1]

    def _build_filter_spectrum(
        self, long_filter: ImplicitLongFilter, groups: list[slice], dtype: torch.dtype, direct: bool
    ) -> torch.Tensor:
        """A static filter's multiplier prepared for convolve_seq, laid out like the transform's output where it
        meets it ``direct``-ly. With several channel groups it is built a group at a time into its final layout
        (without autograd): the intermediates of a whole filter (its kernel, transform and reorderings, each the size
        of the result) never exist at once."""
        hidden = long_filter.hidden_features()

        def prepared(channels: slice) -> torch.Tensor:
            spectrum = long_filter.spectrum_seq(dtype, channels, hidden)
            return prepare_multiplier(spectrum, self.transform, self.max_len)

        if len(groups) == 1:
            multiplier = prepared(groups[0])
            return transform_layout(multiplier, self.transform, self.max_len) if direct else multiplier
        multiplier = None
        for channels in groups:
            part = prepared(channels)
            if multiplier is None:
                # The dimensions from outermost to innermost in memory, as the whole filter would have them.
                last = part.dim() - 1
                if direct and transforms_channel_by_channel(part, self.transform, self.max_len):
                    order = [last, *range(last)]  # channels outermost, as transform_layout lays them out
                else:  # as the part comes: channel by channel from torch's real FFT, else row-major
                    order = sorted(range(part.dim()), key=part.stride, reverse=True)
                shape = [self.d_model if dim == last else part.shape[dim] for dim in order]
                multiplier = part.new_empty(shape).permute([order.index(dim) for dim in range(part.dim())])
            multiplier[..., channels] = part
        return multiplier

    def _projection_rows(self, channels: slice) -> Channels:
        """The rows of in_proj (and of the short convolution) that hold s1, s2 and v of these channels."""
        if channels == ALL_CHANNELS:
            return ALL_CHANNELS
        index = torch.arange(channels.start, channels.stop, device=self.in_proj.weight.device)
        return torch.cat([index, index + self.d_model, index + 2 * self.d_model])

    def _data_spectrum(
        self,
        value: torch.Tensor,
        mask: torch.Tensor | None,
        channels: slice,
        conditioning_input: torch.Tensor | None,
        conditioning_mask: torch.Tensor | None,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        """h_theta^F of v, or of the cross-conditioning sequence u projected like v (Remark 3.3), for the
        given channels."""
        source, source_mask = value, mask
        if conditioning_input is not None:
            rows = range(self.d_model)[channels]
            rows = slice(2 * self.d_model + rows.start, 2 * self.d_model + rows.stop)
            # Zero-padded to the transform length, which Remark 3.3 reads as interpolation in frequency.
            source = linear(conditioning_input, *linear_rows(self.in_proj, rows))
            source_mask = self._mask(conditioning_mask, source.dtype)
            source = self._masked(source, source_mask, inplace=True)
        source_mask = None if source_mask is None else source_mask.to(dtype)
        return self.conditioning(source.to(dtype), self.max_len, source_mask, channels)

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
        if not torch.is_grad_enabled() and self._direct_ok(x):
            return self._forward_direct(x.reshape(-1, self.in_features)).view(*leading, self.out_features)
        blocks = x.reshape(-1, self.num_blocks, self.in_features // self.num_blocks).transpose(0, 1)
        y = torch.bmm(blocks, self.weight.transpose(1, 2)).transpose(0, 1).reshape(*leading, self.out_features)
        return y if self.bias is None else y + self.bias

    def _direct_ok(self, x: torch.Tensor) -> bool:
        return (
            x.dtype == self.weight.dtype
            and not torch.is_autocast_enabled(x.device.type)
            and not torch.compiler.is_compiling()
        )

    def _forward_direct(self, x: torch.Tensor) -> torch.Tensor:
        """Without autograd: oneDNN per block where it applies; else each block's GEMM reads its column slice of
        x and writes its column slice of the output (BLAS leading dimensions), so nothing is transposed."""
        if onednn_linear_applies(x, self.weight):
            blocks = range(self.num_blocks)
            return torch.cat([onednn_linear(self.block_input(i, x), *self.block_parameters(i)) for i in blocks], -1)
        block_out = self.out_features // self.num_blocks
        out = x.new_empty(x.shape[0], self.out_features)
        for i in range(self.num_blocks):
            weight, bias = self.block_parameters(i)
            target = out[:, i * block_out : (i + 1) * block_out]
            if bias is None:
                torch.mm(self.block_input(i, x), weight.T, out=target)
            else:
                torch.addmm(bias, self.block_input(i, x), weight.T, out=target)
        return out

    def block_input(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """The slice of the input features (last axis of x) that block i reads."""
        width = self.in_features // self.num_blocks
        return x[..., i * width : (i + 1) * width]

    def block_parameters(self, i: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """W_i (out_features / b, in_features / b), packed where :func:`packs_weights`, and the bias of block i's
        outputs."""
        width = self.out_features // self.num_blocks
        weight = packed_rows(self.weight, (i,), lambda: self.weight[i])
        return weight, None if self.bias is None else self.bias[i * width : (i + 1) * width]

    def output_slice(
        self, x: torch.Tensor, start: int, stop: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The input slice, weight rows and bias that give output features [start, stop), which lie in one block."""
        width = self.out_features // self.num_blocks
        i = start // width
        if stop > (i + 1) * width:
            raise ValueError(f"output features [{start}, {stop}) span more than one block of {width}")
        rows = slice(start - i * width, stop - i * width)
        weight = packed_rows(self.weight, (i, rows.start, rows.stop), lambda: self.weight[i, rows])
        bias = None if self.bias is None else self.bias[start:stop]
        return self.block_input(i, x), weight, bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, num_blocks={self.num_blocks}"
