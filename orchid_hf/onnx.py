"""ONNX export of Orchid models, and their check against PyTorch with ONNX Runtime.

    from orchid_hf.onnx import export_onnx
    export_onnx(model, "model.onnx", verify=True)      # or a saved folder: export_onnx("my-orchid", "model.onnx")

The graph comes from ``torch.onnx.export(..., dynamo=True)`` (``torch.export``, then the ONNX translation) with a
dynamic batch and, for text, a dynamic length from 1 to ``config.max_sequence_length``; the transforms keep their
fixed length, ``max_sequence_length``. The DCT and the FFT are the graph's own ``DFT`` operators: traced, the model
takes its torch path for the DCT (Makhoul's algorithm with one real FFT), not SciPy's pocketfft, which cannot be
traced. What is exported is the plain model in float32; see :func:`export_onnx` for what is refused and why.

Everything here needs the ``onnx`` extra (``pip install "orchid-hf[onnx]"``: onnx, onnxscript, onnxruntime).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .extras import require_extra
from .modeling import (
    OrchidForImageClassification,
    OrchidForMaskedLM,
    OrchidForMultipleChoice,
    OrchidForQuestionAnswering,
    OrchidForSequenceClassification,
    OrchidForTokenClassification,
    OrchidModel,
    OrchidOperator,
    OrchidPreTrainedModel,
)
from .modeling.orchid_layers import mask_rule
from .modeling.orchid_ops import tracing_for_onnx

# The outputs of each exportable class, in the order of the graph's outputs.
OUTPUT_NAMES: dict[type, tuple[str, ...]] = {
    OrchidModel: ("last_hidden_state",),
    OrchidForMaskedLM: ("logits",),
    OrchidForSequenceClassification: ("logits",),
    OrchidForTokenClassification: ("logits",),
    OrchidForQuestionAnswering: ("start_logits", "end_logits"),
    OrchidForImageClassification: ("logits",),
    OrchidForMultipleChoice: ("logits",),
    OrchidOperator: ("output",),
}
# The tolerance of verify=True: the largest absolute difference allowed between ONNX Runtime's outputs and PyTorch's.
VERIFY_ATOL = 1e-4
EXAMPLE_BATCH = 2


def require_onnx(module: str = "onnxruntime"):
    """``module`` (onnx, onnxscript or onnxruntime), or an ImportError naming the ``onnx`` extra."""
    return require_extra(module, "onnx")


# ---------------------------------------------------------------------------------------------
# What is exported
# ---------------------------------------------------------------------------------------------


def exportable(model) -> nn.Module:
    """``model`` itself if :func:`export_onnx` can export it; otherwise a ValueError naming the part that cannot be
    exported and what to export instead."""
    if not isinstance(model, tuple(OUTPUT_NAMES)):
        names = ", ".join(cls.__name__ for cls in OUTPUT_NAMES)
        hint = "; merge its peft adapters first (merge_and_unload())" if hasattr(model, "peft_config") else ""
        raise ValueError(f"export_onnx exports Orchid models ({names}), got {type(model).__name__}{hint}")
    for name, module in model.named_modules():
        if type(module).__module__.startswith(("torch.ao.nn.quantized", "torch.nn.quantized")):
            raise ValueError(
                f"module {name!r} is a quantised {type(module).__name__}, which the ONNX export does not trace; "
                "export the float32 model and quantise the ONNX graph with onnxruntime.quantization"
            )
    dtypes = sorted({str(p.dtype) for p in model.parameters() if p.is_floating_point()})
    if dtypes != ["torch.float32"]:
        raise ValueError(
            f"export_onnx exports float32 models, got parameters in {dtypes}; export model.float() (ONNX Runtime's "
            "CPU kernels have no bfloat16 DFT)"
        )
    return model


def input_names(model: nn.Module) -> tuple[str, ...]:
    """The graph's inputs: ``pixel_values`` for image models; ``input_ids``, ``attention_mask`` and, where the model
    has token types, ``token_type_ids`` for text; ``hidden_states`` and ``attention_mask`` for an operator."""
    if isinstance(model, OrchidOperator):
        return ("hidden_states", "attention_mask")
    if model.config.is_vision:
        return ("pixel_values",)
    names = ("input_ids", "attention_mask")
    return names + ("token_type_ids",) if model.config.type_vocab_size > 0 else names


def max_length(model: nn.Module) -> int:
    """The longest input: the transform length of the model (``config.max_sequence_length``) or operator."""
    return model.max_len if isinstance(model, OrchidOperator) else model.config.max_sequence_length


# The ONNX file's metadata key under which the input rules (:func:`input_rules`) are stored for the runner.
RULES_KEY = "orchid_hf.input_rules"


def input_rules(model: nn.Module) -> dict[str, tuple[int, int, str]]:
    """The values the model accepts in each integer input of the graph, ``{name: (low, high, rule)}`` with ``low <=
    value < high``: the rules the PyTorch model checks its inputs by (``OrchidModel.input_rules``, the operator's
    ``mask_rule``), for the inputs the graph takes."""
    if isinstance(model, OrchidOperator):
        return {"attention_mask": mask_rule()}
    rules = model.base_model.input_rules()
    return {name: rule for name, rule in rules.items() if name in input_names(model)}


def length_rule(longest: int) -> str:
    """The rule of the length axis (the mask's last), for a model whose longest input is ``longest``."""
    return f"length must lie in [1, max_sequence_length={longest}]"


def output_names(model: nn.Module) -> tuple[str, ...]:
    return next(names for cls, names in OUTPUT_NAMES.items() if isinstance(model, cls))


class ExportedForward(nn.Module):
    """The model's forward with its inputs as positional tensors and its outputs as a tuple of tensors, as the graph
    has them."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.inputs = input_names(model)
        self.outputs = output_names(model)

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        inputs = dict(zip(self.inputs, tensors))
        if isinstance(self.model, OrchidOperator):
            return (self.model(inputs["hidden_states"], inputs["attention_mask"]),)
        result = self.model(**inputs, return_dict=True)
        return tuple(getattr(result, name) for name in self.outputs)


# OrchidForMultipleChoice's inputs have a choices axis; each example (and the check) has this many choices.
EXAMPLE_CHOICES = 2


def example_inputs(
    model: nn.Module, batch: int, length: int, generator: torch.Generator | None = None
) -> dict[str, torch.Tensor]:
    """Random inputs of the graph's names for (batch, length) (length is ignored by image models; multiple choice
    has EXAMPLE_CHOICES choices per example): token ids in [1, vocab_size), a mask with the first row padded on the
    right and, from two rows on, the last row padded on the left (a third of each row padding), token types 0 then
    1."""
    generator = generator if generator is not None else torch.Generator().manual_seed(0)
    names = input_names(model)
    if "pixel_values" in names:
        config = model.config
        shape = (batch, config.num_channels, config.image_size, config.image_size)
        return {"pixel_values": torch.randn(shape, generator=generator)}
    choices = EXAMPLE_CHOICES if isinstance(model, OrchidForMultipleChoice) else 1
    rows = batch * choices
    mask = torch.ones(rows, length, dtype=torch.int64)
    padding = length // 3
    if padding:
        mask[0, length - padding :] = 0
        if rows > 1:
            mask[-1, :padding] = 0
    if "hidden_states" in names:
        hidden = torch.randn(batch, length, model.d_model, generator=generator)
        return {"hidden_states": hidden, "attention_mask": mask}
    inputs = {
        "input_ids": torch.randint(1, model.config.vocab_size, (rows, length), generator=generator),
        "attention_mask": mask,
    }
    if "token_type_ids" in names:
        inputs["token_type_ids"] = (torch.arange(length) >= length // 2).to(torch.int64).expand(rows, length)
    if choices > 1:
        inputs = {name: tensor.reshape(batch, choices, length) for name, tensor in inputs.items()}
    return inputs


def dynamic_axes(model: nn.Module) -> dict[str, dict[int, str]]:
    """The named dynamic axes of each input: batch always; length for text and operators; the choices of
    multiple choice."""
    sequence = {1: "choices", 2: "length"} if isinstance(model, OrchidForMultipleChoice) else {1: "length"}
    if max_length(model) < 2:  # one token: nothing to vary (and torch.export specialises size 1)
        sequence = {axis: name for axis, name in sequence.items() if name != "length"}
    return {name: {0: "batch"} if name == "pixel_values" else {0: "batch", **sequence} for name in input_names(model)}


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """The model in eval mode (no dropout) while it is traced, in its own mode afterwards."""
    training = model.training
    try:
        yield model.eval()
    finally:
        model.train(training)


# ---------------------------------------------------------------------------------------------
# Export
# ---------------------------------------------------------------------------------------------


def load_for_export(model_or_path) -> nn.Module:
    """An Orchid model, or one loaded from a saved folder (or Hub id) as the class its config names (``OrchidModel``
    where it names none); a ValueError for another model type or a class :func:`export_onnx` does not export."""
    if isinstance(model_or_path, nn.Module):
        return model_or_path
    from transformers import AutoConfig

    from .hub import from_pretrained

    how_to_local = "Pass a folder written by save_pretrained."
    path = os.fspath(model_or_path)
    config = from_pretrained(AutoConfig, path, what="model", how_to_local=how_to_local)
    architectures = list(getattr(config, "architectures", None) or [])
    if config.model_type != "orchid":
        raise ValueError(
            f"export_onnx exports Orchid models; {path} holds a {config.model_type!r} model "
            f"({', '.join(architectures) or 'no architectures in its config'}); export it with Hugging Face optimum "
            f"(optimum-cli export onnx --model {path} OUTPUT_DIR)"
        )
    classes = {cls.__name__: cls for cls in OUTPUT_NAMES if issubclass(cls, OrchidPreTrainedModel)}
    names = [name for name in architectures if name in classes]
    if architectures and not names:
        raise ValueError(
            f"{path}: its config.architectures names {architectures}, none of the classes export_onnx exports "
            f"({', '.join(classes)})"
        )
    cls = classes[names[0]] if names else OrchidModel
    return from_pretrained(cls, path, what="model", how_to_local=how_to_local, config=config)


def export_onnx(
    model_or_path,
    path: str | os.PathLike,
    *,
    verify: bool = False,
    atol: float = VERIFY_ATOL,
    opset_version: int | None = None,
    optimize: bool = True,
) -> Path:
    """Export an Orchid model (or a saved folder or Hub id holding one) to the ONNX file ``path``; returns the path.

    The graph's inputs are ``input_ids``, ``attention_mask`` (and ``token_type_ids`` where the model has token
    types), int64, of shape (batch, length) with 1 <= length <= ``config.max_sequence_length``; image models take
    ``pixel_values`` (batch, channels, size, size), operators ``hidden_states`` (batch, length, d_model) and
    ``attention_mask``. Batch and length are dynamic axes named ``batch`` and ``length``. The outputs are those of
    the model's output class: ``last_hidden_state`` (OrchidModel), ``logits`` (masked LM, sequence, token and image
    classification), ``start_logits`` and ``end_logits`` (question answering). Padding on either side gives the
    outputs PyTorch gives. The graph checks masks, ids, token types and the length as the model does
    (:func:`add_input_checks`): ONNX Runtime stops on what PyTorch refuses.

    ``verify``: run the file with ONNX Runtime on random padded batches of other shapes than the example the graph
    was traced with (:func:`compare_with_onnxruntime`) and raise a ValueError if an output differs from PyTorch's by
    more than ``atol``. ``optimize``: let onnxscript's optimizer fold constants (the static filters' spectra) and
    simplify the graph. ``opset_version``: the exporter's default if None.

    Refused with a ValueError naming the part: quantised modules (quantise the ONNX graph instead), parameters in
    another dtype than float32, anything that is not an Orchid model (a peft model: merge its adapters first), a saved
    folder of another model type. The model is traced in eval mode and left as it was.
    """
    require_onnx("onnx")
    require_onnx("onnxscript")
    model = exportable(load_for_export(model_or_path))
    path = Path(path)
    if path.suffix != ".onnx":
        raise ValueError(f"path must end in .onnx, got {str(path)!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    device = next(model.parameters()).device
    length = max_length(model)
    # The example's batch and length must be at least 2 (torch.export specialises sizes 0 and 1) and differ from
    # the shapes compare_with_onnxruntime checks.
    example = example_inputs(model, EXAMPLE_BATCH, max(2, min(16, length // 2)))
    axes = dynamic_axes(model)
    dims = {
        "batch": torch.export.Dim("batch", min=1),
        "choices": torch.export.Dim("choices", min=1),
        "length": torch.export.Dim("length", min=1, max=length),
    }
    wrapper = ExportedForward(model)
    with eval_mode(model), tracing_for_onnx():
        program = torch.export.export(
            wrapper,
            tuple(tensor.to(device) for tensor in example.values()),
            dynamic_shapes=(tuple({axis: dims[name] for axis, name in axes[key].items()} for key in example),),
            strict=False,
        )
    with quiet_exporter():
        onnx_program = torch.onnx.export(
            program,
            dynamo=True,
            input_names=list(wrapper.inputs),
            output_names=list(wrapper.outputs),
            # The axes' names: the exporter renames its symbols (s0, s1, ...) after them.
            dynamic_shapes=(tuple(axes[key] for key in example),),
            opset_version=opset_version,
            optimize=optimize,
            verbose=False,
        )
    check_dynamic_axes(onnx_program.model, axes)
    add_input_checks(onnx_program.model, model)
    onnx_program.save(str(path))
    if verify:
        differences = compare_with_onnxruntime(model, path)
        worst = max(differences, key=differences.get)
        if differences[worst] > atol:
            raise ValueError(
                f"the ONNX graph in {path} differs from PyTorch by up to {differences[worst]:.3g} in {worst} "
                f"(atol={atol}); every output: {differences}"
            )
    return path


# Loggers whose notices during an export say nothing about the model: that torchvision's operators are not
# registered (when the exporter builds its registry), and the constant folder's notes on nodes it does not fold.
QUIET_LOGGERS = ("torch.onnx._internal.exporter._registration", "onnxscript.optimizer._constant_folding")


@contextlib.contextmanager
def quiet_exporter() -> Iterator[None]:
    """torch.onnx.export without the notices of ``QUIET_LOGGERS`` (errors still show) and without the warning that an
    axis name is used by several inputs (it is, on purpose: batch and length are the same axes in every input)."""
    loggers = [logging.getLogger(name) for name in QUIET_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="# The axis name: .* will not be used", category=UserWarning)
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def check_dynamic_axes(model, axes: dict[str, dict[int, str]]) -> None:
    """A RuntimeError unless every input axis of ``axes`` is a symbol of its name in the graph ``model``
    (an ``onnx_ir`` model): a size fixed to the example's would give wrong results or errors at other shapes."""
    for value in model.graph.inputs:
        for axis, name in axes[value.name].items():
            dim = value.shape[axis]
            if getattr(dim, "value", None) != name:
                raise RuntimeError(f"axis {axis} of input {value.name} should be the dynamic axis {name!r}, got {dim}")


def add_input_checks(graph_model, model: nn.Module) -> None:
    """Give the graph ``graph_model`` (an ``onnx_ir`` model) the PyTorch model's checks of its integer inputs
    (:func:`input_rules`) and of the length, and store the rules in its metadata for :func:`run_onnxruntime`.

    ONNX has no assertion, so each check is a ``Gather`` from a one-element tensor at index 0 when the inputs
    satisfy the rule and 1 when they do not, a node named by the rule: ONNX Runtime stops there with "... running
    Gather node. Name:'<rule>' ... out of data bounds" before anything reads the input, instead of reading an
    additive mask inverted, a mask of 2 as 1, or an id of -1 as the embedding's last row. Each checked input
    reaches the rest of the graph plus that Gather's 0, so every node that reads it waits for its check."""
    import onnx_ir as ir

    graph = graph_model.graph
    tape = ir.tape.Tape(graph)

    def constant(value) -> ir.Value:
        return tape.op("Constant", [], attributes={"value": ir.tensor(np.asarray(value, dtype=np.int64))})

    def check(ok: ir.Value, rule: str) -> ir.Value:
        """0 (int64) where ``ok`` is true; a failing Gather named ``rule`` where it is false."""
        index = tape.op("Cast", [tape.op("Not", [ok])], attributes={"to": ir.DataType.INT64})
        return tape.op("Gather", [constant([0]), index], attributes={"axis": 0}, name=rule)

    inputs = {value.name: value for value in graph.inputs}
    rules = input_rules(model)
    for name, (low, high, rule) in rules.items():
        value = inputs[name]
        uses = list(value.uses())
        lowest = tape.op("ReduceMin", [value], attributes={"keepdims": 0})
        highest = tape.op("ReduceMax", [value], attributes={"keepdims": 0})
        ok = tape.op("And", [tape.op("GreaterOrEqual", [lowest, constant(low)]),
                             tape.op("Less", [highest, constant(high)])])  # fmt: skip
        zero = check(ok, rule)
        if name == "attention_mask":  # every text model and operator has one, with the length as its last axis
            length = tape.op("Gather", [tape.op("Shape", [value]), constant(-1)], attributes={"axis": 0})
            within = tape.op("And", [tape.op("GreaterOrEqual", [length, constant(1)]),
                                     tape.op("LessOrEqual", [length, constant(max_length(model))])])  # fmt: skip
            zero = tape.op("Add", [zero, check(within, length_rule(max_length(model)))])
        checked = tape.op("Add", [value, zero])
        for node, index in uses:
            node.replace_input_with(index, checked)
    graph.sort()
    graph_model.metadata_props[RULES_KEY] = json.dumps({"rules": rules, "max_length": max_length(model)})


# ---------------------------------------------------------------------------------------------
# ONNX Runtime
# ---------------------------------------------------------------------------------------------


def onnxruntime_session(path: str | os.PathLike, threads: int | None = None):
    """An ONNX Runtime CPU session of the file ``path``, with ``threads`` intra-op threads (ONNX Runtime's default
    if None)."""
    onnxruntime = require_onnx("onnxruntime")
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # errors only: its notes on constants it cannot fold say nothing to the user
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


# ONNX Runtime's names of the graph's input types.
ONNX_DTYPES = {"tensor(int64)": np.int64, "tensor(float)": np.float32}


def run_onnxruntime(session, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The session's outputs, by name, for inputs given as tensors by name.

    The inputs are checked first as the PyTorch model checks them, with a ValueError naming the input and the
    values: every input of the graph given and no other, text inputs of one shape, the length within the transform
    length, and the values of masks, ids and token types within their rules (:func:`input_rules`, stored in the
    file by :func:`export_onnx`). Then they take the graph's dtypes, so that a bool or float mask and int32 ids run
    as in PyTorch."""
    expected = {value.name: value for value in session.get_inputs()}
    missing, unknown = sorted(set(expected) - set(inputs)), sorted(set(inputs) - set(expected))
    if missing or unknown:
        raise ValueError(f"the graph takes {list(expected)}: missing {missing}; unknown {unknown}")
    arrays = {name: tensor.detach().cpu().numpy() for name, tensor in inputs.items()}
    metadata = json.loads(session.get_modelmeta().custom_metadata_map.get(RULES_KEY, '{"rules": {}}'))
    rules = metadata["rules"]
    shapes = {name: arrays[name].shape for name in rules if name != "attention_mask"}
    if "attention_mask" in rules:
        mask_shape = arrays["attention_mask"].shape
        if any(shape != mask_shape for shape in shapes.values()):
            others = ", ".join(f"{name} {shape}" for name, shape in shapes.items())
            raise ValueError(f"attention_mask has shape {mask_shape}, {others}: they must be the same")
        if not 1 <= mask_shape[-1] <= metadata["max_length"]:
            raise ValueError(f"{length_rule(metadata['max_length'])}, got {mask_shape[-1]}")
    for name, (low, high, rule) in rules.items():
        values = arrays[name].astype(np.float64)
        bad = values[~((values >= low) & (values < high) & (values == np.round(values)))]
        if bad.size:
            raise ValueError(f"{rule}, got values from {_number(bad.min())} to {_number(bad.max())}")
    feed = {name: array.astype(ONNX_DTYPES.get(expected[name].type, array.dtype)) for name, array in arrays.items()}
    names = [output.name for output in session.get_outputs()]
    return {name: torch.from_numpy(array) for name, array in zip(names, session.run(names, feed))}


def quantize_int8(path: str | os.PathLike, output: str | os.PathLike | None = None) -> Path:
    """ONNX Runtime's dynamic int8 quantisation of the graph in ``path``: the weights of its matrix products stored as
    int8 (a scale each), the activations quantised on the fly at each call. Written to ``output`` (default: beside
    ``path``, ``NAME_int8.onnx``) with the input rules that :func:`run_onnxruntime` checks; returns its path.

    The transforms (DCT, FFT) and the filters' networks stay in float32: only ``MatMul`` and ``Gemm`` nodes, the
    projections and MLPs, are quantised."""
    import onnx

    require_onnx("onnxruntime")
    from onnxruntime.quantization import QuantType, quantize_dynamic

    path = Path(path)
    output = Path(output) if output is not None else path.with_name(f"{path.stem}_int8{path.suffix}")
    quantize_dynamic(path, output, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "Gemm"])
    source, quantized = onnx.load(path, load_external_data=False), onnx.load(output)
    kept = {entry.key for entry in quantized.metadata_props}
    for entry in source.metadata_props:
        if entry.key not in kept:
            quantized.metadata_props.add(key=entry.key, value=entry.value)
    onnx.save(quantized, output)
    return output


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else float(value)


def compare_with_onnxruntime(
    model, path: str | os.PathLike, shapes: Sequence[tuple[int, int]] | None = None, seed: int = 0
) -> dict[str, float]:
    """The largest absolute difference of each output between ONNX Runtime running the file ``path`` and PyTorch
    running ``model`` (eval mode, no grad), over random batches of ``shapes`` (batch, length) padded on the right in
    the first row and on the left in the last (:func:`example_inputs`). By default two shapes unlike the export
    example, (3, max_sequence_length) and (1, a third of it), and at every transform length n of a text model or
    operator the rows that sit at the edge of its rung (:func:`rung_edge_inputs`): n real tokens beside n - 1, where
    a sequence starts to fill its transform and close a circle of its own."""
    model = load_for_export(model)
    length = max_length(model)
    generator = torch.Generator().manual_seed(seed)
    if shapes is None:
        shapes = [(3, length), (1, max(1, length // 3))]
        batches = [example_inputs(model, batch, size, generator) for batch, size in shapes]
        batches += rung_edge_inputs(model, generator)
    else:
        batches = [example_inputs(model, batch, size, generator) for batch, size in shapes]
    session = onnxruntime_session(path)
    device = next(model.parameters()).device
    differences: dict[str, float] = {}
    training = model.training
    model.eval()
    try:
        for inputs in batches:
            with torch.no_grad():
                expected = ExportedForward(model)(*(tensor.to(device) for tensor in inputs.values()))
            outputs = run_onnxruntime(session, inputs)
            for name, value in zip(output_names(model), expected):
                difference = (outputs[name] - value.float().cpu()).abs().max().item()
                differences[name] = max(differences.get(name, 0.0), difference)
    finally:
        model.train(training)
    return differences


def rung_edge_inputs(model: nn.Module, generator: torch.Generator) -> list[dict[str, torch.Tensor]]:
    """For every transform length n of a text model or an operator (none for image models, whose grid has one): a
    batch of length n whose rows hold n, n - 1 (padded on the right) and n - 1 (padded on the left) real tokens, and
    one row of n - 1 tokens alone. A row one token short of its rung is zero-padded to it and must not wrap around as
    a full row does (the circular short convolutions of the FFT path)."""
    if "pixel_values" in input_names(model):
        return []
    lengths = model.transform_lengths if isinstance(model, OrchidOperator) else model.config.resolved_transform_lengths(
        max_length(model)
    )
    batches = []
    for n in lengths:
        inputs = example_inputs(model, 3, n, generator)
        mask = torch.ones_like(inputs["attention_mask"]).view(-1, n)  # a row per sequence (per choice)
        if n > 1:
            mask[1::3, -1] = 0
            mask[2::3, 0] = 0
            alone = example_inputs(model, 1, n - 1, generator)
            alone["attention_mask"] = torch.ones_like(alone["attention_mask"])
            batches.append(alone)
        inputs["attention_mask"] = mask.view_as(inputs["attention_mask"])
        batches.append(inputs)
    return batches


__all__ = ["compare_with_onnxruntime", "export_onnx", "onnxruntime_session", "quantize_int8", "run_onnxruntime"]
