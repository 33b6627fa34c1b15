"""The Orchid layer (Karami & Ghodsi, *Orchid: Flexible and Data-Dependent Convolution for Sequence Modeling*,
NeurIPS 2024), in the order of the paper: the short convolution, the static implicit filter (Remark 3.2), the
conditioning network (Sec. 3.2, Eq. 2-4), the operator (Sec. 3.3 and Listing 1), and the block-diagonal linear layer
of the MLPs. Section and equation numbers refer to that paper. The operations these modules call (transforms,
convolutions, masks) are in ``orchid_ops.py``.

Every module here is plain PyTorch: each projection and convolution is a module that is called, and nothing derived
from a parameter outlives a call, so hooks, peft, quantisation, pruning, fused optimizers and ``.data`` edits see the
model as it is. Activations keep the transformers layout ``(batch, length, channels)``; every sequence-mixing step
acts along axis 1, on each channel alone.

This file depends only on torch and the standard library, so that it ships to the Hub as remote code.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, fields
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from .orchid_ops import (
    SequenceLayout,
    dct,
    fills_transform,
    forward_transform,
    forward_transform_2d,
    gated_convolution,
    in_channel_blocks,
    kernel_spectrum,
    kernel_spectrum_2d,
    long_convolution_2d,
    masked,
    orchid_convolutions,
    refuse_jit_trace,
    short_convolution,
    short_convolution_2d,
)

TRANSFORMS = ("dct", "fft")
CONDITIONINGS = ("abs", "xcorr")
CONDITIONING_ACTIVATIONS = ("identity", "sigmoid", "tanh", "softsign", "softshrink")
# How the static filter's multiplier is formed under the DCT: the paper's Listing 1, ``dct(h0)``, or the spectrum of
# a convolution with h0 (see ImplicitFilter). Under the FFT both are the exact circular convolution.
FILTER_SPECTRA = ("listing1", "convolution")


# ---------------------------------------------------------------------------------------------
# Rules: what a setting or an input may be, checked once where it enters
# ---------------------------------------------------------------------------------------------


def is_integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Rule:
    """What a setting must be: ``description`` completes "must be ...", ``test`` tells whether a value is."""

    description: str
    test: Callable[[object], bool]


POSITIVE_INTEGER = Rule("a positive integer", lambda value: is_integer(value) and value >= 1)
NON_NEGATIVE_INTEGER = Rule("a non-negative integer", lambda value: is_integer(value) and value >= 0)
ODD_INTEGER = Rule("a positive odd integer (centred)", lambda value: is_integer(value) and value >= 1 and value % 2)
BOOLEAN = Rule("True or False", lambda value: isinstance(value, bool))
FINITE_NUMBER = Rule("a finite number", lambda value: is_number(value) and math.isfinite(value))
POSITIVE_NUMBER = Rule("a finite number > 0", lambda value: is_number(value) and math.isfinite(value) and value > 0)
PROBABILITY = Rule("in [0, 1)", lambda value: is_number(value) and 0 <= value < 1)


def one_of(choices: tuple) -> Rule:
    return Rule(f"one of {choices}", lambda value: any(value == choice for choice in choices))


def or_none(rule: Rule) -> Rule:
    return Rule(f"{rule.description} or None", lambda value: value is None or rule.test(value))


def check_rules(owner: str, values: Mapping[str, object], rules: Mapping[str, Rule]) -> None:
    """A ValueError for the first of ``values`` that breaks its rule: ``OWNER.NAME must be ..., got VALUE``."""
    for name, rule in rules.items():
        if not rule.test(values[name]):
            raise ValueError(f"{owner}.{name} must be {rule.description}, got {values[name]!r}")


def refuse(problems: Iterable[str]) -> None:
    """A ValueError with the first of ``problems``, what is wrong in words: the rules between settings, or of an input,
    each written where it applies as a generator's message, which looks at the values in order and only as far as
    they are right."""
    for problem in problems:
        raise ValueError(problem)


def tensor_problems(name: str, value) -> Iterator[str]:
    """``value`` must be a torch.Tensor (a list or a NumPy array would fail later with an AttributeError far from the
    cause)."""
    if not isinstance(value, torch.Tensor):
        yield (f"{name} must be a torch.Tensor, got {type(value).__module__}.{type(value).__qualname__} "
               "(torch.as_tensor converts it; a tokenizer gives tensors with return_tensors='pt')")  # fmt: skip


def check_tensor(name: str, value) -> None:
    refuse(tensor_problems(name, value))


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


def mask_rule(name: str = "attention_mask") -> tuple[int, int, str]:
    """What a mask may hold, as :func:`check_whole_values` takes it: 0 or 1, as bool, integer or float."""
    return 0, 2, (f"{name} must hold 1 for real tokens and 0 for padding (bool, integer or float; additive masks, "
                  "0 / -10000 or -inf, are not accepted)")  # fmt: skip


def check_whole_values(values: torch.Tensor, rule: tuple[int, int, str]) -> None:
    """A ValueError naming the values found unless ``values`` are whole numbers with ``low <= value < high``, ``rule``
    being ``(low, high, words)`` (:func:`mask_rule`, ``OrchidModel``'s :func:`input_rules`, the ONNX graph's checks);
    compiled and exported, an assertion in the graph (:func:`check_values`), so that an input is never misread."""
    if values.dtype == torch.bool or not values.numel():
        return
    low, high, words = rule
    valid = (values >= low) & (values < high) & (values == values.round() if values.is_floating_point() else True)
    check_values(valid, words, lambda: f"{words}, got {value_range(values[~valid])}")


def check_attention_mask(attention_mask: torch.Tensor, shape: tuple[int, int], name: str = "attention_mask"):
    """A ValueError unless ``attention_mask`` is a tensor of ``shape`` holding only 0 and 1 (:func:`mask_rule`)."""
    check_tensor(name, attention_mask)
    if tuple(attention_mask.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(attention_mask.shape)}, expected (batch, length) = {tuple(shape)}")
    check_whole_values(attention_mask, mask_rule(name))


def sequence_problems(name: str, x, width: int, longest: int, longest_name: str = "max_len") -> Iterator[str]:
    """What is wrong with ``x`` as a batch of sequences (batch, length, ``width``) of at most ``longest`` positions
    (``longest_name`` says what sets it), in floating point."""
    yield from tensor_problems(name, x)
    if x.dim() != 3:
        yield f"{name} must have shape (batch, length, {width}), got {tuple(x.shape)}"
    elif x.shape[-1] != width:
        yield f"{name} has {x.shape[-1]} features but the operator has d_model={width}"
    elif x.shape[0] == 0:
        yield f"{name} has batch size 0"
    elif x.shape[1] == 0:
        yield f"{name} is an empty sequence (length 0)"
    elif x.shape[1] > longest:
        yield f"{name} has length {x.shape[1]} > {longest_name}={longest}"
    elif not x.is_floating_point():
        yield f"{name} must be a floating-point tensor, got {x.dtype}"


class ShortConvolution(nn.Module):
    """Depthwise convolution along the sequence, centred (a bidirectional encoder sees both neighbours), on
    ``(batch, length, channels)`` inputs. Its parameters have the shapes of ``nn.Conv1d(channels, channels, k,
    groups=channels)``.

    ``circular=True`` wraps around the sequence, which keeps the convolution exactly shift-equivariant on the circle
    (the FFT path, Sec. 3.2); otherwise it pads with zeros (the DCT path, and the frequency axis).
    """

    dimensions = 1  # the axes it convolves over (ShortConvolution2d: 2)

    def __init__(self, channels: int, kernel_size: int, circular: bool = False):
        super().__init__()
        self.channels = channels
        self.kernel_size = kernel_size
        self.circular = circular
        self.weight = nn.Parameter(torch.empty(channels, 1, *[kernel_size] * self.dimensions))
        self.bias = nn.Parameter(torch.empty(channels))
        self.reset_parameters()

    @property
    def fan_in(self) -> int:
        """The inputs of each output: the kernel's taps (one channel)."""
        return self.kernel_size**self.dimensions

    def reset_parameters(self) -> None:
        # nn.Conv1d's (nn.Conv2d's) initialisation: a fan-in of the kernel's taps per channel.
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        bound = 1 / math.sqrt(self.fan_in)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor, wrap: bool | torch.Tensor = True) -> torch.Tensor:
        """x: (B, L, C) -> (B, L, C). ``wrap=False`` pads with zeros even when circular: a sequence shorter than the
        transform is zero-padded to it, so its circle closes over zeros; a (B,) bool tensor says it row by row
        (:func:`fills_transform`)."""
        # The weights follow the input's dtype: the conditioning network runs in float32 inside bf16 models.
        return short_convolution(x, self.weight.to(x.dtype), self.bias.to(x.dtype), self.circular and wrap)

    def extra_repr(self) -> str:
        return f"channels={self.channels}, kernel_size={self.kernel_size}, circular={self.circular}"


class ShortConvolution2d(ShortConvolution):
    """:class:`ShortConvolution` over a grid of patches: a centred depthwise ``k x k`` convolution on ``(batch, rows,
    columns, channels)`` inputs (Hyena N-D's short filter, a standard 2-D convolution), with the parameters of
    ``nn.Conv2d(channels, channels, k, groups=channels)``. ``circular=True`` wraps around both axes, which keeps it
    exactly equivariant to shifts on the torus (the FFT path); otherwise it pads with zeros."""

    dimensions = 2

    def forward(self, x: torch.Tensor, wrap: bool = True) -> torch.Tensor:
        """x: (B, H, W, C) -> (B, H, W, C)."""
        return short_convolution_2d(x, self.weight.to(x.dtype), self.bias.to(x.dtype), self.circular and wrap)


class ShortConvolutionStack(nn.Module):
    """``depth`` short convolutions in a row (App. C.1 uses 1, and 3 for the hardest recall task), each a
    ``convolution`` (:class:`ShortConvolution`, or :class:`ShortConvolution2d` over a grid). Masked positions are
    zeroed before each one, so that padding never reaches a real position."""

    def __init__(
        self,
        channels: int,
        kernel_size: int,
        depth: int,
        circular: bool = False,
        convolution: type[ShortConvolution] = ShortConvolution,
    ):
        super().__init__()
        self.layers = nn.ModuleList(convolution(channels, kernel_size, circular) for _ in range(depth))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, wrap: bool = True) -> torch.Tensor:
        for layer in self.layers:
            x = layer(masked(x, mask), wrap)
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


def lag_embedding(n: int, emb_dim: int, layout: str, scale: int | None = None) -> torch.Tensor:
    """PosEmb(t) of Remark 3.2: the lag over ``scale`` (default n) and ``(emb_dim - 1) / 2`` sinusoid pairs, shape
    (n, emb_dim)."""
    scale = n if scale is None else scale
    t = (kernel_lags(n, layout) / max(scale, 1)).unsqueeze(-1)  # in [-1/2, 1/2] (FFT) or [0, 1) (DCT) at n = scale
    bands = (emb_dim - 1) // 2
    # Built on the CPU explicitly: transformers may construct the model under a meta-device context.
    frequencies = torch.linspace(1e-4, bands - 1, bands, dtype=torch.float32, device="cpu").unsqueeze(0)
    angle = 2 * math.pi * t * frequencies
    features = [t, torch.cos(angle), torch.sin(angle)]
    if 1 + 2 * bands < emb_dim:
        features.append(torch.zeros(n, emb_dim - 1 - 2 * bands, dtype=torch.float32, device="cpu"))
    return torch.cat(features, dim=-1)


def filter_network(features: int, width: int, depth: int, channels: int, sin_frequency: float) -> nn.Sequential:
    """The FFN of an implicit filter, ``Linear -> Sin -> (Linear -> Sin) x depth -> Linear``, from ``features``
    positional features to a kernel value per channel (Hyena's implicit filter)."""
    layers: list[nn.Module] = [nn.Linear(features, width), Sin(width, sin_frequency)]
    for _ in range(depth):
        layers += [nn.Linear(width, width), Sin(width, sin_frequency)]
    layers.append(nn.Linear(width, channels, bias=False))
    return nn.Sequential(*layers)


def channel_decay_rates(rates: tuple[float, float], count: int) -> torch.Tensor:
    """``count`` decay rates evenly from ``rates[0]`` (the slowest) to ``rates[1]`` (the fastest), float32."""
    # Built on the CPU explicitly: transformers may construct the model under a meta-device context.
    return torch.linspace(*rates, count, dtype=torch.float32, device="cpu")


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

    The filter serves every transform length up to ``length``: at a shorter one, n, its kernel lies on the lags of a
    length-n transform, with t measured in units of ``lag_scale`` lags (default ``length``), so that the kernel at a
    given lag, and its decay, are the same at every transform length. A model whose context is extended keeps its
    ``lag_scale``.

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
        lag_scale: int | None = None,
    ):
        super().__init__()
        self.channels = channels
        self.length = length
        self.lag_scale = length if lag_scale is None else lag_scale
        self.transform = transform
        self.listing1 = transform == "dct" and spectrum == "listing1"
        self.emb_dim = emb_dim
        self.sin_frequency = sin_frequency
        self.decay = decay
        self.decay_rates = (math.log(1 / decay_target) / slow_decay_pct, math.log(1 / decay_target) / fast_decay_pct)
        self.ffn = filter_network(emb_dim, width, depth, channels, sin_frequency)
        self.skip = nn.Parameter(torch.randn(channels))
        for name, value in self.derived_buffers().items():
            self.register_buffer(name, value, persistent=False)

    def derived_buffers(self) -> dict[str, torch.Tensor]:
        # The envelope is computed from its two factors when needed: as a buffer of (length, channels) it would take
        # as much memory as an activation in every filter of every layer, all the time.
        return {"lag_features": self.make_lag_features(), **self.make_decay_factors()}

    def make_lag_features(self) -> torch.Tensor:
        return lag_embedding(self.length, self.emb_dim, self.transform, self.lag_scale)

    def make_decay_factors(self) -> dict[str, torch.Tensor]:
        """The factors of :meth:`envelope`: |t|, the lag over ``lag_scale``, (length, 1), and the rate of each channel,
        (channels,), all 0 without decay."""
        lags = kernel_lags(self.length, self.transform).abs().unsqueeze(-1) / max(self.lag_scale, 1)
        if not self.decay:
            return {"decay_lags": lags, "channel_rates": torch.zeros(self.channels, dtype=torch.float32, device="cpu")}
        return {"decay_lags": lags, "channel_rates": channel_decay_rates(self.decay_rates, self.channels)}

    def resize(self, length: int) -> None:
        """Serve transform lengths up to ``length``, keeping ``lag_scale``: the kernel at every lag stays as it was."""
        self.length = length
        self.reset_derived_buffers()

    def lags_of(self, buffer: torch.Tensor, n: int | None) -> torch.Tensor:
        """The rows of ``buffer``, laid out on the lags of a length-``length`` kernel, that a length-``n`` kernel has
        (:func:`kernel_lags`): its first n under the DCT; under the FFT, lags 0 .. n/2 and the negative lags of n."""
        if n is None or n == self.length:
            return buffer
        if self.transform == "dct":
            return buffer[:n]
        return torch.cat([buffer[: n // 2 + 1], buffer[self.length - (n - 1 - n // 2) :]])

    def envelope(self, n: int | None = None) -> torch.Tensor:
        """``exp(-|t| * rate_c)`` on the lags of a length-``n`` kernel (default ``length``), (n, channels), float32."""
        return torch.exp(-self.lags_of(self.decay_lags, n) * self.channel_rates)

    def forward(self, n: int | None = None) -> torch.Tensor:
        """The kernel h0 = FFN(PosEmb(t)) * decay(t) in the time domain for transform length ``n`` (default
        ``length``), (n, channels), in the filter's dtype (the skip parameter tells it; the constant features follow
        it)."""
        response = self.ffn(self.lags_of(self.lag_features, n).to(self.skip.dtype))
        return response * self.envelope(n).to(response.dtype)

    def spectrum(self, dtype: torch.dtype, n: int | None = None) -> torch.Tensor:
        """The multiplier of ``h0 * x + skip * x`` in ``dtype`` for transform length ``n`` (default ``length``): (n,
        channels) under the DCT, (n // 2 + 1, channels) under the FFT."""
        kernel = self(n).to(dtype)
        multiplier = dct(kernel, dim=0) if self.listing1 else kernel_spectrum(kernel, self.transform, dim=0)
        return multiplier + self.skip.to(dtype)

    def extra_repr(self) -> str:
        scale = "" if self.lag_scale == self.length else f", lag_scale={self.lag_scale}"
        return f"channels={self.channels}, length={self.length}, transform={self.transform!r}{scale}"


FILTER_WINDOWS = ("dimensional", "symmetric")


def grid_lag_features(grid: tuple[int, int], emb_dim: int, layout: str) -> torch.Tensor:
    """PE(i, j) of Hyena N-D's 2-D filters (Eq. 3): :func:`lag_embedding` of the row lag i and of the column lag j
    side by side, each over its own axis's length, shape (rows, columns, 2 emb_dim)."""
    rows, columns = grid
    row = lag_embedding(rows, emb_dim, layout).unsqueeze(1).expand(rows, columns, emb_dim)
    column = lag_embedding(columns, emb_dim, layout).unsqueeze(0).expand(rows, columns, emb_dim)
    return torch.cat([row, column], dim=-1)


class ImplicitFilter2d(DerivedBuffers):
    """A static kernel over the lags of a grid, ``h0(i, j) = FFN(PE(i, j)) * window(i, j)`` (Hyena N-D, Eq. 3), and
    its multiplier in the 2-D transform domain: :class:`ImplicitFilter` with a row and a column lag.

    PE(i, j) is the 1-D filter's lag embedding of the row lag and of the column lag side by side
    (:func:`grid_lag_features`), each lag measured over its axis's length; the FFN is the 1-D filter's
    (:func:`filter_network`) on these ``2 * emb_dim`` features, and ``skip`` its ``D`` term. Along each axis the lags
    look both ways, as in 1-D: signed and circular under the FFT, 0 .. N-1 of a kernel even along each axis under the
    DCT.

    The window falls with the lag along each axis (Hyena N-D's Eq. 5 and 6, without their constant gamma, as the 1-D
    filter's decay has none), with the 1-D filter's range of rates, from slow to fast:

    - ``"dimensional"`` (Eq. 6, the default): ``exp(-(alpha_c |t_i| + beta_c |t_j|))``, a rate per channel along each
      axis, so that a channel may reach far along the rows and stay local along the columns, or the reverse. Hyena
      N-D found it better than the symmetric window and made it its standard. It draws the pairs (alpha_c, beta_c) as
      shuffled rates; here they lie on a fixed grid over the range of rates, which gives the same spread of pairs in
      every process (a derived buffer cannot depend on a random draw).
    - ``"symmetric"`` (Eq. 5): ``exp(-alpha_c (|t_i| + |t_j|))``, the 1-D filter's rate of each channel along both axes.

    ``spectrum`` as for the 1-D filter: under the DCT, ``"listing1"`` takes the 2-D DCT of h0 as the multiplier,
    ``"convolution"`` the spectrum of the symmetric convolution with h0 (:func:`kernel_spectrum_2d`); under the FFT
    both are the circular convolution on the torus.
    """

    def __init__(
        self,
        channels: int,
        grid: tuple[int, int],
        transform: str = "dct",
        emb_dim: int = 5,
        width: int = 128,
        depth: int = 2,
        sin_frequency: float = 1.0,
        decay: bool = True,
        spectrum: str = "listing1",
        window: str = "dimensional",
        fast_decay_pct: float = 0.3,
        slow_decay_pct: float = 1.5,
        decay_target: float = 1e-2,
    ):
        super().__init__()
        self.channels = channels
        self.grid = (int(grid[0]), int(grid[1]))
        # The grid's positions: the length FoldedFilter (optimize_for_inference) keys the multiplier by.
        self.length = self.grid[0] * self.grid[1]
        self.transform = transform
        self.listing1 = transform == "dct" and spectrum == "listing1"
        self.emb_dim = emb_dim
        self.sin_frequency = sin_frequency
        self.decay = decay
        self.window = window
        self.decay_rates = (math.log(1 / decay_target) / slow_decay_pct, math.log(1 / decay_target) / fast_decay_pct)
        self.ffn = filter_network(2 * emb_dim, width, depth, channels, sin_frequency)
        self.skip = nn.Parameter(torch.randn(channels))
        for name, value in self.derived_buffers().items():
            self.register_buffer(name, value, persistent=False)

    def derived_buffers(self) -> dict[str, torch.Tensor]:
        rows, columns = self.grid
        return {
            "lag_features": grid_lag_features(self.grid, self.emb_dim, self.transform),
            # |t| along each axis, the lag over the axis's length: (rows, 1, 1) and (1, columns, 1).
            "row_lags": (kernel_lags(rows, self.transform).abs() / rows).view(rows, 1, 1),
            "column_lags": (kernel_lags(columns, self.transform).abs() / columns).view(1, columns, 1),
            **self.make_window_rates(),
        }

    def make_window_rates(self) -> dict[str, torch.Tensor]:
        """Each channel's decay rate along the rows (alpha_c) and the columns (beta_c), (channels,) each; all 0
        without decay."""
        channels = self.channels
        if not self.decay:
            zero = torch.zeros(channels, dtype=torch.float32, device="cpu")
            return {"row_rates": zero, "column_rates": zero.clone()}
        if self.window == "symmetric":
            rates = channel_decay_rates(self.decay_rates, channels)
            return {"row_rates": rates, "column_rates": rates.clone()}
        # Channel c at (c // side, c % side) of a grid of rate pairs, side x ceil(channels / side).
        side = math.ceil(math.sqrt(channels))
        index = torch.arange(channels, device="cpu")
        row_rates = channel_decay_rates(self.decay_rates, math.ceil(channels / side))[index // side]
        return {"row_rates": row_rates, "column_rates": channel_decay_rates(self.decay_rates, side)[index % side]}

    def envelope(self) -> torch.Tensor:
        """window(i, j) on the lags of the grid, (rows, columns, channels), float32."""
        return torch.exp(-(self.row_lags * self.row_rates + self.column_lags * self.column_rates))

    def forward(self) -> torch.Tensor:
        """The kernel h0 over the lags of the grid, (rows, columns, channels), in the filter's dtype."""
        response = self.ffn(self.lag_features.to(self.skip.dtype))
        return response * self.envelope().to(self.skip.dtype)

    def spectrum(self, dtype: torch.dtype, n: int | None = None) -> torch.Tensor:
        """The multiplier of ``h0 * x + skip * x`` in ``dtype``: (rows, columns, channels) under the DCT, (rows,
        columns // 2 + 1, channels) complex under the FFT. ``n``, where given, is the grid's count of positions (the
        argument :class:`FoldedFilter` passes, a 1-D filter's transform length)."""
        kernel = self().to(dtype)
        multiplier = dct(dct(kernel, dim=0), dim=1) if self.listing1 else kernel_spectrum_2d(kernel, self.transform)
        return multiplier + self.skip.to(dtype)

    def extra_repr(self) -> str:
        return f"channels={self.channels}, grid={self.grid}, transform={self.transform!r}, window={self.window!r}"


class FoldedFilter(nn.Module):
    """An implicit filter folded into the multiplier it computes, for inference (``optimize_for_inference``): the
    multiplier is a buffer computed once, where the filter would run its network on every call. It has no parameters,
    so nothing is left that an edit of the model could make stale; a model holding one cannot be saved
    (``save_pretrained`` refuses it), since its checkpoint would lack the filter's network."""

    def __init__(self, implicit_filter: ImplicitFilter, lengths: tuple[int, ...] | None = None):
        super().__init__()
        self.length = implicit_filter.length
        self.lengths = (implicit_filter.length,) if lengths is None else tuple(lengths)
        dtype = torch.promote_types(implicit_filter.skip.dtype, torch.float32)
        with torch.no_grad():
            for n in self.lengths:
                self.register_buffer(f"multiplier_{n}", implicit_filter.spectrum(dtype, n), persistent=False)

    def _apply(self, fn, recurse=True):
        # A cast (.to(dtype), .half(), .double()) would turn a complex multiplier (FFT) into its real part, and round
        # a folded one to half precision where the plain model recomputes it in float32 at least: the multipliers
        # follow the cast's device, at float32 (complex64) precision at least, as the plain model computes them.
        multipliers = {name: buffer for name, buffer in self._buffers.items() if name.startswith("multiplier_")}
        super()._apply(fn, recurse)
        for name, before in multipliers.items():
            target = fn(torch.empty((), dtype=torch.float32, device=before.device))
            real = torch.promote_types(target.dtype, torch.float32) if target.is_floating_point() else torch.float32
            dtype = real.to_complex() if before.is_complex() else real
            self._buffers[name] = before.to(device=target.device, dtype=dtype)
        return self

    def spectrum(self, dtype: torch.dtype, n: int | None = None) -> torch.Tensor:
        """:meth:`ImplicitFilter.spectrum` for transform length ``n`` (one of ``lengths``; default the longest), as
        computed when the filter was folded (complex under the FFT)."""
        multiplier = getattr(self, f"multiplier_{self.length if n is None else n}")
        if multiplier.is_complex():
            dtype = torch.promote_types(dtype, torch.complex64)
        return multiplier.to(dtype)


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

    short_convolution = ShortConvolution  # its convolutions, in time and in frequency (ConditioningNetwork2d: 2-D)

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
        convolution = self.short_convolution
        self.time_conv = ShortConvolutionStack(channels, time_kernel_size, time_layers, circular, convolution)
        if conditioning == "xcorr":
            self.query_conv = ShortConvolutionStack(channels, time_kernel_size, time_layers, circular, convolution)
        self.freq_conv = ShortConvolutionStack(channels, freq_kernel_size, freq_layers, convolution=convolution)

    def forward(self, u: torch.Tensor, n: int, mask: torch.Tensor | None = None) -> torch.Tensor:
        """u: (B, L, C), mask (B, L, 1) or None; the spectrum of the kernel for transform length n >= L: (B, n, C)
        for the DCT, (B, n // 2 + 1, C) complex for the FFT."""
        wrap = fills_transform(mask, n, u.shape[1])
        key = forward_transform(self.time_conv(u, mask, wrap), self.transform, n)
        query = None
        if self.conditioning == "xcorr":
            query = forward_transform(self.query_conv(u, mask, wrap), self.transform, n)
        return self.kernel_of(key, query)

    def kernel_of(self, key: torch.Tensor, query: torch.Tensor | None) -> torch.Tensor:
        """The kernel's spectrum from the transforms of the key and (Type II) the query: Eq. 2 or Eq. 4."""
        if query is None:
            return self.frequency_convolution(key.abs())
        return self.frequency_convolution(cross_spectrum(key, query, self.activation))

    def frequency_convolution(self, spectrum: torch.Tensor) -> torch.Tensor:
        """Conv1d_freq: a real convolution over frequency, on the real and imaginary parts alike of a complex
        spectrum."""
        if torch.is_complex(spectrum):
            return torch.complex(self.freq_conv(spectrum.real), self.freq_conv(spectrum.imag))
        return self.freq_conv(spectrum)


class ConditioningNetwork2d(ConditioningNetwork):
    """:class:`ConditioningNetwork` over a grid, with depthwise 2-D convolutions in space and in frequency and the
    2-D transform: ``"abs"`` (Type I) ``Conv2d_freq( |T(Conv2d(u))| )``, ``"xcorr"`` (Type II) ``Conv2d_freq(
    conj(T(Conv2d_k(u))) * sigma(T(Conv2d_q(u))) )``. Under the FFT, with circular convolutions in space, the kernel
    is invariant to shifts of u on the torus, and the operator equivariant to them (Sec. 3.2, in two dimensions)."""

    short_convolution = ShortConvolution2d

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        """u: (B, H, W, C); the spectrum of the kernel: (B, H, W, C) for the DCT, (B, H, W // 2 + 1, C) complex for
        the FFT."""
        key = forward_transform_2d(self.time_conv(u), self.transform)
        query = None
        if self.conditioning == "xcorr":
            query = forward_transform_2d(self.query_conv(u), self.transform)
        return self.kernel_of(key, query)


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
    transform_lengths: the transform lengths a sequence may be mixed at, ascending, the longest the operator's
        ``max_len``: each sequence takes the shortest that holds its real tokens. None: the powers of two from
        ``MIN_TRANSFORM_LENGTH`` below ``max_len``, then ``max_len`` (:func:`default_transform_lengths`); a config saved
        before the field existed reads as ``[max_len]``, the one length such models were trained at.
    filter_lag_scale: the lags over which the implicit filters' positional features and decay run from 0 to 1 (t =
        lag / filter_lag_scale); None: ``max_len``. A model whose context is extended keeps its earlier value, so that
        its kernels stay what they were at every lag.
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
    transform_lengths: list[int] | None = None
    filter_lag_scale: int | None = None

    def check_settings(
        self, owner: str = "OrchidOperator", max_len: int | None = None, grid: tuple[int, int] | None = None
    ) -> None:
        """A ValueError naming the first setting that is out of range (:data:`SETTING_RULES`), and its value; or that
        does not fit the operator's longest input ``max_len`` or its ``grid`` (2-D)."""
        check_rules(owner, vars(self), SETTING_RULES)
        refuse(self.setting_problems(owner, max_len, grid))

    def setting_problems(
        self, owner: str, max_len: int | None, grid: tuple[int, int] | None, max_len_name: str = "max_len"
    ) -> Iterator[str]:
        """The rules between settings, and between them and the input (its longest length ``max_len``, which
        ``max_len_name`` names, or the ``grid`` of a 2-D mixer): what is wrong, in words."""
        if self.data_dependent and self.conditioning_time_layers + self.conditioning_freq_layers == 0:
            yield (f"{owner}.conditioning_time_layers and conditioning_freq_layers are both 0; the conditioning "
                   "network needs at least one convolution (or set data_dependent=False)")  # fmt: skip
        lengths = self.transform_lengths
        if max_len is not None and lengths is not None and lengths[-1] != max_len:
            yield f"{owner}.transform_lengths must end at the longest input, {max_len}, got {lengths!r}"
        if grid is not None and self.filter_lag_scale is not None:
            yield (f"{owner}.filter_lag_scale={self.filter_lag_scale} does not apply to 2-D mixers, whose filters "
                   "measure each axis's lags over its own length; leave it None")  # fmt: skip
        longest = min(grid) if grid is not None else max_len
        for name in ("short_conv_size", "conditioning_time_kernel_size", "conditioning_freq_kernel_size"):
            if longest is not None and getattr(self, name) > longest:
                where = f"the grid {tuple(grid)}" if grid is not None else f"the input, {max_len_name}={max_len}"
                yield f"{owner}.{name}={getattr(self, name)} is longer than {where}"

    @classmethod
    def checked(
        cls, settings: dict, owner: str, max_len: int | None = None, grid: tuple[int, int] | None = None
    ) -> OperatorSettings:
        """The settings of an operator from its keyword arguments; a ValueError naming ``owner`` for an unknown one
        (with the closest name) or a value out of range (:meth:`check_settings`)."""
        names = [field.name for field in fields(cls)]
        unknown = sorted(set(settings) - set(names))
        if unknown:
            closest = difflib.get_close_matches(unknown[0], names, n=1, cutoff=0.8)
            hint = f"; did you mean {closest[0]!r}?" if closest else f"; the settings are {names}"
            raise ValueError(f"{owner} got unknown settings {unknown}{hint}")
        checked = cls(**settings)
        checked.check_settings(owner, max_len, grid)
        return checked

    def filter_settings(self) -> dict:
        """The keyword arguments of the implicit filters (:class:`ImplicitFilter`, :class:`ImplicitFilter2d`)."""
        return dict(
            transform=self.transform,
            emb_dim=self.filter_emb_dim,
            width=self.filter_width,
            depth=self.filter_depth,
            sin_frequency=self.filter_sin_frequency,
            decay=self.filter_decay,
            spectrum=self.filter_spectrum,
        )

    def conditioning_settings(self) -> dict:
        """The keyword arguments of the conditioning network (:class:`ConditioningNetwork` and its 2-D form)."""
        return dict(
            transform=self.transform,
            conditioning=self.conditioning,
            activation=self.conditioning_activation,
            time_kernel_size=self.conditioning_time_kernel_size,
            freq_kernel_size=self.conditioning_freq_kernel_size,
            time_layers=self.conditioning_time_layers,
            freq_layers=self.conditioning_freq_layers,
        )

    def resolved_transform_lengths(self, max_len: int) -> tuple[int, ...]:
        """``transform_lengths`` for an operator of ``max_len`` (checked by :meth:`check_settings`), or the default."""
        return default_transform_lengths(max_len) if self.transform_lengths is None else tuple(self.transform_lengths)


def ascending_lengths(lengths) -> bool:
    return (isinstance(lengths, (list, tuple)) and len(lengths) > 0 and all(is_integer(n) and n >= 1 for n in lengths)
            and all(a < b for a, b in zip(lengths, lengths[1:])))  # fmt: skip


# The rule of each operator setting (the fields of OperatorSettings), which OrchidConfig shares.
SETTING_RULES: dict[str, Rule] = {
    "transform": one_of(TRANSFORMS),
    "conditioning": one_of(CONDITIONINGS),
    "conditioning_activation": one_of(CONDITIONING_ACTIVATIONS),
    "data_dependent": BOOLEAN,
    "short_conv_size": ODD_INTEGER,
    "conditioning_time_kernel_size": ODD_INTEGER,
    "conditioning_freq_kernel_size": ODD_INTEGER,
    "conditioning_time_layers": NON_NEGATIVE_INTEGER,
    "conditioning_freq_layers": NON_NEGATIVE_INTEGER,
    "filter_emb_dim": POSITIVE_INTEGER,
    "filter_width": POSITIVE_INTEGER,
    "filter_depth": NON_NEGATIVE_INTEGER,
    "filter_sin_frequency": FINITE_NUMBER,
    "filter_decay": BOOLEAN,
    "filter_spectrum": one_of(FILTER_SPECTRA),
    "residual_long_conv": BOOLEAN,
    "transform_lengths": or_none(Rule("positive integers in ascending order", ascending_lengths)),
    "filter_lag_scale": or_none(POSITIVE_INTEGER),
}


# The shortest transform length of the default ladder (default_transform_lengths): below it a transform costs about
# the same whatever its length, and fewer lengths mean fewer groups of rows to mix apart.
MIN_TRANSFORM_LENGTH = 128


def default_transform_lengths(max_len: int) -> tuple[int, ...]:
    """The powers of two from ``MIN_TRANSFORM_LENGTH`` below ``max_len``, then ``max_len``."""
    return extended_transform_lengths((), max_len)


def extended_transform_lengths(lengths: tuple[int, ...], max_len: int) -> tuple[int, ...]:
    """``lengths`` for a new longest input ``max_len``: those below it, then the powers of two from
    ``MIN_TRANSFORM_LENGTH`` above the longest kept and below ``max_len``, then ``max_len``. A model whose context is
    extended keeps every transform length it had, so that its shorter inputs are mixed as they were."""
    kept = [n for n in lengths if n < max_len]
    n = MIN_TRANSFORM_LENGTH
    while n < max_len:
        if not kept or n > kept[-1]:
            kept.append(n)
        n *= 2
    return (*kept, max_len)


def changed_context(max_len: int, lengths: tuple[int, ...], max_positions: int) -> tuple[int, ...]:
    """The transform lengths of an operator of ``max_len`` and ``lengths`` whose context changes to ``max_positions``
    (the one rule of context extension; the implicit filters keep their lag scale beside it): longer, every length
    it had and the powers of two up to the new length (:func:`extended_transform_lengths`); shorter, the lengths up to
    ``max_positions``, which must be one of them, since otherwise the inputs between the next shorter length and
    ``max_positions`` would be mixed at a shorter transform than before and change their outputs."""
    if not is_integer(max_positions) or max_positions < 1:
        raise ValueError(f"max_position_embeddings must be a positive integer, got {max_positions!r}")
    if max_positions < max_len and max_positions not in lengths:
        rung = next(n for n in lengths if n > max_positions)
        shorter = [n for n in lengths if n < max_positions]
        first = shorter[-1] + 1 if shorter else 1
        raise ValueError(
            f"cutting the context from {max_len} to {max_positions} positions would mix inputs of {first} to "
            f"{max_positions} tokens at a transform length of {max_positions} instead of {rung}, which changes their "
            f"outputs; cut to one of the transform lengths {[n for n in lengths if n < max_len]}"
        )
    return extended_transform_lengths(lengths, max_positions)


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

    Each sequence is mixed at the shortest of ``transform_lengths`` that holds its real tokens (the transform length
    N), zero-padded to it, so that its cost follows its own length; rows of a batch that need different lengths are
    mixed apart, in groups (:class:`SequenceLayout`). Positions where ``attention_mask`` is 0 are set to zero before
    every sequence-mixing step, and rows padded on the left are mixed with their real tokens moved to the front, so
    that a sequence's output does not depend on the padding of its batch, nor on the other sequences in it.
    Transforms run in float32 at least, also under autocast and in bf16 models: ``torch.fft`` has no bfloat16.
    """

    def __init__(self, d_model: int, max_len: int, bias: bool = True, **settings):
        super().__init__()
        values = {"d_model": d_model, "max_len": max_len}
        check_rules("OrchidOperator", values, {"d_model": POSITIVE_INTEGER, "max_len": POSITIVE_INTEGER})
        self.settings = OperatorSettings.checked(settings, "OrchidOperator", max_len=max_len)
        s = self.settings
        self.d_model = d_model
        self.max_len = max_len
        self.transform_lengths = s.resolved_transform_lengths(max_len)
        self.transform = s.transform

        self.in_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.short_conv = ShortConvolution(3 * d_model, s.short_conv_size, circular=s.transform == "fft")
        filter_settings = dict(s.filter_settings(), lag_scale=s.filter_lag_scale)
        self.static_filter = ImplicitFilter(d_model, max_len, **filter_settings)
        self.conditioning = ConditioningNetwork(d_model, **s.conditioning_settings()) if s.data_dependent else None
        self.residual_filter = ImplicitFilter(d_model, max_len, **filter_settings) if s.residual_long_conv else None
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def resize(self, max_len: int) -> None:
        """Take inputs up to ``max_len`` (longer or shorter, :func:`changed_context`), keeping the filters' lag scale:
        a sequence mixed at a transform length the operator had before gives the output it gave."""
        lengths = changed_context(self.max_len, self.transform_lengths, max_len)
        self.settings.filter_lag_scale = self.static_filter.lag_scale
        self.settings.transform_lengths = list(lengths)
        self.transform_lengths = lengths
        self.max_len = max_len
        for long_filter in (self.static_filter, self.residual_filter):
            if long_filter is not None:
                long_filter.resize(max_len)

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
        layout: SequenceLayout | None = None,
    ) -> torch.Tensor:
        """x: (B, L, d), 1 <= L <= max_len; attention_mask: (B, L), 1 for real tokens and 0 for padding; returns
        (B, L, d), zero at padded positions. ``conditioning_input`` u (B, L_u, d) and ``conditioning_mask`` (B, L_u)
        make the kernel h_theta(u) (Remark 3.3), each row at the transform length that holds both its sequences.
        Inside ``OrchidModel``, x is the tokens of the model's ``layout``, computed once per call for all layers."""
        if layout is not None:
            return self.mix(x, layout)
        refuse_jit_trace()
        self._check_inputs(x, attention_mask, conditioning_input, conditioning_mask)
        real = None if attention_mask is None else attention_mask.bool()
        if conditioning_input is None:
            layout = SequenceLayout.from_mask(real, self.transform_lengths, x.shape[:2], x.device)
            return layout.restore(self.mix(layout.gather(x), layout))
        source_real = None if conditioning_mask is None else conditioning_mask.bool()
        layout, source = SequenceLayout.pair(real, x.shape[:2], source_real, conditioning_input.shape[:2],
                                             self.transform_lengths, x.device)  # fmt: skip
        return layout.restore(self.mix(layout.gather(x), layout, source.gather(conditioning_input), source))

    def mix(self, x, layout: SequenceLayout, source=None, source_layout: SequenceLayout | None = None) -> torch.Tensor:
        """Listing 1 on the tokens x (..., d) of ``layout``: the projections, and between them each group of
        sequences at its transform length (:meth:`_convolve`); h_theta reads v, or the tokens ``source`` of another
        sequence laid out in the same groups by ``source_layout`` (Remark 3.3)."""
        # Traced, the tokens include padded positions: cleared, so that NaN there never reaches in_proj's gradients.
        tokens = masked(x, layout.real).reshape(-1, self.d_model)
        projected = self.in_proj(tokens)  # s1, s2 and v before the short convolution
        value = projected if source is None else self.in_proj(masked(source, source_layout.real).flatten(0, -2))
        pairs = zip(layout.groups, layout.groups if source is None else source_layout.groups)
        parts = [self._convolve(group.n, group.take(tokens), group.take(projected), group.mask,
                                source_group.take(value[:, 2 * self.d_model :]), source_group.mask)
                 for group, source_group in pairs]  # fmt: skip
        return self.out_proj(layout.join(parts)).view(x.shape)

    def _convolve(self, n, x, projected, mask, source, source_mask) -> torch.Tensor:
        """For sequences (G, L, .) at transform length n, their tokens marked by ``mask`` (G, L, 1): the short
        convolution, h = h0 + h_theta(v) in the transform domain, ``s2 * (h * (s1 * v))`` and the residual long
        convolution of the block input (App. C.3)."""
        # Transforms in float32 at least: torch.fft has no bfloat16, and float16 only for powers of two on CUDA.
        dtype = torch.promote_types(x.dtype, torch.float32)
        with torch.autocast(device_type=x.device.type, enabled=False):
            s1, s2, v = self.short_conv(projected, fills_transform(mask, n, x.shape[1])).chunk(3, dim=-1)
            kernel = self.static_filter.spectrum(dtype, n)
            if self.conditioning is not None:
                kernel = kernel + self.conditioning(source.to(dtype), n, source_mask)
            residual = None if self.residual_filter is None else self.residual_filter.spectrum(dtype, n)
            convolutions = partial(orchid_convolutions, mask=mask, transform=self.transform, n=n, dtype=dtype)
            return in_channel_blocks(convolutions, s1, v, s2, kernel, x, residual).to(x.dtype)

    def _check_inputs(self, x, attention_mask, conditioning_input, conditioning_mask) -> None:
        """A ValueError unless the arguments of :meth:`forward` fit this operator and each other."""
        refuse(self._input_problems(x, conditioning_input))
        for name, value, mask in (("x", x, attention_mask), ("conditioning_input", conditioning_input,
                                                              conditioning_mask)):  # fmt: skip
            if value is not None and mask is not None:
                check_attention_mask(mask, value.shape[:2], f"attention mask for {name}")

    def _input_problems(self, x, conditioning_input) -> Iterator[str]:
        yield from sequence_problems("x", x, self.d_model, self.max_len)
        if conditioning_input is not None:
            if self.conditioning is None:
                yield "conditioning_input needs the data-dependent kernel (data_dependent=True)"
            yield from sequence_problems("conditioning_input", conditioning_input, self.d_model, self.max_len)
            if conditioning_input.shape[0] != x.shape[0]:
                yield f"conditioning_input has batch size {conditioning_input.shape[0]}, x has {x.shape[0]}"

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, max_len={self.max_len}, transform={self.transform!r}"


class OrchidOperator2d(nn.Module):
    """The Orchid operator over a grid of patches: :class:`OrchidOperator`'s data-dependent convolution in two
    dimensions, for images.

    ``y = out_proj( s2 * (h * (s1 * v)) [+ h_res * x] )`` with ``h = h0 + h_theta(v)``, where every step that mixes
    positions acts over the (rows, columns) grid instead of along the flattened sequence:

    1. ``in_proj`` (d -> 3d) and a depthwise ``k x k`` short convolution (:class:`ShortConvolution2d`) give s1, s2, v.
    2. h0 is a 2-D implicit filter (:class:`ImplicitFilter2d`: Hyena N-D's ``window(i, j) * FFN(PE(i, j))``), h_theta
       the conditioning network with 2-D convolutions and the 2-D transform (:class:`ConditioningNetwork2d`, Type I or
       Type II), read from v before the short convolution, as in 1-D.
    3. ``*`` is the 2-D long convolution (:func:`long_convolution_2d`): the separable 2-D DCT (a symmetric
       convolution), or the 2-D real FFT (circular on the torus), at a cost that does not depend on the kernel's
       extent. The gating chain is the 1-D operator's (:func:`gated_convolution`).
    4. The residual long convolution of the block input (App. C.3) with a second 2-D filter, and ``out_proj``.

    It takes hidden states ``(B, rows * columns, d)`` in row-major order, as the patch embeddings flatten an image,
    and mixes them at the grid's own size: the images of a model all have one size, so nothing is padded and there is
    no attention mask. The settings are the 1-D operator's (:class:`OperatorSettings`) and mean the same, but for
    ``transform_lengths`` (a grid has one transform size, its own) and ``filter_lag_scale`` (each axis's lags are
    measured over its own length; it must be None). ``filter_window`` chooses the filters' window (Hyena N-D's Eq. 6
    ``"dimensional"``, or Eq. 5 ``"symmetric"``). Transforms run in float32 at least, as in 1-D.
    """

    def __init__(
        self, d_model: int, grid: tuple[int, int], bias: bool = True, filter_window: str = "dimensional", **settings
    ):
        super().__init__()
        grid_rule = Rule("two positive integers (rows, columns)", lambda value: isinstance(value, (tuple, list))
                         and len(value) == 2 and all(POSITIVE_INTEGER.test(n) for n in value))  # fmt: skip
        check_rules("OrchidOperator2d", {"d_model": d_model, "grid": grid, "filter_window": filter_window},
                    {"d_model": POSITIVE_INTEGER, "grid": grid_rule, "filter_window": one_of(FILTER_WINDOWS)})
        self.settings = OperatorSettings.checked(settings, "OrchidOperator2d", grid=tuple(grid))
        s = self.settings
        self.d_model = d_model
        self.grid = tuple(grid)
        self.transform = s.transform
        self.filter_window = filter_window

        self.in_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.short_conv = ShortConvolution2d(3 * d_model, s.short_conv_size, circular=s.transform == "fft")
        filter_settings = dict(s.filter_settings(), window=filter_window)
        self.static_filter = ImplicitFilter2d(d_model, self.grid, **filter_settings)
        self.conditioning = ConditioningNetwork2d(d_model, **s.conditioning_settings()) if s.data_dependent else None
        self.residual_filter = ImplicitFilter2d(d_model, self.grid, **filter_settings) if s.residual_long_conv else None
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    @classmethod
    def from_config(cls, config) -> OrchidOperator2d:
        """The mixer of one layer of an image model: width ``hidden_size``, the grid of ``image_size / patch_size``
        patches a side, the config's operator settings and ``filter_window``."""
        settings = {field.name: getattr(config, field.name) for field in fields(OperatorSettings)}
        side = config.image_size // config.patch_size
        return cls(config.hidden_size, (side, side), filter_window=config.filter_window or "dimensional", **settings)

    def forward(self, x: torch.Tensor, grid: tuple[int, int] | None = None) -> torch.Tensor:
        """x: (B, rows * columns, d), the grid's positions row by row; returns (B, rows * columns, d). ``grid``, where
        given, must be the operator's (its filters are built for it)."""
        refuse(self._input_problems(x, grid))
        batch = x.shape[0]
        image = x.reshape(batch, *self.grid, self.d_model)  # (B, H, W, d), channels last
        projected = self.in_proj(image)
        s1, s2, v = self.short_conv(projected).chunk(3, dim=-1)
        # Transforms in float32 at least, as in 1-D: torch.fft has no bfloat16.
        dtype = torch.promote_types(x.dtype, torch.float32)
        with torch.autocast(device_type=x.device.type, enabled=False):
            kernel = self.static_filter.spectrum(dtype)
            if self.conditioning is not None:
                kernel = kernel + self.conditioning(projected[..., 2 * self.d_model :].to(dtype))
            y = gated_convolution(s1, v, s2, lambda u: long_convolution_2d(u, kernel, self.transform), None, dtype)
            if self.residual_filter is not None:
                y = y + long_convolution_2d(image.to(dtype), self.residual_filter.spectrum(dtype), self.transform)
        return self.out_proj(y.to(x.dtype)).reshape(batch, -1, self.d_model)

    def _input_problems(self, x, grid: tuple[int, int] | None) -> Iterator[str]:
        rows, columns = self.grid
        if grid is not None and tuple(grid) != self.grid:
            yield f"OrchidOperator2d was built for a {self.grid} grid (its filters are), got grid={grid!r}"
        yield from sequence_problems("x", x, self.d_model, rows * columns)
        if x.shape[1] != rows * columns:
            yield f"x has {x.shape[1]} positions, the {rows} x {columns} grid has {rows * columns}"

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, grid={self.grid}, transform={self.transform!r}"


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


