"""Held-out masked-token accuracy of a masked LM at several context lengths, on the same masked tokens
(``scripts/long_context_eval.py``; docs/results/long_context.md).

The held-out text is one token stream (its documents joined by ``[SEP]``, as the pretraining recipe packs them,
:func:`token_stream`). Its masks are drawn once (:func:`mask_stream`, BERT's 80/10/10 rule at the recipe's masking
rate), and the masked stream is cut into blocks ``[CLS] <length - 2 tokens> [SEP]`` for each context length
(:func:`predict`): every length asks the model for the same tokens under the same corruption, and only how much of
the text around them it sees changes. Each masked token also gets categories (:func:`context_categories`) by where
else its token stands unmasked: in its block of the shortest length (``local``), only further away, in its block of
the longest length (``far``: only the longer context shows it), or in neither (``absent``); and ``rare`` when the
training text holds it fewer than ``rare_below`` times, which the held-out novel's names of people and places are.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.harness import provenance, table_lines, write_json
from experiments.real_data.report import difference_cell, interval_note

# The recipe's masking rate (orchid-bert-base-mlm), which every pretraining run of the comparison trained with.
MLM_PROBABILITY = 0.3
CATEGORIES = ("all", "local", "far", "absent", "rare", "far, rare")


def token_stream(tokenizer, texts: Iterable[str]) -> np.ndarray:
    """The token ids of the non-blank ``texts``, each followed by ``[SEP]``: the stream that the pretraining recipe
    cuts into blocks (``orchid_hf.pretraining.block_packer``)."""
    texts = [text for text in texts if text and text.strip()]
    if not texts:
        raise ValueError("no text to evaluate on: every document is blank")
    sep = tokenizer.sep_token_id
    if sep is None or tokenizer.cls_token_id is None or tokenizer.mask_token_id is None:
        raise ValueError("the tokenizer needs [CLS], [SEP] and [MASK] tokens (cls_token, sep_token, mask_token)")
    ids = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
    return np.fromiter((token for document in ids for token in (*document, sep)), dtype=np.int64)


def mask_stream(
    stream: np.ndarray, special_ids: Sequence[int], vocab_size: int, mask_id: int, probability: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(inputs, labels)``: each position not holding a special token is selected with ``probability``; a selected
    position becomes ``mask_id`` (80%), a random token (10%) or stays (10%), as ``DataCollatorForLanguageModeling``
    corrupts; ``labels`` holds the original token where selected and -100 elsewhere. Drawn with ``seed`` alone."""
    if not 0.0 < probability < 1.0:
        raise ValueError(f"probability must be in (0, 1), got {probability}")
    rng = np.random.default_rng(seed)
    selected = ~np.isin(stream, np.asarray(list(special_ids))) & (rng.random(len(stream)) < probability)
    draw = rng.random(len(stream))
    inputs = stream.copy()
    inputs[selected & (draw < 0.8)] = mask_id
    replaced = selected & (draw >= 0.8) & (draw < 0.9)
    inputs[replaced] = rng.integers(0, vocab_size, int(replaced.sum()))
    return inputs, np.where(selected, stream, -100)


def seen_in_block(stream: np.ndarray, labels: np.ndarray, length: int) -> np.ndarray:
    """Per position: whether it is masked (a label) and its token stands unmasked elsewhere in its block of
    ``length`` (``length - 2`` tokens of the stream, as :func:`predict` cuts it)."""
    block = np.arange(len(stream)) // (length - 2)
    selected = labels != -100
    key = block * (int(stream.max()) + 1) + stream
    return selected & np.isin(key, key[~selected])


def context_categories(
    stream: np.ndarray, labels: np.ndarray, short: int, long: int, training_counts: np.ndarray, rare_below: int
) -> dict[str, np.ndarray]:
    """Boolean masks over the stream's positions, one per name of :data:`CATEGORIES`: every masked token; those whose
    token stands unmasked elsewhere in their block of ``short`` tokens (``local``); the others whose token stands so in
    their block of ``long`` tokens (``far``); the rest (``absent``); and those whose token occurs fewer than
    ``rare_below`` times in the training text (``training_counts``, indexed by token id)."""
    if not 2 < short <= long:
        raise ValueError(f"need 2 < short <= long (blocks hold [CLS], [SEP] and text), got short={short}, long={long}")
    selected = labels != -100
    local = seen_in_block(stream, labels, short)
    far = seen_in_block(stream, labels, long) & ~local
    counts = np.asarray(training_counts)
    if len(counts) <= stream.max():
        raise ValueError(f"training_counts covers token ids below {len(counts)}, but the stream holds {stream.max()}")
    rare = selected & (counts[stream] < rare_below)
    return {"all": selected, "local": local, "far": far, "absent": selected & ~local & ~far, "rare": rare,
            "far, rare": far & rare}  # fmt: skip


@torch.no_grad()
def predict(
    model, inputs: np.ndarray, labels: np.ndarray, length: int, special: dict[str, int], tokens_per_batch: int = 4096
) -> tuple[np.ndarray, np.ndarray]:
    """``(predictions, losses)`` per stream position: the model's arg-max and the cross-entropy of the label where
    there is one (-1 and NaN elsewhere), with the masked stream ``inputs`` cut into blocks ``[CLS] <length - 2>
    [SEP]`` (the last one shorter, padded with ``special["pad"]`` and masked out), ``tokens_per_batch // length``
    blocks at a time. ``special`` holds the ``cls``, ``sep`` and ``pad`` ids."""
    if length < 3:
        raise ValueError(f"length must be >= 3 ([CLS], one token, [SEP]), got {length}")
    model.eval()
    content = length - 2
    starts = list(range(0, len(inputs), content))
    per_batch = max(1, tokens_per_batch // length)
    predictions = np.full(len(inputs), -1, dtype=np.int64)
    losses = np.full(len(inputs), np.nan)
    for first in range(0, len(starts), per_batch):
        batch = starts[first : first + per_batch]
        rows = [inputs[start : start + content] for start in batch]
        ids = torch.full((len(rows), max(map(len, rows)) + 2), special["pad"], dtype=torch.long)
        mask = torch.zeros_like(ids)
        for k, row in enumerate(rows):
            ids[k, : len(row) + 2] = torch.as_tensor([special["cls"], *row, special["sep"]])
            mask[k, : len(row) + 2] = 1
        logits = model(input_ids=ids, attention_mask=mask).logits
        for k, (start, row) in enumerate(zip(batch, rows)):
            target = torch.as_tensor(labels[start : start + len(row)])
            scored = target != -100
            where = start + np.flatnonzero(scored.numpy())
            scores = logits[k, 1 : len(row) + 1][scored].float()
            predictions[where] = scores.argmax(-1).numpy()
            losses[where] = F.cross_entropy(scores, target[scored], reduction="none").numpy()
    return predictions, losses


def summarise(
    predictions: np.ndarray, losses: np.ndarray, labels: np.ndarray, categories: dict[str, np.ndarray]
) -> dict[str, dict]:
    """Per category: the masked tokens it holds (``count``), their accuracy and mean cross-entropy (None if none)."""
    summary = {}
    for name, where in categories.items():
        count = int(where.sum())
        summary[name] = {
            "count": count,
            "accuracy": float((predictions[where] == labels[where]).mean()) if count else None,
            "loss": float(losses[where].mean()) if count else None,
        }
    return summary


def load_masked_lm(model_name_or_path: str | Path, length: int, one_transform_length: bool = False):
    """``(model, how)``: the masked LM of ``model_name_or_path`` to read blocks of ``length`` tokens, or ``(None,
    reason)`` when it cannot. An Orchid model whose context is shorter is extended without training (docs/model.md,
    "Context extension"; ``how`` says so); with ``one_transform_length`` an Orchid model mixes every input at its
    longest transform length (``transform_lengths=[max_position_embeddings]``) instead of its own ladder."""
    from transformers import AutoConfig, AutoModelForMaskedLM

    import orchid_hf  # noqa: F401  (registers the orchid model type with the Auto classes)

    config = AutoConfig.from_pretrained(model_name_or_path)
    positions = config.max_position_embeddings
    orchid = config.model_type == "orchid"
    if one_transform_length and not orchid:
        raise ValueError(f"one_transform_length is a setting of Orchid models; {model_name_or_path} is a "
                         f"{config.model_type} model")  # fmt: skip
    if length > positions and not orchid:
        return None, f"its positions stop at {positions}"
    kwargs, how = {}, "as trained"
    if one_transform_length:
        kwargs["transform_lengths"] = [positions]
        how += f", one transform length ({positions})"
    model = AutoModelForMaskedLM.from_pretrained(model_name_or_path, **kwargs)
    if length > positions:
        # In memory, after loading: the checkpoint's position embeddings are loaded at their own size first.
        model.resize_position_embeddings(length)
        how = f"extended from {positions} to {length} positions without training" + how.removeprefix("as trained")
    return model, how


def evaluate_contexts(
    model_name_or_path: str | Path,
    validation_file: str | Path,
    train_file: str | Path,
    lengths: Sequence[int],
    output_dir: str | Path,
    mlm_probability: float = MLM_PROBABILITY,
    seed: int = 0,
    rare_below: int = 5,
    tokens_per_batch: int = 4096,
    one_transform_length: bool = False,
) -> dict:
    """Masked-token accuracy and loss of one masked LM on the documents of ``validation_file`` (text, one document a
    line) at every context length of ``lengths`` it can read (:func:`load_masked_lm`), per category
    (:func:`context_categories`, whose ``short`` and ``long`` blocks are the shortest and longest of ``lengths``;
    rarity counted in ``train_file``); every length reads the same stream, cut to whole blocks of the longest length.
    With ``one_transform_length`` an Orchid model is also read at every length below its own with one transform
    length. Writes and returns ``results.json`` in ``output_dir``."""
    from transformers import AutoConfig, AutoTokenizer

    lengths = sorted(set(lengths))
    if not lengths or lengths[0] < 3:
        raise ValueError(f"lengths must be context lengths of at least 3 tokens, got {lengths}")
    tokenizer = AutoTokenizer.from_pretrained(model_name_or_path)
    config = AutoConfig.from_pretrained(model_name_or_path)
    stream = token_stream(tokenizer, Path(validation_file).read_text(encoding="utf-8").splitlines())
    kept = len(stream) // (lengths[-1] - 2) * (lengths[-1] - 2)
    if kept == 0:
        raise ValueError(f"{validation_file} holds {len(stream)} tokens, fewer than one block of {lengths[-1]}")
    stream = stream[:kept]
    training = token_stream(tokenizer, Path(train_file).read_text(encoding="utf-8").splitlines())
    counts = np.bincount(training, minlength=len(tokenizer))
    special = {"cls": tokenizer.cls_token_id, "sep": tokenizer.sep_token_id, "pad": tokenizer.pad_token_id}
    inputs, labels = mask_stream(stream, tokenizer.all_special_ids, len(tokenizer), tokenizer.mask_token_id,
                                 mlm_probability, seed)  # fmt: skip
    categories = context_categories(stream, labels, lengths[0], lengths[-1], counts, rare_below)
    settings = [(length, False) for length in lengths]
    if one_transform_length and config.model_type == "orchid":
        settings += [(length, True) for length in lengths if length < config.max_position_embeddings]
    evaluations = []
    for length, one_length in settings:
        model, how = load_masked_lm(model_name_or_path, length, one_length)
        entry = {"length": length, "one_transform_length": one_length, "how": how}
        if model is not None:
            start = time.perf_counter()
            predictions, losses = predict(model, inputs, labels, length, special, tokens_per_batch)
            entry.update(seconds=time.perf_counter() - start, categories=summarise(predictions, losses, labels,
                                                                                   categories))  # fmt: skip
        evaluations.append(entry)
    results = {
        "model": str(model_name_or_path),
        "model_type": config.model_type,
        "max_position_embeddings": config.max_position_embeddings,
        "validation_file": str(validation_file),
        "train_file": str(train_file),
        "tokens": int(kept),
        "mlm_probability": mlm_probability,
        "seed": seed,
        "rare_below": rare_below,
        "category_blocks": [lengths[0], lengths[-1]],
        "evaluations": evaluations,
        **provenance(),
    }
    write_json(Path(output_dir) / "results.json", results)
    return results


__all__ = [
    "CATEGORIES",
    "context_categories",
    "evaluate_contexts",
    "load_masked_lm",
    "mask_stream",
    "predict",
    "seen_in_block",
    "summarise",
    "token_stream",
]


# The seeds of a long-context setting: run files (as in docs/results/long_context_causes/) named SETTING for seed 0
# and SETTING-sN for seed N, each with its commands, its recipe's results and its evaluation.
SEED_SUFFIX = "-s"
SEED_COLUMNS = (("all", 128), ("all", 512), ("all", 2048), ("far", 128), ("far", 512), ("far", 2048))


def run_seed(run: dict) -> int:
    """The pretraining seed of a run file: the ``--seed`` of its first command (the recipe's), 0 where it has none."""
    words = run["commands"][0].split()
    return int(words[words.index("--seed") + 1]) if "--seed" in words else 0


def run_scores(run: dict) -> dict[str, float]:
    """A run's held-out accuracies by category and length (``"all 128"``, ``"far 2048"``, ...), each block read at its
    own transform length, and its recipe's held-out loss (``"loss"``)."""
    scores = {"loss": run["recipe"]["eval_loss"]}
    for entry in run["evaluation"]["evaluations"]:
        if entry["one_transform_length"] or "categories" not in entry:
            continue
        for category, length in SEED_COLUMNS:
            if entry["length"] == length:
                scores[f"{category} {length}"] = entry["categories"][category]["accuracy"]
    return scores


def seed_groups(runs_dir: str | Path, settings: Sequence[str]) -> dict[str, dict[int, dict[str, float]]]:
    """Each setting's scores by seed, from the run files SETTING.json and SETTING-sN.json in ``runs_dir``; a
    ValueError names a setting without run files, or a file whose seed is not the one its name says."""
    groups = {}
    for setting in settings:
        seeds = {}
        for path in sorted(Path(runs_dir).glob(f"{setting}*.json")):
            suffix = path.stem[len(setting):]
            if suffix and not re.fullmatch(rf"{SEED_SUFFIX}\d+", suffix):
                continue  # another setting whose name begins with this one
            run = json.loads(path.read_text())
            seed = run_seed(run)
            if seed != (int(suffix[len(SEED_SUFFIX):]) if suffix else 0):
                raise ValueError(f"{path.name}: its recipe ran with --seed {seed}, not the seed its name says")
            seeds[seed] = run_scores(run)
        if not seeds:
            raise ValueError(f"no run files of {setting!r} in {runs_dir} ({setting}.json, {setting}-sN.json)")
        groups[setting] = dict(sorted(seeds.items()))
    return groups


def seed_cell(values: list[float], scale: float = 100.0, digits: int = 1) -> str:
    """The mean of per-seed values and, with several seeds, each one: ``20.9 (22.0 / 20.5 / 20.1)``."""
    mean = f"{scale * sum(values) / len(values):.{digits}f}"
    if len(values) == 1:
        return mean
    return f"{mean} ({' / '.join(f'{scale * value:.{digits}f}' for value in values)})"


def seed_tables(groups: dict[str, dict[int, dict[str, float]]], names: dict[str, str],
                comparisons: Sequence[tuple[str, str]]) -> str:
    """The page's tables: each setting's seeds, mean and per-seed held-out accuracies and loss; then, for each pair
    of ``comparisons`` (first, second), the difference of the means with its 95% interval
    (:func:`experiments.real_data.report.difference_cell`), stated only from three seeds a side."""
    columns = [f"{category} {length}" for category, length in SEED_COLUMNS]
    header = ["run", "seeds", *[f"{column} %" for column in columns], "held-out loss (recipe)"]
    rows = []
    for setting, seeds in groups.items():
        values = {key: [scores[key] for scores in seeds.values()] for key in (*columns, "loss")}
        rows.append([names.get(setting, setting), ", ".join(map(str, seeds)),
                     *[seed_cell(values[key]) for key in columns], seed_cell(values["loss"], scale=1, digits=2)])
    lines = table_lines(header, rows)
    if comparisons:
        lines += ["", *table_lines(["first − second", *columns], [
            [f"{names.get(first, first)} − {names.get(second, second)}",
             *[difference_cell([s[key] for s in groups[first].values()], [s[key] for s in groups[second].values()])
               for key in columns]]
            for first, second in comparisons])]  # fmt: skip
        lines += ["", interval_note("the second model")]
    return "\n".join(lines) + "\n"
