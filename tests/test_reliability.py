"""What goes wrong when users pass bad inputs, labels, keywords or config edits: each gets a clear error (or works),
eager and compiled; dtype round trips leave no trace; peft's task types and transformers' keyword arguments work."""

import copy
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import peft
import pytest
import torch
from datasets import Dataset
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoConfig, Trainer, TrainingArguments

from orchid_hf import (
    OrchidConfig,
    OrchidForImageClassification,
    OrchidForMaskedLM,
    OrchidForSequenceClassification,
    OrchidForTokenClassification,
    OrchidModel,
)

from .test_models import TEXT_HEADS, tiny_image_config, tiny_text_config

ALL_HEADS = [*TEXT_HEADS, OrchidForImageClassification]


def main_output(output) -> torch.Tensor:
    return output.logits if hasattr(output, "logits") else output.last_hidden_state


def text_batch(batch: int = 2, length: int = 6) -> dict[str, torch.Tensor]:
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[-1, length - 2 :] = 0
    return {"input_ids": torch.randint(5, 97, (batch, length)), "attention_mask": mask}


def build(head, **overrides):
    config = tiny_image_config(**overrides) if head is OrchidForImageClassification else tiny_text_config(**overrides)
    return head(config).eval()


def model_inputs(head, batch: int = 2) -> dict[str, torch.Tensor]:
    if head is OrchidForImageClassification:
        return {"pixel_values": torch.randn(batch, 3, 16, 16)}
    return text_batch(batch)


# ---------------------------------------------------------------------------------------------
# Value checks under torch.compile and torch.export
# ---------------------------------------------------------------------------------------------

BAD_MASKS = {
    "additive": lambda mask: (1.0 - mask.float()) * -10000.0,
    "half": lambda mask: mask.float() * 0.5,
}


@pytest.mark.parametrize("kind", sorted(BAD_MASKS))
def test_eager_mask_check_names_the_values(kind):
    model = build(OrchidModel)
    inputs = text_batch()
    inputs["attention_mask"] = BAD_MASKS[kind](inputs["attention_mask"])
    expected = {"additive": r"got values from -10000.0 to -10000.0", "half": r"got values from 0.5 to 0.5"}[kind]
    with pytest.raises(ValueError, match=r"attention_mask must hold 1 for real tokens and 0 for padding.*" + expected):
        model(**inputs)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("kind", sorted(BAD_MASKS))
def test_compiled_model_rejects_masks_that_are_not_zero_or_one(backend, kind):
    torch._dynamo.reset()
    model = build(OrchidForSequenceClassification)
    compiled = torch.compile(model, backend=backend)
    inputs = text_batch()
    with torch.no_grad():
        torch.testing.assert_close(main_output(compiled(**inputs)), main_output(model(**inputs)))
        inputs["attention_mask"] = BAD_MASKS[kind](inputs["attention_mask"])
        with pytest.raises((ValueError, RuntimeError), match=r"attention_mask must hold 1 for real tokens and 0"):
            compiled(**inputs)


@pytest.mark.slow
@pytest.mark.parametrize(
    "field,value,message",
    [
        ("input_ids", 97, r"input_ids must lie in \[0, vocab_size=97\)"),
        ("input_ids", -1, r"input_ids must lie in \[0, vocab_size=97\)"),
        ("token_type_ids", 2, r"token_type_ids must lie in \[0, type_vocab_size=2\)"),
        ("position_ids", 24, r"position_ids must lie in \[0, max_position_embeddings=24\)"),
    ],
)
def test_compiled_model_is_one_graph_and_rejects_ids_out_of_range(field, value, message):
    # fullgraph: a check that broke the graph (.item(), a branch on a value) would fail to compile.
    torch._dynamo.reset()
    model = build(OrchidForMaskedLM)
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    inputs = text_batch()
    with torch.no_grad():
        torch.testing.assert_close(compiled(**inputs).logits, model(**inputs).logits)
        bad = torch.zeros_like(inputs["input_ids"]) if field != "input_ids" else inputs["input_ids"].clone()
        bad[0, 1] = value
        with pytest.raises((ValueError, RuntimeError), match=message):
            compiled(**(inputs | {field: bad}))


@pytest.mark.slow
def test_compiled_heads_reject_labels_out_of_range():
    torch._dynamo.reset()
    model = build(OrchidForTokenClassification)
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    inputs = text_batch()
    labels = torch.zeros_like(inputs["input_ids"])
    compiled(**inputs, labels=labels)
    labels[1, 2] = 50
    with pytest.raises((ValueError, RuntimeError), match=r"labels must lie in \[0, num_labels=3\)"):
        compiled(**inputs, labels=labels)


@pytest.mark.slow
def test_text_model_exports_and_the_exported_program_checks_its_inputs():
    model = build(OrchidForSequenceClassification)
    inputs = text_batch()
    program = torch.export.export(model, (inputs["input_ids"], inputs["attention_mask"]))
    exported = program.module()
    with torch.no_grad():
        expected = model(**inputs).logits
    torch.testing.assert_close(exported(inputs["input_ids"], inputs["attention_mask"]).logits, expected)
    with pytest.raises(RuntimeError, match=r"attention_mask must hold 1 for real tokens"):
        exported(inputs["input_ids"], BAD_MASKS["additive"](inputs["attention_mask"]))
    bad_ids = inputs["input_ids"].clone()
    bad_ids[0, 0] = 97
    with pytest.raises(RuntimeError, match=r"input_ids must lie in \[0, vocab_size=97\)"):
        exported(bad_ids, inputs["attention_mask"])


@pytest.mark.slow
def test_image_model_exports():
    model = build(OrchidForImageClassification)
    pixels = torch.randn(2, 3, 16, 16)
    exported = torch.export.export(model, (pixels,)).module()
    with torch.no_grad():
        torch.testing.assert_close(exported(pixels).logits, model(pixel_values=pixels).logits)


# ---------------------------------------------------------------------------------------------
# problem_type
# ---------------------------------------------------------------------------------------------


def test_an_unknown_problem_type_is_refused_at_construction():
    with pytest.raises(ValueError, match=r"problem_type='regresion'.*'regression'.*'single_label_classification'"
                                         r".*'multi_label_classification'"):
        tiny_text_config(problem_type="regresion")


@pytest.mark.parametrize("head", [OrchidForSequenceClassification, OrchidForImageClassification])
def test_an_unknown_problem_type_set_later_is_refused_by_the_loss(head):
    model = build(head)
    model.config.problem_type = "regresion"
    with pytest.raises(ValueError, match=r"problem_type='regresion'.*'regression'"):
        model(**model_inputs(head), labels=torch.rand(2, 3 if head is not OrchidForImageClassification else 5))


# ---------------------------------------------------------------------------------------------
# Labels: shape and class range, with the numbers
# ---------------------------------------------------------------------------------------------


def test_token_classification_refuses_transposed_labels():
    model = build(OrchidForTokenClassification)
    inputs = text_batch(batch=2, length=6)
    labels = torch.randint(0, 3, (6, 2))
    with pytest.raises(ValueError, match=r"labels has shape \(6, 2\), expected \(batch, length\) = \(2, 6\)"):
        model(**inputs, labels=labels)


@pytest.mark.parametrize(
    "head,field,count",
    [
        (OrchidForTokenClassification, "num_labels", 3),
        (OrchidForSequenceClassification, "num_labels", 3),
        (OrchidForImageClassification, "num_labels", 5),
        (OrchidForMaskedLM, "vocab_size", 97),
    ],
)
def test_labels_outside_the_classes_name_the_label_and_the_count(head, field, count):
    model = build(head)
    inputs = model_inputs(head)
    shape = inputs["input_ids"].shape if head in (OrchidForTokenClassification, OrchidForMaskedLM) else (2,)
    labels = torch.zeros(shape, dtype=torch.long)
    labels.view(-1)[-1] = 150
    with pytest.raises(ValueError, match=rf"labels must lie in \[0, {field}={count}\).*got values from 0 to 150"):
        model(**inputs, labels=labels)
    labels.view(-1)[-1] = -3
    with pytest.raises(ValueError, match=r"got values from -3 to 0"):
        model(**inputs, labels=labels)


@pytest.mark.parametrize("head", [OrchidForTokenClassification, OrchidForSequenceClassification, OrchidForMaskedLM])
def test_minus_100_still_marks_labels_without_a_loss(head):
    model = build(head)
    inputs = model_inputs(head)
    shape = inputs["input_ids"].shape if head is not OrchidForSequenceClassification else (2,)
    labels = torch.randint(0, 3, shape)
    ignored = labels.clone()
    ignored.view(-1)[0] = -100
    out = model(**inputs, labels=ignored)
    logits = out.logits.reshape(-1, out.logits.shape[-1])
    kept = ignored.view(-1) != -100
    expected = torch.nn.functional.cross_entropy(logits[kept], labels.view(-1)[kept])
    torch.testing.assert_close(out.loss, expected)


@pytest.mark.parametrize("head", [OrchidForSequenceClassification, OrchidForImageClassification])
def test_regression_and_multi_label_targets_of_the_wrong_shape_are_refused(head):
    regression = build(head, num_labels=1)
    with pytest.raises(ValueError, match=r"labels has shape \(2, 2\), expected \(batch,\) = \(2,\)"):
        regression(**model_inputs(head), labels=torch.rand(2, 2))
    regression(**model_inputs(head), labels=torch.rand(2))
    regression(**model_inputs(head), labels=torch.rand(2, 1))
    multi = build(head, problem_type="multi_label_classification")
    classes = multi.config.num_labels
    expected = rf"labels has shape \(2,\), expected \(batch, num_labels\) = \(2, {classes}\)"
    with pytest.raises(ValueError, match=expected):
        multi(**model_inputs(head), labels=torch.rand(2))
    with pytest.raises(ValueError, match=rf"labels has shape \({classes}, 2\)"):
        multi(**model_inputs(head), labels=torch.rand(classes, 2))
    with pytest.raises(ValueError, match=r"multi-label targets must lie in \[0, 1\], got values from .* to 3.0"):
        multi(**model_inputs(head), labels=torch.full((2, classes), 3.0))
    multi(**model_inputs(head), labels=torch.rand(2, classes))


@pytest.mark.parametrize("head", [OrchidForSequenceClassification, OrchidForImageClassification])
def test_single_label_classification_refuses_labels_of_the_wrong_shape(head):
    model = build(head)
    with pytest.raises(ValueError, match=r"labels has shape \(2, 2\), expected \(batch,\) = \(2,\)"):
        model(**model_inputs(head), labels=torch.zeros(2, 2, dtype=torch.long))


def test_masked_lm_labels_of_the_wrong_shape_are_refused():
    model = build(OrchidForMaskedLM)
    inputs = text_batch(batch=2, length=6)
    with pytest.raises(ValueError, match=r"labels has shape \(6, 2\), expected \(batch, length\) = \(2, 6\)"):
        model(**inputs, labels=torch.zeros(6, 2, dtype=torch.long))


# ---------------------------------------------------------------------------------------------
# Misspelt keywords
# ---------------------------------------------------------------------------------------------


def test_a_misspelt_preset_override_names_the_closest_field():
    with pytest.raises(ValueError, match=r"hidden_sizee.*did you mean 'hidden_size'"):
        OrchidConfig.from_preset("orchid-bert-base", hidden_sizee=64)
    with pytest.raises(ValueError, match=r"'no_such_setting' is not a field of OrchidConfig"):
        OrchidConfig.from_preset("orchid-recall", no_such_setting=1)


def test_preset_overrides_that_transformers_takes_still_work():
    config = OrchidConfig.from_preset("orchid-recall", num_labels=4, problem_type="regression", transform="fft",
                                      torch_dtype="float32", output_attentions=False, finetuning_task="sst2")
    assert (config.num_labels, config.problem_type, config.transform) == (4, "regression", "fft")
    assert config.finetuning_task == "sst2"


def test_a_misspelt_constructor_keyword_warns_with_the_closest_field():
    with pytest.warns(UserWarning, match=r"hidden_sizee.*did you mean 'hidden_size'"):
        config = OrchidConfig(hidden_sizee=64)
    assert config.hidden_size == 768  # transformers keeps unknown keywords as attributes, on purpose
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = OrchidConfig(my_custom_field=1)  # nothing like a field: a custom attribute, no warning
    assert config.my_custom_field == 1
    assert not [warning for warning in caught if "did you mean" in str(warning.message)]


# ---------------------------------------------------------------------------------------------
# Buffers derived from the config, through dtype casts
# ---------------------------------------------------------------------------------------------


def derived_buffers(model) -> dict[str, torch.Tensor]:
    return dict(model.named_buffers())


@pytest.mark.parametrize("head", [OrchidForMaskedLM, OrchidForImageClassification])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dtype_round_trips_leave_the_derived_buffers_exact(head, dtype, tmp_path):
    model = build(head)
    reference = {name: buffer.clone() for name, buffer in derived_buffers(model).items()}
    assert reference and all(buffer.dtype == torch.float32 for buffer in reference.values())
    model.to(dtype)
    assert all(buffer.dtype == torch.float32 for buffer in derived_buffers(model).values())
    model.to(torch.float32)
    for name, buffer in derived_buffers(model).items():
        assert torch.equal(buffer, reference[name]), name
    # The red-team's case: saved and reloaded, the model gives the same outputs.
    model.save_pretrained(tmp_path)
    reloaded = head.from_pretrained(tmp_path).eval()
    inputs = model_inputs(head)
    with torch.no_grad():
        assert torch.equal(main_output(model(**inputs)), main_output(reloaded(**inputs)))


@pytest.mark.parametrize("head", [OrchidForMaskedLM, OrchidForImageClassification])
def test_derived_buffers_are_not_saved_and_half_precision_loads_run(head, tmp_path):
    model = build(head)
    model.save_pretrained(tmp_path)
    assert not any(name in model.state_dict() for name in derived_buffers(model))
    loaded = head.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    assert loaded.get_input_embeddings().weight.dtype == torch.bfloat16
    fresh = build(head)
    for name, buffer in derived_buffers(loaded).items():
        assert buffer.dtype == torch.float32 and torch.equal(buffer, dict(fresh.named_buffers())[name]), name
    with torch.no_grad():
        out = main_output(loaded(**model_inputs(head)))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()


# ---------------------------------------------------------------------------------------------
# Config edits after a model was built
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field,value", [("transform", "fft"), ("hidden_size", 64), ("num_hidden_layers", 3), ("mlp_type", "mlp"),
                    ("filter_width", 16), ("layer_norm_eps", 1e-5), ("classifier_pooling", "mean"),
                    ("hidden_dropout_prob", 0.2)],
)
def test_editing_a_setting_the_model_was_built_with_changes_nothing_and_is_refused_at_save(field, value, tmp_path):
    """The modules take their settings when they are built and never read the config in forward: the model runs as
    built. Saved, the config would describe another model: save_pretrained refuses it."""
    model = build(OrchidForSequenceClassification)
    inputs = text_batch()
    with torch.no_grad():
        expected = model(**inputs).logits
    before = getattr(model.config, field)
    setattr(model.config, field, value)
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits, expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match=rf"config.{field}={value!r} .* built with {field}={before!r}"):
        model.save_pretrained(tmp_path)
    assert not list(tmp_path.iterdir())
    # A new model from the edited config is what the user meant.
    OrchidForSequenceClassification(copy.deepcopy(model.config))(**text_batch())


def test_editing_num_labels_of_a_built_classifier_is_refused_at_save(tmp_path):
    model = build(OrchidForSequenceClassification)
    model.config.num_labels = 5
    assert model(**text_batch()).logits.shape == (2, 3)
    with pytest.raises(ValueError, match=r"config.num_labels=5 .* classifier has 3 outputs"):
        model.save_pretrained(tmp_path)


def test_the_config_edits_of_transformers_and_users_still_work():
    model = build(OrchidForSequenceClassification)
    model.config.id2label = {0: "a", 1: "b", 2: "c"}
    model.config.label2id = {"a": 0, "b": 1, "c": 2}
    model.config.pad_token_id = 1
    model.config.use_cache = False
    model.config.output_hidden_states = True
    model.config.return_dict = False
    out = model(**text_batch())
    assert isinstance(out, tuple) and len(out[1]) == 3
    model.config.return_dict = True
    model.resize_token_embeddings(120)
    assert model.config.vocab_size == 120
    model(input_ids=torch.full((1, 4), 110))
    # Replacing the classifier together with num_labels, as users do.
    model.classifier = torch.nn.Linear(32, 5)
    model.config.num_labels = 5
    assert model(**text_batch()).logits.shape == (2, 5)


# ---------------------------------------------------------------------------------------------
# transformers' keyword arguments; peft with a task type
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("head", ALL_HEADS)
def test_every_head_takes_the_keyword_arguments_transformers_passes(head):
    model = build(head)
    inputs = model_inputs(head)
    out = model(**inputs, output_attentions=False, output_hidden_states=True, return_dict=True)
    assert len(out.hidden_states) == model.config.num_hidden_layers + 1
    assert getattr(out, "attentions", None) is None
    as_tuple = model(**inputs, output_attentions=None, return_dict=False)
    torch.testing.assert_close(as_tuple[0], main_output(out))
    with pytest.raises(ValueError, match=r"output_attentions=True: Orchid has no attention maps"):
        model(**inputs, output_attentions=True)


def test_a_keyword_no_model_takes_is_ignored_as_bert_ignores_it_with_a_warning(caplog):
    model = build(OrchidModel)
    inputs = text_batch()
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
        with caplog.at_level("WARNING"):
            got = model(**inputs, attention_maskk=None, num_items_in_batch=torch.tensor(4)).last_hidden_state
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert "ignores the keyword arguments ['attention_maskk']" in caplog.text


@pytest.mark.parametrize("head", TEXT_HEADS)
def test_text_heads_refuse_what_an_encoder_without_heads_cannot_do(head):
    model = build(head)
    inputs = text_batch()
    model(**inputs, head_mask=None, use_cache=False, encoder_hidden_states=None)
    with pytest.raises(ValueError, match=r"head_mask: Orchid has no attention heads"):
        model(**inputs, head_mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"encoder_hidden_states: Orchid is an encoder"):
        model(**inputs, encoder_hidden_states=torch.randn(2, 6, 32))
    packed_rule = (r"gives one output per sequence" if head is OrchidForSequenceClassification else
                   r"sequences packed in one row \(cu_seq_lens_q, cu_seq_lens_k, seq_idx\) come as a batch of one row "
                   r"without attention_mask; got a batch of 2 with an attention_mask")  # fmt: skip
    with pytest.raises(ValueError, match=packed_rule):
        model(**inputs, cu_seq_lens_q=torch.tensor([0, 3, 6]))


@pytest.mark.slow
def test_trainer_keeps_dividing_the_loss_by_gradient_accumulation_steps():
    model = build(OrchidForSequenceClassification)
    assert model.accepts_loss_kwargs is False


@pytest.mark.slow
@pytest.mark.parametrize(
    "task_type,head",
    [
        (peft.TaskType.SEQ_CLS, OrchidForSequenceClassification),
        (peft.TaskType.TOKEN_CLS, OrchidForTokenClassification),
        (peft.TaskType.FEATURE_EXTRACTION, OrchidModel),
    ],
)
def test_peft_lora_with_a_task_type_trains(task_type, head, tmp_path, one_thread):
    torch.manual_seed(0)
    model = build(head)
    config = peft.LoraConfig(task_type=task_type, r=4, target_modules=["in_proj", "out_proj"])
    wrapped = peft.get_peft_model(model, config)
    inputs = text_batch()
    out = wrapped(**inputs, output_hidden_states=True)
    assert len(out.hidden_states) == 3
    main_output(out).square().mean().backward()
    lora = [p for name, p in wrapped.named_parameters() if "lora_B" in name]
    assert lora and all(p.grad is not None for p in lora)
    with pytest.raises(ValueError, match=r"output_attentions=True: Orchid has no attention maps"):
        wrapped(**inputs, output_attentions=True)
    if head is OrchidModel:
        return
    rows = []
    for _ in range(8):
        ids = torch.randint(5, 97, (6,))
        label = torch.randint(0, 3, (6,) if head is OrchidForTokenClassification else ()).tolist()
        rows.append({"input_ids": ids.tolist(), "attention_mask": [1] * 6, "labels": label})
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=4, max_steps=2,
                             learning_rate=1e-2, save_strategy="no")
    before = {name: p.detach().clone() for name, p in wrapped.named_parameters() if p.requires_grad}
    Trainer(model=wrapped, args=args, train_dataset=Dataset.from_list(rows)).train()
    assert any(not torch.equal(before[name], p) for name, p in wrapped.named_parameters() if p.requires_grad)


def test_editing_vocab_size_without_resizing_the_embeddings_is_refused_at_save(tmp_path):
    model = build(OrchidForMaskedLM)
    model.config.vocab_size = 120
    with pytest.raises(ValueError, match=r"input_ids must lie in \[0, vocab_size=97\), got values from 110 to 110"):
        model(input_ids=torch.full((1, 4), 110))
    with pytest.raises(ValueError, match=r"config.vocab_size=120 but the word embeddings have 97 rows"):
        model.save_pretrained(tmp_path)
    assert not list(tmp_path.iterdir())


def test_single_label_classification_refuses_float_labels():
    model = build(OrchidForSequenceClassification, problem_type="single_label_classification")
    with pytest.raises(ValueError, match=r"labels must hold integer class ids, got torch.float32"):
        model(**text_batch(), labels=torch.tensor([0.0, 1.0]))


def test_a_mask_with_nan_is_refused():
    model = build(OrchidModel)
    inputs = text_batch()
    inputs["attention_mask"] = inputs["attention_mask"].float()
    inputs["attention_mask"][0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"attention_mask must hold 1 for real tokens and 0 for padding"):
        model(**inputs)


def test_a_misspelt_operator_setting_names_the_closest_setting():
    from orchid_hf import OrchidOperator

    with pytest.raises(ValueError, match=r"unknown settings \['transfrom'\]; did you mean 'transform'"):
        OrchidOperator(16, 8, transfrom="fft")


def test_inputs_of_the_other_modality_are_refused():
    image_model = OrchidModel(tiny_image_config()).eval()
    with pytest.raises(ValueError, match=r"image model .*\['attention_mask'\] do not apply"):
        image_model(pixel_values=torch.randn(2, 3, 16, 16), attention_mask=torch.ones(2, 16))
    text_model = build(OrchidModel)
    with pytest.raises(ValueError, match=r"text model .*pixel_values do not apply"):
        text_model(**text_batch(), pixel_values=torch.randn(2, 3, 16, 16))


# ---------------------------------------------------------------------------------------------
# Checks once, at the boundary
# ---------------------------------------------------------------------------------------------


class HostReads(TorchDispatchMode):
    """Counts the operations that read a tensor's value on the host (``.item()``, ``bool(tensor)``, a boolean index):
    on a GPU each one waits for every kernel queued before it."""

    READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default)

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func in self.READS
        return func(*args, **(kwargs or {}))


def host_reads(model, **inputs) -> int:
    """How many times a call reads tensor values on the host: the dispatched reads, and ``tolist()``, which copies a
    tensor's values without going through the dispatcher."""
    tolist = torch.Tensor.tolist
    with HostReads() as reads, pytest.MonkeyPatch.context() as patch:

        def counted(tensor):
            reads.count += 1
            return tolist(tensor)

        patch.setattr(torch.Tensor, "tolist", counted)
        model(**inputs)
    return reads.count


@pytest.mark.parametrize("padding", ["right", "left"])
def test_a_forward_reads_values_on_the_host_as_often_whatever_the_depth(padding):
    """The model checks its inputs and lays out the padding once per call; its layers read no value on the host.
    With labels, the head checks them once more."""
    inputs = text_batch(3, 10)
    if padding == "left":
        inputs["attention_mask"] = inputs["attention_mask"].flip(1)
    counts = {}
    for layers in (1, 2, 8):
        torch.manual_seed(0)
        model = OrchidForSequenceClassification(tiny_text_config(num_hidden_layers=layers)).eval()
        counts[layers] = (host_reads(model, **inputs), host_reads(model, **inputs, labels=torch.tensor([0, 1, 2])))
    assert counts[1] == counts[2] == counts[8]
    # input_ids' range, the mask's values, the layout (each row's length and whether the rows need reordering, in one
    # read); the labels' range.
    assert counts[1] == (3, 4)


def test_an_operator_inside_the_model_neither_checks_nor_reorders_its_input():
    model = OrchidModel(tiny_text_config(num_hidden_layers=2)).eval()
    mixer = model.encoder.layer[0].mixer
    inputs = text_batch(3, 10)
    inputs["attention_mask"][0, :3] = 0
    with torch.no_grad():
        alone = host_reads(mixer, x=torch.randn(3, 10, 32), attention_mask=inputs["attention_mask"])
    assert alone == 2  # on its own: the mask's values and the layout of its rows
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(mixer), "_check_inputs", lambda *args: pytest.fail("checked inside the model"))
        model(**inputs)


# ---------------------------------------------------------------------------------------------
# Loading overrides: the rules of construction
# ---------------------------------------------------------------------------------------------

# A value that the constructor refuses, for every field it checks, and the words of its message.
BAD_FIELD_VALUES = {
    "hidden_size": (0, "hidden_size must be a positive integer"),
    "num_hidden_layers": (2.5, "num_hidden_layers must be a positive integer"),
    "intermediate_size": ("64", "intermediate_size must be a positive integer"),
    "max_position_embeddings": (-1, "max_position_embeddings must be a positive integer"),
    "type_vocab_size": (-1, "type_vocab_size must be a non-negative integer"),
    "chunk_size_feed_forward": (2.5, "chunk_size_feed_forward must be a non-negative integer"),
    "mlp_type": ("gated", "mlp_type must be one of"),
    "classifier_pooling": ("max", "classifier_pooling must be one of"),
    "hidden_act": ("gelux", "hidden_act must be an activation transformers knows"),
    "hidden_dropout_prob": (1.5, "hidden_dropout_prob must be in"),
    "layer_norm_eps": (-1.0, "layer_norm_eps must be a finite number > 0"),
    "initializer_range": (float("nan"), "initializer_range must be a finite number > 0"),
    "mlp_num_blocks": (5, "must be divisible by mlp_num_blocks=5"),
    "transform": ("dft", "transform must be one of"),
    "conditioning": ("dot", "conditioning must be one of"),
    "short_conv_size": (4, "short_conv_size must be a positive odd integer"),
    "filter_width": (0, "filter_width must be a positive integer"),
    "data_dependent": ("yes", "data_dependent must be True or False"),
    "transform_lengths": ([8, 16], "transform_lengths must end at the longest input"),
    "filter_lag_scale": (0, "filter_lag_scale must be a positive integer or None"),
    "layer_types": (["orchid", "convolution"], "layer_types must be a list of"),
    "pad_token_id": (500, "pad_token_id=500 is outside vocab_size=97"),
}


@pytest.mark.parametrize("field", sorted(BAD_FIELD_VALUES))
def test_a_loading_override_meets_the_rules_of_the_constructor(field, tmp_path):
    """transformers sets from_pretrained's overrides after the config is built; they are checked as the constructor
    checks its fields, with the same ValueError."""
    value, message = BAD_FIELD_VALUES[field]
    with pytest.raises(ValueError, match=re.escape(message)):
        tiny_text_config(**{field: value})
    OrchidForMaskedLM(tiny_text_config()).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=re.escape(message)):
        OrchidForMaskedLM.from_pretrained(tmp_path, **{field: value})
    with pytest.raises(ValueError, match=re.escape(message)):
        AutoConfig.from_pretrained(tmp_path, **{field: value})


def test_loading_overrides_of_a_hybrid_image_model_keep_its_layer_types_and_layers_in_step(tmp_path):
    config = tiny_image_config(image_mixer="2d", layer_types="orchid-first", num_hidden_layers=3)
    OrchidForImageClassification(config).save_pretrained(tmp_path)
    # Two layers for three layer types: which layer goes is the user's to say.
    with pytest.raises(ValueError, match=r"layer_types has 3 entries, num_hidden_layers=2"):
        OrchidForImageClassification.from_pretrained(tmp_path, num_hidden_layers=2)
    # A short form of layer_types, as the constructor takes it: one entry per layer.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = OrchidForImageClassification.from_pretrained(tmp_path, layer_types="orchid")
    assert model.config.layer_types == ["orchid"] * 3 and len(model.orchid.encoder.layer) == 3
    types = {type(layer.mixer).__name__ for layer in model.orchid.encoder.layer}
    assert types == {"OrchidOperator2d"}
    both = OrchidForImageClassification.from_pretrained(tmp_path, num_hidden_layers=2, layer_types="alternate")
    assert both.config.layer_types == ["orchid", "full_attention"] and len(both.orchid.encoder.layer) == 2


@pytest.mark.parametrize("kind", ["numpy", "list"])
def test_inputs_that_are_not_tensors_are_refused_by_name(kind):
    model = build(OrchidForSequenceClassification)
    inputs = text_batch()
    convert = (lambda tensor: tensor.numpy()) if kind == "numpy" else (lambda tensor: tensor.tolist())
    name = "numpy.ndarray" if kind == "numpy" else "builtins.list"
    for field in ("attention_mask", "input_ids"):
        with pytest.raises(ValueError, match=rf"{field} must be a torch.Tensor, got {re.escape(name)}"):
            model(**{**inputs, field: convert(inputs[field])})
    with pytest.raises(ValueError, match=rf"labels must be a torch.Tensor, got {re.escape(name)}"):
        model(**inputs, labels=convert(torch.tensor([0, 1])))
    operator = model.orchid.encoder.layer[0].mixer
    with pytest.raises(ValueError, match=rf"attention mask for x must be a torch.Tensor, got {re.escape(name)}"):
        operator(torch.randn(2, 6, 32), convert(inputs["attention_mask"]))


def test_jit_trace_and_the_legacy_onnx_exporter_are_refused_with_the_tracers_that_work(tmp_path):
    """torch.jit.trace would freeze the traced batch's padding layout (a left-padded batch then comes out wrong, a
    longer one crashes); the legacy ONNX exporter runs it."""
    model = build(OrchidModel)
    inputs = text_batch()
    with pytest.raises(ValueError, match=r"torch.jit.trace .* use torch.export.export, torch.onnx.export\(\.\.\., "
                                         r"dynamo=True\)"):
        torch.jit.trace(model, (inputs["input_ids"], inputs["attention_mask"]), strict=False)
    with pytest.raises(ValueError, match="torch.jit.trace"):
        torch.onnx.export(model, (inputs["input_ids"], inputs["attention_mask"]), tmp_path / "m.onnx", dynamo=False)
    operator = model.encoder.layer[0].mixer
    with pytest.raises(ValueError, match="torch.jit.trace"):
        torch.jit.trace(operator, (torch.randn(2, 6, 32), inputs["attention_mask"]))


@pytest.mark.slow
def test_a_plain_pytest_without_transformers_tests_skips_their_file_with_the_command(tmp_path):
    """transformers' common tests are fetched by `make transformers-tests`: a plain `pytest` on a fresh checkout skips
    their file naming the command, and `make test` (ORCHID_REQUIRE_TRANSFORMERS_TESTS) fails without them."""
    file = Path(__file__).parent / "test_transformers_common.py"
    environment = {**os.environ, "ORCHID_TRANSFORMERS_TESTS": str(tmp_path / "absent")}
    environment.pop("ORCHID_REQUIRE_TRANSFORMERS_TESTS", None)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(file)]
    skipped = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=300)
    # pytest's exit status 5: no test was collected (the file was skipped whole).
    assert skipped.returncode == 5, skipped.stdout + skipped.stderr
    assert "1 skipped" in skipped.stdout and "`make transformers-tests` fetches them" in skipped.stdout
    required = subprocess.run(command, capture_output=True, text=True, timeout=300,
                              env={**environment, "ORCHID_REQUIRE_TRANSFORMERS_TESTS": "1"})
    assert required.returncode != 0 and "`make transformers-tests` fetches them" in required.stdout
