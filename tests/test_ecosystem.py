"""What users and the ecosystem do to a model: Trainer with its default (fused) optimizer, fused optimizers and
``.data`` edits, peft LoRA and merging, hooks, dynamic quantisation, pruning, half-precision loads, torch.compile,
padding on either side with garbage or NaN in it, and bad input of every kind."""

import copy
import math

import numpy as np
import peft
import pytest
import torch
from datasets import Dataset
from torch import nn
from torch.nn.utils import prune
from transformers import AutoModelForMaskedLM, Trainer, TrainingArguments

from orchid_hf import (
    BlockDiagonalLinear,
    OrchidConfig,
    OrchidForImageClassification,
    OrchidForMaskedLM,
    OrchidForSequenceClassification,
    OrchidForTokenClassification,
    OrchidModel,
    OrchidOperator,
)

from .test_models import tiny_image_config, tiny_text_config

TEXT_HEADS = [OrchidModel, OrchidForMaskedLM, OrchidForSequenceClassification, OrchidForTokenClassification]


def main_output(output) -> torch.Tensor:
    return output.logits if hasattr(output, "logits") else output.last_hidden_state


def text_batch(batch: int = 3, length: int = 12, vocab: int = 97) -> dict[str, torch.Tensor]:
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[-1, length - 4 :] = 0
    return {"input_ids": torch.randint(5, vocab, (batch, length)), "attention_mask": mask}


def outputs(model, inputs, grad: bool) -> torch.Tensor:
    with torch.set_grad_enabled(grad):
        return main_output(model(**inputs)).detach()


def fresh_copy(model):
    """The same architecture with the model's current weights, loaded from its state dict."""
    other = type(model)(model.config).eval()
    other.load_state_dict(model.state_dict())
    return other


# ---------------------------------------------------------------------------------------------
# Training: Trainer's defaults, fused optimizers, .data edits
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_trainer_with_default_arguments_reports_the_eval_loss_of_a_fresh_evaluation(tmp_path):
    torch.manual_seed(0)
    model = OrchidForMaskedLM(tiny_text_config())
    rows = []
    for _ in range(24):
        ids = torch.randint(5, 97, (12,))
        labels = torch.full_like(ids, -100)
        labels[::3] = ids[::3]
        rows.append({"input_ids": ids.tolist(), "attention_mask": [1] * 12, "labels": labels.tolist()})
    data = Dataset.from_list(rows)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=8, max_steps=3,
                             learning_rate=1e-2)
    assert args.optim == "adamw_torch_fused"  # the default: updates parameters without bumping their versions
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer.train()
    assert any(not torch.equal(before[name], p) for name, p in model.named_parameters())
    reported = trainer.evaluate()["eval_loss"]
    reference = fresh_copy(model)
    with torch.no_grad():
        losses = []
        for start in range(0, len(rows), 8):
            batch = {key: torch.tensor([row[key] for row in rows[start : start + 8]]) for key in rows[0]}
            losses.append(reference(**batch).loss.item())
    assert reported == pytest.approx(np.mean(losses), rel=1e-5)


@pytest.mark.parametrize("optimizer", ["adamw_fused", "sgd_fused", "data_edit", "load_state_dict"])
def test_no_grad_outputs_follow_every_kind_of_weight_update(optimizer):
    torch.manual_seed(0)
    model = OrchidForSequenceClassification(tiny_text_config()).eval()
    inputs = text_batch()
    first = outputs(model, inputs, grad=False)
    if optimizer in ("adamw_fused", "sgd_fused"):
        kind = torch.optim.AdamW if optimizer == "adamw_fused" else torch.optim.SGD
        opt = kind(model.parameters(), lr=0.05, fused=True)
        model(**inputs, labels=torch.tensor([0, 1, 2])).loss.backward()
        opt.step()
    elif optimizer == "data_edit":  # as peft's merge_and_unload does
        for module in model.modules():
            if isinstance(module, nn.Linear):
                module.weight.data += 0.05 * torch.randn_like(module.weight)
    else:
        model.load_state_dict({k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()})
    after = outputs(model, inputs, grad=False)
    assert (after - first).abs().max() > 1e-3
    torch.testing.assert_close(after, outputs(model, inputs, grad=True), atol=1e-6, rtol=0)
    torch.testing.assert_close(after, outputs(fresh_copy(model), inputs, grad=False), atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------------------------
# peft LoRA on every projection, and merging
# ---------------------------------------------------------------------------------------------


def lora_targets(mlp_num_blocks: int) -> list[str]:
    mlp = ["up_proj", "down_proj"] if mlp_num_blocks == 1 else [f"blocks.{i}" for i in range(mlp_num_blocks)]
    return ["in_proj", "out_proj", *mlp]


@pytest.mark.slow
@pytest.mark.parametrize("mlp_num_blocks", [1, 4])
@pytest.mark.parametrize("targets", ["operator", "mlp", "all-linear"])
def test_lora_changes_the_output_trains_and_merges(mlp_num_blocks, targets):
    torch.manual_seed(0)
    config = tiny_text_config(mlp_num_blocks=mlp_num_blocks, num_labels=3)
    model = OrchidForSequenceClassification(config).eval()
    inputs = text_batch()
    base = outputs(model, inputs, grad=False)
    names = {"operator": ["in_proj", "out_proj"], "mlp": lora_targets(mlp_num_blocks)[2:]}.get(targets, targets)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=names, init_lora_weights=False))
    adapted = {name.rsplit(".", 1)[0] for name, _ in wrapped.named_parameters() if "lora_A" in name}
    kinds = {"in_proj", "out_proj", "up_proj", "down_proj"} if targets == "all-linear" else set()
    kinds |= {"in_proj", "out_proj"} if targets == "operator" else set()
    kinds |= {"up_proj", "down_proj"} if targets == "mlp" else set()
    for kind in kinds:
        assert any(f".{kind}." in f"{name}." for name in adapted), (kind, sorted(adapted))
    # The adapters act on the output, without and with autograd alike.
    with_lora = outputs(wrapped, inputs, grad=False)
    assert (with_lora - base).abs().max() > 1e-4
    torch.testing.assert_close(with_lora, outputs(wrapped, inputs, grad=True), atol=1e-6, rtol=0)
    # They train: every LoRA weight gets a gradient, and a step changes the output.
    wrapped.train()
    loss = wrapped(**inputs, labels=torch.tensor([0, 1, 2])).loss
    loss.backward()
    lora_parameters = [p for name, p in wrapped.named_parameters() if "lora_" in name]
    assert lora_parameters and all(p.grad is not None and p.grad.abs().sum() > 0 for p in lora_parameters)
    torch.optim.AdamW([p for p in wrapped.parameters() if p.requires_grad], lr=1e-2, fused=True).step()
    wrapped.eval()
    trained = outputs(wrapped, inputs, grad=False)
    assert (trained - with_lora).abs().max() > 1e-5
    merged = wrapped.merge_and_unload()
    assert not any("lora_" in name for name, _ in merged.named_parameters())
    torch.testing.assert_close(outputs(merged, inputs, grad=False), trained, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# Hooks, quantisation, pruning
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("grad", [False, True])
def test_forward_hooks_fire_once_per_module_call(grad):
    torch.manual_seed(0)
    model = OrchidModel(tiny_text_config(num_hidden_layers=2)).eval()
    calls: dict[str, int] = {}

    def count(module, args, out, name):
        calls[name] = calls.get(name, 0) + 1

    for name, module in model.named_modules():
        if name:
            module.register_forward_hook(lambda m, args, out, name=name: count(m, args, out, name))
    with torch.set_grad_enabled(grad):
        model(**text_batch())
    for layer in range(2):
        prefix = f"encoder.layer.{layer}"
        for part in ("mixer", "mixer.in_proj", "mixer.short_conv", "mixer.out_proj", "mixer.static_filter.ffn",
                     "mixer.static_filter.ffn.0", "mixer.conditioning", "mixer.conditioning.time_conv.layers.0",
                     "mixer.residual_filter.ffn", "mlp", "mlp.up_proj", "mlp.up_proj.blocks.3",
                     "mlp.down_proj.blocks.0", "mixer_norm", "mlp_norm"):
            assert calls.get(f"{prefix}.{part}") == 1, (prefix, part, calls.get(f"{prefix}.{part}"))


def test_a_hook_that_changes_a_projection_output_changes_the_model_output():
    torch.manual_seed(0)
    model = OrchidModel(tiny_text_config()).eval()
    inputs = text_batch()
    base = outputs(model, inputs, grad=False)
    model.encoder.layer[0].mixer.in_proj.register_forward_hook(lambda m, args, out: out * 0.5)
    model.encoder.layer[1].mlp.up_proj.blocks[2].register_forward_hook(lambda m, args, out: out + 1.0)
    hooked = outputs(model, inputs, grad=False)
    assert (hooked - base).abs().max() > 1e-3
    torch.testing.assert_close(hooked, outputs(model, inputs, grad=True), atol=1e-6, rtol=0)


@pytest.mark.parametrize("mlp_num_blocks", [1, 4])
def test_dynamic_quantisation_quantizes_every_linear_and_stays_close(mlp_num_blocks):
    torch.manual_seed(0)
    model = OrchidForMaskedLM(tiny_text_config(mlp_num_blocks=mlp_num_blocks)).eval()
    inputs = text_batch()
    expected = outputs(model, inputs, grad=False)
    quantized = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8)
    remaining = [name for name, module in quantized.named_modules() if type(module) is nn.Linear]
    assert remaining == [], remaining
    got = outputs(quantized, inputs, grad=False)
    assert torch.isfinite(got).all()
    assert (got - expected).abs().mean() < 0.05 * expected.abs().mean()


def test_pruning_acts_on_the_operator_and_mlp_projections():
    torch.manual_seed(0)
    model = OrchidModel(tiny_text_config()).eval()
    inputs = text_batch()
    base = outputs(model, inputs, grad=False)
    layer = model.encoder.layer[0]
    for module in (layer.mixer.in_proj, layer.mixer.out_proj, layer.mlp.up_proj.blocks[0], layer.mixer.short_conv):
        prune.l1_unstructured(module, "weight", amount=0.5)
    pruned = outputs(model, inputs, grad=False)
    assert (pruned - base).abs().max() > 1e-3
    assert (layer.mixer.in_proj.weight == 0).float().mean() >= 0.5
    # The same as a model whose weights were zeroed by hand.
    for module in (layer.mixer.in_proj, layer.mixer.out_proj, layer.mlp.up_proj.blocks[0], layer.mixer.short_conv):
        prune.remove(module, "weight")
    torch.testing.assert_close(outputs(fresh_copy(model), inputs, grad=False), pruned, atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------------------------
# Precision: half-precision loads and casts
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("transform", ["dct", "fft"])
def test_from_pretrained_in_half_precision_runs_close_to_float32(tmp_path, dtype, transform):
    torch.manual_seed(0)
    model = OrchidForMaskedLM(tiny_text_config(transform=transform)).eval()
    model.save_pretrained(tmp_path)
    inputs = text_batch()
    expected = outputs(model, inputs, grad=False)
    loaded = AutoModelForMaskedLM.from_pretrained(tmp_path, dtype=dtype).eval()
    mixer = loaded.orchid.encoder.layer[0].mixer
    assert mixer.in_proj.weight.dtype == dtype
    assert mixer.static_filter.skip.dtype == torch.float32  # the implicit filters stay in float32 (see the class)
    got = outputs(loaded, inputs, grad=False)
    assert got.dtype == dtype and torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), expected, atol=0.15, rtol=0.1)
    cast = copy.deepcopy(model).to(dtype)  # everything in half precision, the filters too
    got = outputs(cast, inputs, grad=False)
    assert got.dtype == dtype and torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), expected, atol=0.15, rtol=0.1)


def test_bf16_autocast_training_step_of_every_text_head_is_finite():
    for head in TEXT_HEADS[1:]:
        torch.manual_seed(0)
        model = head(tiny_text_config(num_labels=3)).train()
        inputs = text_batch()
        labels = torch.tensor([0, 1, 2]) if head is OrchidForSequenceClassification else inputs["input_ids"] % 3
        if head is OrchidForMaskedLM:
            labels = inputs["input_ids"]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(**inputs, labels=labels).loss
        loss.backward()
        assert torch.isfinite(loss)
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


# ---------------------------------------------------------------------------------------------
# Padding on either side, garbage and NaN in padded positions
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("head", TEXT_HEADS)
@pytest.mark.parametrize("pooling", ["first", "mean"])
def test_left_padding_gives_the_outputs_of_right_padding(head, pooling):
    torch.manual_seed(0)
    model = head(tiny_text_config(classifier_pooling=pooling)).eval()
    lengths = (7, 12, 4)
    rows = [torch.randint(5, 97, (n,)) for n in lengths]
    width = max(lengths)
    right = torch.zeros(3, width, dtype=torch.long)
    left = torch.zeros(3, width, dtype=torch.long)
    right_mask, left_mask = torch.zeros_like(right), torch.zeros_like(left)
    for i, row in enumerate(rows):
        right[i, : len(row)], right_mask[i, : len(row)] = row, 1
        left[i, width - len(row) :], left_mask[i, width - len(row) :] = row, 1
    with torch.no_grad():
        from_right = main_output(model(input_ids=right, attention_mask=right_mask))
        from_left = main_output(model(input_ids=left, attention_mask=left_mask))
        for i, row in enumerate(rows):
            alone = main_output(model(input_ids=row[None]))
            if from_right.dim() == 3:  # per-token outputs: compare the real positions
                torch.testing.assert_close(from_right[i, : len(row)], alone[0], atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(from_left[i, width - len(row) :], alone[0], atol=1e-5, rtol=1e-5)
            else:
                torch.testing.assert_close(from_right[i], alone[0], atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(from_left[i], alone[0], atol=1e-5, rtol=1e-5)


def test_hidden_states_come_back_in_the_callers_order_with_left_padding():
    torch.manual_seed(0)
    model = OrchidModel(tiny_text_config()).eval()
    ids = torch.randint(5, 97, (1, 6))
    left = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        states = model(input_ids=left, attention_mask=mask, output_hidden_states=True).hidden_states
        expected = model(input_ids=ids, output_hidden_states=True).hidden_states
    for got, want in zip(states, expected):
        torch.testing.assert_close(got[:, 3:], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e30])
@pytest.mark.parametrize("side", ["right", "left"])
def test_non_finite_embeddings_at_padded_positions_change_nothing_and_train(value, side):
    torch.manual_seed(0)
    model = OrchidForTokenClassification(tiny_text_config(num_labels=3)).train()
    ids = torch.randint(5, 97, (1, 8))
    embeds = model.get_input_embeddings()(ids).detach()
    bad = torch.full((1, 4, 32), value)
    x = torch.cat([embeds, bad], dim=1) if side == "right" else torch.cat([bad, embeds], dim=1)
    mask = torch.tensor([[1] * 8 + [0] * 4]) if side == "right" else torch.tensor([[0] * 4 + [1] * 8])
    labels = torch.full((1, 12), -100)
    real = slice(0, 8) if side == "right" else slice(4, 12)
    labels[0, real] = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    out = model(inputs_embeds=x, attention_mask=mask, labels=labels)
    alone = model(inputs_embeds=embeds, labels=labels[:, real])
    torch.testing.assert_close(out.logits[:, real], alone.logits, atol=1e-5, rtol=1e-5)
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


# ---------------------------------------------------------------------------------------------
# Geometry: the ImageNet model's kernel 5 and 196 patches at many batch sizes
# ---------------------------------------------------------------------------------------------


def test_imagenet_geometry_runs_at_many_batch_sizes():
    # orchid-vit-imagenet's sequence: 224 / 16 = 14 x 14 = 196 patches, short convolutions of 5, block-diagonal MLP;
    # a narrow model, so that many batch sizes run in seconds.
    config = OrchidConfig.from_preset(
        "orchid-vit-imagenet", image_size=28, patch_size=2, num_channels=1, hidden_size=16, intermediate_size=32,
        num_hidden_layers=1, filter_width=8, filter_emb_dim=5, num_labels=3,
    )
    assert config.num_patches == 196 and config.short_conv_size == 5
    torch.manual_seed(0)
    model = OrchidForImageClassification(config).eval()
    images = torch.randn(211, 1, 28, 28)
    with torch.no_grad():
        whole = model(pixel_values=images).logits
        for batch in (1, 2, 41, 42, 69, 70, 171, 182, 196, 210):
            torch.testing.assert_close(model(pixel_values=images[:batch]).logits, whole[:batch], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("max_len", [48, 200])
def test_operator_compiles_as_one_graph(max_len):
    # aot_eager traces the whole operator (dynamo + AOTAutograd, forward and backward) in seconds; inductor compiles it
    # too, but its C++ build takes minutes on a small CPU machine. Under compilation the DCT runs in torch.
    torch._dynamo.reset()
    torch.manual_seed(0)
    op = OrchidOperator(8, max_len, filter_width=8)
    compiled = torch.compile(op, backend="aot_eager", fullgraph=True)
    x = torch.randn(2, max_len, 8, requires_grad=True)
    mask = torch.ones(2, max_len)
    mask[1, : max_len // 2] = 0  # padded on the left: the packing order is traced, not checked
    expected = op(x, mask)
    got = compiled(x, mask)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    got.square().sum().backward()
    assert torch.isfinite(x.grad).all()


# ---------------------------------------------------------------------------------------------
# Bad input: a ValueError naming the field and the numbers
# ---------------------------------------------------------------------------------------------


def bad_inputs() -> list:
    ids = torch.randint(5, 97, (2, 6))
    return [
        (dict(input_ids=torch.zeros(0, 6, dtype=torch.long)), r"batch size 0"),
        (dict(input_ids=torch.tensor([[5, 97, 3]])), r"input_ids must lie in \[0, vocab_size=97\), got values from 97"),
        (dict(input_ids=torch.tensor([[5, -1, 3]])), r"must lie in \[0, vocab_size=97\), got values from -1 to -1"),
        (dict(input_ids=ids.float()), r"input_ids must hold integer ids, got torch.float32"),
        (dict(input_ids=ids, token_type_ids=torch.full((2, 6), 2)),
         r"token_type_ids must lie in \[0, type_vocab_size=2\), got values from 2 to 2"),
        (dict(input_ids=ids, token_type_ids=torch.zeros(2, 5, dtype=torch.long)),
         r"token_type_ids has shape \(2, 5\), the input has shape \(2, 6\)"),
        (dict(input_ids=ids, position_ids=torch.full((2, 6), 24)),
         r"position_ids must lie in \[0, max_position_embeddings=24\), got values from 24 to 24"),
        (dict(input_ids=ids, position_ids=torch.arange(6)), r"position_ids has shape \(6,\), the input has shape"),
        (dict(inputs_embeds=torch.randn(2, 6, 31)), r"inputs_embeds must have shape \(batch, length, hidden_size=32\)"),
        (dict(inputs_embeds=torch.randn(2, 6, 32, dtype=torch.float64)),
         r"inputs_embeds has dtype torch.float64, the model's embeddings are torch.float32"),
        (dict(input_ids=ids, attention_mask=torch.full((2, 6), -10000.0)), r"additive masks"),
        (dict(input_ids=ids, attention_mask=torch.ones(2, 7)), r"attention_mask has shape \(2, 7\)"),
        (dict(input_ids=ids, inputs_embeds=torch.randn(2, 6, 32)), r"pass exactly one of input_ids and inputs_embeds"),
        (dict(input_ids=torch.randint(5, 97, (2, 25))), r"length 25 > max_position_embeddings=24"),
    ]


@pytest.mark.parametrize("kwargs,message", bad_inputs())
def test_bad_text_inputs_raise_value_errors_naming_the_field_and_the_numbers(kwargs, message):
    model = OrchidForMaskedLM(tiny_text_config())
    with pytest.raises(ValueError, match=message):
        model(**kwargs)


def test_bad_image_inputs_raise_value_errors():
    model = OrchidForImageClassification(tiny_image_config())
    with pytest.raises(ValueError, match=r"batch size 0"):
        model(pixel_values=torch.randn(0, 3, 16, 16))
    with pytest.raises(ValueError, match=r"\(batch, 3, 16, 16\).*got \(1, 3, 32, 32\)"):
        model(pixel_values=torch.randn(1, 3, 32, 32))


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(layer_norm_eps=math.nan), r"layer_norm_eps must be a finite number > 0, got nan"),
        (dict(initializer_range=math.inf), r"initializer_range must be a finite number > 0, got inf"),
        (dict(hidden_dropout_prob=math.nan), r"hidden_dropout_prob must be in \[0, 1\), got nan"),
        (dict(filter_sin_frequency=math.inf), r"filter_sin_frequency must be a finite number, got inf"),
        (dict(hidden_act="gelu_fancy"), r"hidden_act must be an activation transformers knows .*, got 'gelu_fancy'"),
        (dict(hidden_size=32.0), r"hidden_size must be a positive integer, got 32.0"),
        (dict(num_hidden_layers=True), r"num_hidden_layers must be a positive integer, got True"),
        (dict(filter_width=8.5), r"filter_width must be a positive integer, got 8.5"),
        (dict(max_position_embeddings=3, short_conv_size=5),
         r"short_conv_size=5 is longer than the input, max_position_embeddings=3"),
        (dict(conditioning_freq_kernel_size=25), r"conditioning_freq_kernel_size=25 is longer than the input"),
        (dict(residual_long_conv="no"), r"residual_long_conv must be True or False, got 'no'"),
    ],
)
def test_bad_config_values_raise_value_errors_naming_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_text_config(**overrides)


def test_block_diagonal_layers_are_plain_linear_modules():
    model = OrchidModel(tiny_text_config(mlp_num_blocks=4))
    up = model.encoder.layer[0].mlp.up_proj
    assert isinstance(up, BlockDiagonalLinear) and all(type(block) is nn.Linear for block in up.blocks)
