"""Fast CPU inference for Orchid models, as an explicit opt-in: :func:`optimize_for_inference`.

The model in ``modeling/`` is plain PyTorch, so that training, hooks, peft, quantisation and every other tool see it
as it is. Without autograd on a CPU much of its time goes into memory rather than arithmetic: every step allocates a
tensor of the sequence's size, which on long inputs means fresh pages from the operating system, and filter spectra
that only depend on the weights are computed again on every call. ``optimize_for_inference(model)`` returns a frozen
copy that computes the same outputs another way:

* the static filters' spectra are computed once, when the copy is made;
* the operator mixes groups of channels in turn, so that its intermediate tensors stay small, and works in place on
  tensors that nothing else reads; on long inputs its short convolution and output projection overwrite their inputs;
* everything after the mixer (residual sums, LayerNorms, the MLP) runs on chunks of tokens written over the mixer's
  output, each layer's output takes the memory of the output of the layer before last, and the embeddings are summed
  in place;
* linear layers run through oneDNN with their weights packed once, adding the bias and applying the MLP's activation
  while the GEMM writes its output (``torch.ops.mkldnn``; MKL's GEMMs where a torch build lacks the op).

The copy refuses to train (``train()`` raises), never records gradients, and refuses every change of its parameters,
which the cached spectra and packed weights would not follow (see :func:`optimize_for_inference`). It runs on the CPU
in float32, and needs plain ``nn.Linear`` projections: merge LoRA adapters first (peft's ``merge_and_unload``), and
remove hooks, which it would not call. Its outputs equal the plain model's to rounding (``tests/test_inference.py``).
"""

from __future__ import annotations

import copy
import functools

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_outputs import BaseModelOutput

from .modeling.modeling_orchid import (
    OrchidEmbeddings,
    OrchidEncoder,
    OrchidLayer,
    OrchidMLP,
    OrchidPreTrainedModel,
)
from .modeling.orchid_layers import BlockDiagonalLinear, ConditioningNetwork, OrchidOperator, cross_spectrum
from .modeling.orchid_ops import (
    ALL_CHANNELS,
    channel_groups,
    depthwise_convolution,
    forward_transform,
    front_packing_order,
    gather_rows,
    idct,
    pocketfft_in_place,
    scatter_rows,
    short_convolution,
    uses_pocketfft,
)

# The operator mixes the plain operator's channel groups in turn (channel_groups). Inputs of at least
# LONG_INPUT_TOKENS (B x N) run each group's transforms on halves of its channels after an in-place short convolution,
# which lowers the peak memory while the input projection still reads the input once per group.
LONG_INPUT_TOKENS = 8192
# The in-place short convolution works on chunks of positions of about this many elements.
SHORT_CONV_CHUNK_ELEMENTS = 2**18
# The in-place output projection and the embeddings' LayerNorm work on chunks of tokens of about this many elements.
TOKEN_CHUNK_ELEMENTS = 2**20
# Everything after the mixer runs on chunks of tokens whose up-projection holds about this many numbers (32 MiB in
# float32; the MLP holds one block's piece of it at a time), and at least this many tokens, so GEMMs stay efficient.
MLP_CHUNK_ELEMENTS = 2**23
MLP_MIN_CHUNK_TOKENS = 256

# transformers' names of the activations oneDNN applies while its GEMM writes: (post-op, algorithm).
ONEDNN_ACTIVATIONS = {
    "gelu": ("gelu", "none"),
    "gelu_pytorch_tanh": ("gelu", "tanh"),
    "relu": ("relu", ""),
    "silu": ("swish", ""),
    "swish": ("swish", ""),
}
# The same activations in place, for MKL's GEMMs.
INPLACE_ACTIVATIONS = {
    "gelu": lambda x: torch.ops.aten.gelu_(x),
    "gelu_pytorch_tanh": lambda x: torch.ops.aten.gelu_(x, approximate="tanh"),
    "relu": torch.relu_,
    "silu": lambda x: F.silu(x, inplace=True),
    "swish": lambda x: F.silu(x, inplace=True),
}
PACKING_BATCH = 1024  # the batch oneDNN packs weights for; any larger batch reads the same layout


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


def optimize_for_inference(model: OrchidPreTrainedModel | OrchidOperator):
    """A frozen copy of an Orchid model (any head) or operator for fast CPU inference, with the same outputs.

    The model must be on the CPU in float32 (a ValueError names any other dtype or device: use the plain model
    there), with plain ``nn.Linear`` projections and no hooks: merge LoRA adapters first, and use the plain model for
    quantised weights. The model itself is left as it was.

    The copy holds spectra and packed weights derived from its parameters, so it is frozen: its parameters are
    :class:`FrozenWeight`, read like any others (``state_dict()`` loads into a plain model, ``save_pretrained`` and
    pickling work, copies stay frozen), and every write raises before it starts, whatever the path:

    * in-place ops on a parameter or on a tensor sharing its memory (``.data``, ``detach()``, views, ``state_dict()``
      entries): ``p.data.mul_``, ``p.add_`` under ``no_grad``, ``+=``, ``copy_``, ``nn.init``, optimizer steps (fused
      ones included); ``p.data = ...``; ``load_state_dict`` (with ``assign=True`` too): a RuntimeError;
    * ``requires_grad_(True)`` of the copy or a parameter, ``p.requires_grad = True``, ``train()``: a RuntimeError;
    * a cast to another dtype (``.double()``, ``.half()``, ``.to(torch.bfloat16)``): a ValueError, before anything
      is converted; numpy arrays of the parameters are read-only.

    What torch lets through without a call to refuse stops the copy's next forward with a RuntimeError naming the
    part (:class:`FrozenParts`): a parameter or module it holds derived forms of, replaced (by assignment, peft's
    ``get_peft_model``, ``torch.func.functional_call``), and forward hooks on modules it does not call as the plain
    model does (projections, filters, norms, the MLP) or global ones. Hooks on the model, its layers' mixers and
    the modules it calls whole run as usual. Writes below the tensor API (storages, DLPack) are not seen. In every case
    the remedy is the same: change the plain model and optimise it again.
    """
    if not isinstance(model, OrchidPreTrainedModel | OrchidOperator):
        raise ValueError(f"optimize_for_inference takes an Orchid model or OrchidOperator, got {type(model).__name__}")
    check_optimizable(model)
    with torch._C.DisableTorchFunctionSubclass():  # the parameters of a copy optimised again read as plain tensors
        frozen = copy.deepcopy(model).eval().requires_grad_(False)
        for name, module in list(frozen.named_modules()):
            if isinstance(module, OrchidOperator):
                InferenceOperator.freeze(module)
            elif isinstance(module, OrchidMLP):
                InferenceMLP.freeze(module)
            elif isinstance(module, OrchidLayer):
                module.__class__ = InferenceLayer
                module.frozen_parts = FrozenParts.of_layer(module, name)
            elif isinstance(module, OrchidEncoder):
                module.__class__ = InferenceEncoder
            elif isinstance(module, OrchidEmbeddings):
                module.__class__ = InferenceEmbeddings
                module.frozen_parts = FrozenParts.of_embeddings(module, name)
        if isinstance(frozen, OrchidOperator):
            frozen.frozen_parts = FrozenParts.of_operator(frozen, "")
        for parameter in frozen.parameters():
            parameter.__class__ = FrozenWeight
    return frozen


def check_optimizable(model: nn.Module) -> None:
    """A ValueError unless the fast path computes what ``model`` computes: float32 on the CPU, no hooks it would not
    call, and plain ``nn.Linear`` projections (not LoRA layers, quantised layers or other replacements)."""
    parameters = list(model.parameters())
    devices = {p.device.type for p in parameters}
    dtypes = {p.dtype for p in parameters}
    if devices != {"cpu"} or dtypes != {torch.float32}:
        raise ValueError(
            "optimize_for_inference needs a float32 model on the CPU, got parameters on "
            f"{sorted(devices)} in {sorted(str(d) for d in dtypes)}"
        )
    if nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks:
        raise ValueError("optimize_for_inference: global forward hooks are registered, which the copy would not call")
    for name, module in model.named_modules():
        if module._forward_hooks or module._forward_pre_hooks:
            raise ValueError(
                f"optimize_for_inference: module {name!r} has forward hooks, which the copy would not call"
            )
        if isinstance(module, OrchidOperator):
            projections = {"in_proj": module.in_proj, "out_proj": module.out_proj}
        elif isinstance(module, OrchidMLP):
            projections = {"up_proj": module.up_proj, "down_proj": module.down_proj}
        else:
            continue
        for part, layer in projections.items():
            for block in linear_blocks(layer):
                if type(block) is not nn.Linear:
                    raise ValueError(
                        f"optimize_for_inference needs plain nn.Linear projections, but {name}.{part} holds a "
                        f"{type(block).__module__}.{type(block).__name__}; merge adapters first (peft: "
                        "merge_and_unload), and use the plain model for quantised weights"
                    )


def linear_blocks(layer: nn.Module) -> list[nn.Module]:
    """The linear maps of a projection: the blocks of a block-diagonal layer, or the layer itself."""
    return list(layer.blocks) if isinstance(layer, BlockDiagonalLinear) else [layer]


def check_no_grad_input(name: str, tensor: torch.Tensor | None) -> None:
    if tensor is not None and tensor.requires_grad:
        raise ValueError(
            f"{name} requires grad, but this model was made by optimize_for_inference and records no gradients; "
            "use the plain model"
        )


# ---------------------------------------------------------------------------------------------
# What keeps the copy frozen
# ---------------------------------------------------------------------------------------------

EDIT_REFUSED = (
    "{what} is refused: this model was made by optimize_for_inference and holds spectra and packed weights derived "
    "from its parameters, which would not follow the change; change the plain model and optimise the plain model again"
)
PART_CHANGED = (
    "{what}: this model was made by optimize_for_inference, which computes its outputs its own way from the parts it "
    "had then; change the plain model (hooks, adapters and other weights work there) and optimise it again"
)
# Tensor methods whose names end in "_" that change no value: moving storage to shared memory, for worker processes.
IN_PLACE_BUT_UNCHANGED = frozenset({"share_memory_"})
IN_PLACE_OPERATORS = frozenset(
    [f"__i{name}__" for name in ("add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "pow", "and", "or",
                                 "xor", "lshift", "rshift")]
    + ["__setitem__"]
)
DATA_SETTER = torch.Tensor.data.__set__
REQUIRES_GRAD_SETTER = torch.Tensor.requires_grad.__set__


def frozen_torch_function(cls, func, types, args=(), kwargs=None):
    """``__torch_function__`` of the copy's parameters and of the tensors that share their memory: everything that
    reads them runs as on any tensor; what would write them, cast them or make them require grad raises before it
    starts. Results that share their memory (``.data``, ``detach()``, views) are frozen in turn, and numpy arrays
    of them are read-only."""
    kwargs = kwargs or {}
    with torch._C.DisableTorchFunctionSubclass():  # the checks below read the tensors without coming back here
        refuse_writes(func, args, kwargs)
        result = func(*args, **kwargs)
        frozen = {storage_address(t) for t in tensors_in(args) if isinstance(t, FrozenTensor | FrozenWeight)}
        if getattr(func, "__name__", "") == "numpy":
            result.flags.writeable = False
        elif isinstance(result, tuple | list):
            result = type(result)(frozen_if_shared(r, frozen) for r in result)
        else:
            result = frozen_if_shared(result, frozen)
    return result


def refuse_writes(func, args, kwargs) -> None:
    name = getattr(func, "__name__", "")
    if func == DATA_SETTER:
        target, value = args
        if value.dtype != target.dtype or value.device != target.device:
            raise ValueError(
                f"this model was made by optimize_for_inference and runs in torch.float32 on the CPU, so it cannot "
                f"become {value.dtype} on {value.device}; in another dtype or on another device, use the plain model "
                "(optimize_for_inference takes float32 models on the CPU)"
            )
        if storage_address(value) != storage_address(target) or value.shape != target.shape:
            raise RuntimeError(EDIT_REFUSED.format(what="Setting a parameter's .data"))
    elif func == REQUIRES_GRAD_SETTER or name == "requires_grad_":
        requires_grad = args[1] if len(args) > 1 else kwargs.get("requires_grad", True)
        if requires_grad:
            raise RuntimeError(EDIT_REFUSED.format(what="Making a parameter require grad (for training)"))
    elif (name.endswith("_") and not name.startswith("__") and name not in IN_PLACE_BUT_UNCHANGED) or (
        name in IN_PLACE_OPERATORS
    ):
        written = args[:1] if args else list(kwargs.values())[:1]  # nn.init passes its tensor by keyword
        if any(isinstance(t, FrozenTensor | FrozenWeight) for t in tensors_in(written)):
            raise RuntimeError(EDIT_REFUSED.format(what=f"Writing a parameter in place ({name})"))
    if any(isinstance(t, FrozenTensor | FrozenWeight) for t in tensors_in([kwargs.get("out")])):
        raise RuntimeError(EDIT_REFUSED.format(what=f"Writing a parameter as the out= of {name}"))


def tensors_in(values) -> list[torch.Tensor]:
    """The tensors among ``values`` and in the lists and tuples among them (as foreach ops and optimizers pass)."""
    found = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, list | tuple):
            found.extend(v for v in value if isinstance(v, torch.Tensor))
    return found


def storage_address(tensor: torch.Tensor) -> int | None:
    try:
        return tensor.untyped_storage().data_ptr() if tensor.numel() else None
    except (RuntimeError, NotImplementedError):  # sparse, nested and other tensors without one storage
        return None


def frozen_if_shared(value, frozen_storages: set):
    if isinstance(value, torch.Tensor) and not isinstance(value, FrozenTensor | FrozenWeight):
        address = storage_address(value)
        if address is not None and address in frozen_storages:
            return value.as_subclass(FrozenTensor)
    return value


class FrozenWeight(nn.Parameter):
    """A parameter of a model made by :func:`optimize_for_inference`: read like any other, never written (see
    :func:`frozen_torch_function`). It pickles and copies as itself, so copies of the model stay frozen."""

    __torch_function__ = classmethod(frozen_torch_function)

    def __reduce_ex__(self, protocol):
        with torch._C.DisableTorchFunctionSubclass():
            return rebuild_frozen_weight, (self.data,)

    def __repr__(self) -> str:
        with torch._C.DisableTorchFunctionSubclass():
            return "Frozen parameter containing:\n" + repr(self.data)


def rebuild_frozen_weight(data: torch.Tensor) -> FrozenWeight:
    return torch.Tensor._make_subclass(FrozenWeight, data, False)


class FrozenTensor(torch.Tensor):
    """A tensor that shares the memory of a :class:`FrozenWeight` (its ``.data``, a ``detach()``, a ``state_dict()``
    entry, a view): read like any other, never written. It pickles as a plain tensor, so a saved state dict loads with
    ``torch.load(weights_only=True)`` and belongs to whoever loads it."""

    __torch_function__ = classmethod(frozen_torch_function)

    def __reduce_ex__(self, protocol):
        with torch._C.DisableTorchFunctionSubclass():
            return self.as_subclass(torch.Tensor).__reduce_ex__(protocol)


class FrozenParts:
    """What a module made by :func:`optimize_for_inference` cannot see change through its parameters: ``derived``,
    the submodules it holds spectra or packed weights of (each of their modules and parameters must stay the object it
    was: a replacement, by assignment, peft or ``torch.func.functional_call``, would not be read), and ``uncalled``,
    the submodules it reads without calling them (or calls on pieces of the input), whose hooks it would not run
    as the plain model runs them. :meth:`check`, at each call, costs a few dictionary look-ups per part."""

    def __init__(self, prefix: str, module: nn.Module, derived: list[str], uncalled: list[str]):
        self.derived = []  # (name, owner, table, key, part): owner.<table>[key] must still be part
        for path in derived:
            owner_path, _, key = path.rpartition(".")
            owner = module.get_submodule(owner_path)
            part = owner._modules.get(key)
            if part is None:
                continue
            self.derived.append((qualified(prefix, path), owner, "_modules", key, part))
            for name, sub in part.named_modules(prefix=qualified(prefix, path)):
                self.derived += [(f"{name}.{k}", sub, "_modules", k, v) for k, v in sub._modules.items()]
                self.derived += [(f"{name}.{k}", sub, "_parameters", k, v) for k, v in sub._parameters.items()]
        self.uncalled = [
            (name, sub)
            for path in uncalled
            for name, sub in module.get_submodule(path).named_modules(prefix=qualified(prefix, path))
        ]

    @classmethod
    def of_operator(cls, op: OrchidOperator, prefix: str) -> FrozenParts:
        derived = ["in_proj", "out_proj", "static_filter", "residual_filter"]
        return cls(prefix, op, derived, uncalled=list(dict(op.named_children())))

    @classmethod
    def of_layer(cls, layer: OrchidLayer, prefix: str) -> FrozenParts:
        derived = ["mixer.in_proj", "mixer.out_proj", "mixer.static_filter", "mixer.residual_filter", "mlp.up_proj",
                   "mlp.down_proj"]
        uncalled = [f"mixer.{name}" for name, _ in layer.mixer.named_children()]
        uncalled += [name for name, _ in layer.named_children() if name != "mixer"]
        return cls(prefix, layer, derived, uncalled)

    @classmethod
    def of_embeddings(cls, embeddings: OrchidEmbeddings, prefix: str) -> FrozenParts:
        uncalled = [name for name, _ in embeddings.named_children() if name != "word_embeddings"]
        return cls(prefix, embeddings, derived=[], uncalled=uncalled)

    def check(self) -> None:
        if nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks:
            raise RuntimeError(
                PART_CHANGED.format(what="global forward hooks are registered, which this copy would not call")
            )
        for name, owner, table, key, part in self.derived:
            if owner.__dict__[table].get(key) is not part:
                raise RuntimeError(PART_CHANGED.format(what=f"{name} was replaced"))
        for name, module in self.uncalled:
            if module._forward_hooks or module._forward_pre_hooks:
                raise RuntimeError(
                    PART_CHANGED.format(what=f"{name} has forward hooks, which this copy does not call")
                )


def qualified(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


class RefusesChanges:
    """``train()`` and ``load_state_dict`` of the modules made by :func:`optimize_for_inference`."""

    def train(self, mode: bool = True) -> nn.Module:
        if mode:
            raise RuntimeError(
                "this model was made by optimize_for_inference for inference only and cannot train; train the plain "
                "model and optimise a new copy of it"
            )
        return nn.Module.train(self, False)

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        raise RuntimeError(EDIT_REFUSED.format(what="load_state_dict"))


# ---------------------------------------------------------------------------------------------
# Linear layers through oneDNN, weights packed once
# ---------------------------------------------------------------------------------------------


@functools.cache
def onednn_ops():
    """``(linear, pack)`` from ``torch.ops.mkldnn`` if this build of torch has them and they compute F.linear on a small
    check, else None (MKL's GEMMs are used instead)."""
    try:
        linear, pack = torch.ops.mkldnn._linear_pointwise, torch.ops.mkldnn._reorder_linear_weight
        with torch.no_grad():
            x = torch.linspace(-1.0, 1.0, 12).view(3, 4)
            weight, bias = torch.linspace(-2.0, 2.0, 20).view(5, 4), torch.linspace(0.0, 1.0, 5)
            packed = pack(weight, PACKING_BATCH)
            works = torch.allclose(linear(x, packed, bias, "none", [], ""), F.linear(x, weight, bias), atol=1e-5)
    except (AttributeError, RuntimeError):
        return None
    return (linear, pack) if works else None


class FrozenLinear:
    """A linear map ``x W^T + b`` ready for inference: the weight packed once for oneDNN (or as it is, for MKL), and
    ``activation`` (a key of ``ONEDNN_ACTIVATIONS``, or None) applied to the output as it is written. It keeps the
    plain weight as well, from which a copy or an unpickled model packs again (packed tensors cannot be copied)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, activation: str | None = None):
        self.plain_weight = weight.detach().contiguous()
        self.bias = None if bias is None else bias.detach().contiguous()
        self.activation = activation
        ops = onednn_ops()
        self.weight = self.plain_weight if ops is None else ops[1](self.plain_weight, PACKING_BATCH)

    def __getstate__(self) -> dict:
        return {"weight": self.plain_weight, "bias": self.bias, "activation": self.activation}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["weight"], state["bias"], state["activation"])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        ops = onednn_ops()
        if ops is not None:
            # oneDNN copies a strided input on every call: hand it a contiguous one.
            post_op, algorithm = ONEDNN_ACTIVATIONS[self.activation] if self.activation else ("none", "")
            return ops[0](x.contiguous(), self.weight, self.bias, post_op, [], algorithm)
        out = F.linear(x, self.weight, self.bias)
        return out if self.activation is None else INPLACE_ACTIVATIONS[self.activation](out)


# ---------------------------------------------------------------------------------------------
# Transforms and convolutions in place
# ---------------------------------------------------------------------------------------------


def dct_in_place(x: torch.Tensor, n: int) -> torch.Tensor:
    """The orthonormal DCT-II along axis 1 of x (B, L, C) zero-padded to n. pocketfft transforms x itself when it is
    contiguous with n samples (x must then be a fresh tensor that nothing else reads), else a padded copy."""
    if not uses_pocketfft(x):
        return forward_transform(x, "dct", n)
    if x.shape[1] == n and x.is_contiguous():
        out = x
    else:
        out = x.new_empty(x.shape[0], n, x.shape[2])
        out[:, : x.shape[1]] = x
        out[:, x.shape[1] :].zero_()
    return pocketfft_in_place(out, 1, inverse=False)


def idct_in_place(x: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` samples of the orthonormal inverse DCT along axis 1 of x (B, n, C), which it overwrites."""
    if not uses_pocketfft(x) or not x.is_contiguous():
        return idct(x, 1, length)
    return pocketfft_in_place(x, 1, inverse=True)[:, :length]


def convolve_in_place(u: torch.Tensor, multiplier: torch.Tensor, transform: str, n: int) -> torch.Tensor:
    """``long_convolution(u, multiplier, transform, n)``, overwriting u (B, L, C) where it can: u must be fresh."""
    length = u.shape[1]
    if transform == "dct":
        return idct_in_place(dct_in_place(u, n).mul_(multiplier), length)
    spectrum = torch.fft.rfft(u, n=n, dim=1).mul_(multiplier)
    return torch.fft.irfft(spectrum, n=n, dim=1)[:, :length]


def short_convolution_in_place(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, wrap: bool):
    """:func:`short_convolution` written over x in chunks of positions, so that the output never exists beside its
    input. Each chunk reads the positions ``[start - pad, stop + pad)`` of x extended by its borders (zeros, or the
    sequence's other end when it wraps), and is written back once the next chunk, which reads its last ``pad``
    positions, has been computed."""
    pad = weight.shape[-1] // 2
    length = x.shape[1]
    chunk = max(SHORT_CONV_CHUNK_ELEMENTS // (x.shape[0] * x.shape[2]), pad + 1)
    if length <= chunk or pad == 0:
        return x.copy_(short_convolution(x, weight, bias, wrap))
    if wrap and pad <= length:
        before, after = x[:, length - pad :].clone(), x[:, :pad].clone()
    else:
        before = after = x.new_zeros(x.shape[0], pad, x.shape[2])
    pending = None
    for start in range(0, length, chunk):
        stop = min(start + chunk, length)
        window = []
        if start < pad:
            window.append(before[:, start:])
        window.append(x[:, max(start - pad, 0) : min(stop + pad, length)])
        if stop + pad > length:
            window.append(after[:, : stop + pad - length])
        out = depthwise_convolution(torch.cat(window, dim=1) if len(window) > 1 else window[0], weight, bias)
        if pending is not None:
            x[:, pending[0]] = pending[1]
        pending = (slice(start, stop), out)
    x[:, pending[0]] = pending[1]
    return x


def fresh_copy(x: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of x, which in-place work may overwrite."""
    return x.clone(memory_format=torch.contiguous_format)


# ---------------------------------------------------------------------------------------------
# The operator
# ---------------------------------------------------------------------------------------------


class InferenceOperator(RefusesChanges, OrchidOperator):
    """An :class:`OrchidOperator` made by :func:`optimize_for_inference`: the same parameters, the static filters'
    spectra computed once, channels mixed in groups, work done in place. Its outputs equal the plain operator's."""

    @staticmethod
    def freeze(op: OrchidOperator) -> None:
        op.__class__ = InferenceOperator
        op.static_spectrum = op.static_filter.spectrum(torch.float32).detach().contiguous()
        op.residual_spectrum = None
        if op.residual_filter is not None:
            op.residual_spectrum = op.residual_filter.spectrum(torch.float32).detach().contiguous()
        op.in_proj_groups = {}  # (start, stop) of a channel group -> FrozenLinear of in_proj's rows for it
        op.out_linear = FrozenLinear(op.out_proj.weight, op.out_proj.bias)

    def forward(
        self,
        x: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        conditioning_input: torch.Tensor | None = None,
        conditioning_mask: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """As :meth:`OrchidOperator.forward`. ``out``, a tensor like x that nothing reads any more, lends its memory to
        the result where the channel groups are written into one output; the result is then ``out``."""
        check_no_grad_input("x", x)
        check_no_grad_input("conditioning_input", conditioning_input)
        if "frozen_parts" in self.__dict__:  # an operator optimised alone; in a model, its layer checks
            self.frozen_parts.check()
        self._check_inputs(x, attention_mask, conditioning_input, conditioning_mask)
        order = front_packing_order(attention_mask)
        with torch.no_grad(), torch._C.DisableTorchFunctionSubclass():
            if order is not None:
                x, attention_mask, out = gather_rows(x, order), gather_rows(attention_mask, order), None
            conditioning = None
            if conditioning_input is not None:
                conditioning = self._project_value(conditioning_input, conditioning_mask)
            y = self._mix_in_groups(x, attention_mask, conditioning, out)
        return y if order is None else scatter_rows(y, order)

    def channel_groups(self, batch: int) -> list[slice]:
        """The plain operator's channel groups (:func:`channel_groups`), each with explicit bounds."""
        groups = channel_groups(self.d_model, batch * self.max_len)
        return [slice(0, self.d_model)] if groups == [ALL_CHANNELS] else groups

    def transform_parts(self, width: int, batch: int) -> list[slice]:
        """The runs of a group's ``width`` channels whose transforms run together: halves from ``LONG_INPUT_TOKENS``
        (B x N) on, else the whole group."""
        if batch * self.max_len < LONG_INPUT_TOKENS:
            return [slice(0, width)]
        half = max(-(-width // 2), 1)
        return [slice(start, min(start + half, width)) for start in range(0, width, half)]

    def writes_into_out(self, batch: int) -> bool:
        """Whether a lent ``out`` receives the output: with more than one channel group."""
        return len(self.channel_groups(batch)) > 1

    def _mix_in_groups(self, x, attention_mask, conditioning, out):
        mask = None if attention_mask is None else attention_mask.bool().unsqueeze(-1)
        if mask is not None:
            x = x.masked_fill(~mask, 0.0)
        groups = self.channel_groups(x.shape[0])
        if len(groups) == 1:
            return self.out_linear(self._mix_channels(x, groups[0], mask, conditioning))
        lendable = out is not None and out.shape == x.shape and out.dtype == x.dtype and out.is_contiguous()
        lendable = lendable and out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
        y = out if lendable else torch.empty_like(x, memory_format=torch.contiguous_format)
        for channels in groups:
            self._mix_channels(x, channels, mask, conditioning, out=y)
        # out_proj written over its input, a few tokens at a time: the output never exists beside it.
        tokens = y.view(-1, self.d_model)
        rows = max(1, TOKEN_CHUNK_ELEMENTS // self.d_model)
        for start in range(0, tokens.shape[0], rows):
            chunk = tokens[start : start + rows]
            chunk.copy_(self.out_linear(chunk))
        return y

    def _group_rows(self, channels: slice) -> torch.Tensor:
        """The rows of in_proj (and of the short convolution) that hold s1, s2 and v of these channels."""
        index = torch.arange(channels.start, channels.stop)
        return torch.cat([index, index + self.d_model, index + 2 * self.d_model])

    def _in_proj_rows(self, channels: slice) -> FrozenLinear:
        key = (channels.start, channels.stop)
        if key not in self.in_proj_groups:
            rows = self._group_rows(channels)
            bias = None if self.in_proj.bias is None else self.in_proj.bias[rows]
            self.in_proj_groups[key] = FrozenLinear(self.in_proj.weight[rows], bias)
        return self.in_proj_groups[key]

    def _mix_channels(self, x, channels, mask, conditioning, out=None):
        """``s2 * (h * (s1 * v)) + h_res * x`` for these channels, (B, L, width); with ``out``, written into
        ``out[..., channels]`` a transform part at a time instead."""
        n, width = self.max_len, channels.stop - channels.start
        wrap = x.shape[1] == n
        projected = self._in_proj_rows(channels)(x)  # (B, L, 3 width): s1, s2 and v of these channels
        if mask is not None:
            projected.masked_fill_(~mask, 0.0)
        parts = self.transform_parts(width, x.shape[0]) if out is not None else [slice(0, width)]
        # The kernels first: h_theta reads v before the short convolution, and building them before the
        # convolution's output exists lowers the peak memory.
        kernels = [
            self._kernel(
                projected[..., 2 * width + part.start : 2 * width + part.stop],
                shifted(part, channels.start),
                mask,
                conditioning,
            )
            for part in parts
        ]
        rows = self._group_rows(channels)
        weight, bias = self.short_conv.weight[rows], self.short_conv.bias[rows]
        convolve = short_convolution_in_place if len(parts) > 1 else short_convolution
        gated = convolve(projected, weight, bias, self.short_conv.circular and wrap)
        del projected
        result = None
        for part in parts:
            kernel = kernels.pop(0)  # dropped once used: the next part's transforms reuse its memory
            s1, s2, v = (gated[..., k * width + part.start : k * width + part.stop] for k in range(3))
            layer_channels = shifted(part, channels.start)
            u = s1.mul_(v)  # the gated tensor is fresh: the product goes into s1's place
            if mask is not None:
                u.masked_fill_(~mask, 0.0)
            y = convolve_in_place(u.contiguous(), kernel, self.transform, n).mul_(s2)
            del kernel
            if self.residual_spectrum is not None:
                # A copy of the block input's channels: the transform works in place, and x is the caller's.
                residual = convolve_in_place(
                    fresh_copy(x[..., layer_channels]),
                    self.residual_spectrum[..., layer_channels],
                    self.transform,
                    n,
                )
                y.add_(residual)
                del residual
            if mask is not None:
                y.masked_fill_(~mask, 0.0)
            if out is None:
                result = y
            else:
                out[..., layer_channels] = y
            del y
        return result

    def _kernel(self, value, channels, mask, conditioning):
        """The multiplier of h = h0 + h_theta for these channels, from v before the short convolution (or from the
        projected cross-conditioning sequence)."""
        static = self.static_spectrum[..., channels]
        if self.conditioning is None:
            return static
        if conditioning is None:
            source, source_mask = value, mask
        else:
            source, source_mask = conditioning[0][..., channels], conditioning[1]
        data = conditioning_spectrum(self.conditioning, source, self.max_len, source_mask, channels)
        # Under the FFT a Type I kernel is real and the static spectrum complex.
        return data.add_(static) if data.dtype == static.dtype else data + static


def shifted(part: slice, start: int) -> slice:
    return slice(start + part.start, start + part.stop)


def conditioning_spectrum(
    network: ConditioningNetwork, u: torch.Tensor, n: int, mask: torch.Tensor | None, channels: slice
) -> torch.Tensor:
    """``network(u, n, mask)`` for the network's ``channels`` only, transforming fresh time features in place."""
    wrap = u.shape[1] == n

    def transformed(stack) -> torch.Tensor:
        features = stack(u, mask, wrap, channels)
        # A layer or the mask made a new tensor; else it is u itself, which the transform must not overwrite.
        features = features.contiguous() if features is not u else fresh_copy(u)
        return dct_in_place(features, n) if network.transform == "dct" else forward_transform(features, "fft", n)

    key = transformed(network.time_conv)
    if network.conditioning == "abs":
        return network.frequency_convolution(key.abs() if key.is_complex() else key.abs_(), channels)
    query = transformed(network.query_conv)
    return network.frequency_convolution(cross_spectrum(key, query, network.activation), channels)


# ---------------------------------------------------------------------------------------------
# MLP, layer, encoder, embeddings
# ---------------------------------------------------------------------------------------------


class InferenceMLP(RefusesChanges, OrchidMLP):
    """An :class:`OrchidMLP` made by :func:`optimize_for_inference`: the intermediate features in pieces, one per block
    of ``down_proj``, each a GEMM whose activation oneDNN applies as it writes (for the GLU, a gate piece times the
    value piece at the same place of the second half); every GEMM reads a contiguous input."""

    @staticmethod
    def freeze(mlp: OrchidMLP) -> None:
        mlp.__class__ = InferenceMLP
        up_blocks, down_blocks = linear_blocks(mlp.up_proj), linear_blocks(mlp.down_proj)
        up_width = mlp.up_proj.out_features // len(up_blocks)
        in_width = mlp.up_proj.in_features // len(up_blocks)
        intermediate = mlp.down_proj.in_features
        piece = intermediate // len(down_blocks)
        fused = mlp.hidden_act if mlp.hidden_act in ONEDNN_ACTIVATIONS else None

        def up_rows(start: int, activation: str | None) -> tuple[slice, FrozenLinear]:
            """The up-projection's outputs [start, start + piece), which lie in one block: that block's input columns
            and its rows."""
            block = start // up_width
            linear = up_blocks[block]
            rows = slice(start - block * up_width, start - block * up_width + piece)
            bias = None if linear.bias is None else linear.bias[rows]
            return slice(block * in_width, (block + 1) * in_width), FrozenLinear(linear.weight[rows], bias, activation)

        mlp.pieces = []
        for k, down in enumerate(down_blocks):
            gate = up_rows(k * piece, fused)
            value = up_rows(intermediate + k * piece, None) if mlp.is_glu else None
            mlp.pieces.append((gate, value, FrozenLinear(down.weight, down.bias)))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """hidden_states: (tokens, hidden_size), a chunk of the sequence."""
        inputs: dict[tuple[int, int], torch.Tensor] = {}  # the up blocks' input columns, each made contiguous once

        def columns(block_columns: slice) -> torch.Tensor:
            key = (block_columns.start, block_columns.stop)
            if key not in inputs:
                inputs[key] = hidden_states[..., block_columns].contiguous()
            return inputs[key]

        outputs = []
        for (gate_columns, gate), value, down in self.pieces:
            activated = gate(columns(gate_columns))
            if gate.activation is None:
                activated = self.act(activated)
            if value is not None:
                activated.mul_(value[1](columns(value[0])))
            outputs.append(down(activated))
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-1)


class InferenceLayer(RefusesChanges, OrchidLayer):
    """An :class:`OrchidLayer` made by :func:`optimize_for_inference`: everything after the mixer acts on each token
    alone, so it runs on chunks of tokens written over the mixer's output, a fresh tensor that becomes the layer's
    output. A chunk's tensors stay in cache and reuse each other's memory, where the whole sequence would allocate five
    more tensors of the input's size."""

    def forward(
        self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        self.frozen_parts.check()
        mixer_input = self.mixer_norm(hidden_states) if self.pre_norm else hidden_states
        out = self.mixer(mixer_input, attention_mask, out=out)
        tokens = out.view(-1, out.shape[-1])
        inputs = hidden_states.reshape(-1, hidden_states.shape[-1])
        for chunk in token_chunks(tokens.shape[0], self.mlp.up_proj.out_features):
            hidden = inputs[chunk] + tokens[chunk]
            if self.pre_norm:
                tokens[chunk] = self.mlp(self.mlp_norm(hidden)).add_(hidden)
            else:
                hidden = self.mixer_norm(hidden)
                tokens[chunk] = self.mlp_norm(self.mlp(hidden).add_(hidden))
        return out


def token_chunks(num_tokens: int, up_features: int) -> list[slice]:
    """Equal runs of tokens whose up-projection holds about ``MLP_CHUNK_ELEMENTS`` numbers, each at least
    ``MLP_MIN_CHUNK_TOKENS`` long."""
    size = max(MLP_MIN_CHUNK_TOKENS, MLP_CHUNK_ELEMENTS // up_features)
    count = max(1, num_tokens // size)
    size = -(-num_tokens // count)
    return [slice(start, min(start + size, num_tokens)) for start in range(0, num_tokens, size)]


class InferenceEncoder(RefusesChanges, OrchidEncoder):
    """An :class:`OrchidEncoder` made by :func:`optimize_for_inference`: without autograd, and each layer's output in
    the memory of the output of the layer before last, which nothing reads any more (never the encoder's own input,
    nor an output returned with ``output_hidden_states``)."""

    def forward(self, hidden_states, attention_mask=None, output_hidden_states=False, rows_packed=False):
        # rows_packed (OrchidEncoder's) is not needed: each InferenceOperator finds packed rows itself at no cost.
        check_no_grad_input("hidden_states", hidden_states)
        with torch.no_grad(), torch._C.DisableTorchFunctionSubclass():
            all_hidden_states = (hidden_states,) if output_hidden_states else None
            reuse = not output_hidden_states and len(self.layer) >= 3
            reuse = reuse and self.layer[0].mixer.writes_into_out(hidden_states.shape[0])
            spare = None  # the output of the layer before last
            for index, layer in enumerate(self.layer):
                layer_input = hidden_states
                hidden_states = layer(hidden_states, attention_mask, out=spare)
                if output_hidden_states:
                    all_hidden_states += (hidden_states,)
                spare = layer_input if reuse and index > 0 and layer_input is not hidden_states else None
            if self.final_norm is not None:
                hidden_states = self.final_norm(hidden_states)
        return BaseModelOutput(last_hidden_state=hidden_states, hidden_states=all_hidden_states)


class InferenceEmbeddings(RefusesChanges, OrchidEmbeddings):
    """:class:`OrchidEmbeddings` made by :func:`optimize_for_inference`: the position and token-type embeddings added
    into the word embeddings' fresh tensor, and the LayerNorm applied a chunk of tokens at a time over it."""

    def forward(self, input_ids=None, token_type_ids=None, position_ids=None, inputs_embeds=None):
        check_no_grad_input("inputs_embeds", inputs_embeds)
        self.frozen_parts.check()
        with torch.no_grad(), torch._C.DisableTorchFunctionSubclass():
            # A fresh tensor either way: never in place on the caller's embeddings.
            embeddings = self.word_embeddings(input_ids) if inputs_embeds is None else fresh_copy(inputs_embeds)
            if position_ids is None:
                embeddings.add_(self.position_embeddings.weight[: embeddings.shape[1]])
            else:
                embeddings.add_(self.position_embeddings(position_ids))
            if self.token_type_embeddings is not None:
                if token_type_ids is None:
                    embeddings.add_(self.token_type_embeddings.weight[0])
                else:
                    embeddings.add_(self.token_type_embeddings(token_type_ids))
            tokens = embeddings.view(-1, embeddings.shape[-1])
            rows = max(1, TOKEN_CHUNK_ELEMENTS // tokens.shape[-1])
            for start in range(0, tokens.shape[0], rows):
                tokens[start : start + rows] = self.LayerNorm(tokens[start : start + rows])
        return embeddings


__all__ = ["optimize_for_inference"]
