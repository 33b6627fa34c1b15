"""Each fast operation of modeling/orchid_ops.py against its plain reference (``*_ref``, written as the paper defines
it), in float64, on every DCT backend; and the order that puts the real tokens of padded rows first."""

import numpy as np
import pytest
import scipy.fft
import torch
from orchid_hf.modeling import orchid_ops
from orchid_hf.modeling.orchid_ops import (
    SequenceGroup,
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
    masked,
    packing_order,
    short_convolution,
    short_convolution_ref,
    transform_length,
)

SHAPES = [(1, 1), (5, 5), (5, 8), (17, 32), (64, 64)]  # (length, transform length)


@pytest.fixture(params=["matrix", "pocketfft", "fft"])
def backend(request, monkeypatch):
    """The DCT's three backends (:func:`dct_backend`): a product with its matrix, pocketfft (the CPU), torch's real
    FFT (Makhoul's algorithm), each made to serve every length."""
    monkeypatch.setattr(orchid_ops, "MATRIX_DCT_MAX_LENGTH", 10**6 if request.param == "matrix" else 0)
    if request.param == "fft":
        monkeypatch.setattr(orchid_ops, "scipy_fft", None)
    assert orchid_ops.dct_backend(torch.zeros(1, dtype=torch.float64), 64) == request.param
    return request.param


@pytest.mark.parametrize("length,n", [*SHAPES, (100, 200), (129, 256), (300, 300)])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_dct_and_idct_equal_scipy_on_every_backend_along_any_axis(backend, length, n, dim):
    """Each backend against SciPy in float64 (the matrix backend serves up to MATRIX_DCT_MAX_LENGTH points, the other
    two beyond it): the DCT of x zero-padded to n, and the inverse cut back to x's length."""
    torch.manual_seed(0)
    x = torch.randn(*[length if axis == dim else 3 for axis in range(3)], dtype=torch.float64)
    expected = scipy.fft.dct(x.numpy(), n=n, axis=dim, norm="ortho")
    np.testing.assert_allclose(dct(x, dim, n).numpy(), expected, atol=1e-12, rtol=0)
    spectrum = torch.from_numpy(expected)
    inverse = scipy.fft.idct(expected, axis=dim, norm="ortho").take(range(length), axis=dim)
    np.testing.assert_allclose(idct(spectrum, dim, length).numpy(), inverse, atol=1e-12, rtol=0)
    np.testing.assert_allclose(idct(spectrum, dim, length).numpy(), x.numpy(), atol=1e-12, rtol=0)


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
def test_packing_order_is_a_stable_sort_of_the_padding(seed):
    generator = torch.Generator().manual_seed(seed)
    mask = torch.rand(6, 11, generator=generator) < 0.6
    mask[0] = True  # no padding
    mask[1, 4:] = False  # right padding
    mask[2, :7] = False  # left padding
    expected = torch.sort((~mask).to(torch.uint8), dim=1, stable=True).indices
    assert torch.equal(packing_order(mask), expected)


def padded_mask(seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    mask = torch.rand(6, 40, generator=generator) < 0.6
    mask[0] = True  # no padding
    mask[1, 4:] = False  # right padding
    mask[2, :27] = False  # left padding
    mask[3] = False
    mask[3, 0] = True  # one token
    return mask


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("traced", [False, True])
def test_the_layout_gives_each_sequence_from_its_first_token_at_its_transform_length(seed, traced):
    """Eager, the tokens are the real ones, row after row; traced, every position. Either way each group's rows are
    its sequences' real tokens from position 0, zero after, each sequence in exactly one group (its own transform
    length), and join and restore put every token back."""
    mask = padded_mask(seed)
    lengths = (8, 16, 40)
    build = SequenceLayout.traced if traced else SequenceLayout.from_mask
    layout = build(mask, lengths, tuple(mask.shape), torch.device("cpu"))
    x = torch.randn(*mask.shape, 3, dtype=torch.float64)
    tokens = layout.gather(x).reshape(-1, 3)
    assert tokens.shape[0] == (mask.numel() if traced else int(mask.sum()))
    seen = []
    for group in layout.groups:
        rows = group.take(tokens)
        for row, index in zip(rows, group.index):
            real = index < layout.num_tokens
            if not real.any():
                continue  # traced: a row of another group
            count = int(real.sum())
            assert torch.equal(real, torch.arange(len(index)) < count)
            matches = [b for b in range(mask.shape[0]) if int(mask[b].sum()) == count
                       and torch.equal(row[:count], x[b][mask[b]])]  # fmt: skip
            assert matches and transform_length(count, lengths) == group.n
            assert torch.equal(row[count:], torch.zeros_like(row[count:]))
            seen.append(matches[0])
    assert sorted(seen) == list(range(mask.shape[0]))
    parts = [group.take(tokens) for group in layout.groups]
    torch.testing.assert_close(layout.join(parts), masked(tokens, layout.real.reshape(-1, 1)) if traced else tokens)
    torch.testing.assert_close(layout.restore(layout.gather(x)), masked(x, mask.unsqueeze(-1)))


def test_a_batch_without_padding_is_its_own_tokens_and_one_group():
    layout = SequenceLayout.from_mask(torch.ones(3, 8, dtype=torch.bool), (8, 16), (3, 8), torch.device("cpu"))
    assert layout.tokens is None and len(layout.groups) == 1 and layout.groups[0].index is None
    x = torch.randn(3, 8, 2)
    assert layout.gather(x) is x and layout.restore(x) is x
    assert SequenceLayout.from_mask(None, (8,), (3, 8), torch.device("cpu")).groups == (SequenceGroup(8, shape=(3, 8)),)


def test_packed_sequences_are_mixed_apart():
    layout = SequenceLayout.from_packed([0, 5, 7], [5, 2, 30], (8, 16, 40), (1, 37), torch.device("cpu"))
    tokens = torch.arange(37, dtype=torch.float64).unsqueeze(-1)
    rows = {group.n: group.take(tokens)[..., 0] for group in layout.groups}
    assert rows[8].tolist() == [[0, 1, 2, 3, 4], [5, 6, 0, 0, 0]]
    assert rows[40].tolist() == [list(range(7, 37))]


def test_a_first_transform_under_inference_mode_leaves_later_training_calls_working():
    """The DCT matrices are kept between calls; one first made under torch.inference_mode() must serve autograd."""
    orchid_ops._CONSTANTS.clear()
    x = torch.randn(2, 24, 3)
    with torch.inference_mode():
        expected = dct(x, 1)
    y = torch.randn(2, 24, 3, requires_grad=True)
    dct(y, 1).square().sum().backward()
    torch.testing.assert_close(dct(x, 1), expected)
    assert y.grad is not None
