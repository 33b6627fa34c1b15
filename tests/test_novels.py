"""Real-text data from novels (experiments/real_data/novels.py, scripts/prepare_novels.py) on tiny generated novels:
chapters and paragraphs as Gutenberg lays them out, the held-out novel, passages of exactly N tokens, no chapter in both
splits of the attribution task, and a fine-tuning run on the files the script writes."""

import csv
import importlib.util
import json
from pathlib import Path

import pytest
from transformers import BertTokenizer

from experiments.real_data.novels import (
    chapter_passages,
    is_test_chapter,
    split_chapters,
    write_attribution_task,
    write_mlm_corpus,
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


def test_attribution_split_keeps_every_chapter_on_one_side(novels, tmp_path):
    tokenizer = BertTokenizer.from_pretrained(novels / "vocab", do_lower_case=True)
    counts = write_attribution_task([novels / "alpha.txt", novels / "beta.txt"], tokenizer, 16, tmp_path, test_every=3)
    assert counts["chapters"] == {"alpha": {"train": 5, "validation": 2}, "beta": {"train": 4, "validation": 2}}
    sides = {}
    for split in ("train", "validation"):
        with open(tmp_path / f"{split}.csv", newline="") as handle:
            rows = list(csv.DictReader(handle))
        assert len(rows) == sum(counts[split].values())
        for row in rows:
            novel, chapter = int(row["sentence"][1]), int(row["sentence"].split("c")[1].split("w")[0])
            assert row["label"] == ["alpha", "beta"][novel]
            sides.setdefault((novel, chapter), set()).add(split)
    assert all(len(side) == 1 for side in sides.values())
    assert {key for key, side in sides.items() if side == {"validation"}} == {(0, 2), (0, 5), (1, 2), (1, 5)}
    assert [is_test_chapter(i, 5) for i in range(6)] == [False, False, True, False, False, False]
    with pytest.raises(ValueError, match="test_every must be >= 2"):
        write_attribution_task([novels / "alpha.txt"], tokenizer, 16, tmp_path, test_every=1)
    with pytest.raises(ValueError, match="no passage of 4000 tokens"):
        write_attribution_task([novels / "alpha.txt"], tokenizer, 4000, tmp_path)


@pytest.mark.slow
def test_prepared_files_fine_tune_a_classifier(novels, tmp_path):
    spec = importlib.util.spec_from_file_location("prepare_novels", ROOT / "scripts" / "prepare_novels.py")
    prepare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prepare)
    out = tmp_path / "data"
    summary = prepare.main(
        ["--novels", str(novels / "beta.txt"), str(novels / "alpha.txt"), "--held_out", "alpha", "--vocab_dir",
         str(novels / "vocab"), "--passage_tokens", "16", "32", "--test_every", "3", "--output_dir", str(out)]
    )  # fmt: skip
    assert summary["mlm"]["validation"] == {"alpha": 21}
    assert json.loads((out / "attribution-16" / "counts.json").read_text())["chapters"]["beta"]["validation"] == 2
    assert summary["attribution-32"]["validation"] < summary["attribution-16"]["validation"]
    assert BertTokenizer.from_pretrained(out / "tokenizer").tokenize("N0C1W2") == ["n0c1w2"]

    results = finetune(
        ["--train_file", str(out / "attribution-16" / "train.csv"), "--validation_file",
         str(out / "attribution-16" / "validation.csv"), "--tokenizer_name", str(out / "tokenizer"),
         "--config_overrides", "hidden_size=32,num_hidden_layers=1,intermediate_size=64,max_position_embeddings=16,"
         "filter_width=16", "--max_seq_length", "16", "--max_steps", "2", "--per_device_train_batch_size", "4",
         "--output_dir", str(tmp_path / "fit"), "--use_cpu", "--disable_tqdm", "True", "--report_to", "none"]
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
