"""Linear probes on frozen features for the novels' pair task (same novel or not): is what tells two passages'
novels apart in a model's features at all, before any fine-tuning? Each passage is encoded alone (one segment) by
a model that is never trained here; its features are the mean over its real tokens of the embeddings' output and
of the last layer; a pair is described by the products and the absolute differences of its two passages'
standardised features (the form of the bag-of-words floor's pair features, so that a linear model can weigh
"alike" whichever direction it is in), and a logistic regression is chosen and scored as the floor is
(:func:`experiments.real_data.baselines.choose_and_score`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from benchmarks.harness import provenance, write_json
from experiments.real_data.baselines import check_logistic_settings, choose_and_score, read_task_csv
from orchid_hf.extras import require_extra

INITS = ("pretrained", "random")
LAYERS = ("embeddings", "last")


@torch.no_grad()
def passage_features(model, tokenizer, texts: Sequence[str], batch_size: int = 64) -> dict[str, np.ndarray]:
    """The mean over each passage's real tokens (its attention mask) of the embeddings' output and of the last
    layer's output, in float64, one row per text, keyed by :data:`LAYERS`; what padding holds never enters."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    model.eval()
    features: dict[str, list[np.ndarray]] = {layer: [] for layer in LAYERS}
    for start in tqdm(range(0, len(texts), batch_size), desc="encoding passages", unit="batch", disable=None):
        batch = tokenizer(list(texts[start : start + batch_size]), padding=True, return_tensors="pt")
        batch.pop("token_type_ids", None)  # one segment: every model takes its default, type 0
        outputs = model(**batch, output_hidden_states=True)
        real = batch["attention_mask"].unsqueeze(-1).bool()
        for layer, hidden in zip(LAYERS, (outputs.hidden_states[0], outputs.hidden_states[-1])):
            # masked_fill, not a product with the mask: whatever a padded position holds (NaN too) stays out.
            total = hidden.to(torch.float64).masked_fill(~real, 0.0).sum(1)
            features[layer].append((total / real.sum(1)).numpy())
    return {layer: np.concatenate(rows) for layer, rows in features.items()}


def pair_features(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """A pair's features from its two passages' (standardised) features: their product and their absolute
    difference, side by side; the same whichever passage comes first."""
    return np.hstack([first * second, np.abs(first - second)])


def load_frozen_model(model_name_or_path: str | Path, init: str = "pretrained", seed: int = 0):
    """The encoder of ``model_name_or_path`` (a masked-LM checkpoint loads without its head) with its weights
    (``init="pretrained"``), or the same configuration at random initialisation drawn with ``seed``
    (``init="random"``), and its tokenizer."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    import orchid_hf  # noqa: F401  (registers the orchid model type with the Auto classes)

    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    if init == "pretrained":
        model = AutoModel.from_pretrained(str(model_name_or_path))
    else:
        torch.manual_seed(seed)
        model = AutoModel.from_config(AutoConfig.from_pretrained(str(model_name_or_path)))
    return model.float().eval(), AutoTokenizer.from_pretrained(str(model_name_or_path))


def frozen_feature_pair_probe(
    task_dir: str | Path,
    model_name_or_path: str | Path,
    output_dir: str | Path,
    init: str = "pretrained",
    seed: int = 0,
    C: Sequence[float] = (0.1, 1.0, 10.0),
    max_iter: int = 1000,
    batch_size: int = 64,
) -> dict:
    """For each of :data:`LAYERS`, a logistic regression on :func:`pair_features` of the frozen model's passage
    features (standardised with the training pairs' passages' mean and spread), fitted on ``train.csv`` of
    ``task_dir`` once per C, chosen on ``validation.csv`` and scored on ``test.csv``; ``results.json`` in
    ``output_dir`` holds, per layer, what :func:`~experiments.real_data.baselines.choose_and_score` returns."""
    require_extra("sklearn", "vision")
    check_logistic_settings(C, max_iter)
    task_dir = Path(task_dir)
    splits = {name: read_task_csv(task_dir / f"{name}.csv") for name in ("train", "validation", "test")}
    if len(splits["train"][0][0]) != 2:
        raise ValueError(f"{task_dir}/train.csv is not a pair task: it has one text column (sentence), not two")
    model, tokenizer = load_frozen_model(model_name_or_path, init, seed)
    # Each distinct passage once: most passages open one pair and close another.
    texts = sorted({text for rows, _ in splits.values() for row in rows for text in row})
    index = {text: i for i, text in enumerate(texts)}
    encoded = passage_features(model, tokenizer, texts, batch_size)
    labels = {name: np.asarray(values) for name, (_, values) in splits.items()}
    results = {
        "task_dir": str(task_dir),
        "model_name_or_path": str(model_name_or_path),
        "model_type": model.config.model_type,
        "init": init,
        "seed": seed,
        "max_iter": max_iter,
        "num_passages": len(texts),
        "features": "mean over the real tokens, each passage alone; a pair: product and absolute difference",
        "layers": {},
    }
    rows = {name: np.asarray([[index[a], index[b]] for a, b in pairs]) for name, (pairs, _) in splits.items()}
    seen = np.unique(rows["train"])
    for layer in LAYERS:
        mean = encoded[layer][seen].mean(0)
        spread = encoded[layer][seen].std(0) + 1e-12  # a feature constant over the training passages stays 0
        scaled = (encoded[layer] - mean) / spread
        features = {name: pair_features(scaled[r[:, 0]], scaled[r[:, 1]]) for name, r in rows.items()}
        results["layers"][layer] = choose_and_score(features, labels, C, max_iter)
    results.update(provenance())
    write_json(Path(output_dir) / "results.json", results)
    return results


__all__ = ["INITS", "LAYERS", "frozen_feature_pair_probe", "load_frozen_model", "pair_features", "passage_features"]
