"""The question-answering and multiple-choice heads: losses as BERT's, label checks, transformers' keyword arguments,
padding on either side, Auto classes, remote code, and training with the Trainer on tokenized (question, context)
pairs as the run_qa recipe does."""

import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file
from torch.nn.functional import cross_entropy
from transformers import AutoModelForMultipleChoice, AutoModelForQuestionAnswering, Trainer, TrainingArguments

from orchid_hf import OrchidForMaskedLM, OrchidForMultipleChoice, OrchidForQuestionAnswering
from orchid_hf.tokenization import train_wordpiece_tokenizer

from .test_checkpoints import CORPUS, REMOTE_LOADER
from .test_models import tiny_text_config

# ---------------------------------------------------------------------------------------------
# Question answering
# ---------------------------------------------------------------------------------------------


def test_auto_classes_build_the_heads():
    assert type(AutoModelForQuestionAnswering.from_config(tiny_text_config())) is OrchidForQuestionAnswering
    assert type(AutoModelForMultipleChoice.from_config(tiny_text_config())) is OrchidForMultipleChoice


def test_question_answering_logits_and_span_loss():
    model = OrchidForQuestionAnswering(tiny_text_config()).eval()
    ids = torch.randint(5, 97, (3, 10))
    start, end = torch.tensor([1, 4, 0]), torch.tensor([2, 6, 9])
    output = model(ids, start_positions=start, end_positions=end)
    assert output.start_logits.shape == output.end_logits.shape == (3, 10)
    expected = (cross_entropy(output.start_logits, start) + cross_entropy(output.end_logits, end)) / 2
    torch.testing.assert_close(output.loss, expected)
    # (batch, 1) positions, as data-parallel gathers give them, mean the same.
    torch.testing.assert_close(model(ids, start_positions=start[:, None], end_positions=end[:, None]).loss, expected)
    assert model(ids).loss is None


def test_question_answering_positions_outside_the_input_are_clamped_and_ignored_as_in_bert():
    model = OrchidForQuestionAnswering(tiny_text_config()).eval()
    ids = torch.randint(5, 97, (3, 10))
    # Row 1's answer lies past the input (cut off by truncation): position >= 10 becomes 10, the ignore index.
    # A negative position is clamped to 0, the [CLS] token, as BertForQuestionAnswering does.
    start, end = torch.tensor([1, 25, -3]), torch.tensor([2, 40, 4])
    output = model(ids, start_positions=start, end_positions=end)
    kept = torch.tensor([0, 2])
    start_loss = cross_entropy(output.start_logits[kept], torch.tensor([1, 0]))
    end_loss = cross_entropy(output.end_logits[kept], torch.tensor([2, 4]))
    torch.testing.assert_close(output.loss, (start_loss + end_loss) / 2)


def test_question_answering_rejects_bad_positions():
    model = OrchidForQuestionAnswering(tiny_text_config())
    ids = torch.randint(5, 97, (2, 8))
    with pytest.raises(ValueError, match="start_positions was given without end_positions"):
        model(ids, start_positions=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="end_positions was given without start_positions"):
        model(ids, end_positions=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"end_positions has shape \(3,\), expected \(batch,\) = \(2,\)"):
        model(ids, start_positions=torch.tensor([1, 2]), end_positions=torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match=r"start_positions must hold integer positions, got torch.float32"):
        model(ids, start_positions=torch.tensor([1.0, 2.0]), end_positions=torch.tensor([1, 2]))


# ---------------------------------------------------------------------------------------------
# Multiple choice
# ---------------------------------------------------------------------------------------------


def test_multiple_choice_scores_each_choice_and_takes_a_cross_entropy_over_choices():
    model = OrchidForMultipleChoice(tiny_text_config()).eval()
    ids = torch.randint(5, 97, (2, 4, 9))
    labels = torch.tensor([3, 0])
    output = model(ids, labels=labels)
    assert output.logits.shape == (2, 4)
    torch.testing.assert_close(output.loss, cross_entropy(output.logits, labels))
    # A choice's score depends on that choice alone.
    with torch.no_grad():
        alone = model(ids[:, 2:3]).logits
    torch.testing.assert_close(alone[:, 0], output.logits[:, 2], atol=1e-5, rtol=1e-5)


def test_multiple_choice_rejects_bad_labels_and_shapes_naming_the_numbers():
    model = OrchidForMultipleChoice(tiny_text_config())
    ids = torch.randint(5, 97, (2, 3, 6))
    out_of_range = r"labels must lie in \[0, num_choices=3\) or be -100 \(no loss\), got values from "
    with pytest.raises(ValueError, match=out_of_range + "0 to 3"):
        model(ids, labels=torch.tensor([0, 3]))
    with pytest.raises(ValueError, match=out_of_range + "-1 to 2"):
        model(ids, labels=torch.tensor([-1, 2]))
    with pytest.raises(ValueError, match=r"labels has shape \(2, 3\), expected \(batch,\) = \(2,\)"):
        model(ids, labels=torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"labels must hold integer class ids, got torch.float32"):
        model(ids, labels=torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"input_ids must have shape \(batch, num_choices, length\), got \(2, 6\)"):
        model(ids[:, 0])
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(batch, num_choices, length\), got \(2, 6"):
        model(ids, attention_mask=torch.ones(2, 6))
    with pytest.raises(ValueError, match="pass exactly one of input_ids and inputs_embeds"):
        model()


# ---------------------------------------------------------------------------------------------
# transformers' keyword arguments
# ---------------------------------------------------------------------------------------------


def qa_inputs():
    return {"input_ids": torch.randint(5, 97, (2, 9))}


def mc_inputs():
    return {"input_ids": torch.randint(5, 97, (2, 3, 9))}


def first_logits(output):
    return output.start_logits if hasattr(output, "start_logits") else output.logits


@pytest.mark.parametrize(
    "cls,make_inputs", [(OrchidForQuestionAnswering, qa_inputs), (OrchidForMultipleChoice, mc_inputs)]
)
def test_heads_take_transformers_common_keyword_arguments(cls, make_inputs):
    model = cls(tiny_text_config()).eval()
    inputs = make_inputs()
    ids = inputs["input_ids"]
    with torch.no_grad():
        reference = model(**inputs)
        # Arguments with their neutral values change nothing.
        neutral = model(
            **inputs,
            token_type_ids=torch.zeros_like(ids),
            position_ids=torch.arange(ids.shape[-1]).expand_as(ids),
            attention_mask=torch.ones_like(ids),
            head_mask=None,
            output_attentions=False,
            return_dict=True,
        )
        embeds = model(inputs_embeds=model.get_input_embeddings()(ids))
        as_tuple = model(**inputs, return_dict=False)
        hidden = model(**inputs, output_hidden_states=True)
    for output in (neutral, embeds, hidden):
        torch.testing.assert_close(first_logits(output), first_logits(reference))
    assert isinstance(as_tuple, tuple)
    torch.testing.assert_close(as_tuple[0], first_logits(reference))
    assert len(hidden.hidden_states) == model.config.num_hidden_layers + 1
    with pytest.raises(ValueError, match="output_attentions=True: Orchid has no attention maps"):
        model(**inputs, output_attentions=True)
    with pytest.raises(ValueError, match="head_mask: Orchid has no attention heads to mask"):
        model(**inputs, head_mask=torch.ones(2, 4))


# ---------------------------------------------------------------------------------------------
# Padding on either side
# ---------------------------------------------------------------------------------------------


def pad(ids: torch.Tensor, length: int, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A row of ids padded with 0 to ``length`` on ``side``, and its attention mask."""
    padding = torch.zeros(length - ids.shape[-1], dtype=torch.long)
    mask = torch.cat([torch.ones_like(ids), padding])
    if side == "left":
        return torch.cat([padding, ids]), mask.flip(0)
    return torch.cat([ids, padding]), mask


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("transform", ["dct", "fft"])
def test_question_answering_logits_at_real_positions_do_not_depend_on_padding(side, transform):
    model = OrchidForQuestionAnswering(tiny_text_config(transform=transform)).eval()
    short, long = torch.randint(5, 97, (7,)), torch.randint(5, 97, (13,))
    with torch.no_grad():
        alone = model(short[None])
        for length in (13, 24):  # batched with a longer input, and padded to max_length
            padded, mask = pad(short, length, side)
            ids = torch.stack([padded, pad(long, length, side)[0]])
            masks = torch.stack([mask, pad(long, length, side)[1]])
            output = model(ids, attention_mask=masks)
            real = mask.bool()
            torch.testing.assert_close(output.start_logits[0, real], alone.start_logits[0], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(output.end_logits[0, real], alone.end_logits[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("pooling", ["first", "mean"])
def test_multiple_choice_scores_do_not_depend_on_padding(side, pooling):
    model = OrchidForMultipleChoice(tiny_text_config(classifier_pooling=pooling)).eval()
    choices = [torch.randint(5, 97, (length,)) for length in (5, 9, 7)]
    with torch.no_grad():
        alone = torch.cat([model(choice[None, None]).logits[0] for choice in choices])
        padded = [pad(choice, 12, side) for choice in choices]
        ids = torch.stack([ids for ids, _ in padded])[None]
        masks = torch.stack([mask for _, mask in padded])[None]
        batched = model(ids, attention_mask=masks).logits[0]
    torch.testing.assert_close(batched, alone, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------------------------
# Checkpoints: a masked-LM checkpoint as the start, remote code
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "auto_class,head_keys",
    [
        (AutoModelForQuestionAnswering, {"qa_outputs.weight", "qa_outputs.bias"}),
        (
            AutoModelForMultipleChoice,
            {"pooler.dense.weight", "pooler.dense.bias", "classifier.weight", "classifier.bias"},
        ),
    ],
)
def test_masked_lm_checkpoint_loads_initialising_only_the_head(auto_class, head_keys, tmp_path):
    mlm = OrchidForMaskedLM(tiny_text_config())
    mlm.save_pretrained(tmp_path)
    model, info = auto_class.from_pretrained(tmp_path, output_loading_info=True)
    assert set(info["missing_keys"]) == head_keys
    for name, tensor in mlm.orchid.state_dict().items():
        torch.testing.assert_close(model.orchid.state_dict()[name], tensor)


@pytest.mark.slow
def test_saved_heads_load_as_remote_code_without_orchid_hf(tmp_path, hf_modules_cache):
    heads = {
        "question_answering": (OrchidForQuestionAnswering, "AutoModelForQuestionAnswering", qa_inputs),
        "multiple_choice": (OrchidForMultipleChoice, "AutoModelForMultipleChoice", mc_inputs),
    }
    for name, (cls, _, make_inputs) in heads.items():
        model = cls(tiny_text_config()).eval()
        folder = tmp_path / name
        model.save_pretrained(folder)
        assert {"configuration_orchid.py", "modeling_orchid.py", "orchid_layers.py"} <= {
            path.name for path in folder.iterdir()
        }
        inputs = make_inputs()
        with torch.no_grad():
            output = model(**inputs)
        if name == "question_answering":  # the loader compares both logits, stacked
            expected = torch.stack([output.start_logits, output.end_logits])
        else:
            expected = output.logits
        save_file({**inputs, "expected": expected}, str(folder / "io.safetensors"))
    specs = [f"{name}:{auto_name}" for name, (_, auto_name, _) in heads.items()]
    result = subprocess.run(
        [sys.executable, "-c", REMOTE_LOADER, "orchid_hf", str(tmp_path), *specs],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # not the repository, whose orchid_hf/ folder would be importable from the cwd
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "remote-ok question_answering OrchidForQuestionAnswering" in result.stdout, result.stdout
    assert "remote-ok multiple_choice OrchidForMultipleChoice" in result.stdout, result.stdout


# ---------------------------------------------------------------------------------------------
# Training as run_qa does: tokenized (question, context) pairs, offsets, the Trainer
# ---------------------------------------------------------------------------------------------

QUESTIONS = [
    ("where did the cat sit", "the cat sat on the mat", "the mat"),
    ("where did the dog run", "a dog ran in the park", "the park"),
    ("what did my friend read", "my friend read a good book", "a good book"),
    ("where did the bird sing", "the bird sang in the tree", "the tree"),
]


def span_features(tokenizer, questions):
    """run_qa's preprocessing: the answer's character span mapped to token positions through the offsets."""
    encoded = tokenizer(
        [q for q, _, _ in questions],
        [c for _, c, _ in questions],
        padding="max_length",
        max_length=24,
        truncation="only_second",
        return_offsets_mapping=True,
    )
    features = []
    for row, (_, context, answer) in enumerate(questions):
        first_char = context.index(answer)
        last_char = first_char + len(answer)
        sequence_ids = encoded.sequence_ids(row)
        offsets = encoded["offset_mapping"][row]
        in_context = [i for i, s in enumerate(sequence_ids) if s == 1]
        start = next(i for i in in_context if offsets[i][0] == first_char)
        end = next(i for i in in_context if offsets[i][1] == last_char)
        features.append(
            {
                "input_ids": encoded["input_ids"][row],
                "token_type_ids": encoded["token_type_ids"][row],
                "attention_mask": encoded["attention_mask"][row],
                "start_positions": start,
                "end_positions": end,
            }
        )
    return encoded, features


@pytest.mark.slow
def test_trainer_learns_answer_spans_and_offsets_give_the_answer_text(tmp_path, one_thread):
    tokenizer = train_wordpiece_tokenizer(CORPUS, vocab_size=97)
    config = tiny_text_config(vocab_size=len(tokenizer))
    model = OrchidForQuestionAnswering(config)
    encoded, features = span_features(tokenizer, QUESTIONS)
    args = TrainingArguments(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=4,
        num_train_epochs=60,
        learning_rate=3e-3,
        optim="adamw_torch_fused",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=features)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses[-1] < 0.2 * losses[0], losses

    trainer.save_model(tmp_path / "qa")
    loaded = AutoModelForQuestionAnswering.from_pretrained(tmp_path / "qa").eval()
    batch = {key: torch.tensor(encoded[key]) for key in ("input_ids", "token_type_ids", "attention_mask")}
    with torch.no_grad():
        output = loaded(**batch)
    for row, (_, context, answer) in enumerate(QUESTIONS):
        # The best span inside the context, decoded to text through the offsets.
        in_context = torch.tensor([s == 1 for s in encoded.sequence_ids(row)])
        start = output.start_logits[row].masked_fill(~in_context, -1e9).argmax().item()
        end = output.end_logits[row].masked_fill(~in_context, -1e9).argmax().item()
        offsets = encoded["offset_mapping"][row]
        assert context[offsets[start][0] : offsets[end][1]] == answer
