"""Real-text data from novels (experiments/real_data/novels.py, scripts/prepare_novels.py) on tiny generated novels:
chapters and paragraphs as Gutenberg lays them out, the held-out novel, passages of exactly N tokens, no chapter in two
splits of the attribution and pair tasks, balanced and reproducible pairs, and fine-tuning runs on the files the
script writes (the pairs with BERT's token types reaching the model)."""

import csv
import importlib.util
import json
from pathlib import Path

import pytest
import torch
from orchid_hf.modeling.modeling_orchid import OrchidModel
from transformers import AutoModelForSequenceClassification, AutoTokenizer, BertTokenizer

from experiments.real_data.novels import (
    chapter_passages,
    chapter_split,
    is_test_chapter,
    make_pairs,
    split_chapters,
    write_attribution_task,
    write_mlm_corpus,
    write_pair_task,
)
from orchid_hf.glue import main as finetune

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def chapter_words(novel: int, chapter: int) -> list[str]:
    """Words found only in one chapter of one novel, so a passage tells where it came from."""
    return [f"n{novel}c{chapter}w{k}" for k in range(4)]


def write_novel(path: Path, novel: int, chapters: int, heading: str) -> None:
    lines = [f"NOVEL {novel}", "", "by Somebody", "", "PREFACE TEXT that is not in a chapter.", "", ""]
    for c in range(chapters):
        if c == 2:
            lines += ["VOLUME II", ""]
        lines += [heading.format(roman=["I", "II", "III", "IV", "V", "VI", "VII"][c], n=c + 1), ""]
        words = chapter_words(novel, c)
        for _ in range(3):
            # Hard-wrapped paragraphs of two lines, as in Project Gutenberg.
            lines += [" ".join(words * 3), " ".join(reversed(words)) + ".", ""]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def novels(tmp_path_factory):
    root = tmp_path_factory.mktemp("novels")
    write_novel(root / "alpha.txt", 0, 7, "CHAPTER {roman}")
    write_novel(root / "beta.txt", 1, 6, "Chapter {n}")
    words = [w for n, c in ((0, range(7)), (1, range(6))) for i in c for w in chapter_words(n, i)]
    (root / "vocab").mkdir()
    (root / "vocab" / "vocab.txt").write_text("\n".join(SPECIALS + [".", ","] + words) + "\n")
    return root


def test_chapters_and_paragraphs_follow_the_gutenberg_layout():
    lines = ["TITLE", "", "Preface line.", "", "CHAPTER I", "", "One two", "three.", "", "", "VOLUME II", "",
             "Chapter 2", "Four.", "", "CHAPTER XLV.", "Five", "six."]  # fmt: skip
    assert split_chapters(lines) == [["One two three."], ["Four."], ["Five six."]]
    assert split_chapters(["no heading here", "", "at all"]) == []


def test_mlm_corpus_holds_one_novel_out(novels, tmp_path):
    paths = [novels / "alpha.txt", novels / "beta.txt"]
    counts = write_mlm_corpus(paths, "beta", tmp_path)
    assert counts == {"train": {"alpha": 21}, "validation": {"beta": 18}}
    train = (tmp_path / "train.txt").read_text().splitlines()
    validation = (tmp_path / "validation.txt").read_text().splitlines()
    assert len(train) == 21 and len(validation) == 18
    assert all(line.startswith("n0c") for line in train) and all(line.startswith("n1c") for line in validation)
    with pytest.raises(ValueError, match="held_out='gamma' is not one of the novels \\['alpha', 'beta'\\]"):
        write_mlm_corpus(paths, "gamma", tmp_path)


def test_passages_are_whole_words_that_tokenize_back_to_the_same_pieces(novels, tmp_path):
    tokenizer = BertTokenizer.from_pretrained(novels / "vocab", do_lower_case=True)
    chapter = split_chapters((novels / "alpha.txt").read_text().splitlines())[0]
    pieces = tokenizer.tokenize(" ".join(chapter))
    # One piece per word. 14 per passage: three, and a tail of 9 kept (over half); 25: two, and a tail of 1 dropped.
    assert len(pieces) == 51
    passages = chapter_passages(chapter, tokenizer, 16)
    assert [len(tokenizer(passage)["input_ids"]) for passage in passages] == [16, 16, 16, 11]
    assert [len(tokenizer(passage)["input_ids"]) for passage in chapter_passages(chapter, tokenizer, 27)] == [27, 27]
    with pytest.raises(ValueError, match="passage_tokens must be >= 3"):
        chapter_passages(chapter, tokenizer, 2)

    # Words of several pieces stay whole: a passage never starts inside a word, and its text gives its pieces back.
    (tmp_path / "vocab.txt").write_text("\n".join(SPECIALS + ["walk", "talk", "##ing", "##s", "."]) + "\n")
    pieced = BertTokenizer.from_pretrained(tmp_path, do_lower_case=True)
    paragraph = ["walking talks walk. talking walks walking walk talk."] * 3
    pieces = pieced.tokenize(" ".join(paragraph))
    passages = chapter_passages(paragraph, pieced, 6)  # at most 4 pieces each
    joined = []
    for passage in passages:
        own = pieced.tokenize(passage)
        assert 2 <= len(own) <= 4 and not own[0].startswith("##")
        assert pieced.convert_tokens_to_string(own) == passage
        joined += own
    assert joined == pieces[: len(joined)] and len(pieces) - len(joined) < 2  # only a short tail is dropped


def read_rows(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def origin(passage: str) -> tuple[int, int]:
    """(novel, chapter) of a generated passage, from its words ``n<novel>c<chapter>w<k>``."""
    word = passage.split()[0]
    return int(word[1:].split("c")[0]), int(word.split("c")[1].split("w")[0])


def test_attribution_split_keeps_every_chapter_on_one_side(novels, tmp_path):
    tokenizer = BertTokenizer.from_pretrained(novels / "vocab", do_lower_case=True)
    paths = [novels / "alpha.txt", novels / "beta.txt"]
    counts = write_attribution_task(paths, tokenizer, 16, tmp_path, test_every=3)
    assert counts["chapters"] == {"alpha": {"train": 4, "validation": 1, "test": 2},
                                  "beta": {"train": 3, "validation": 1, "test": 2}}  # fmt: skip
    sides = {}
    for split in ("train", "validation", "test"):
        rows = read_rows(tmp_path / f"{split}.csv")
        assert len(rows) == sum(counts[split].values())
        for row in rows:
            novel, chapter = origin(row["sentence"])
            assert row["label"] == ["alpha", "beta"][novel]
            assert chapter_split(chapter, 3) == split
            sides.setdefault((novel, chapter), set()).add(split)
    assert all(len(side) == 1 for side in sides.values())
    assert {key for key, side in sides.items() if side == {"test"}} == {(0, 2), (0, 5), (1, 2), (1, 5)}
    assert {key for key, side in sides.items() if side == {"validation"}} == {(0, 4), (1, 4)}
    # trainval.csv: every chapter that is not a test chapter, in the novels' order.
    expected = [(passage, name) for path, name in zip(paths, ("alpha", "beta"))
                for index, chapter in enumerate(split_chapters(path.read_text().splitlines()))
                if not is_test_chapter(index, 3) for passage in chapter_passages(chapter, tokenizer, 16)]  # fmt: skip
    assert [(row["sentence"], row["label"]) for row in read_rows(tmp_path / "trainval.csv")] == expected
    assert sum(counts["trainval"].values()) == len(expected) == sum(counts["train"].values()) + sum(
        counts["validation"].values()
    )
    assert [is_test_chapter(i, 5) for i in range(6)] == [False, False, True, False, False, False]
    with pytest.raises(ValueError, match="test_every must be >= 2"):
        write_attribution_task([novels / "alpha.txt"], tokenizer, 16, tmp_path, test_every=1)
    with pytest.raises(ValueError, match="validation_every must be >= 2"):
        write_attribution_task([novels / "alpha.txt"], tokenizer, 16, tmp_path, validation_every=1)
    with pytest.raises(ValueError, match="no passage of 4000 tokens"):
        write_attribution_task([novels / "alpha.txt"], tokenizer, 4000, tmp_path)


def test_validation_chapters_come_from_the_training_chapters_only():
    splits = [chapter_split(index) for index in range(40)]
    assert [i for i, s in enumerate(splits) if s == "test"] == [i for i in range(40) if is_test_chapter(i, 5)]
    assert splits.count("validation") == 8 and splits.count("train") == 24


def test_pairs_are_balanced_split_by_chapter_and_reproducible(novels, tmp_path):
    tokenizer = BertTokenizer.from_pretrained(novels / "vocab", do_lower_case=True)
    paths = [novels / "alpha.txt", novels / "beta.txt"]
    counts = write_pair_task(paths, tokenizer, 16, tmp_path / "a", test_every=3, validation_every=2, seed=0)
    passages = counts["passages"]
    for split in ("train", "validation", "test"):
        rows = read_rows(tmp_path / "a" / f"{split}.csv")
        assert list(rows[0]) == ["sentence1", "sentence2", "label"]
        assert all(row["sentence1"] and row["sentence2"] for row in rows)
        labels = [row["label"] for row in rows]
        assert labels.count("same") == labels.count("different") == len(rows) // 2 == passages[split] // 2
        assert counts[split] == {"same": len(rows) // 2, "different": len(rows) // 2}
        # Every passage opens one pair (an odd one out is left out), and both passages come from this split.
        assert len({row["sentence1"] for row in rows}) == len(rows) >= passages[split] - 1
        for row in rows:
            (novel1, chapter1), (novel2, chapter2) = origin(row["sentence1"]), origin(row["sentence2"])
            assert chapter_split(chapter1, 3, 2) == chapter_split(chapter2, 3, 2) == split
            assert (row["label"] == "same") == (novel1 == novel2)
            assert row["label"] == "different" or chapter1 != chapter2  # a "same" pair spans two chapters
            # [CLS] a [SEP] b [SEP] fits twice the passage length; the second passage is segment 1, as BERT's.
            encoded = tokenizer(row["sentence1"], row["sentence2"])
            assert len(encoded["input_ids"]) <= 2 * 16 - 1
            first = encoded["input_ids"].index(tokenizer.sep_token_id) + 1
            assert encoded["token_type_ids"] == [0] * first + [1] * (len(encoded["input_ids"]) - first)
    test_passages = {text for row in read_rows(tmp_path / "a" / "test.csv") for text in (row["sentence1"],
                                                                                      row["sentence2"])}  # fmt: skip
    trained = {text for name in ("train", "trainval") for row in read_rows(tmp_path / "a" / f"{name}.csv")
               for text in (row["sentence1"], row["sentence2"])}  # fmt: skip
    assert test_passages and not test_passages & trained
    assert read_rows(tmp_path / "a" / "trainval.csv") == [
        *read_rows(tmp_path / "a" / "train.csv"), *read_rows(tmp_path / "a" / "validation.csv")
    ]

    # The same seed gives the same files; another seed other pairs of the same passages.
    write_pair_task(paths, tokenizer, 16, tmp_path / "b", test_every=3, validation_every=2, seed=0)
    write_pair_task(paths, tokenizer, 16, tmp_path / "c", test_every=3, validation_every=2, seed=1)
    for name in ("train", "validation", "test", "trainval", "counts"):
        suffix = "json" if name == "counts" else "csv"
        assert (tmp_path / "a" / f"{name}.{suffix}").read_bytes() == (tmp_path / "b" / f"{name}.{suffix}").read_bytes()
    assert read_rows(tmp_path / "a" / "train.csv") != read_rows(tmp_path / "c" / "train.csv")

    with pytest.raises(ValueError, match=r"pairs need passages of at least 2 novels, got 1 \(\['alpha'\]\)"):
        make_pairs([("alpha", 0, "a"), ("alpha", 1, "b")])
    with pytest.raises(ValueError, match="novel 'beta' has passages in 1 chapter of this split"):
        make_pairs([("alpha", 0, "a"), ("alpha", 1, "b"), ("beta", 3, "c"), ("beta", 3, "d")])
    # With the default split (one chapter in four of the others for validation), these novels have one validation
    # chapter each: too few for a "same" pair.
    with pytest.raises(ValueError, match="has passages in 1 chapter"):
        write_pair_task(paths, tokenizer, 16, tmp_path / "d", test_every=3)


TINY_ORCHID = "hidden_size=32,num_hidden_layers=1,intermediate_size=64,max_position_embeddings=32,filter_width=16"
QUIET = ["--use_cpu", "--disable_tqdm", "True", "--report_to", "none"]


def load_prepare_script():
    spec = importlib.util.spec_from_file_location("prepare_novels", ROOT / "scripts" / "prepare_novels.py")
    prepare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prepare)
    return prepare


@pytest.fixture(scope="module")
def prepared(novels, tmp_path_factory):
    out = tmp_path_factory.mktemp("prepared")
    summary = load_prepare_script().main(
        ["--novels", str(novels / "beta.txt"), str(novels / "alpha.txt"), "--held_out", "alpha", "--vocab_dir",
         str(novels / "vocab"), "--passage_tokens", "16", "32", "--pair_tokens", "8", "--test_every", "3",
         "--validation_every", "2", "--output_dir", str(out)]
    )  # fmt: skip
    return out, summary


@pytest.mark.slow
def test_prepared_files_fine_tune_a_classifier(prepared, tmp_path):
    out, summary = prepared
    assert summary["mlm"]["validation"] == {"alpha": 21}
    assert json.loads((out / "attribution-16" / "counts.json").read_text())["chapters"]["beta"]["test"] == 2
    assert summary["attribution-32"]["test"] < summary["attribution-16"]["test"]
    for task in ("attribution-16", "attribution-32", "pairs-16"):
        assert summary[task]["trainval"] == summary[task]["train"] + summary[task]["validation"]
        assert sorted(path.name for path in (out / task).iterdir()) == [
            "counts.json", "test.csv", "train.csv", "trainval.csv", "validation.csv",
        ]  # fmt: skip
    assert BertTokenizer.from_pretrained(out / "tokenizer").tokenize("N0C1W2") == ["n0c1w2"]

    results = finetune(
        ["--train_file", str(out / "attribution-16" / "train.csv"), "--validation_file",
         str(out / "attribution-16" / "validation.csv"), "--tokenizer_name", str(out / "tokenizer"),
         "--config_overrides", f"{TINY_ORCHID},max_position_embeddings=16", "--max_seq_length", "16", "--max_steps",
         "2", "--per_device_train_batch_size", "4", "--output_dir", str(tmp_path / "fit"), *QUIET]
    )  # fmt: skip
    own = results["tasks"]["own"]
    assert own["initialized_from"] == "new orchid model" and own["epochs_done"] > 0
    accuracy = own["metrics"]["validation"]["accuracy"]
    assert 0.0 <= accuracy <= 1.0
    all_results = json.loads((tmp_path / "fit" / "all_results.json").read_text())
    assert all_results["eval_accuracy"] == accuracy
    assert all_results["eval_samples"] == summary["attribution-16"]["validation"]
    config = json.loads((tmp_path / "fit" / "config.json").read_text())
    assert config["id2label"] == {"0": "alpha", "1": "beta"}


def test_pair_files_fine_tune_orchid_with_token_types(prepared, tmp_path, monkeypatch):
    """scripts/finetune_glue.py takes the pair CSV as a sentence-pair task: the tokenizer gives the second passage
    token type 1, as BERT's does, the collator keeps it, and it reaches Orchid's model, whose embeddings add it."""
    out, summary = prepared
    seen = []
    forward = OrchidModel.forward

    def recording(self, input_ids=None, *args, token_type_ids=None, **kwargs):
        seen.append((input_ids, token_type_ids))
        return forward(self, input_ids, *args, token_type_ids=token_type_ids, **kwargs)

    monkeypatch.setattr(OrchidModel, "forward", recording)
    results = finetune(
        ["--train_file", str(out / "pairs-16" / "train.csv"), "--validation_file",
         str(out / "pairs-16" / "validation.csv"), "--tokenizer_name", str(out / "tokenizer"),
         "--config_overrides", TINY_ORCHID, "--max_seq_length", "16", "--max_steps", "2",
         "--per_device_train_batch_size", "4", "--output_dir", str(tmp_path / "pairs"), *QUIET]
    )  # fmt: skip
    own = results["tasks"]["own"]
    assert own["hyperparameters"]["pooling"] == "mean"  # the recipe's for a new Orchid head
    all_results = json.loads((tmp_path / "pairs" / "all_results.json").read_text())
    assert all_results["eval_samples"] == summary["pairs-16"]["validation"]
    config = json.loads((tmp_path / "pairs" / "config.json").read_text())
    assert config["id2label"] == {"0": "different", "1": "same"} and config["type_vocab_size"] == 2
    assert seen and all(types is not None for _, types in seen)
    tokenizer = AutoTokenizer.from_pretrained(out / "tokenizer")
    for input_ids, token_type_ids in seen:
        assert input_ids.shape == token_type_ids.shape
        for ids, types in zip(input_ids.tolist(), token_type_ids.tolist()):
            seps = [i for i, token in enumerate(ids) if token == tokenizer.sep_token_id]
            assert len(seps) == 2 and ids[0] == tokenizer.cls_token_id
            end = seps[1] + 1  # padding after the second [SEP] has type 0, as the tokenizer pads it
            assert types == [0] * (seps[0] + 1) + [1] * (end - seps[0] - 1) + [0] * (len(ids) - end)

    # The saved classifier reads the token types: the same tokens as one segment give other logits.
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "pairs").eval()
    rows = read_rows(out / "pairs-16" / "validation.csv")[:4]
    batch = tokenizer([r["sentence1"] for r in rows], [r["sentence2"] for r in rows], padding=True,
                      return_tensors="pt")  # fmt: skip
    assert batch["token_type_ids"].max() == 1
    with torch.no_grad():
        logits = model(**batch).logits
        one_segment = model(**{**batch, "token_type_ids": torch.zeros_like(batch["token_type_ids"])}).logits
    assert not torch.allclose(logits, one_segment)
