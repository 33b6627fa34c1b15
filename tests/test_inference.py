"""The inference opt-in, ``optimize_for_inference``: a copy whose implicit filters are folded into the multipliers
they compute. Its outputs equal the plain model's on every head, both transforms and padding on either side; it is
built from the plain model's own modules, so that nothing an edit does can leave it stale, and it cannot be saved."""

import copy

import peft
import pytest
import torch
from orchid_hf.modeling.orchid_layers import FoldedFilter, ImplicitFilter

from orchid_hf import (
    OrchidConfig,
    OrchidForImageClassification,
    OrchidForMaskedLM,
    OrchidForSequenceClassification,
    OrchidForTokenClassification,
    OrchidModel,
    OrchidOperator,
    optimize_for_inference,
)

from .test_models import tiny_text_config

TEXT_HEADS = [OrchidModel, OrchidForMaskedLM, OrchidForSequenceClassification, OrchidForTokenClassification]


def main_output(output) -> torch.Tensor:
    return output.logits if hasattr(output, "logits") else output.last_hidden_state


def padded_batch(length: int = 20) -> dict[str, torch.Tensor]:
    mask = torch.ones(3, length, dtype=torch.long)
    mask[1, length - 6 :] = 0  # right padding
    mask[2, :4] = 0  # left padding
    return {"input_ids": torch.randint(5, 97, (3, length)), "attention_mask": mask}


@pytest.mark.parametrize("head", TEXT_HEADS)
@pytest.mark.parametrize("transform", ["dct", "fft"])
def test_the_folded_copy_equals_the_plain_model_on_every_text_head(head, transform):
    torch.manual_seed(0)
    model = head(tiny_text_config(transform=transform, num_hidden_layers=3, classifier_pooling="mean")).eval()
    fast = optimize_for_inference(model)
    for inputs in (padded_batch(), padded_batch(24), {"input_ids": torch.randint(5, 97, (2, 9))}):
        with torch.no_grad():
            expected = main_output(model(**inputs))
        got = main_output(fast(**inputs))
        assert not got.requires_grad
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(conditioning="xcorr", conditioning_activation="tanh", conditioning_time_layers=2),
        dict(data_dependent=False, residual_long_conv=False, pre_norm=True),
        dict(filter_spectrum="convolution", short_conv_size=5, filter_decay=False),
    ],
)
def test_the_folded_copy_equals_the_plain_model_for_other_settings(overrides):
    torch.manual_seed(0)
    model = OrchidForMaskedLM(tiny_text_config(num_hidden_layers=2, **overrides)).eval()
    fast = optimize_for_inference(model)
    inputs = padded_batch()
    with torch.no_grad():
        torch.testing.assert_close(fast(**inputs).logits, model(**inputs).logits, atol=1e-6, rtol=1e-6)


def test_the_folded_copy_of_an_image_model_and_of_an_operator():
    torch.manual_seed(0)
    config = OrchidConfig.from_preset(
        "orchid-vit-cifar-s", image_size=8, patch_size=2, hidden_size=16, intermediate_size=32, num_hidden_layers=2
    )
    model = OrchidForImageClassification(config).eval()
    images = torch.randn(3, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(optimize_for_inference(model)(images).logits, model(images).logits)
    op = OrchidOperator(13, 32, conditioning="xcorr").eval()
    x, u = torch.randn(2, 29, 13), torch.randn(2, 17, 13)
    mask = torch.ones(2, 29)
    mask[1, :9] = 0
    with torch.no_grad():
        expected = op(x, mask, conditioning_input=u)
    torch.testing.assert_close(optimize_for_inference(op)(x, mask, conditioning_input=u), expected)


def test_the_copy_holds_no_filter_network_and_leaves_the_plain_model_alone():
    torch.manual_seed(0)
    model = OrchidForMaskedLM(tiny_text_config(num_hidden_layers=2))
    before = {name: p.clone() for name, p in model.named_parameters()}
    fast = optimize_for_inference(model)
    assert model.training and all(p.requires_grad for p in model.parameters())
    assert not any(isinstance(m, ImplicitFilter) for m in fast.modules())
    assert sum(isinstance(m, FoldedFilter) for m in fast.modules()) == 4  # static and residual filter per layer
    assert not any("filter" in name for name, _ in fast.named_parameters())
    assert not fast.training and not any(p.requires_grad for p in fast.parameters())
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name])


def test_edits_after_folding_act_on_the_copy_as_on_any_model():
    """Training the plain model (fused AdamW, which bumps no tensor version) leaves the copy as it was made; an edit of
    the copy's own weights (.data, as peft's merge does) changes its next output, as in any model: nothing is
    cached from a weight but the folded filters, which have no weights."""
    torch.manual_seed(0)
    model = OrchidForMaskedLM(tiny_text_config(num_hidden_layers=2, hidden_dropout_prob=0.0))
    fast = optimize_for_inference(model)
    inputs = padded_batch()
    made = fast(**inputs).logits
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    for _ in range(2):
        model(**inputs, labels=inputs["input_ids"]).loss.backward()
        optimizer.step()
    torch.testing.assert_close(fast(**inputs).logits, made, atol=0, rtol=0)
    fast.orchid.encoder.layer[0].mixer.out_proj.weight.data.mul_(2.0)
    assert not torch.allclose(fast(**inputs).logits, made)


def test_the_copy_of_a_peft_model_keeps_its_adapters_and_the_copy_cannot_be_saved(tmp_path):
    torch.manual_seed(0)
    model = OrchidForSequenceClassification(tiny_text_config(num_hidden_layers=2)).eval()
    adapters = peft.LoraConfig(r=2, target_modules=["in_proj", "out_proj"], init_lora_weights=False)
    lora = peft.get_peft_model(model, adapters)
    fast = optimize_for_inference(lora)
    inputs = padded_batch()
    with torch.no_grad():
        torch.testing.assert_close(fast(**inputs).logits, lora(**inputs).logits, atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="made by optimize_for_inference.*save the model it was made from"):
        optimize_for_inference(model).save_pretrained(tmp_path)
    assert not (tmp_path / "model.safetensors").exists()
    again = optimize_for_inference(copy.deepcopy(optimize_for_inference(model)))
    with torch.no_grad():
        torch.testing.assert_close(again(**inputs).logits, model(**inputs).logits, atol=1e-6, rtol=1e-6)


CASTS = {
    "float64": lambda model: model.to(torch.float64),
    "bfloat16": lambda model: model.to(torch.bfloat16),
    "float16 then float32": lambda model: model.to(torch.float16).to(torch.float32),
    "bfloat16 then float32": lambda model: model.to(torch.bfloat16).to(torch.float32),
}


def folded_and_plain(transform: str, image: bool):
    torch.manual_seed(0)
    if image:
        config = OrchidConfig.from_preset("orchid-vit-2d-s", image_size=8, patch_size=2, hidden_size=16,
                                          intermediate_size=32, num_hidden_layers=2, transform=transform)
        return OrchidForImageClassification(config).eval(), {"pixel_values": torch.randn(3, 3, 8, 8)}
    return OrchidForMaskedLM(tiny_text_config(transform=transform)).eval(), padded_batch()


@pytest.mark.parametrize("cast", sorted(CASTS))
@pytest.mark.parametrize("transform", ["dct", "fft"])
@pytest.mark.parametrize("image", [False, True], ids=["text", "image-2d"])
def test_a_folded_copy_cast_to_another_dtype_behaves_as_the_plain_model_cast_the_same_way(cast, transform, image):
    """A cast keeps the folded multipliers complex under the FFT (a real cast would keep their real part) and at the
    float32 precision the plain model computes them in, or float64: the folded copy's outputs then stray from the
    float32 model's no further than the plain model's cast the same way."""
    model, inputs = folded_and_plain(transform, image)
    with torch.no_grad():
        reference = model(**inputs).logits
        folded = CASTS[cast](optimize_for_inference(model))
        plain = CASTS[cast](copy.deepcopy(model))
        folded_error = (folded(**inputs).logits.double() - reference.double()).abs().max().item()
        plain_error = (plain(**inputs).logits.double() - reference.double()).abs().max().item()
    multipliers = [buffer for name, buffer in folded.named_buffers() if "multiplier" in name]
    assert multipliers and all(m.is_complex() == (transform == "fft") for m in multipliers)
    assert all(m.real.dtype == (torch.float64 if cast == "float64" else torch.float32) for m in multipliers)
    scale = reference.abs().max().item()
    if cast == "float64":
        assert folded_error < 1e-6 * scale, (folded_error, plain_error)
    else:
        assert folded_error <= 1.5 * plain_error, (folded_error, plain_error)


def test_a_folded_copy_refuses_a_new_context_and_stays_as_it_was():
    model = OrchidForMaskedLM(tiny_text_config(transform="fft")).eval()
    folded = optimize_for_inference(model)
    inputs = padded_batch()
    expected = folded(**inputs).logits
    with pytest.raises(ValueError, match="made by optimize_for_inference: .* resize the model it was made from"):
        folded.resize_position_embeddings(48)
    assert folded.config.max_position_embeddings == 24
    assert folded.get_position_embeddings().num_embeddings == 24
    torch.testing.assert_close(folded(**inputs).logits, expected, atol=0, rtol=0)
