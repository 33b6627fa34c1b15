"""Associative recall: the data generator, the models (the product's own classes), every flag of the script, and
that the orchid-recall preset learns the task."""

import importlib.util
import itertools
import json
import math
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import BertForMaskedLM, GPT2LMHeadModel

from experiments.recall import (
    BLOCKS,
    RecallConfig,
    ShiftedEmbedding,
    build_model,
    check_answers,
    earlier_positions_changed,
    evaluate,
    generate_batch,
    held_out_set,
    most_frequent_value,
    next_token_labels,
    objective_loss,
    plateau_accuracy,
    query_logits,
    render_page,
    results_table,
    sinusoids,
    train,
)
from orchid_hf import OrchidConfig, OrchidForMaskedLM

pytestmark = pytest.mark.usefixtures("one_thread")

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "associative_recall.py"
TINY = ["--vocab_size", "8", "--seq_len", "16", "--hidden_size", "16", "--steps", "2", "--batch_size", "4",
        "--eval_every", "2", "--eval_size", "8", "--no_progress"]  # fmt: skip


def load_script():
    spec = importlib.util.spec_from_file_location("associative_recall_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("vocab_size,seq_len", [(20, 128), (30, 128), (40, 64), (4, 5), (20, 33)])
def test_every_answer_is_the_query_keys_value(vocab_size, seq_len):
    inputs, targets = generate_batch(500, vocab_size, seq_len, torch.Generator().manual_seed(1))
    assert inputs.shape == (500, seq_len) and targets.shape == (500,)
    assert check_answers(inputs, targets, vocab_size)


def test_next_token_labels_are_the_following_tokens_then_the_answer():
    inputs, targets = generate_batch(50, 20, 16, torch.Generator().manual_seed(3))  # one start token, 7 pairs
    labels = next_token_labels(inputs, targets, 20)
    assert labels.shape == inputs.shape
    assert torch.equal(labels[:, :-1], inputs[:, 1:]) and torch.equal(labels[:, -1], targets)
    no_start = next_token_labels(*generate_batch(5, 20, 15, torch.Generator().manual_seed(3)), 20)
    assert (no_start != -100).all()  # 15 tokens: 7 pairs and the query, no start token
    inputs[:, :2] = 20  # a second start token: the label before it is ignored
    assert (next_token_labels(inputs, targets, 20)[:, 0] == -100).all()


def test_the_next_token_loss_averages_every_position():
    config = RecallConfig(vocab_size=8, seq_len=16, hidden_size=16, objective="next_token")
    torch.manual_seed(0)
    model = build_model(config)
    inputs, targets = generate_batch(4, 8, 16, torch.Generator().manual_seed(4))
    logits = model(input_ids=inputs).logits
    labels = torch.cat([inputs[:, 1:], targets[:, None]], dim=1)
    expected = torch.stack([F.cross_entropy(logits[b, t], labels[b, t]) for b in range(4) for t in range(16)]).mean()
    torch.testing.assert_close(objective_loss(model, inputs, targets, config), expected)
    query = RecallConfig(vocab_size=8, seq_len=16, hidden_size=16)
    torch.testing.assert_close(objective_loss(model, inputs, targets, query), F.cross_entropy(logits[:, -1], targets))


@pytest.mark.parametrize("model,changed", [("gpt2", 0.0), ("orchid", 1.0), ("static", 1.0), ("transformer", 1.0)])
def test_only_the_gpt2_model_is_causal(model, changed):
    # The conditioning network reads the spectrum of the whole sequence and the DCT's kernel is even, so every Orchid
    # output depends on later tokens; BertForMaskedLM attends both ways. GPT-2's outputs before a token never move.
    config = RecallConfig(model=model, vocab_size=8, seq_len=16, hidden_size=16)
    torch.manual_seed(0)
    inputs, _ = generate_batch(20, 8, 16, torch.Generator().manual_seed(5))
    assert earlier_positions_changed(build_model(config), inputs, 8) == changed


class NextTokenOracle(torch.nn.Module):
    """Reads the next token off its input and predicts it (the query's value is beyond its reach: it predicts
    the token after the vocabulary's first value)."""

    def forward(self, input_ids):
        following = torch.cat([input_ids[:, 1:], torch.full_like(input_ids[:, :1], 4)], dim=1)
        return type("Output", (), {"logits": F.one_hot(following, 9).float()})


def test_next_key_accuracy_measures_reading_the_following_tokens():
    inputs, targets = generate_batch(40, 8, 16, torch.Generator().manual_seed(6))
    oracle = evaluate(NextTokenOracle(), inputs, targets, 8)
    assert oracle["next_key_accuracy"] == 1.0
    assert oracle["accuracy"] == (targets == 4).sum().item() / len(targets)
    torch.manual_seed(0)
    causal = evaluate(build_model(RecallConfig(model="gpt2", vocab_size=8, seq_len=16, hidden_size=16)), inputs,
                      targets, 8)  # fmt: skip
    assert causal["next_key_accuracy"] < 0.6


def test_keys_and_values_come_from_disjoint_halves():
    vocab_size, half = 20, 10
    inputs, targets = generate_batch(300, vocab_size, 128, torch.Generator().manual_seed(2))
    body = inputs[:, 1:-1]  # seq_len 128: one start token, 63 pairs, the query
    assert (inputs[:, 0] == vocab_size).all()
    assert (body[:, 0::2] < half).all() and (body[:, 1::2] >= half).all() and (body[:, 1::2] < vocab_size).all()
    assert (inputs[:, -1] < half).all() and (targets >= half).all() and (targets < vocab_size).all()
    # Each sequence has its own dictionary: the same key maps to different values across sequences.
    first_key_values = {(row[1], row[2]) for row in inputs[:, :3].tolist()}
    assert len({v for k, v in first_key_values if k == inputs[0, 1].item()}) > 1


def test_a_wrong_answer_is_detected():
    inputs, targets = generate_batch(8, 20, 32, torch.Generator().manual_seed(3))
    wrong = targets.clone()
    wrong[0] = 10 + (wrong[0] - 10 + 1) % 10
    assert not check_answers(inputs, wrong, 20)


def test_bad_sizes_name_the_field():
    with pytest.raises(ValueError, match="seq_len=4 .* 1 key-value pair"):
        generate_batch(2, 20, 4)
    with pytest.raises(ValueError, match="vocab_size .* got 3"):
        generate_batch(2, 3, 32)
    with pytest.raises(ValueError, match="vocab_size .* got 21"):
        RecallConfig(vocab_size=21).validate()
    with pytest.raises(ValueError, match="model must be one of"):
        RecallConfig(model="mamba").validate()
    with pytest.raises(ValueError, match="hidden_size=60 must be divisible by num_heads=8"):
        RecallConfig(model="transformer", hidden_size=60, num_heads=8).validate()
    with pytest.raises(ValueError, match="embedding_init_std must be > 0, got 0"):
        RecallConfig(embedding_init_std=0).validate()
    with pytest.raises(ValueError, match="only, got model='orchid', transformer_shift=True"):
        RecallConfig(transformer_shift=True).validate()
    with pytest.raises(ValueError, match="apply to model='transformer' only, .* transformer_positions='rotary'"):
        RecallConfig(model="static", transformer_positions="rotary").validate()
    with pytest.raises(ValueError, match="transformer_positions must be one of"):
        RecallConfig(model="transformer", transformer_positions="alibi").validate()
    with pytest.raises(ValueError, match="conditioning_norm applies to model='orchid' with conditioning='abs' only"):
        RecallConfig(conditioning="xcorr", conditioning_norm=True).validate()


def test_the_models_are_the_products_classes():
    orchid = build_model(RecallConfig(vocab_size=20, seq_len=128))
    assert type(orchid) is OrchidForMaskedLM
    preset = OrchidConfig.from_preset("orchid-recall", vocab_size=21, max_position_embeddings=128)
    assert orchid.config.to_diff_dict() == preset.to_diff_dict()
    # The preset's word embeddings are N(0, 1); the tied decoder is the same tensor.
    assert 0.9 < orchid.get_input_embeddings().weight.std().item() < 1.1
    assert orchid.lm_head.decoder.weight is orchid.get_input_embeddings().weight
    static = build_model(RecallConfig(model="static", vocab_size=20, seq_len=128))
    assert type(static) is OrchidForMaskedLM and static.config.data_dependent is False
    bert = build_model(RecallConfig(model="transformer", vocab_size=20, seq_len=128))
    assert type(bert) is BertForMaskedLM
    assert (bert.config.hidden_size, bert.config.num_hidden_layers, bert.config.vocab_size) == (64, 2, 21)
    # Token 0 is a key: no padding row that would stay zero and get no gradient.
    assert bert.bert.embeddings.word_embeddings.padding_idx is None
    for table in (bert.bert.embeddings.word_embeddings, bert.bert.embeddings.position_embeddings):
        assert 0.9 < table.weight.std().item() < 1.1
    inputs, _ = generate_batch(3, 20, 128, torch.Generator().manual_seed(5))
    for model in (orchid, static, bert):
        assert query_logits(model, inputs).shape == (3, 21)


def test_the_conditioning_norm_normalises_both_convolutions_and_keeps_padding_zero():
    model = build_model(RecallConfig(vocab_size=8, seq_len=16, hidden_size=16, conditioning_norm=True))
    conditioning = model.orchid.encoder.layer[0].mixer.conditioning
    assert {"time_norm.weight", "freq_norm.bias"} <= set(conditioning.state_dict())  # trained and saved with it
    seen = {}

    def spy(name):
        def keep(module, args, output) -> None:
            seen[name] = output

        return keep

    spies = [getattr(conditioning, name).register_forward_hook(spy(name)) for name in ("time_conv", "freq_conv")]
    inputs, _ = generate_batch(2, 8, 16, torch.Generator().manual_seed(8))
    with torch.no_grad():
        model(input_ids=inputs)
    for spied in spies:
        spied.remove()
    assert set(seen) == {"time_conv", "freq_conv"}
    for output in seen.values():  # registered after the norms' hooks, the spies saw what those return: normalised
        assert torch.allclose(output.mean(-1), torch.zeros(output.shape[:-1]), atol=1e-5)
        assert torch.allclose(output.var(-1, unbiased=False), torch.ones(output.shape[:-1]), atol=1e-3)
    mask = torch.ones(1, 16, 1, dtype=torch.bool)
    mask[0, 10:] = False
    with torch.no_grad():
        keys = conditioning.time_conv(torch.randn(1, 16, 16), mask, False)
    assert keys[0, 10:].abs().max() == 0 and keys[0, :10].abs().min() > 0
    plain = build_model(RecallConfig(vocab_size=8, seq_len=16, hidden_size=16))
    assert not hasattr(plain.orchid.encoder.layer[0].mixer.conditioning, "time_norm")


def test_the_shift_mixes_each_token_with_its_neighbours_and_keeps_the_decoder_tied():
    model = build_model(RecallConfig(model="transformer", vocab_size=20, seq_len=32, transformer_shift=True))
    words = model.bert.embeddings.word_embeddings
    assert isinstance(words, ShiftedEmbedding)
    assert model.cls.predictions.decoder.weight is words.weight is words.embedding.weight
    inputs, _ = generate_batch(2, 20, 32, torch.Generator().manual_seed(6))
    changed = inputs.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 20
    moved = (words(changed) - words(inputs)).abs().amax(dim=(0, 2))
    assert moved[9:12].min() > 0 and moved[:9].max() == 0 and moved[12:].max() == 0
    # The decoder's gradient and the input's gradient reach the same tied tensor.
    F.cross_entropy(query_logits(model, inputs), torch.tensor([10, 11])).backward()
    assert words.weight.grad is not None and words.shift.weight.grad is not None
    plain = build_model(RecallConfig(model="transformer", vocab_size=20, seq_len=32))
    assert type(plain.bert.embeddings.word_embeddings) is torch.nn.Embedding


def test_the_transformers_positions():
    from transformers import RoFormerForMaskedLM

    config = RecallConfig(model="transformer", vocab_size=20, seq_len=64, transformer_positions="sinusoidal")
    bert = build_model(config)
    table = bert.bert.embeddings.position_embeddings.weight
    assert torch.equal(table, sinusoids(64, 64)) and table.requires_grad  # started from sinusoids, then trained
    # Position 5 at the first frequency (1) and at the last (10000^(-62/64)); every entry of variance 1 on average.
    assert torch.allclose(table[5, :2], 2**0.5 * torch.tensor([math.sin(5.0), math.cos(5.0)]))
    assert torch.allclose(table[5, -2:], 2**0.5 * torch.tensor([math.sin(5 * 1e4 ** (-62 / 64)),
                                                                 math.cos(5 * 1e4 ** (-62 / 64))]))  # fmt: skip
    assert abs(table.pow(2).mean().item() - 1) < 1e-5
    rotary = build_model(RecallConfig(model="transformer", vocab_size=20, seq_len=64, transformer_positions="rotary"))
    assert type(rotary) is RoFormerForMaskedLM and rotary.config.hidden_size == 64
    assert rotary.cls.predictions.decoder.weight is rotary.get_input_embeddings().weight
    assert 0.9 < rotary.get_input_embeddings().weight.std().item() < 1.1
    inputs, _ = generate_batch(2, 20, 64, torch.Generator().manual_seed(7))
    assert query_logits(rotary, inputs).shape == (2, 21)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["orchid", "static", "transformer"])
def test_a_few_steps_reduce_the_loss(model):
    config = RecallConfig(model=model, vocab_size=8, seq_len=16, hidden_size=16)
    net = build_model(config)
    inputs, targets = generate_batch(32, 8, 16, torch.Generator().manual_seed(4))
    optimizer = torch.optim.Adam(net.parameters(), lr=3e-3)
    first = F.cross_entropy(query_logits(net, inputs), targets).item()
    for _ in range(20):
        loss = F.cross_entropy(query_logits(net, inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.8 * first


STEPS = 400


@pytest.mark.slow
def test_the_recall_preset_learns_the_task():
    # The preset at a small size of the task (4 keys, 4 values, 7 pairs). With BERT's initialisation of the word
    # embeddings (std 0.02 instead of the preset's 1) the same run stays near 60%.
    config = RecallConfig(vocab_size=8, seq_len=16, steps=STEPS, batch_size=32, eval_every=STEPS, eval_size=500)
    result = train(config, progress=False)
    assert result["test_accuracy"] >= 0.97, result["curve"]


@pytest.mark.slow
def test_the_shift_takes_the_transformer_off_the_plateau():
    # The diagnosis of the Transformer's plateau on a small instance (10 keys, 15 pairs): with the shift, attention
    # only has to match the query to a key; plain BertForMaskedLM is still near the most frequent value's accuracy
    # after thousands of steps at this size (docs/results/associative_recall.md).
    config = RecallConfig(model="transformer", vocab_size=20, seq_len=32, steps=300, batch_size=32, eval_every=300,
                          eval_size=500, transformer_shift=True)  # fmt: skip
    result = train(config, progress=False)
    assert result["val_accuracy"] >= 0.95, result["curve"]


@pytest.mark.slow
def test_training_loop_logs_a_curve_and_the_table_reads_it(tmp_path):
    config = RecallConfig(vocab_size=8, seq_len=16, hidden_size=16, steps=4, batch_size=8, warmup_steps=2,
                          eval_every=2, eval_size=20)  # fmt: skip
    result = train(config, log_path=tmp_path / "run.log", progress=False)
    assert [p["step"] for p in result["curve"]] == [2, 4]
    assert len((tmp_path / "run.log").read_text().splitlines()) == 2
    (tmp_path / "run.json").write_text(json.dumps(result))
    table = results_table([tmp_path / "run.json"])
    parameters = sum(p.numel() for p in build_model(config).parameters())
    label = "orchid / dct / abs / spatial+spectral / h0 dct(h0), Listing 1 / width 16"  # the non-default width named
    assert f"| {label} | {parameters / 1e3:.0f}K | 8 | 16 | 0 | 4 |" in table


def test_the_validation_and_test_splits_are_fixed_and_differ():
    config = RecallConfig(vocab_size=20, seq_len=32, eval_size=200)
    val_inputs, val_targets = held_out_set(config, "validation")
    test_inputs, _ = held_out_set(config, "test")
    assert torch.equal(val_inputs, held_out_set(config, "validation")[0])  # the same sequences for every run
    assert check_answers(val_inputs, val_targets, 20)
    train_inputs, _ = generate_batch(200, 20, 32, torch.Generator().manual_seed(config.seed + 1))
    rows = [set(map(tuple, x.tolist())) for x in (val_inputs, test_inputs, train_inputs)]
    assert not rows[0] & rows[1] and not rows[0] & rows[2] and not rows[1] & rows[2]
    with pytest.raises(ValueError, match="split must be one of .* got 'train'"):
        held_out_set(config, "train")


def test_the_plateau_predicts_the_most_frequent_value():
    # Vocabulary 8: keys 0-3, values 4-7, start token 8; the last token is the query.
    inputs = torch.tensor([[8, 0, 5, 1, 6, 2, 5, 3, 7, 1], [8, 0, 6, 1, 5, 2, 7, 3, 4, 0]])
    assert most_frequent_value(inputs, 8).tolist() == [5, 4]  # a tie goes to the lowest value
    config = RecallConfig(vocab_size=20, seq_len=32, eval_size=300)
    inputs, targets = held_out_set(config, "test")
    hits = 0
    for row, target in zip(inputs.tolist(), targets.tolist()):
        counts = Counter(t for t in row[:-1] if 10 <= t < 20)
        top = max(counts.values())
        hits += min(v for v, n in counts.items() if n == top) == target
    assert plateau_accuracy(20, 32, 300) == hits / 300


TINY_RUN = dict(vocab_size=8, seq_len=16, hidden_size=16, steps=6, batch_size=8, warmup_steps=2, eval_every=2,
                eval_size=20)  # fmt: skip


@pytest.mark.slow
def test_a_stopped_run_resumes_where_it_stopped(tmp_path, monkeypatch):
    import experiments.recall as recall

    config = RecallConfig(**TINY_RUN)
    whole = train(config, progress=False)
    assert [p["step"] for p in whole["curve"]] == [2, 4, 6]
    assert {"val_accuracy", "test_accuracy", "val_loss", "test_loss"} <= set(whole["curve"][0])

    calls = []

    def stop_at_the_fourth_batch(batch_size, *args, generate=recall.generate_batch):
        if batch_size == config.batch_size:  # a training batch, not a held-out split
            calls.append(1)
            if len(calls) == 4:
                raise KeyboardInterrupt
        return generate(batch_size, *args)

    paths = {"log_path": tmp_path / "run.log", "result_path": tmp_path / "run.json",
             "checkpoint_path": tmp_path / "run.ckpt"}  # fmt: skip
    monkeypatch.setattr(recall, "generate_batch", stop_at_the_fourth_batch)
    with pytest.raises(KeyboardInterrupt):
        train(config, progress=False, **paths)
    monkeypatch.undo()
    stopped = json.loads((tmp_path / "run.json").read_text())
    assert not stopped["finished"] and stopped["steps_done"] == 2 and (tmp_path / "run.ckpt").exists()

    resumed = train(config, progress=False, **paths)

    def metrics(result):
        return [{k: v for k, v in point.items() if k != "seconds"} for point in result["curve"]]

    assert metrics(resumed) == metrics(whole)  # the same model, optimizer and data stream as the uninterrupted run
    assert resumed["finished"] and not (tmp_path / "run.ckpt").exists()
    assert [json.loads(line)["step"] for line in (tmp_path / "run.log").read_text().splitlines()] == [2, 4, 6]


def test_a_checkpoint_of_another_run_is_refused(tmp_path):
    config = RecallConfig(**TINY_RUN)
    torch.save({"config": {**asdict(config), "lr": 0.5}}, tmp_path / "run.ckpt")
    with pytest.raises(ValueError, match=r"belongs to another run; .* \{'lr': \(0.5, 0.002\)\}"):
        train(config, progress=False, checkpoint_path=tmp_path / "run.ckpt")


def fake_result(**config) -> dict:
    """A run file as train() writes it, for a config, without training."""
    curve = [{"step": s, "train_loss": 1.0, "val_loss": 1.0, "val_accuracy": 0.5, "test_loss": 1.0,
              "test_accuracy": 0.25 * s / 100, "seconds": 6.0 * s} for s in (100, 200)]  # fmt: skip
    config = asdict(RecallConfig(steps=200, **config))
    return {"config": config, "parameters": 1000, "finished": True, "steps_done": 200, "val_accuracy": 0.5,
            "test_accuracy": 0.5, "best_test_accuracy": 0.5, "seconds": 1200.0, "curve": curve}  # fmt: skip


def test_a_results_page_is_rebuilt_from_its_run_files(tmp_path):
    runs = tmp_path / "runs"
    (runs / "grid").mkdir(parents=True)
    (runs / "grid" / "a.json").write_text(json.dumps(fake_result(lr=5e-4)))
    (runs / "grid" / "b.json").write_text(json.dumps(fake_result(model="static")))
    (runs / "main.json").write_text(json.dumps(fake_result(vocab_size=30)))
    page = ("# Page\n\n<!-- recall:table grid/*.json -->\n| stale |\n<!-- /recall:table grid/*.json -->\n\nText.\n\n"
            "<!-- recall:figure *.json main.png -->\nold\n<!-- /recall:figure *.json main.png -->\n")  # fmt: skip
    rendered = render_page(page, runs)
    table = results_table([runs / "grid" / "a.json", runs / "grid" / "b.json"])
    assert rendered == ("# Page\n\n<!-- recall:table grid/*.json -->\n" + table + "<!-- /recall:table grid/*.json -->"
                        "\n\nText.\n\n<!-- recall:figure *.json main.png -->\n![learning curves](main.png)\n"
                        "<!-- /recall:figure *.json main.png -->\n")  # fmt: skip
    assert "| 0.0005 | 100 | 50.0 | 50.0 |" in table and "| static" in table
    assert render_page(rendered, runs) == rendered  # rebuilding an up-to-date page changes nothing
    with pytest.raises(ValueError, match="no run files match 'other/\\*.json'"):
        render_page("<!-- recall:table other/*.json -->\n<!-- /recall:table other/*.json -->", runs)
    with pytest.raises(ValueError, match="'paper PATTERN' or 'figure PATTERN PNG', got 'figure main.json'"):
        render_page(f"<!-- {BLOCKS}:figure main.json -->\n<!-- /{BLOCKS}:figure main.json -->", runs)


@pytest.mark.slow
def test_a_results_page_draws_its_figures(tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "run.json").write_text(json.dumps(fake_result()))
    render_page("<!-- recall:figure run.json curves.png -->\n<!-- /recall:figure run.json curves.png -->\n", tmp_path,
                tmp_path)
    assert (tmp_path / "curves.png").stat().st_size > 1000


def test_training_ends_where_stop_says_with_a_last_evaluation():
    # The GPU check gives each run a time budget this way (benchmarks/gpu.py).
    config = RecallConfig(vocab_size=8, seq_len=16, hidden_size=16, steps=50, batch_size=4, eval_every=20,
                          eval_size=8)  # fmt: skip
    calls = itertools.count(1)
    result = train(config, progress=False, device=torch.device("cpu"), stop=lambda: next(calls) >= 3)
    assert result["steps_done"] == 3 and not result["finished"]
    assert len(result["commit"]) == 40 and result["machine"]["torch_threads"] == config.threads  # where it was run
    assert [point["step"] for point in result["curve"]] == [3]
    assert 0 <= result["test_accuracy"] <= 1 and result["curve"][0]["train_loss"] > 0


def test_the_paper_table_puts_the_seeds_beside_table_4_2(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    # Orchid's vocabulary-30 run has App. C.1's deeper conditioning: still the same model's row.
    cases = [("orchid", 20, 0, 0.99, 1.0, 1.0), ("orchid", 20, 1, 0.98, 1.0, 1.0), ("orchid", 30, 0, 0.5, 0.99, 1.0),
             ("gpt2", 20, 0, 0.3, 0.1, 0.0), ("gpt2", 20, 1, 0.95, 0.12, 0.0)]  # fmt: skip
    for model, vocab, seed, accuracy, keys, moved in cases:
        depth = 3 if (model, vocab) == ("orchid", 30) else 1
        config = asdict(RecallConfig(model=model, vocab_size=vocab, seed=seed, objective="next_token",
                                     conditioning_depth=depth))  # fmt: skip
        result = {"config": config, "test_accuracy": accuracy, "earlier_positions_changed": moved,
                  "curve": [{"val_next_key_accuracy": keys}]}  # fmt: skip
        (runs / f"{model}_{vocab}_{seed}.json").write_text(json.dumps(result))
    page = render_page("<!-- recall:paper *.json -->\n<!-- /recall:paper *.json -->\n", runs)
    lines = page.splitlines()
    assert lines[1] == ("| model | vocabulary 20: test % by seed (paper) | vocabulary 30: test % by seed (paper) | "
                        "next key predicted %, by vocabulary (chance 10 / 6.67) | "
                        "earlier positions moved by a later token % |")  # fmt: skip
    assert lines[3] == ("| orchid / dct / abs / spatial+spectral / h0 dct(h0), Listing 1 / next-token loss | "
                        "99.0 / 98.0 (100) | 50.0 (99.4) | 100 / 99 | 100 |")  # fmt: skip
    assert lines[4] == ("| transformer (GPT2LMHeadModel, causal, pre-norm) / next-token loss | 30.0 / 95.0 (100) | - | "
                        "11 / - | 0 |")  # fmt: skip


# Every flag of scripts/associative_recall.py, with a value other than its default, and what it must change.
FLAGS = [
    (["--model", "static"], lambda c, m: c["model"] == "static" and m.config.data_dependent is False),
    (["--model", "transformer"], lambda c, m: isinstance(m, BertForMaskedLM)),
    (["--model", "gpt2"], lambda c, m: isinstance(m, GPT2LMHeadModel) and m.config.n_embd == 16),
    (["--model", "gpt2", "--num_heads", "2"], lambda c, m: m.config.n_head == 2),
    (["--objective", "next_token"], lambda c, m: c["objective"] == "next_token"),
    (["--hidden_size", "24"], lambda c, m: m.config.hidden_size == 24),
    (["--num_layers", "1"], lambda c, m: m.config.num_hidden_layers == 1),
    (["--model", "transformer", "--num_heads", "2"], lambda c, m: m.config.num_attention_heads == 2),
    (["--transform", "fft"], lambda c, m: m.config.transform == "fft"),
    (["--conditioning", "xcorr"], lambda c, m: m.config.conditioning == "xcorr"),
    (["--conditioning", "xcorr", "--activation", "tanh"], lambda c, m: m.config.conditioning_activation == "tanh"),
    (["--conditioning_layout", "spatial"],
     lambda c, m: (m.config.conditioning_time_layers, m.config.conditioning_freq_layers) == (2, 0)),
    (["--conditioning_layout", "spectral"],
     lambda c, m: (m.config.conditioning_time_layers, m.config.conditioning_freq_layers) == (0, 2)),
    (["--conditioning_depth", "3"],
     lambda c, m: (m.config.conditioning_time_layers, m.config.conditioning_freq_layers) == (3, 3)),
    (["--filter_spectrum", "convolution"], lambda c, m: m.config.filter_spectrum == "convolution"),
    (["--conditioning_norm"],
     lambda c, m: c["conditioning_norm"] and hasattr(m.orchid.encoder.layer[0].mixer.conditioning, "time_norm")),
    (["--model", "transformer", "--transformer_positions", "rotary"],
     lambda c, m: type(m).__name__ == "RoFormerForMaskedLM"),
    (["--model", "transformer", "--transformer_positions", "sinusoidal"],
     lambda c, m: torch.allclose(m.bert.embeddings.position_embeddings.weight, sinusoids(16, 16), atol=1e-3)),
    (["--model", "transformer", "--transformer_shift"],
     lambda c, m: isinstance(m.bert.embeddings.word_embeddings, ShiftedEmbedding)),
    (["--embedding_init_std", "0.5"], lambda c, m: m.config.word_embedding_init_std == 0.5),
    (["--config_overrides", '{"pre_norm": false}'], lambda c, m: m.config.pre_norm is False),
    (["--steps", "4"], lambda c, m: c["steps"] == 4),
    (["--batch_size", "2"], lambda c, m: c["batch_size"] == 2),
    (["--lr", "0.01"], lambda c, m: c["lr"] == 0.01),
    (["--warmup_steps", "1"], lambda c, m: c["warmup_steps"] == 1),
    (["--weight_decay", "0"], lambda c, m: c["weight_decay"] == 0),
    (["--grad_clip", "0"], lambda c, m: c["grad_clip"] == 0),
    (["--eval_every", "1"], lambda c, m: c["eval_every"] == 1),
    (["--eval_size", "5"], lambda c, m: c["eval_size"] == 5),
    (["--seed", "3"], lambda c, m: c["seed"] == 3),
    (["--threads", "1"], lambda c, m: c["threads"] == 1),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("flags,check", FLAGS, ids=[" ".join(f) for f, _ in FLAGS])
def test_every_flag_of_the_script_runs_and_takes_effect(tmp_path, flags, check, monkeypatch):
    import experiments.recall as recall

    built = []
    monkeypatch.setattr(recall, "build_model", lambda config, build=recall.build_model: built.append(build(config))
                        or built[-1])  # fmt: skip
    out = tmp_path / "run.json"
    load_script().main([*TINY, *flags, "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["finished"] and result["command"].startswith("python scripts/associative_recall.py")
    assert check(result["config"], built[0]), result["config"]
    assert len(out.with_name("run.json.log").read_text().splitlines()) == len(result["curve"])


@pytest.mark.slow
def test_the_script_prints_the_table_and_plots_the_curves(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    script = load_script()
    for model in ("orchid", "transformer"):
        script.main([*TINY, "--model", model, "--note", f"a {model} note", "--out", str(tmp_path / f"{model}.json")])
    assert json.loads((tmp_path / "orchid.json").read_text())["note"] == "a orchid note"
    capsys.readouterr()
    script.main(["--table", str(tmp_path / "orchid.json"), str(tmp_path / "transformer.json"),
                 "--plot", str(tmp_path / "curves.png")])  # fmt: skip
    table = capsys.readouterr().out
    assert "transformer (BertForMaskedLM)" in table and "| orchid / dct / abs" in table
    assert "| a orchid note |" in table and "| a transformer note |" in table
    assert "| 2 | 4 | 0.002 | 100 |" in table  # steps, batch, lr, warm-up
    assert (tmp_path / "curves.png").stat().st_size > 1000
    with pytest.raises(SystemExit):
        script.main(["--plot", str(tmp_path / "x.png")])
    page = tmp_path / "page.md"
    page.write_text("<!-- recall:table orchid.json -->\n<!-- /recall:table orchid.json -->\n"
                    "<!-- recall:figure *.json page_curves.png -->\n<!-- /recall:figure *.json page_curves.png -->\n")
    script.main(["--update_page", str(page), "--runs", str(tmp_path)])
    assert "| orchid / dct / abs" in page.read_text() and "transformer (BertForMaskedLM)" not in page.read_text()
    assert (tmp_path / "page_curves.png").stat().st_size > 1000
    with pytest.raises(SystemExit):
        script.main(["--update_page", str(page)])
