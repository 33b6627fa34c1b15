"""The Orchid model family in transformers: config, presets, heads, Auto classes, padding, checkpoints."""

import pytest
import torch
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

# (count in the paper, largest relative difference allowed). The paper gives Orchid-m's count at 1x1 and 2x2 patches
# only (2.0M, 2.1M), to one decimal; the preset has 4x4 patches (docs/model.md, "Parameter counts").
PAPER_PARAMETERS = {
    "orchid-bert-base": (77e6, 0.015),
    "orchid-bert-large": (254e6, 0.015),
    "orchid-vit-cifar-s": (735e3, 0.015),
    "orchid-vit-cifar-m": (2.0e6, 0.025),
    "orchid-vit-imagenet": (48e6, 0.02),
}


def test_preset_parameter_counts_match_the_paper(capsys):
    # orchid-recall's size is set by the task (vocab_size, max_position_embeddings); the paper gives no count, nor for
    # the 2-D image models, which it does not have.
    assert set(OrchidConfig.preset_names()) == set(PAPER_PARAMETERS) | {
        "orchid-recall", "orchid-vit-2d-s", "orchid-vit-2d-hybrid-s", "orchid-bert-long"
    }
    # orchid-bert-long is orchid-bert-base without its position table, at 2,048 positions, with larger word embeddings.
    base, long = OrchidConfig.from_preset("orchid-bert-base"), OrchidConfig.from_preset("orchid-bert-long")
    assert {k: v for k, v in long.to_dict().items() if base.to_dict().get(k) != v} == {
        "max_position_embeddings": 2048, "position_embedding_type": "none", "word_embedding_init_std": 0.3}
    with torch.device("meta"):
        assert OrchidForMaskedLM(long).base_model.embeddings.position_embeddings is None
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


@pytest.mark.parametrize("cls", [OrchidModel, OrchidForMaskedLM, OrchidForSequenceClassification])
def test_word_embedding_init_std_sets_the_word_embeddings_scale_and_loading_keeps_saved_weights(cls, tmp_path):
    model = cls(tiny_text_config(word_embedding_init_std=1.0, vocab_size=500, pad_token_id=0))
    words = model.get_input_embeddings().weight
    assert 0.9 < words[1:].std().item() < 1.1 and torch.all(words[0] == 0)  # the padding row stays zero
    others = model.base_model.embeddings.position_embeddings.weight
    assert 0.015 < others.std().item() < 0.025  # BERT's std for everything else
    assert cls(tiny_text_config()).get_input_embeddings().weight.std().item() < 0.025
    model.save_pretrained(tmp_path)
    loaded = cls.from_pretrained(tmp_path)
    torch.testing.assert_close(loaded.get_input_embeddings().weight, words, atol=0, rtol=0)
    with pytest.raises(ValueError, match=r"word_embedding_init_std must be a finite number > 0 or None, got 0"):
        tiny_text_config(word_embedding_init_std=0)


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
    assert layer.mixer.short_conv.weight.std().item() == pytest.approx(1 / 3, rel=0.25)
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


@pytest.mark.slow
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


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------


def test_bad_text_input_raises_value_errors_naming_the_numbers():
    model = OrchidForMaskedLM(tiny_text_config())
    with pytest.raises(ValueError, match=r"length 25 > max_position_embeddings=24"):
        model(torch.randint(5, 97, (1, 25)))
    with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 5\), expected \(batch, length\) = \(2, 6\)"):
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


@pytest.mark.parametrize("pre_norm", [False, True])
def test_feed_forward_chunks_give_the_outputs_and_gradients_of_all_tokens_at_once(pre_norm):
    torch.manual_seed(0)
    whole = OrchidForMaskedLM(tiny_text_config(pre_norm=pre_norm, chunk_size_feed_forward=0))
    chunked = OrchidForMaskedLM(tiny_text_config(pre_norm=pre_norm, chunk_size_feed_forward=7))
    chunked.load_state_dict(whole.state_dict())
    calls = []
    chunked.orchid.encoder.layer[0].mlp.register_forward_hook(lambda module, args, output: calls.append(len(output)))
    ids = torch.randint(5, 97, (3, 20))
    mask = torch.ones(3, 20, dtype=torch.long)
    mask[1, :6] = 0  # left padding
    labels = torch.where(torch.rand(3, 20) < 0.3, ids, -100)
    outputs = [model(input_ids=ids, attention_mask=mask, labels=labels) for model in (whole, chunked)]
    assert calls == [7] * 7 + [5]  # the 54 real tokens in runs of 7, each through the MLP
    torch.testing.assert_close(outputs[1].logits, outputs[0].logits, atol=1e-6, rtol=1e-6)
    for output in outputs:
        output.loss.backward()
    for (name, a), b in zip(whole.named_parameters(), chunked.parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-6, rtol=1e-5, msg=name)
    assert OrchidConfig().chunk_size_feed_forward == 1024
