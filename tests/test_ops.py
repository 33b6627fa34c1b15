"""Each fast operation of modeling/orchid_ops.py against its plain reference (``*_ref``, written as the paper defines
it), in float64, on every DCT backend; and the order that puts the real tokens of padded rows first."""

import pytest
import torch
from orchid_hf.modeling import orchid_ops
from orchid_hf.modeling.orchid_ops import (
    RowGroup,
    SequenceLayout,
    dct,
    dct_ref,
    gated_long_convolution,
    gated_long_convolution_ref,
    idct,
    idct_ref,
    kernel_spectrum,
    long_convolution,
    long_convolution_ref,
    packing_order,
    short_convolution,
    short_convolution_ref,
)

SHAPES = [(1, 1), (5, 5), (5, 8), (17, 32), (64, 64)]  # (length, transform length)


@pytest.fixture(params=["matrix", "pocketfft", "torch"])
def backend(request, monkeypatch):
    """The DCT's three ways: a product with its matrix (short transforms), pocketfft (the CPU), torch's real FFT."""
    if request.param != "matrix":
        monkeypatch.setattr(orchid_ops, "MATRIX_DCT_MAX_LENGTH", 0)
    if request.param == "torch":
        monkeypatch.setattr(orchid_ops, "scipy_fft", None)
    assert orchid_ops.uses_pocketfft(torch.zeros(1, dtype=torch.float64)) == (request.param != "torch")
    return request.param


@pytest.mark.parametrize("length,n", SHAPES)
def test_dct_and_idct_equal_their_matrix_references(backend, length, n):
    torch.manual_seed(0)
    x = torch.randn(3, length, 4, dtype=torch.float64)
    torch.testing.assert_close(dct(x, 1, n), dct_ref(x, 1, n), rtol=1e-12, atol=1e-12)
    spectrum = torch.randn(3, n, 4, dtype=torch.float64)
    torch.testing.assert_close(idct(spectrum, 1, length), idct_ref(spectrum, 1, length), rtol=1e-12, atol=1e-12)


def test_the_matrix_reference_is_orthonormal_and_inverts():
    x = torch.randn(2, 9, dtype=torch.float64)
    torch.testing.assert_close(idct_ref(dct_ref(x)), x, rtol=1e-12, atol=1e-12)
    matrix = orchid_ops.dct_matrix(9)
    torch.testing.assert_close(matrix @ matrix.T, torch.eye(9, dtype=torch.float64), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("transform", ["dct", "fft"])
@pytest.mark.parametrize("length,n", SHAPES)
def test_long_convolution_equals_its_reference(backend, transform, length, n):
    torch.manual_seed(0)
    x = torch.randn(2, length, 3, dtype=torch.float64)
    kernel = torch.randn(n, 3, dtype=torch.float64)
    multiplier = kernel_spectrum(kernel, transform, dim=0)
    expected = long_convolution_ref(x, multiplier, transform, n)
    torch.testing.assert_close(long_convolution(x, multiplier, transform, n), expected, rtol=1e-10, atol=1e-10)
    if transform == "dct":  # any real multiplier, as Listing 1's dct(h0), and one per row (data-dependent)
        multiplier = torch.randn(2, n, 3, dtype=torch.float64)
        expected = long_convolution_ref(x, multiplier, transform, n)
        torch.testing.assert_close(long_convolution(x, multiplier, transform, n), expected, rtol=1e-10, atol=1e-10)


def test_the_fft_reference_is_the_circular_convolution_of_the_kernel():
    """The reference itself, against the sum written with explicit indices."""
    torch.manual_seed(0)
    n, length = 8, 5
    x = torch.randn(1, length, 1, dtype=torch.float64)
    kernel = torch.randn(n, 1, dtype=torch.float64)
    y = long_convolution_ref(x, torch.fft.rfft(kernel, dim=0), "fft", n)
    for t in range(length):
        expected = sum(kernel[(t - s) % n, 0] * x[0, s, 0] for s in range(length))
        torch.testing.assert_close(y[0, t, 0], expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("transform", ["dct", "fft"])
def test_gated_long_convolution_equals_its_reference_with_padding(backend, transform):
    torch.manual_seed(0)
    batch, length, n, d = 3, 6, 8, 4
    s1, v, s2 = (torch.randn(batch, length, d, dtype=torch.float64) for _ in range(3))
    multiplier = kernel_spectrum(torch.randn(n, d, dtype=torch.float64), transform, dim=0)
    mask = torch.ones(batch, length, 1, dtype=torch.bool)
    mask[1, 4:] = False
    v[1, 4:] = float("nan")  # what padding holds never reaches a real position
    ours = gated_long_convolution(s1, v, s2, multiplier, mask, transform, n, torch.float64)
    reference = gated_long_convolution_ref(s1, v, s2, multiplier, mask, transform, n, torch.float64)
    real = mask.expand_as(ours)
    torch.testing.assert_close(ours[real], reference[real], rtol=1e-10, atol=1e-10)
    assert torch.isfinite(ours[real]).all()


@pytest.mark.parametrize("wrap", [True, False])
@pytest.mark.parametrize("kernel_size", [1, 3, 5])
@pytest.mark.parametrize("length", [1, 2, 3, 10])
def test_short_convolution_equals_conv1d(wrap, kernel_size, length):
    torch.manual_seed(0)
    x = torch.randn(2, length, 6, dtype=torch.float64)
    weight = torch.randn(6, 1, kernel_size, dtype=torch.float64)
    bias = torch.randn(6, dtype=torch.float64)
    torch.testing.assert_close(
        short_convolution(x, weight, bias, wrap), short_convolution_ref(x, weight, bias, wrap), rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize("seed", range(5))
def test_packing_order_is_a_stable_sort_of_the_padding_and_the_layout_round_trips(seed):
    generator = torch.Generator().manual_seed(seed)
    mask = torch.rand(6, 11, generator=generator) < 0.6
    mask[0] = True  # no padding
    mask[1, 4:] = False  # right padding
    mask[2, :7] = False  # left padding
    expected = torch.sort((~mask).to(torch.uint8), dim=1, stable=True).indices
    assert torch.equal(packing_order(mask), expected)
    layout = SequenceLayout.from_mask(mask.long(), (11,))
    x = torch.randn(6, 11, 3, generator=generator)
    packed = layout.pack(x)
    for row in range(6):
        count = int(mask[row].sum())
        assert torch.equal(packed[row, :count], x[row][mask[row]])
        assert torch.equal(layout.mask[row, :, 0], torch.arange(11) < count)
    assert torch.equal(layout.unpack(packed), x)


def test_a_layout_of_rows_padded_on_the_right_takes_no_order():
    mask = torch.ones(3, 8, dtype=torch.long)
    mask[1, 5:] = 0
    layout = SequenceLayout.from_mask(mask, (8,))
    assert layout.order is None and torch.equal(layout.mask[..., 0], mask.bool())
    assert SequenceLayout.from_mask(None, (8,), 8) == SequenceLayout(groups=(RowGroup(8, 8),))


def test_a_first_transform_under_inference_mode_leaves_later_training_calls_working():
    """The DCT matrices are kept between calls; one first made under torch.inference_mode() must serve autograd."""
    orchid_ops._TRANSFORM_MATRICES.clear()
    x = torch.randn(2, 24, 3)
    with torch.inference_mode():
        expected = dct(x, 1)
    y = torch.randn(2, 24, 3, requires_grad=True)
    dct(y, 1).square().sum().backward()
    torch.testing.assert_close(dct(x, 1), expected)
    assert y.grad is not None
