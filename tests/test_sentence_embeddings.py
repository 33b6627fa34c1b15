"""The pieces of the sentence-embedding experiment (experiments/sentence_embeddings.py, scripts/sentence_embeddings.py)
on small generated novels: pairs, the retrieval task, a run of each model, the report."""

import json
from pathlib import Path

import pytest
from transformers import BertTokenizer

from experiments.real_data.novels import chapter_passages, read_novel
from experiments.sentence_embeddings import chapter_pairs, retrieval_task

from .test_novels import SPECIALS, chapter_words, write_novel
from .test_real_data import load_script

main = load_script("sentence_embeddings").main

pytestmark = pytest.mark.usefixtures("one_thread")

NOVELS = {"alpha": (0, 7), "beta": (1, 6), "gamma": (2, 5)}


@pytest.fixture(scope="module")
def novels(tmp_path_factory):
    root = tmp_path_factory.mktemp("novels")
    for name, (number, chapters) in NOVELS.items():
        write_novel(root / f"{name}.txt", number, chapters, "CHAPTER {roman}")
    words = [w for number, chapters in NOVELS.values() for c in range(chapters) for w in chapter_words(number, c)]
    (root / "vocab").mkdir()
    (root / "vocab" / "vocab.txt").write_text("\n".join(SPECIALS + [".", ","] + words) + "\n")
    return root


@pytest.fixture(scope="module")
def tokenizer(novels):
    return BertTokenizer.from_pretrained(novels / "vocab", do_lower_case=True)


def chapter_of(text: str) -> str:
    """The chapter a passage of the generated novels comes from: its words are "n{novel}c{chapter}w{k}"."""
    return text.split()[0].rsplit("w", 1)[0]


def test_pairs_are_two_disjoint_spans_of_one_chapter_spread_over_the_list(novels, tokenizer):
    chapters = read_novel(novels / "alpha.txt") + read_novel(novels / "beta.txt")
    pairs = chapter_pairs(chapters, tokenizer, anchor_tokens=8, positive_passages=2, pairs_per_chapter=3)
    assert len(pairs) == 3 * len(chapters)
    for anchor, positive in pairs:
        assert len(tokenizer(anchor)["input_ids"]) <= 8
        assert len(tokenizer(positive)["input_ids"]) <= 2 * 6 + 2
        assert {chapter_of(word) for word in positive.split() if word != "."} == {chapter_of(anchor)}
    # The anchor passage is not part of its positive span: the spans' passages are whole passages of the chapter.
    passages = chapter_passages(chapters[0], tokenizer, 8)
    for anchor, positive in pairs:
        if chapter_of(anchor) == chapter_of(passages[0]):
            index = passages.index(anchor)
            span = [p for p in passages if p in positive]
            assert anchor not in span and len(span) >= 2 and index not in [passages.index(p) for p in span]
    # The first len(chapters) pairs hold one pair of each chapter: a batch of them has no false negatives.
    assert len({chapter_of(anchor) for anchor, _ in pairs[: len(chapters)]}) == len(chapters)
    with pytest.raises(ValueError, match="positive_passages and pairs_per_chapter must be >= 1, got 0 and 3"):
        chapter_pairs(chapters, tokenizer, positive_passages=0, pairs_per_chapter=3)
    # A chapter too short for an anchor and a disjoint positive gives no pair.
    assert chapter_pairs(chapters, tokenizer, anchor_tokens=8, positive_passages=20) == []


def test_retrieval_task_has_every_chapter_whole_and_queries_pointing_to_theirs(novels, tokenizer):
    chapters = read_novel(novels / "gamma.txt")
    queries, corpus, relevant = retrieval_task(chapters, tokenizer, query_tokens=8, queries_per_chapter=3)
    assert list(corpus.values()) == [" ".join(chapter) for chapter in chapters]
    assert len(queries) == 3 * len(chapters) and set(relevant) == set(queries)
    for query_id, text in queries.items():
        (chapter_id,) = relevant[query_id]
        assert text in corpus[chapter_id] and chapter_of(text) == chapter_of(corpus[chapter_id])
    with pytest.raises(ValueError, match="queries_per_chapter must be >= 1, got 0"):
        retrieval_task(chapters, tokenizer, queries_per_chapter=0)


@pytest.mark.slow
def test_the_script_trains_and_evaluates_both_models_and_reports(novels, tmp_path):
    common = ["--novels", *(str(novels / f"{name}.txt") for name in NOVELS), "--held_out", "gamma",
              "--vocab_dir", str(novels / "vocab"), "--hidden_size", "32", "--num_hidden_layers", "1",
              "--steps", "3", "--batch_size", "4", "--anchor_tokens", "8", "--positive_passages", "2",
              "--queries_per_chapter", "2", "--truncated_length", "32"]  # fmt: skip
    runs = []
    for model in ("orchid", "bert"):
        results = main(["train", "--model", model, "--output_dir", str(tmp_path / model), *common])
        assert results == json.loads((tmp_path / model / "results.json").read_text())
        assert results["training_novels"] == ["alpha", "beta"] and results["chapters"] == 5
        assert results["queries"] == 10 and len(results["losses"]) == 3
        assert [e["max_seq_length"] for e in results["evaluations"]] == [32, 128]
        for evaluation in results["evaluations"]:
            assert 0 <= evaluation["recall@1"] <= evaluation["recall@5"] <= 1
            assert 1 / 5 <= evaluation["mrr@5"] <= 1 and evaluation["eval_cpu_seconds"] >= 0
        runs.append(results)
    assert runs[0]["sizes"]["hidden_size"] == runs[1]["sizes"]["hidden_size"] == 32
    table = main(["report", "--runs", str(tmp_path / "orchid"), str(tmp_path / "bert"), "--output",
                  str(tmp_path / "report.md"), "--command", "the command"])  # fmt: skip
    assert Path(tmp_path / "report.md").read_text() == table
    assert table.count("\n| orchid |") == 2 and table.count("\n| bert |") == 2 and "`the command`" in table
    with pytest.raises(ValueError, match=r"held_out='delta' is not one of the novels \['alpha', 'beta', 'gamma'\]"):
        main(["train", "--model", "orchid", "--output_dir", str(tmp_path / "x"), *common, "--held_out", "delta"])
