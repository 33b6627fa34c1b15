"""transformers' own exporters (``transformers.exporters``) on every Orchid class, as a user calls them: exported once
with dynamic shapes at one batch and length, then run at others (padding on either side, lengths on several rungs of
the transform-length ladder) by ONNX Runtime (``OnnxExporter``) and by the exported program (``DynamoExporter``),
equal to the PyTorch model; the ONNX folder saved and run again from disk."""

import pytest
import torch

from orchid_hf import (
    OrchidForImageClassification,
    OrchidForMaskedLM,
    OrchidForMultipleChoice,
    OrchidForQuestionAnswering,
    OrchidForSequenceClassification,
    OrchidForTokenClassification,
    OrchidModel,
)
from orchid_hf.onnx import example_inputs
from tests.test_models import tiny_image_config, tiny_text_config

pytest.importorskip("onnxruntime")
exporters = pytest.importorskip("transformers.exporters")

pytestmark = pytest.mark.usefixtures("one_thread")

TEXT_CLASSES = [OrchidModel, OrchidForMaskedLM, OrchidForSequenceClassification, OrchidForTokenClassification,
                OrchidForQuestionAnswering, OrchidForMultipleChoice]  # fmt: skip


def build(cls):
    torch.manual_seed(0)
    if cls is OrchidForImageClassification:
        return cls(tiny_image_config()).eval()
    # Three transform lengths, the FFT and a short convolution that wraps only rows that fill their length.
    config = tiny_text_config(max_position_embeddings=48, transform_lengths=[16, 32, 48], transform="fft",
                              short_conv_size=5)  # fmt: skip
    return cls(config).eval()


def real_outputs(outputs: dict, inputs: dict) -> dict[str, torch.Tensor]:
    """The outputs that depend on the inputs only: per-token outputs at real positions, everything else as it is."""
    mask = inputs.get("attention_mask")
    kept = {}
    for name, value in outputs.items():
        value = torch.as_tensor(value)
        if mask is not None and value.dim() >= 2 and value.shape[:2] == mask.shape:
            value = value * mask.view(*mask.shape, *[1] * (value.dim() - 2)).to(value.dtype)
        kept[name] = value
    return kept


def pytorch_outputs(model, inputs) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        out = model(**inputs)
    return real_outputs({name: value for name, value in out.items() if isinstance(value, torch.Tensor)}, inputs)


def shapes_for(cls):
    return [(1, 1)] if cls is OrchidForImageClassification else [(3, 40), (2, 13), (1, 48), (4, 24)]


def check_at_other_shapes(model, run, generator) -> None:
    for batch, length in shapes_for(type(model)):
        inputs = example_inputs(model, batch, length, generator)
        expected, got = pytorch_outputs(model, inputs), real_outputs(dict(run(**inputs)), inputs)
        for name, value in expected.items():
            torch.testing.assert_close(got[name], value, rtol=1e-4, atol=1e-5, msg=f"{name} at {(batch, length)}")


@pytest.mark.parametrize("cls", [*TEXT_CLASSES, OrchidForImageClassification], ids=lambda c: c.__name__)
def test_onnx_exporter_runs_every_class_in_onnx_runtime_at_other_shapes(cls, tmp_path):
    model = build(cls)
    generator = torch.Generator().manual_seed(1)
    exported = exporters.OnnxExporter().export(model, example_inputs(model, 2, 20, generator),
                                               config=exporters.OnnxConfig(dynamic=True))  # fmt: skip
    check_at_other_shapes(model, exported, generator)
    exported.save_pretrained(tmp_path / "exported")
    loaded = exporters.ExportedModel.from_pretrained(tmp_path / "exported")  # transformers' runner, from disk
    check_at_other_shapes(model, loaded, generator)


@pytest.mark.parametrize("cls", [OrchidForSequenceClassification, OrchidForMaskedLM], ids=lambda c: c.__name__)
def test_dynamo_exporter_runs_the_exported_program_at_other_shapes(cls, tmp_path):
    model = build(cls)
    generator = torch.Generator().manual_seed(2)
    exported = exporters.DynamoExporter().export(model, example_inputs(model, 2, 20, generator),
                                                 config=exporters.DynamoConfig(dynamic=True))  # fmt: skip
    check_at_other_shapes(model, exported, generator)
    exported.save_pretrained(tmp_path / "exported")
    # A saved program is pickled, so loading it runs code: transformers asks for trust_remote_code.
    loaded = exporters.ExportedModel.from_pretrained(tmp_path / "exported", trust_remote_code=True)
    check_at_other_shapes(model, loaded, generator)
