"""Real text from novels in Project Gutenberg's layout (hard-wrapped lines, paragraphs separated by empty lines,
chapter headings on their own lines): a masked-LM corpus with one novel held out, and two classification tasks split
by chapter (:func:`chapter_split`): passage-to-novel attribution, and pairs of passages labelled by whether they come
from the same novel. ``scripts/prepare_novels.py`` is the command line; docs/results/real_data.md uses it on Jane
Austen's six novels.

>>> chapters = split_chapters(["EMMA", "", "CHAPTER I", "", "Emma Woodhouse,", "handsome.", "", "She was."])
>>> chapters
[['Emma Woodhouse, handsome.', 'She was.']]
"""

from __future__ import annotations

import csv
import random
import re
from pathlib import Path

from benchmarks.harness import provenance, write_json

# "CHAPTER I", "Chapter 12", "CHAPTER XLV." on a line of their own.
CHAPTER_HEADING = re.compile(r"^\s*chapter\s+([0-9]+|[ivxlcdm]+)\.?\s*$", re.IGNORECASE)
# Division headings inside a novel ("VOLUME II") that are not text.
DIVISION_HEADING = re.compile(r"^\s*(volume|book|part)\s+([0-9]+|[ivxlcdm]+|one|two|three)\.?\s*$", re.IGNORECASE)


def split_chapters(lines: list[str]) -> list[list[str]]:
    """The chapters of a novel, each a list of paragraphs (a paragraph's wrapped lines joined by spaces). Text
    before the first chapter heading (title, preface) is not part of any chapter."""
    chapters: list[list[str]] | None = None
    paragraph: list[str] = []

    def close_paragraph():
        if paragraph and chapters is not None:
            chapters[-1].append(" ".join(paragraph))
        paragraph.clear()

    for line in lines:
        text = line.strip()
        if CHAPTER_HEADING.match(text):
            close_paragraph()
            chapters = [] if chapters is None else chapters
            chapters.append([])
        elif not text or DIVISION_HEADING.match(text):
            close_paragraph()
        else:
            paragraph.append(text)
    close_paragraph()
    return [chapter for chapter in (chapters or []) if chapter]


def read_novel(path: str | Path) -> list[list[str]]:
    """:func:`split_chapters` of a text file; a ``ValueError`` if it has no chapter heading."""
    chapters = split_chapters(Path(path).read_text(encoding="utf-8").splitlines())
    if not chapters:
        raise ValueError(f"{path}: no chapter heading (a line such as 'CHAPTER I' or 'Chapter 1') was found")
    return chapters


def novel_name(path: str | Path) -> str:
    return Path(path).stem


def write_mlm_corpus(paths: list[str | Path], held_out: str, out_dir: str | Path) -> dict:
    """``train.txt`` (every paragraph of every novel but ``held_out``, one per line) and ``validation.txt`` (the
    held-out novel's paragraphs), the files ``scripts/pretrain_mlm.py --train_file/--validation_file`` reads."""
    names = [novel_name(p) for p in paths]
    if held_out not in names:
        raise ValueError(f"held_out={held_out!r} is not one of the novels {names}")
    if len(names) < 2:
        raise ValueError(f"a held-out novel needs at least 2 novels, got {len(names)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {"train": {}, "validation": {}}
    with open(out_dir / "train.txt", "w", encoding="utf-8") as train, open(
        out_dir / "validation.txt", "w", encoding="utf-8"
    ) as validation:
        for path, name in zip(paths, names):
            split, handle = ("validation", validation) if name == held_out else ("train", train)
            paragraphs = [p for chapter in read_novel(path) for p in chapter]
            handle.writelines(p + "\n" for p in paragraphs)
            counts[split][name] = len(paragraphs)
    return counts


def chapter_passages(chapter: list[str], tokenizer, passage_tokens: int) -> list[str]:
    """A chapter cut into passages of at most ``passage_tokens`` tokens once [CLS] and [SEP] are added, made of
    whole words (a word's WordPiece continuations, ``##...``, stay with it), so that the tokenizer turns each
    passage's text back into the same pieces. A passage is closed when the next word would not fit; the rest of the
    chapter, if shorter than half a passage, is dropped."""
    if passage_tokens < 3:
        raise ValueError(f"passage_tokens must be >= 3 ([CLS], [SEP] and a token), got {passage_tokens}")
    size = passage_tokens - 2
    words: list[list[str]] = []
    for piece in tokenizer.tokenize(" ".join(chapter)):
        if piece.startswith("##") and words:
            words[-1].append(piece)
        else:
            words.append([piece])
    passages, current = [], []
    for word in words:
        if len(word) > size:  # a word longer than a passage (never in prose): left out
            continue
        if len(current) + len(word) > size:
            passages.append(current)
            current = []
        current += word
    if len(current) * 2 >= size:
        passages.append(current)
    return [tokenizer.convert_tokens_to_string(pieces) for pieces in passages]


def is_test_chapter(index: int, test_every: int) -> bool:
    """Every ``test_every``-th chapter (the 3rd, 8th, 13th, ... for 5) is a test chapter: spread over each novel."""
    return index % test_every == min(2, test_every - 1)


# The splits of a task, and the file that trains the models evaluated on the test chapters without a choice made on
# the validation chapters (every chapter that is not a test chapter).
SPLITS = ("train", "validation", "test")
TRAINVAL = "trainval"


def chapter_split(index: int, test_every: int = 5, validation_every: int = 4) -> str:
    """``test`` for the test chapters (:func:`is_test_chapter`); of the others, one in ``validation_every`` (the
    4th, 8th, ... of them for 4) is a validation chapter, so that choices are made without the test chapters."""
    if test_every < 2:
        raise ValueError(f"test_every must be >= 2 (one chapter in test_every is a test chapter), got {test_every}")
    if validation_every < 2:
        raise ValueError(
            f"validation_every must be >= 2 (one training chapter in validation_every is a validation chapter), got "
            f"{validation_every}"
        )
    if is_test_chapter(index, test_every):
        return "test"
    kept = index - sum(is_test_chapter(i, test_every) for i in range(index))
    return "validation" if kept % validation_every == validation_every - 1 else "train"


def split_passages(
    paths: list[str | Path], tokenizer, passage_tokens: int, test_every: int = 5, validation_every: int = 4
) -> tuple[list[tuple[str, str, int, str]], dict]:
    """The passages of every chapter (:func:`chapter_passages`), each as (split, novel, chapter index, text) in the
    order of the novels, their chapters and the text, with each chapter's split (:func:`chapter_split`); and the
    number of chapters per novel and split. A ``ValueError`` if a split gets no passage."""
    passages: list[tuple[str, str, int, str]] = []
    chapters: dict[str, dict[str, int]] = {}
    for path in paths:
        name = novel_name(path)
        chapters[name] = dict.fromkeys(SPLITS, 0)
        for index, chapter in enumerate(read_novel(path)):
            split = chapter_split(index, test_every, validation_every)
            passages += [(split, name, index, text) for text in chapter_passages(chapter, tokenizer, passage_tokens)]
            chapters[name][split] += 1
    for split in SPLITS:
        if not any(row[0] == split for row in passages):
            raise ValueError(
                f"the {split} split has no passage of {passage_tokens} tokens: the chapters are too short or too few"
            )
    return passages, chapters


def _write_csv(path: Path, header: tuple[str, ...], rows: list[tuple]) -> None:
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)


def write_attribution_task(
    paths: list[str | Path],
    tokenizer,
    passage_tokens: int,
    out_dir: str | Path,
    test_every: int = 5,
    validation_every: int = 4,
) -> dict:
    """Passage-to-novel attribution: ``train.csv``, ``validation.csv`` and ``test.csv`` with columns ``sentence`` (a
    passage of at most ``passage_tokens`` tokens, :func:`chapter_passages`) and ``label`` (the novel's file name),
    split by chapter (:func:`chapter_split`) so that no chapter gives passages to two splits; ``trainval.csv`` holds
    the training and validation chapters' passages in the novels' order. Returns the passage counts per split and
    novel, and the chapters per novel and split (also in ``counts.json``)."""
    passages, chapters = split_passages(paths, tokenizer, passage_tokens, test_every, validation_every)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    counts: dict = {split: {} for split in SPLITS}
    for split in SPLITS:
        rows = [(text, name) for side, name, _, text in passages if side == split]
        _write_csv(out_dir / f"{split}.csv", ("sentence", "label"), rows)
        for _, name in rows:
            counts[split][name] = counts[split].get(name, 0) + 1
    rows = [(text, name) for side, name, _, text in passages if side != "test"]
    _write_csv(out_dir / f"{TRAINVAL}.csv", ("sentence", "label"), rows)
    counts[TRAINVAL] = {name: counts["train"].get(name, 0) + counts["validation"].get(name, 0) for name in chapters}
    counts["chapters"] = chapters
    write_json(out_dir / "counts.json", {**counts, **provenance()})
    return counts


# The labels of the pair task: whether the two passages come from the same novel.
SAME, DIFFERENT = "same", "different"


def make_pairs(passages: list[tuple[str, int, str]], seed: int | str = 0) -> list[tuple[str, str, str]]:
    """Pairs of passages (novel, chapter index, text) of one split, as (sentence1, sentence2, label): every passage
    is the first of one pair, in an order drawn with ``seed``; half of them (an odd one out is left out) get a
    second passage from the same novel but another chapter (label ``same``), so that a pair cannot be told by the
    chapter's names and scene, and the other half one from another novel (``different``), drawn uniformly among the
    split's passages of the other novels. Labels are balanced exactly, and the same passages and seed give the same
    pairs."""
    rng = random.Random(seed)
    by_novel: dict[str, list[tuple[int, str]]] = {}
    for name, chapter, text in passages:
        by_novel.setdefault(name, []).append((chapter, text))
    if len(by_novel) < 2:
        raise ValueError(f"pairs need passages of at least 2 novels, got {len(by_novel)} ({sorted(by_novel)})")
    for name, rows in by_novel.items():
        if len({chapter for chapter, _ in rows}) < 2:
            raise ValueError(
                f"pairs: novel {name!r} has passages in {len({c for c, _ in rows})} chapter of this split; a 'same' "
                "pair needs passages of two chapters of one novel"
            )
    order = rng.sample(range(len(passages)), len(passages) - len(passages) % 2)
    pairs = []
    for position, index in enumerate(order):
        name, chapter, text = passages[index]
        # Drawn again until the condition holds: uniform over the passages that meet it, in a few draws.
        if position % 2 == 0:
            partner_chapter, partner = rng.choice(by_novel[name])
            while partner_chapter == chapter:
                partner_chapter, partner = rng.choice(by_novel[name])
            pairs.append((text, partner, SAME))
        else:
            novel, _, partner = rng.choice(passages)
            while novel == name:
                novel, _, partner = rng.choice(passages)
            pairs.append((text, partner, DIFFERENT))
    return pairs


def write_pair_task(
    paths: list[str | Path],
    tokenizer,
    passage_tokens: int,
    out_dir: str | Path,
    test_every: int = 5,
    validation_every: int = 4,
    seed: int = 0,
) -> dict:
    """Same novel or not: ``train.csv``, ``validation.csv`` and ``test.csv`` with columns ``sentence1``,
    ``sentence2`` (passages of at most ``passage_tokens`` tokens with their [CLS] and [SEP], so that a pair encoded
    as ``[CLS] a [SEP] b [SEP]`` fits ``2 * passage_tokens - 1`` tokens) and ``label`` (``same`` or ``different``,
    :func:`make_pairs`), both passages of a pair from chapters of the same split (:func:`chapter_split`, as the
    attribution task splits them); ``trainval.csv`` holds the training pairs, then the validation pairs. Returns the
    pair counts per split and label, the passages per split, and the chapters per novel and split (also in
    ``counts.json``)."""
    passages, chapters = split_passages(paths, tokenizer, passage_tokens, test_every, validation_every)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    header = ("sentence1", "sentence2", "label")
    counts: dict = {"passages": {}}
    pairs = {}
    for split in SPLITS:
        rows = [(name, chapter, text) for side, name, chapter, text in passages if side == split]
        pairs[split] = make_pairs(rows, f"{seed}-{split}")
        _write_csv(out_dir / f"{split}.csv", header, pairs[split])
        counts[split] = {label: sum(row[2] == label for row in pairs[split]) for label in (SAME, DIFFERENT)}
        counts["passages"][split] = len(rows)
    _write_csv(out_dir / f"{TRAINVAL}.csv", header, pairs["train"] + pairs["validation"])
    counts[TRAINVAL] = {label: counts["train"][label] + counts["validation"][label] for label in (SAME, DIFFERENT)}
    counts["chapters"] = chapters
    write_json(out_dir / "counts.json", {**counts, **provenance()})
    return counts


__all__ = [
    "CHAPTER_HEADING",
    "DIFFERENT",
    "SAME",
    "SPLITS",
    "TRAINVAL",
    "chapter_passages",
    "chapter_split",
    "is_test_chapter",
    "make_pairs",
    "novel_name",
    "read_novel",
    "split_chapters",
    "split_passages",
    "write_attribution_task",
    "write_mlm_corpus",
    "write_pair_task",
]
