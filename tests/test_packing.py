"""Padding-free batches as transformers passes them (``DataCollatorWithFlattening``): several sequences packed in one
row with ``position_ids`` restarting at each (and, on request, ``cu_seq_lens_q/k`` or ``seq_idx``). Each packed
sequence is mixed alone: its outputs, loss and gradients are those of the same sequence in a padded batch."""

import pytest
import torch
from datasets import Dataset
from transformers import DataCollatorWithFlattening, Trainer, TrainingArguments

from orchid_hf import (
    OrchidForMaskedLM,
    OrchidForMultipleChoice,
    OrchidForQuestionAnswering,
    OrchidForSequenceClassification,
    OrchidForTokenClassification,
    OrchidModel,
)

from .test_long_inputs import long_config

LENGTHS = (37, 5, 130, 1, 64)  # across the transform lengths 128 and 256 of a 256-position model


def sequences(seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(5, 97, (length,), generator=generator).tolist() for length in LENGTHS]


def padded(rows: list[list[int]], left: bool = False) -> dict[str, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for row, tokens in enumerate(rows):
        place = slice(width - len(tokens), width) if left else slice(0, len(tokens))
        ids[row, place], mask[row, place] = torch.tensor(tokens), 1
    return {"input_ids": ids, "attention_mask": mask}


def flattened(rows: list[list[int]], **collator_options) -> dict[str, torch.Tensor]:
    batch = DataCollatorWithFlattening(**collator_options)([{"input_ids": tokens} for tokens in rows])
    batch.pop("labels", None)
    return batch


def per_sequence(output: torch.Tensor, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """Each sequence's rows of a per-token output, in order: the real positions of a padded batch, or the pieces of a
    packed row."""
    if "attention_mask" in inputs:
        return [row[mask.bool()] for row, mask in zip(output, inputs["attention_mask"])]
    return list(output[0].split(list(LENGTHS)))


@pytest.mark.parametrize("transform", ["dct", "fft"])
@pytest.mark.parametrize("head", [OrchidModel, OrchidForMaskedLM, OrchidForTokenClassification])
@pytest.mark.parametrize("options", [{}, {"return_flash_attn_kwargs": True}, {"return_seq_idx": True}],
                         ids=["position_ids", "cu_seq_lens", "seq_idx"])  # fmt: skip
def test_a_packed_row_gives_each_sequence_its_padded_batch_outputs(head, transform, options):
    torch.manual_seed(0)
    model = head(long_config(256, transform=transform, short_conv_size=5)).eval()
    rows = sequences()
    expected = padded(rows)
    packed = flattened(rows, **options)
    assert packed["input_ids"].shape == (1, sum(LENGTHS))
    with torch.no_grad():
        want = per_sequence(model(**expected)[0], expected)
        got = per_sequence(model(**packed)[0], packed)
    for sequence, (a, b) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=f"sequence {sequence}")


def test_a_packed_row_gives_the_loss_and_gradients_of_the_padded_batch():
    torch.manual_seed(0)
    model = OrchidForMaskedLM(long_config(256, hidden_dropout_prob=0.0))
    rows = sequences(1)
    generator = torch.Generator().manual_seed(1)
    labels = [[token if torch.rand((), generator=generator) < 0.3 else -100 for token in tokens] for tokens in rows]
    expected = padded(rows)
    expected["labels"] = torch.full_like(expected["input_ids"], -100)
    for row, tokens in enumerate(labels):
        expected["labels"][row, : len(tokens)] = torch.tensor(tokens)
    packed = flattened(rows)
    packed["labels"] = torch.tensor([sum(labels, [])])
    grads = []
    for inputs in (expected, packed):
        model.zero_grad()
        loss = model(**inputs).loss
        loss.backward()
        grads.append((loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}))
    torch.testing.assert_close(grads[1][0], grads[0][0], atol=1e-6, rtol=1e-6)
    for name, gradient in grads[0][1].items():
        torch.testing.assert_close(grads[1][1][name], gradient, atol=1e-5, rtol=1e-4, msg=name)


def test_heads_with_one_output_per_sequence_refuse_a_packed_row_naming_the_padded_path():
    rows = sequences()
    for head in (OrchidForSequenceClassification, OrchidForQuestionAnswering):
        model = head(long_config(256)).eval()
        for options in ({}, {"return_flash_attn_kwargs": True}, {"return_seq_idx": True}):
            with pytest.raises(ValueError, match=rf"{head.__name__} gives one output per sequence, and takes sequences "
                                                 r"as rows of a padded batch with an attention_mask"):
                model(**flattened(rows, **options))
    choice = OrchidForMultipleChoice(long_config(256)).eval()
    packed = flattened(rows)
    with pytest.raises(ValueError, match="OrchidForMultipleChoice gives one output per sequence"):
        choice(input_ids=packed["input_ids"].unsqueeze(1), position_ids=packed["position_ids"].unsqueeze(1))
    # One sequence with its own position_ids, not packed, is a sequence as any other.
    single = {"input_ids": torch.tensor([rows[0]]), "position_ids": torch.arange(len(rows[0])).unsqueeze(0)}
    OrchidForSequenceClassification(long_config(256)).eval()(**single)


def test_packed_rows_that_do_not_fit_or_do_not_add_up_are_refused():
    model = OrchidModel(long_config(128)).eval()
    rows = sequences()  # one of 130 tokens
    with pytest.raises(ValueError, match=r"position_ids must lie in \[0, max_position_embeddings=128\), got values "
                                         r"from 128 to 129"):
        model(**flattened(rows))
    bounds = flattened(rows, return_flash_attn_kwargs=True)["cu_seq_lens_q"]
    with pytest.raises(ValueError, match=r"a packed sequence has 130 tokens > max_position_embeddings=128 \(lengths "
                                         r"\[37, 5, 130, 1, 64\]\)"):
        model(input_ids=flattened(rows)["input_ids"], cu_seq_lens_q=bounds)
    short = [rows[0], rows[1]]
    packed = flattened(short, return_flash_attn_kwargs=True)
    with pytest.raises(ValueError, match=r"cu_seq_lens_q must rise from 0 to the row's length 42, got \[0, 37, 40\]"):
        model(input_ids=packed["input_ids"], cu_seq_lens_q=torch.tensor([0, 37, 40]))
    with pytest.raises(ValueError, match="come as a batch of one row without attention_mask; got a batch of 1 with"):
        model(input_ids=packed["input_ids"], attention_mask=torch.ones_like(packed["input_ids"]),
              cu_seq_lens_q=packed["cu_seq_lens_q"])  # fmt: skip


@pytest.mark.slow
def test_a_compiled_model_refuses_a_packed_row_it_would_mix_as_one():
    torch._dynamo.reset()  # the recompilations of earlier tests count towards the limit of fullgraph=True
    model = OrchidModel(long_config(256)).eval()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    packed = flattened(sequences()[:2])
    with pytest.raises(RuntimeError, match="position_ids restart within the row"):
        compiled(**packed)
    single = {"input_ids": torch.tensor([sequences()[0]]), "position_ids": torch.arange(37).unsqueeze(0)}
    torch.testing.assert_close(compiled(**single).last_hidden_state, model(**single).last_hidden_state)


@pytest.mark.slow
def test_trainer_fine_tunes_a_token_classifier_on_packed_rows(tmp_path, one_thread):
    """Trainer with DataCollatorWithFlattening, as its padding-free training is turned on: the token classifier
    learns (its loss falls) from rows of packed sequences."""
    torch.manual_seed(0)
    model = OrchidForTokenClassification(long_config(256, num_labels=2))
    generator = torch.Generator().manual_seed(0)
    features = []
    for _ in range(32):
        tokens = torch.randint(5, 97, (int(torch.randint(3, 40, (), generator=generator)),), generator=generator)
        features.append({"input_ids": tokens.tolist(), "labels": (tokens % 2).tolist()})  # parity: a per-token task
    arguments = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, num_train_epochs=6,
                                  learning_rate=3e-3, logging_steps=4, report_to="none", use_cpu=True,
                                  save_strategy="no", disable_tqdm=True)  # fmt: skip
    trainer = Trainer(model=model, args=arguments, train_dataset=Dataset.from_list(features),
                      data_collator=DataCollatorWithFlattening())  # fmt: skip
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses[-1] < 0.5 * losses[0], losses
