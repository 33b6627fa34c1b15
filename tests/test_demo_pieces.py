"""The demo's generated language and task, and a miniature run of scripts/demo.py end to end."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.linear_model import LogisticRegression

from orchid_hf.demo_data import NEGATIVE, POSITIVE, make_corpus, make_sentiment_task, write_demo_data

pytestmark = pytest.mark.usefixtures("one_thread")


ROOT = Path(__file__).resolve().parents[1]


def test_generator_is_deterministic():
    assert make_corpus(20, seed=3) == make_corpus(20, seed=3)
    assert make_corpus(20, seed=3) != make_corpus(20, seed=4)
    assert make_sentiment_task(50, seed=1) == make_sentiment_task(50, seed=1)
    with pytest.raises(ValueError, match="num_documents must be >= 1, got 0"):
        make_corpus(0)
    with pytest.raises(ValueError, match="num_examples must be >= 1, got -2"):
        make_sentiment_task(-2)


def test_sentiment_label_is_polarity_flipped_by_negation():
    rows = make_sentiment_task(2000, seed=0)
    negated = 0
    for row in rows:
        words = row["sentence"].split()
        (adjective,) = [w for w in words if w in POSITIVE or w in NEGATIVE]
        negation = "not" in words
        negated += negation
        assert row["label"] == int((adjective in POSITIVE) != negation), row
    labels = np.array([row["label"] for row in rows])
    assert 0.45 < labels.mean() < 0.55 and 0.25 < negated / len(rows) < 0.35
    # Word counts alone cannot get it right; the order ("not" before the adjective) is needed.
    test = make_sentiment_task(1000, seed=1)
    vectorizer = CountVectorizer(token_pattern=r"\S+")
    features = vectorizer.fit_transform([r["sentence"] for r in rows])
    classifier = LogisticRegression(max_iter=2000).fit(features, labels)
    accuracy = classifier.score(vectorizer.transform([r["sentence"] for r in test]), [r["label"] for r in test])
    assert 0.6 < accuracy < 0.9


def test_demo_data_layout(tmp_path):
    sizes = dict(train_documents=5, validation_documents=3, train_examples=4, validation_examples=2)
    paths = write_demo_data(tmp_path, **sizes)
    assert len(paths["corpus_train"].read_text().splitlines()) == 5
    lines = paths["sst2_validation"].read_text().splitlines()
    assert lines[0] == "sentence\tlabel\tidx" and len(lines) == 3
    assert all(len(line.split("\t")) == 3 for line in lines)
    again = write_demo_data(tmp_path / "again", **sizes)
    assert all(paths[k].read_text() == again[k].read_text() for k in paths)


@pytest.mark.slow
def test_miniature_demo_runs_end_to_end(tmp_path):
    spec = importlib.util.spec_from_file_location("demo", ROOT / "scripts" / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    result = demo.run_demo(
        tmp_path, train_documents=150, train_examples=64, validation_examples=32, vocab_size=200,
        pretrain_steps=3, pretrain_batch_size=8, finetune_epochs=1, baseline=True,
    )  # fmt: skip
    assert 0.0 <= result["masked_accuracy_before"] <= 1.0 and 0.0 <= result["masked_accuracy_after"] <= 1.0
    assert 0.0 <= result["classification_accuracy"] <= 1.0
    assert result["classification_accuracy_from_scratch"] is not None
    assert json.loads((tmp_path / "summary.json").read_text())["seconds"] == result["seconds"]
    assert "pipeline_tag: fill-mask" in (tmp_path / "mlm" / "README.md").read_text()
    assert "pipeline_tag: text-classification" in (tmp_path / "glue" / "sst2" / "README.md").read_text()
    # Three steps teach nothing, and the check says so.
    assert result["learned"] is False
