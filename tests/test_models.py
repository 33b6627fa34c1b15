"""The Orchid model family in transformers: config, presets, heads, Auto classes, padding, checkpoints."""

import copy
import functools
import gc
import io
import types

import pytest
import torch
import torch.nn.functional as F
from orchid_hf.modeling import modeling_orchid, orchid_layers
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForImageClassification,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from orchid_hf import (
    OrchidConfig,
    OrchidForImageClassification,
    OrchidForMaskedLM,
    OrchidForSequenceClassification,
    OrchidForTokenClassification,
    OrchidModel,
)

TEXT_HEADS = [OrchidModel, OrchidForMaskedLM, OrchidForSequenceClassification, OrchidForTokenClassification]


def tiny_text_config(**overrides) -> OrchidConfig:
    fields = dict(
        vocab_size=97,
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        max_position_embeddings=24,
        hidden_dropout_prob=0.0,
        num_labels=3,
    )
    return OrchidConfig(**(fields | overrides))


def tiny_image_config(**overrides) -> OrchidConfig:
    fields = dict(
        image_size=16,
        patch_size=4,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=48,
        mlp_type="mlp",
        mlp_num_blocks=1,
        pre_norm=True,
        hidden_dropout_prob=0.0,
        num_labels=5,
    )
    return OrchidConfig(**(fields | overrides))


def main_output(output):
    return output.logits if hasattr(output, "logits") else output.last_hidden_state


# ---------------------------------------------------------------------------------------------
# Config and presets
# ---------------------------------------------------------------------------------------------

PAPER_PARAMETERS = {
    "orchid-bert-base": (77e6, 0.05),
    "orchid-bert-large": (254e6, 0.05),
    "orchid-vit-cifar-s": (735e3, 0.10),
    "orchid-vit-cifar-m": (2.0e6, 0.10),
    "orchid-vit-imagenet": (48e6, 0.10),
}


def test_preset_parameter_counts_match_the_paper(capsys):
    assert set(OrchidConfig.preset_names()) == set(PAPER_PARAMETERS)
    rows = []
    with torch.device("meta"):  # counts need shapes only
        for name, (paper, tolerance) in PAPER_PARAMETERS.items():
            config = OrchidConfig.from_preset(name)
            model = OrchidForImageClassification(config) if config.is_vision else OrchidForMaskedLM(config)
            count = sum(p.numel() for p in model.parameters())
            rows.append((name, count, paper))
            assert abs(count - paper) / paper <= tolerance, f"{name}: {count:,} vs paper {paper:,.0f}"
    with capsys.disabled():
        print("\n| preset | parameters | paper | difference |\n|---|---|---|---|")
        for name, count, paper in rows:
            print(f"| {name} | {count / 1e6:.3f}M | {paper / 1e6:.3f}M | {100 * (count - paper) / paper:+.1f}% |")


def test_bert_presets_tie_the_decoder_to_the_word_embeddings():
    model = OrchidForMaskedLM(tiny_text_config())
    assert model.lm_head.decoder.weight is model.orchid.embeddings.word_embeddings.weight
    assert model.config.tie_word_embeddings is True


def test_from_preset_overrides_and_rejects_unknown_names():
    config = OrchidConfig.from_preset("orchid-bert-base", num_hidden_layers=2, transform="fft")
    assert (config.hidden_size, config.num_hidden_layers, config.transform) == (768, 2, "fft")
    with pytest.raises(ValueError, match="unknown preset 'orchid-gpt'; available presets: orchid-bert-base"):
        OrchidConfig.from_preset("orchid-gpt")


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(hidden_size=0), r"hidden_size must be a positive integer, got 0"),
        (dict(transform="dft"), r"transform must be one of \('dct', 'fft'\), got 'dft'"),
        (dict(conditioning="softmax"), r"conditioning must be one of"),
        (dict(conditioning_activation="relu"), r"conditioning_activation must be one of"),
        (dict(mlp_type="moe"), r"mlp_type must be one of \('mlp', 'glu'\)"),
        (dict(short_conv_size=4), r"short_conv_size must be a positive odd integer \(centred\), got 4"),
        (dict(hidden_size=30, mlp_num_blocks=4), r"hidden_size=30 must be divisible by mlp_num_blocks=4"),
        (dict(hidden_dropout_prob=1.5), r"hidden_dropout_prob must be in \[0, 1\), got 1.5"),
        (dict(classifier_pooling="max"), r"classifier_pooling must be one of \('first', 'mean'\)"),
        (dict(filter_spectrum="dft"), r"filter_spectrum must be one of \('listing1', 'convolution'\), got 'dft'"),
        (dict(pad_token_id=200), r"pad_token_id=200 is outside vocab_size=97"),
        (dict(conditioning_time_layers=0, conditioning_freq_layers=0), r"both 0"),
        (dict(patch_size=4), r"patch_size=4 is set but image_size is not"),
    ],
)
def test_config_rejects_invalid_values(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_text_config(**overrides)


def test_image_config_rejects_a_patch_size_that_does_not_divide_the_image():
    with pytest.raises(ValueError, match=r"patch_size=5 must divide image_size=16"):
        tiny_image_config(patch_size=5)


def test_config_round_trips_through_json(tmp_path):
    config = tiny_text_config(conditioning="xcorr", conditioning_activation="softshrink", transform="fft")
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, OrchidConfig)
    # Everything but where it was loaded from survives the round trip.
    assert {**loaded.to_dict(), "_name_or_path": ""} == config.to_dict()


def test_initialisation_keeps_the_operator_signal_alive():
    # transformers skips _init_weights for parameterless wrappers; the short convolutions must still get
    # PyTorch's fan-in initialisation (std 1/3 for kernel 3), not BERT's 0.02.
    model = AutoModelForSequenceClassification.from_config(tiny_text_config())
    layer = model.orchid.encoder.layer[0]
    assert layer.mixer.short_conv.conv.weight.std().item() == pytest.approx(1 / 3, rel=0.25)
    hidden = torch.randn(2, 24, 32)
    with torch.no_grad():
        mixed = layer.mixer(hidden)
    assert mixed.square().mean().sqrt() > 1e-2 * hidden.square().mean().sqrt()

    image_model = OrchidForImageClassification(tiny_image_config(num_channels=1, patch_size=2))
    weight = image_model.orchid.embeddings.projection.weight
    assert weight.std().item() == pytest.approx((2.0 / (4 + 32)) ** 0.5, rel=0.25)  # Xavier over the flattened patch


# ---------------------------------------------------------------------------------------------
# Heads and Auto classes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "auto_class,expected",
    [
        (AutoModel, OrchidModel),
        (AutoModelForMaskedLM, OrchidForMaskedLM),
        (AutoModelForSequenceClassification, OrchidForSequenceClassification),
        (AutoModelForTokenClassification, OrchidForTokenClassification),
    ],
)
def test_auto_classes_build_the_right_text_heads(auto_class, expected):
    assert type(auto_class.from_config(tiny_text_config())) is expected


def test_auto_classes_build_image_models():
    config = tiny_image_config()
    assert type(AutoModelForImageClassification.from_config(config)) is OrchidForImageClassification
    base = AutoModel.from_config(config)  # the vision encoder: patch embeddings, no word embeddings
    assert type(base) is OrchidModel
    output = base(pixel_values=torch.randn(2, 3, 16, 16))
    assert output.last_hidden_state.shape == (2, 16, 32)


def test_masked_lm_loss_ignores_minus_100():
    model = OrchidForMaskedLM(tiny_text_config())
    ids = torch.randint(5, 97, (2, 10))
    labels = torch.full_like(ids, -100)
    labels[:, 3] = ids[:, 3]
    output = model(ids, labels=labels)
    expected = torch.nn.functional.cross_entropy(output.logits[:, 3], ids[:, 3])
    torch.testing.assert_close(output.loss, expected)
    assert output.logits.shape == (2, 10, 97)


@pytest.mark.parametrize(
    "num_labels,labels,problem_type",
    [
        (1, torch.tensor([0.5, -1.0]), "regression"),
        (3, torch.tensor([0, 2]), "single_label_classification"),
        (3, torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]), "multi_label_classification"),
    ],
)
def test_sequence_classification_problem_types(num_labels, labels, problem_type):
    model = OrchidForSequenceClassification(tiny_text_config(num_labels=num_labels))
    output = model(torch.randint(5, 97, (2, 8)), labels=labels)
    assert model.config.problem_type == problem_type
    assert output.logits.shape == (2, num_labels)
    assert output.loss.ndim == 0 and torch.isfinite(output.loss)
    output.loss.backward()


def test_token_and_image_classification_heads():
    token_model = OrchidForTokenClassification(tiny_text_config(num_labels=4))
    labels = torch.randint(0, 4, (2, 9))
    labels[:, -2:] = -100
    output = token_model(torch.randint(5, 97, (2, 9)), labels=labels)
    assert output.logits.shape == (2, 9, 4) and torch.isfinite(output.loss)

    image_model = OrchidForImageClassification(tiny_image_config())
    assert image_model.main_input_name == "pixel_values"
    output = image_model(torch.randn(3, 3, 16, 16), labels=torch.tensor([0, 4, 2]))
    assert type(output).__name__ == "ImageClassifierOutput"
    assert output.logits.shape == (3, 5) and torch.isfinite(output.loss)


def test_heads_reject_the_wrong_modality():
    with pytest.raises(ValueError, match="needs an image config"):
        OrchidForImageClassification(tiny_text_config())
    with pytest.raises(ValueError, match="needs a text config"):
        OrchidForMaskedLM(tiny_image_config())


# ---------------------------------------------------------------------------------------------
# Padding invariance for every text head
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("head", TEXT_HEADS)
@pytest.mark.parametrize("transform", ["dct", "fft"])
def test_outputs_at_real_positions_do_not_depend_on_padding(head, transform):
    config = tiny_text_config(transform=transform, classifier_pooling="mean")
    model = head(config).eval()
    sentence = torch.randint(5, 97, (1, 7))
    alone = main_output(model(sentence))

    padded = torch.cat([sentence, torch.zeros(1, 24 - 7, dtype=torch.long)], dim=1)  # padded to max_length
    mask = (padded != 0).long()
    mask[:, :7] = 1
    other = torch.randint(5, 97, (1, 13))  # batched with a longer sentence: padded to the longest, 13
    batch = torch.cat([padded[:, :13], other], dim=0)
    batch_mask = torch.cat([mask[:, :13], torch.ones(1, 13, dtype=torch.long)], dim=0)

    with torch.no_grad():
        to_max_length = main_output(model(padded, attention_mask=mask))
        in_batch = main_output(model(batch, attention_mask=batch_mask))
    if alone.dim() == 3:  # per-token outputs: compare the real positions
        to_max_length, in_batch_first = to_max_length[:, :7], in_batch[:1, :7]
    else:
        in_batch_first = in_batch[:1]
    torch.testing.assert_close(to_max_length, alone, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(in_batch_first, alone, atol=1e-4, rtol=1e-4)


def test_first_token_pooling_is_padding_invariant_too():
    model = OrchidForSequenceClassification(tiny_text_config(classifier_pooling="first")).eval()
    sentence = torch.randint(5, 97, (1, 6))
    padded = torch.cat([sentence, torch.zeros(1, 10, dtype=torch.long)], dim=1)
    mask = torch.zeros_like(padded)
    mask[:, :6] = 1
    torch.testing.assert_close(model(padded, attention_mask=mask).logits, model(sentence).logits, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------------------------
# transformers conventions
# ---------------------------------------------------------------------------------------------


def test_hidden_states_tuple_outputs_and_inputs_embeds():
    model = OrchidForMaskedLM(tiny_text_config()).eval()
    ids = torch.randint(5, 97, (2, 8))
    output = model(ids, output_hidden_states=True)
    assert len(output.hidden_states) == model.config.num_hidden_layers + 1
    as_tuple = model(ids, return_dict=False)
    assert isinstance(as_tuple, tuple)
    torch.testing.assert_close(as_tuple[0], output.logits)
    embeds = model.get_input_embeddings()(ids)
    torch.testing.assert_close(model(inputs_embeds=embeds).logits, output.logits)


def test_gradient_checkpointing_recomputes_and_keeps_gradients_and_names():
    torch.manual_seed(0)
    model = OrchidForSequenceClassification(tiny_text_config()).train()
    names = [name for name, _ in model.named_parameters()]
    ids, labels = torch.randint(5, 97, (2, 10)), torch.tensor([0, 2])

    def gradients_and_mixer_calls():
        calls = []
        layers = model.orchid.encoder.layer
        handles = [layer.mixer.register_forward_hook(lambda *_: calls.append(1)) for layer in layers]
        model.zero_grad()
        model(ids, labels=labels).loss.backward()
        for handle in handles:
            handle.remove()
        return [p.grad.clone() for p in model.parameters()], len(calls)

    reference, plain_calls = gradients_and_mixer_calls()
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    assert model.is_activation_checkpointing
    checkpointed, checkpointed_calls = gradients_and_mixer_calls()
    assert plain_calls == 2 and checkpointed_calls == 4, "each layer's mixer runs again in the backward pass"
    for a, b in zip(reference, checkpointed):
        torch.testing.assert_close(a, b)
    assert [name for name, _ in model.named_parameters()] == names


def test_resize_token_embeddings_keeps_the_decoder_tied():
    model = OrchidForMaskedLM(tiny_text_config())
    model.resize_token_embeddings(120)
    assert model.config.vocab_size == 120
    assert model.lm_head.decoder.weight is model.orchid.embeddings.word_embeddings.weight
    assert model.lm_head.decoder.bias.shape == (120,)
    assert model(torch.randint(100, 120, (1, 5))).logits.shape == (1, 5, 120)


def test_masked_lm_checkpoint_loads_into_a_classifier_initialising_only_the_head(tmp_path):
    mlm = OrchidForMaskedLM(tiny_text_config())
    mlm.save_pretrained(tmp_path)
    classifier, info = AutoModelForSequenceClassification.from_pretrained(
        tmp_path, num_labels=2, output_loading_info=True
    )
    assert info["missing_keys"] == {"pooler.dense.weight", "pooler.dense.bias", "classifier.weight", "classifier.bias"}
    for name, tensor in mlm.orchid.state_dict().items():
        torch.testing.assert_close(classifier.orchid.state_dict()[name], tensor)


def test_lora_on_the_operator_projections():
    import peft
    model = OrchidForSequenceClassification(tiny_text_config())
    lora = peft.get_peft_model(
        model, peft.LoraConfig(r=4, target_modules=["in_proj", "out_proj"], modules_to_save=["classifier"])
    )
    trainable = [name for name, p in lora.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name or "classifier" in name for name in trainable)
    output = lora(input_ids=torch.randint(5, 97, (2, 6)), labels=torch.tensor([1, 0]))
    output.loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for n, p in lora.named_parameters() if "lora_B" in n)


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------


def test_bad_text_input_raises_value_errors_naming_the_numbers():
    model = OrchidForMaskedLM(tiny_text_config())
    with pytest.raises(ValueError, match=r"length 25 > max_position_embeddings=24"):
        model(torch.randint(5, 97, (1, 25)))
    with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 5\), the input has shape \(2, 6\)"):
        model(torch.randint(5, 97, (2, 6)), attention_mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match="pass exactly one of input_ids and inputs_embeds"):
        model()
    with pytest.raises(ValueError, match=r"empty sequence \(length 0\)"):
        model(torch.zeros(1, 0, dtype=torch.long))


def test_bad_image_input_raises_value_errors_naming_the_numbers():
    model = OrchidForImageClassification(tiny_image_config())
    with pytest.raises(ValueError, match=r"\(batch, 3, 16, 16\).*got \(1, 3, 32, 32\)"):
        model(torch.randn(1, 3, 32, 32))
    with pytest.raises(ValueError, match=r"got \(1, 1, 16, 16\)"):
        model(torch.randn(1, 1, 16, 16))
    with pytest.raises(ValueError, match="pass pixel_values"):
        model()


def long_input_settings(monkeypatch) -> None:
    """Token chunks of 7 and channel groups of 3 at tiny sizes: the paths that long inputs take without autograd."""
    monkeypatch.setattr(modeling_orchid, "MLP_CHUNK_ELEMENTS", 1)
    monkeypatch.setattr(modeling_orchid, "MLP_MIN_CHUNK_TOKENS", 7)
    monkeypatch.setattr(orchid_layers, "CHANNEL_GROUP_ELEMENTS", 1)
    monkeypatch.setattr(orchid_layers, "MIN_CHANNEL_GROUP", 3)
    monkeypatch.setattr(orchid_layers, "LONG_INPUT_TOKENS", 1)


@pytest.mark.parametrize(
    ("hidden_act", "mlp_type", "mlp_num_blocks"),
    [
        ("gelu", "glu", 1),
        ("gelu", "glu", 2),
        ("gelu", "glu", 4),
        ("gelu_pytorch_tanh", "glu", 4),
        ("relu", "glu", 4),
        ("silu", "glu", 1),
        ("gelu", "mlp", 4),
        ("relu", "mlp", 1),
        ("gelu_new", "glu", 4),  # no fused or in-place form: the plain path
    ],
)
@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("onednn", [True, False])
def test_inference_forward_equals_the_autograd_forward(
    hidden_act, mlp_type, mlp_num_blocks, chunked, onednn, monkeypatch
):
    # Without gradients the linear layers run through oneDNN with the bias and activation fused in (or,
    # with ONEDNN_LINEAR off, the GLU updates its up-projection in place and the block-diagonal layers write straight
    # into their outputs), the MLP runs on chunks of tokens and the operator in groups of channels with out_proj
    # written over its input; the result must not differ from the path autograd records. Chunks of 7 tokens (the
    # last one shorter) and channel groups of 3 stand in for long inputs, whose groups' transforms run in parts
    # after an in-place short convolution.
    monkeypatch.setattr(orchid_layers, "ONEDNN_LINEAR", onednn)
    if chunked:
        long_input_settings(monkeypatch)
        monkeypatch.setattr(orchid_layers, "SHORT_CONV_CHUNK_ELEMENTS", 1)
        monkeypatch.setattr(orchid_layers, "PROJECTION_CHUNK_ELEMENTS", 1)
    torch.manual_seed(0)
    config = tiny_text_config(hidden_act=hidden_act, mlp_type=mlp_type, mlp_num_blocks=mlp_num_blocks)
    model = OrchidModel(config).eval()
    input_ids = torch.randint(0, config.vocab_size, (3, 20))
    with torch.no_grad():
        inference = model(input_ids).last_hidden_state
    recorded = model(input_ids).last_hidden_state
    assert recorded.requires_grad
    torch.testing.assert_close(inference, recorded.detach(), atol=1e-6, rtol=0)


@pytest.mark.parametrize("explicit_ids", [False, True])
def test_embeddings_are_summed_in_place_and_equal_the_sum_of_their_lookups(explicit_ids, monkeypatch):
    # The position and token-type embeddings are added into the word embeddings' tensor (the default ones as rows
    # of their tables); without autograd the LayerNorm runs on chunks of tokens (here 3 tokens of 32 features, the
    # last chunk shorter). Both must give LayerNorm(word + position + token type), as separate lookups give it.
    monkeypatch.setattr(modeling_orchid, "EMBEDDING_CHUNK_ELEMENTS", 96)
    torch.manual_seed(0)
    embeddings = modeling_orchid.OrchidEmbeddings(tiny_text_config(type_vocab_size=2)).eval()
    input_ids = torch.randint(0, 97, (2, 20))
    positions, types = torch.arange(20).expand(2, -1), torch.zeros(2, 20, dtype=torch.long)
    ids = {}
    if explicit_ids:
        positions, types = torch.randint(0, 24, (2, 20)), torch.randint(0, 2, (2, 20))
        ids = dict(token_type_ids=types, position_ids=positions)
    with torch.no_grad():
        expected = embeddings.LayerNorm(
            embeddings.word_embeddings(input_ids)
            + embeddings.position_embeddings(positions)
            + embeddings.token_type_embeddings(types)
        )
    recorded = embeddings(input_ids, **ids)
    assert recorded.requires_grad
    chunks = []
    layer_norm = embeddings.LayerNorm.forward
    monkeypatch.setattr(embeddings.LayerNorm, "forward", lambda x: chunks.append(x.shape[0]) or layer_norm(x))
    with torch.no_grad():
        inference = embeddings(input_ids, **ids)
        assert chunks == [3] * 13 + [1]
        given = recorded.detach().clone()
        from_given = embeddings(inputs_embeds=given, **ids)
    torch.testing.assert_close(given, recorded.detach(), atol=0, rtol=0)  # the caller's tensor stays as it was
    torch.testing.assert_close(recorded.detach(), expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(inference, expected, atol=1e-6, rtol=0)
    with torch.no_grad():
        summed = given + embeddings.position_embeddings(positions) + embeddings.token_type_embeddings(types)
        torch.testing.assert_close(from_given, embeddings.LayerNorm(summed), atol=1e-6, rtol=0)


@pytest.mark.parametrize("pre_norm", [False, True])
def test_layers_run_in_token_chunks_for_inference_and_match_autograd(pre_norm, monkeypatch):
    # In eval mode without autograd, everything after the mixer runs on chunks of tokens over the mixer's output.
    monkeypatch.setattr(modeling_orchid, "MLP_CHUNK_ELEMENTS", 1)
    monkeypatch.setattr(modeling_orchid, "MLP_MIN_CHUNK_TOKENS", 7)
    calls = []
    forward = modeling_orchid.OrchidMLP.forward
    monkeypatch.setattr(modeling_orchid.OrchidMLP, "forward", lambda self, x: calls.append(x.shape) or forward(self, x))
    torch.manual_seed(0)
    config = tiny_text_config(pre_norm=pre_norm)
    model = OrchidModel(config).eval()
    input_ids = torch.randint(0, config.vocab_size, (3, 20))
    recorded = model(input_ids).last_hidden_state
    assert calls == [(3, 20, 32)] * 2
    calls.clear()
    with torch.no_grad():
        inference = model(input_ids).last_hidden_state
    assert model.encoder.layer[0].mlp.token_chunks(60) == [slice(i, i + 8) for i in range(0, 56, 8)] + [slice(56, 60)]
    assert calls == ([(8, 32)] * 7 + [(4, 32)]) * 2  # seven chunks of 8 tokens and one of 4, in each layer
    torch.testing.assert_close(inference, recorded.detach(), atol=1e-6, rtol=0)


def test_encoder_layers_write_into_the_output_of_the_layer_before_last(monkeypatch):
    long_input_settings(monkeypatch)
    outputs, lent = [], []
    forward = modeling_orchid.OrchidLayer.forward

    def recording(self, hidden_states, attention_mask=None, out=None):
        lent.append(None if out is None else out.data_ptr())
        result = forward(self, hidden_states, attention_mask, out)
        outputs.append(result.data_ptr())
        return result

    monkeypatch.setattr(modeling_orchid.OrchidLayer, "forward", recording)
    torch.manual_seed(0)
    model = OrchidModel(tiny_text_config(num_hidden_layers=4)).eval()
    input_ids = torch.randint(0, 97, (2, 20))
    recorded = model(input_ids, output_hidden_states=True)
    assert lent == [None] * 4  # autograd keeps every layer's output
    with torch.no_grad():
        embedded = model.embeddings(input_ids)
        given = embedded.clone()
        lent.clear(), outputs.clear()
        reused = model.encoder(given).last_hidden_state
        assert torch.equal(given, embedded)  # the encoder's input is the caller's: never written
        assert lent == [None, None, outputs[0], outputs[1]] and outputs[2:] == outputs[:2]
        lent.clear()
        every = model(input_ids, output_hidden_states=True).hidden_states
        assert lent == [None] * 4  # the hidden states returned must all stay as they are
        monkeypatch.setattr(modeling_orchid, "MLP_CHUNK_ELEMENTS", 2**23)  # one token chunk: the plain layer path,
        lent.clear()  # which never writes into lent memory, so none is held for it
        model(input_ids)
        assert lent == [None] * 4
    torch.testing.assert_close(reused, recorded.last_hidden_state.detach(), atol=1e-6, rtol=0)
    for kept, expected in zip(every, recorded.hidden_states):
        torch.testing.assert_close(kept, expected.detach(), atol=1e-6, rtol=0)


def test_a_hook_in_the_layers_keeps_each_layer_output_in_memory_of_its_own(monkeypatch):
    long_input_settings(monkeypatch)
    torch.manual_seed(0)
    model = OrchidModel(tiny_text_config(num_hidden_layers=4)).eval()
    input_ids = torch.randint(0, 97, (2, 20))
    recorded = model(input_ids, output_hidden_states=True).hidden_states
    seen = []
    for layer in model.encoder.layer:
        layer.register_forward_hook(lambda module, args, out: seen.append(out))
    with torch.no_grad():
        model(input_ids)
    for kept, expected in zip(seen, recorded[1:]):  # as the hooks saw them, not overwritten by later layers
        torch.testing.assert_close(kept, expected.detach(), atol=1e-6, rtol=0)


def test_hooks_keep_the_whole_sequence_layer_path(monkeypatch):
    # A hook on the mixer sees its output unchanged, and one on the MLP sees the whole sequence once.
    monkeypatch.setattr(modeling_orchid, "MLP_CHUNK_ELEMENTS", 1)
    monkeypatch.setattr(modeling_orchid, "MLP_MIN_CHUNK_TOKENS", 7)
    torch.manual_seed(0)
    model = OrchidModel(tiny_text_config()).eval()
    input_ids = torch.randint(0, 97, (3, 20))
    with torch.no_grad():
        expected = model(input_ids).last_hidden_state
    layer = model.encoder.layer[0]
    seen = {}
    layer.mixer.register_forward_hook(lambda module, args, out: seen.update(mixer=(out, out.clone())))
    layer.mlp.register_forward_hook(lambda module, args, out: seen.update(mlp=args[0].shape))
    with torch.no_grad():
        hooked = model(input_ids).last_hidden_state
    assert torch.equal(seen["mixer"][0], seen["mixer"][1]) and seen["mlp"] == (3, 20, 32)
    torch.testing.assert_close(hooked, expected, atol=1e-6, rtol=0)
    # The chunked path skips the dropout after the mixer (identity in eval mode), so a hook there keeps it off too.
    other = model.encoder.layer[1]
    other.mixer_dropout.register_forward_hook(lambda module, args, out: seen.update(dropout=out.shape))
    with torch.no_grad():
        model(input_ids)
    assert seen["dropout"] == (3, 20, 32)


REFERENCE_ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}


@pytest.mark.parametrize("activation", sorted(orchid_layers.ONEDNN_ACTIVATIONS))
def test_onednn_linear_equals_f_linear_with_its_activation(activation):
    torch.manual_seed(0)
    x, weight, bias = torch.randn(5, 7, 16), torch.randn(12, 16), torch.randn(12)
    columns = torch.randn(5, 7, 40)[..., 8:24]  # a strided slice of features, as a block of a block-diagonal layer
    with torch.no_grad():
        assert orchid_layers.onednn_linear_applies(x, weight)
        plain = F.linear(x, weight, bias)
        fused = orchid_layers.onednn_linear
        torch.testing.assert_close(fused(x, weight, bias), plain, atol=1e-5, rtol=1e-5)
        activated = REFERENCE_ACTIVATIONS[activation](plain)
        torch.testing.assert_close(fused(x, weight, bias, activation=activation), activated, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(fused(columns, weight), F.linear(columns, weight), atol=1e-5, rtol=1e-5)


def test_onednn_linear_applies_only_to_cpu_float32_without_autograd(monkeypatch):
    x, weight = torch.randn(2, 3), torch.randn(4, 3)
    assert not orchid_layers.onednn_linear_applies(x, weight)  # autograd records
    with torch.no_grad():
        assert orchid_layers.onednn_linear_applies(x, weight)
        assert not orchid_layers.onednn_linear_applies(x.double(), weight.double())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not orchid_layers.onednn_linear_applies(x, weight)
        monkeypatch.setattr(orchid_layers, "ONEDNN_LINEAR", False)
        assert not orchid_layers.onednn_linear_applies(x, weight)


def test_linear_falls_back_to_f_linear_where_torch_lacks_the_onednn_op(monkeypatch):
    x, weight, bias = torch.randn(2, 3), torch.randn(4, 3), torch.randn(4)
    orchid_layers._onednn_linear_op.cache_clear()
    monkeypatch.setattr(torch.ops, "mkldnn", types.SimpleNamespace())
    try:
        assert orchid_layers._onednn_linear_op() is None
        with torch.no_grad():
            assert not orchid_layers.onednn_linear_applies(x, weight)
            torch.testing.assert_close(orchid_layers.linear(x, weight, bias), F.linear(x, weight, bias))
    finally:
        monkeypatch.undo()
        orchid_layers._onednn_linear_op.cache_clear()
    assert orchid_layers._onednn_linear_op() is not None


def counting_packs(monkeypatch) -> list:
    """Replaces the packing op with one that records the shape of each weight it packs."""
    packed, real = [], orchid_layers._pack_op()

    def pack(weight, batch):
        packed.append(tuple(weight.shape))
        return real(weight, batch)

    monkeypatch.setattr(orchid_layers, "_pack_op", lambda: pack)
    return packed


def test_packed_weights_give_the_plain_results_and_are_packed_once_per_version(monkeypatch):
    packed = counting_packs(monkeypatch)
    torch.manual_seed(0)
    dense = orchid_layers.Linear(16, 12)
    blocks = orchid_layers.BlockDiagonalLinear(16, 24, num_blocks=4)
    x = torch.randn(3, 5, 16)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(dense(x), F.linear(x, dense.weight, dense.bias), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(blocks(x), blocks(x.requires_grad_()).detach(), atol=1e-5, rtol=1e-5)
            x.requires_grad_(False)
    assert packed == [(12, 16)] + [(6, 4)] * 4  # the second calls reuse the packed copies
    with torch.no_grad():
        assert all(blocks.block_parameters(i)[0].layout == torch._mkldnn for i in range(4))
    # An update in place (an optimizer step) and load_state_dict both make the next call pack again.
    with torch.no_grad():
        dense.weight.mul_(2.0)
        blocks.load_state_dict({name: torch.randn_like(value) for name, value in blocks.state_dict().items()})
        torch.testing.assert_close(dense(x), F.linear(x, dense.weight, dense.bias), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(blocks(x), blocks(x.requires_grad_()).detach(), atol=1e-5, rtol=1e-5)
    assert packed == ([(12, 16)] + [(6, 4)] * 4) * 2


def test_weights_are_packed_only_where_onednn_multiplies_by_them_without_autograd(monkeypatch):
    packed = counting_packs(monkeypatch)
    torch.manual_seed(0)
    dense, x = orchid_layers.Linear(8, 4), torch.randn(2, 8)
    dense(x)  # autograd records: F.linear with the parameter itself
    with torch.no_grad():
        dense.double()(x.double())
        monkeypatch.setattr(orchid_layers, "PACK_WEIGHTS", False)
        dense.float()(x)
    assert packed == []
    with torch.inference_mode():
        made_in_inference_mode = orchid_layers.Linear(8, 4)  # no version counter to tell its updates apart
        made_in_inference_mode(x)
    assert packed == []


def test_packed_copies_are_bounded_and_go_with_their_parameter(monkeypatch):
    monkeypatch.setattr(orchid_layers, "PACKED_ROWS_LIMIT", 2)
    dense = orchid_layers.Linear(8, 12)
    with torch.no_grad():
        for start in range(12):
            orchid_layers.linear_rows(dense, slice(start, start + 3))
        packs = orchid_layers._PACKED_WEIGHTS[id(dense.weight)][1]
        assert 0 < sum(w.numel() for w in packs.values()) <= 2 * dense.weight.numel()
    key = id(dense.weight)
    del dense, packs
    gc.collect()
    assert key not in orchid_layers._PACKED_WEIGHTS


@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_pytorch_tanh"])
def test_a_model_whose_weights_were_packed_can_be_copied_and_pickled(hidden_act):
    # The packed copies are oneDNN tensors, which neither deepcopy nor pickle can handle: the modules must not hold
    # them (nor the torch op or lambda of an in-place activation).
    torch.manual_seed(0)
    model = OrchidModel(tiny_text_config(hidden_act=hidden_act, mlp_type="glu")).eval()
    input_ids = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        expected = model(input_ids).last_hidden_state
        assert id(model.encoder.layer[0].mixer.in_proj.weight) in orchid_layers._PACKED_WEIGHTS
        copied = copy.deepcopy(model)
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        torch.testing.assert_close(copied(input_ids).last_hidden_state, expected, atol=0, rtol=0)
        torch.testing.assert_close(loaded(input_ids).last_hidden_state, expected, atol=0, rtol=0)


@pytest.mark.parametrize(
    ("mlp_type", "mlp_num_blocks", "calls"),
    [("glu", 4, 4 + 4 + 4), ("glu", 3, 3 + 3 + 3), ("glu", 1, 3), ("mlp", 4, 8)],
)
def test_mlp_without_autograd_runs_its_gemms_with_the_activation_fused(mlp_type, mlp_num_blocks, calls, monkeypatch):
    # GLU with 4 blocks: a gate piece (activation fused) and a value piece per block of down_proj, and the four
    # down blocks; each reads a contiguous input, the up blocks' input slices copied once.
    contiguous = []
    seen = []

    def counting(*args, **kwargs):
        seen.append(kwargs.get("activation"))
        contiguous.append(args[0].is_contiguous())
        return orchid_layers.onednn_linear(*args, **kwargs)

    monkeypatch.setattr(modeling_orchid, "onednn_linear", counting)
    torch.manual_seed(0)
    config = tiny_text_config(mlp_type=mlp_type, mlp_num_blocks=mlp_num_blocks, hidden_size=48, intermediate_size=96)
    mlp = modeling_orchid.OrchidMLP(config).eval()
    x = torch.randn(2, 9, 48)
    with torch.no_grad():
        fused = mlp(x)
    assert len(seen) == calls and all(contiguous)
    assert seen.count("gelu") == mlp_num_blocks
    torch.testing.assert_close(fused, mlp(x).detach(), atol=1e-6, rtol=0)
