"""Needle in a haystack (experiments/needle.py, scripts/needle_benchmark.py) on generated novels and tiny models: the
haystacks are exactly as long as asked, with the needle at its depth, the question at the end and labels only at its
answers; they are reproducible and share their text across depths; made-up words never stand in the text; left
truncation keeps the question and says which depths fall outside the window; Orchid and BERT folders are scored end
to end; the learning rate is chosen on the validation haystacks and flagged at the grid's edge; bad flags are named."""

import importlib.util
import itertools
import json
import random
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForMaskedLM, BertTokenizer

from experiments.needle import (
    MADE_UP_WORDS,
    MEMORY_MEASURE,
    PASSKEY_NEEDLE,
    SYLLABLES,
    TASKS,
    NeedleBuilder,
    TextSource,
    answer_logits,
    build_grid,
    build_training_set,
    choose_learning_rate,
    load_sources,
    occurs_as_word,
    read_paragraphs,
    run_needle_benchmark,
    score,
    seeded_random,
    summarise,
    truncate,
)
from orchid_hf import OrchidConfig, OrchidForMaskedLM

ROOT = Path(__file__).resolve().parents[1]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# The words of the needles and questions, and of the text; the short words left out of the vocabulary are split
# into letters (two or three tokens), so that words of several tokens are in the text.
PROMPT_WORDS = ("the pass key is remember it what old map hidden in town of where traveller always carries a her "
                "coat does carry lighthouse keeper called").split()  # fmt: skip
TEXT_WORDS = ("anne walked home and captain wentworth came to bath by the sea she said that he was not there but "
              "they had been at kellynch for many years").split()  # fmt: skip
SPLIT_WORDS = ["ox", "elm", "yew", "ivy", "owl"]
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
# Made-up words of two syllables that the generated text holds: the needle task must never draw them.
TEXT_MADE_UP = ["".join(pair) for pair in itertools.product(SYLLABLES, repeat=2)][:20]
# A made-up word that is one token of the vocabulary, as "brakes" (bra + kes) is of BERT's: a real word, never drawn.
VOCABULARY_MADE_UP = "zanwim"


def write_vocabulary(folder: Path) -> BertTokenizer:
    """A lower-cased WordPiece tokenizer saved in ``folder``: digits, letters (so that every word has tokens), the
    syllables of the made-up words, and the words of the prompts and the text."""
    words = PROMPT_WORDS + TEXT_WORDS + list(SYLLABLES) + [f"##{s}" for s in SYLLABLES] + [VOCABULARY_MADE_UP]
    vocab = SPECIALS + [str(d) for d in range(10)] + list(".,?;") + LETTERS + [f"##{c}" for c in LETTERS] + words
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(dict.fromkeys(vocab)) + "\n")
    tokenizer = BertTokenizer.from_pretrained(folder, do_lower_case=True)
    tokenizer.save_pretrained(folder)
    return tokenizer


def write_novel(path: Path, seed: int, chapters: int = 4, paragraphs: int = 12) -> None:
    """A novel in Project Gutenberg's layout: a title and preface, chapter headings, paragraphs of sentences
    hard-wrapped at about 70 characters, separated by blank lines."""
    rng = random.Random(seed)
    words = TEXT_WORDS * 3 + SPLIT_WORDS + TEXT_MADE_UP
    lines = [f"NOVEL {seed}", "", "PREFACE never read as text.", ""]
    for chapter in range(chapters):
        lines += [f"CHAPTER {chapter + 1}", ""]
        for _ in range(paragraphs):
            sentences = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 12))).capitalize() + rng.choice(".,;")
                         for _ in range(rng.randint(2, 5))]  # fmt: skip
            text, line = " ".join(sentences), ""
            for word in text.split():
                if len(line) + len(word) > 70:
                    lines.append(line)
                    line = ""
                line = f"{line} {word}".strip()
            lines += [line, ""]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Three generated novels (one per split), a tokenizer, and tiny Orchid and BERT masked LMs of 128 positions
    saved with it."""
    root = tmp_path_factory.mktemp("needle")
    for name, seed in (("train", 1), ("validation", 2), ("test", 3)):
        (root / name).mkdir()
        write_novel(root / name / f"novel{seed}.txt", seed)
    tokenizer = write_vocabulary(root / "tokenizer")
    common = dict(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                  max_position_embeddings=128, pad_token_id=0)  # fmt: skip
    torch.manual_seed(0)
    models = {"orchid": OrchidForMaskedLM(OrchidConfig(**common, filter_width=16)),
              "bert": BertForMaskedLM(BertConfig(**common, num_attention_heads=2))}  # fmt: skip
    for name, model in models.items():
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return SimpleNamespace(root=root, tokenizer=tokenizer, **{name: root / name for name in models})


@pytest.fixture(scope="module")
def builder(corpus):
    return NeedleBuilder(load_sources([corpus.root / "test" / "novel3.txt"], corpus.tokenizer), corpus.tokenizer)


def load_script():
    spec = importlib.util.spec_from_file_location("needle_benchmark", ROOT / "scripts" / "needle_benchmark.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_text_is_the_novels_paragraphs_as_one_token_stream(corpus, builder):
    paragraphs = read_paragraphs(corpus.root / "test" / "novel3.txt")
    assert len(paragraphs) == 4 * 12 and not any("PREFACE" in p or "CHAPTER" in p for p in paragraphs)
    source = builder.sources[0]
    ids = corpus.tokenizer(paragraphs, add_special_tokens=False)["input_ids"]
    assert source.ids.tolist() == [token for paragraph in ids for token in paragraph]
    pieces = corpus.tokenizer.convert_ids_to_tokens(source.ids.tolist())
    assert source.word_start.tolist() == [not piece.startswith("##") for piece in pieces]
    assert 0.5 < source.word_start.mean() < 0.95  # words of several tokens are there
    # A file without chapter headings is read whole.
    plain = corpus.root / "plain.txt"
    plain.write_text("One line\nwrapped.\n\nAnother one.\n")
    assert read_paragraphs(plain) == ["One line wrapped.", "Another one."]


@pytest.mark.parametrize("length", [96, 128, 200])
def test_haystacks_are_exact_with_the_needle_at_its_depth_and_labels_only_at_answers(corpus, builder, length):
    tokenizer = corpus.tokenizer
    source = builder.sources[0]
    mask, digits = tokenizer.mask_token_id, {tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)}
    for task, depth, k in itertools.product(TASKS, (0, 25, 50, 75, 100), range(3)):
        haystack = builder.build(task, length, depth, f"s-{length}-{k}")
        ids, labels = list(haystack.input_ids), list(haystack.labels)
        start, end, question = haystack.needle_start, haystack.needle_end, haystack.question_start
        assert len(ids) == len(labels) == length
        assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
        # The depth: a share of the text before the question, the needle moved to a word start at most 2 away.
        target = 1 + depth / 100 * (question - 1 - (end - start))
        assert abs(start - target) <= 2, (task, depth, start, target)
        assert end <= question
        if task != "copy":  # (the copy task's span also ends at a word start, so it may stand a token or two off)
            assert (depth != 0 or start == 1) and (depth != 100 or end == question)
        # Labels at the question's [MASK]s and nowhere else; every [MASK] of the haystack is an answer.
        answers = [p for p, label in enumerate(labels) if label != -100]
        assert answers and answers == [p for p, token in enumerate(ids) if token == mask]
        assert min(answers) >= question
        text = ids[1:start] + ids[end:question]
        if task == "copy":
            # The text is one window of the file, the span part of it, and the question is the span with masks.
            assert ids[1:question] == source.ids[haystack.offset : haystack.offset + question - 1].tolist()
            span = ids[start:end]
            assert len(ids[question:-1]) == len(span)
            for p, (token, original) in enumerate(zip(ids[question:-1], span)):
                assert token == original if token != mask else labels[question + p] == original
            masked = [p - question for p in answers]
            assert min(masked) >= len(span) // 4
            pieces = tokenizer.convert_ids_to_tokens(span)
            # Whole words: a masked token's word is masked all through.
            for p in masked:
                assert (p + 1 == len(span) or not pieces[p + 1].startswith("##")) or p + 1 in masked
            continue
        assert text == source.ids[haystack.offset : haystack.offset + len(text)].tolist()
        if task == "passkey":
            needle = tokenizer(PASSKEY_NEEDLE.format(digits=haystack.answer), add_special_tokens=False)["input_ids"]
            assert ids[start:end] == needle
            assert len(answers) == 5 and {labels[p] for p in answers} <= digits
            assert " ".join(tokenizer.convert_ids_to_tokens([labels[p] for p in answers])) == haystack.answer
        else:
            key = tokenizer(haystack.answer, add_special_tokens=False)["input_ids"]
            assert [labels[p] for p in answers] == key
            assert haystack.answer in tokenizer.decode(ids[start:end]).replace(" ", "")


def test_haystacks_are_reproducible_and_share_their_text_across_depths(builder):
    grid = build_grid(builder, TASKS, [128], [0, 50, 100], 4, 7, "test")
    assert grid == build_grid(builder, TASKS, [128], [0, 50, 100], 4, 7, "test")
    other = build_grid(builder, TASKS, [128], [0, 50, 100], 4, 8, "test")
    assert [h.input_ids for h in grid] != [h.input_ids for h in other]
    assert len(grid) == 3 * 3 * 4
    for task in TASKS:
        cells = [[h for h in grid if h.task == task and h.depth == depth] for depth in (0, 50, 100)]
        for k in range(4):
            same = [cell[k] for cell in cells]
            # The same window of text at every depth, and the same pass key or fact; only the needle moves (the
            # copy task's span is the text at the depth).
            assert len({(h.source, h.offset) for h in same}) == 1
            if task != "copy":
                assert len({h.answer for h in same}) == 1
                assert len({h.input_ids[1 : h.needle_start] + h.input_ids[h.needle_end : h.question_start]
                            for h in same}) == 1  # fmt: skip
            assert len({h.needle_start for h in same}) == 3
        assert len({h.offset for h in cells[0]}) > 1  # the examples of a cell read different text
    # Seeds that differ in one character draw unrelated windows (Random("...-0") and Random("...-1") do not).
    first = [seeded_random(f"0-test-256-{k}", "text").random() for k in range(2)]
    assert abs(first[0] - first[1]) > 0.05
    training = build_training_set(builder, TASKS, [96, 128], 30, 0)
    assert training == build_training_set(builder, TASKS, [96, 128], 30, 0)
    assert {h.task for h in training} == set(TASKS) and {h.length for h in training} == {96, 128}
    assert len({round(h.depth, 6) for h in training}) == 30 and all(0 <= h.depth <= 100 for h in training)


def test_made_up_words_never_stand_in_the_text(builder, corpus):
    source = builder.sources[0]
    held = [word for word in TEXT_MADE_UP if word in source.words]
    assert len(held) >= 10  # the text holds made-up words, which the needles must avoid
    needles = [builder.build("needle", 128, depth, f"w-{k}") for k in range(40) for depth in (0, 100)]
    for haystack in needles:
        assert haystack.answer not in source.words
        key = corpus.tokenizer(haystack.answer, add_special_tokens=False)["input_ids"]
        text = np.asarray(
            haystack.input_ids[1 : haystack.needle_start]
            + haystack.input_ids[haystack.needle_end : haystack.question_start]
        )
        starts = np.asarray([not piece.startswith("##") for piece in corpus.tokenizer.convert_ids_to_tokens(text)])
        assert not occurs_as_word(text, starts, key)
    # Every word but one taken: that one is drawn; all taken: an error.
    rng = random.Random(0)
    free = {"torvekzan", VOCABULARY_MADE_UP}
    crowded = TextSource("x", "x.txt", source.ids, source.word_start, frozenset(MADE_UP_WORDS) - free)
    assert {builder.made_up_word(rng, crowded) for _ in range(20)} == {"torvekzan"}
    with pytest.raises(ValueError, match="every made-up word of SYLLABLES is a word of the text"):
        builder.made_up_word(rng, TextSource("y", "y.txt", source.ids, source.word_start, frozenset(MADE_UP_WORDS)))
    assert occurs_as_word(np.array([5, 6, 7, 8]), np.array([True, True, False, True]), [6, 7])
    assert not occurs_as_word(np.array([5, 6, 7, 8]), np.array([True, True, False, False]), [6, 7])


def test_the_passkey_task_needs_each_digit_as_one_token(corpus, tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join(SPECIALS + LETTERS + [f"##{c}" for c in LETTERS]) + "\n")
    tokenizer = BertTokenizer.from_pretrained(tmp_path, do_lower_case=True)
    builder = NeedleBuilder(load_sources([corpus.root / "test" / "novel3.txt"], tokenizer), tokenizer)
    with pytest.raises(ValueError, match=r"the passkey task needs each digit as one token, but .* \['\[UNK\]'"):
        build_grid(builder, ["passkey"], [128], [50], 1, 0, "test")
    assert len(build_grid(builder, ["copy", "needle"], [128], [50], 1, 0, "test")) == 2


def test_left_truncation_keeps_the_question_and_says_where_the_needle_is(builder, corpus):
    for depth, inside in ((0, False), (50, False), (100, True)):
        haystack = builder.build("passkey", 256, depth, "t")
        ids, labels, in_window = truncate(haystack, 64)
        assert len(ids) == len(labels) == 64 and in_window == inside
        assert ids[0] == corpus.tokenizer.cls_token_id and ids[1:] == list(haystack.input_ids[-63:])
        assert labels[1:] == list(haystack.labels[-63:]) and sum(label != -100 for label in labels) == 5
        assert truncate(haystack, 256)[:2] == (list(haystack.input_ids), list(haystack.labels))
    # The needle's last token cut off is outside.
    haystack = builder.build("passkey", 256, 100, "t")
    cut = 256 - haystack.needle_start
    assert truncate(haystack, cut + 1)[2] and not truncate(haystack, cut)[2]


class EchoMaskedLM(torch.nn.Module):
    """Predicts at each position the token ``shift`` positions before it: the copy task's answer exactly when the
    span stands right before its copy."""

    def __init__(self, vocab_size: int, shift: int):
        super().__init__()
        self.vocab_size, self.shift = vocab_size, shift

    def forward(self, input_ids):
        source = torch.roll(input_ids, self.shift, dims=1)
        return SimpleNamespace(logits=torch.nn.functional.one_hot(source, self.vocab_size).float() * 10)


def test_scores_count_a_hit_only_when_every_answer_token_is_right(builder, corpus):
    # At depth 100 the span ends at the question, unless a word of several tokens moved it a token or two back.
    adjacent = {length: [h for k in range(40) if (h := builder.build("copy", length, 100, f"e-{k}")).needle_end
                         == h.question_start][:3] for length in (96, 128)}  # fmt: skip
    assert all(len(rows) == 3 for rows in adjacent.values())
    haystacks = [*adjacent[96], *adjacent[128], *build_grid(builder, ["copy", "passkey"], [96, 128], [0], 3, 0, "t")]
    records, per_length = score(EchoMaskedLM(len(corpus.tokenizer), builder.copy_span), haystacks, None,
                                tokens_per_batch=300, progress=False)  # fmt: skip
    summary = summarise(records)
    assert summary["accuracy"]["copy"] == {"96": {"0": 0.0, "100": 1.0}, "128": {"0": 0.0, "100": 1.0}}
    assert summary["accuracy"]["passkey"] == {"96": {"0": 0.0}, "128": {"0": 0.0}}
    cell = next(c for c in summary["cells"] if c["task"] == "copy" and c["length"] == 128 and c["depth"] == 100)
    assert cell["token_accuracy"] == 1.0 and cell["examples"] == 3 and cell["needle_in_window"] == 1
    assert summary["overall_accuracy"] == pytest.approx(6 / 18)
    assert set(per_length) == {96, 128} and all(v["examples"] == 9 and v["seconds_per_example"] > 0
                                                for v in per_length.values())  # fmt: skip
    assert all(r["hit"] == (r["answer_ids"] == r["predicted_ids"]) for r in records)
    # The records come back in the haystacks' order, whatever the batches.
    assert [(r["task"], r["length"], r["offset"]) for r in records] == [(h.task, h.length, h.offset) for h in haystacks]


@pytest.mark.parametrize("name", ["orchid", "bert"])
def test_answer_logits_are_the_full_logits_at_the_answers(corpus, builder, name):
    from transformers import AutoModelForMaskedLM

    import orchid_hf  # noqa: F401

    model = AutoModelForMaskedLM.from_pretrained(getattr(corpus, name)).eval()
    haystacks = [builder.build(task, 128, 50, "a") for task in TASKS]
    ids = torch.tensor([h.input_ids for h in haystacks])
    positions = torch.tensor([h.labels for h in haystacks]) != -100
    with torch.no_grad():
        assert torch.allclose(answer_logits(model, ids, positions), model(input_ids=ids).logits[positions], atol=1e-5)


@pytest.mark.usefixtures("one_thread")
def test_orchid_and_bert_folders_are_scored_end_to_end(corpus, tmp_path):
    script = load_script()
    test = str(corpus.root / "test")
    common = ["--test_files", test, "--lengths", "128", "256", "--depths", "0", "50", "100", "--examples_per_cell",
              "2", "--no_finetune", "--threads", "1", "--device", "cpu"]  # fmt: skip
    results = {}
    with pytest.raises(ValueError, match="longer than the model's window of 128 tokens: truncate"):
        script.main(["--model", str(corpus.bert), "--output_dir", str(tmp_path / "bert"), *common])
    for name, extra in (("orchid", []), ("bert", ["--truncation_side", "left"])):
        out = tmp_path / name
        results[name] = script.main(["--model", str(getattr(corpus, name)), "--output_dir", str(out), *common, *extra])
        assert json.loads((out / "results.json").read_text()) == json.loads(json.dumps(results[name]))
        for task in TASKS:
            png = (out / f"heatmap_{task}.png").read_bytes()
            assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
        predictions = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
        assert len(predictions) == 3 * 2 * 3 * 2
        result = results[name]
        assert {"model", "model_type", "window", "how", "truncation_side", "tasks", "lengths", "depths", "accuracy",
                "outside_window", "cells", "speed_and_memory", "samples", "commit", "uncommitted_changes", "machine",
                "files", "finetuning"} <= set(result)  # fmt: skip
        assert result["finetuning"] is None and result["files"] == {"test": [str(corpus.root / "test" / "novel3.txt")]}
        assert {"platform", "torch", "torch_threads"} <= set(result["machine"])
        assert result["machine"]["torch_threads"] == 1 and result["machine"]["device"] == "cpu"
        assert result["commit"] is None or len(result["commit"]) == 40
        for task in TASKS:
            for length in ("128", "256"):
                for depth in ("0", "50", "100"):
                    hits = [p["hit"] for p in predictions if p["task"] == task and str(p["length"]) == length
                            and f"{p['depth']:g}" == depth]  # fmt: skip
                    assert len(hits) == 2 and result["accuracy"][task][length][depth] == sum(hits) / 2
        for length in ("128", "256"):
            speed = result["speed_and_memory"][length]
            assert speed["examples"] == 18 and speed["seconds_per_example"] > 0 and speed["peak_memory_mib"] > 0
        assert result["memory_measure"] == MEMORY_MEASURE
        assert result["samples"]["passkey"]["question"].startswith("what is the pass key")
    orchid, bert = results["orchid"], results["bert"]
    assert orchid["window"] == 256 and "extended from 128 to 256 positions" in orchid["how"]
    assert orchid["max_position_embeddings"] == bert["max_position_embeddings"] == 128  # the checkpoints' own
    assert orchid["outside_window"] == {task: {"128": [], "256": []} for task in TASKS}
    # BERT reads the last 128 tokens of a 256-token haystack: the needle at 0% and 50% is outside, at 100% inside.
    assert bert["window"] == 128 and bert["speed_and_memory"]["256"]["read_tokens"] == 128
    assert bert["how"] == "as trained, reading [CLS] and the last 127 tokens of longer haystacks"
    # Reading 256 tokens takes more memory than 128; BERT reads 128 tokens of either.
    memory = {name: [r["speed_and_memory"][n]["peak_memory_mib"] for n in ("128", "256")]
              for name, r in results.items()}  # fmt: skip
    assert memory["orchid"][1] > 1.5 * memory["orchid"][0]
    assert memory["bert"][1] == pytest.approx(memory["bert"][0], rel=0.05)
    assert bert["outside_window"] == {task: {"128": [], "256": [0.0, 50.0]} for task in TASKS}
    assert all(
        p["in_window"] == (p["length"] == 128 or p["depth"] == 100)
        for p in map(json.loads, (tmp_path / "bert" / "predictions.jsonl").read_text().splitlines())
    )


def test_bert_at_full_length_repeats_its_learned_positions(corpus, builder):
    """``max_length`` past a BERT's positions extends its table by repeating the learned rows: a haystack no longer
    than the old table reads exactly as before, a longer one is read whole (no needle outside the window)."""
    from experiments.needle import load_model

    bert = BertForMaskedLM.from_pretrained(corpus.bert).eval()
    model, window, how = load_model(corpus.bert, [128, 256], max_length=256)
    model.eval()
    assert window == 256 and model.config.max_position_embeddings == 256
    assert how == "positions extended from 128 to 256 by repeating its learned rows, without training"
    table, old = model.bert.embeddings.position_embeddings.weight, bert.bert.embeddings.position_embeddings.weight
    assert torch.equal(table[:128], old) and torch.equal(table[128:], old)
    short = torch.tensor([builder.build("passkey", 128, 50, "a").input_ids])
    long = torch.tensor([builder.build("passkey", 256, 50, "a").input_ids])
    with torch.no_grad():
        assert torch.equal(model(input_ids=short).logits, bert(input_ids=short).logits)
        assert model(input_ids=long).logits.shape[1] == 256
    records, _ = score(model, [builder.build("passkey", 256, 0, "a")], window, progress=False)
    assert records[0]["in_window"]
    # A model whose positions are not a learned table (RoFormer's rotary ones) is refused, naming its positions.
    from transformers import RoFormerConfig, RoFormerForMaskedLM

    from experiments.needle import repeat_positions

    roformer = RoFormerForMaskedLM(RoFormerConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1,
                                                  num_attention_heads=2, intermediate_size=32,
                                                  max_position_embeddings=128))  # fmt: skip
    with pytest.raises(ValueError, match="roformer model reads at most its 128 positions: .* to extend to 256"):
        repeat_positions(roformer, 256)


def test_the_learning_rate_is_the_best_on_validation_and_flagged_at_an_edge():
    def runs(*points):
        return [{"accuracy": accuracy, "loss": loss} for accuracy, loss in points]

    assert choose_learning_rate(runs((0.2, 3.0), (0.5, 2.0), (0.4, 1.0))) == (1, False)
    assert choose_learning_rate(runs((0.5, 3.0), (0.5, 2.0), (0.4, 1.0))) == (1, False)  # a tie: the lower loss
    assert choose_learning_rate(runs((0.0, 2.0), (0.0, 1.0), (0.0, float("nan")))) == (1, False)
    assert choose_learning_rate(runs((0.0, 2.0), (0.0, 3.0), (0.0, float("nan")))) == (0, True)
    assert choose_learning_rate(runs((0.1, 2.0), (0.2, 3.0), (0.3, 4.0))) == (2, True)
    assert choose_learning_rate(runs((0.1, 2.0))) == (0, True)
    with pytest.raises(ValueError, match="no learning rate"):
        choose_learning_rate([])


@pytest.mark.usefixtures("one_thread")
def test_finetuning_chooses_on_validation_and_warns_at_the_grid_edge(corpus, tmp_path):
    common = dict(test_files=[corpus.root / "test"], train_files=[corpus.root / "train"],
                  validation_files=[corpus.root / "validation"], tasks=["passkey"], lengths=[128], depths=[0, 100],
                  examples_per_cell=2, train_examples=16, max_steps=4, batch_size=4, device="cpu",
                  progress=False)  # fmt: skip
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*edge of the grid")
        results = run_needle_benchmark(corpus.orchid, output_dir=tmp_path / "grid",
                                       learning_rates=[30.0, 1e-7, 3e-3], **common)  # fmt: skip
    tuning = results["finetuning"]
    assert tuning["learning_rates"] == [r["learning_rate"] for r in tuning["runs"]] == [1e-7, 3e-3, 30.0]
    assert tuning["steps"] == 4 and tuning["train_examples"] == 16 and tuning["validation_examples"] == 4
    for run in tuning["runs"]:  # the curve: each step's loss once, in chunks that end at the last step
        assert [point["step"] for point in run["train_loss_curve"]] == [1, 2, 3, 4]
        assert run["train_loss_curve"][0]["loss"] == run["train_loss_first"]
        assert run["train_loss_curve"][-1]["loss"] == pytest.approx(run["train_loss_last"], nan_ok=True)  # lr 30
    # A learning rate too small to move the model and one that wrecks it: the middle one is best, inside the grid.
    assert tuning["best_learning_rate"] == 3e-3 and tuning["best_at_edge"] is False
    losses = {r["learning_rate"]: r["validation_loss"] for r in tuning["runs"]}
    assert losses[3e-3] < losses[1e-7] and not losses[30.0] < losses[3e-3]
    assert "fine-tuned at lr 0.003" in results["how"]
    assert set(results["files"]) == {"train", "validation", "test"}
    with pytest.warns(UserWarning, match="is at the edge of the grid .* extend the grid"):
        edge = run_needle_benchmark(corpus.orchid, output_dir=tmp_path / "edge", learning_rates=[1e-7, 3e-3],
                                    **common)  # fmt: skip
    assert edge["finetuning"]["best_learning_rate"] == 3e-3 and edge["finetuning"]["best_at_edge"] is True
    assert json.loads((tmp_path / "edge" / "results.json").read_text())["finetuning"]["best_at_edge"] is True
    with pytest.raises(ValueError, match="novel3.txt is both a test and a train file"):
        run_needle_benchmark(corpus.orchid, output_dir=tmp_path / "x", learning_rates=[1e-3],
                             **{**common, "train_files": [corpus.root / "test" / "novel3.txt"]})  # fmt: skip


@pytest.mark.usefixtures("one_thread")
def test_finetuning_on_short_haystacks_scores_long_ones(corpus, tmp_path, monkeypatch):
    import experiments.needle as needle

    trained = []

    def spy(builder, tasks, lengths, examples, seed):
        trained.append(list(lengths))
        return build_training_set(builder, tasks, lengths, examples, seed)

    monkeypatch.setattr(needle, "build_training_set", spy)
    splits = {f"{split}_files": [corpus.root / split] for split in ("train", "validation", "test")}
    results = run_needle_benchmark(corpus.orchid, **splits, output_dir=tmp_path, tasks=["copy"],
                                   lengths=[128, 160], train_lengths=[96], depths=[0, 100], examples_per_cell=2,
                                   train_examples=8, max_steps=2, batch_size=4, learning_rates=[1e-7, 1e-3, 10.0],
                                   device="cpu", progress=False)  # fmt: skip
    assert trained == [[96]] and results["train_lengths"] == [96] and results["lengths"] == [128, 160]
    # Validation haystacks are of the training length: one task, one length, two depths, two examples.
    assert results["finetuning"]["validation_examples"] == 4
    assert {cell["length"] for cell in results["cells"]} == {128, 160} and results["window"] >= 160
    assert (tmp_path / "heatmap_copy.png").exists()


def test_the_command_line_names_the_flag_and_value_it_refuses(corpus, tmp_path):
    script = load_script()
    base = ["--model", str(corpus.bert), "--test_files", str(corpus.root / "test"), "--output_dir", str(tmp_path),
            "--no_finetune"]  # fmt: skip
    cases = [
        (["--lengths", "512", "-5"], r"--lengths -5"),
        (["--train_lengths", "2"], r"--train_lengths 2: a haystack length is a whole number of tokens, at least 3"),
        (["--depths", "50", "101"], r"--depths 101\.0: a depth is a percentage of the text, in \[0, 100\]"),
        (["--depths", "-1"], r"--depths -1\.0"),
        (["--tasks", "passkey", "haystack"], r"--tasks 'haystack': not a task"),
        (["--truncation_side", "right"], r"--truncation_side right"),
        (["--examples_per_cell", "0"], r"--examples_per_cell 0"),
    ]
    for extra, message in cases:
        with pytest.raises(ValueError, match=message):
            script.main(base + extra)
    missing = tmp_path / "missing.txt"
    with pytest.raises(ValueError, match=f"--test_files {missing}: no such file or folder"):
        script.main(["--model", str(corpus.bert), "--test_files", str(missing), "--output_dir", str(tmp_path)])
    finetune = ["--model", str(corpus.bert), "--test_files", str(corpus.root / "test"), "--output_dir", str(tmp_path)]
    with pytest.raises(ValueError, match="--train_files is needed to fine-tune"):
        script.main(finetune)
    with pytest.raises(ValueError, match=f"--validation_files {missing}: no such file"):
        script.main(finetune + ["--train_files", str(corpus.root / "train"), "--validation_files", str(missing)])
    with pytest.raises(ValueError, match=r"--learning_rates -0\.001"):
        script.main(finetune + ["--train_files", str(corpus.root / "train"), "--validation_files",
                                str(corpus.root / "validation"), "--learning_rates", "-0.001"])  # fmt: skip
    assert not (tmp_path / "results.json").exists()


def fake_run(seed: int, accuracy: dict[int, float], outside: tuple[int, ...] = ()) -> dict:
    """A needle run's results.json as the report reads it: one task, two depths, ``accuracy`` per length."""
    lengths = sorted(accuracy)
    return {
        "tasks": ["passkey"], "lengths": lengths, "depths": [0.0, 100.0], "seed": seed, "train_lengths": [128],
        "accuracy": {"passkey": {str(n): {"0": accuracy[n], "100": accuracy[n]} for n in lengths}},
        "outside_window": {"passkey": {str(n): [0.0] if n in outside else [] for n in lengths}},
        "speed_and_memory": {str(n): {"seconds_per_example": n / 1e5, "peak_memory_mib": n / 100} for n in lengths},
        "finetuning": {"best_learning_rate": 1e-3, "steps": 10,
                       "runs": [{"learning_rate": 1e-3, "train_seconds": 5.0}]},
    }  # fmt: skip


def test_the_report_puts_seeds_side_by_side_and_sizes_differences_by_them(tmp_path):
    from experiments.needle import report

    orchid = [fake_run(s, {128: 1.0, 2048: 0.9 + 0.02 * s}) for s in range(3)]
    bert = [fake_run(s, {128: 1.0 - 0.01 * s, 2048: 0.1 * s}, outside=(2048,)) for s in range(3)]
    text = report({"Orchid": orchid, "BERT": bert}, [("Orchid", "BERT")])
    assert "| Orchid | passkey | 100% (100 / 100 / 100) | 92% (90 / 92 / 94) |" in text
    assert "| BERT | passkey | 99% (100 / 99 / 98) | 10% (0 / 10 / 20)† |" in text
    # Fine-tuning: 5 s over 10 steps; reading: n / 1e5 s and n / 100 MiB per haystack of n tokens.
    assert "| Orchid | 128 | 0.001 | 0, 1, 2 | 0.50 | 1, 1 | 20, 20 |" in text
    assert "- passkey, 2,048 tokens: Orchid beats BERT by 82.0 points" in text
    assert "- passkey, 128 tokens: Orchid and BERT are level" in text
    two = report({"Orchid": orchid[:2], "BERT": bert[:2]}, [("Orchid", "BERT")])
    assert "- passkey, 2,048 tokens: no difference stated (Orchid − BERT: +86.0 points; fewer than 3 seeds)" in two
    one = report({"Orchid": orchid[:1], "BERT": bert[:1]}, [("Orchid", "BERT")])
    assert "fewer than 3 seeds" in one and "| Orchid | passkey | 100% | 90% |" in one
    # Models scored at different lengths: every length is a column, "–" where a model was not scored, and only
    # the lengths both were scored at are compared.
    longer = [fake_run(s, {2048: 0.5, 8192: 0.2}) for s in range(3)]
    mixed = report({"Orchid": orchid, "longer": longer}, [("Orchid", "longer")])
    assert "| Orchid | passkey | 100% (100 / 100 / 100) | 92% (90 / 92 / 94) | – |" in mixed
    assert "| longer | passkey | – | 50% (50 / 50 / 50) | 20% (20 / 20 / 20) |" in mixed
    assert "| Orchid | 128 | 0.001 | 0, 1, 2 | 0.50 | 1, 1 | 20, 20 | – |" in mixed
    assert "| longer | 128 | 0.001 | 0, 1, 2 | 0.50 | – | 20, 20 | 82, 82 |" in mixed
    assert "- passkey, 2,048 tokens: Orchid beats longer" in mixed and "- passkey, 128 tokens" not in mixed
    assert "- passkey, 8,192 tokens" not in mixed
    with pytest.raises(ValueError, match="compare names 'ViT', which is not among the runs"):
        report({"Orchid": orchid}, [("Orchid", "ViT")])
    with pytest.raises(ValueError, match="the runs of 'Orchid' differ in tasks, lengths or depths"):
        report({"Orchid": [orchid[0], fake_run(1, {128: 1.0})]})

    spec = importlib.util.spec_from_file_location("needle_report", ROOT / "scripts" / "needle_report.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for k, run in enumerate(orchid):
        (tmp_path / f"o{k}").mkdir()
        (tmp_path / f"o{k}" / "results.json").write_text(json.dumps(run))
    output = tmp_path / "tables.md"
    written = script.main([*(f"--run=Orchid={tmp_path / f'o{k}'}" for k in range(3)), "--output", str(output)])
    assert output.read_text() == written == report({"Orchid": orchid})
    with pytest.raises(ValueError, match="give LABEL=RUN_DIR"):
        script.main(["--run", str(tmp_path / "o0")])
    with pytest.raises(ValueError, match="results.json does not exist"):
        script.main(["--run", f"Orchid={tmp_path}"])
