"""Needle in a haystack on real text for masked LMs (``scripts/needle_benchmark.py``; docs/results/needle.md).

A haystack is ``[CLS] <text> <question> [SEP]``, exactly ``length`` tokens: a window of real text from plain-text
files (read as novels in Project Gutenberg's layout, :func:`experiments.real_data.novels.read_novel`) with a
*needle* placed at a *depth* (0% right after ``[CLS]``, 100% right before the question), and a question at the end
whose answer tokens are ``[MASK]``. The answer positions are the only labelled positions. Three tasks
(:data:`TASKS`):

- ``passkey``: "The pass key is 4 8 2 1 3. Remember it. 4 8 2 1 3 is the pass key." is inserted in the text; the
  question "What is the pass key? The pass key is [MASK] [MASK] [MASK] [MASK] [MASK]." asks for its digits, written
  apart so that each is one token of a WordPiece vocabulary;
- ``needle``: a made-up fact (:data:`NEEDLE_FACTS`: a place, an object or a name, a word of two or three
  :data:`SYLLABLES` that the file never holds and the vocabulary has no token for, :data:`MADE_UP_WORDS`) is
  inserted in the text; its restatement at the end has the made-up word masked (one ``[MASK]`` per token of it);
- ``copy``: a span of the text itself (at the depth) is repeated at the end with some of its words masked, the
  positive control: a model that reads as far back as the span can always copy it.

An example is a hit when every answer token is predicted right (arg-max of the masked-LM head). The needle and the
question are tokenized on their own and joined to the text's tokens at word boundaries, so the haystack's length is
exact; the needle's first token stands at ``1 + depth / 100 * (tokens of text and needle - tokens of the needle)``,
moved to the nearest word start (within a token or two in prose; the copy task's span also ends at a word start).

Haystacks of one length and example index share their window of text across depths and tasks (the same seed draws
it), so that a heat map's cells differ by where the needle stands and not by the text around it. Training,
validation and test haystacks come from separate files (:func:`run_needle_benchmark`). A model whose window is
shorter than a haystack reads its end (``truncation_side="left"``: ``[CLS]`` and the last ``window - 1`` tokens),
so the question is always kept; the results say at which depths the needle falls outside the window.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
import re
import statistics
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.harness import peak_bytes, provenance, table_lines, timed_call, write_json
from experiments.real_data.novels import novel_name, read_novel, split_chapters

TASKS = ("passkey", "needle", "copy")
DEFAULT_LENGTHS = (512, 2048, 8192)
DEFAULT_DEPTHS = (0.0, 25.0, 50.0, 75.0, 100.0)
DEFAULT_LEARNING_RATES = (3e-5, 1e-4, 3e-4, 1e-3)
TRUNCATION_SIDES = ("left",)

PASSKEY_NEEDLE = "The pass key is {digits}. Remember it. {digits} is the pass key."
PASSKEY_QUESTION = "What is the pass key? The pass key is"
# (kind, the fact with {key} for the made-up word, the question asked before the fact is restated with it masked).
NEEDLE_FACTS = (
    ("place", "The old map is hidden in the town of {key}.", "Where is the old map hidden?"),
    ("object", "The traveller always carries a {key} in her coat.", "What does the traveller always carry?"),
    ("name", "The lighthouse keeper is called {key}.", "What is the lighthouse keeper called?"),
)
# Made-up words are two or three of these; a word that the file holds is never drawn (NeedleBuilder.made_up_word).
SYLLABLES = ("bra", "cor", "dun", "fel", "gar", "hul", "kes", "lom", "mir", "nav", "pos", "quil", "ros", "sab", "tor",
             "vek", "wim", "zan")  # fmt: skip
MADE_UP_WORDS = tuple("".join(parts) for count in (2, 3) for parts in itertools.product(SYLLABLES, repeat=count))
WORD = re.compile(r"[^\W\d_]+")


# ---------------------------------------------------------------------------------------------
# Text
# ---------------------------------------------------------------------------------------------


def text_files(paths: str | Path | Iterable[str | Path], name: str = "files") -> list[Path]:
    """The text files that ``paths`` names: files as given, folders as their ``*.txt`` files in name order. A
    ``ValueError`` naming ``name`` (the argument or flag) and the path for a path that does not exist, a folder
    without text files, or no path at all."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(path.glob("*.txt"))
            if not found:
                raise ValueError(f"{name} {path}: the folder holds no .txt file")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise ValueError(f"{name} {path}: no such file or folder")
    if not files:
        raise ValueError(f"{name}: no file given")
    return files


def read_paragraphs(path: str | Path) -> list[str]:
    """The paragraphs of a text file in reading order: the chapters' paragraphs of a novel in Project Gutenberg's
    layout (:func:`~experiments.real_data.novels.read_novel`, which leaves out the title and preface), or, for a file
    without chapter headings, every paragraph of the file (blank-line separated, wrapped lines joined)."""
    try:
        chapters = read_novel(path)
    except ValueError:
        # The whole file as one chapter: the novels' reader under a heading of its own.
        chapters = split_chapters(["CHAPTER I", *Path(path).read_text(encoding="utf-8").splitlines()])
    return [paragraph for chapter in chapters for paragraph in chapter]


@dataclass(frozen=True)
class TextSource:
    """One file's text as a token stream: ``ids`` (the paragraphs' tokens, one after the other, no special token),
    ``word_start`` (whether each token starts a word, as the tokenizer's pre-tokenizer splits words) and ``words``
    (the lower-cased words of the text, which a made-up word must not be)."""

    name: str
    path: str
    ids: np.ndarray
    word_start: np.ndarray
    words: frozenset[str]


def word_starts(tokenizer, encoding, index: int, ids: Sequence[int]) -> list[bool]:
    """Per token of one encoded text: whether it starts a word. From the encoding's ``word_ids`` where the tokenizer
    gives them, otherwise by WordPiece's rule (a continuation is ``##...``)."""
    if getattr(tokenizer, "is_fast", False):
        words = encoding.word_ids(index)
        return [k == 0 or words[k] != words[k - 1] for k in range(len(words))]
    return [not piece.startswith("##") for piece in tokenizer.convert_ids_to_tokens(list(ids))]


def load_sources(paths: Sequence[str | Path], tokenizer) -> list[TextSource]:
    """A :class:`TextSource` of each file (:func:`read_paragraphs`); a ``ValueError`` for a file without text."""
    sources = []
    for path in paths:
        paragraphs = read_paragraphs(path)
        if not paragraphs:
            raise ValueError(f"{path}: no text (no paragraph was found)")
        encoding = tokenizer(paragraphs, add_special_tokens=False, verbose=False)
        ids: list[int] = []
        starts: list[bool] = []
        for index, paragraph_ids in enumerate(encoding["input_ids"]):
            ids += paragraph_ids
            starts += word_starts(tokenizer, encoding, index, paragraph_ids)
        words = frozenset(WORD.findall(" ".join(paragraphs).lower()))
        sources.append(TextSource(novel_name(path), str(path), np.asarray(ids, dtype=np.int64),
                                  np.asarray(starts, dtype=bool), words))  # fmt: skip
    return sources


# ---------------------------------------------------------------------------------------------
# Haystacks
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Haystack:
    """One example: ``input_ids`` (``[CLS]`` text with the needle, question, ``[SEP]``; ``length`` tokens) and
    ``labels`` (the answer's token at each ``[MASK]`` of the question, -100 elsewhere). The needle (the inserted
    sentence, or the copy task's span) is ``input_ids[needle_start:needle_end]``, the question
    ``input_ids[question_start:-1]``; ``answer`` is the answer as text; ``source`` and ``offset`` say which file and
    token of its stream the window of text starts at."""

    task: str
    length: int
    depth: float
    input_ids: tuple[int, ...]
    labels: tuple[int, ...]
    needle_start: int
    needle_end: int
    question_start: int
    answer: str
    source: str
    offset: int


def seeded_random(*key) -> random.Random:
    """A generator seeded by the SHA-256 of ``key``'s parts: keys that differ in one character give unrelated draws
    (seeded with the strings themselves, Mersenne Twister's first draws of "s-1" and "s-2" are close)."""
    digest = hashlib.sha256("\x1f".join(map(str, key)).encode()).digest()
    return random.Random(int.from_bytes(digest, "big"))


def nearest_boundary(boundaries: np.ndarray, target: float) -> int:
    """The index of ``boundaries`` (a boolean array) that is True and nearest ``target`` (the lower one on a tie)."""
    candidates = np.flatnonzero(boundaries)
    if not len(candidates):
        raise ValueError("no word boundary to place the needle at")
    return int(candidates[np.argmin(np.abs(candidates - target))])


def occurs_as_word(ids: np.ndarray, word_start: np.ndarray, word: Sequence[int]) -> bool:
    """Whether the tokens ``word`` stand in ``ids`` as a whole word (starting a word, followed by a word start or
    the end)."""
    size = len(word)
    if size == 0 or size > len(ids):
        return False
    windows = np.lib.stride_tricks.sliding_window_view(ids, size)
    ends = np.append(word_start, True)[size:]
    return bool(((windows == np.asarray(word)).all(axis=1) & word_start[: len(windows)] & ends).any())


class NeedleBuilder:
    """Builds :class:`Haystack` examples from ``sources`` with ``tokenizer`` (which needs ``[CLS]``, ``[SEP]`` and
    ``[MASK]``, and for the passkey task each digit as one token). ``passkey_digits`` digits make a pass key; the
    copy task repeats ``copy_span`` tokens with ``copy_masked`` whole words of them masked (every token of each),
    never in the span's first quarter (which shows the model where the copy comes from)."""

    def __init__(self, sources: Sequence[TextSource], tokenizer, passkey_digits: int = 5, copy_span: int = 32,
                 copy_masked: int = 4):  # fmt: skip
        if not sources:
            raise ValueError("no text: give at least one file")
        if passkey_digits < 1:
            raise ValueError(f"passkey_digits must be >= 1, got {passkey_digits}")
        if not 1 <= copy_masked <= copy_span - copy_span // 4:
            raise ValueError(f"copy_masked must be between 1 and the span's last three quarters "
                             f"({copy_span - copy_span // 4} of copy_span={copy_span}), got {copy_masked}")  # fmt: skip
        self.sources = list(sources)
        self.tokenizer = tokenizer
        self.passkey_digits = passkey_digits
        self.copy_span = copy_span
        self.copy_masked = copy_masked
        self.free_words: dict[str, list[str]] = {}
        self.vocabulary_words: set[str] | None = None
        self.cls, self.sep, self.mask = tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.mask_token_id
        if None in (self.cls, self.sep, self.mask):
            raise ValueError("the tokenizer needs [CLS], [SEP] and [MASK] tokens (cls_token, sep_token, mask_token)")

    def tokens(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]

    def check_digits(self) -> None:
        """A ``ValueError`` unless each digit, written apart, is one token of the tokenizer (a pass key's digits are
        then its answer tokens)."""
        digits = [str(d) for d in range(10)]
        pieces = self.tokenizer.tokenize(" ".join(digits))
        if pieces != digits:
            raise ValueError(f"the passkey task needs each digit as one token, but the tokenizer writes "
                             f"'0 1 ... 9' as {pieces}")  # fmt: skip

    def made_up_word(self, rng: random.Random, source: TextSource) -> str:
        """One of :data:`MADE_UP_WORDS` that is not a word of ``source`` nor one token of the vocabulary (a real
        word, such as "brakes")."""
        if source.path not in self.free_words:
            if self.vocabulary_words is None:
                pieces = self.tokenizer(list(MADE_UP_WORDS), add_special_tokens=False, verbose=False)["input_ids"]
                self.vocabulary_words = {word for word, ids in zip(MADE_UP_WORDS, pieces) if len(ids) == 1}
            self.free_words[source.path] = [
                word for word in MADE_UP_WORDS if word not in source.words and word not in self.vocabulary_words
            ]
        if not self.free_words[source.path]:
            raise ValueError(f"{source.path}: every made-up word of SYLLABLES is a word of the text")
        return rng.choice(self.free_words[source.path])

    def needle_and_question(self, task: str, rng: random.Random, source: TextSource):
        """``(needle ids, question ids, question labels, answer text, answer ids)`` of the passkey or needle task."""
        if task == "passkey":
            digits = " ".join(str(rng.randrange(10)) for _ in range(self.passkey_digits))
            answer_ids = self.tokens(digits)
            needle = self.tokens(PASSKEY_NEEDLE.format(digits=digits))
            prompt, after = self.tokens(PASSKEY_QUESTION), self.tokens(".")
            answer = digits
        else:
            kind, fact, question = rng.choice(NEEDLE_FACTS)
            answer = self.made_up_word(rng, source)
            before, _, after_text = fact.partition("{key}")
            key = answer if kind == "object" else answer.capitalize()  # places and names are proper nouns
            answer_ids = self.tokens(key)
            needle = self.tokens(fact.format(key=key))
            prompt, after = self.tokens(question) + self.tokens(before), self.tokens(after_text)
        question_ids = prompt + [self.mask] * len(answer_ids) + after
        labels = [-100] * len(prompt) + list(answer_ids) + [-100] * len(after)
        return needle, question_ids, labels, answer, answer_ids

    def window(self, source: TextSource, size: int, fraction: float) -> int:
        """The start of a window of ``size`` tokens of ``source`` that starts and ends at word boundaries, chosen by
        ``fraction`` in [0, 1) among all such windows."""
        n = len(source.ids)
        ends = np.append(source.word_start, True)[size : n + 1]
        candidates = np.flatnonzero(source.word_start[: n - size + 1] & ends)
        if not len(candidates):
            raise ValueError(f"{source.path}: no window of {size} tokens starts and ends at a word boundary")
        return int(candidates[int(fraction * len(candidates))])

    def eligible(self, length: int) -> list[TextSource]:
        eligible = [source for source in self.sources if len(source.ids) >= length]
        if not eligible:
            longest = max(len(source.ids) for source in self.sources)
            raise ValueError(f"a haystack of {length} tokens needs a file of at least {length} tokens of text; the "
                             f"longest holds {longest}")  # fmt: skip
        return eligible

    def build(self, task: str, length: int, depth: float, seed: str) -> Haystack:
        """The haystack of ``task`` with ``length`` tokens and the needle at ``depth`` percent. ``seed`` (any
        string) draws the file and window of text, and with the task the pass key, the fact or the copy's masks:
        the same seed gives the same window for every task and depth."""
        check_tasks([task], "task")
        check_depths([depth], "depth")
        text_rng, task_rng = seeded_random(seed, "text"), seeded_random(seed, task)
        eligible = self.eligible(length)
        source = text_rng.choices(eligible, weights=[len(s.ids) for s in eligible])[0]
        fraction = text_rng.random()
        if task == "copy":
            return self._copy(source, length, depth, fraction, task_rng)
        for _ in range(100):
            needle, question, question_labels, answer, answer_ids = self.needle_and_question(task, task_rng, source)
            filler = length - 2 - len(question) - len(needle)
            if filler < 1:
                raise ValueError(f"length {length} is too short for the {task} task: its needle and question take "
                                 f"{len(needle) + len(question) + 2} tokens with [CLS] and [SEP]")  # fmt: skip
            offset = self.window(source, filler, fraction)
            text = source.ids[offset : offset + filler]
            starts = source.word_start[offset : offset + filler]
            # The made-up word is not a word of the file; its tokens must not stand as a word in the window either
            # (a tokenizer may normalise two spellings to the same tokens).
            if task == "passkey" or not occurs_as_word(text, starts, answer_ids):
                break
        else:
            raise ValueError(f"{source.path}: no made-up word was found that the window does not hold")
        at = nearest_boundary(np.append(starts, True), depth / 100 * filler)
        ids = [self.cls, *text[:at].tolist(), *needle, *text[at:].tolist(), *question, self.sep]
        labels = [-100] * (1 + filler + len(needle)) + question_labels + [-100]
        return Haystack(task, length, float(depth), tuple(ids), tuple(labels), 1 + at, 1 + at + len(needle),
                        length - 1 - len(question), answer, source.name, offset)  # fmt: skip

    def _copy(self, source: TextSource, length: int, depth: float, fraction: float, rng: random.Random) -> Haystack:
        span = self.copy_span
        body = length - 2 - span
        if body < span:
            raise ValueError(f"length {length} is too short for the copy task: its span is repeated, which takes "
                             f"{2 * span + 2} tokens with [CLS] and [SEP]")  # fmt: skip
        offset = self.window(source, body, fraction)
        text = source.ids[offset : offset + body]
        starts = np.append(source.word_start[offset : offset + body], True)
        # A span from a word start to a word start, so that its copy reads as whole words.
        at = nearest_boundary(starts[: body - span + 1] & starts[span:], depth / 100 * (body - span))
        copied = text[at : at + span].tolist()
        # Whole words, so that a masked word's own tokens do not give it away.
        firsts = [k for k in range(span // 4, span) if starts[at + k]]
        if len(firsts) < self.copy_masked:
            raise ValueError(f"{source.path}: a span of {span} tokens has {len(firsts)} words after its first "
                             f"quarter, fewer than copy_masked={self.copy_masked}")  # fmt: skip
        masked = set()
        for first in rng.sample(firsts, self.copy_masked):
            end = first + 1
            while end < span and not starts[at + end]:
                end += 1
            masked.update(range(first, end))
        masked = sorted(masked)
        question = [self.mask if k in masked else token for k, token in enumerate(copied)]
        labels = [-100] * (1 + body) + [token if k in masked else -100 for k, token in enumerate(copied)] + [-100]
        answer = self.tokenizer.decode([copied[k] for k in masked])
        return Haystack("copy", length, float(depth), (self.cls, *text.tolist(), *question, self.sep), tuple(labels),
                        1 + at, 1 + at + span, length - 1 - span, answer, source.name, offset)  # fmt: skip


def build_grid(builder: NeedleBuilder, tasks: Sequence[str], lengths: Sequence[int], depths: Sequence[float],
               examples_per_cell: int, seed: int | str, split: str) -> list[Haystack]:  # fmt: skip
    """``examples_per_cell`` haystacks of every task, length and depth; example ``k`` of a length has the same
    window of text in every task and depth."""
    if examples_per_cell < 1:
        raise ValueError(f"examples_per_cell must be >= 1, got {examples_per_cell}")
    if "passkey" in tasks:
        builder.check_digits()
    return [builder.build(task, length, depth, f"{seed}-{split}-{length}-{k}")
            for task in tasks for length in lengths for depth in depths for k in range(examples_per_cell)]  # fmt: skip


def build_training_set(builder: NeedleBuilder, tasks: Sequence[str], lengths: Sequence[int], examples: int,
                       seed: int | str) -> list[Haystack]:  # fmt: skip
    """``examples`` training haystacks, each of a task and length drawn among ``tasks`` and ``lengths`` and a depth
    drawn uniformly in [0, 100] (not only the grid's depths)."""
    if examples < 1:
        raise ValueError(f"train_examples must be >= 1, got {examples}")
    if "passkey" in tasks:
        builder.check_digits()
    rng = seeded_random(seed, "train")
    draws = [(rng.choice(list(tasks)), rng.choice(list(lengths)), rng.uniform(0, 100)) for _ in range(examples)]
    return [builder.build(task, length, depth, f"{seed}-train-{k}") for k, (task, length, depth) in enumerate(draws)]


def truncate(haystack: Haystack, window: int | None) -> tuple[list[int], list[int], bool]:
    """``(input_ids, labels, needle in window)`` as a model of ``window`` tokens reads the haystack: whole if it fits
    (or ``window`` is None), otherwise ``[CLS]`` and the last ``window - 1`` tokens (left truncation: the question
    is kept). The needle is in the window when all its tokens are kept."""
    ids, labels = list(haystack.input_ids), list(haystack.labels)
    if window is None or len(ids) <= window:
        return ids, labels, True
    cut = len(ids) - (window - 1)
    return ids[:1] + ids[cut:], labels[:1] + labels[cut:], haystack.needle_start >= cut


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


def load_model(model_name_or_path: str | Path, lengths: Sequence[int], max_length: int | None = None,
               truncation_side: str | None = None, device: str | torch.device = "cpu"):  # fmt: skip
    """``(model, window, how)``: the masked LM of ``model_name_or_path`` (Orchid through the Auto classes, BERT, any
    ``AutoModelForMaskedLM``) on ``device`` and the tokens it reads: ``max_length`` if given, otherwise an Orchid
    model's longest haystack and another model's ``max_position_embeddings``. A model with fewer positions than its
    window is extended without training: Orchid's context
    (:func:`experiments.real_data.long_context.load_masked_lm`), another model's learned position table by
    :func:`repeat_positions`. A ``ValueError`` when a haystack is longer than the window and ``truncation_side`` is
    not ``"left"``."""
    from transformers import AutoConfig

    from experiments.real_data.long_context import load_masked_lm

    config = AutoConfig.from_pretrained(model_name_or_path)
    positions = getattr(config, "max_position_embeddings", None)
    orchid = config.model_type == "orchid"
    window = max_length or (max(lengths) if orchid or positions is None else positions)
    if truncation_side is not None and truncation_side not in TRUNCATION_SIDES:
        raise ValueError(f"truncation_side must be one of {TRUNCATION_SIDES} (the question is at the end) or None, "
                         f"got {truncation_side!r}")  # fmt: skip
    if max(lengths) > window and truncation_side != "left":
        raise ValueError(f"haystacks of {max(lengths)} tokens are longer than the model's window of {window} tokens: "
                         "truncate with truncation_side='left' (--truncation_side left), which keeps the end of "
                         "each haystack and its question, or leave out the longer lengths")  # fmt: skip
    if orchid:
        model, how = load_masked_lm(model_name_or_path, max(window, positions or window))
    else:
        from transformers import AutoModelForMaskedLM

        model, how = AutoModelForMaskedLM.from_pretrained(model_name_or_path), "as trained"
        if positions is not None and window > positions:
            model = repeat_positions(model, window)
            how = f"positions extended from {positions} to {window} by repeating its learned rows, without training"
    if max(lengths) > window:
        how += f", reading [CLS] and the last {window - 1} tokens of longer haystacks"
    return model.to(device), window, how


def repeat_positions(model, length: int):
    """``model``, a masked LM with a learned table of absolute positions (BERT's ``embeddings.position_embeddings``),
    rebuilt for ``length`` positions with its learned rows repeated over the new ones, as Longformer extended
    RoBERTa's 512 positions (Beltagy et al., 2020) and as Orchid's ``resize_position_embeddings`` extends its own
    table: an input no longer than the old table reads exactly as before, and a longer one sees positions that the
    model learns to tell apart by training at the new length. A ``ValueError`` for a model without one such table."""
    import copy

    from transformers import AutoModelForMaskedLM

    state = model.state_dict()
    keys = [key for key in state if key.endswith("embeddings.position_embeddings.weight")]
    if len(keys) != 1:
        raise ValueError(f"a {model.config.model_type} model reads at most its {model.config.max_position_embeddings} "
                         f"positions: it has no learned position table (embeddings.position_embeddings) to extend to "
                         f"{length}")  # fmt: skip
    table = state[keys[0]]
    state[keys[0]] = table[torch.arange(length) % table.shape[0]]
    config = copy.deepcopy(model.config)
    config.max_position_embeddings = length
    longer = AutoModelForMaskedLM.from_config(config)
    longer.load_state_dict(state)
    return longer.to(table.dtype)


def load_tokenizer(model_name_or_path: str | Path, tokenizer_name: str | Path | None = None):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_name or model_name_or_path)


def split_head(model):
    """``(encoder, head)`` of a masked LM whose head maps hidden states to logits (Orchid's ``lm_head``, BERT's
    ``cls``), so that only the answer positions go through the head (at 8,192 tokens, a 30,522-token vocabulary's
    logits of every position take a GiB); None for another layout."""
    for name in ("lm_head", "cls"):
        head = getattr(model, name, None)
        if isinstance(head, torch.nn.Module):
            return model.base_model, head
    return None


def answer_logits(model, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The masked-LM logits at ``positions`` (a boolean mask of ``input_ids``' shape), one row per position in
    row-major order; the same as the model's full logits there."""
    parts = split_head(model)
    if parts is None:
        return model(input_ids=input_ids).logits[positions]
    encoder, head = parts
    hidden = encoder(input_ids=input_ids).last_hidden_state
    return head(hidden[positions])


# What peak_memory_mib measures (benchmarks.harness.peak_bytes), in words for results.json.
MEMORY_MEASURE = ("peak memory of reading one haystack alone (batch of 1, no gradients), above what was allocated "
                  "before: the CUDA allocator's peak on a GPU; on a CPU the peak of live tensor bytes that PyTorch's "
                  "allocator handed out, from the profiler's allocation events (not MKL's or oneDNN's own "
                  "workspaces, not the process's resident set)")  # fmt: skip


def example_peak_mib(model, haystack: Haystack, window: int | None, device: str | torch.device) -> float:
    """The peak memory in MiB of ``model`` reading ``haystack`` alone as :func:`truncate` gives it to a window
    (:data:`MEMORY_MEASURE`)."""
    ids, labels, _ = truncate(haystack, window)
    input_ids = torch.tensor([ids], device=device)
    positions = torch.tensor([labels], device=device) != -100
    return peak_bytes(lambda: answer_logits(model, input_ids, positions), device) / 2**20


def timed_logits(model, input_ids: torch.Tensor, positions: torch.Tensor, device) -> tuple[torch.Tensor, float]:
    """:func:`answer_logits` and its seconds (:func:`benchmarks.harness.timed_call`: CUDA events on a GPU)."""
    logits = []
    seconds = timed_call(lambda: logits.append(answer_logits(model, input_ids, positions)), device)
    return logits[0], seconds


def micro_batches(rows: list[tuple[list[int], list[int]]], tokens_per_batch: int):
    """``rows`` (``(input_ids, labels)``) grouped by length (shortest first) into batches of at most
    ``tokens_per_batch`` tokens (at least one row each), as tensors ``(indices, input_ids, labels)``."""
    by_length: dict[int, list[int]] = {}
    for index, (ids, _) in enumerate(rows):
        by_length.setdefault(len(ids), []).append(index)
    for length in sorted(by_length):
        indices = by_length[length]
        size = max(1, tokens_per_batch // length)
        for first in range(0, len(indices), size):
            chunk = indices[first : first + size]
            yield (chunk, torch.tensor([rows[k][0] for k in chunk]), torch.tensor([rows[k][1] for k in chunk]))


def score_rows(model, haystacks: Sequence[Haystack], rows: list[tuple[list[int], list[int], bool]],
               tokens_per_batch: int, device, bar=None) -> tuple[list[dict], float]:  # fmt: skip
    """The records of ``haystacks`` read as ``rows`` (:func:`truncate`), in their order (see :func:`score`), and the
    seconds of the forward passes."""
    records: list[dict | None] = [None] * len(haystacks)
    seconds = 0.0
    for batch, ids, labels in micro_batches([row[:2] for row in rows], tokens_per_batch):
        ids, labels = ids.to(device), labels.to(device)
        positions = labels != -100
        logits, elapsed = timed_logits(model, ids, positions, device)
        seconds += elapsed
        targets = labels[positions]
        losses = F.cross_entropy(logits.float(), targets, reduction="none")
        predicted = logits.argmax(-1)
        first = 0
        for k, count in zip(batch, positions.sum(1).tolist()):
            part = slice(first, first + count)
            first += count
            haystack = haystacks[k]
            answer, guess = targets[part].tolist(), predicted[part].tolist()
            records[k] = {
                "task": haystack.task, "length": haystack.length, "depth": haystack.depth, "source": haystack.source,
                "offset": haystack.offset, "needle_start": haystack.needle_start, "in_window": rows[k][2],
                "answer": haystack.answer, "answer_ids": answer, "predicted_ids": guess,
                "correct_tokens": sum(a == b for a, b in zip(answer, guess)), "hit": answer == guess,
                "loss": float(losses[part].sum()), "seconds": elapsed / len(batch),
            }  # fmt: skip
        if bar is not None:
            bar.update(len(batch))
    return records, seconds


@torch.no_grad()
def score(model, haystacks: Sequence[Haystack], window: int | None, tokens_per_batch: int = 16384,
          device: str | torch.device = "cpu", progress: bool = True) -> tuple[list[dict], dict[int, dict]]:  # fmt: skip
    """Each haystack read by ``model`` (truncated to ``window``, :func:`truncate`), ``tokens_per_batch`` tokens at a
    time: per haystack a record (task, length, depth, the needle's position and whether it is in the window, the
    answer and predicted tokens, ``hit`` when all are right, the summed cross-entropy of the answer tokens and its
    share of its batch's forward seconds), in the haystacks' order; and per haystack length the examples, tokens
    read, seconds per example, and the peak memory of reading one of them alone (:func:`example_peak_mib`)."""
    from tqdm.auto import tqdm

    model.eval()
    records: list[dict | None] = [None] * len(haystacks)
    per_length: dict[int, dict] = {}
    bar = tqdm(total=len(haystacks), desc="scoring haystacks", unit="haystack", disable=None if progress else True)
    for length in sorted({h.length for h in haystacks}):
        chosen = [k for k, haystack in enumerate(haystacks) if haystack.length == length]
        subset = [haystacks[k] for k in chosen]
        rows = [truncate(haystack, window) for haystack in subset]
        found, seconds = score_rows(model, subset, rows, tokens_per_batch, device, bar)
        for k, record in zip(chosen, found):
            records[k] = record
        per_length[length] = {"examples": len(chosen), "read_tokens": min(length, window or length),
                              "seconds_per_example": seconds / len(chosen),
                              "peak_memory_mib": example_peak_mib(model, subset[0], window, device)}  # fmt: skip
    bar.close()
    return records, per_length


def depth_key(depth: float) -> str:
    return f"{depth:g}"


def summarise(records: Sequence[dict]) -> dict:
    """The records of :func:`score` per task, length and depth: ``cells`` (examples, accuracy (hits), token accuracy,
    mean answer cross-entropy, the share of needles in the window, seconds per example), ``accuracy`` as
    ``{task: {length: {depth: accuracy}}}`` (the keys strings, as JSON has them), ``outside_window`` as ``{task:
    {length: [depths at which some needle is not in the window]}}``, and over every record ``overall_accuracy``
    and ``loss`` (mean cross-entropy per answer token)."""
    groups: dict[tuple, list[dict]] = {}
    for record in records:
        groups.setdefault((record["task"], record["length"], record["depth"]), []).append(record)
    cells, accuracy, outside = [], {}, {}
    for (task, length, depth), group in sorted(groups.items(), key=lambda item: (TASKS.index(item[0][0]),
                                                                                 *item[0][1:])):  # fmt: skip
        tokens = sum(len(r["answer_ids"]) for r in group)
        cell = {
            "task": task, "length": length, "depth": depth, "examples": len(group),
            "accuracy": sum(r["hit"] for r in group) / len(group),
            "token_accuracy": sum(r["correct_tokens"] for r in group) / tokens,
            "loss": sum(r["loss"] for r in group) / tokens,
            "needle_in_window": sum(r["in_window"] for r in group) / len(group),
            "seconds_per_example": sum(r["seconds"] for r in group) / len(group),
        }  # fmt: skip
        cells.append(cell)
        accuracy.setdefault(task, {}).setdefault(str(length), {})[depth_key(depth)] = cell["accuracy"]
        depths = outside.setdefault(task, {}).setdefault(str(length), [])
        if cell["needle_in_window"] < 1:
            depths.append(depth)
    tokens = sum(len(r["answer_ids"]) for r in records)
    return {"cells": cells, "accuracy": accuracy, "outside_window": outside,
            "overall_accuracy": sum(r["hit"] for r in records) / len(records) if records else None,
            "loss": sum(r["loss"] for r in records) / tokens if tokens else None}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Fine-tuning
# ---------------------------------------------------------------------------------------------


def train(model, examples: Sequence[Haystack], learning_rate: float, steps: int, window: int | None,
          batch_size: int = 8, tokens_per_batch: int = 16384, warmup_ratio: float = 0.1, weight_decay: float = 0.01,
          seed: int = 0, device: str | torch.device = "cpu", progress: bool = True) -> list[float]:  # fmt: skip
    """Fine-tune ``model`` for ``steps`` steps of ``batch_size`` haystacks (the training set in an order drawn with
    ``seed``, reshuffled at each pass), each read as :func:`truncate` reads it: AdamW at ``learning_rate`` with
    linear warm-up over ``warmup_ratio`` of the steps then linear decay to 0, gradients clipped to norm 1, the loss
    the cross-entropy of the answer tokens only (their mean over the step). A step's haystacks go through the model
    in batches of at most ``tokens_per_batch`` tokens. Returns each step's loss."""
    from tqdm.auto import tqdm
    from transformers import get_linear_schedule_with_warmup

    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got {steps} and {batch_size}")
    rows = [truncate(example, window)[:2] for example in examples]
    rng = seeded_random(seed, "order")
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim > 1]
    rest = [p for n, p in model.named_parameters() if p.requires_grad and p.ndim <= 1]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                   {"params": rest, "weight_decay": 0.0}], lr=learning_rate)  # fmt: skip
    schedule = get_linear_schedule_with_warmup(optimizer, round(warmup_ratio * steps), steps)
    model.train()
    order: list[int] = []
    losses = []
    for _ in tqdm(range(steps), desc=f"training at lr {learning_rate:g}", unit="step",
                  disable=None if progress else True):  # fmt: skip
        batch = []
        while len(batch) < batch_size:
            if not order:
                order = rng.sample(range(len(rows)), len(rows))
            batch.append(order.pop())
        step_rows = [rows[k] for k in batch]
        answers = sum(sum(label != -100 for label in labels) for _, labels in step_rows)
        total = 0.0
        for _, ids, labels in micro_batches(step_rows, tokens_per_batch):
            ids, labels = ids.to(device), labels.to(device)
            positions = labels != -100
            loss = F.cross_entropy(answer_logits(model, ids, positions).float(), labels[positions],
                                   reduction="sum") / answers  # fmt: skip
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(total)
    model.eval()
    return losses


def loss_curve(losses: Sequence[float], points: int = 50) -> list[dict]:
    """The training losses in at most ``points`` consecutive chunks of steps: each chunk's last step (counted from
    1) and its mean loss, so that a results file shows whether and when the loss fell."""
    size = max(1, math.ceil(len(losses) / points))
    chunks = [losses[start : start + size] for start in range(0, len(losses), size)]
    return [{"step": min((k + 1) * size, len(losses)), "loss": sum(chunk) / len(chunk)}
            for k, chunk in enumerate(chunks)]


def choose_learning_rate(validations: Sequence[dict]) -> tuple[int, bool]:
    """``(index, at edge)``: the best of ``validations`` (one per learning rate of the grid, in increasing order,
    each with validation ``accuracy`` and ``loss``): the highest accuracy, ties broken by the lower loss (a NaN
    loss is the worst), then by the smaller learning rate; at the edge when it is the grid's first or last point
    (always, for a grid of fewer than three), where a better learning rate may lie outside the grid."""
    if not validations:
        raise ValueError("no learning rate to choose from")

    def key(k: int):
        loss = validations[k]["loss"]
        return (-validations[k]["accuracy"], math.inf if loss is None or math.isnan(loss) else loss, k)

    best = min(range(len(validations)), key=key)
    return best, best in (0, len(validations) - 1)


def finetune_and_select(
    model_name_or_path: str | Path, lengths: Sequence[int], training: Sequence[Haystack],
    validation: Sequence[Haystack], learning_rates: Sequence[float], steps: int, max_length: int | None = None,
    truncation_side: str | None = None, batch_size: int = 8, tokens_per_batch: int = 16384,
    warmup_ratio: float = 0.1, weight_decay: float = 0.01, seed: int = 0, device: str | torch.device = "cpu",
    progress: bool = True,
) -> tuple[torch.nn.Module, int, str, dict]:  # fmt: skip
    """Fine-tune a fresh copy of the checkpoint at each learning rate (:func:`train`, seeded alike), score each on
    the ``validation`` haystacks, and keep the best (:func:`choose_learning_rate`). Returns the chosen model, its
    window and how it was loaded and trained (:func:`load_model`), and a summary: per learning rate its validation
    accuracy and loss, first and last training losses and seconds; the chosen learning rate, and ``best_at_edge``
    (with a warning) when it is at an end of the grid."""
    from transformers import set_seed

    learning_rates = sorted(learning_rates)
    best_model, runs = None, []
    for learning_rate in learning_rates:
        set_seed(seed)
        model, window, how = load_model(model_name_or_path, lengths, max_length, truncation_side, device)
        started = time.perf_counter()
        losses = train(model, training, learning_rate, steps, window, batch_size, tokens_per_batch, warmup_ratio,
                       weight_decay, seed, device, progress)  # fmt: skip
        seconds = time.perf_counter() - started
        records, _ = score(model, validation, window, tokens_per_batch, device, progress)
        summary = summarise(records)
        runs.append({"learning_rate": learning_rate, "validation_accuracy": summary["overall_accuracy"],
                     "validation_loss": summary["loss"], "train_loss_first": losses[0], "train_loss_last": losses[-1],
                     "train_loss_curve": loss_curve(losses), "train_seconds": round(seconds, 2)})  # fmt: skip
        best, _ = choose_learning_rate([{"accuracy": r["validation_accuracy"], "loss": r["validation_loss"]}
                                        for r in runs])  # fmt: skip
        if best == len(runs) - 1:
            best_model = model
        del model  # the next learning rate's model is loaded with only the best so far kept
    best, at_edge = choose_learning_rate([{"accuracy": r["validation_accuracy"], "loss": r["validation_loss"]}
                                          for r in runs])  # fmt: skip
    if at_edge:
        warnings.warn(f"the best learning rate on the validation haystacks, {learning_rates[best]:g}, is at the edge "
                      f"of the grid {[f'{lr:g}' for lr in learning_rates]}: extend the grid (--learning_rates) past "
                      "it, a better one may lie outside", stacklevel=2)  # fmt: skip
    how += f", fine-tuned at lr {learning_rates[best]:g}"
    summary = {"learning_rates": learning_rates, "runs": runs, "best_learning_rate": learning_rates[best],
               "best_at_edge": at_edge, "steps": steps, "batch_size": batch_size, "warmup_ratio": warmup_ratio,
               "weight_decay": weight_decay, "train_examples": len(training),
               "validation_examples": len(validation)}  # fmt: skip
    return best_model, window, how, summary


# ---------------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------------


def check_tasks(tasks: Sequence[str], name: str = "tasks") -> list[str]:
    tasks = list(tasks)
    if not tasks:
        raise ValueError(f"{name}: no task given; choose among {list(TASKS)}")
    for task in tasks:
        if task not in TASKS:
            raise ValueError(f"{name} {task!r}: not a task; choose among {list(TASKS)}")
    return list(dict.fromkeys(tasks))


def check_lengths(lengths: Sequence[int], name: str = "lengths") -> list[int]:
    lengths = list(lengths)
    if not lengths:
        raise ValueError(f"{name}: no length given")
    for length in lengths:
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 3:
            raise ValueError(f"{name} {length!r}: a haystack length is a whole number of tokens, at least 3 "
                             "([CLS], a token, [SEP])")  # fmt: skip
    return sorted(set(int(length) for length in lengths))


def check_depths(depths: Sequence[float], name: str = "depths") -> list[float]:
    depths = list(depths)
    if not depths:
        raise ValueError(f"{name}: no depth given")
    for depth in depths:
        if not isinstance(depth, (int, float, np.number)) or not 0 <= depth <= 100:
            raise ValueError(f"{name} {depth!r}: a depth is a percentage of the text, in [0, 100]")
    return sorted(set(float(depth) for depth in depths))


def check_learning_rates(learning_rates: Sequence[float], name: str = "learning_rates") -> list[float]:
    learning_rates = list(learning_rates)
    if not learning_rates:
        raise ValueError(f"{name}: no learning rate given")
    for learning_rate in learning_rates:
        if not learning_rate > 0 or math.isinf(learning_rate):
            raise ValueError(f"{name} {learning_rate!r}: a learning rate is a positive number")
    return sorted(set(learning_rates))


def plot_heatmaps(results: dict, output_dir: str | Path) -> list[Path]:
    """A depth-by-length heat map of accuracy per task (``heatmap_<task>.png``): depth down, length across, each cell
    with its accuracy, marked "outside window" where some needle was outside the model's window."""
    from orchid_hf.extras import require_extra

    require_extra("matplotlib", "plot")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    paths = []
    lengths, depths = results["lengths"], results["depths"]
    trained = ", ".join(f"{length:,}" for length in results.get("train_lengths") or lengths)
    state = f"fine-tuned at {trained} tokens, lr {results['finetuning']['best_learning_rate']:g}" \
        if results["finetuning"] else "not fine-tuned"  # fmt: skip
    for task in results["tasks"]:
        table = results["accuracy"][task]
        values = np.array([[table[str(length)][depth_key(depth)] for length in lengths] for depth in depths])
        figure = Figure(figsize=(1.6 * len(lengths) + 2.5, 0.6 * len(depths) + 1.8))
        FigureCanvasAgg(figure)
        ax = figure.subplots()
        image = ax.imshow(values, cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto")
        for i, depth in enumerate(depths):
            for j, length in enumerate(lengths):
                out = depth in results["outside_window"][task][str(length)]
                label = f"{values[i, j]:.2f}" + ("\noutside window" if out else "")
                ax.text(j, i, label, ha="center", va="center", fontsize=9)
        ax.set_xticks(range(len(lengths)), [f"{length:,}" for length in lengths])
        ax.set_yticks(range(len(depths)), [f"{depth:g}%" for depth in depths])
        ax.set(xlabel="haystack length (tokens)", ylabel="needle depth")
        ax.set_title(f"{task}: {Path(results['model']).name} ({state}), window {results['window']:,}", fontsize=10)
        figure.colorbar(image, ax=ax, label="accuracy")
        figure.tight_layout()
        path = Path(output_dir) / f"heatmap_{task}.png"
        figure.savefig(path, dpi=100)
        paths.append(path)
    return paths


def mean_accuracy(results: dict, task: str, length: int) -> float:
    """A run's accuracy on ``task`` at ``length``, the mean over its depths (every depth has as many examples)."""
    row = results["accuracy"][task][str(length)]
    return sum(row.values()) / len(row)


def report(runs: dict[str, Sequence[dict]], compare: Sequence[tuple[str, str]] = ()) -> str:
    """Markdown tables of needle runs, ``runs`` mapping a model's label to its runs' ``results.json`` (one per
    seed, fine-tuned and scored alike): accuracy per task and length (the mean over depths; with several seeds,
    their mean and each seed's value), marked where some needles stood outside the window; the time and memory of
    reading a haystack and the time of a fine-tuning step; and, for each ``(first, second)`` of ``compare``, the
    difference of their accuracies per task and length with its 95% interval over seeds
    (:func:`experiments.real_data.report.comparison_words`: no difference is stated below three seeds a model).
    The columns are every length some model was scored at; "–" where a model was not."""
    from experiments.real_data.report import comparison_words, difference_interval

    for label, group in runs.items():
        if not group:
            raise ValueError(f"model {label!r} has no run")
        shapes = {(tuple(r["tasks"]), tuple(r["lengths"]), tuple(r["depths"])) for r in group}
        if len(shapes) > 1:
            raise ValueError(f"the runs of {label!r} differ in tasks, lengths or depths: {sorted(shapes)}")
    for pair in compare:
        for label in pair:
            if label not in runs:
                raise ValueError(f"compare names {label!r}, which is not among the runs {list(runs)}")
    scored = {label: set(group[0]["lengths"]) for label, group in runs.items()}  # the lengths each model was scored at
    lengths = sorted(set().union(*scored.values()))

    def accuracies(group: Sequence[dict], task: str, length: int) -> list[float]:
        return [mean_accuracy(r, task, length) for r in group]

    def cell(label: str, task: str, length: int) -> str:
        if length not in scored[label]:
            return "–"
        group = runs[label]
        values = accuracies(group, task, length)
        text = f"{100 * statistics.mean(values):.0f}%"
        if len(values) > 1:
            text += f" ({' / '.join(f'{100 * v:.0f}' for v in values)})"
        return text + ("†" if any(r["outside_window"][task][str(length)] for r in group) else "")

    lines = table_lines(["model", "task", *(f"{length:,} tokens" for length in lengths)],
                        [[label, task, *(cell(label, task, n) for n in lengths)]
                         for label, group in runs.items() for task in group[0]["tasks"]])  # fmt: skip
    lines += ["", "† some needles stood outside the model's window (it reads the end of the haystack).", ""]
    rows = []
    for label, group in runs.items():
        tuned = [r["finetuning"] for r in group if r["finetuning"]]
        rates = sorted({t["best_learning_rate"] for t in tuned})
        steps = [next(run["train_seconds"] for run in t["runs"] if run["learning_rate"] == t["best_learning_rate"])
                 / t["steps"] for t in tuned]  # fmt: skip
        trained = (", ".join(f"{n:,}" for n in group[0].get("train_lengths") or group[0]["lengths"]) if tuned
                   else "not fine-tuned")  # fmt: skip
        speed = []
        for length in lengths:
            if length not in scored[label]:
                speed.append("–")
                continue
            entries = [r["speed_and_memory"][str(length)] for r in group]
            milliseconds = 1000 * statistics.mean(e["seconds_per_example"] for e in entries)
            speed.append(f"{milliseconds:.0f}, {max(e['peak_memory_mib'] for e in entries):.0f}")
        rows.append([label, trained, ", ".join(f"{rate:g}" for rate in rates) or "–",
                     ", ".join(str(r["seed"]) for r in group), f"{statistics.mean(steps):.2f}" if steps else "–",
                     *speed])  # fmt: skip
    lines += table_lines(["model", "fine-tuned at (tokens)", "learning rate", "seeds", "s / step",
                          *(f"{length:,}: ms / haystack, MiB" for length in lengths)], rows)  # fmt: skip
    for first, second in compare:
        lines += ["", f"{first} against {second}:", ""]
        for task in runs[first][0]["tasks"]:
            for length in lengths:
                if length not in scored[first] & scored[second]:
                    continue
                a, b = accuracies(runs[first], task, length), accuracies(runs[second], task, length)
                if min(len(a), len(b)) < 2:
                    words = (f"no difference stated ({first} − {second}: "
                             f"{100 * (statistics.mean(a) - statistics.mean(b)):+.1f} points; fewer than 3 seeds)")
                else:
                    words = comparison_words(first, second, difference_interval(a, b))
                lines.append(f"- {task}, {length:,} tokens: {words}")
    return "\n".join(lines) + "\n"


def sample(tokenizer, haystack: Haystack) -> dict:
    """What one haystack's needle and question read like (decoded tokens), and its answer."""
    ids = haystack.input_ids
    return {"needle": tokenizer.decode(ids[haystack.needle_start : haystack.needle_end]),
            "question": tokenizer.decode(ids[haystack.question_start : -1]), "answer": haystack.answer,
            "source": haystack.source, "length": haystack.length, "depth": haystack.depth}  # fmt: skip


def run_needle_benchmark(
    model_name_or_path: str | Path,
    test_files: Sequence[str | Path],
    output_dir: str | Path,
    train_files: Sequence[str | Path] | None = None,
    validation_files: Sequence[str | Path] | None = None,
    tasks: Sequence[str] = TASKS,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    depths: Sequence[float] = DEFAULT_DEPTHS,
    train_lengths: Sequence[int] | None = None,
    examples_per_cell: int = 10,
    validation_examples_per_cell: int | None = None,
    finetune: bool = True,
    learning_rates: Sequence[float] = DEFAULT_LEARNING_RATES,
    train_examples: int = 512,
    epochs: float = 1.0,
    max_steps: int | None = None,
    batch_size: int = 8,
    tokens_per_batch: int = 16384,
    warmup_ratio: float = 0.1,
    weight_decay: float = 0.01,
    truncation_side: str | None = None,
    max_length: int | None = None,
    tokenizer_name: str | Path | None = None,
    seed: int = 0,
    device: str | None = None,
    save_model: bool = False,
    progress: bool = True,
    heatmaps: bool = True,
) -> dict:
    """The benchmark of one masked-LM checkpoint: with ``finetune``, fine-tuned on ``train_examples`` haystacks of
    ``train_files`` for ``max_steps`` steps (or ``epochs`` passes) at each of ``learning_rates``, the learning rate
    chosen on the haystacks of ``validation_files`` (:func:`finetune_and_select`); training and validation haystacks
    are ``train_lengths`` long (default: ``lengths``), so that a model fine-tuned on short haystacks can be scored on
    longer ones (length generalisation); then scored on
    ``examples_per_cell`` haystacks of ``test_files`` per task, length and depth (:func:`score`). The three sets of
    files must not share a file. Writes to ``output_dir`` ``results.json`` (returned), ``predictions.jsonl`` (one
    test haystack a line), with ``heatmaps`` ``heatmap_<task>.png`` (:func:`plot_heatmaps`, which needs matplotlib)
    and, with ``save_model``, the fine-tuned model and tokenizer in ``model/``."""
    import json

    from transformers import AutoConfig

    import orchid_hf  # noqa: F401  (registers the orchid model type with the Auto classes)

    started = time.perf_counter()
    tasks, lengths, depths = check_tasks(tasks), check_lengths(lengths), check_depths(depths)
    train_lengths = lengths if train_lengths is None else check_lengths(train_lengths, "train_lengths")
    test_paths = text_files(test_files, "test_files")
    split_paths = {"test": test_paths}
    if finetune:
        learning_rates = check_learning_rates(learning_rates)
        if not train_files or not validation_files:
            raise ValueError("fine-tuning needs train_files and validation_files (or score only, finetune=False)")
        split_paths["train"] = text_files(train_files, "train_files")
        split_paths["validation"] = text_files(validation_files, "validation_files")
        if max_steps is None and not epochs > 0:
            raise ValueError(f"epochs must be > 0 (or give max_steps), got {epochs}")
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    seen: dict[Path, str] = {}
    for split, paths in split_paths.items():
        for path in paths:
            other = seen.setdefault(path.resolve(), split)
            if other != split:
                raise ValueError(f"{path} is both a {other} and a {split} file: the splits must read separate files")
    if examples_per_cell < 1:
        raise ValueError(f"examples_per_cell must be >= 1, got {examples_per_cell}")
    if tokens_per_batch < 1:
        raise ValueError(f"tokens_per_batch must be >= 1, got {tokens_per_batch}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)

    tokenizer = load_tokenizer(model_name_or_path, tokenizer_name)
    builders = {split: NeedleBuilder(load_sources(paths, tokenizer), tokenizer) for split, paths in split_paths.items()}
    test = build_grid(builders["test"], tasks, lengths, depths, examples_per_cell, seed, "test")
    finetuning = None
    if finetune:
        training = build_training_set(builders["train"], tasks, train_lengths, train_examples, seed)
        validation = build_grid(builders["validation"], tasks, train_lengths, depths,
                                validation_examples_per_cell or examples_per_cell, seed, "validation")  # fmt: skip
        steps = max_steps or math.ceil(epochs * len(training) / batch_size)
        all_lengths = sorted({*lengths, *train_lengths})  # the model's window is the longest of them
        model, window, how, finetuning = finetune_and_select(
            model_name_or_path, all_lengths, training, validation, learning_rates, steps, max_length, truncation_side,
            batch_size, tokens_per_batch, warmup_ratio, weight_decay, seed, device, progress)  # fmt: skip
    else:
        model, window, how = load_model(model_name_or_path, lengths, max_length, truncation_side, device)
    records, per_length = score(model, test, window, tokens_per_batch, device, progress)
    summary = summarise(records)
    checkpoint = AutoConfig.from_pretrained(model_name_or_path)
    results = {
        "model": str(model_name_or_path),
        "model_type": checkpoint.model_type,
        "max_position_embeddings": getattr(checkpoint, "max_position_embeddings", None),
        "window": window,
        "truncation_side": truncation_side,
        "how": how,
        "tasks": tasks,
        "lengths": lengths,
        "train_lengths": train_lengths if finetune else None,
        "depths": depths,
        "examples_per_cell": examples_per_cell,
        "seed": seed,
        "files": {split: [str(p) for p in paths] for split, paths in split_paths.items()},
        "finetuning": finetuning,
        "accuracy": summary["accuracy"],
        "outside_window": summary["outside_window"],
        "overall_accuracy": summary["overall_accuracy"],
        "cells": summary["cells"],
        "speed_and_memory": {str(length): entry for length, entry in per_length.items()},
        "memory_measure": MEMORY_MEASURE,
        "samples": {task: sample(tokenizer, next(h for h in test if h.task == task)) for task in tasks},
        "seconds": round(time.perf_counter() - started, 2),
        **provenance(device=device),
    }
    write_json(output_dir / "results.json", results)
    with open(output_dir / "predictions.jsonl", "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps({**record, "predicted": tokenizer.decode(record["predicted_ids"])}) + "\n")
    if heatmaps:
        plot_heatmaps(results, output_dir)
    if save_model and finetune:
        model.save_pretrained(output_dir / "model")
        tokenizer.save_pretrained(output_dir / "model")
    return results


__all__ = [
    "DEFAULT_DEPTHS",
    "DEFAULT_LEARNING_RATES",
    "DEFAULT_LENGTHS",
    "MADE_UP_WORDS",
    "MEMORY_MEASURE",
    "NEEDLE_FACTS",
    "PASSKEY_NEEDLE",
    "PASSKEY_QUESTION",
    "SYLLABLES",
    "TASKS",
    "Haystack",
    "NeedleBuilder",
    "TextSource",
    "answer_logits",
    "build_grid",
    "build_training_set",
    "check_depths",
    "check_learning_rates",
    "check_lengths",
    "check_tasks",
    "choose_learning_rate",
    "finetune_and_select",
    "load_model",
    "load_sources",
    "load_tokenizer",
    "mean_accuracy",
    "example_peak_mib",
    "plot_heatmaps",
    "read_paragraphs",
    "report",
    "run_needle_benchmark",
    "sample",
    "score",
    "score_rows",
    "seeded_random",
    "summarise",
    "text_files",
    "train",
    "truncate",
]
