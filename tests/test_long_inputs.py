"""Long inputs at the price of their own length: each sequence mixed at the transform length that holds it
(``transform_lengths``), alone or batched with longer ones, eager, compiled and exported; and context extension
(``from_pretrained(..., max_position_embeddings=N)``, ``resize_position_embeddings``)."""

import json
import subprocess
import sys
import textwrap

import peft
import pytest
import torch
from orchid_hf.modeling.orchid_layers import ConditioningNetwork, default_transform_lengths
from transformers import AutoConfig, AutoModelForMaskedLM

from orchid_hf import (
    OrchidConfig,
    OrchidForImageClassification,
    OrchidForMaskedLM,
    OrchidForMultipleChoice,
    OrchidForQuestionAnswering,
    OrchidForSequenceClassification,
    OrchidForTokenClassification,
    OrchidModel,
    OrchidOperator,
    optimize_for_inference,
)

from .test_models import tiny_image_config


def long_config(max_positions: int = 512, **overrides) -> OrchidConfig:
    settings = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, intermediate_size=64, filter_width=16,
                    max_position_embeddings=max_positions, hidden_dropout_prob=0.0, num_labels=3,
                    classifier_pooling="mean")
    return OrchidConfig(**{**settings, **overrides})


def mixed_batch(lengths=(300, 100, 7, 512), width: int = 512, left: tuple[int, ...] = (2,)):
    """Rows of these real lengths in one padded batch; the rows in ``left`` padded on the left."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 97, (len(lengths), width), generator=generator)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, length in enumerate(lengths):
        if row in left:
            mask[row, width - length :] = 1
        else:
            mask[row, :length] = 1
    return ids, mask


def main_output(output) -> torch.Tensor:
    return output.logits if hasattr(output, "logits") else output.last_hidden_state


def record_transform_lengths(monkeypatch) -> list[int]:
    """The transform lengths the conditioning networks run at, call by call."""
    seen = []
    forward = ConditioningNetwork.forward

    def recording(self, u, n, *args, **kwargs):
        seen.append(n)
        return forward(self, u, n, *args, **kwargs)

    monkeypatch.setattr(ConditioningNetwork, "forward", recording)
    return seen


def test_the_default_transform_lengths_and_their_checks():
    assert default_transform_lengths(128) == (128,)
    assert default_transform_lengths(100) == (100,)
    assert default_transform_lengths(8192) == (128, 256, 512, 1024, 2048, 4096, 8192)
    assert default_transform_lengths(600) == (128, 256, 512, 600)
    assert long_config().resolved_transform_lengths(512) == (128, 256, 512)
    assert OrchidOperator(8, 300).transform_lengths == (128, 256, 300)
    assert OrchidOperator(8, 300, transform_lengths=[300]).transform_lengths == (300,)
    for lengths, message in [([256, 128, 512], "ascending"), ([128, 256], "must end at the longest input, 512"),
                             ([0, 512], "positive integers"), ("512", "positive integers")]:
        with pytest.raises(ValueError, match=rf"OrchidConfig.transform_lengths {message}|{message}"):
            long_config(transform_lengths=lengths)
    with pytest.raises(ValueError, match="OrchidOperator.transform_lengths must end at the longest input, 64"):
        OrchidOperator(8, 64, transform_lengths=[32])
    with pytest.raises(ValueError, match="filter_lag_scale must be a positive integer or None, got 0"):
        long_config(filter_lag_scale=0)


@pytest.mark.parametrize("transform", ["dct", "fft"])
@pytest.mark.parametrize("head", [OrchidModel, OrchidForMaskedLM, OrchidForSequenceClassification])
def test_each_sequence_is_mixed_at_its_own_length_and_gives_its_output_alone(head, transform, monkeypatch):
    torch.manual_seed(0)
    model = head(long_config(transform=transform)).eval()
    lengths = (300, 100, 7, 512)
    ids, mask = mixed_batch(lengths)
    seen = record_transform_lengths(monkeypatch)
    with torch.no_grad():
        batched = main_output(model(input_ids=ids, attention_mask=mask))
    # One group per transform length: 512 (the row of 512), 512 again for 300, 128 for 100 and 7.
    assert sorted(set(seen)) == [128, 512]
    for row, length in enumerate(lengths):
        alone_ids = ids[row][mask[row].bool()].unsqueeze(0)
        seen.clear()
        with torch.no_grad():
            alone = main_output(model(input_ids=alone_ids))
        assert set(seen) == {128 if length <= 128 else 512 if length > 256 else 256}
        got = batched[row] if head is OrchidForSequenceClassification else batched[row][mask[row].bool()]
        torch.testing.assert_close(got, alone[0], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head", [OrchidForMaskedLM, OrchidForTokenClassification])
def test_per_token_heads_run_on_the_real_tokens_only(head, dtype):
    """The masked-LM and token-classification heads see the real tokens of a padded batch (padded on either side)
    and no other position: at the real positions their logits, and their loss and gradients, are those of the head
    run over every position of the encoder's output; padded positions hold zeros."""
    torch.manual_seed(0)
    model = head(long_config()).to(dtype)
    ids, mask = mixed_batch((300, 100, 7), width=300)  # the row of 7 padded on the left
    real = mask.bool()
    picked = real & (torch.rand(ids.shape) < 0.3)
    labels = torch.where(picked, ids if head is OrchidForMaskedLM else ids % 3, -100)
    if head is OrchidForMaskedLM:
        last, over_every_position = model.lm_head.decoder, model.lm_head
    else:
        last, over_every_position = model.classifier, lambda states: model.classifier(model.dropout(states))
    rows = []
    last.register_forward_hook(lambda module, args, output: rows.append(output.shape[:-1].numel()))
    output = model(input_ids=ids, attention_mask=mask, labels=labels)
    assert rows == [int(real.sum())]
    assert output.logits.dtype == dtype and output.logits.shape[:2] == ids.shape
    assert output.logits[~real].eq(0).all()
    reference = over_every_position(model.orchid(ids, attention_mask=mask).last_hidden_state)
    torch.testing.assert_close(output.logits[real], reference[real])
    if dtype is torch.bfloat16:
        return
    reference_loss = torch.nn.functional.cross_entropy(reference[picked].float(), labels[picked])
    torch.testing.assert_close(output.loss, reference_loss)
    grads = torch.autograd.grad(output.loss, list(model.parameters()))
    for (name, parameter), grad in zip(model.named_parameters(), grads):
        torch.testing.assert_close(grad, torch.autograd.grad(reference_loss, parameter, retain_graph=True)[0],
                                   msg=name)


def test_a_short_batch_in_a_long_context_model_pays_for_its_own_length(monkeypatch):
    """In a model of 8,192 positions a batch of 128 tokens is mixed by transforms of 128 points, and gives the outputs
    of a model of 128 positions with the same weights (its transform lengths hold 128)."""
    torch.manual_seed(0)
    long_model = OrchidModel(long_config(8192)).eval()
    # The filters' lag scale is the longest input's: the short model's kernels are measured in the same unit.
    short_model = OrchidModel(long_config(128, filter_lag_scale=8192)).eval()
    state = long_model.state_dict()
    state["embeddings.position_embeddings.weight"] = state["embeddings.position_embeddings.weight"][:128]
    short_model.load_state_dict(state)
    ids = torch.randint(5, 97, (4, 128))
    seen = record_transform_lengths(monkeypatch)
    with torch.no_grad():
        got = long_model(ids).last_hidden_state
    assert set(seen) == {128}
    with torch.no_grad():
        torch.testing.assert_close(got, short_model(ids).last_hidden_state, atol=1e-6, rtol=1e-6)


def test_the_compiled_model_is_one_graph_with_the_eager_outputs_and_gradients():
    """Traced, every transform length up to the padded length runs on every row and each row takes its own: one graph
    (fullgraph), no value read on the host, the eager model's outputs and gradients."""
    torch.manual_seed(0)
    model = OrchidForMaskedLM(long_config())
    ids, mask = mixed_batch((300, 100, 7), width=300)
    real = mask.bool()
    eager = model(input_ids=ids, attention_mask=mask).logits
    eager[real].square().mean().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    traced = compiled(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(traced[real], eager[real], atol=1e-5, rtol=1e-5)
    traced[real].square().mean().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.slow
def test_an_exported_graph_mixes_each_row_at_its_own_length(tmp_path):
    from orchid_hf.onnx import compare_with_onnxruntime, export_onnx

    torch.manual_seed(0)
    model = OrchidModel(long_config(512, type_vocab_size=0)).eval()
    path = export_onnx(model, tmp_path / "model.onnx")
    differences = compare_with_onnxruntime(model, path, shapes=[(3, 512), (4, 200), (2, 90)])
    assert differences["last_hidden_state"] < 1e-4


def test_gradient_checkpointing_and_lora_with_rows_of_every_length():
    torch.manual_seed(0)
    model = OrchidForSequenceClassification(long_config())
    ids, mask = mixed_batch()
    labels = torch.tensor([0, 1, 2, 0])
    model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    plain = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    model.gradient_checkpointing_enable()
    model.train()
    model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, plain[name], atol=1e-6, rtol=1e-5, msg=name)
    lora = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["in_proj", "out_proj"]))
    lora(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    assert all(p.grad is not None for name, p in lora.named_parameters() if "lora_" in name)


def test_the_folded_copy_and_the_operator_alone_at_every_length():
    torch.manual_seed(0)
    model = OrchidForMaskedLM(long_config(transform="fft")).eval()
    ids, mask = mixed_batch()
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(optimize_for_inference(model)(input_ids=ids, attention_mask=mask).logits, expected,
                               atol=1e-6, rtol=1e-6)
    # The operator on its own: a row with a cross-conditioning sequence is mixed at the length that holds both.
    op = OrchidOperator(8, 400, conditioning="xcorr").eval()
    x, u = torch.randn(2, 100, 8), torch.randn(2, 300, 8)
    x_mask, u_mask = torch.ones(2, 100), torch.ones(2, 300)
    u_mask[1, 50:] = 0
    with torch.no_grad():
        both = op(x, x_mask, conditioning_input=u, conditioning_mask=u_mask)
        first = op(x[:1], conditioning_input=u[:1])
        second = op(x[1:], conditioning_input=u[1:, :50])
    torch.testing.assert_close(both, torch.cat([first, second]), atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# Context extension
# ---------------------------------------------------------------------------------------------


def saved_short_model(tmp_path, transform: str = "dct", without_new_fields: bool = False):
    torch.manual_seed(0)
    model = OrchidForMaskedLM(long_config(128, transform=transform)).eval()
    model.save_pretrained(tmp_path)
    if without_new_fields:  # as this package saved models before transform lengths existed
        path = tmp_path / "config.json"
        values = json.loads(path.read_text())
        del values["transform_lengths"], values["filter_lag_scale"]
        path.write_text(json.dumps(values))
    return model


def test_a_config_saved_before_transform_lengths_reads_as_one_length(tmp_path):
    saved_short_model(tmp_path, without_new_fields=True)
    values = json.loads((tmp_path / "config.json").read_text())
    values["max_position_embeddings"] = 512
    (tmp_path / "config.json").write_text(json.dumps(values))
    config = AutoConfig.from_pretrained(tmp_path)
    assert config.transform_lengths == [512] and config.resolved_transform_lengths(512) == (512,)
    assert OrchidConfig(max_position_embeddings=512).transform_lengths is None  # new configs: the default ladder


@pytest.mark.parametrize("transform", ["dct", "fft"])
def test_extension_keeps_the_outputs_of_short_inputs_and_takes_long_ones(transform, tmp_path):
    short = saved_short_model(tmp_path, transform, without_new_fields=True)
    extended = OrchidForMaskedLM.from_pretrained(tmp_path, max_position_embeddings=1024).eval()
    config = extended.config
    assert (config.max_position_embeddings, config.transform_lengths, config.filter_lag_scale) == (
        1024, [128, 256, 512, 1024], 128)
    ids = torch.randint(5, 97, (3, 120))
    with torch.no_grad():
        torch.testing.assert_close(extended(ids).logits, short(ids).logits, atol=0, rtol=0)
        long_logits = extended(torch.randint(5, 97, (1, 1000))).logits
    assert long_logits.shape == (1, 1000, 97) and torch.isfinite(long_logits).all()
    # The new positions repeat the learned ones, as long-document encoders extended BERT's.
    positions = extended.get_position_embeddings().weight
    torch.testing.assert_close(positions[128:256], positions[:128], atol=0, rtol=0)
    # Saved and reloaded, and the config alone, agree.
    extended.save_pretrained(tmp_path / "extended")
    reloaded = OrchidForMaskedLM.from_pretrained(tmp_path / "extended").eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(torch.randint(5, 97, (1, 700))).logits.shape, (1, 700, 97))
    from_config_alone = AutoConfig.from_pretrained(tmp_path, max_position_embeddings=1024).to_dict()
    assert {key: value for key, value in from_config_alone.items() if key != "_name_or_path"} == {
        key: value for key, value in reloaded.config.to_dict().items() if key != "_name_or_path"}


def test_an_extended_model_trains_at_the_new_length(tmp_path):
    saved_short_model(tmp_path)
    model = OrchidForMaskedLM.from_pretrained(tmp_path, max_position_embeddings=512).train()
    ids = torch.randint(5, 97, (2, 400))
    labels = torch.where(torch.rand(2, 400) < 0.3, ids, torch.full_like(ids, -100))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5


def test_resizing_to_fewer_positions_and_what_cannot_be_resized():
    model = OrchidModel(long_config(256)).eval()
    ids = torch.randint(5, 97, (1, 100))
    with torch.no_grad():
        before = model(ids).last_hidden_state
    # A cut to a length between two transform lengths would mix 101..200-token inputs at 200 instead of 256.
    with pytest.raises(ValueError, match=r"cutting the context from 256 to 200 positions would mix inputs of 129 to "
                                         r"200 tokens at a transform length of 200 instead of 256.*\[128\]"):
        model.resize_position_embeddings(200)
    assert model.config.max_position_embeddings == 256  # refused before anything changed
    model.resize_position_embeddings(128)
    assert model.config.max_position_embeddings == 128 and model.config.transform_lengths == [128]
    with torch.no_grad():
        torch.testing.assert_close(model(ids).last_hidden_state, before, atol=0, rtol=0)
    with pytest.raises(ValueError, match="the input has length 129 > max_position_embeddings=128"):
        model(torch.randint(5, 97, (1, 129)))
    with pytest.raises(ValueError, match="must be a positive integer, got 0"):
        model.resize_position_embeddings(0)
    with pytest.raises(ValueError, match="would mix inputs of 1 to 100 tokens at a transform length of 100 instead "
                                         "of 128"):
        model.resize_position_embeddings(100)
    image_model = OrchidForImageClassification(tiny_image_config())
    with pytest.raises(ValueError, match="positions are fixed sin-cos embeddings of its patch grid"):
        image_model.resize_position_embeddings(512)


AUTO_CLASSES = {
    "AutoModel": OrchidModel,
    "AutoModelForMaskedLM": OrchidForMaskedLM,
    "AutoModelForSequenceClassification": OrchidForSequenceClassification,
    "AutoModelForTokenClassification": OrchidForTokenClassification,
    "AutoModelForQuestionAnswering": OrchidForQuestionAnswering,
    "AutoModelForMultipleChoice": OrchidForMultipleChoice,
}


def outputs_of(model, ids: torch.Tensor) -> list[torch.Tensor]:
    """Every output tensor of a head for ``ids`` (multiple choice: the ids as 1 choice of 1 example per row)."""
    if isinstance(model, OrchidForMultipleChoice):
        ids = ids.unsqueeze(1)
    with torch.no_grad():
        output = model(input_ids=ids)
    return [value for value in output.to_tuple() if isinstance(value, torch.Tensor)]


@pytest.mark.parametrize("auto_name", sorted(AUTO_CLASSES))
def test_context_extension_through_every_auto_class_equals_the_class(auto_name, tmp_path):
    """README's ``AutoModelForMaskedLM.from_pretrained(path, max_position_embeddings=N)``, with every Auto class: the
    checkpoint's weights loaded and extended as the class extends them, short inputs unchanged."""
    import transformers

    torch.manual_seed(0)
    cls = AUTO_CLASSES[auto_name]
    cls(long_config(128)).save_pretrained(tmp_path)
    auto = getattr(transformers, auto_name).from_pretrained(tmp_path, max_position_embeddings=1024).eval()
    direct = cls.from_pretrained(tmp_path, max_position_embeddings=1024).eval()
    assert type(auto) is cls
    assert (auto.config.max_position_embeddings, auto.config.transform_lengths, auto.config.filter_lag_scale) == (
        1024, [128, 256, 512, 1024], 128)
    assert auto.config.to_dict() == direct.config.to_dict()
    for name, value in direct.state_dict().items():
        torch.testing.assert_close(auto.state_dict()[name], value, atol=0, rtol=0, msg=name)
    ids = torch.randint(5, 97, (2, 100))
    # Against the checkpoint loaded as it is: a loaded copy of a model is not always bit-equal to the model in memory
    # (the multiple-choice head's one-column product, with the same weights at another address, rounds otherwise).
    loaded = cls.from_pretrained(tmp_path).eval()
    for got, expected in zip(outputs_of(auto, ids), outputs_of(loaded, ids), strict=True):
        torch.testing.assert_close(got, expected, atol=0, rtol=0)
    # The extended config alone, given to from_pretrained as the Auto classes give it, loads the same model.
    config = AutoConfig.from_pretrained(tmp_path, max_position_embeddings=1024)
    assert "_checkpoint_context" not in config.to_dict()
    assert cls.from_pretrained(tmp_path, config=config).config.to_dict() == direct.config.to_dict()
    auto.save_pretrained(tmp_path / "extended")
    assert "_checkpoint_context" not in json.loads((tmp_path / "extended" / "config.json").read_text())


def test_the_config_alone_extends_a_checkpoint_of_any_length_as_the_class_does(tmp_path):
    """A 100-position checkpoint: AutoConfig keeps its transform length of 100 (inputs up to 100 tokens mixed as
    before) and adds the ladder, as the class does; cuts follow the class's rule."""
    torch.manual_seed(0)
    model = OrchidForMaskedLM(long_config(100)).eval()
    model.save_pretrained(tmp_path)
    config = AutoConfig.from_pretrained(tmp_path, max_position_embeddings=512)
    assert config.transform_lengths == [100, 128, 256, 512]
    loaded = AutoModelForMaskedLM.from_pretrained(tmp_path, config=config).eval()
    assert loaded.config.transform_lengths == OrchidForMaskedLM.from_pretrained(
        tmp_path, max_position_embeddings=512).config.transform_lengths
    ids = torch.randint(5, 97, (2, 90))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, atol=0, rtol=0)
    with pytest.raises(ValueError, match="cutting the context from 100 to 64 positions"):
        AutoConfig.from_pretrained(tmp_path, max_position_embeddings=64)


def test_the_readme_context_extension(tmp_path):
    """README, "Long inputs": ``AutoModelForMaskedLM.from_pretrained("my-orchid", max_position_embeddings=4096)``,
    inputs up to 128 tokens unchanged."""
    torch.manual_seed(0)
    folder = tmp_path / "my-orchid"
    OrchidForMaskedLM(long_config(128)).save_pretrained(folder)
    long = AutoModelForMaskedLM.from_pretrained(folder, max_position_embeddings=4096).eval()
    short = OrchidForMaskedLM.from_pretrained(folder).eval()
    ids = torch.randint(5, 97, (1, 128))
    with torch.no_grad():
        torch.testing.assert_close(long(ids).logits, short(ids).logits, atol=0, rtol=0)
        assert long(torch.randint(5, 97, (1, 4096))).logits.shape == (1, 4096, 97)


REMOTE_EXTENSION = textwrap.dedent(
    """
    import sys
    sys.modules["orchid_hf"] = None  # a user who never installed the package
    import torch, transformers
    folder, auto_name, expected_path = sys.argv[1:]
    model = getattr(transformers, auto_name).from_pretrained(
        folder, trust_remote_code=True, max_position_embeddings=1024).eval()
    assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
    expected = torch.load(expected_path, weights_only=True)
    with torch.no_grad():
        got = model(input_ids=expected["ids"]).logits
    torch.testing.assert_close(got, expected["logits"], atol=0, rtol=0)
    print("remote-ok", model.config.max_position_embeddings, model.config.transform_lengths)
    """
)


@pytest.mark.slow
def test_context_extension_through_remote_code_without_the_package(tmp_path, hf_modules_cache):
    torch.manual_seed(0)
    model = OrchidForMaskedLM(long_config(128)).eval()
    model.save_pretrained(tmp_path / "model")
    ids = torch.randint(5, 97, (2, 100))
    with torch.no_grad():
        torch.save({"ids": ids, "logits": model(ids).logits}, tmp_path / "expected.pt")
    result = subprocess.run(
        [sys.executable, "-c", REMOTE_EXTENSION, str(tmp_path / "model"), "AutoModelForMaskedLM",
         str(tmp_path / "expected.pt")],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "remote-ok 1024 [128, 256, 512, 1024]" in result.stdout, result.stdout


# ---------------------------------------------------------------------------------------------
# Rows at the edge of a transform length
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", ["short_conv_size", "conditioning_time_kernel_size"])
@pytest.mark.parametrize("size", [5, 7])
@pytest.mark.parametrize("conditioning", ["abs", "xcorr"])
def test_a_row_one_token_short_of_its_transform_length_never_wraps_onto_its_own_end(kernel, size, conditioning):
    """Under the FFT the short convolutions wrap around a row that fills its transform length, and pad a shorter one
    with zeros: a row of n - 1 tokens batched with a row of n (either padding side) gives its output alone, at every
    transform length n."""
    torch.manual_seed(0)
    model = OrchidModel(long_config(512, transform="fft", conditioning=conditioning, num_hidden_layers=1,
                                    **{kernel: size})).eval()  # fmt: skip
    for n in model.transform_lengths:
        ids = torch.randint(5, 97, (3, n))
        mask = torch.ones(3, n, dtype=torch.long)
        mask[1, -1] = 0
        mask[2, 0] = 0
        with torch.no_grad():
            batched = model(ids, attention_mask=mask).last_hidden_state
            full = model(ids[:1]).last_hidden_state[0]
            right = model(ids[1:2, :-1]).last_hidden_state[0]
            left = model(ids[2:3, 1:]).last_hidden_state[0]
        torch.testing.assert_close(batched[0], full, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(batched[1, :-1], right, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(batched[2, 1:], left, atol=1e-6, rtol=1e-6)


@pytest.mark.slow
def test_compiled_rows_one_token_short_of_their_transform_length_match_eager():
    torch.manual_seed(0)
    model = OrchidModel(long_config(256, transform="fft", short_conv_size=5, num_hidden_layers=1)).eval()
    compiled = torch.compile(model, backend="eager", fullgraph=True, dynamic=True)
    for n in (127, 128, 255):
        ids = torch.randint(5, 97, (2, n))
        with torch.no_grad():
            torch.testing.assert_close(compiled(ids).last_hidden_state, model(ids).last_hidden_state,
                                       atol=1e-5, rtol=1e-5)


def test_a_model_without_position_embeddings_extends_and_ignores_padding(tmp_path):
    """``position_embedding_type="none"``: no position table (nothing to repeat when the context grows); a sequence's
    outputs are the same padded on either side, and a checkpoint extends with its short inputs unchanged."""
    torch.manual_seed(0)
    model = OrchidForMaskedLM(long_config(128, position_embedding_type="none")).eval()
    assert model.get_position_embeddings() is None
    assert not any("position_embeddings" in name for name, _ in model.named_parameters())
    ids, mask = mixed_batch((100, 40, 128), width=128, left=(1,))
    with torch.no_grad():
        batched = model(input_ids=ids, attention_mask=mask).logits
        for row in range(3):
            alone = model(input_ids=ids[row][mask[row].bool()].unsqueeze(0)).logits[0]
            torch.testing.assert_close(batched[row][mask[row].bool()], alone, atol=1e-6, rtol=1e-6)
    model.save_pretrained(tmp_path)
    extended = AutoModelForMaskedLM.from_pretrained(tmp_path, max_position_embeddings=1024).eval()
    with torch.no_grad():
        torch.testing.assert_close(extended(ids[:1]).logits, model(ids[:1]).logits, atol=0, rtol=0)
        assert extended(torch.randint(5, 97, (1, 1000))).logits.shape == (1, 1000, 97)
    with pytest.raises(ValueError, match="position_embedding_type must be one of"):
        long_config(position_embedding_type="rotary")
