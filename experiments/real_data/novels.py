"""Real text from novels in Project Gutenberg's layout (hard-wrapped lines, paragraphs separated by empty lines,
chapter headings on their own lines): a masked-LM corpus with one novel held out, and passage-to-novel
attribution split by chapter. ``scripts/prepare_novels.py`` is the command line; docs/results/real_data.md uses it
on Jane Austen's six novels.

>>> chapters = split_chapters(["EMMA", "", "CHAPTER I", "", "Emma Woodhouse,", "handsome.", "", "She was."])
>>> chapters
[['Emma Woodhouse, handsome.', 'She was.']]
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

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


def write_attribution_task(
    paths: list[str | Path], tokenizer, passage_tokens: int, out_dir: str | Path, test_every: int = 5
) -> dict:
    """Passage-to-novel attribution: ``train.csv`` and ``validation.csv`` with columns ``sentence`` (a passage of
    at most ``passage_tokens`` tokens, :func:`chapter_passages`) and ``label`` (the novel's file name), split by
    chapter so that no chapter gives passages to both (:func:`is_test_chapter`). Returns the passage counts per
    split and novel."""
    if test_every < 2:
        raise ValueError(f"test_every must be >= 2 (one chapter in test_every is a test chapter), got {test_every}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = {"train": [], "validation": []}
    counts = {"train": {}, "validation": {}, "chapters": {}}
    for path in paths:
        name = novel_name(path)
        chapters = read_novel(path)
        counts["chapters"][name] = {"train": 0, "validation": 0}
        for index, chapter in enumerate(chapters):
            split = "validation" if is_test_chapter(index, test_every) else "train"
            passages = chapter_passages(chapter, tokenizer, passage_tokens)
            rows[split] += [(passage, name) for passage in passages]
            counts[split][name] = counts[split].get(name, 0) + len(passages)
            counts["chapters"][name][split] += 1
    for split, split_rows in rows.items():
        if not split_rows:
            raise ValueError(
                f"the {split} split has no passage of {passage_tokens} tokens: the chapters are too short or too few"
            )
        with open(out_dir / f"{split}.csv", "w", encoding="utf-8", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(("sentence", "label"))
            writer.writerows(split_rows)
    (out_dir / "counts.json").write_text(json.dumps(counts, indent=2) + "\n")
    return counts


__all__ = [
    "CHAPTER_HEADING",
    "chapter_passages",
    "is_test_chapter",
    "novel_name",
    "read_novel",
    "split_chapters",
    "write_attribution_task",
    "write_mlm_corpus",
]
