"""The opt-in fast path, ``optimize_for_inference``: the same outputs as the plain model on every head, both transforms,
long and short inputs (channel groups, transform halves, in-place convolutions and projections, token chunks, lent
layer outputs), padding on either side; and a clear refusal of what it cannot do."""

import copy
import io
import pickle

import numpy as np
import peft
import pytest
import torch
from orchid_hf.modeling import orchid_ops
from torch import nn

from orchid_hf import (
    OrchidConfig,
    OrchidForImageClassification,
    OrchidForMaskedLM,
    OrchidForSequenceClassification,
    OrchidForTokenClassification,
    OrchidModel,
    OrchidOperator,
    inference,
    optimize_for_inference,
)

from .test_models import tiny_text_config

TEXT_HEADS = [OrchidModel, OrchidForMaskedLM, OrchidForSequenceClassification, OrchidForTokenClassification]


@pytest.fixture(params=["short inputs", pytest.param("long inputs", marks=pytest.mark.slow)])
def input_size(request, monkeypatch):
    """Tiny sizes take the paths of long inputs with these settings: channel groups of 3 (the last one narrower),
    transforms on halves of a group after an in-place short convolution in chunks of one position, out_proj and the
    embeddings' LayerNorm a token at a time, and everything after the mixer on chunks of 7 tokens."""
    if request.param == "long inputs":
        # The channel groups are the plain operator's, so the plain model takes them as well.
        monkeypatch.setattr(orchid_ops, "CHANNEL_GROUP_ELEMENTS", 1)
        monkeypatch.setattr(orchid_ops, "MIN_CHANNEL_GROUP", 3)
        for name, value in [("LONG_INPUT_TOKENS", 1), ("SHORT_CONV_CHUNK_ELEMENTS", 1), ("TOKEN_CHUNK_ELEMENTS", 1),
                            ("MLP_CHUNK_ELEMENTS", 1), ("MLP_MIN_CHUNK_TOKENS", 7)]:
            monkeypatch.setattr(inference, name, value)
    return request.param


def main_output(output) -> torch.Tensor:
    return output.logits if hasattr(output, "logits") else output.last_hidden_state


def padded_batch(length: int = 20) -> dict[str, torch.Tensor]:
    mask = torch.ones(3, length, dtype=torch.long)
    mask[1, length - 6 :] = 0  # right padding
    mask[2, :4] = 0  # left padding
    return {"input_ids": torch.randint(5, 97, (3, length)), "attention_mask": mask}


@pytest.mark.parametrize("head", TEXT_HEADS)
@pytest.mark.parametrize("transform", ["dct", "fft"])
def test_fast_path_equals_the_plain_model_on_every_text_head(head, transform, input_size):
    torch.manual_seed(0)
    model = head(tiny_text_config(transform=transform, num_hidden_layers=4, classifier_pooling="mean")).eval()
    fast = optimize_for_inference(model)
    for inputs in (padded_batch(), padded_batch(24), {"input_ids": torch.randint(5, 97, (2, 9))}):
        with torch.no_grad():
            expected = main_output(model(**inputs))
        got = main_output(fast(**inputs))
        assert not got.requires_grad
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    # The caller's input and the plain model stay as they were.
    embeds = model.get_input_embeddings()(padded_batch()["input_ids"]).detach()
    given = embeds.clone()
    with torch.no_grad():
        expected = main_output(model(inputs_embeds=embeds))
    torch.testing.assert_close(main_output(fast(inputs_embeds=given)), expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(given, embeds)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(hidden_act="gelu_pytorch_tanh", mlp_num_blocks=2),
        dict(hidden_act="relu", mlp_type="mlp", mlp_num_blocks=4),
        dict(hidden_act="gelu_new", mlp_num_blocks=1),  # no fused form: the activation after the GEMM
        dict(conditioning="xcorr", conditioning_activation="tanh", conditioning_time_layers=2),
        dict(data_dependent=False, residual_long_conv=False, pre_norm=True),
        dict(conditioning_time_layers=0, conditioning_freq_layers=2),
        dict(filter_spectrum="convolution", short_conv_size=5),
    ],
)
def test_fast_path_equals_the_plain_model_for_other_settings(overrides, input_size):
    torch.manual_seed(0)
    model = OrchidForMaskedLM(tiny_text_config(num_hidden_layers=3, **overrides)).eval()
    fast = optimize_for_inference(model)
    inputs = padded_batch()
    with torch.no_grad():
        expected = model(**inputs).logits
    torch.testing.assert_close(fast(**inputs).logits, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_fast_path_equals_the_plain_model_on_images_at_the_imagenet_geometry():
    # orchid-vit-imagenet's sequence (14 x 14 = 196 patches, short convolutions of 5, a block-diagonal MLP) at the
    # default settings, wide enough for channel groups of 32: from batch 42 on, each group's short convolution runs in
    # place in chunks of positions, and at 42 a chunk of 65 positions ends one short of the sequence's border (an
    # earlier fast path failed there, and at batches 69, 70, 171-182 and 196-210).
    config = OrchidConfig.from_preset(
        "orchid-vit-imagenet", image_size=28, patch_size=2, num_channels=1, hidden_size=128, intermediate_size=256,
        num_hidden_layers=1, filter_width=8, num_labels=3,
    )
    torch.manual_seed(0)
    model = OrchidForImageClassification(config).eval()
    fast = optimize_for_inference(model)
    assert len(fast.orchid.encoder.layer[0].mixer.channel_groups(batch=42)) == 4
    images = torch.randn(211, 1, 28, 28)
    with torch.no_grad():
        expected = model(pixel_values=images).logits
    for batch in (1, 2, 41, 42, 69, 70, 171, 182, 196, 210, 211):
        torch.testing.assert_close(fast(pixel_values=images[:batch]).logits, expected[:batch], atol=1e-5, rtol=1e-5)


def test_fast_operator_equals_the_plain_operator_with_cross_conditioning_and_lent_output(input_size):
    torch.manual_seed(0)
    op = OrchidOperator(13, 32, conditioning="xcorr").eval()
    fast = optimize_for_inference(op)
    x = torch.randn(2, 29, 13)
    mask = torch.ones(2, 29)
    mask[1, 20:] = 0
    u = torch.randn(2, 17, 13)
    u_mask = torch.ones(2, 17)
    u_mask[0, :3] = 0
    with torch.no_grad():
        expected = op(x, mask, conditioning_input=u, conditioning_mask=u_mask)
        plain = op(x, mask)
    torch.testing.assert_close(fast(x, mask, conditioning_input=u, conditioning_mask=u_mask), expected, atol=1e-5,
                               rtol=1e-5)
    lent = torch.full_like(x, float("nan"))
    result = fast(x, mask, out=lent)
    torch.testing.assert_close(result, plain, atol=1e-5, rtol=1e-5)
    if fast.writes_into_out(batch=2):
        assert result.data_ptr() == lent.data_ptr()
    shared = x.clone()
    torch.testing.assert_close(fast(shared, mask, out=shared), plain, atol=1e-5, rtol=1e-5)  # never x's memory


def test_hidden_states_of_the_fast_path_are_all_kept():
    # Layers lend the memory of earlier outputs to later ones, but never of an output the caller gets back.
    torch.manual_seed(0)
    model = OrchidModel(tiny_text_config(num_hidden_layers=4)).eval()
    fast = optimize_for_inference(model)
    inputs = padded_batch()
    with torch.no_grad():
        expected = model(**inputs, output_hidden_states=True).hidden_states
    for got, want in zip(fast(**inputs, output_hidden_states=True).hidden_states, expected):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("padding", ["zeros", "circular"])
@pytest.mark.parametrize("kernel_size", [1, 3, 5])
@pytest.mark.parametrize("chunk_elements", [1, 60, 2**18])
def test_short_convolution_in_place_equals_the_direct_convolution(padding, kernel_size, chunk_elements, monkeypatch):
    # Chunks of 1 position (the smallest the border allows), of a few positions, and the whole sequence at once;
    # lengths that leave a last chunk shorter than the border.
    monkeypatch.setattr(inference, "SHORT_CONV_CHUNK_ELEMENTS", chunk_elements)
    torch.manual_seed(0)
    weight, bias = torch.randn(3, 1, kernel_size), torch.randn(3)
    for length in (1, 2, 5, 23, 65, 196):
        for wrap in (True, False):
            x = torch.randn(2, length, 3)
            wraps = padding == "circular" and wrap
            expected = inference.short_convolution(x, weight, bias, wraps)
            circular = wraps and kernel_size // 2 <= length
            reference = direct_depthwise(x, weight, bias, circular)
            np.testing.assert_allclose(expected.numpy(), reference, atol=1e-5, rtol=0)
            written = x.clone()
            assert inference.short_convolution_in_place(written, weight, bias, wraps) is written
            torch.testing.assert_close(written, expected, atol=1e-6, rtol=0)


def direct_depthwise(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, circular: bool) -> np.ndarray:
    k = weight.shape[-1]
    xs, w, b = x.double().numpy(), weight[:, 0].double().numpy(), bias.double().numpy()
    length = xs.shape[1]
    out = np.zeros_like(xs)
    for t in range(length):
        for j in range(k):
            s = t + j - k // 2
            if circular:
                s %= length
            elif not 0 <= s < length:
                continue
            out[:, t] += w[:, j] * xs[:, s]
    return out + b


@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_pytorch_tanh", "relu", "silu"])
def test_fused_linear_layers_equal_f_linear_with_their_activation(hidden_act, monkeypatch):
    torch.manual_seed(0)
    x, weight, bias = torch.randn(5, 7, 16), torch.randn(12, 16), torch.randn(12)
    columns = torch.randn(5, 7, 40)[..., 8:24]  # a strided slice of features, as a block of a block-diagonal layer
    activation = {"gelu": nn.GELU(), "gelu_pytorch_tanh": nn.GELU("tanh"), "relu": nn.ReLU(), "silu": nn.SiLU()}
    with torch.no_grad():
        for ops in (inference.onednn_ops(), None):  # oneDNN, and MKL where a torch build lacks the op
            monkeypatch.setattr(inference, "onednn_ops", lambda ops=ops: ops)
            plain = nn.functional.linear(x, weight, bias)
            torch.testing.assert_close(inference.FrozenLinear(weight, bias)(x), plain, atol=1e-5, rtol=1e-5)
            fused = inference.FrozenLinear(weight, bias, hidden_act)(x)
            torch.testing.assert_close(fused, activation[hidden_act](plain), atol=1e-5, rtol=1e-5)
            strided = inference.FrozenLinear(weight, None)(columns)
            torch.testing.assert_close(strided, nn.functional.linear(columns, weight), atol=1e-5, rtol=1e-5)


def test_fast_model_copies_and_pickles():
    # Packed oneDNN weights can be neither copied nor pickled: the copy keeps the plain weights and packs them again.
    torch.manual_seed(0)
    fast = optimize_for_inference(OrchidForMaskedLM(tiny_text_config()).eval())
    inputs = padded_batch()
    expected = fast(**inputs).logits
    buffer = io.BytesIO()
    torch.save(fast, buffer)
    buffer.seek(0)
    for other in (copy.deepcopy(fast), torch.load(buffer, weights_only=False), pickle.loads(pickle.dumps(fast))):
        torch.testing.assert_close(other(**inputs).logits, expected, atol=0, rtol=0)


def test_fast_model_saves_the_plain_weights(tmp_path):
    torch.manual_seed(0)
    model = OrchidForSequenceClassification(tiny_text_config()).eval()
    fast = optimize_for_inference(model)
    fast.save_pretrained(tmp_path)
    loaded = OrchidForSequenceClassification.from_pretrained(tmp_path).eval()
    inputs = padded_batch()
    with torch.no_grad():
        torch.testing.assert_close(loaded(**inputs).logits, model(**inputs).logits, atol=0, rtol=0)


# ---------------------------------------------------------------------------------------------
# What the fast path refuses
# ---------------------------------------------------------------------------------------------


def test_fast_model_refuses_training_and_gradients():
    torch.manual_seed(0)
    model = OrchidForMaskedLM(tiny_text_config())
    fast = optimize_for_inference(model)
    assert model.training, "the plain model is left as it was"
    with pytest.raises(RuntimeError, match="optimize_for_inference for inference only and cannot train"):
        fast.train()
    fast.eval()
    embeds = fast.get_input_embeddings()(torch.randint(5, 97, (1, 6))).requires_grad_()
    with pytest.raises(ValueError, match="inputs_embeds requires grad"):
        fast(inputs_embeds=embeds)
    output = fast(torch.randint(5, 97, (1, 6)), labels=torch.randint(5, 97, (1, 6)))
    assert not output.loss.requires_grad
    assert not any(p.requires_grad for p in fast.parameters())


@pytest.mark.parametrize("change", ["lora", "quantized", "hook", "float64", "not orchid"])
def test_optimize_refuses_what_it_would_compute_differently(change):
    torch.manual_seed(0)
    model = OrchidForSequenceClassification(tiny_text_config(mlp_num_blocks=2))
    message = {"lora": "needs plain nn.Linear projections.*merge_and_unload",
               "quantized": "needs plain nn.Linear projections",
               "hook": "module 'orchid.encoder.layer.1.mlp' has forward hooks",
               "float64": r"needs a float32 model on the CPU, got parameters on \['cpu'\] in \['torch.float64'\]",
               "not orchid": "takes an Orchid model or OrchidOperator, got Linear"}[change]
    if change == "lora":
        model = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["in_proj"])).base_model.model
    elif change == "quantized":
        model = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    elif change == "hook":
        model.orchid.encoder.layer[1].mlp.register_forward_hook(lambda *args: None)
    elif change == "float64":
        model = model.double()
    else:
        model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match=message):
        optimize_for_inference(model)
