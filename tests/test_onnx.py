"""ONNX export (``orchid_hf.onnx``, ``scripts/export_onnx.py``): tiny models of both transforms exported with a dynamic
batch and length, run by ONNX Runtime on padded batches (right and left) of other shapes than the export example and
compared with PyTorch; the DCT and FFT as the graph's DFT operators; and the clear refusals (an optimised copy, a
quantised model, another dtype, a missing extra)."""

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import torch

from orchid_hf import (
    OrchidForImageClassification,
    OrchidForMaskedLM,
    OrchidForSequenceClassification,
    OrchidModel,
    OrchidOperator,
    optimize_for_inference,
)
from orchid_hf.onnx import (
    compare_with_onnxruntime,
    example_inputs,
    export_onnx,
    onnxruntime_session,
    quantize_int8,
    run_onnxruntime,
)
from orchid_hf.runs import run_cli

from .test_models import tiny_image_config, tiny_text_config

MAX_LENGTH = 64
# (batch, length): two batch sizes and two lengths, none the export example's (2, 16); the full length, where the FFT
# model's short convolutions wrap around the circle; a single token.
SHAPES = [(3, MAX_LENGTH), (4, 23), (1, 1)]
ATOL = 1e-4
# The onnx extra installs onnxruntime only where a version that runs these graphs (>= 1.27) has wheels.
needs_onnxruntime = pytest.mark.skipif(sys.version_info < (3, 11), reason="onnxruntime >= 1.27 needs Python >= 3.11")
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "export_onnx.py"


def text_config(transform: str):
    return tiny_text_config(max_position_embeddings=MAX_LENGTH, transform=transform, num_labels=3)


def load_script():
    spec = importlib.util.spec_from_file_location("export_onnx_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Each (transform, class) exported once: OrchidModel through ``export_onnx(model, path)``, the classifier saved
    and exported by ``scripts/export_onnx.py FOLDER OUT.onnx --verify``; (model, path)."""
    cache = {}

    def get(transform: str, cls):
        if (transform, cls) not in cache:
            folder = tmp_path_factory.mktemp(f"{transform}_{cls.__name__}")
            torch.manual_seed(0)
            model = cls(text_config(transform)).eval()
            path = folder / "model.onnx"
            if cls is OrchidModel:
                assert export_onnx(model, path) == path
            else:
                model.save_pretrained(folder / "saved")
                assert load_script().main([str(folder / "saved"), str(path), "--verify"]) == str(path)
            cache[transform, cls] = (model, path)
        return cache[transform, cls]

    return get


@pytest.mark.slow
@needs_onnxruntime
@pytest.mark.parametrize("cls", [OrchidModel, OrchidForSequenceClassification])
@pytest.mark.parametrize("transform", ["dct", "fft"])
def test_onnx_runtime_gives_pytorchs_outputs_on_padded_batches_of_any_shape(exported, transform, cls):
    model, path = exported(transform, cls)
    differences = compare_with_onnxruntime(model, path, shapes=SHAPES)
    print(f"ONNX Runtime against PyTorch, {transform}, {cls.__name__}: {differences}")  # pytest -s shows it
    name = "last_hidden_state" if cls is OrchidModel else "logits"
    assert set(differences) == {name}
    assert differences[name] < ATOL, differences
    # The inputs hold right and left padding; the padded positions' outputs are not compared to the unpadded
    # batch here (test_models does that for PyTorch), but every position of both batches is.
    inputs = example_inputs(model, 3, 30)
    assert inputs["attention_mask"][0, -1] == 0 and inputs["attention_mask"][-1, 0] == 0
    # Another model's weights give other outputs: the comparison can fail.
    torch.manual_seed(1)
    other = cls(text_config(transform)).eval()
    assert compare_with_onnxruntime(other, path, shapes=SHAPES[:1])[name] > 100 * ATOL


@pytest.mark.slow
@needs_onnxruntime
@pytest.mark.parametrize("transform", ["dct", "fft"])
def test_the_graph_has_dynamic_batch_and_length_and_its_transforms(exported, transform, tmp_path):
    import onnx
    import onnxruntime

    _, path = exported(transform, OrchidModel)
    proto = onnx.load(str(path))

    def dims(value):
        return [dim.dim_param or dim.dim_value for dim in value.type.tensor_type.shape.dim]

    assert {value.name: dims(value) for value in proto.graph.input} == {
        "input_ids": ["batch", "length"],
        "attention_mask": ["batch", "length"],
        "token_type_ids": ["batch", "length"],
    }
    assert {value.name: dims(value) for value in proto.graph.output} == {"last_hidden_state": ["batch", "length", 32]}
    # Per layer: the conditioning network's transform, a forward and an inverse transform for each of the two long
    # convolutions, and the static filters' spectra, which depend on the weights only: ONNX Runtime folds those into
    # constants when it loads the graph (onnxscript's optimizer leaves them, as their inputs are large). The DCT of
    # these 64 points is a product with its matrix (MATRIX_DCT_MAX_LENGTH), no DFT.
    transforms = 0 if transform == "dct" else 2
    assert [node.op_type for node in proto.graph.node].count("DFT") == transforms * (5 + 2)
    loaded = tmp_path / "loaded.onnx"
    options = onnxruntime.SessionOptions()
    options.optimized_model_filepath = str(loaded)
    onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    assert [node.op_type for node in onnx.load(str(loaded)).graph.node].count("DFT") == transforms * 5


@pytest.mark.slow
@needs_onnxruntime
def test_an_image_classifier_exports_with_a_dynamic_batch(tmp_path):
    torch.manual_seed(0)
    model = OrchidForImageClassification(tiny_image_config(transform="fft")).eval()
    path = export_onnx(model, tmp_path / "image.onnx", verify=True)
    session = onnxruntime_session(path, threads=1)
    assert [value.name for value in session.get_inputs()] == ["pixel_values"]
    assert session.get_inputs()[0].shape == ["batch", 3, 16, 16]
    differences = compare_with_onnxruntime(model, path, shapes=[(5, 0), (1, 0)])
    assert differences["logits"] < ATOL
    inputs = example_inputs(model, 3, 0)
    with torch.no_grad():
        expected = model(**inputs).logits
    assert torch.allclose(run_onnxruntime(session, inputs)["logits"], expected, atol=ATOL)


def set_first(tensor: torch.Tensor, value) -> torch.Tensor:
    tensor = tensor.clone()
    tensor[0, 1] = value
    return tensor


# Inputs the PyTorch model refuses: (input, edit, the rule, the values the runner's error names).
BAD_INPUTS = {
    "additive mask": ("attention_mask", lambda mask: (1 - mask) * -10000, "attention_mask must hold 1 for real "
                      "tokens and 0 for padding", "from -10000 to -10000"),
    "mask of 2": ("attention_mask", lambda mask: mask * 2, "attention_mask must hold 1", "from 2 to 2"),
    "input id -1": ("input_ids", lambda ids: set_first(ids, -1), "input_ids must lie in [0, vocab_size=97)",
                    "from -1 to -1"),
    "input id 97": ("input_ids", lambda ids: set_first(ids, 97), "input_ids must lie in [0, vocab_size=97)",
                    "from 97 to 97"),
    "token type -1": ("token_type_ids", lambda types: set_first(types, -1),
                      "token_type_ids must lie in [0, type_vocab_size=2)", "from -1 to -1"),
    "token type 2": ("token_type_ids", lambda types: set_first(types, 2),
                     "token_type_ids must lie in [0, type_vocab_size=2)", "from 2 to 2"),
}  # fmt: skip


@pytest.mark.slow
@needs_onnxruntime
def test_the_graph_and_the_runner_refuse_the_inputs_pytorch_refuses(exported):
    import onnxruntime

    model, path = exported("dct", OrchidForSequenceClassification)
    direct = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    session = onnxruntime_session(path)
    good = example_inputs(model, 2, 8)
    for case, (field, edit, rule, values) in BAD_INPUTS.items():
        inputs = {**good, field: edit(good[field])}
        with pytest.raises(ValueError, match=re.escape(rule.split(" [")[0])):
            model(**inputs)  # PyTorch's own check
        with pytest.raises(ValueError, match=rf"{re.escape(rule)}.*got values {values}"):
            run_onnxruntime(session, inputs)
        # onnxruntime called directly: the graph stops in the node named by the rule, instead of reading the
        # additive mask inverted, 2 as 1, or -1 as the last row of the embedding.
        with pytest.raises(Exception, match=re.escape(rule)) as error:
            direct.run(None, {name: tensor.numpy() for name, tensor in inputs.items()})
        assert "out of data bounds" in str(error.value), case

    # The runner takes what PyTorch takes (a float or bool mask, int32 ids) and gives PyTorch's outputs.
    with torch.no_grad():
        expected = model(**good).logits
    for name, dtype in (("attention_mask", torch.float32), ("attention_mask", torch.bool), ("input_ids", torch.int32)):
        outputs = run_onnxruntime(session, {**good, name: good[name].to(dtype)})
        torch.testing.assert_close(outputs["logits"], expected, atol=ATOL, rtol=0)
    with pytest.raises(Exception, match=r"Unexpected input data type"):  # ONNX Runtime's own dtype check
        direct.run(None, {name: tensor.numpy().astype("float32") for name, tensor in good.items()})
    half = {**good, "attention_mask": good["attention_mask"] * 0.5}
    with pytest.raises(ValueError, match=r"attention_mask must hold 1 .* got values from 0.5 to 0.5"):
        run_onnxruntime(session, half)
    # Shapes: a length past the transform's, inputs of different shapes, a missing or unknown input.
    long = example_inputs(model, 1, MAX_LENGTH + 1)
    with pytest.raises(ValueError, match=rf"length must lie in \[1, max_sequence_length={MAX_LENGTH}\], got 65"):
        run_onnxruntime(session, long)
    with pytest.raises(Exception, match=rf"length must lie in \[1, max_sequence_length={MAX_LENGTH}\]"):
        direct.run(None, {name: tensor.numpy() for name, tensor in long.items()})
    with pytest.raises(ValueError, match=r"attention_mask has shape \(1, 8\), input_ids \(2, 8\)"):
        run_onnxruntime(session, {**good, "attention_mask": good["attention_mask"][:1]})
    with pytest.raises(ValueError, match=r"missing \['token_type_ids'\]; unknown \['labels'\]"):
        run_onnxruntime(session, {"input_ids": good["input_ids"], "attention_mask": good["attention_mask"],
                                  "labels": torch.zeros(2, dtype=torch.long)})  # fmt: skip


# ---------------------------------------------------------------------------------------------
# What is refused, and why
# ---------------------------------------------------------------------------------------------


def test_the_folded_copy_exports_with_the_outputs_of_the_plain_model(tmp_path):
    model = OrchidModel(text_config("dct")).eval()
    path = export_onnx(optimize_for_inference(model), tmp_path / "fast.onnx")
    assert max(compare_with_onnxruntime(model, path).values()) < 1e-4


def test_other_dtypes_quantised_layers_and_other_models_are_refused_by_name(tmp_path):
    model = OrchidModel(text_config("fft"))
    with pytest.raises(ValueError, match=r"float32 models, got parameters in \['torch.float64'\]"):
        export_onnx(model.double(), tmp_path / "model.onnx")
    quantised = torch.ao.quantization.quantize_dynamic(OrchidModel(text_config("fft")), {torch.nn.Linear})
    with pytest.raises(ValueError, match=r"module 'encoder.layer.0.mixer.in_proj' is a quantised .*onnxruntime"):
        export_onnx(quantised, tmp_path / "model.onnx")
    with pytest.raises(ValueError, match=r"exports Orchid models \(OrchidModel, .*\), got Linear"):
        export_onnx(torch.nn.Linear(2, 2), tmp_path / "model.onnx")
    with pytest.raises(ValueError, match=r"path must end in .onnx, got '.*model.pt'"):
        export_onnx(OrchidModel(text_config("fft")), tmp_path / "model.pt")
    assert not list(tmp_path.iterdir())


def test_a_folder_of_another_model_type_or_a_foreign_architecture_is_refused_by_name(tmp_path, capsys):
    from transformers import BertConfig, BertForSequenceClassification

    bert = tmp_path / "bert"
    BertForSequenceClassification(
        BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    ).save_pretrained(bert)
    message = r"exports Orchid models; .*bert holds a 'bert' model \(BertForSequenceClassification\).*optimum"
    with pytest.raises(ValueError, match=message):
        export_onnx(bert, tmp_path / "bert.onnx")
    with pytest.MonkeyPatch.context() as patch, pytest.raises(SystemExit) as stop:
        patch.setattr(sys, "argv", ["export_onnx.py", str(bert), str(tmp_path / "bert.onnx")])
        run_cli(load_script().main)
    assert stop.value.code == 1 and "holds a 'bert' model" in capsys.readouterr().err
    # An Orchid config whose architectures name a function of the package, or a class it does not have.
    for name in ("push_to_hub", "OrchidForCausalLM"):
        folder = tmp_path / name
        OrchidForSequenceClassification(text_config("dct")).save_pretrained(folder)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "architectures": [name]}))
        with pytest.raises(ValueError, match=rf"architectures names \['{name}'\], none of the classes export_onnx "
                                             r"exports \(OrchidModel, OrchidForMaskedLM, "):
            export_onnx(folder, tmp_path / "model.onnx")
    assert not list(tmp_path.glob("*.onnx"))


@pytest.mark.parametrize("module", ["onnx", "onnxscript", "onnxruntime"])
def test_a_missing_extra_names_the_install_command(tmp_path, monkeypatch, module):
    monkeypatch.setitem(sys.modules, module, None)  # as if it were not installed
    message = rf'{module} is needed here but is not installed: pip install "orchid-hf\[onnx\]"'
    if module == "onnxruntime":
        with pytest.raises(ImportError, match=message):
            onnxruntime_session(tmp_path / "model.onnx")
    else:
        with pytest.raises(ImportError, match=message):
            export_onnx(OrchidModel(text_config("dct")), tmp_path / "model.onnx")


def test_the_script_states_a_bad_argument_in_one_line(tmp_path, capsys):
    script = load_script()
    monkeypatch_argv = ["export_onnx.py", str(tmp_path / "missing"), str(tmp_path / "out.onnx")]
    with pytest.MonkeyPatch.context() as patch, pytest.raises(SystemExit) as stop:
        patch.setattr(sys, "argv", monkeypatch_argv)
        run_cli(script.main)
    assert stop.value.code == 2  # neither a folder nor, offline, a Hub name
    error = capsys.readouterr().err
    assert error.startswith(f"error: model {str(tmp_path / 'missing')!r} is not a local folder"), error
    assert "Pass a folder written by save_pretrained." in error


@pytest.mark.parametrize("transform", ["dct", "fft"])
def test_the_operator_traces_one_graph_for_every_length_up_to_the_transform_length(transform):
    # torch.export alone, without ONNX: the transforms pad by one op and the FFT's circular short convolutions select
    # their wrap in the graph, so that no length is tied to one side of `length < max_len`.
    torch.manual_seed(0)
    op = OrchidOperator(8, 16, transform=transform, conditioning="xcorr").eval().requires_grad_(False)
    example = torch.randn(2, 5, 8), torch.ones(2, 5, dtype=torch.int64)
    length = torch.export.Dim("length", min=1, max=16)
    batch = torch.export.Dim("batch", min=1)
    with torch.enable_grad():
        program = torch.export.export(op, example, dynamic_shapes=({0: batch, 1: length}, {0: batch, 1: length}),
                                      strict=False)  # fmt: skip
    for size in (16, 15, 7, 1):
        x, mask = torch.randn(3, size, 8), torch.ones(3, size, dtype=torch.int64)
        mask[0, size // 2 + 1 :] = 0
        mask[2, : size // 3] = 0
        with torch.no_grad():
            expected = op(x, mask)
        torch.testing.assert_close(program.module()(x, mask), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@needs_onnxruntime
@pytest.mark.parametrize("transform", ["dct", "fft"])
def test_the_model_exports_as_it_is_with_torch_onnx_export(transform, tmp_path):
    """As users of transformers' models export them: torch.onnx.export of the model itself, with a dynamic batch and
    length, runs in ONNX Runtime with PyTorch's outputs on padded batches of other shapes than the example."""
    import onnxruntime

    torch.manual_seed(0)
    model = OrchidModel(text_config(transform)).eval()
    inputs = example_inputs(model, 2, 16)
    batch, length = torch.export.Dim("batch", min=1), torch.export.Dim("length", min=2, max=MAX_LENGTH)
    axes = {0: batch, 1: length}
    program = torch.onnx.export(
        model, (inputs["input_ids"], inputs["attention_mask"]), dynamo=True,
        input_names=["input_ids", "attention_mask"], dynamic_shapes=(axes, axes),
    )
    program.save(str(tmp_path / "model.onnx"))
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"))
    for shape in [(3, MAX_LENGTH), (4, 23)]:
        other = example_inputs(model, *shape, torch.Generator().manual_seed(1))
        feed = {name: other[name].numpy() for name in ("input_ids", "attention_mask")}
        with torch.no_grad():
            expected = model(input_ids=other["input_ids"], attention_mask=other["attention_mask"]).last_hidden_state
        got = torch.from_numpy(session.run(None, feed)[0])
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


def test_verify_tries_the_rows_at_the_edge_of_every_transform_length():
    """verify=True (compare_with_onnxruntime's default batches) holds, at every transform length n, rows of n real
    tokens beside rows of n - 1 padded on either side, and a row of n - 1 alone."""
    from orchid_hf.onnx import rung_edge_inputs

    model = OrchidModel(tiny_text_config(max_position_embeddings=300, type_vocab_size=0))
    batches = rung_edge_inputs(model, torch.Generator().manual_seed(0))
    real_lengths = {tuple(batch["attention_mask"].sum(1).tolist()) for batch in batches}
    for n in (128, 256, 300):
        assert (n, n - 1, n - 1) in real_lengths and (n - 1,) in real_lengths
    for batch in batches:
        mask = batch["attention_mask"]
        if mask.shape[0] == 3:
            assert mask[1, -1] == 0 and mask[2, 0] == 0  # padded on the right, and on the left
    assert rung_edge_inputs(OrchidForImageClassification(tiny_image_config()), torch.Generator()) == []


@pytest.mark.slow
def test_verify_catches_a_row_one_token_short_of_its_transform_length_wrapping_around(tmp_path, monkeypatch):
    """With the short convolution's wrap decided per group of rows (a row of n - 1 tokens wraps when batched with a
    row of n, and at a traced length of n), verify=True fails; with the rule row by row, it passes."""
    import orchid_hf.modeling.orchid_layers as layers

    torch.manual_seed(0)
    model = OrchidForMaskedLM(tiny_text_config(max_position_embeddings=64, transform="fft", short_conv_size=5,
                                               type_vocab_size=0)).eval()  # fmt: skip
    export_onnx(model, tmp_path / "model.onnx", verify=True)

    def by_width(mask, n, length):  # every row of a group wraps when the group's width is n
        if mask is None:
            return length == n
        return (mask.view(mask.shape[0], -1).sum(dim=1) >= 0) & (length == n)

    monkeypatch.setattr(layers, "fills_transform", by_width)
    with pytest.raises(ValueError, match="differs from PyTorch"):
        export_onnx(model, tmp_path / "per-group.onnx", verify=True)


def test_int8_quantisation_keeps_the_outputs_and_the_input_rules(tmp_path):
    """quantize_int8: int8 weights for the matrix products (a smaller file), outputs close to the float graph's, and
    the runner still refusing bad inputs by name."""
    torch.manual_seed(0)
    config = tiny_text_config(hidden_size=64, intermediate_size=256, max_position_embeddings=32)
    model = OrchidForMaskedLM(config).eval()
    path = export_onnx(model, tmp_path / "model.onnx")
    quantized = quantize_int8(path)
    assert quantized == tmp_path / "model_int8.onnx" and quantized.stat().st_size < 0.6 * path.stat().st_size
    inputs = example_inputs(model, 3, 32, torch.Generator().manual_seed(1))
    real = inputs["attention_mask"].bool()
    exact = run_onnxruntime(onnxruntime_session(path), inputs)["logits"][real]
    approximate = run_onnxruntime(onnxruntime_session(quantized), inputs)["logits"][real]
    cosine = torch.nn.functional.cosine_similarity(exact, approximate, dim=-1)
    assert cosine.min() > 0.99 and not torch.equal(exact, approximate)  # quantised, and close
    with pytest.raises(ValueError, match=r"input_ids must lie in \[0, vocab_size=97\)"):
        run_onnxruntime(onnxruntime_session(quantized), {**inputs, "input_ids": inputs["input_ids"] + 97})


@needs_onnxruntime
@pytest.mark.parametrize("transform", ["dct", "fft"])
def test_batches_that_leave_transform_lengths_without_rows_in_a_program_and_in_onnx_runtime(transform, tmp_path):
    """A batch whose rows all sit at the shortest transform length leaves the others without rows: a torch.export
    program (every length on every row) and the ONNX graph (each length on its own rows, none here) both give the
    eager outputs, as they do for a batch with a row at every length."""
    torch.manual_seed(0)
    config = tiny_text_config(max_position_embeddings=64, transform_lengths=[16, 32, 64], transform=transform,
                              short_conv_size=5)  # fmt: skip
    model = OrchidModel(config).eval()
    example = example_inputs(model, 2, 40, torch.Generator().manual_seed(1))
    batch, length = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("length", min=2, max=64)
    names = ("input_ids", "attention_mask", "token_type_ids")
    program = torch.export.export(model, (), kwargs={name: example[name] for name in names},
                                  dynamic_shapes={name: {0: batch, 1: length} for name in names}).module()  # fmt: skip
    import onnx

    path = export_onnx(model, tmp_path / "model.onnx")
    # The ONNX graph finds each transform length's rows: one NonZero per length (the program has none).
    assert [node.op_type for node in onnx.load(path).graph.node].count("NonZero") == 3
    session = onnxruntime_session(path)
    for rows in ([9, 12, 16], [16, 30, 64, 5]):  # all at 16; then one at each length
        inputs = example_inputs(model, len(rows), max(rows), torch.Generator().manual_seed(2))
        inputs["attention_mask"] = (torch.arange(max(rows)) < torch.tensor(rows).unsqueeze(1)).long()
        real = inputs["attention_mask"].bool().unsqueeze(-1)
        with torch.no_grad():
            expected = model(**inputs).last_hidden_state * real
            exported = program(**{name: inputs[name] for name in names}).last_hidden_state * real
        onnx = run_onnxruntime(session, inputs)["last_hidden_state"] * real
        torch.testing.assert_close(exported, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(onnx, expected, atol=1e-5, rtol=1e-5)
