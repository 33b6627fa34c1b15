"""Orchid in two dimensions: the 2-D operations against SciPy, NumPy and direct sums, the 2-D operator (gradients,
shift equivariance on the torus, a reference forward pass), and the image models that use it (``image_mixer="2d"``,
hybrid ``layer_types`` with ViT's attention): configs and their errors, save/load, remote code, training,
torch.compile, ONNX and the image recipe. The report of the comparison (experiments/images_2d.py) is tested in
tests/test_images_2d_report.py."""

import json
import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import scipy.fft
import torch
from orchid_hf.modeling.configuration_orchid import layer_pattern
from orchid_hf.modeling.orchid_layers import (
    ConditioningNetwork2d,
    FoldedFilter,
    ImplicitFilter2d,
    ShortConvolution2d,
    cross_spectrum,
)
from orchid_hf.modeling.orchid_ops import (
    circular_convolution_2d_ref,
    forward_transform_2d,
    kernel_spectrum_2d,
    long_convolution_2d,
    long_convolution_2d_ref,
    short_convolution_2d,
    short_convolution_2d_ref,
    symmetric_convolution_2d_ref,
)
from transformers import AutoModelForImageClassification, Trainer, TrainingArguments
from transformers.models.vit.modeling_vit import ViTAttention

from orchid_hf import (
    OrchidConfig,
    OrchidForImageClassification,
    OrchidModel,
    OrchidOperator,
    OrchidOperator2d,
    optimize_for_inference,
)

from .test_models import tiny_image_config

TRANSFORMS = ["dct", "fft"]
CONDITIONINGS = ["abs", "xcorr"]
GRIDS = [(5, 7), (6, 4)]  # rectangular, odd and even sides: a swapped axis or a wrong half-spectrum shows


def grid_input(grid, batch=2, channels=3, seed=0, dtype=torch.float64):
    return torch.randn(batch, *grid, channels, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def tiny_2d_config(**overrides) -> OrchidConfig:
    """A small 2-D image model: 16x16 images in 4x4 patches, a 4 x 4 grid."""
    return tiny_image_config(**{"image_mixer": "2d", "filter_width": 16, **overrides})


def pixels(batch=3, size=16, channels=3, seed=1):
    return torch.randn(batch, channels, size, size, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------
# The 2-D operations against SciPy, NumPy and direct sums (float64)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("grid", GRIDS)
def test_the_2d_transforms_are_scipys_dctn_and_numpys_rfftn(grid):
    x = grid_input(grid)
    expected_dct = scipy.fft.dctn(x.numpy(), axes=(1, 2), norm="ortho")
    torch.testing.assert_close(forward_transform_2d(x, "dct"), torch.from_numpy(expected_dct), atol=1e-12, rtol=0)
    expected_fft = np.fft.rfftn(x.numpy(), axes=(1, 2), norm="ortho")
    torch.testing.assert_close(forward_transform_2d(x, "fft"), torch.from_numpy(expected_fft), atol=1e-12, rtol=0)
    # rfftn's half axis is the columns: (B, H, W // 2 + 1, C); the full complex FFT runs along the rows.
    assert forward_transform_2d(x, "fft").shape == (2, grid[0], grid[1] // 2 + 1, 3)
    full = np.fft.fftn(x.numpy(), axes=(1, 2), norm="ortho")[:, :, : grid[1] // 2 + 1]
    torch.testing.assert_close(forward_transform_2d(x, "fft"), torch.from_numpy(full), atol=1e-12, rtol=0)


@pytest.mark.parametrize("grid", GRIDS)
def test_the_kernel_spectrum_is_numpys_rfftn_and_the_dct_of_the_even_extension_along_each_axis(grid):
    kernel = grid_input(grid, batch=1)[0]
    expected = np.fft.rfftn(kernel.numpy(), axes=(0, 1))
    torch.testing.assert_close(kernel_spectrum_2d(kernel, "fft"), torch.from_numpy(expected), atol=1e-12, rtol=0)
    # Under the DCT the multiplier is real and separable: the 1-D kernel spectrum along the rows, then the columns,
    # equals the 2-D real FFT of the kernel extended evenly along both axes (first H x W coefficients).
    rows, columns = grid
    even = kernel.numpy()
    for axis, size in ((0, rows), (1, columns)):
        zero = np.zeros_like(np.take(even, [0], axis=axis))
        even = np.concatenate([even, zero, np.flip(np.take(even, range(1, size), axis=axis), axis)], axis)
    expected = np.fft.fftn(even, axes=(0, 1))[:rows, :columns]
    assert np.abs(expected.imag).max() < 1e-9
    torch.testing.assert_close(kernel_spectrum_2d(kernel, "dct"), torch.from_numpy(expected.real), atol=1e-10, rtol=0)


@pytest.mark.parametrize("grid", GRIDS)
def test_the_fft_long_convolution_is_the_circular_convolution_on_the_torus(grid):
    x, kernel = grid_input(grid, seed=1), grid_input(grid, batch=1, seed=2)[0]
    got = long_convolution_2d(x, kernel_spectrum_2d(kernel, "fft"), "fft")
    torch.testing.assert_close(got, circular_convolution_2d_ref(x, kernel), atol=1e-10, rtol=0)
    # The direct sum itself, for one output: y[t, u] = sum_{s, v} h[(t - s) mod H, (u - v) mod W] x[s, v].
    rows, columns = grid
    t, u = 3, 1
    direct = sum(
        kernel[(t - s) % rows, (u - v) % columns] * x[:, s, v] for s in range(rows) for v in range(columns)
    )
    torch.testing.assert_close(got[:, t, u], direct, atol=1e-10, rtol=0)


@pytest.mark.parametrize("grid", GRIDS)
def test_the_dct_long_convolution_is_the_symmetric_convolution_of_the_mirrored_grid(grid):
    x, kernel = grid_input(grid, seed=3), grid_input(grid, batch=1, seed=4)[0]
    got = long_convolution_2d(x, kernel_spectrum_2d(kernel, "dct"), "dct")
    torch.testing.assert_close(got, symmetric_convolution_2d_ref(x, kernel), atol=1e-10, rtol=0)


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("grid", GRIDS)
def test_the_long_convolution_matches_its_reference_for_any_multiplier_per_example(transform, grid):
    x = grid_input(grid, seed=5)
    width = grid[1] if transform == "dct" else grid[1] // 2 + 1
    multiplier = torch.randn(2, grid[0], width, 3, dtype=torch.float64)
    if transform == "fft":
        multiplier = torch.complex(multiplier, torch.randn_like(multiplier))
        # A real kernel's spectrum: the reference goes back to the kernel with irfftn.
        multiplier = torch.fft.rfftn(torch.fft.irfftn(multiplier, s=grid, dim=(1, 2)), dim=(1, 2))
    got = long_convolution_2d(x, multiplier, transform)
    torch.testing.assert_close(got, long_convolution_2d_ref(x, multiplier, transform), atol=1e-10, rtol=0)


@pytest.mark.parametrize("wrap", [True, False])
@pytest.mark.parametrize("size", [1, 3, 5])
def test_the_short_convolution_is_the_direct_sum_and_nn_conv2d(wrap, size):
    x = grid_input((5, 7), channels=4, seed=6)
    conv = torch.nn.Conv2d(4, 4, size, padding=size // 2, groups=4, padding_mode="circular" if wrap else "zeros")
    conv = conv.double()
    got = short_convolution_2d(x, conv.weight, conv.bias, wrap)
    torch.testing.assert_close(got, short_convolution_2d_ref(x, conv.weight, conv.bias, wrap), atol=1e-12, rtol=0)
    with torch.no_grad():
        expected = conv(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)


def test_the_2d_short_convolution_has_nn_conv2ds_parameters_and_initialisation():
    torch.manual_seed(0)
    conv = ShortConvolution2d(64, 3, circular=True)
    assert conv.weight.shape == (64, 1, 3, 3) and conv.bias.shape == (64,) and conv.fan_in == 9
    bound = 1 / math.sqrt(9)  # nn.Conv2d's: a fan-in of k * k per channel
    assert conv.weight.abs().max() <= bound and conv.weight.abs().max() > 0.9 * bound
    assert conv.bias.abs().max() <= bound and conv.bias.abs().max() > 0.9 * bound
    model = OrchidForImageClassification(tiny_2d_config())
    short = model.orchid.encoder.layer[0].mixer.short_conv
    assert short.weight.abs().max() <= bound and short.weight.std() > 0.1  # not BERT's normal(0.02)


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_gradcheck_of_the_2d_operations(transform):
    grid = (3, 4)
    x = grid_input(grid, batch=1, channels=2, seed=7).requires_grad_()
    kernel = grid_input(grid, batch=1, channels=2, seed=8)[0].requires_grad_()
    assert torch.autograd.gradcheck(
        lambda x, h: long_convolution_2d(x, kernel_spectrum_2d(h, transform), transform), (x, kernel)
    )
    assert torch.autograd.gradcheck(lambda x: forward_transform_2d(x, transform).abs(), (x,))


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("conditioning", CONDITIONINGS)
def test_gradcheck_of_the_2d_operator(transform, conditioning):
    torch.manual_seed(0)
    op = OrchidOperator2d(4, (3, 4), transform=transform, conditioning=conditioning, filter_width=4).double()
    x = torch.randn(2, 12, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(op, (x,))
    y = op(x)
    y.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in op.parameters() if p.requires_grad)


# ---------------------------------------------------------------------------------------------
# The 2-D operator
# ---------------------------------------------------------------------------------------------


def reference_forward(op: OrchidOperator2d, x: torch.Tensor) -> torch.Tensor:
    """The 2-D operator written with the references, float64: SciPy's dctn or NumPy's fftn for the conditioning
    network's transforms, the direct short convolution, and the long convolution by its reference."""
    batch, (rows, columns), d = x.shape[0], op.grid, op.d_model
    image = x.reshape(batch, rows, columns, d)

    def short(stack, u, wrap):
        for layer in stack.layers:
            u = short_convolution_2d_ref(u, layer.weight, layer.bias, wrap and layer.circular)
        return u

    def transform(u):
        array = u.detach().numpy()
        if op.transform == "dct":
            return torch.from_numpy(scipy.fft.dctn(array, axes=(1, 2), norm="ortho"))
        return torch.from_numpy(np.fft.fftn(array, axes=(1, 2), norm="ortho")[:, :, : columns // 2 + 1])

    projected = op.in_proj(image)
    conv = op.short_conv
    s1, s2, v = short_convolution_2d_ref(projected, conv.weight, conv.bias, conv.circular).chunk(3, dim=-1)
    kernel = op.static_filter.spectrum(torch.float64)
    net = op.conditioning
    source = projected[..., 2 * d :]
    key = transform(short(net.time_conv, source, True))
    if net.conditioning == "abs":
        spectrum = key.abs()
    else:
        spectrum = cross_spectrum(key, transform(short(net.query_conv, source, True)), net.activation)
    if spectrum.is_complex():
        spectrum = torch.complex(short(net.freq_conv, spectrum.real, False), short(net.freq_conv, spectrum.imag, False))
    else:
        spectrum = short(net.freq_conv, spectrum, False)
    y = long_convolution_2d_ref(s1 * v, kernel + spectrum, op.transform) * s2
    y = y + long_convolution_2d_ref(image, op.residual_filter.spectrum(torch.float64), op.transform)
    return op.out_proj(y).reshape(batch, rows * columns, d)


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("conditioning", CONDITIONINGS)
def test_the_operator_is_its_reference_forward_pass(transform, conditioning):
    torch.manual_seed(0)
    op = OrchidOperator2d(6, (5, 7), transform=transform, conditioning=conditioning, filter_width=8).double()
    x = torch.randn(3, 35, 6, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(op(x), reference_forward(op, x), atol=1e-10, rtol=0)


def roll_grid(x: torch.Tensor, grid, shifts) -> torch.Tensor:
    """x (B, rows * columns, d) shifted circularly on the grid by (rows, columns) = shifts."""
    return x.reshape(x.shape[0], *grid, -1).roll(shifts, dims=(1, 2)).reshape(x.shape)


@pytest.mark.parametrize("conditioning", CONDITIONINGS)
def test_the_fft_operator_is_shift_equivariant_on_the_torus(conditioning):
    torch.manual_seed(0)
    grid = (5, 6)
    op = OrchidOperator2d(8, grid, transform="fft", conditioning=conditioning, filter_width=8).double()
    x = torch.randn(2, 30, 8, dtype=torch.float64)
    with torch.no_grad():
        y = op(x)
        for shifts in [(1, 0), (0, 2), (3, 5), (-2, 1)]:
            torch.testing.assert_close(op(roll_grid(x, grid, shifts)), roll_grid(y, grid, shifts), atol=1e-11, rtol=0)
        # The data-dependent kernel itself does not move: it is invariant to shifts of the image.
        source = op.in_proj(x.reshape(2, *grid, 8))[..., 16:]
        kernel = op.conditioning(source)
        shifted = op.conditioning(source.roll((3, 5), dims=(1, 2)))
        torch.testing.assert_close(shifted, kernel, atol=1e-11, rtol=0)
        # A shift along the flattened sequence is not a shift of the image: it moves rows across the grid's edge.
        assert (op(x.roll(1, dims=1)) - y.roll(1, dims=1)).abs().max() > 1e-3


def test_the_dct_operator_is_not_shift_equivariant():
    # The DCT mixes mirror images, not a torus (as the 1-D DCT path, Sec. 3.2 derives invariance for the DFT only).
    torch.manual_seed(0)
    grid = (5, 6)
    op = OrchidOperator2d(8, grid, transform="dct", filter_width=8).double()
    x = torch.randn(2, 30, 8, dtype=torch.float64)
    with torch.no_grad():
        assert (op(roll_grid(x, grid, (1, 2))) - roll_grid(op(x), grid, (1, 2))).abs().max() > 1e-3


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_the_kernel_is_computed_from_the_image(transform):
    torch.manual_seed(0)
    net = ConditioningNetwork2d(4, transform).double()
    a, b = grid_input((5, 6), channels=4, seed=1), grid_input((5, 6), channels=4, seed=2)
    with torch.no_grad():
        ka, kb = net(a), net(b)
    assert ka.shape == (2, 5, 6 if transform == "dct" else 4, 4)
    assert (ka - kb).abs().max() > 1e-2  # another image, another kernel
    torch.testing.assert_close(net(torch.cat([a, b]))[:2], ka)  # each example its own kernel


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("spectrum", ["listing1", "convolution"])
def test_the_static_filter_is_ffn_of_2d_positions_times_the_window_and_its_spectrum(transform, spectrum):
    torch.manual_seed(0)
    grid = (5, 6)
    f = ImplicitFilter2d(8, grid, transform=transform, width=16, spectrum=spectrum).double()
    kernel = f()
    assert kernel.shape == (5, 6, 8)
    torch.testing.assert_close(kernel, f.ffn(f.lag_features.double()) * f.envelope().double())
    # PE(i, j): the 1-D lag embedding of the row lag, then of the column lag.
    assert f.lag_features.shape == (5, 6, 10)
    torch.testing.assert_close(f.lag_features[:, 0, :5], f.lag_features[:, 3, :5])
    torch.testing.assert_close(f.lag_features[0, :, 5:], f.lag_features[4, :, 5:])
    multiplier = f.spectrum(torch.float64)
    if transform == "dct" and spectrum == "listing1":
        expected = torch.from_numpy(scipy.fft.dctn(kernel.detach().numpy(), axes=(0, 1), norm="ortho"))
    else:
        expected = kernel_spectrum_2d(kernel, transform)
    torch.testing.assert_close(multiplier, expected + f.skip, atol=1e-12, rtol=0)


def test_the_windows_dimensional_by_default_and_symmetric_as_a_setting():
    grid = (6, 6)
    dimensional = ImplicitFilter2d(16, grid, transform="fft")
    symmetric = ImplicitFilter2d(16, grid, transform="fft", window="symmetric")
    assert dimensional.window == "dimensional"
    # Symmetric (Eq. 5): exp(-alpha_c (|t_i| + |t_j|)), the same along rows and columns.
    window = symmetric.envelope()
    torch.testing.assert_close(window, window.transpose(0, 1))
    t = (torch.tensor([0, 1, 2, 3, 2, 1]) / 6.0).double()
    alpha = symmetric.row_rates.double()
    expected = torch.exp(-(t[:, None, None] + t[None, :, None]) * alpha)
    torch.testing.assert_close(window.double(), expected, atol=1e-6, rtol=1e-6)
    # Dimensional (Eq. 6): exp(-(alpha_c |t_i| + beta_c |t_j|)), the pairs (alpha_c, beta_c) a grid over the range of
    # rates: every combination of slow and fast along rows and columns.
    alpha, beta = dimensional.row_rates, dimensional.column_rates
    assert len(set(zip(alpha.tolist(), beta.tolist()))) == 16
    assert alpha.min() == beta.min() and alpha.max() == beta.max() == symmetric.row_rates.max()
    fast, slow = alpha.argmax(), alpha.argmin()
    assert beta[fast] == beta.min() and beta[slow] == beta.min()  # the grid's corners
    window = dimensional.envelope()
    expected = torch.exp(-(t[:, None, None] * alpha.double() + t[None, :, None] * beta.double()))
    torch.testing.assert_close(window.double(), expected, atol=1e-6, rtol=1e-6)
    assert not torch.allclose(window, window.transpose(0, 1))
    flat = ImplicitFilter2d(16, grid, decay=False)
    assert torch.all(flat.envelope() == 1)


def test_the_filters_are_exact_after_casts():
    model = OrchidForImageClassification(tiny_2d_config(filter_window="symmetric"))
    mixer = model.orchid.encoder.layer[0].mixer
    exact = {name: buffer.clone() for name, buffer in mixer.static_filter.named_buffers()}
    model.to(torch.bfloat16).to(torch.float32)
    for name, buffer in mixer.static_filter.named_buffers():
        assert buffer.dtype == torch.float32 and torch.equal(buffer, exact[name]), name


# ---------------------------------------------------------------------------------------------
# Operator errors
# ---------------------------------------------------------------------------------------------


def test_the_operator_refuses_bad_settings_and_inputs_by_name():
    with pytest.raises(ValueError, match=r"OrchidOperator2d.grid must be two positive integers"):
        OrchidOperator2d(8, (4,))
    with pytest.raises(ValueError, match=r"OrchidOperator2d.d_model must be a positive integer, got 0"):
        OrchidOperator2d(0, (4, 4))
    with pytest.raises(ValueError, match=r"OrchidOperator2d.filter_window must be one of \('dimensional', "):
        OrchidOperator2d(8, (4, 4), filter_window="round")
    with pytest.raises(ValueError, match=r"OrchidOperator2d got unknown settings \['transfrom'\]; did you mean"):
        OrchidOperator2d(8, (4, 4), transfrom="fft")
    with pytest.raises(ValueError, match=r"OrchidOperator2d.transform must be one of"):
        OrchidOperator2d(8, (4, 4), transform="wavelet")
    with pytest.raises(ValueError, match=r"OrchidOperator2d.short_conv_size=5 is longer than the grid \(4, 3\)"):
        OrchidOperator2d(8, (4, 3), short_conv_size=5)
    with pytest.raises(ValueError, match=r"OrchidOperator2d.filter_lag_scale=16 does not apply to 2-D mixers"):
        OrchidOperator2d(8, (4, 4), filter_lag_scale=16)
    op = OrchidOperator2d(8, (4, 3), filter_width=4)
    with pytest.raises(ValueError, match=r"x has 11 positions, the 4 x 3 grid has 12"):
        op(torch.randn(2, 11, 8))
    with pytest.raises(ValueError, match=r"x has 7 features but the operator has d_model=8"):
        op(torch.randn(2, 12, 7))
    with pytest.raises(ValueError, match=r"built for a \(4, 3\) grid \(its filters are\), got grid=\(3, 4\)"):
        op(torch.randn(2, 12, 8), grid=(3, 4))
    assert op(torch.randn(2, 12, 8), grid=(4, 3)).shape == (2, 12, 8)


# ---------------------------------------------------------------------------------------------
# Configs
# ---------------------------------------------------------------------------------------------


def test_the_defaults_keep_the_1d_models_and_old_configs_load_as_they_were():
    config = tiny_image_config()
    assert config.image_mixer == "1d" and config.layer_types is None and config.filter_window is None
    assert config.resolved_layer_types == ["orchid", "orchid"]
    model = OrchidModel(config)
    assert all(type(layer.mixer) is OrchidOperator for layer in model.encoder.layer)
    saved = config.to_dict()
    for name in ("image_mixer", "filter_window", "layer_types", "num_attention_heads", "qkv_bias",
                 "attention_probs_dropout_prob"):  # fmt: skip
        saved.pop(name)
    loaded = OrchidConfig.from_dict(saved)
    assert loaded.image_mixer == "1d" and loaded.layer_types is None


def test_layer_patterns_and_lists():
    assert layer_pattern("orchid-first", 6) == ["orchid"] * 3 + ["full_attention"] * 3
    assert layer_pattern("orchid-first", 5) == ["orchid"] * 3 + ["full_attention"] * 2
    assert layer_pattern("attention-first", 5) == ["full_attention"] * 3 + ["orchid"] * 2
    assert layer_pattern("alternate", 4) == ["orchid", "full_attention"] * 2
    assert layer_pattern("attention", 2) == ["full_attention"] * 2
    config = tiny_2d_config(num_hidden_layers=3, layer_types="orchid-first")
    assert config.layer_types == ["orchid", "orchid", "full_attention"]
    # transformers' own name for global attention; "attention" is renamed to it, as PreTrainedConfig does.
    config = tiny_2d_config(layer_types=["attention", "orchid"])
    assert config.layer_types == ["full_attention", "orchid"]
    assert OrchidConfig.from_dict(config.to_dict()).layer_types == ["full_attention", "orchid"]
    hybrid = OrchidConfig.from_preset("orchid-vit-2d-hybrid-s")
    assert hybrid.layer_types == ["orchid"] * 3 + ["full_attention"] * 3 and hybrid.image_mixer == "2d"
    assert OrchidConfig.from_preset("orchid-vit-2d-hybrid-s", num_hidden_layers=4).layer_types == [
        "orchid", "orchid", "full_attention", "full_attention"
    ]  # fmt: skip


BAD_CONFIGS = [
    (dict(image_mixer="3d"), r"OrchidConfig.image_mixer must be one of \('1d', '2d'\), got '3d'"),
    (dict(filter_window="round"), r"OrchidConfig.filter_window must be one of \('dimensional', 'symmetric'\)"),
    (dict(image_mixer="1d", filter_window="symmetric"), r"filter_window='symmetric' is the window of the 2-D"),
    (dict(layer_types="hyena-first"), r"OrchidConfig.layer_types must be one of \('orchid', .*got 'hyena-first'"),
    (dict(layer_types=["orchid", "sliding_attention"]), r"OrchidConfig.layer_types must be a list of \('orchid', "),
    (dict(layer_types=["orchid"]), r"OrchidConfig.layer_types has 1 entries, num_hidden_layers=2"),
    (dict(layer_types="alternate", num_attention_heads=5), r"num_attention_heads=5 must divide hidden_size=32"),
    (dict(layer_types="alternate", attention_probs_dropout_prob=1.5), r"attention_probs_dropout_prob must be in"),
    (dict(short_conv_size=5), r"OrchidConfig.short_conv_size=5 is longer than the grid \(4, 4\)"),
    (dict(conditioning_time_kernel_size=7), r"conditioning_time_kernel_size=7 is longer than the grid \(4, 4\)"),
    (dict(filter_lag_scale=32), r"OrchidConfig.filter_lag_scale=32 does not apply to 2-D mixers"),
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "message"), BAD_CONFIGS)
def test_bad_values_are_refused_by_name(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_2d_config(**overrides)


def test_text_configs_refuse_the_image_mixers():
    from .test_models import tiny_text_config

    with pytest.raises(ValueError, match=r"image_mixer='2d' mixes a grid of patches: it needs an image config"):
        tiny_text_config(image_mixer="2d")
    with pytest.raises(ValueError, match=r"layer_types has attention layers, which image models have"):
        tiny_text_config(layer_types="alternate")


def test_an_edit_of_a_new_field_after_building_is_refused_on_save(tmp_path):
    model = OrchidForImageClassification(tiny_2d_config())
    model.config.filter_window = "symmetric"
    with pytest.raises(ValueError, match=r"config.filter_window='symmetric' but this model was built with"):
        model.save_pretrained(tmp_path)


# ---------------------------------------------------------------------------------------------
# The image models
# ---------------------------------------------------------------------------------------------


def test_the_layers_have_the_mixers_their_config_names():
    model = OrchidForImageClassification(tiny_2d_config(num_hidden_layers=4, layer_types="orchid-first"))
    mixers = [layer.mixer for layer in model.orchid.encoder.layer]
    assert [type(m) for m in mixers] == [OrchidOperator2d, OrchidOperator2d, ViTAttention, ViTAttention]
    assert mixers[0].grid == (4, 4) and mixers[0].filter_window == "dimensional"
    assert model.config._attn_implementation == "sdpa"
    one_d = OrchidForImageClassification(tiny_image_config(layer_types="alternate"))
    assert [type(layer.mixer) for layer in one_d.orchid.encoder.layer] == [OrchidOperator, ViTAttention]


@pytest.mark.parametrize(("image_size", "patch_size"), [(28, 4), (28, 2), (12, 3), (8, 8)])
def test_any_image_size_that_divides_into_patches(image_size, patch_size):
    side = image_size // patch_size
    kernel = 1 if side < 3 else 3
    config = tiny_2d_config(image_size=image_size, patch_size=patch_size, num_channels=1, layer_types="orchid-first",
                            short_conv_size=kernel, conditioning_time_kernel_size=kernel,
                            conditioning_freq_kernel_size=kernel)  # fmt: skip
    model = OrchidForImageClassification(config).eval()
    assert model.orchid.encoder.layer[0].mixer.grid == (side, side)
    output = model(pixel_values=pixels(2, image_size, 1), labels=torch.tensor([0, 1]), output_hidden_states=True)
    assert output.logits.shape == (2, 5) and torch.isfinite(output.loss)
    assert output.hidden_states[-1].shape == (2, side * side, 32)
    with pytest.raises(ValueError, match=r"pixel_values must have shape \(batch, 1, "):
        model(pixel_values=pixels(2, image_size + patch_size, 1))


@pytest.mark.parametrize("layer_types", [None, "orchid-first"])
@pytest.mark.parametrize("transform", TRANSFORMS)
def test_each_image_gets_the_same_outputs_alone_and_in_a_batch(layer_types, transform):
    torch.manual_seed(0)
    model = OrchidForImageClassification(tiny_2d_config(transform=transform, layer_types=layer_types)).eval()
    x = pixels(3)
    with torch.no_grad():
        alone = model(pixel_values=x[:1]).logits
        together = model(pixel_values=x).logits
    torch.testing.assert_close(together[:1], alone, atol=1e-5, rtol=1e-5)


def test_save_load_and_auto_class(tmp_path):
    torch.manual_seed(0)
    model = OrchidForImageClassification(tiny_2d_config(layer_types="orchid-first", transform="fft")).eval()
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["image_mixer"] == "2d" and config["layer_types"] == ["orchid", "full_attention"]
    loaded = AutoModelForImageClassification.from_pretrained(tmp_path).eval()
    assert type(loaded) is OrchidForImageClassification
    x = pixels()
    with torch.no_grad():
        torch.testing.assert_close(loaded(pixel_values=x).logits, model(pixel_values=x).logits, atol=0, rtol=0)


REMOTE_LOADER = textwrap.dedent(
    """
    import sys

    sys.modules["orchid_hf"] = None  # a user who never installed orchid_hf
    import torch, transformers
    from safetensors.torch import load_file

    folder = sys.argv[1]
    model = transformers.AutoModelForImageClassification.from_pretrained(folder, trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
    kinds = [type(layer.mixer).__name__ for layer in model.orchid.encoder.layer]
    tensors = load_file(f"{folder}/io.safetensors")
    with torch.no_grad():
        got = model(pixel_values=tensors["pixel_values"]).logits
    torch.testing.assert_close(got, tensors["expected"], atol=1e-6, rtol=1e-6)
    print("remote-ok", kinds)
    """
)


@pytest.mark.slow
def test_the_hybrid_loads_as_remote_code_without_orchid_hf(tmp_path, hf_modules_cache):
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = OrchidForImageClassification(tiny_2d_config(layer_types="orchid-first")).eval()
    folder = tmp_path / "hybrid"
    model.save_pretrained(folder)
    x = pixels()
    with torch.no_grad():
        save_file({"pixel_values": x, "expected": model(pixel_values=x).logits}, str(folder / "io.safetensors"))
    result = subprocess.run([sys.executable, "-c", REMOTE_LOADER, str(folder)], capture_output=True, text=True,
                            cwd=tmp_path, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "remote-ok ['OrchidOperator2d', 'ViTAttention']" in result.stdout, result.stdout


@pytest.mark.parametrize("layer_types", [None, "orchid-first"])
def test_the_2d_models_fit_a_batch(layer_types, one_thread):
    # AdamW moves each weight by about the learning rate a step, so a batch of 8 random images takes some twenty
    # steps to fit, at the pace of the 1-D model from the same seed (both fall by a few percent a step at first).
    torch.manual_seed(0)
    model = OrchidForImageClassification(tiny_2d_config(layer_types=layer_types))
    x, labels = pixels(8), torch.arange(8) % 5
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = model(pixel_values=x, labels=labels).loss
        losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert losses[-1] < 0.25 * losses[0], losses


def test_a_trainer_step_with_gradient_checkpointing(tmp_path, one_thread):
    torch.manual_seed(0)
    model = OrchidForImageClassification(tiny_2d_config(layer_types="orchid-first"))
    data = [{"pixel_values": image, "labels": int(i % 5)} for i, image in enumerate(pixels(8))]
    args = TrainingArguments(str(tmp_path), per_device_train_batch_size=4, max_steps=4, learning_rate=3e-3,
                             gradient_checkpointing=True, report_to="none", save_strategy="no", use_cpu=True,
                             logging_steps=1, disable_tqdm=True)  # fmt: skip
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    result = Trainer(model=model, args=args, train_dataset=data).train()
    assert math.isfinite(result.training_loss)
    changed = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
    for part in ("mixer.static_filter.ffn", "mixer.conditioning.time_conv", "mixer.q_proj", "mixer.in_proj"):
        assert any(part in name for name in changed), part


@pytest.mark.parametrize("layer_types", [None, "orchid-first"])
def test_gradient_checkpointing_gives_the_same_gradients(layer_types):
    torch.manual_seed(0)
    model = OrchidForImageClassification(tiny_2d_config(layer_types=layer_types)).train()
    x, labels = pixels(4), torch.arange(4)
    model(pixel_values=x, labels=labels).loss.backward()
    plain = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    model.gradient_checkpointing_enable()
    model(pixel_values=x, labels=labels).loss.backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, plain[name], atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("layer_types", [None, "orchid-first"])
@pytest.mark.parametrize("transform", TRANSFORMS)
def test_torch_compile_equals_eager(layer_types, transform):
    torch.manual_seed(0)
    model = OrchidForImageClassification(tiny_2d_config(layer_types=layer_types, transform=transform)).eval()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    x = pixels()
    with torch.no_grad():
        torch.testing.assert_close(compiled(pixel_values=x).logits, model(pixel_values=x).logits, atol=1e-6,
                                   rtol=1e-6)  # fmt: skip


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_half_precision_runs_the_transforms_in_float32(transform):
    torch.manual_seed(0)
    model = OrchidForImageClassification(tiny_2d_config(transform=transform, layer_types="orchid-first")).eval()
    x = pixels()
    with torch.no_grad():
        expected = model(pixel_values=x).logits
        half = AutoModelForImageClassification.from_config(model.config, dtype=torch.bfloat16)
        half.load_state_dict(model.state_dict())
        mixer = half.orchid.encoder.layer[0].mixer
        assert mixer.static_filter.skip.dtype == torch.float32 and mixer.in_proj.weight.dtype == torch.bfloat16
        got = half.eval()(pixel_values=x).logits
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, atol=0.1, rtol=0.1)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = model(pixel_values=x).logits
    torch.testing.assert_close(autocast.float(), expected, atol=0.1, rtol=0.1)


def test_the_folded_copy_gives_the_same_outputs():
    torch.manual_seed(0)
    model = OrchidForImageClassification(tiny_2d_config(layer_types="orchid-first")).eval()
    fast = optimize_for_inference(model)
    assert isinstance(fast.orchid.encoder.layer[0].mixer.static_filter, FoldedFilter)
    x = pixels()
    with torch.no_grad():
        torch.testing.assert_close(fast(pixel_values=x).logits, model(pixel_values=x).logits, atol=1e-6, rtol=1e-6)


def test_lora_adapts_the_2d_and_attention_projections():
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    model = OrchidForImageClassification(tiny_2d_config(layer_types="orchid-first"))
    config = peft.LoraConfig(r=4, target_modules=["in_proj", "out_proj", "q_proj", "v_proj"],
                             modules_to_save=["classifier"], init_lora_weights=False)  # fmt: skip
    adapted = peft.get_peft_model(model, config)
    x = pixels()
    with torch.no_grad():
        before = adapted(pixel_values=x).logits
        merged = adapted.merge_and_unload()(pixel_values=x).logits
    torch.testing.assert_close(merged, before, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("transform", TRANSFORMS)
def test_the_2d_and_hybrid_models_export_to_onnx(transform, tmp_path):
    pytest.importorskip("onnxruntime")
    from orchid_hf.onnx import compare_with_onnxruntime, export_onnx

    torch.manual_seed(0)
    model = OrchidForImageClassification(tiny_2d_config(transform=transform, layer_types="orchid-first")).eval()
    path = export_onnx(model, tmp_path / "image.onnx", verify=True)
    assert compare_with_onnxruntime(model, path, shapes=[(5, 0), (1, 0)])["logits"] < 1e-4


# ---------------------------------------------------------------------------------------------
# The image recipe
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_image_recipe_trains_the_2d_hybrid_on_idx_files(tmp_path, one_thread):
    from orchid_hf.vision import main as train_images

    from .test_vision import write_idx_folder

    root = write_idx_folder(tmp_path / "idx", train=48, test=24, size=12)
    out = tmp_path / "run"
    results = train_images([
        "--train_dir", str(root), "--recipe", "orchid-vit-digits", "--output_dir", str(out),
        "--config_overrides", "image_size=12,patch_size=3,num_channels=1,image_mixer=2d,layer_types=orchid-first,"
        "filter_window=symmetric", "--num_train_epochs", "1", "--per_device_train_batch_size", "16",
        "--save_strategy", "no", "--disable_tqdm", "True", "--seed", "0",
    ])  # fmt: skip
    assert results["num_eval"] == 24 and 0 <= results["accuracy"] <= 1
    loaded = AutoModelForImageClassification.from_pretrained(out)
    assert loaded.config.image_mixer == "2d" and loaded.config.filter_window == "symmetric"
    assert [type(layer.mixer) for layer in loaded.orchid.encoder.layer] == [OrchidOperator2d, OrchidOperator2d,
                                                                            ViTAttention]  # fmt: skip


def test_config_overrides_parse_the_new_fields():
    from orchid_hf.model_loading import parse_overrides

    overrides = parse_overrides("image_mixer=2d,layer_types=orchid-first,filter_window=symmetric,num_attention_heads=2")
    config = OrchidConfig.from_preset("orchid-vit-cifar-s", **overrides)
    assert config.image_mixer == "2d" and config.num_attention_heads == 2
    assert config.layer_types == ["orchid"] * 3 + ["full_attention"] * 3
