"""Checkpoints: safetensors only, remote code without orchid_hf installed (and without SciPy), corrupt files,
pipelines."""

import json
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from transformers import ViTImageProcessor, pipeline
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging as transformers_logging

from orchid_hf import (
    OrchidForImageClassification,
    OrchidForMaskedLM,
    OrchidForSequenceClassification,
    OrchidForTokenClassification,
    OrchidModel,
)
from orchid_hf.tokenization import train_wordpiece_tokenizer

from .test_models import tiny_image_config, tiny_text_config

CORPUS = [
    "the cat sat on the mat",
    "a dog ran in the park",
    "the bird sang in the tree",
    "my friend read a good book",
    "the sun is warm today",
] * 20

# Each head with the Auto class that must load it from remote code, and an input builder.
HEADS = {
    "base": (OrchidModel, "AutoModel", "text"),
    "masked_lm": (OrchidForMaskedLM, "AutoModelForMaskedLM", "text"),
    "sequence": (OrchidForSequenceClassification, "AutoModelForSequenceClassification", "text"),
    "token": (OrchidForTokenClassification, "AutoModelForTokenClassification", "text"),
    "image": (OrchidForImageClassification, "AutoModelForImageClassification", "image"),
}


def make_inputs(kind: str) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    if kind == "image":
        return {"pixel_values": torch.randn(2, 3, 16, 16, generator=generator)}
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0
    return {"input_ids": torch.randint(5, 97, (2, 9), generator=generator), "attention_mask": mask}


def first_output(output) -> torch.Tensor:
    return output.logits if hasattr(output, "logits") else output.last_hidden_state


@pytest.fixture(scope="module")
def saved_heads(tmp_path_factory):
    """Every head saved with its inputs and the outputs it gives in this process."""
    root = tmp_path_factory.mktemp("heads")
    for name, (cls, _, kind) in HEADS.items():
        torch.manual_seed(0)
        config = tiny_image_config() if kind == "image" else tiny_text_config()
        model = cls(config).eval()
        folder = root / name
        model.save_pretrained(folder)
        inputs = make_inputs(kind)
        with torch.no_grad():
            expected = first_output(model(**inputs))
        save_file({**inputs, "expected": expected.contiguous()}, str(folder / "io.safetensors"))
    return root


def test_save_pretrained_writes_safetensors_and_the_remote_code(saved_heads):
    for name in HEADS:
        files = {path.name for path in (saved_heads / name).iterdir()}
        assert "model.safetensors" in files
        assert not any(f.endswith((".bin", ".pt", ".pth", ".pkl", ".ckpt")) for f in files), files
        model_code = {"configuration_orchid.py", "modeling_orchid.py", "orchid_layers.py", "orchid_ops.py"}
        assert model_code | {"config.json"} <= files
        auto_map = json.loads((saved_heads / name / "config.json").read_text())["auto_map"]
        # The question-answering and multiple-choice heads are saved and loaded in tests/test_heads_qa_mc.py.
        other_heads = {"AutoModelForQuestionAnswering", "AutoModelForMultipleChoice"}
        assert set(auto_map) == {auto for _, auto, _ in HEADS.values()} | other_heads | {"AutoConfig"}


REMOTE_LOADER = textwrap.dedent(
    """
    import sys

    # The environment of a user who never installed orchid_hf (nor, with "scipy" blocked, SciPy): a None entry in
    # sys.modules makes every import of the package fail, and importlib.util.find_spec report it missing.
    blocked = sys.argv[1].split(",")
    for package in blocked:
        sys.modules[package] = None
    for package in blocked:
        try:
            __import__(package)
            raise SystemExit(f"{package} is importable; the test would prove nothing")
        except ModuleNotFoundError:
            pass

    import torch, transformers
    from safetensors.torch import load_file

    root, heads = sys.argv[2], sys.argv[3:]
    for spec in heads:
        name, auto_name = spec.split(":")
        folder = f"{root}/{name}"
        model = getattr(transformers, auto_name).from_pretrained(folder, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
        tensors = load_file(f"{folder}/io.safetensors")
        expected = tensors.pop("expected")
        with torch.no_grad():
            output = model(**tensors)
        if hasattr(output, "start_logits"):  # question answering: both logits, stacked
            got = torch.stack([output.start_logits, output.end_logits])
        else:
            got = output.logits if hasattr(output, "logits") else output.last_hidden_state
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
        layers = sys.modules[type(model).__module__.rsplit(".", 1)[0] + ".orchid_ops"]
        print("remote-ok", name, type(model).__name__, "dct:" + ("torch" if layers.scipy_fft is None else "pocketfft"))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("blocked", ["orchid_hf", "orchid_hf,scipy"])
def test_every_head_loads_as_remote_code_without_orchid_hf(saved_heads, tmp_path, hf_modules_cache, blocked):
    # Without SciPy the remote code runs the DCT in torch, and gives what the package gave through pocketfft.
    specs = [f"{name}:{auto}" for name, (_, auto, _) in HEADS.items()]
    result = subprocess.run(
        [sys.executable, "-c", REMOTE_LOADER, blocked, str(saved_heads), *specs],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # not the repository, whose orchid_hf/ folder would be importable from the cwd
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("remote-ok") == len(HEADS), result.stdout
    assert result.stdout.count("dct:torch" if "scipy" in blocked else "dct:pocketfft") == len(HEADS), result.stdout


def copy_checkpoint(source, destination):
    shutil.copytree(source, destination)
    return destination


def test_truncated_checkpoint_raises(saved_heads, tmp_path):
    folder = copy_checkpoint(saved_heads / "masked_lm", tmp_path / "truncated")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(Exception, match="(?i)header|metadata|incomplete|deserializ"):
        OrchidForMaskedLM.from_pretrained(folder)


def test_checkpoint_missing_an_encoder_weight_is_reported_as_transformers_reports_it(saved_heads, tmp_path):
    """As for transformers' own models: the weight is initialised, listed in missing_keys and named in a warning."""
    folder = copy_checkpoint(saved_heads / "sequence", tmp_path / "missing")
    weights = load_file(str(folder / "model.safetensors"))
    del weights["orchid.encoder.layer.1.mixer.out_proj.weight"]
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    logger = transformers_logging.get_logger("transformers.modeling_utils")
    with CaptureLogger(logger) as captured:
        model, info = OrchidForSequenceClassification.from_pretrained(folder, output_loading_info=True)
    assert info["missing_keys"] == {"orchid.encoder.layer.1.mixer.out_proj.weight"}
    assert "orchid.encoder.layer.1.mixer.out_proj.weight" in captured.out
    assert torch.isfinite(model.orchid.encoder.layer[1].mixer.out_proj.weight).all()


def test_checkpoint_with_a_wrong_shape_raises(saved_heads, tmp_path):
    folder = copy_checkpoint(saved_heads / "base", tmp_path / "reshaped")
    weights = load_file(str(folder / "model.safetensors"))
    weights["encoder.layer.0.mixer.in_proj.weight"] = torch.zeros(10, 10)
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(Exception, match="(?i)size|shape|mismatch"):
        OrchidModel.from_pretrained(folder)


# ---------------------------------------------------------------------------------------------
# Pipelines on saved folders
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    return train_wordpiece_tokenizer(CORPUS, vocab_size=97)


def save_text_model(cls, tokenizer, folder, **config_overrides):
    model = cls(tiny_text_config(vocab_size=len(tokenizer), **config_overrides)).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


def test_fill_mask_pipeline(tokenizer, tmp_path):
    save_text_model(OrchidForMaskedLM, tokenizer, tmp_path)
    fill = pipeline("fill-mask", model=str(tmp_path), device="cpu")
    predictions = fill("the cat [MASK] on the mat", top_k=3)
    assert len(predictions) == 3
    assert all(p["sequence"].startswith("the cat") and 0 <= p["score"] <= 1 for p in predictions)
    assert predictions[0]["score"] >= predictions[-1]["score"]


def test_text_classification_pipeline_with_sentence_pairs(tokenizer, tmp_path):
    labels = {0: "contradiction", 1: "neutral", 2: "entailment"}
    model = save_text_model(
        OrchidForSequenceClassification,
        tokenizer,
        tmp_path,
        id2label=labels,
        label2id={v: k for k, v in labels.items()},
    )
    classify = pipeline("text-classification", model=str(tmp_path), device="cpu")
    result = classify({"text": "the cat sat on the mat", "text_pair": "a dog ran in the park"})
    result = result[0] if isinstance(result, list) else result
    assert result["label"] in labels.values()
    # The pipeline encodes the pair as one sequence with token types, like the model called directly.
    encoded = tokenizer("the cat sat on the mat", "a dog ran in the park", return_tensors="pt")
    with torch.no_grad():
        probabilities = model(**encoded).logits.softmax(-1)[0]
    assert result["label"] == labels[int(probabilities.argmax())]
    assert result["score"] == pytest.approx(float(probabilities.max()), abs=1e-5)


def test_token_classification_pipeline(tokenizer, tmp_path):
    labels = {0: "NOUN", 1: "VERB", 2: "OTHER"}
    save_text_model(
        OrchidForTokenClassification, tokenizer, tmp_path, id2label=labels, label2id={v: k for k, v in labels.items()}
    )
    tag = pipeline("token-classification", model=str(tmp_path), device="cpu")
    entities = tag("the cat sat on the mat")
    assert [entity["word"] for entity in entities] == tokenizer.tokenize("the cat sat on the mat")
    assert all(entity["entity"] in labels.values() for entity in entities)


def test_image_classification_pipeline(tmp_path):
    config = tiny_image_config(id2label={i: f"class_{i}" for i in range(5)})
    OrchidForImageClassification(config).eval().save_pretrained(tmp_path)
    ViTImageProcessor(size={"height": 16, "width": 16}, image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(
        tmp_path
    )
    classify = pipeline("image-classification", model=str(tmp_path), device="cpu")
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 30, 3), dtype=np.uint8))
    results = classify(image, top_k=5)
    assert sorted(r["label"] for r in results) == [f"class_{i}" for i in range(5)]
    assert sum(r["score"] for r in results) == pytest.approx(1.0, abs=1e-4)
