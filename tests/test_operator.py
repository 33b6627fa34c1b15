"""The Orchid operator against the paper's properties: exact convolution, orthonormal DCT, shift
equivariance (Sec. 3.2, App. B), padding invariance, gradients, and clear errors."""

import numpy as np
import pytest
import scipy.fft
import torch
import torch.nn.functional as F
from orchid_hf.modeling import orchid_layers
from orchid_hf.modeling.orchid_layers import (
    ALL_CHANNELS,
    CONDITIONING_ACTIVATIONS,
    ImplicitLongFilter,
    apply_spectrum,
    convolve_seq,
    dct,
    idct,
    long_convolution,
    prepare_multiplier,
)

from orchid_hf import BlockDiagonalLinear, OrchidOperator

LENGTHS = [1, 2, 3, 5, 8, 17, 64, 100, 128, 129]


@pytest.fixture(autouse=True, params=["channels together", "channels in groups"])
def channel_groups(request, monkeypatch):
    """Every test runs twice: all channels in one group, and one channel per group, which is how long inputs run
    (in groups of 32 channels and more); there the output projection also goes a token at a time."""
    if request.param == "channels in groups":
        monkeypatch.setattr(orchid_layers, "CHANNEL_GROUP_ELEMENTS", 1)
        monkeypatch.setattr(orchid_layers, "MIN_CHANNEL_GROUP", 1)
        monkeypatch.setattr(orchid_layers, "PROJECTION_CHUNK_ELEMENTS", 1)
    return request.param


@pytest.fixture(autouse=True, params=["pocketfft DCT", "torch DCT"])
def dct_in_torch_or_pocketfft(request, monkeypatch):
    """Every test runs with the DCT through pocketfft, as on the CPU, and through torch, as on a GPU: a GEMM up to
    MATMUL_DCT_MAX_LEN, Makhoul's FFT algorithm beyond."""
    monkeypatch.setattr(orchid_layers, "POCKETFFT_DCT", request.param == "pocketfft DCT")
    return request.param


def direct_circular_convolution(x: np.ndarray, h: np.ndarray) -> np.ndarray:
    """y[t] = sum_s h[(t - s) mod N] x[s], the O(N^2) definition."""
    n = x.shape[-1]
    y = np.zeros_like(x)
    for t in range(n):
        for s in range(n):
            y[..., t] += h[..., (t - s) % n] * x[..., s]
    return y


def direct_symmetric_convolution(x: np.ndarray, h: np.ndarray) -> np.ndarray:
    """y[t] = sum_s x[s] (h_e[t - s] + h_e[t + s + 1]): x mirrored about its start, convolved with the even kernel
    h_e[m] = h[|m|] for |m| < N, h_e[N] = 0, period 2N. The O(N^2) definition of the DCT's convolution."""
    n = x.shape[-1]

    def even(m):
        m = m % (2 * n)
        return np.zeros_like(h[..., 0]) if m == n else h[..., min(m, 2 * n - m)]

    y = np.zeros_like(x)
    for t in range(n):
        for s in range(n):
            y[..., t] += (even(t - s) + even(t + s + 1)) * x[..., s]
    return y


# ---------------------------------------------------------------------------------------------
# Transforms and the long convolution
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", LENGTHS)
def test_fft_long_convolution_equals_direct_circular_convolution(n):
    x = torch.randn(2, 3, n)
    h = torch.randn(3, n)
    expected = direct_circular_convolution(x.double().numpy(), h.double().numpy())
    got = long_convolution(x, h, "fft").double().numpy()
    np.testing.assert_allclose(got, expected, atol=1e-5 * max(1.0, np.abs(expected).max()), rtol=0)


@pytest.mark.parametrize("n", LENGTHS)
def test_dct_long_convolution_equals_direct_symmetric_convolution(n):
    x = torch.randn(2, 3, n, dtype=torch.float64)
    h = torch.randn(3, n, dtype=torch.float64)
    expected = direct_symmetric_convolution(x.numpy(), h.numpy())
    np.testing.assert_allclose(long_convolution(x, h, "dct").numpy(), expected, atol=1e-10, rtol=0)


@pytest.mark.parametrize("transform", ["dct", "fft"])
def test_kernels_keep_their_gain_under_both_transforms(transform):
    # An impulse is the identity and a kernel at lag +-1 averages the neighbours with weight h[1], for both
    # transforms alike (inside the sequence; the DCT reflects at its start, the FFT wraps around).
    n = 16
    x = torch.randn(3, n, dtype=torch.float64)
    impulse = torch.zeros(n, dtype=torch.float64)
    impulse[0] = 1.0
    torch.testing.assert_close(long_convolution(x, impulse, transform), x, atol=1e-12, rtol=0)
    neighbours = torch.zeros(n, dtype=torch.float64)
    neighbours[1] = 0.5
    if transform == "fft":
        neighbours[-1] = 0.5  # lag -1 of a circular kernel
    y = long_convolution(x, neighbours, transform)
    torch.testing.assert_close(y[:, 1:-1], 0.5 * (x[:, :-2] + x[:, 2:]), atol=1e-12, rtol=0)


@pytest.mark.parametrize("transform", ["dct", "fft"])
@pytest.mark.parametrize("n", [17, 128, 129, 300])
def test_static_filter_multiplier_convolves_with_its_kernel(transform, n):
    # The operator's path (sequence axis; one GEMM for the DCT up to 128, Makhoul's algorithm beyond) against a
    # direct convolution with the filter's own kernel h0 plus the skip term.
    long_filter = ImplicitLongFilter(3, n, transform, spectrum="convolution").double()
    with torch.no_grad():
        long_filter.ffn[-1].weight.mul_(10.0)  # a kernel well above the skip term, so a wrong one shows
    x = torch.randn(2, n - 3, 3, dtype=torch.float64)
    multiplier = prepare_multiplier(long_filter.spectrum_seq(torch.float64), transform, n)
    got = convolve_seq(x, multiplier, transform, n, prepared=True)
    padded = np.pad(x.transpose(1, 2).numpy(), ((0, 0), (0, 0), (0, 3)))
    kernel = long_filter().detach().numpy()
    direct = direct_symmetric_convolution if transform == "dct" else direct_circular_convolution
    expected = direct(padded, kernel) + long_filter.skip.detach().numpy()[:, None] * padded
    np.testing.assert_allclose(got.detach().transpose(1, 2).numpy(), expected[..., : n - 3], atol=1e-9, rtol=0)


def test_listing1_filter_spectrum_is_the_dct_of_the_circular_kernel():
    # The default, the authors' parameterisation: dct(h0) of a kernel on circular lags.
    long_filter = ImplicitLongFilter(3, 16, "dct").double()
    kernel, skip = long_filter().detach(), long_filter.skip.detach()
    expected = dct(kernel) + skip[:, None]
    torch.testing.assert_close(long_filter.spectrum(torch.float64).detach(), expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(long_filter.spectrum_seq(torch.float64).detach(), expected.T, atol=1e-12, rtol=0)
    assert long_filter.envelope[-1, 0] > long_filter.envelope[8, 0]  # circular: lag -1 sits at the end
    # Under the FFT there is nothing to choose: both give the exact circular convolution.
    torch.manual_seed(0)
    fft_listing1 = OrchidOperator(4, 12, transform="fft", filter_spectrum="listing1")
    torch.manual_seed(0)
    fft_convolution = OrchidOperator(4, 12, transform="fft", filter_spectrum="convolution")
    x = torch.randn(2, 12, 4)
    torch.testing.assert_close(fft_listing1(x), fft_convolution(x), atol=0, rtol=0)
    with pytest.raises(ValueError, match="filter_spectrum must be one of"):
        OrchidOperator(4, 12, filter_spectrum="dft")


def test_dct_filter_lags_run_forward_and_decay():
    # Under the DCT, index m of the kernel is the lag +-m: the envelope must decay along the whole kernel,
    # not rise again towards its end as the circular FFT layout does.
    dct_filter = ImplicitLongFilter(4, 64, "dct", spectrum="convolution")
    fft_filter = ImplicitLongFilter(4, 64, "fft")
    assert torch.all(dct_filter.envelope[1:] < dct_filter.envelope[:-1])
    assert fft_filter.envelope[-1, 0] > fft_filter.envelope[32, 0]
    with pytest.raises(ValueError, match="transform"):
        ImplicitLongFilter(4, 64, "dst")


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_dct_matches_scipy_and_inverse_round_trips(n, dtype):
    x = torch.randn(4, 3, n, dtype=dtype)
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    reference = scipy.fft.dct(x.double().numpy(), norm="ortho", axis=-1)
    np.testing.assert_allclose(dct(x).double().numpy(), reference, atol=tolerance)
    np.testing.assert_allclose(
        idct(x).double().numpy(), scipy.fft.idct(x.double().numpy(), norm="ortho", axis=-1), atol=tolerance
    )
    round_trip_tolerance = 1e-12 if dtype == torch.float64 else 1e-6
    torch.testing.assert_close(idct(dct(x)), x, atol=round_trip_tolerance, rtol=0)


def test_dct_is_orthonormal():
    eye = torch.eye(16, dtype=torch.float64)
    basis = dct(eye)
    torch.testing.assert_close(basis @ basis.T, eye, atol=1e-12, rtol=0)


def test_constant_spectrum_is_a_scaling_for_both_transforms():
    # The skip term of the static filter is folded into the spectrum; this is exact for both transforms.
    x = torch.randn(2, 4, 33, dtype=torch.float64)
    scale = torch.randn(4, 1, dtype=torch.float64)
    for transform in ("fft", "dct"):
        torch.testing.assert_close(apply_spectrum(x, scale, transform, 33), x * scale, atol=1e-12, rtol=0)


# ---------------------------------------------------------------------------------------------
# The operator against a direct reference (FFT path, Type I and Type II)
# ---------------------------------------------------------------------------------------------


def _circular_depthwise(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Centred depthwise convolution with circular padding; x (C, N), weight (C, k)."""
    k = weight.shape[-1]
    # Conv1d is a cross-correlation: out[t] = sum_j w[j] x[t + j - k // 2].
    out = sum(weight[:, j : j + 1] * np.roll(x, k // 2 - j, axis=-1) for j in range(k))
    return out + bias[:, None]


def _zero_padded_depthwise(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    k = weight.shape[-1]
    padded = np.pad(x, ((0, 0), (k // 2, k // 2)))
    out = sum(weight[:, j : j + 1] * padded[:, j : j + x.shape[-1]] for j in range(k))
    return out + bias[:, None]


def _dft_ortho(x: np.ndarray) -> np.ndarray:
    n = x.shape[-1]
    t = np.arange(n)
    basis = np.exp(-2j * np.pi * np.outer(t, t) / n) / np.sqrt(n)
    return (x @ basis.T)[..., : n // 2 + 1]


def _conv_from_half_spectrum(u: np.ndarray, half: np.ndarray) -> np.ndarray:
    """Apply a (C, N//2+1) multiplier of the unnormalised real FFT as a circular convolution."""
    n = u.shape[-1]
    kernel = np.fft.irfft(half, n=n, axis=-1)
    return direct_circular_convolution(u, kernel)


def to_np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


def reference_gates(op: OrchidOperator, x: torch.Tensor, depthwise) -> tuple[np.ndarray, ...]:
    """The input projection and the short convolution of one sequence: x (d, L), z = in_proj(x) (3d, L), and the
    gates s1, s2 and the value v (d, L) each."""
    d = op.d_model
    xs = to_np(x[0]).T
    z = to_np(op.in_proj.weight) @ xs + to_np(op.in_proj.bias)[:, None]
    conv = op.short_conv.conv
    gated = depthwise(z, to_np(conv.weight)[:, 0], to_np(conv.bias))
    return xs, z, gated[:d], gated[d : 2 * d], gated[2 * d :]


def reference_operator(op: OrchidOperator, x: torch.Tensor) -> np.ndarray:
    """The operator of Sec. 3.3 written out with direct O(N^2) sums, for one sequence of length N = max_len."""
    d = op.d_model
    xs, z, s1, s2, v = reference_gates(op, x, _circular_depthwise)

    def time_stack(stack, u):
        for layer in stack.layers:
            u = _circular_depthwise(u, to_np(layer.conv.weight)[:, 0], to_np(layer.conv.bias))
        return u

    def freq_stack(u):
        for layer in op.conditioning.freq_conv.layers:
            u = _zero_padded_depthwise(u, to_np(layer.conv.weight)[:, 0], to_np(layer.conv.bias))
        return u

    value = z[2 * d :]  # the conditioning network reads v before the short convolution
    key_spectrum = _dft_ortho(time_stack(op.conditioning.time_conv, value))
    if op.conditioning.conditioning == "abs":
        h_theta = freq_stack(np.abs(key_spectrum)).astype(complex)
    else:
        query_spectrum = _dft_ortho(time_stack(op.conditioning.query_conv, value))
        product = np.conj(key_spectrum) * query_spectrum
        h_theta = freq_stack(product.real) + 1j * freq_stack(product.imag)
    h0 = to_np(op.static_filter())
    static_half = np.fft.rfft(h0, axis=-1) + to_np(op.static_filter.skip)[:, None]
    y = _conv_from_half_spectrum(s1 * v, static_half + h_theta) * s2
    h_res = to_np(op.residual_filter())
    y = y + direct_circular_convolution(xs, h_res) + to_np(op.residual_filter.skip)[:, None] * xs
    return (to_np(op.out_proj.weight) @ y + to_np(op.out_proj.bias)[:, None]).T


@pytest.mark.parametrize("conditioning", ["abs", "xcorr"])
def test_fft_operator_matches_direct_reference(conditioning):
    op = OrchidOperator(4, 12, transform="fft", conditioning=conditioning).double()
    x = torch.randn(1, 12, 4, dtype=torch.float64)
    np.testing.assert_allclose(op(x)[0].detach().numpy(), reference_operator(op, x), atol=1e-9, rtol=0)


def reference_dct_operator(op: OrchidOperator, x: torch.Tensor) -> np.ndarray:
    """The DCT-mode operator with Type I conditioning written out with explicit cosine sums and a direct symmetric
    convolution, for one sequence of length L <= N = max_len (zero-padded to N)."""
    d, n, length = op.d_model, op.max_len, x.shape[1]
    xs, z, s1, s2, v = reference_gates(op, x, _zero_padded_depthwise)
    k, t = np.arange(n)[:, None], np.arange(length)[None, :]
    scale = np.where(k == 0, np.sqrt(1 / n), np.sqrt(2 / n))
    dct_matrix = scale * np.cos(np.pi * (2 * t + 1) * k / (2 * n))  # (N, L): orthonormal DCT-II of x padded to N
    key = z[2 * d :]  # the conditioning network reads v before the short convolution
    for layer in op.conditioning.time_conv.layers:
        key = _zero_padded_depthwise(key, to_np(layer.conv.weight)[:, 0], to_np(layer.conv.bias))
    h_theta = np.abs(key @ dct_matrix.T)  # (d, N)
    for layer in op.conditioning.freq_conv.layers:
        h_theta = _zero_padded_depthwise(h_theta, to_np(layer.conv.weight)[:, 0], to_np(layer.conv.bias))
    h0 = to_np(op.static_filter())  # (d, N), lags 0 .. N-1 of an even kernel
    lags = np.arange(1, n)[None, :]
    h0_spectrum = h0[:, :1] + 2 * h0[:, 1:] @ np.cos(np.pi * np.arange(n)[:, None] * lags / n).T
    multiplier = h0_spectrum + to_np(op.static_filter.skip)[:, None] + h_theta
    y = (((s1 * v) @ dct_matrix.T) * multiplier) @ dct_matrix * s2
    padded = np.pad(xs, ((0, 0), (0, n - length)))
    residual = direct_symmetric_convolution(padded, to_np(op.residual_filter()))[:, :length]
    y = y + residual + to_np(op.residual_filter.skip)[:, None] * xs
    return (to_np(op.out_proj.weight) @ y + to_np(op.out_proj.bias)[:, None]).T


@pytest.mark.parametrize("length", [9, 12])
def test_dct_operator_matches_direct_reference(length):
    op = OrchidOperator(4, 12, transform="dct", conditioning="abs", filter_spectrum="convolution").double()
    with torch.no_grad():
        for long_filter in (op.static_filter, op.residual_filter):
            long_filter.ffn[-1].weight.mul_(10.0)  # kernels well above the skip terms, so a wrong one shows
    x = torch.randn(1, length, 4, dtype=torch.float64)
    np.testing.assert_allclose(op(x)[0].detach().numpy(), reference_dct_operator(op, x), atol=1e-9, rtol=0)


# ---------------------------------------------------------------------------------------------
# Shift equivariance (Sec. 3.2, App. B)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "conditioning,activation",
    [("abs", "identity")] + [("xcorr", name) for name in CONDITIONING_ACTIVATIONS],
)
@pytest.mark.parametrize("layers", [1, 3])
def test_fft_operator_is_shift_equivariant(conditioning, activation, layers):
    op = OrchidOperator(
        6,
        24,
        transform="fft",
        conditioning=conditioning,
        conditioning_activation=activation,
        conditioning_time_layers=layers,
        conditioning_freq_layers=layers,
    ).double()
    x = torch.randn(2, 24, 6, dtype=torch.float64)
    y = op(x)
    for shift in (1, 5, 13):
        torch.testing.assert_close(op(torch.roll(x, shift, dims=1)), torch.roll(y, shift, dims=1), atol=1e-8, rtol=0)


def test_data_dependent_kernel_is_shift_invariant_under_cross_conditioning():
    # Remark 3.3: rolling only the conditioning sequence u leaves the kernel, hence the output, unchanged.
    op = OrchidOperator(4, 16, transform="fft", conditioning="xcorr").double()
    x = torch.randn(1, 16, 4, dtype=torch.float64)
    u = torch.randn(1, 16, 4, dtype=torch.float64)
    torch.testing.assert_close(
        op(x, conditioning_input=torch.roll(u, 3, dims=1)), op(x, conditioning_input=u), atol=1e-8, rtol=0
    )


def test_shift_equivariance_test_detects_a_non_equivariant_operator():
    # The DCT path has an even-symmetric boundary instead of wrap-around: it is not exactly equivariant,
    # which shows the equivariance check above is able to fail.
    op = OrchidOperator(6, 24, transform="dct").double()
    x = torch.randn(1, 24, 6, dtype=torch.float64)
    error = (op(torch.roll(x, 5, dims=1)) - torch.roll(op(x), 5, dims=1)).abs().max()
    assert error > 1e-3


# ---------------------------------------------------------------------------------------------
# Padding invariance: the bug that broke M2-BERT's embeddings
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("transform", ["dct", "fft"])
@pytest.mark.parametrize("conditioning", ["abs", "xcorr"])
def test_output_does_not_depend_on_padding_or_batch_mates(transform, conditioning):
    max_len, d = 32, 8
    op = OrchidOperator(d, max_len, transform=transform, conditioning=conditioning, conditioning_time_layers=2).eval()
    sentence = torch.randn(1, 9, d)
    alone = op(sentence)

    # Padded to max_len with garbage (padding embeddings are never zero in a real model).
    padded = torch.cat([sentence, 5 * torch.randn(1, max_len - 9, d)], dim=1)
    mask = torch.zeros(1, max_len, dtype=torch.long)
    mask[:, :9] = 1
    torch.testing.assert_close(op(padded, mask)[:, :9], alone, atol=1e-5, rtol=1e-5)

    # Batched with a longer sequence: padded to the batch's longest, 20.
    batch = torch.cat([padded[:, :20], torch.randn(1, 20, d)], dim=0)
    batch_mask = torch.ones(2, 20, dtype=torch.long)
    batch_mask[0, 9:] = 0
    out = op(batch, batch_mask)
    torch.testing.assert_close(out[:1, :9], alone, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1:], op(batch[1:]), atol=1e-5, rtol=1e-5)
    # Masked positions carry no signal out of the operator's sequence mixing.
    assert torch.isfinite(out).all()


def test_cross_conditioning_sequence_is_zero_padded_to_the_input_length():
    op = OrchidOperator(4, 16, transform="dct").double()
    x = torch.randn(2, 12, 4, dtype=torch.float64)
    u = torch.randn(2, 5, 4, dtype=torch.float64)
    u_padded = torch.cat([u, torch.randn(2, 7, 4, dtype=torch.float64)], dim=1)
    u_mask = torch.zeros(2, 12)
    u_mask[:, :5] = 1
    expected = op(x, conditioning_input=u)
    torch.testing.assert_close(op(x, conditioning_input=u_padded, conditioning_mask=u_mask), expected)
    # The kernel really depends on u.
    assert (op(x, conditioning_input=torch.randn_like(u)) - expected).abs().max() > 1e-6


# ---------------------------------------------------------------------------------------------
# Gradients, lengths, precision
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("transform", ["dct", "fft"])
@pytest.mark.parametrize("conditioning,activation", [("abs", "identity"), ("xcorr", "identity"), ("xcorr", "tanh")])
def test_gradcheck(transform, conditioning, activation):
    op = OrchidOperator(
        3, 7, transform=transform, conditioning=conditioning, conditioning_activation=activation, filter_width=8
    ).double()
    x = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    assert torch.autograd.gradcheck(lambda inp: op(inp, mask), (x,), eps=1e-6, atol=1e-5)
    # Gradients with respect to the parameters, through the conditioning network and both filters.
    params = [p for p in op.parameters()]
    out = op(x, mask).square().sum()
    grads = torch.autograd.grad(out, params)
    assert all(torch.isfinite(g).all() for g in grads)
    assert all(g.abs().sum() > 0 for g in grads), "every parameter takes part in the output"


@pytest.mark.parametrize("length", [1, 2, 7, 31, 48, 63])
@pytest.mark.parametrize("transform", ["dct", "fft"])
def test_any_length_up_to_max_len(length, transform):
    op = OrchidOperator(8, 63, transform=transform)
    y = op(torch.randn(3, length, 8))
    assert y.shape == (3, length, 8)
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("transform", ["dct", "fft"])
@pytest.mark.parametrize("conditioning", ["abs", "xcorr"])
def test_bf16_autocast_forward_and_backward_stay_finite(transform, conditioning):
    op = OrchidOperator(16, 50, transform=transform, conditioning=conditioning)
    x = torch.randn(2, 37, 16, requires_grad=True)
    mask = torch.ones(2, 37)
    mask[1, 20:] = 0
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = op(x, mask)
    assert y.dtype == torch.bfloat16
    y.float().square().mean().backward()
    assert torch.isfinite(y).all()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in op.parameters() if p.grad is not None)
    # bf16 output stays close to the float32 one.
    torch.testing.assert_close(y.float(), op(x, mask).detach(), atol=0.1, rtol=0.1)


def test_bf16_weights_run():
    op = OrchidOperator(8, 16).to(torch.bfloat16)
    y = op(torch.randn(2, 16, 8, dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16 and torch.isfinite(y).all()


def test_memory_is_linear_in_length():
    # An L x L float32 matrix at L = 2^16 would need 16 GiB; the operator needs a few MiB.
    op = OrchidOperator(2, 2**16, filter_width=4)
    with torch.no_grad():
        y = op(torch.randn(1, 2**16, 2))
    assert y.shape == (1, 2**16, 2)


def test_static_spectrum_cache_follows_parameter_updates():
    op = OrchidOperator(4, 16, transform="fft").eval()
    x = torch.randn(1, 16, 4)
    with torch.no_grad():
        first = op(x)
        torch.testing.assert_close(op(x), first)
        op.static_filter.skip.add_(1.0)
        updated = op(x)
    assert (updated - first).abs().max() > 1e-4
    torch.testing.assert_close(updated, op(x).detach())  # grad-enabled path, no cache


def test_operator_built_under_inference_mode_runs_and_follows_updates():
    # Its parameters are inference tensors, which have no version counter to key the spectrum cache on.
    with torch.inference_mode():
        op = OrchidOperator(4, 16).eval()
        x = torch.randn(1, 16, 4)
        before = op(x)
        op.static_filter.skip.add_(1.0)
        assert not torch.allclose(op(x), before)


def test_static_kernel_only_mode_has_no_conditioning_network():
    op = OrchidOperator(4, 16, data_dependent=False)
    assert op.conditioning is None
    assert op(torch.randn(1, 16, 4)).shape == (1, 16, 4)


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


def test_clear_errors_for_bad_input():
    op = OrchidOperator(8, 16)
    with pytest.raises(ValueError, match=r"length 17 > max_len=16"):
        op(torch.randn(1, 17, 8))
    with pytest.raises(ValueError, match=r"has 5 features but the operator has d_model=8"):
        op(torch.randn(1, 4, 5))
    with pytest.raises(ValueError, match=r"shape \(1, 3\), expected \(batch, length\) = \(1, 4\)"):
        op(torch.randn(1, 4, 8), torch.ones(1, 3))
    with pytest.raises(ValueError, match=r"empty sequence"):
        op(torch.randn(1, 0, 8))
    with pytest.raises(ValueError, match=r"shape \(batch, length, 8\)"):
        op(torch.randn(4, 8))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(transform="wavelet"), r"transform must be one of \('dct', 'fft'\), got 'wavelet'"),
        (dict(conditioning="attention"), r"conditioning must be one of \('abs', 'xcorr'\), got 'attention'"),
        (dict(conditioning_activation="relu"), r"conditioning_activation must be one of"),
        (dict(short_conv_size=4), r"kernel_size must be a positive odd number, got 4"),
        (dict(conditioning_time_layers=-1), r"must be >= 0, got -1 and 1"),
        (dict(max_len=0), r"max_len must be >= 1, got 0"),
    ],
)
def test_clear_errors_for_bad_configuration(kwargs, message):
    arguments = dict(d_model=8, max_len=16) | kwargs
    with pytest.raises(ValueError, match=message):
        OrchidOperator(**arguments)


# ---------------------------------------------------------------------------------------------
# Block-diagonal linear layer
# ---------------------------------------------------------------------------------------------


def test_block_diagonal_linear_equals_dense_block_diagonal_matrix():
    layer = BlockDiagonalLinear(12, 8, num_blocks=4)
    dense = torch.block_diag(*layer.weight)  # (8, 12)
    x = torch.randn(3, 5, 12)
    torch.testing.assert_close(layer(x), F.linear(x, dense, layer.bias))
    assert sum(p.numel() for p in layer.parameters()) == 12 * 8 // 4 + 8


def test_block_diagonal_linear_rejects_indivisible_sizes():
    with pytest.raises(ValueError, match=r"in_features=10 and out_features=8 must both be divisible by num_blocks=4"):
        BlockDiagonalLinear(10, 8, num_blocks=4)


def test_channel_groups_cover_every_channel_once(channel_groups, monkeypatch):
    op = OrchidOperator(4, 16)
    expected = [slice(None)] if channel_groups == "channels together" else [slice(i, i + 1) for i in range(4)]
    assert op.channel_groups(batch=2) == expected
    # A last group narrower than the others, and the operator's output unchanged by it.
    torch.manual_seed(0)
    op = OrchidOperator(13, 16)
    x = torch.randn(2, 16, 13)
    whole = op(x)
    monkeypatch.setattr(orchid_layers, "CHANNEL_GROUP_ELEMENTS", 1)
    monkeypatch.setattr(orchid_layers, "MIN_CHANNEL_GROUP", 3)
    assert op.channel_groups(batch=2) == [slice(0, 3), slice(3, 6), slice(6, 9), slice(9, 12), slice(12, 13)]
    with torch.no_grad():  # the same without autograd, also for long inputs (whose transforms run in parts)
        assert op.channel_groups(batch=2) == [slice(0, 3), slice(3, 6), slice(6, 9), slice(9, 12), slice(12, 13)]
        monkeypatch.setattr(orchid_layers, "LONG_INPUT_TOKENS", 32)
        assert op.channel_groups(batch=2) == [slice(0, 3), slice(3, 6), slice(6, 9), slice(9, 12), slice(12, 13)]
    torch.testing.assert_close(op(x), whole, atol=1e-6, rtol=0)
    with torch.no_grad():  # without autograd the groups are written into one output in place
        torch.testing.assert_close(op(x), whole.detach(), atol=1e-6, rtol=0)
    # At the defaults (2^19 elements, at least 32 channels): one group for (8, 128) (groups of 256 channels would be
    # only three), groups of 128 channels for a 4096-long sequence, 32 for a 16384-long one, with or without autograd.
    monkeypatch.undo()
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            assert OrchidOperator(768, 128).channel_groups(batch=8) == [slice(None)]
            groups = OrchidOperator(768, 4096).channel_groups(batch=1)
            assert len(groups) == 6 and all(g.stop - g.start == 128 for g in groups) and groups[-1].stop == 768
            assert len(OrchidOperator(768, 16384).channel_groups(batch=1)) == 24


def test_transform_parts_halve_groups_of_long_inputs_without_autograd():
    op = OrchidOperator(768, 16384)
    assert op.transform_parts(32, batch=1) == [slice(0, 32)]  # autograd keeps whole groups
    with torch.no_grad():
        assert op.transform_parts(32, batch=1) == [slice(0, 16), slice(16, 32)]
        assert op.transform_parts(5, batch=1) == [slice(0, 3), slice(3, 5)]
        assert op.transform_parts(1, batch=1) == [slice(0, 1)]
        # Below LONG_INPUT_TOKENS (B x N) the whole group.
        assert OrchidOperator(768, 4096).transform_parts(128, batch=1) == [slice(0, 128)]
        assert OrchidOperator(768, 4096).transform_parts(64, batch=2) == [slice(0, 32), slice(32, 64)]


@pytest.mark.parametrize("padding_mode", ["zeros", "circular"])
@pytest.mark.parametrize("kernel_size", [1, 3, 5])
@pytest.mark.parametrize("chunk_elements", [1, 60, 2**18])
def test_short_conv_in_place_equals_the_direct_convolution(padding_mode, kernel_size, chunk_elements, monkeypatch):
    # Chunks of 1 position (the smallest the border allows), of a few positions, and the whole sequence at once.
    monkeypatch.setattr(orchid_layers, "SHORT_CONV_CHUNK_ELEMENTS", chunk_elements)
    torch.manual_seed(0)
    conv = orchid_layers.ShortConv1d(7, kernel_size, padding_mode)
    channels = torch.tensor([6, 0, 3])  # a subset, in the order the operator's index tensors use
    weight, bias = to_np(conv.conv.weight)[channels.numpy(), 0], to_np(conv.conv.bias)[channels.numpy()]
    for length in (1, 2, 5, 23):
        for wrap in (True, False):
            x = torch.randn(2, length, 3)
            expected = conv(x, wrap, channels).detach()
            circular = padding_mode == "circular" and wrap and length >= kernel_size // 2
            direct = _circular_depthwise if circular else _zero_padded_depthwise
            reference = np.stack([direct(to_np(seq).T, weight, bias).T for seq in x])
            np.testing.assert_allclose(to_np(expected), reference, atol=1e-5, rtol=0)
            with torch.no_grad():
                written = x.clone()
                assert conv.forward_in_place(written, wrap, channels) is written
            torch.testing.assert_close(written, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize(("transform", "n"), [("dct", 64), ("dct", 256), ("fft", 256)])
@pytest.mark.parametrize(("data_dependent", "cross"), [(True, False), (True, True), (False, False)])
def test_inference_in_parts_equals_the_autograd_forward(transform, n, data_dependent, cross, monkeypatch):
    # Long inputs without autograd run each group's transforms on halves of its channels, after an in-place short
    # convolution in chunks; here every input counts as long, with groups of 4 channels and chunks of 5 positions.
    # cross: the kernel from another sequence (Remark 3.3), which needs the data-dependent kernel.
    monkeypatch.setattr(orchid_layers, "CHANNEL_GROUP_ELEMENTS", 1)
    monkeypatch.setattr(orchid_layers, "MIN_CHANNEL_GROUP", 4)
    monkeypatch.setattr(orchid_layers, "LONG_INPUT_TOKENS", 1)
    monkeypatch.setattr(orchid_layers, "SHORT_CONV_CHUNK_ELEMENTS", 5 * 2 * 3 * 4)
    monkeypatch.setattr(orchid_layers, "PROJECTION_CHUNK_ELEMENTS", 3 * 18)
    torch.manual_seed(0)
    op = OrchidOperator(18, n, transform=transform, data_dependent=data_dependent).eval()
    x = torch.randn(2, n - 7, 18)
    mask = torch.ones(2, n - 7, dtype=torch.long)
    mask[1, n // 2 :] = 0
    other = dict(conditioning_input=torch.randn(2, n - 20, 18)) if cross else {}
    with torch.no_grad():
        assert op.channel_groups(batch=2)[-1] == slice(16, 18)
        assert op.transform_parts(4, batch=2) == [slice(0, 2), slice(2, 4)]
    recorded = op(x, mask, **other)
    assert recorded.requires_grad
    with torch.no_grad():
        inference = op(x, mask, **other)
    torch.testing.assert_close(inference, recorded.detach(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("padding", [16, 0])
@pytest.mark.parametrize(("n", "channels"), [(256, 5), (64, 1), (30, 8)])
def test_irfft_seq_returns_torchs_inverse_in_rows(padding, n, channels, monkeypatch):
    # Without autograd the inverse FFT writes each channel n + padding apart, then copies to row-major.
    monkeypatch.setattr(orchid_layers, "FFT_ROW_PADDING", padding)
    spectrum = torch.fft.rfft(torch.randn(3, n, channels), dim=1)
    with torch.no_grad():
        signal = orchid_layers.irfft_seq(spectrum, n)
    assert signal.shape == (3, n, channels) and (signal.is_contiguous() or not padding)
    torch.testing.assert_close(signal, torch.fft.irfft(spectrum, n=n, dim=1), atol=0, rtol=0)


@pytest.mark.parametrize("transform", ["dct", "fft"])
@pytest.mark.parametrize("data_dependent", [True, False])
def test_inference_equals_the_autograd_forward_with_fft_sized_transforms(transform, data_dependent):
    # N = 256 takes torch's DCT through the FFT (N > MATMUL_DCT_MAX_LEN): without autograd, the inverse transform's
    # output is written with padded rows. Some multipliers are laid out like the transform's output.
    torch.manual_seed(0)
    op = OrchidOperator(12, 256, transform=transform, data_dependent=data_dependent).eval()
    x = torch.randn(2, 200, 12)
    mask = torch.ones(2, 200, dtype=torch.long)
    mask[1, 150:] = 0
    recorded = op(x, mask)
    assert recorded.requires_grad
    with torch.no_grad():
        inference = op(x, mask)
    torch.testing.assert_close(inference, recorded.detach(), atol=1e-6, rtol=0)
    # Multipliers that meet the transform's output directly are laid out as it is: channel by channel from torch's
    # real FFT, row-major from pocketfft's DCT.
    direct = ["static", "residual"] if not data_dependent else ["residual"]
    channel_major = transform == "fft" or not orchid_layers.POCKETFFT_DCT
    assert all((op._spectrum_cache[name][1].stride()[-1] > 1) == channel_major for name in direct)


@pytest.mark.parametrize("conditioning", ["abs", "xcorr"])
@pytest.mark.parametrize("time_layers", [0, 1])
@pytest.mark.parametrize("masked", [False, True])
def test_inference_equals_the_autograd_forward_at_every_conditioning_depth(conditioning, time_layers, masked):
    # Without autograd the conditioning network's transforms overwrite the time features they transform, which
    # must never be v itself: with no time layer and no mask, v reaches the transform as it is.
    torch.manual_seed(0)
    op = OrchidOperator(8, 32, conditioning=conditioning, conditioning_time_layers=time_layers).eval()
    x = torch.randn(2, 32, 8)
    mask = torch.ones(2, 32, dtype=torch.long)
    mask[1, 20:] = 0
    mask = mask if masked else None
    recorded = op(x, mask)
    with torch.no_grad():
        inference = op(x, mask)
    torch.testing.assert_close(inference, recorded.detach(), atol=1e-6, rtol=0)


def test_the_operator_writes_into_a_lent_output_and_refuses_one_that_does_not_fit(monkeypatch):
    monkeypatch.setattr(orchid_layers, "CHANNEL_GROUP_ELEMENTS", 1)
    monkeypatch.setattr(orchid_layers, "MIN_CHANNEL_GROUP", 3)
    torch.manual_seed(0)
    op = OrchidOperator(12, 16).eval()
    x = torch.randn(2, 16, 12)
    expected = op(x).detach()
    with torch.no_grad():
        lent = torch.full_like(x, float("nan"))
        result = op(x, out=lent)
        assert result.data_ptr() == lent.data_ptr()
        torch.testing.assert_close(result, expected, atol=1e-6, rtol=0)
        with pytest.raises(ValueError, match=r"out must be like x: got \(2, 16, 6\)"):
            op(x, out=torch.empty(2, 16, 6))
        with pytest.raises(ValueError, match="out shares its memory with x"):
            op(x, out=x)


@pytest.mark.parametrize("transform, n", [("dct", 256), ("dct", 64), ("fft", 256)])
@pytest.mark.parametrize("data_dependent", [True, False])
def test_cached_filter_spectra_built_by_channel_groups_equal_whole_filters(monkeypatch, transform, n, data_dependent):
    # N = 64 takes the DCT by GEMM (row-major multipliers), N = 256 through the FFT (some channel by channel).
    monkeypatch.setattr(orchid_layers, "CHANNEL_GROUP_ELEMENTS", 1)
    monkeypatch.setattr(orchid_layers, "MIN_CHANNEL_GROUP", 3)
    torch.manual_seed(0)
    # In float64, where the two evaluation orders (GEMMs and transforms of 3 or 12 channels) agree to rounding.
    op = OrchidOperator(12, n, transform=transform, data_dependent=data_dependent).double().eval()
    filters = {"static": op.static_filter, "residual": op.residual_filter}
    calls = {name: [] for name in filters}
    for name, long_filter in filters.items():
        def spectrum_seq(dtype, channels=ALL_CHANNELS, hidden=None, name=name, original=long_filter.spectrum_seq):
            calls[name].append((channels, hidden is not None))
            return original(dtype, channels, hidden)

        monkeypatch.setattr(long_filter, "spectrum_seq", spectrum_seq)
    with torch.no_grad():
        op(torch.randn(1, n, 12, dtype=torch.float64))
    for name, long_filter in filters.items():
        assert calls[name] == [(slice(start, start + 3), True) for start in range(0, 12, 3)]
        cached = op._spectrum_cache[name][1]
        whole = op._filter_spectrum(name, long_filter, torch.float64).detach()  # autograd: the whole filter at once
        assert cached.stride() == whole.stride()
        torch.testing.assert_close(cached, whole, atol=1e-12, rtol=0)
