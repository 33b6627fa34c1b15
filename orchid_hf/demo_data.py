"""The demo's data (``scripts/demo.py``, ``make demo``): a deterministic, English-like toy language for offline runs,
a corpus for masked-LM pretraining and a sentiment task laid out like GLUE's SST-2 (``sentence``, ``label``).

The language is a small templated grammar. Every document stays on one topic (sport, food, weather, ...),
so a masked topic word can be recovered from the rest of the document; people "love" or "enjoy" things
described with positive adjectives and "hate" or "avoid" things described with negative ones, so the
corpus also teaches which adjectives are positive. In the sentiment task the label is the adjective's
polarity, flipped when the sentence negates it ("was not great" is negative): a bag of words cannot
solve it, a model that reads the order can.
"""

from __future__ import annotations

import random
from pathlib import Path

TOPICS: dict[str, dict[str, list[str]]] = {
    "sport": dict(
        nouns=["match", "team", "goal", "coach", "ball", "stadium", "player", "race"],
        verbs=["played", "watched", "won", "lost", "trained for", "cheered at"],
        adjectives=["fast", "long", "tough", "early", "final", "local"],
        places=["field", "arena", "gym", "track"],
    ),
    "food": dict(
        nouns=["soup", "bread", "cake", "salad", "pasta", "coffee", "cheese", "pie"],
        verbs=["cooked", "ate", "baked", "ordered", "tasted", "shared"],
        adjectives=["warm", "fresh", "sweet", "spicy", "small", "homemade"],
        places=["kitchen", "restaurant", "bakery", "market"],
    ),
    "weather": dict(
        nouns=["rain", "storm", "wind", "snow", "cloud", "sun", "fog", "heat"],
        verbs=["expected", "watched", "felt", "reported", "measured", "forecast"],
        adjectives=["cold", "heavy", "dark", "strong", "sudden", "gentle"],
        places=["coast", "valley", "mountain", "harbor"],
    ),
    "music": dict(
        nouns=["song", "band", "guitar", "piano", "concert", "album", "singer", "drum"],
        verbs=["played", "heard", "recorded", "sang", "tuned", "practiced"],
        adjectives=["loud", "slow", "new", "quiet", "old", "live"],
        places=["studio", "theater", "club", "hall"],
    ),
    "travel": dict(
        nouns=["train", "flight", "hotel", "ticket", "map", "bus", "trip", "ship"],
        verbs=["booked", "missed", "took", "planned", "caught", "boarded"],
        adjectives=["late", "crowded", "cheap", "direct", "short", "night"],
        places=["station", "airport", "port", "city"],
    ),
    "science": dict(
        nouns=["experiment", "theory", "sample", "telescope", "cell", "atom", "laser", "model"],
        verbs=["tested", "studied", "measured", "built", "observed", "described"],
        adjectives=["careful", "precise", "novel", "simple", "large", "rare"],
        places=["laboratory", "university", "institute", "observatory"],
    ),
}
NAMES = ["anna", "ben", "clara", "david", "emma", "frank", "grace", "henry", "iris", "jack", "kate", "leo"]
POSITIVE = ["good", "great", "wonderful", "excellent", "lovely", "pleasant", "delightful", "superb"]
NEGATIVE = ["bad", "awful", "terrible", "poor", "dreadful", "boring", "horrible", "disappointing"]
LIKES = ["loved", "enjoyed", "liked", "praised", "adored"]
DISLIKES = ["hated", "disliked", "avoided", "criticized", "regretted"]
TIMES = ["yesterday", "today", "last week", "in the morning", "at night", "on sunday"]
LABEL_NAMES = ["negative", "positive"]


class SyntheticLanguage:
    """Sentences and documents of the toy language; the same ``seed`` always gives the same text."""

    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)

    def _pick(self, words: list[str]) -> str:
        return self.rng.choice(words)

    def _sentiment_clause(self, topic: dict[str, list[str]]) -> str:
        """'<name> loved the <noun> because it was <positive adjective>', or the negative mirror image."""
        positive = self.rng.random() < 0.5
        verb = self._pick(LIKES if positive else DISLIKES)
        adjective = self._pick(POSITIVE if positive else NEGATIVE)
        noun = self._pick(topic["nouns"])
        templates = [
            f"{self._pick(NAMES)} {verb} the {noun} because it was {adjective} .",
            f"everyone at the {self._pick(topic['places'])} {verb} the {adjective} {noun} .",
            f"the {noun} was {adjective} , so {self._pick(NAMES)} {verb} it .",
        ]
        return self._pick(templates)

    def _plain_sentence(self, topic: dict[str, list[str]]) -> str:
        noun, other = self.rng.sample(topic["nouns"], 2)
        adjective, place = self._pick(topic["adjectives"]), self._pick(topic["places"])
        verb = self._pick(topic["verbs"])
        templates = [
            f"{self._pick(NAMES)} {verb} the {adjective} {noun} at the {place} .",
            f"{self._pick(TIMES)} the {noun} was {adjective} and the {other} was {self._pick(topic['adjectives'])} .",
            f"after the {noun} , {self._pick(NAMES)} {verb} a {other} near the {place} .",
            f"at the {place} the {adjective} {noun} came before the {other} .",
            f"{self._pick(NAMES)} and {self._pick(NAMES)} {verb} the {noun} {self._pick(TIMES)} .",
        ]
        return self._pick(templates)

    def document(self, num_sentences: tuple[int, int] = (3, 6)) -> str:
        """A paragraph on one topic: plain sentences and, one time in three, sentiment clauses."""
        topic = TOPICS[self._pick(list(TOPICS))]
        sentences = [
            self._sentiment_clause(topic) if self.rng.random() < 0.35 else self._plain_sentence(topic)
            for _ in range(self.rng.randint(*num_sentences))
        ]
        return " ".join(sentences)

    def review(self) -> tuple[str, int]:
        """One sentiment-task example: (sentence, label) with label 1 = positive, 0 = negative."""
        topic = TOPICS[self._pick(list(TOPICS))]
        polarity = self.rng.random() < 0.5
        negated = self.rng.random() < 0.3
        adjective = self._pick(POSITIVE if polarity else NEGATIVE)
        noun, place = self._pick(topic["nouns"]), self._pick(topic["places"])
        negation = "not " if negated else ""
        templates = [
            f"the {noun} at the {place} was {negation}{adjective} .",
            f"{self._pick(TIMES)} the {noun} was {negation}{adjective} .",
            f"{self._pick(NAMES)} said the {noun} was {negation}{adjective} .",
            f"i think the {self._pick(topic['adjectives'])} {noun} is {negation}{adjective} .",
            f"honestly , the {noun} was {negation}really {adjective} .",
        ]
        return self._pick(templates), int(polarity != negated)


def make_corpus(num_documents: int, seed: int = 0) -> list[str]:
    """``num_documents`` paragraphs of the toy language, deterministic in ``seed``."""
    if num_documents < 1:
        raise ValueError(f"num_documents must be >= 1, got {num_documents}")
    language = SyntheticLanguage(seed)
    return [language.document() for _ in range(num_documents)]


def make_sentiment_task(num_examples: int, seed: int = 0) -> list[dict]:
    """``num_examples`` rows of the sentiment task as SST-2 rows: ``{"sentence", "label", "idx"}``."""
    if num_examples < 1:
        raise ValueError(f"num_examples must be >= 1, got {num_examples}")
    language = SyntheticLanguage(seed)
    rows = []
    for index in range(num_examples):
        sentence, label = language.review()
        rows.append({"sentence": sentence, "label": label, "idx": index})
    return rows


def write_demo_data(
    directory: str | Path,
    *,
    train_documents: int = 6000,
    validation_documents: int = 400,
    train_examples: int = 2000,
    validation_examples: int = 500,
    seed: int = 0,
) -> dict[str, Path]:
    """Write the corpus (``corpus/train.txt``, ``corpus/validation.txt``, one document per line) and the
    sentiment task in GLUE's layout (``sst2/train.tsv``, ``sst2/validation.tsv`` with ``sentence``,
    ``label``, ``idx`` columns). Train and validation use different seeds, so they share no generator state."""
    directory = Path(directory)
    (directory / "corpus").mkdir(parents=True, exist_ok=True)
    (directory / "sst2").mkdir(parents=True, exist_ok=True)
    paths = {
        "corpus_train": directory / "corpus" / "train.txt",
        "corpus_validation": directory / "corpus" / "validation.txt",
        "sst2_train": directory / "sst2" / "train.tsv",
        "sst2_validation": directory / "sst2" / "validation.tsv",
    }
    paths["corpus_train"].write_text("\n".join(make_corpus(train_documents, seed)) + "\n")
    paths["corpus_validation"].write_text("\n".join(make_corpus(validation_documents, seed + 1)) + "\n")
    splits = (("train", train_examples, seed + 2), ("validation", validation_examples, seed + 3))
    for split, count, split_seed in splits:
        lines = ["sentence\tlabel\tidx"]
        lines += [f"{r['sentence']}\t{r['label']}\t{r['idx']}" for r in make_sentiment_task(count, split_seed)]
        paths[f"sst2_{split}"].write_text("\n".join(lines) + "\n")
    return paths


__all__ = [
    "LABEL_NAMES",
    "NEGATIVE",
    "POSITIVE",
    "SyntheticLanguage",
    "make_corpus",
    "make_sentiment_task",
    "write_demo_data",
]
