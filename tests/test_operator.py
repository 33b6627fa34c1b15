"""The Orchid operator against the paper's properties: exact convolution, orthonormal DCT, shift equivariance
(Sec. 3.2, App. B), padding invariance on either side, gradients, precision, and clear errors."""

import numpy as np
import pytest
import scipy.fft
import torch
import torch.nn.functional as F
from orchid_hf.modeling import orchid_ops
from orchid_hf.modeling.orchid_layers import CONDITIONING_ACTIVATIONS, ConditioningNetwork, ImplicitFilter
from orchid_hf.modeling.orchid_ops import dct, idct, kernel_spectrum, long_convolution

from orchid_hf import BlockDiagonalLinear, OrchidOperator

LENGTHS = [1, 2, 3, 5, 8, 17, 64, 100, 128, 129]


@pytest.fixture(params=["matrix DCT", "pocketfft DCT", "torch DCT"])
def dct_backend(request, monkeypatch):
    """The DCT as a product with its matrix, as at short transform lengths; through pocketfft, as on the CPU at longer
    ones; and through torch's real FFT (Makhoul's algorithm), as on a GPU or without SciPy: every test that computes
    a DCT runs with each (``both_dct_backends``)."""
    if request.param != "matrix DCT":
        monkeypatch.setattr(orchid_ops, "MATRIX_DCT_MAX_LENGTH", 0)
    if request.param == "torch DCT":
        monkeypatch.setattr(orchid_ops, "scipy_fft", None)
    if request.param != "matrix DCT":
        expected = "fft" if request.param == "torch DCT" else "pocketfft"
        assert orchid_ops.dct_backend(torch.zeros(1), 200) == expected
    return request.param


both_dct_backends = pytest.mark.usefixtures("dct_backend")


def direct_circular_convolution(x: np.ndarray, h: np.ndarray) -> np.ndarray:
    """y[t] = sum_s h[(t - s) mod N] x[s] along the last axis, the O(N^2) definition."""
    n = x.shape[-1]
    y = np.zeros_like(x)
    for t in range(n):
        for s in range(n):
            y[..., t] += h[..., (t - s) % n] * x[..., s]
    return y


def direct_symmetric_convolution(x: np.ndarray, h: np.ndarray) -> np.ndarray:
    """y[t] = sum_s x[s] (h_e[t - s] + h_e[t + s + 1]) along the last axis: x mirrored about its start, convolved
    with the even kernel h_e[m] = h[|m|] for |m| < N, h_e[N] = 0, period 2N. The O(N^2) definition of the DCT's
    convolution."""
    n = x.shape[-1]

    def even(m):
        m = m % (2 * n)
        return np.zeros_like(h[..., 0]) if m == n else h[..., min(m, 2 * n - m)]

    y = np.zeros_like(x)
    for t in range(n):
        for s in range(n):
            y[..., t] += (even(t - s) + even(t + s + 1)) * x[..., s]
    return y


def to_np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


# ---------------------------------------------------------------------------------------------
# Transforms and the long convolution
# ---------------------------------------------------------------------------------------------


@both_dct_backends
@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_dct_matches_scipy_and_inverse_round_trips(n, dtype):
    x = torch.randn(4, 3, n, dtype=dtype)
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    reference = scipy.fft.dct(x.double().numpy(), norm="ortho", axis=-1)
    np.testing.assert_allclose(to_np(dct(x)), reference, atol=tolerance)
    inverse = scipy.fft.idct(x.double().numpy(), norm="ortho", axis=-1)
    np.testing.assert_allclose(to_np(idct(x)), inverse, atol=tolerance)
    torch.testing.assert_close(idct(dct(x)), x, atol=10 * tolerance, rtol=0)


@both_dct_backends
def test_dct_is_orthonormal():
    eye = torch.eye(16, dtype=torch.float64)
    basis = dct(eye)
    torch.testing.assert_close(basis @ basis.T, eye, atol=1e-12, rtol=0)


@pytest.mark.slow
@both_dct_backends
@pytest.mark.parametrize(("n", "length"), [(16, 16), (16, 9), (45, 31)])
def test_dct_gradients_and_double_backward(n, length):
    # The orthonormal, zero-padded DCT's gradient is the inverse DCT cut to the input's length, and the other way
    # round (pocketfft's autograd rule; torch's own autograd through the FFT on the other backend).
    x = torch.randn(2, length, 3, dtype=torch.float64, requires_grad=True)
    spectrum = torch.randn(2, n, 3, dtype=torch.float64, requires_grad=True)
    for fn, argument in ((lambda t: dct(t, 1, n), x), (lambda t: idct(t, 1, length), spectrum)):
        assert torch.autograd.gradcheck(fn, (argument,))
        assert torch.autograd.gradgradcheck(fn, (argument,))


@both_dct_backends
def test_the_dct_of_a_strided_view_leaves_the_input_alone():
    rows = torch.randn(2, 32, 9, dtype=torch.float64)
    x = rows[..., :3]  # a strided view, as the operator's gates are
    before = rows.clone()
    out = dct(x, dim=1, n=40)
    assert torch.equal(rows, before)
    np.testing.assert_allclose(out.numpy(), scipy.fft.dct(x.numpy(), n=40, axis=1, norm="ortho"), atol=1e-12)
    # pocketfft writes into a tensor of torch's, which its profiler counts
    if orchid_ops.dct_backend(x, 40) == "pocketfft":
        assert out.is_contiguous()


@pytest.mark.parametrize("n", LENGTHS)
def test_fft_long_convolution_equals_direct_circular_convolution(n):
    x = torch.randn(2, n, 3, dtype=torch.float64)
    h = torch.randn(n, 3, dtype=torch.float64)
    expected = direct_circular_convolution(x.transpose(1, 2).numpy(), h.T.numpy())
    got = long_convolution(x, kernel_spectrum(h, "fft"), "fft", n).transpose(1, 2).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-10, rtol=0)


@both_dct_backends
@pytest.mark.parametrize("n", LENGTHS)
def test_dct_long_convolution_equals_direct_symmetric_convolution(n):
    x = torch.randn(2, n, 3, dtype=torch.float64)
    h = torch.randn(n, 3, dtype=torch.float64)
    expected = direct_symmetric_convolution(x.transpose(1, 2).numpy(), h.T.numpy())
    got = long_convolution(x, kernel_spectrum(h, "dct"), "dct", n).transpose(1, 2).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-10, rtol=0)


@both_dct_backends
@pytest.mark.parametrize("transform", ["dct", "fft"])
def test_kernels_keep_their_gain_under_both_transforms(transform):
    # An impulse is the identity and a kernel at lag +-1 averages the neighbours with weight h[1], for both transforms
    # alike (inside the sequence; the DCT reflects at its start, the FFT wraps around).
    n = 16
    x = torch.randn(3, n, 1, dtype=torch.float64)
    impulse = torch.zeros(n, 1, dtype=torch.float64)
    impulse[0] = 1.0
    torch.testing.assert_close(long_convolution(x, kernel_spectrum(impulse, transform), transform, n), x)
    neighbours = torch.zeros(n, 1, dtype=torch.float64)
    neighbours[1] = 0.5
    if transform == "fft":
        neighbours[-1] = 0.5  # lag -1 of a circular kernel
    y = long_convolution(x, kernel_spectrum(neighbours, transform), transform, n)
    torch.testing.assert_close(y[:, 1:-1], 0.5 * (x[:, :-2] + x[:, 2:]), atol=1e-12, rtol=0)


@both_dct_backends
@pytest.mark.parametrize("transform", ["dct", "fft"])
def test_constant_multiplier_is_a_scaling_and_shorter_inputs_are_zero_padded(transform):
    x = torch.randn(2, 33, 4, dtype=torch.float64)
    scale = torch.randn(4, dtype=torch.float64)
    torch.testing.assert_close(long_convolution(x, scale, transform, 33), x * scale, atol=1e-12, rtol=0)
    torch.testing.assert_close(long_convolution(x, scale, transform, 50), x * scale, atol=1e-12, rtol=0)


@both_dct_backends
@pytest.mark.parametrize("transform", ["dct", "fft"])
@pytest.mark.parametrize("n", [17, 128, 129, 300])
def test_static_filter_multiplier_convolves_with_its_kernel(transform, n):
    long_filter = ImplicitFilter(3, n, transform, spectrum="convolution").double()
    with torch.no_grad():
        long_filter.ffn[-1].weight.mul_(10.0)  # a kernel well above the skip term, so a wrong one shows
    x = torch.randn(2, n - 3, 3, dtype=torch.float64)
    got = long_convolution(x, long_filter.spectrum(torch.float64), transform, n)
    padded = np.pad(x.transpose(1, 2).numpy(), ((0, 0), (0, 0), (0, 3)))
    kernel = to_np(long_filter()).T  # (channels, N)
    direct = direct_symmetric_convolution if transform == "dct" else direct_circular_convolution
    expected = direct(padded, kernel) + to_np(long_filter.skip)[:, None] * padded
    np.testing.assert_allclose(to_np(got).transpose(0, 2, 1), expected[..., : n - 3], atol=1e-9, rtol=0)


@both_dct_backends
def test_listing1_filter_spectrum_is_the_dct_of_the_kernel_on_lags_0_to_n():
    # The default, the authors' parameterisation: dct(h0) of a kernel on lags 0 .. N-1 whose decay only falls.
    long_filter = ImplicitFilter(3, 16, "dct").double()
    kernel, skip = to_np(long_filter()), to_np(long_filter.skip)
    expected = scipy.fft.dct(kernel, axis=0, norm="ortho") + skip
    np.testing.assert_allclose(to_np(long_filter.spectrum(torch.float64)), expected, atol=1e-12)
    assert torch.all(long_filter.envelope()[1:] < long_filter.envelope()[:-1])
    np.testing.assert_allclose(to_np(long_filter.lag_features[:, 0]), np.arange(16) / 16, atol=1e-7)
    # Under the FFT there is nothing to choose: both give the exact circular convolution.
    torch.manual_seed(0)
    fft_listing1 = OrchidOperator(4, 12, transform="fft", filter_spectrum="listing1")
    torch.manual_seed(0)
    fft_convolution = OrchidOperator(4, 12, transform="fft", filter_spectrum="convolution")
    x = torch.randn(2, 12, 4)
    torch.testing.assert_close(fft_listing1(x), fft_convolution(x), atol=0, rtol=0)


@pytest.mark.parametrize("transform", ["dct", "fft"])
@pytest.mark.parametrize("decay", [True, False])
def test_the_envelope_is_computed_when_needed_and_no_buffer_is_as_large_as_the_kernel(transform, decay):
    """exp(-|t| / N * rate_c), rates spaced from slow to fast across channels (ones without decay), computed from its
    two factors: no buffer of (length, channels) is kept in every filter of every layer."""
    length, channels = 40, 6
    long_filter = ImplicitFilter(channels, length, transform, decay=decay)
    lags = torch.arange(length, dtype=torch.float32)
    if transform == "fft":
        lags = torch.where(lags <= length // 2, lags, lags - length)
    rates = torch.linspace(*long_filter.decay_rates, channels) if decay else torch.zeros(channels)
    # The formula in float32, as the model computes it: the same values to the last bit.
    expected = torch.exp(-lags.abs()[:, None] / length * rates)
    torch.testing.assert_close(long_filter.envelope(), expected, rtol=0, atol=0)
    assert all(buffer.numel() < length * channels for buffer in long_filter.buffers())


@both_dct_backends
@pytest.mark.parametrize("spectrum,median_bound", [("listing1", 0.15), ("convolution", 0.01)])
def test_the_dct_static_kernel_stays_local_and_does_not_reach_the_mirror_position(spectrum, median_bound):
    # An impulse at position 20 of 128: its response near the mirror position 107 against its response near 20, over
    # 64 channels at initialisation (the skip term left out, as it only adds at 20 itself). A kernel on signed
    # circular lags under dct(h0) gives a median of about 0.8: its taps at negative lags act on the mirror image.
    ratios = []
    for seed in range(3):
        torch.manual_seed(seed)
        long_filter = ImplicitFilter(64, 128, "dct", spectrum=spectrum).double()
        with torch.no_grad():
            multiplier = long_filter.spectrum(torch.float64) - long_filter.skip.double()
        impulse = torch.zeros(1, 128, 64, dtype=torch.float64)
        impulse[0, 20] = 1.0
        response = long_convolution(impulse, multiplier, "dct", 128)[0].abs()
        ratios.append(response[102:113].amax(0) / response[15:26].amax(0))
    ratios = torch.cat(ratios)
    assert ratios.median() < median_bound, ratios.median()
    assert ratios.max() < 1.0, ratios.max()  # no channel answers more at the mirror than at the impulse


def test_dct_filter_lags_run_forward_and_decay():
    # Under the DCT, index m of the kernel is the lag +-m: the envelope must decay along the whole kernel, not rise
    # again towards its end as the circular FFT layout does.
    dct_filter = ImplicitFilter(4, 64, "dct", spectrum="convolution")
    fft_filter = ImplicitFilter(4, 64, "fft")
    assert torch.all(dct_filter.envelope()[1:] < dct_filter.envelope()[:-1])
    assert fft_filter.envelope()[-1, 0] > fft_filter.envelope()[32, 0]


# ---------------------------------------------------------------------------------------------
# The operator against a direct reference (FFT path, Type I and Type II; DCT path, Type I)
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
    kernel = np.fft.irfft(half, n=u.shape[-1], axis=-1)
    return direct_circular_convolution(u, kernel)


def _stack(stack, u, depthwise):
    for layer in stack.layers:
        u = depthwise(u, to_np(layer.weight)[:, 0], to_np(layer.bias))
    return u


def reference_gates(op: OrchidOperator, x: torch.Tensor, depthwise) -> tuple[np.ndarray, ...]:
    """The input projection and the short convolution of one sequence: x (d, L), z = in_proj(x) (3d, L), and the
    gates s1, s2 and the value v (d, L) each."""
    d = op.d_model
    xs = to_np(x[0]).T
    z = to_np(op.in_proj.weight) @ xs + to_np(op.in_proj.bias)[:, None]
    gated = depthwise(z, to_np(op.short_conv.weight)[:, 0], to_np(op.short_conv.bias))
    return xs, z, gated[:d], gated[d : 2 * d], gated[2 * d :]


def reference_operator(op: OrchidOperator, x: torch.Tensor) -> np.ndarray:
    """The operator of Sec. 3.3 written out with direct O(N^2) sums, for one sequence of length N = max_len."""
    d = op.d_model
    xs, z, s1, s2, v = reference_gates(op, x, _circular_depthwise)
    value = z[2 * d :]  # the conditioning network reads v before the short convolution
    key_spectrum = _dft_ortho(_stack(op.conditioning.time_conv, value, _circular_depthwise))
    freq = op.conditioning.freq_conv
    if op.conditioning.conditioning == "abs":
        h_theta = _stack(freq, np.abs(key_spectrum), _zero_padded_depthwise).astype(complex)
    else:
        query_spectrum = _dft_ortho(_stack(op.conditioning.query_conv, value, _circular_depthwise))
        product = np.conj(key_spectrum) * query_spectrum
        h_theta = _stack(freq, product.real, _zero_padded_depthwise) + 1j * _stack(
            freq, product.imag, _zero_padded_depthwise
        )
    h0 = to_np(op.static_filter()).T
    static_half = np.fft.rfft(h0, axis=-1) + to_np(op.static_filter.skip)[:, None]
    y = _conv_from_half_spectrum(s1 * v, static_half + h_theta) * s2
    h_res = to_np(op.residual_filter()).T
    y = y + direct_circular_convolution(xs, h_res) + to_np(op.residual_filter.skip)[:, None] * xs
    return (to_np(op.out_proj.weight) @ y + to_np(op.out_proj.bias)[:, None]).T


@pytest.mark.parametrize("conditioning", ["abs", "xcorr"])
def test_fft_operator_matches_direct_reference(conditioning):
    op = OrchidOperator(4, 12, transform="fft", conditioning=conditioning).double()
    x = torch.randn(1, 12, 4, dtype=torch.float64)
    np.testing.assert_allclose(to_np(op(x)[0]), reference_operator(op, x), atol=1e-9, rtol=0)


def reference_dct_operator(op: OrchidOperator, x: torch.Tensor) -> np.ndarray:
    """The DCT-mode operator with Type I conditioning written out with explicit cosine sums and a direct symmetric
    convolution, for one sequence of length L <= N = max_len (zero-padded to N)."""
    d, n, length = op.d_model, op.max_len, x.shape[1]
    xs, z, s1, s2, v = reference_gates(op, x, _zero_padded_depthwise)
    k, t = np.arange(n)[:, None], np.arange(length)[None, :]
    scale = np.where(k == 0, np.sqrt(1 / n), np.sqrt(2 / n))
    dct_matrix = scale * np.cos(np.pi * (2 * t + 1) * k / (2 * n))  # (N, L): orthonormal DCT-II of x padded to N
    key = _stack(op.conditioning.time_conv, z[2 * d :], _zero_padded_depthwise)  # v before the short convolution
    h_theta = _stack(op.conditioning.freq_conv, np.abs(key @ dct_matrix.T), _zero_padded_depthwise)  # (d, N)
    h0 = to_np(op.static_filter()).T  # (d, N), lags 0 .. N-1 of an even kernel
    lags = np.arange(1, n)[None, :]
    h0_spectrum = h0[:, :1] + 2 * h0[:, 1:] @ np.cos(np.pi * np.arange(n)[:, None] * lags / n).T
    multiplier = h0_spectrum + to_np(op.static_filter.skip)[:, None] + h_theta
    y = (((s1 * v) @ dct_matrix.T) * multiplier) @ dct_matrix * s2
    padded = np.pad(xs, ((0, 0), (0, n - length)))
    residual = direct_symmetric_convolution(padded, to_np(op.residual_filter()).T)[:, :length]
    y = y + residual + to_np(op.residual_filter.skip)[:, None] * xs
    return (to_np(op.out_proj.weight) @ y + to_np(op.out_proj.bias)[:, None]).T


@both_dct_backends
@pytest.mark.parametrize("length", [9, 12])
def test_dct_operator_matches_direct_reference(length):
    op = OrchidOperator(4, 12, transform="dct", conditioning="abs", filter_spectrum="convolution").double()
    with torch.no_grad():
        for long_filter in (op.static_filter, op.residual_filter):
            long_filter.ffn[-1].weight.mul_(10.0)  # kernels well above the skip terms, so a wrong one shows
    x = torch.randn(1, length, 4, dtype=torch.float64)
    np.testing.assert_allclose(to_np(op(x)[0]), reference_dct_operator(op, x), atol=1e-9, rtol=0)


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


@both_dct_backends
def test_shift_equivariance_test_detects_a_non_equivariant_operator():
    # The DCT path has an even-symmetric boundary instead of wrap-around: it is not equivariant, which shows the
    # equivariance check above is able to fail.
    op = OrchidOperator(6, 24, transform="dct").double()
    x = torch.randn(1, 24, 6, dtype=torch.float64)
    error = (op(torch.roll(x, 5, dims=1)) - torch.roll(op(x), 5, dims=1)).abs().max()
    assert error > 1e-3


@both_dct_backends
@pytest.mark.parametrize("conditioning", ["abs", "xcorr"])
def test_the_dct_kernel_moves_with_its_input_even_away_from_the_boundaries(conditioning):
    # docs/model.md: the data-dependent kernel is invariant to shifts under the FFT only. A DCT coefficient's magnitude
    # depends on where the signal lies, not only at the boundaries: moving a signal that lies well inside the
    # sequence changes the DCT-mode kernel by a large fraction.
    n, channels, shift = 64, 4, 5
    v = torch.zeros(1, n, channels, dtype=torch.float64)
    v[:, 20:36] = torch.randn(1, 16, channels, dtype=torch.float64)
    change = {}
    for transform in ("dct", "fft"):
        network = ConditioningNetwork(channels, transform, conditioning).double()
        kernel, moved = network(v, n), network(v.roll(shift, dims=1), n)
        change[transform] = ((moved - kernel).abs().norm() / kernel.abs().norm()).item()
    assert change["fft"] < 1e-12
    assert change["dct"] > 0.05


# ---------------------------------------------------------------------------------------------
# Padding: invariance on either side, garbage and NaN in padded positions, the mask convention
# ---------------------------------------------------------------------------------------------


@both_dct_backends
@pytest.mark.parametrize("transform", ["dct", "fft"])
@pytest.mark.parametrize("conditioning", ["abs", "xcorr"])
def test_output_does_not_depend_on_padding_or_batch_mates(transform, conditioning):
    max_len, d = 32, 8
    op = OrchidOperator(d, max_len, transform=transform, conditioning=conditioning, conditioning_time_layers=2)
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
    assert torch.isfinite(out).all()


@both_dct_backends
@pytest.mark.parametrize("transform", ["dct", "fft"])
@pytest.mark.parametrize("conditioning", ["abs", "xcorr"])
def test_left_padding_and_holes_give_the_outputs_of_right_padding(transform, conditioning):
    op = OrchidOperator(6, 16, transform=transform, conditioning=conditioning).double()
    tokens = torch.randn(1, 7, 6, dtype=torch.float64)
    alone = op(tokens)
    garbage = 3 * torch.randn(1, 5, 6, dtype=torch.float64)
    left = torch.cat([garbage, tokens], dim=1)
    left_mask = torch.tensor([[0] * 5 + [1] * 7])
    torch.testing.assert_close(op(left, left_mask)[:, 5:], alone, atol=1e-10, rtol=0)
    # A hole in the middle: the real tokens in order, wherever they are.
    holes = torch.cat([tokens[:, :3], garbage[:, :2], tokens[:, 3:]], dim=1)
    holes_mask = torch.tensor([[1, 1, 1, 0, 0, 1, 1, 1, 1]])
    out = op(holes, holes_mask)
    torch.testing.assert_close(torch.cat([out[:, :3], out[:, 5:]], dim=1), alone, atol=1e-10, rtol=0)
    # Rows padded on different sides in one batch, and the cross-conditioning sequence padded on the left too.
    right = torch.cat([tokens, garbage], dim=1)
    batch = torch.cat([left, right], dim=0)
    batch_mask = torch.cat([left_mask, left_mask.flip(1)], dim=0)
    out = op(batch, batch_mask)
    torch.testing.assert_close(out[:1, 5:], alone, atol=1e-10, rtol=0)
    torch.testing.assert_close(out[1:, :7], alone, atol=1e-10, rtol=0)
    u = torch.randn(1, 4, 6, dtype=torch.float64)
    u_left = torch.cat([torch.randn(1, 3, 6, dtype=torch.float64), u], dim=1)
    crossed = op(tokens, conditioning_input=u_left, conditioning_mask=torch.tensor([[0, 0, 0, 1, 1, 1, 1]]))
    torch.testing.assert_close(crossed, op(tokens, conditioning_input=u), atol=1e-10, rtol=0)


@both_dct_backends
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), 1e30])
@pytest.mark.parametrize("side", ["right", "left"])
def test_non_finite_values_at_padded_positions_never_reach_real_tokens(value, side):
    op = OrchidOperator(6, 16, conditioning="xcorr")
    tokens = torch.randn(1, 9, 6, requires_grad=True)
    bad = torch.full((1, 4, 6), value)
    x = torch.cat([tokens, bad], dim=1) if side == "right" else torch.cat([bad, tokens], dim=1)
    mask = torch.tensor([[1] * 9 + [0] * 4]) if side == "right" else torch.tensor([[0] * 4 + [1] * 9])
    out = op(x, mask)
    real = out[:, :9] if side == "right" else out[:, 4:]
    torch.testing.assert_close(real, op(tokens), atol=1e-5, rtol=1e-5)
    real.square().sum().backward()
    assert torch.isfinite(tokens.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in op.parameters())


@pytest.mark.parametrize("dtype", [torch.bool, torch.int32, torch.long, torch.float32, torch.float16])
def test_masks_of_any_binary_dtype_agree(dtype):
    op = OrchidOperator(4, 12)
    x = torch.randn(2, 12, 4)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 8:] = 0
    torch.testing.assert_close(op(x, mask.to(dtype)), op(x, mask), atol=0, rtol=0)


@pytest.mark.parametrize(
    "mask_values,message",
    [
        ([0.0, -10000.0], r"0 / -10000 or -inf, are not accepted\), got values from -10000.0 to -10000.0"),
        ([1.0, -float("inf")], r"got values from -inf to -inf"),
        ([1.0, 2.0], r"must hold 1 for real tokens and 0 for padding.*got values from 2.0 to 2.0"),
        ([1.0, 0.5], r"got values from 0.5 to 0.5"),
    ],
)
def test_non_binary_masks_are_refused_naming_the_convention(mask_values, message):
    op = OrchidOperator(4, 12)
    mask = torch.tensor([mask_values[0]] * 6 + [mask_values[1]] * 6).unsqueeze(0)
    with pytest.raises(ValueError, match=message):
        op(torch.randn(1, 12, 4), mask)


@both_dct_backends
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


@pytest.mark.slow
@both_dct_backends
@pytest.mark.parametrize("transform", ["dct", "fft"])
@pytest.mark.parametrize("conditioning,activation", [("abs", "identity"), ("xcorr", "identity"), ("xcorr", "tanh")])
def test_gradcheck(transform, conditioning, activation):
    op = OrchidOperator(
        3, 7, transform=transform, conditioning=conditioning, conditioning_activation=activation, filter_width=8
    ).double()
    x = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 1, 0]])  # padding on both sides of the second row
    assert torch.autograd.gradcheck(lambda inp: op(inp, mask), (x,), eps=1e-6, atol=1e-5)
    # Gradients with respect to the parameters, through the conditioning network and both filters.
    params = list(op.parameters())
    grads = torch.autograd.grad(op(x, mask).square().sum(), params)
    assert all(torch.isfinite(g).all() for g in grads)
    assert all(g.abs().sum() > 0 for g in grads), "every parameter takes part in the output"


@both_dct_backends
@pytest.mark.parametrize("length", [1, 2, 7, 31, 48, 63])
@pytest.mark.parametrize("transform", ["dct", "fft"])
def test_any_length_up_to_max_len(length, transform):
    op = OrchidOperator(8, 63, transform=transform)
    y = op(torch.randn(3, length, 8))
    assert y.shape == (3, length, 8)
    assert torch.isfinite(y).all()


@both_dct_backends
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


@both_dct_backends
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("transform", ["dct", "fft"])
def test_half_precision_weights_run_with_transforms_in_float32(dtype, transform):
    torch.manual_seed(0)
    op = OrchidOperator(8, 16, transform=transform)
    x = torch.randn(2, 16, 8)
    expected = op(x).detach()
    half = op.to(dtype)
    y = half(x.to(dtype))
    assert y.dtype == dtype and torch.isfinite(y).all()
    torch.testing.assert_close(y.float(), expected, atol=0.1, rtol=0.1)


def test_a_sequence_of_65536_positions_runs_in_one_call():
    # An L x L float32 matrix at L = 2^16 would need 16 GiB; the operator's buffers grow with L (the benchmark
    # measures its memory by length).
    op = OrchidOperator(2, 2**16, filter_width=4)
    with torch.no_grad():
        y = op(torch.randn(1, 2**16, 2))
    assert y.shape == (1, 2**16, 2)


def test_static_kernel_only_mode_has_no_conditioning_network():
    op = OrchidOperator(4, 16, data_dependent=False)
    assert op.conditioning is None
    assert op(torch.randn(1, 16, 4)).shape == (1, 16, 4)
    with pytest.raises(ValueError, match="conditioning_input needs the data-dependent kernel"):
        op(torch.randn(1, 16, 4), conditioning_input=torch.randn(1, 16, 4))


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
    with pytest.raises(ValueError, match=r"batch size 0"):
        op(torch.randn(0, 4, 8))
    with pytest.raises(ValueError, match=r"shape \(batch, length, 8\)"):
        op(torch.randn(4, 8))
    with pytest.raises(ValueError, match=r"must be a floating-point tensor, got torch.int64"):
        op(torch.ones(1, 4, 8, dtype=torch.long))
    with pytest.raises(ValueError, match=r"conditioning_input has batch size 3, x has 1"):
        op(torch.randn(1, 4, 8), conditioning_input=torch.randn(3, 4, 8))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(transform="wavelet"), r"transform must be one of \('dct', 'fft'\), got 'wavelet'"),
        (dict(conditioning="attention"), r"conditioning must be one of \('abs', 'xcorr'\), got 'attention'"),
        (dict(conditioning_activation="relu"), r"conditioning_activation must be one of"),
        (dict(filter_spectrum="dft"), r"filter_spectrum must be one of \('listing1', 'convolution'\), got 'dft'"),
        (dict(short_conv_size=4), r"short_conv_size must be a positive odd integer \(centred\), got 4"),
        (dict(short_conv_size=17), r"short_conv_size=17 is longer than the input, max_len=16"),
        (dict(conditioning_time_layers=-1), r"conditioning_time_layers must be a non-negative integer, got -1"),
        (dict(filter_width=2.5), r"filter_width must be a positive integer, got 2.5"),
        (dict(filter_sin_frequency=float("nan")), r"filter_sin_frequency must be a finite number, got nan"),
        (dict(data_dependent="yes"), r"data_dependent must be True or False, got 'yes'"),
        (dict(conditioning_time_layers=0, conditioning_freq_layers=0), r"both 0"),
        (dict(max_len=0), r"max_len must be a positive integer, got 0"),
        (dict(d_model=8.0), r"d_model must be a positive integer, got 8.0"),
        (dict(filter_size=3), r"unknown settings \['filter_size'\]"),
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
    dense = torch.block_diag(*(block.weight for block in layer.blocks))  # (8, 12)
    bias = torch.cat([block.bias for block in layer.blocks])
    for shape in ((3, 5, 12), (7, 12), (2, 3, 4, 12)):
        x = torch.randn(*shape)
        torch.testing.assert_close(layer(x), F.linear(x, dense, bias))
    strided = torch.randn(3, 5, 20)[..., 4:16]
    torch.testing.assert_close(layer(strided), F.linear(strided, dense, bias))
    assert sum(p.numel() for p in layer.parameters()) == 12 * 8 // 4 + 8
    assert all(isinstance(block, torch.nn.Linear) for block in layer.blocks)


def test_block_diagonal_linear_rejects_indivisible_sizes():
    with pytest.raises(ValueError, match=r"in_features=10 and out_features=8 must both be divisible by num_blocks=4"):
        BlockDiagonalLinear(10, 8, num_blocks=4)
    with pytest.raises(ValueError, match=r"expected 12 input features, got 8"):
        BlockDiagonalLinear(12, 8, num_blocks=4)(torch.randn(2, 8))


@both_dct_backends
@pytest.mark.parametrize("transform", ["dct", "fft"])
@pytest.mark.parametrize("conditioning", ["abs", "xcorr"])
def test_without_autograd_a_long_input_is_mixed_a_block_of_channels_at_a_time_with_the_same_outputs(
    transform, conditioning, monkeypatch
):
    # Blocks of 32 channels at this small size (a block holds 2 x 64 positions x 32 channels).
    monkeypatch.setattr(orchid_ops, "CHANNEL_BLOCK_ELEMENTS", 2 * 64 * 32)
    op = OrchidOperator(128, 64, transform=transform, conditioning=conditioning, conditioning_activation="tanh")
    x = torch.randn(2, 64, 128)
    mask = torch.ones(2, 64, dtype=torch.long)
    mask[1, :10] = 0
    calls = []
    convolve = orchid_ops.gated_long_convolution
    monkeypatch.setattr(orchid_ops, "gated_long_convolution",
                        lambda s1, *args: calls.append(s1.shape[-1]) or convolve(s1, *args))  # fmt: skip
    whole = op(x, mask)  # under autograd: all channels at once
    assert calls == [128]
    calls.clear()
    with torch.no_grad():
        blocks = op(x, mask)
    assert calls == [32] * 4
    torch.testing.assert_close(blocks, whole.detach(), atol=0, rtol=0)
