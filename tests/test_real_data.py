"""The real-data report (experiments/real_data/report.py, scripts/real_data_report.py) on miniature runs of the same
scripts that scripts/real_data.sh runs, with generated novels and IDX images: every number in the tables comes from a
run's own result files, the plots are drawn, and only the generated blocks of the report and README change."""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.harness import replace_block
from experiments.real_data.baselines import logistic_regression_baseline
from experiments.real_data.report import (
    ATTRIBUTION_RUN,
    CONTEXT_RUN,
    GRID_RUN,
    PAIRS_RUN,
    PROBE_RUN,
    best_pooled_point,
    choose_grid_point,
    collect_runs,
    comparison_outcome,
    comparison_words,
    difference_cell,
    difference_interval,
    grid_record,
    load_records,
    pretraining_table,
    render_report,
    time_note,
    time_report,
)
from orchid_hf.glue import main as finetune
from orchid_hf.pretraining import main as pretrain
from tests.test_novels import SPECIALS, chapter_words, write_novel
from tests.test_vision import write_idx_folder

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
ORCHID = "hidden_size=32,num_hidden_layers=1,intermediate_size=64,max_position_embeddings=32,filter_width=16"
BERT = "hidden_size=32,num_hidden_layers=1,intermediate_size=64,max_position_embeddings=32,num_attention_heads=2"
QUIET = ["--use_cpu", "--disable_tqdm", "True", "--report_to", "none", "--save_strategy", "no"]
BLOCKS = ("headline", "pretraining", "attribution", "pairs", "grid", "images", "machine")


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Run folders named as scripts/real_data.sh names them, made by the real scripts on tiny data."""
    root = tmp_path_factory.mktemp("real_data")
    novels = root / "novels"
    novels.mkdir()
    for index, name in enumerate(("alpha", "beta", "gamma")):
        write_novel(novels / f"{name}.txt", index, 6, "CHAPTER {roman}")
    words = [w for n in range(3) for c in range(6) for w in chapter_words(n, c)]
    (novels / "vocab").mkdir()
    (novels / "vocab" / "vocab.txt").write_text("\n".join(SPECIALS + [".", ","] + words) + "\n")
    data, out = root / "data", root / "runs"
    load_script("prepare_novels").main(
        ["--novels", *map(str, sorted(novels.glob("*.txt"))), "--held_out", "gamma", "--vocab_dir",
         str(novels / "vocab"), "--passage_tokens", "16", "--pair_tokens", "8", "--test_every", "3",
         "--validation_every", "2", "--output_dir", str(data)]
    )  # fmt: skip
    mlm = ["--train_file", str(data / "mlm/train.txt"), "--validation_file", str(data / "mlm/validation.txt"),
           "--tokenizer_name", str(data / "tokenizer"), "--max_seq_length", "16",
           "--per_device_train_batch_size", "4",
           "--max_steps", "4", "--eval_strategy", "steps", "--eval_steps", "2", "--logging_steps", "2",
           "--eval_before_training", "--cache_dir", str(root / "cache"), *QUIET]  # fmt: skip
    pretrain([*mlm, "--config_overrides", ORCHID, "--output_dir", str(out / "pretrain-orchid")])
    pretrain([*mlm, "--model_type", "bert", "--config_overrides", BERT, "--output_dir", str(out / "pretrain-bert")])
    pretrain([*mlm, "--model_type", "bert", "--config_overrides", BERT, "--learning_rate", "1e-4",
              "--output_dir", str(out / "pretrain-bert-lr1e-4")])  # fmt: skip
    task = ["--train_file", str(data / "attribution-16/trainval.csv"), "--validation_file",
            str(data / "attribution-16/test.csv"), "--max_seq_length", "16", "--max_steps", "2",
            *QUIET]  # fmt: skip
    for seed in (0, 1):
        finetune([*task, "--seed", str(seed), "--model_name_or_path", str(out / "pretrain-orchid"), "--pooling",
                  "first", "--output_dir", str(out / f"attribution-16-orchid-pretrained-s{seed}")])  # fmt: skip
    finetune([*task, "--model_name_or_path", str(out / "pretrain-orchid"), "--pooling", "mean",
              "--output_dir", str(out / "attribution-16-orchid-pretrained-mean-pooling-s0")])  # fmt: skip
    finetune([*task, "--model_name_or_path", str(out / "pretrain-bert"),
              "--output_dir", str(out / "attribution-16-bert-pretrained-s0")])  # fmt: skip
    finetune([*task, "--model_type", "bert", "--config_overrides", BERT, "--tokenizer_name", str(data / "tokenizer"),
              "--output_dir", str(out / "attribution-16-bert-scratch-s0")])  # fmt: skip
    pairs = ["--train_file", str(data / "pairs-16/trainval.csv"), "--validation_file", str(data / "pairs-16/test.csv"),
             "--max_seq_length", "16", "--max_steps", "2", *QUIET]  # fmt: skip
    for arch in ("orchid", "bert"):
        finetune([*pairs, "--model_name_or_path", str(out / f"pretrain-{arch}"),
                  "--output_dir", str(out / f"pairs-16-{arch}-pretrained-s0")])  # fmt: skip
    # A grid of two points and a run at the chosen one, as the grid stage names them.
    for lr in ("1e-4", "1e-3"):
        finetune(["--train_file", str(data / "attribution-16/train.csv"), "--validation_file",
                  str(data / "attribution-16/validation.csv"), "--max_seq_length", "16", "--max_steps", "2",
                  "--pooling", "mean", "--learning_rate", lr, "--model_name_or_path", str(out / "pretrain-orchid"),
                  *QUIET, "--output_dir",
                  str(out / f"grid-attribution-16-orchid-pretrained-mean-lr{lr}-s0")])  # fmt: skip
    pooling, chosen = load_script("real_data_report").main(
        ["--runs", str(out), "--choose", "grid-attribution-16-orchid-pretrained", "--grid_poolings", "mean",
         "--grid_learning_rates", "1e-4", "1e-3"]
    ).split()  # fmt: skip
    finetune(["--train_file", str(data / "attribution-16/train.csv"), "--validation_file",
              str(data / "attribution-16/test.csv"), "--max_seq_length", "16", "--max_steps", "2", "--pooling",
              pooling, "--learning_rate", chosen, "--seed", "1", "--model_name_or_path", str(out / "pretrain-orchid"),
              *QUIET, "--output_dir", str(out / "grid-attribution-16-orchid-pretrained-chosen-s1")])  # fmt: skip
    images = write_idx_folder(root / "idx", train=24, test=12)
    sys.path.insert(0, str(ROOT / "scripts"))
    image_args = ["--train_dir", str(images), "--recipe", "orchid-vit-digits", "--num_train_epochs", "1",
                  "--per_device_train_batch_size", "8", "--class_names", "left", "middle", "right", *QUIET]  # fmt: skip
    image = "num_channels=1,image_size=28,patch_size=7,hidden_size=16,num_hidden_layers=1"
    train_image = load_script("train_image").main
    train_image([*image_args, "--config_overrides", image, "--output_dir", str(out / "fashion-orchid-s0")])
    vit = f"{image},num_attention_heads=2,intermediate_size=32"
    vit_folder = str(out / "fashion-vit-s0")
    train_image([*image_args, "--model_type", "vit", "--config_overrides", vit, "--output_dir", vit_folder])
    load_script("image_baseline").main(["--train_dir", str(images), "--output_dir", str(out / "fashion-logreg"),
                                        "--class_names", "left", "middle", "right", "--max_iter", "20"])  # fmt: skip
    for task in ("attribution-16", "pairs-16"):
        load_script("text_baseline").main(["--task_dir", str(data / task), "--tokenizer_name", str(data / "tokenizer"),
                                           "--output_dir", str(out / f"floor-{task}")])  # fmt: skip
    for arch, init in (("orchid", "pretrained"), ("bert", "random")):
        load_script("pair_probe").main(["--task_dir", str(data / "pairs-16"), "--model_name_or_path",
                                        str(out / f"pretrain-{arch}"), "--init", init,
                                        "--output_dir", str(out / f"probe-pairs-16-{arch}-{init}")])  # fmt: skip
    (out / "attribution-16-orchid-scratch-s0").mkdir()  # unfinished: no results.json, not collected
    return out


def skeleton(path: Path, names=BLOCKS) -> Path:
    text = "# Report\n\nWritten by hand.\n\n"
    text += "\n\n".join(f"<!-- real-data:{n} -->\nold\n<!-- /real-data:{n} -->" for n in names) + "\n\nThe end.\n"
    path.write_text(text)
    return path


@pytest.mark.slow
def test_report_tables_come_from_the_runs(runs, tmp_path):
    results = tmp_path / "results"
    names = collect_runs(runs, results)
    assert names == [
        "attribution-16-bert-pretrained-s0", "attribution-16-bert-scratch-s0",
        "attribution-16-orchid-pretrained-mean-pooling-s0", "attribution-16-orchid-pretrained-s0",
        "attribution-16-orchid-pretrained-s1", "fashion-logreg", "fashion-orchid-s0", "fashion-vit-s0",
        "floor-attribution-16", "floor-pairs-16",
        "grid-attribution-16-orchid-pretrained-chosen-s1", "grid-attribution-16-orchid-pretrained-mean-lr1e-3-s0",
        "grid-attribution-16-orchid-pretrained-mean-lr1e-4-s0", "pairs-16-bert-pretrained-s0",
        "pairs-16-orchid-pretrained-s0", "pretrain-bert", "pretrain-bert-lr1e-4", "pretrain-orchid",
        "probe-pairs-16-bert-random", "probe-pairs-16-orchid-pretrained",
    ]  # fmt: skip
    records = load_records(results)
    assert len(records["pretraining"]) == 3 and len(records["attribution"]) == 5 and len(records["image"]) == 3
    assert len(records["pairs"]) == 2 and len(records["grid"]) == 3 and len(records["floor"]) == 2
    assert len(records["probe"]) == 2

    orchid = json.loads((results / "pretrain-orchid.json").read_text())
    own = json.loads((runs / "pretrain-orchid" / "results.json").read_text())
    assert orchid["num_parameters"] == own["num_parameters"]
    # Word, position and token-type tables of width 32.
    config = json.loads((runs / "pretrain-orchid" / "config.json").read_text())
    rows = config["vocab_size"] + config["max_position_embeddings"] + config["type_vocab_size"]
    assert orchid["num_parameters"] - orchid["num_parameters_without_embeddings"] == rows * 32
    assert [p["step"] for p in orchid["curve"]] == [0, 2, 4]
    seconds = [p["train_seconds"] for p in orchid["curve"]]
    assert seconds[0] == 0 < seconds[1] <= seconds[2]
    assert orchid["eval"]["loss"] == own["eval"]["eval_loss"]
    assert (orchid["learning_rate"], orchid["variant"]) == (8e-4, None)  # the recipe's
    variant = json.loads((results / "pretrain-bert-lr1e-4.json").read_text())
    assert (variant["learning_rate"], variant["variant"], variant["arch"]) == (1e-4, "lr1e-4", "bert")

    report, readme = skeleton(tmp_path / "real_data.md"), skeleton(tmp_path / "README.md", ["headline"])
    script = load_script("real_data_report")
    blocks = script.main(["--results", str(results), "--report", str(report), "--readme", str(readme)])
    text = report.read_text()
    assert text.startswith("# Report\n\nWritten by hand.") and text.endswith("The end.\n") and "\nold\n" not in text
    for name in BLOCKS:
        assert f"<!-- real-data:{name} -->\n{blocks[name]}\n<!-- /real-data:{name} -->" in text
    assert f"<!-- real-data:headline -->\n{blocks['headline']}\n" in readme.read_text()

    accuracy = json.loads((runs / "pretrain-bert" / "results.json").read_text())["eval"]["eval_masked_accuracy"]
    assert f"| BERT {100 * accuracy:.1f}% |" in blocks["headline"]  # the recipe's run, not the variant
    assert [line.split(" | ")[3] for line in blocks["pretraining"].splitlines()[2:5]] == ["0.0008", "0.0008", "0.0001"]
    seeds_records = [json.loads((results / f"attribution-16-orchid-pretrained-s{s}.json").read_text()) for s in (0, 1)]
    seeds = [record["accuracy"] for record in seeds_records]
    row = f"| 16 tokens | Orchid | pretrained | {50 * sum(seeds):.1f} ({100 * seeds[0]:.1f} / {100 * seeds[1]:.1f}) |"
    assert row in blocks["attribution"]
    # A variant has its own row, and the headline keeps to the recipe's runs.
    mean_pooling = json.loads((results / "attribution-16-orchid-pretrained-mean-pooling-s0.json").read_text())
    assert (mean_pooling["variant"], mean_pooling["hyperparameters"]["pooling"]) == ("mean-pooling", "mean")
    assert "variant" not in seeds_records[0] and seeds_records[0]["hyperparameters"]["pooling"] == "first"
    row = f"| 16 tokens | Orchid, mean pooling | pretrained | {100 * mean_pooling['accuracy']:.1f} |"
    assert row in blocks["attribution"]
    assert f"| novel attribution, 16-token passages, pretrained | {50 * sum(seeds):.1f}% |" in blocks["headline"]
    assert re.search(r"\| 16 tokens \| BERT \| scratch \| \d+\.\d \| – \| \d+\.\d min \|", blocks["attribution"])
    logreg = json.loads((runs / "fashion-logreg" / "results.json").read_text())
    assert f"| logistic regression | 2k | {100 * logreg['accuracy']:.2f} |" in blocks["images"]
    assert f"logistic regression {100 * logreg['accuracy']:.2f}%" in blocks["headline"]
    # The pair task and the grid, from the runs' own files.
    pair_runs = {arch: json.loads((runs / f"pairs-16-{arch}-pretrained-s0" / "results.json").read_text())
                 for arch in ("orchid", "bert")}  # fmt: skip
    assert pair_runs["orchid"]["hyperparameters"]["pooling"] == "mean"  # the recipe's, for a new Orchid head
    orchid, bert = (100 * pair_runs[a]["metrics"]["validation"]["accuracy"] for a in ("orchid", "bert"))
    assert f"| 2 × 8 tokens | Orchid | pretrained | {orchid:.1f} |" in blocks["pairs"]
    assert f"| same novel, pairs of 2 × 8 tokens, pretrained | {orchid:.1f}% | BERT {bert:.1f}% |" in blocks["headline"]
    grid = {lr: json.loads((runs / f"grid-attribution-16-orchid-pretrained-mean-lr{lr}-s0" / "results.json")
                           .read_text()) for lr in ("1e-4", "1e-3")}  # fmt: skip
    assert {lr: result["learning_rate"] for lr, result in grid.items()} == {"1e-4": 1e-4, "1e-3": 1e-3}
    chosen = json.loads((results / "grid-attribution-16-orchid-pretrained-chosen-s1.json").read_text())
    assert chosen["scored_on"] == "test" and chosen["chosen"] and chosen["hyperparameters"]["pooling"] == "mean"
    row = next(line for line in blocks["grid"].splitlines() if line.startswith("| novel attribution, 16 tokens"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    validation = [f"{100 * grid[lr]['metrics']['validation']['accuracy']:.1f}" for lr in ("1e-4", "1e-3")]
    assert cells[3] == "mean" and [cell.strip("*") for cell in cells[4:6]] == validation
    edge = " (the grid's highest)" if chosen["learning_rate"] == 1e-3 else " (the grid's lowest)"
    assert cells[6] == f"mean, lr {chosen['learning_rate']:g}{edge}" and cells[7] == f"{100 * chosen['accuracy']:.1f}"
    # The bag-of-words floors, below the grid: C chosen on the validation chapters, accuracy on the test chapters.
    for task, text in (("attribution-16", "novel attribution, 16 tokens"), ("pairs-16", "same novel, pairs of 2 × 8 "
                                                                                       "tokens")):  # fmt: skip
        floor = json.loads((runs / f"floor-{task}" / "results.json").read_text())
        assert floor["validation_accuracy"][f"{floor['chosen_C']:g}"] == max(floor["validation_accuracy"].values())
        assert f"{text} {100 * floor['accuracy']:.1f}% (C {floor['chosen_C']:g}; majority class " in blocks["grid"]
    # The frozen-feature probes of the pair task, after the floors, from the probes' own files.
    probes = {name: json.loads((runs / f"probe-pairs-16-{name}" / "results.json").read_text())["layers"]
              for name in ("orchid-pretrained", "bert-random")}  # fmt: skip
    assert blocks["grid"].endswith(
        "on the test chapters: Orchid pretrained embeddings "
        f"{100 * probes['orchid-pretrained']['embeddings']['accuracy']:.1f}%, last layer "
        f"{100 * probes['orchid-pretrained']['last']['accuracy']:.1f}%; BERT random embeddings "
        f"{100 * probes['bert-random']['embeddings']['accuracy']:.1f}%, last layer "
        f"{100 * probes['bert-random']['last']['accuracy']:.1f}%."
    )
    assert "Frozen features, same novel, pairs of 2 × 8 tokens (`scripts/pair_probe.py`" in blocks["grid"]
    assert (tmp_path / "real_data_pretraining.png").stat().st_size > 0
    assert (tmp_path / "real_data_confusion.png").stat().st_size > 0


def write_splits(task: Path, text: str) -> Path:
    """A task folder whose train.csv, validation.csv and test.csv all hold ``text``."""
    task.mkdir(parents=True, exist_ok=True)
    for split in ("train", "validation", "test"):
        (task / f"{split}.csv").write_text(text)
    return task


def write_pair_files(task: Path, pairs: dict[str, list[tuple[str, str, str]]]) -> None:
    task.mkdir(parents=True, exist_ok=True)
    for split, rows in pairs.items():
        lines = ["sentence1,sentence2,label"] + [",".join(row) for row in rows]
        (task / f"{split}.csv").write_text("\n".join(lines) + "\n")


def test_token_frequency_features_of_passages_and_pairs(tmp_path):
    """The floor's features: each passage's token frequencies (summing to 100); for a pair, the tokens both
    passages contain and those only one contains; bad task files and settings name the problem."""
    from transformers import BertTokenizer

    from experiments.real_data.baselines import text_logistic_regression_baseline, token_frequency_features

    (tmp_path / "vocab.txt").write_text("\n".join(SPECIALS + ["emma", "anne", "walked", "home"]) + "\n")
    tokenizer = BertTokenizer.from_pretrained(tmp_path)
    emma, anne, walked = (tokenizer.convert_tokens_to_ids(t) for t in ("emma", "anne", "walked"))
    single = token_frequency_features([("emma walked",), ("anne anne",)], tokenizer).toarray()
    assert single.shape == (2, len(tokenizer)) and single.sum(1).tolist() == [100.0, 100.0]
    assert (single[0, emma], single[0, walked], single[1, anne]) == (50.0, 50.0, 100.0)
    pair = token_frequency_features([("emma walked", "emma emma"), ("anne", "walked")], tokenizer).toarray()
    shared, difference = pair[:, : len(tokenizer)], pair[:, len(tokenizer) :]
    assert shared[0, emma] == 1.0 and shared[0].sum() == 1.0 and shared[1].sum() == 0.0
    assert (difference[0, emma], difference[0, walked], difference[1, anne], difference[1, walked]) == (0, 1, 1, 1)
    assert difference[0].sum() == 1.0 and difference[1].sum() == 2.0
    task = write_splits(tmp_path / "task", "text,label\nemma walked,a\n")
    with pytest.raises(ValueError, match=r"train.csv lacks the column\(s\) \['sentence1', 'sentence2'\]"):
        text_logistic_regression_baseline(task, tmp_path, tmp_path / "out")
    with pytest.raises(ValueError, match=r"C must be one or more positive numbers, got \[0.0\]"):
        text_logistic_regression_baseline(task, tmp_path, tmp_path / "out", C=[0.0])


def test_pair_probe_reads_frozen_features(tmp_path):
    """The frozen-feature probe of the pair task: each passage's features are the mean of its real tokens, the same
    alone or padded in a batch, whatever the padded positions hold; a task whose "same" pairs are one passage twice
    is told apart perfectly (their difference is exactly zero); the random initialisation is drawn from the seed; bad
    input names the problem."""
    from transformers import BertTokenizer

    from experiments.real_data.probes import frozen_feature_pair_probe, load_frozen_model, passage_features
    from orchid_hf import OrchidConfig, OrchidForMaskedLM

    words = [f"w{k}" for k in range(40)]
    (tmp_path / "vocab.txt").write_text("\n".join(SPECIALS + words) + "\n")
    model_dir = tmp_path / "model"
    BertTokenizer.from_pretrained(tmp_path).save_pretrained(model_dir)
    config = OrchidConfig(vocab_size=len(SPECIALS) + len(words), hidden_size=16, num_hidden_layers=1,
                          intermediate_size=32, max_position_embeddings=16, filter_width=8)  # fmt: skip
    OrchidForMaskedLM(config).save_pretrained(model_dir)
    model, tokenizer = load_frozen_model(model_dir)
    texts = ["w1 w2 w3 w4 w5 w6 w7", "w8", "w9 w10 w11"]
    alone = [passage_features(model, tokenizer, [text]) for text in texts]
    batched = passage_features(model, tokenizer, texts, batch_size=3)
    for layer in ("embeddings", "last"):
        assert batched[layer].shape == (3, 16) and batched[layer].dtype.name == "float64"
        one_by_one = np.concatenate([features[layer] for features in alone])
        torch.testing.assert_close(torch.from_numpy(batched[layer]), torch.from_numpy(one_by_one), rtol=0, atol=1e-6)

    class NaNInPadding(torch.nn.Module):
        """The model, with NaN written into the padded positions of every hidden state it returns."""

        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, attention_mask, **inputs):
            outputs = self.inner(attention_mask=attention_mask, **inputs)
            pad = ~attention_mask.bool().unsqueeze(-1)
            outputs.hidden_states = tuple(h.masked_fill(pad, float("nan")) for h in outputs.hidden_states)
            return outputs

    poisoned = passage_features(NaNInPadding(), tokenizer, texts, batch_size=3)
    for layer in ("embeddings", "last"):
        assert (poisoned[layer] == batched[layer]).all()

    # Same pairs are one passage twice, different pairs two passages: exactly separable by the differences.
    rng = torch.Generator().manual_seed(0)
    passages = [" ".join(words[i] for i in torch.randint(0, 40, (6,), generator=rng).tolist()) for _ in range(90)]
    pairs = {split: [(passages[i], passages[i] if i % 2 else passages[i + 1], "same" if i % 2 else "different")
                     for i in range(start, start + 30)] for split, start in
             (("train", 0), ("validation", 30), ("test", 60))}  # fmt: skip
    write_pair_files(tmp_path / "pairs", pairs)
    results = frozen_feature_pair_probe(tmp_path / "pairs", model_dir, tmp_path / "out", init="random", seed=3)
    assert json.loads((tmp_path / "out" / "results.json").read_text()) == results
    assert (results["init"], results["seed"], results["model_type"]) == ("random", 3, "orchid")
    for layer in ("embeddings", "last"):
        probe = results["layers"][layer]
        assert probe["accuracy"] == 1.0 and probe["num_train"] == probe["num_eval"] == 30
        assert probe["validation_accuracy"][f"{probe['chosen_C']:g}"] == max(probe["validation_accuracy"].values())
    # The random initialisation is the seed's, not the checkpoint's weights.
    again, _ = load_frozen_model(model_dir, "random", seed=3)
    other, _ = load_frozen_model(model_dir, "random", seed=4)
    same = load_frozen_model(model_dir, "random", seed=3)[0]
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), same.state_dict().values()))
    assert not torch.equal(again.embeddings.word_embeddings.weight, other.embeddings.word_embeddings.weight)
    assert not torch.equal(again.embeddings.word_embeddings.weight, model.embeddings.word_embeddings.weight)

    with pytest.raises(ValueError, match=r"init must be one of \('pretrained', 'random'\), got 'scratch'"):
        load_frozen_model(model_dir, "scratch")
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        passage_features(model, tokenizer, texts, batch_size=0)
    single = write_splits(tmp_path / "single", "sentence,label\nw1 w2,a\n")
    with pytest.raises(ValueError, match=r"single/train.csv is not a pair task: it has one text column"):
        frozen_feature_pair_probe(single, model_dir, tmp_path / "out")
    with pytest.raises(ValueError, match=r"C must be one or more positive numbers, got \[\]"):
        frozen_feature_pair_probe(tmp_path / "pairs", model_dir, tmp_path / "out", C=[])


class RunsCodeWhenLoaded:
    """Unpickling this writes a file: what a crafted training_args.bin could do instead."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.write_text, (self.marker, "ran")


@pytest.mark.slow
def test_collecting_runs_never_unpickles_training_args(runs, tmp_path):
    crafted = tmp_path / "runs"
    shutil.copytree(runs / "pretrain-bert", crafted / "pretrain-bert")
    # A run made before the recipe wrote its learning rate to results.json: the report reads training_args.bin.
    results_file = crafted / "pretrain-bert" / "results.json"
    results = json.loads(results_file.read_text())
    assert results.pop("learning_rate") == 8e-4
    results_file.write_text(json.dumps(results))
    marker = tmp_path / "marker"
    arguments = crafted / "pretrain-bert" / "training_args.bin"
    torch.save({"payload": RunsCodeWhenLoaded(marker), "learning_rate": 3e-4}, arguments)
    assert collect_runs(crafted, tmp_path / "results") == ["pretrain-bert"]
    assert not marker.exists()
    assert json.loads((tmp_path / "results" / "pretrain-bert.json").read_text())["learning_rate"] == 3e-4
    torch.load(arguments, weights_only=False)  # the file does run code when loaded
    assert marker.read_text() == "ran"


def test_report_errors_name_what_is_missing(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="has no finished run"):
        collect_runs(tmp_path / "empty", tmp_path / "results")
    with pytest.raises(ValueError, match="holds no records"):
        render_report(tmp_path / "empty", tmp_path / "report.md")
    with pytest.raises(ValueError, match="no <!-- real-data:images --> ... <!-- /real-data:images --> block"):
        replace_block("text", "real-data", "images", "table")


def test_a_difference_is_given_with_its_welch_interval():
    # 65 / 80 / 62 against 57 / 51 / 62: means 69 and 56.67, variances 93 and 30.33, so a standard error of
    # sqrt(93 / 3 + 30.33 / 3) = 6.412 on Welch's 3.179 degrees of freedom (t = 3.083): 12.33 ± 19.77 holds zero.
    level = difference_interval([0.65, 0.80, 0.62], [0.57, 0.51, 0.62])
    assert level["difference"] == pytest.approx(0.12333, abs=1e-5)
    assert level["degrees_of_freedom"] == pytest.approx(3.1792, abs=1e-3)
    assert (level["low"], level["high"]) == (pytest.approx(-0.07436, abs=1e-4), pytest.approx(0.32103, abs=1e-4))
    assert comparison_words("Orchid", "BERT", level) == (
        "Orchid and BERT are level (Orchid − BERT: +12.3 points, 95% interval -7.4 to +32.1)")
    assert difference_cell([0.65, 0.80, 0.62], [0.57, 0.51, 0.62]) == "+12.3 (-7.4 to +32.1), level"
    # 90 / 91 / 92 against 80 / 81 / 82: variances 1 and 1, a standard error of sqrt(2 / 3) = 0.8165 on 4 degrees of
    # freedom (t = 2.776): 10 ± 2.267 excludes zero, either way round.
    ahead = difference_interval([0.90, 0.91, 0.92], [0.80, 0.81, 0.82])
    assert ahead["degrees_of_freedom"] == pytest.approx(4.0)
    assert (ahead["low"], ahead["high"]) == (pytest.approx(0.07733, abs=1e-4), pytest.approx(0.12267, abs=1e-4))
    assert comparison_words("Orchid", "BERT", ahead) == (
        "Orchid beats BERT by 10.0 points (95% interval of Orchid − BERT: +7.7 to +12.3)")
    behind = difference_interval([0.80, 0.81, 0.82], [0.90, 0.91, 0.92])
    assert comparison_words("Orchid", "BERT", behind).startswith("BERT beats Orchid by 10.0 points")
    assert difference_cell([0.80, 0.81, 0.82], [0.90, 0.91, 0.92]) == "-10.0 (-12.3 to -7.7), beaten"
    assert difference_cell([0.8], [0.9, 0.91]) == "–" and difference_cell([0.8, 0.9], None) == "–"
    # Two seeds, however far apart, or runs that do not vary (a constant prediction): no stated difference.
    assert difference_cell([0.90, 0.91], [0.80, 0.81]) == "+10.0, not sized"
    assert comparison_words("Orchid", "BERT", difference_interval([0.90, 0.91], [0.80, 0.81])) == (
        "no difference stated (Orchid − BERT: +10.0 points; fewer than 3 seeds)")
    constant = difference_interval([0.36, 0.36, 0.36], [0.28, 0.28, 0.28])
    assert comparison_outcome(constant) == "unsized" and comparison_words("Orchid", "BERT", constant).endswith(
        "no spread across seeds)")
    with pytest.raises(ValueError, match=r"first has 1 score\(s\) \[0.8\]; an interval needs at least two seeds"):
        difference_interval([0.8], [0.9, 0.91])
    with pytest.raises(ValueError, match="confidence must lie strictly between 0 and 1, got 1.5"):
        difference_interval([0.8, 0.9], [0.9, 0.91], confidence=1.5)


def test_a_pretraining_run_of_earlier_code_is_named_in_the_table():
    def record(arch, variant=None, learning_rate=8e-4, accuracy=0.2):
        return {"arch": arch, "variant": variant, "learning_rate": learning_rate, "num_parameters": 10e6,
                "num_parameters_without_embeddings": 2e6, "steps": 400, "train_seconds": 600.0,
                "eval": {"loss": 5.0, "masked_accuracy": accuracy}}  # fmt: skip

    records = [record("bert", "lr2e-4", 2e-4), record("orchid", "512-point-transforms", accuracy=0.243),
               record("bert"), record("orchid", accuracy=0.235)]  # fmt: skip
    models = [line.split(" | ")[0].lstrip("| ") for line in pretraining_table(records).splitlines()[2:]]
    # The recipe's runs first; a learning-rate variant is told apart by its peak lr, earlier code by its name.
    assert models == ["Orchid", "Orchid, 512-point transforms (earlier code)", "BERT", "BERT"]


def test_the_time_note_says_how_the_runs_shared_the_machine():
    assert time_note({"threads_per_run": 1, "runs_at_a_time": 2}).endswith("on one thread beside one other run.")
    assert time_note({"threads_per_run": 2, "runs_at_a_time": 1}).endswith("each run on 2 threads alone.")
    assert time_note({"threads_per_run": 1, "runs_at_a_time": 4}).endswith("on one thread beside 3 other runs.")


def fake_finetune_run(folder: Path, accuracy: float, learning_rate: float, seconds: float = 120.0,
                      epochs: float = 3.0, pooling: str = "mean") -> None:
    """A fine-tuning run's folder with the files the report reads, laid out as scripts/finetune_glue.py writes them."""
    folder.mkdir(parents=True)
    results = {
        "task": "own data", "recipe": "orchid-bert-classification", "model_type": "orchid",
        "initialized_from": "outputs/real_data/pretrain-orchid", "learning_rate": learning_rate,
        "hyperparameters": {"learning_rate": f"peak {learning_rate:g}", "epochs": epochs, "batch_size": 32,
                            "pooling": pooling, "max_seq_length": 128},
        "epochs_done": epochs, "metrics": {"validation": {"accuracy": accuracy, "loss": 1.0}},
    }  # fmt: skip
    (folder / "results.json").write_text(json.dumps(results))
    history = [{"loss": 1.2, "step": 10, "train_seconds": seconds / 2}, {"step": 20, "train_seconds": seconds}]
    (folder / "trainer_state.json").write_text(json.dumps({"log_history": history}))


GRID = ("1e-4", "3e-4", "1e-3")


@pytest.fixture
def grid_runs(tmp_path):
    """Run folders of the grid and pairs stages. The pretrained Orchid has both poolings: its best accuracy, 0.40, at
    3e-4 with either pooling and at 1e-3 with the mean (the lowest rate, then the first token, is chosen). BERT's
    points are named as grids of the recipe's pooling alone named them (no pooling: its results say first), best at
    1e-4. The pair task's scratch Orchid has its grid but no run at the chosen point yet, and the 2048-token task's
    scratch BERT its grid of 1 epoch a point."""
    runs = tmp_path / "runs"
    for pooling, accuracies in (("mean", (0.30, 0.40, 0.40)), ("first", (0.25, 0.40, 0.10))):
        for lr, accuracy in zip(GRID, accuracies):
            fake_finetune_run(runs / f"grid-attribution-128-orchid-pretrained-{pooling}-lr{lr}-s0", accuracy,
                              float(lr), pooling=pooling)  # fmt: skip
    for lr, accuracy in zip(GRID, (0.35, 0.33, 0.20)):
        fake_finetune_run(runs / f"grid-attribution-128-bert-pretrained-lr{lr}-s0", accuracy, float(lr),
                          pooling="first")  # fmt: skip
    for seed, accuracy in enumerate((0.41, 0.43, 0.45)):
        fake_finetune_run(runs / f"grid-attribution-128-orchid-pretrained-chosen-s{seed}", accuracy, 3e-4,
                          pooling="first")  # fmt: skip
        fake_finetune_run(runs / f"grid-attribution-128-bert-pretrained-chosen-s{seed}", 0.5, 1e-4, pooling="first")
    for lr, accuracy in zip(GRID, (0.6, 0.7, 0.5)):
        fake_finetune_run(runs / f"grid-pairs-128-orchid-scratch-mean-lr{lr}-s0", accuracy, float(lr))
        fake_finetune_run(runs / f"grid-attribution-2048-bert-scratch-first-lr{lr}-s0", accuracy, float(lr),
                          epochs=1.0, pooling="first")  # fmt: skip
    for seed in (0, 1):
        fake_finetune_run(runs / f"pairs-128-orchid-pretrained-s{seed}", 0.6 + seed / 10, 2e-4)
        fake_finetune_run(runs / f"pairs-128-bert-pretrained-s{seed}", 0.55, 2e-4)
    floor = {"accuracy": 0.9, "chosen_C": 1.0, "validation_accuracy": {"0.1": 0.8, "1": 0.88},
             "majority_class_accuracy": 0.228, "train_seconds": 5.0}  # fmt: skip
    (runs / "floor-attribution-128").mkdir()
    (runs / "floor-attribution-128" / "results.json").write_text(json.dumps(floor))
    return runs


def test_the_grid_choice_is_made_on_the_validation_chapters(grid_runs, capsys):
    both = ["first", "mean"]
    assert choose_grid_point(grid_runs, "grid-attribution-128-orchid-pretrained", list(GRID), both) == "first 3e-4"
    assert choose_grid_point(grid_runs, "grid-attribution-128-orchid-pretrained", list(GRID), ["mean"]) == "mean 3e-4"
    assert choose_grid_point(grid_runs, "grid-pairs-128-orchid-scratch", list(GRID), ["mean"]) == "mean 3e-4"
    assert best_pooled_point({("mean", 1e-3): 0.5, ("first", 1e-3): 0.5, ("mean", 3e-3): 0.5}) == ("first", 1e-3)
    # What scripts/real_data.sh reads into --pooling and --learning_rate: both as the grid writes them, alone.
    script = load_script("real_data_report")
    assert script.main(["--runs", str(grid_runs), "--choose", "grid-attribution-128-orchid-pretrained",
                        "--grid_learning_rates", *GRID]) == "first 3e-4"  # fmt: skip
    assert capsys.readouterr().out == "first 3e-4\n"
    missing = r"no finished run \(results.json\) in \[.*-orchid-pretrained-mean-lr2e-3-s0'\]"
    with pytest.raises(ValueError, match=missing):
        choose_grid_point(grid_runs, "grid-attribution-128-orchid-pretrained", ["1e-4", "2e-3"], ["mean"])
    # A point's name and its results must agree on the pooling.
    fake_finetune_run(grid_runs / "grid-attribution-128-bert-pretrained-mean-lr1e-4-s0", 0.9, 1e-4, pooling="first")
    with pytest.raises(ValueError, match="the name says mean pooling, but the run's results say first"):
        choose_grid_point(grid_runs, "grid-attribution-128-bert-pretrained", ["1e-4"], ["mean"])
    with pytest.raises(ValueError, match="the name says mean pooling, but the run's results say first"):
        collect_runs(grid_runs, grid_runs.parent / "results")
    with pytest.raises(SystemExit):
        script.main(["--choose", "grid-attribution-128-orchid-pretrained"])


def test_report_shows_the_grid_and_the_pairs(grid_runs, tmp_path):
    results = tmp_path / "results"
    collect_runs(grid_runs, results)
    records = load_records(results)
    assert len(records["grid"]) == 21 and len(records["pairs"]) == 4 and not records["attribution"]
    assert len(records["floor"]) == 1
    report, readme = skeleton(tmp_path / "real_data.md"), skeleton(tmp_path / "README.md", ["headline"])
    blocks = render_report(results, report, readme)
    assert "<!-- real-data:attribution -->\nold\n" in report.read_text()  # no records of its own: left as it was
    rows = {" | ".join(line.split(" | ")[:4]): line for line in blocks["grid"].splitlines()
            if line.startswith("| novel") or line.startswith("| same")}  # fmt: skip
    assert blocks["grid"].splitlines()[0] == (
        "| task | model | start | pooling | validation % at lr 0.0001 | validation % at lr 0.0003 | "
        "validation % at lr 0.001 | chosen | test % at the chosen point (mean; seeds) | "
        "test: − BERT, points (95% interval) |"
    )
    # Validation accuracy for every grid point, a row per pooling, the chosen one in bold; test accuracy on the
    # chosen pooling's row only, and its difference from BERT's: 43.0 - 50.0 = -7.0, BERT's seeds all 50.0, Orchid's
    # variance 4 (points²) over 3 seeds, so a standard error of 1.155 on 2 degrees of freedom (t = 4.303): -7.0 ± 4.97.
    assert rows["| novel attribution, 128 tokens | Orchid | pretrained | first"].endswith(
        "| 25.0 | **40.0** | 10.0 | first, lr 0.0003 | 43.0 (41.0 / 43.0 / 45.0) | -7.0 (-12.0 to -2.0), beaten |"
    )
    assert rows["| novel attribution, 128 tokens | Orchid | pretrained | mean"].endswith(
        "| 30.0 | 40.0 | 40.0 |  |  |  |"
    )
    grid_lines = blocks["grid"].splitlines()
    first = grid_lines.index(rows["| novel attribution, 128 tokens | Orchid | pretrained | first"])
    assert grid_lines[first + 1] == rows["| novel attribution, 128 tokens | Orchid | pretrained | mean"]
    assert rows["| novel attribution, 128 tokens | BERT | pretrained | first"].endswith(
        "| **35.0** | 33.0 | 20.0 | first, lr 0.0001 (the grid's lowest) | 50.0 (50.0 / 50.0 / 50.0) | – |"
    )
    assert rows["| same novel, pairs of 2 × 64 tokens | Orchid | scratch | mean"].endswith(
        "| 60.0 | **70.0** | 50.0 | mean, lr 0.0003 | – | – |"
    )
    assert "Each grid point (a pooling and a learning rate): 3 epochs (1 for novel attribution, 2048 tokens)," in (
        blocks["grid"])
    assert "time" not in blocks["grid"]  # the grid's runs may share a machine many at a time: no speed comparison
    # Two seeds each: 65.0 - 55.0 = +10.0, too few seeds to state a difference.
    row = "| 2 × 64 tokens | Orchid | pretrained | 65.0 (60.0 / 70.0) | +10.0, not sized | 2.0 min |"
    assert row in blocks["pairs"]
    # BERT's grid has one pooling: no comparison in the headline, whose rows compare models that chose both.
    assert "| novel attribution, 128 tokens, pretrained," not in blocks["headline"]
    assert blocks["grid"].endswith("C among 0.1, 1 chosen on the validation chapters, trained on the training "
                                   "chapters), on the test chapters: novel attribution, 128 tokens 90.0% (C 1; "
                                   "majority class 22.8%).")  # fmt: skip
    assert ("| same novel, pairs of 2 × 64 tokens, pretrained | 65.0% | BERT 55.0% | 2 seeds, no difference stated "
            "(Orchid − BERT: +10.0 points; fewer than 3 seeds);") in blocks["headline"]  # fmt: skip
    assert f"<!-- real-data:headline -->\n{blocks['headline']}\n" in readme.read_text()

    # With BERT's other pooling run too, the headline compares the two, both poolings chosen.
    for lr, accuracy in zip(GRID, (0.1, 0.2, 0.3)):
        fake_finetune_run(grid_runs / f"grid-attribution-128-bert-pretrained-mean-lr{lr}-s0", accuracy, float(lr))
    collect_runs(grid_runs, results)
    assert ("| novel attribution, 128 tokens, pretrained, pooling and lr chosen on validation chapters | 43.0% | BERT "
            "50.0% | 3 seeds, BERT beats Orchid by 7.0 points (95% interval of Orchid − BERT: -12.0 to -2.0); chosen: "
            "first, lr 0.0003 vs first, lr 0.0001 (the grid's lowest); bag of words 90.0% |"
            ) in render_report(results, report)["headline"]  # fmt: skip

    # Runs at another point than the grid's choice are refused, not shown as the chosen point's.
    fake_finetune_run(grid_runs / "grid-attribution-128-orchid-pretrained-chosen-s3", 0.9, 3e-4)
    collect_runs(grid_runs, results)
    with pytest.raises(ValueError, match=r"used \(pooling, learning rate\) \[\('mean', 0.0003\)\], but the grid's best "
                                         r"on the validation chapters is \('first', 0.0003\)"):  # fmt: skip
        render_report(results, report)


def test_bert_pools_the_mean_of_its_real_tokens_as_orchid_does():
    """BERT's classifier with ``classifier_pooling="mean"`` feeds its own pooler (dense + tanh) the mean of the real
    tokens' last hidden states, whatever the padded positions hold; with ``"first"`` it is BERT's own classifier."""
    from transformers import BertForSequenceClassification

    from experiments.real_data.pooling import PoolingBertConfig, PoolingBertForSequenceClassification

    sizes = dict(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                 num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # fmt: skip
    torch.manual_seed(0)
    mean = PoolingBertForSequenceClassification(PoolingBertConfig(classifier_pooling="mean", **sizes)).eval()
    ids = torch.randint(5, 40, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 5:] = 0
    logits = mean(input_ids=ids, attention_mask=mask).logits
    hidden = mean.bert(input_ids=ids, attention_mask=mask).last_hidden_state
    pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    expected = mean.classifier(mean.bert.pooler.activation(mean.bert.pooler.dense(pooled)))
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-6)
    garbage = ids.clone()
    garbage[1, 5:] = torch.randint(5, 40, (4,))
    torch.testing.assert_close(mean(input_ids=garbage, attention_mask=mask).logits, logits, rtol=0, atol=1e-6)
    # The mask given by position works as by keyword (the hook reads either).
    torch.testing.assert_close(mean(ids, mask).logits, logits, rtol=0, atol=1e-6)

    first = PoolingBertForSequenceClassification(PoolingBertConfig(classifier_pooling="first", **sizes)).eval()
    plain = BertForSequenceClassification(first.config).eval()
    plain.load_state_dict(first.state_dict())
    torch.testing.assert_close(first(input_ids=ids, attention_mask=mask).logits,
                               plain(input_ids=ids, attention_mask=mask).logits, rtol=0, atol=0)  # fmt: skip
    with pytest.raises(ValueError, match=r"classifier_pooling must be one of \('first', 'mean'\), got 'max'"):
        PoolingBertForSequenceClassification(PoolingBertConfig(classifier_pooling="max", **sizes))


def test_a_grid_record_keeps_the_last_logged_training_loss(tmp_path):
    """The loss of the last logging step, not Trainer's closing average over the whole run (``train_loss``); None for
    a run that logged no loss."""
    run = tmp_path / "grid-pairs-128-bert-scratch-mean-lr1e-4-s0"
    fake_finetune_run(run, 0.5, 1e-4)
    history = [{"loss": 0.9, "step": 10, "train_seconds": 5.0}, {"loss": 0.69, "step": 20, "train_seconds": 10.0},
               {"train_loss": 0.8, "step": 20, "train_seconds": 10.0}]  # fmt: skip
    (run / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    assert grid_record(run, GRID_RUN.match(run.name))["final_train_loss"] == 0.69
    (run / "trainer_state.json").write_text(json.dumps({"log_history": history[2:]}))
    assert grid_record(run, GRID_RUN.match(run.name))["final_train_loss"] is None


def test_the_grid_script_fine_tunes_bert_with_mean_pooling(tmp_path):
    """scripts/real_data_finetune.py, as the grid runs it: --pooling mean for a new BERT model trains a classifier that
    pools the mean, and its results and saved config say so (model type still bert)."""
    tokenizer = tmp_path / "tokenizer"
    word_tokenizer(tokenizer)
    rows = [f"{' '.join(WORDS[i % 5:i % 5 + 4])},{'ab'[i % 2]}" for i in range(8)]
    task = write_splits(tmp_path / "task", "sentence,label\n" + "\n".join(rows) + "\n")
    out = tmp_path / "grid-attribution-16-bert-scratch-mean-lr1e-3-s0"
    command = [sys.executable, str(ROOT / "scripts" / "real_data_finetune.py"), "--train_file",
               str(task / "train.csv"), "--validation_file", str(task / "validation.csv"), "--max_seq_length", "16",
               "--max_steps", "2", "--pooling", "mean", "--learning_rate", "1e-3", "--model_type", "bert",
               "--config_overrides", BERT, "--tokenizer_name", str(tokenizer), "--threads", "1", *QUIET,
               "--output_dir", str(out)]  # fmt: skip
    subprocess.run(command, env={**os.environ, "HF_HUB_OFFLINE": "1"}, check=True, capture_output=True, text=True)
    results = json.loads((out / "results.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert results["hyperparameters"]["pooling"] == "mean" and results["model_type"] == "bert"
    assert (config["model_type"], config["classifier_pooling"]) == ("bert", "mean")
    record = grid_record(out, GRID_RUN.match(out.name))
    assert (record["arch"], record["hyperparameters"]["pooling"], record["learning_rate"]) == ("bert", "mean", 1e-3)


def test_the_job_lists_name_runs_as_the_report_reads_them(tmp_path):
    """scripts/real_data.sh's commands for the fine-tuning stages: run names the report collects, the files each run
    trains and is scored on (nothing chosen on test chapters), and the grid's seeds after its points."""
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PY": "python"}

    def jobs(*stages, **narrowed):
        command = ["bash", str(ROOT / "scripts" / "real_data.sh"), "jobs", *stages]
        return subprocess.run(command, env={**env, **narrowed}, capture_output=True, text=True,
                              check=True).stdout.splitlines()  # fmt: skip

    def run_name(line):
        return re.search(r"--output_dir (\S+)", line)[1].rsplit("/", 1)[1]

    data = f"{tmp_path}/out/austen"
    grid = jobs("grid")
    # Task by task, in `run`'s order: a task's 40 grid points (2 starts x 2 architectures x 2 poolings x 5 learning
    # rates), then its 12 seeds.
    tasks = [grid[start:start + 52] for start in range(0, len(grid), 52)]
    assert [GRID_RUN.match(run_name(chunk[0])).group("task", "length") for chunk in tasks] == [
        ("attribution", "128"), ("attribution", "512"), ("pairs", "128"), ("attribution", "2048")]  # fmt: skip
    points = [line for chunk in tasks for line in chunk[:40]]
    seeds = [line for chunk in tasks for line in chunk[40:]]
    for chunk in tasks:
        assert len({(match["task"], match["length"]) for match in map(GRID_RUN.match, map(run_name, chunk))}) == 1
    for line in points:
        match = GRID_RUN.match(run_name(line))
        assert match and match["lr"] in ("1e-4", "3e-4", "1e-3", "3e-3", "1e-2") and match["seed"] == "0"
        task = f"{match['task']}-{match['length']}"
        assert line.startswith("python scripts/real_data_finetune.py ")  # BERT pools the mean there too
        assert f"--train_file {data}/{task}/train.csv --validation_file {data}/{task}/validation.csv " in line
        # 3 epochs; 1 for passages longer than 512 tokens, whose epochs cost as much as a long-context pretraining run
        epochs = 3 if int(match["length"]) <= 512 else 1
        assert f"--max_seq_length {match['length']} " in line and f"--num_train_epochs {epochs} " in line
        assert f"--pooling {match['pooling']} --learning_rate {match['lr']} " in line
        # 32 passages a step, or 16,384 tokens where 32 passages would hold more; passages longer than the pretrain
        # stage's 512 positions start from the long-context stage's model of their length (or its configuration).
        length, arch = int(match["length"]), match["arch"]
        assert f"--per_device_train_batch_size {min(32, 16384 // length)} " in line
        if match["init"] == "pretrained":
            model = f"pretrain-{arch}" if length <= 512 else f"ctx-{arch}-{length}"
            assert f"--model_name_or_path {tmp_path}/out/{model} " in line
        else:
            overrides = re.search(r"--config_overrides (\S+)", line)[1]
            assert overrides.startswith("hidden_size=256," if length <= 512 else "hidden_size=128,")
            assert f"max_position_embeddings={max(length, 512)}" in overrides.split(",")
            assert ("num_attention_heads=4" in overrides) == (arch == "bert")
    # Both poolings for both architectures, at every learning rate.
    assert {GRID_RUN.match(run_name(line)).group("arch", "pooling") for line in points} == {
        ("orchid", "first"), ("orchid", "mean"), ("bert", "first"), ("bert", "mean")}  # fmt: skip
    for line in seeds:
        match = GRID_RUN.match(run_name(line))
        assert match and match["chosen"] and match["seed"] in ("0", "1", "2")
        task = f"{match['task']}-{match['length']}"
        group = f"grid-{task}-{match['arch']}-{match['init']}"
        assert line.startswith(f"point=$(python scripts/real_data_report.py --runs {tmp_path}/out --choose {group} "
                               "--grid_poolings first mean --grid_learning_rates 1e-4 3e-4 1e-3 3e-3 1e-2) && "
                               "python scripts/real_data_finetune.py ")  # fmt: skip
        assert f"--train_file {data}/{task}/train.csv --validation_file {data}/{task}/test.csv " in line
        epochs = 3 if int(match["length"]) <= 512 else 1
        assert f"--num_train_epochs {epochs} --pooling ${{point% *}} --learning_rate ${{point#* }} " in line
    assert len({run_name(line) for line in grid}) == 208
    # Every run computes in float32, also on a GPU (no bfloat16, no TensorFloat-32).
    assert all("--bf16 False --tf32 False " in line for line in grid)
    # GRID_ARCHS and GRID_TASKS narrow the grid: one architecture's runs of one task, its points before its seeds.
    narrowed = jobs("grid", GRID_ARCHS="bert", GRID_TASKS="attribution-512")
    assert narrowed == [line for line in grid if "-attribution-512-bert-" in line]
    assert len(narrowed) == 26
    # GRID_INITS too: the runs from scratch of both architectures, which need no pretrained model.
    scratch = jobs("grid", GRID_INITS="scratch", GRID_TASKS="pairs-128")
    assert scratch == [line for line in grid if "-pairs-128-" in line and "-scratch-" in line]
    assert len(scratch) == 26 and not any("pretrain-" in line for line in scratch)
    # GRID_LEARNING_RATES extends it past the default rates, for the points and for the seeds' choice alike.
    extended = jobs("grid", GRID_ARCHS="orchid", GRID_INITS="scratch", GRID_TASKS="attribution-2048",
                    GRID_LEARNING_RATES="3e-5 1e-4")  # fmt: skip
    assert [GRID_RUN.match(run_name(line)).group("pooling", "lr") for line in extended[:4]] == [
        ("first", "3e-5"), ("first", "1e-4"), ("mean", "3e-5"), ("mean", "1e-4")]
    assert "--learning_rate 3e-5 " in extended[0] and len(extended) == 7
    assert all("--grid_learning_rates 3e-5 1e-4) && " in line for line in extended[4:])

    for stage, pattern, count in (("attribution", ATTRIBUTION_RUN, 16), ("pairs", PAIRS_RUN, 8)):
        lines = jobs(stage)
        assert len(lines) == count
        for line in lines:
            match = pattern.match(run_name(line))
            task = f"{stage}-{match['length']}"
            assert f"--train_file {data}/{task}/trainval.csv --validation_file {data}/{task}/test.csv " in line
            assert "--num_train_epochs 1 --learning_rate 2e-4 " in line
            # The attribution stage compares first-token pooling; the pairs take the recipe's.
            assert ("--pooling first" in line) == (stage == "attribution" and match["arch"] == "orchid")
    # The frozen-feature probes: both architectures' pretrained models and their configurations at random.
    probes = jobs("pair-probe")
    assert [PROBE_RUN.match(run_name(line)).group("arch", "init") for line in probes] == [
        ("orchid", "pretrained"), ("orchid", "random"), ("bert", "pretrained"), ("bert", "random")]  # fmt: skip
    for line in probes:
        arch, init = PROBE_RUN.match(run_name(line)).group("arch", "init")
        assert f"--task_dir {data}/pairs-128 --model_name_or_path {tmp_path}/out/pretrain-{arch} --init {init} " in line
    failed = subprocess.run(["bash", str(ROOT / "scripts" / "real_data.sh"), "jobs", "pairs", "grids"], env=env,
                            capture_output=True, text=True)  # fmt: skip
    assert failed.returncode == 2 and "unknown stage 'grids'" in failed.stderr and not failed.stdout


def test_run_skips_finished_runs_and_goes_task_by_task(tmp_path):
    """`run` with `echo` as the Python: every job writes its command to its log, except a run whose folder holds
    results.json (finished), which is skipped; with one job at a time, each grid task's points come before its seeds
    and before the next task."""
    out = tmp_path / "out"
    finished = out / "grid-attribution-128-orchid-pretrained-mean-lr3e-4-s0"
    finished.mkdir(parents=True)
    (finished / "results.json").write_text("{}")
    env = {**os.environ, "OUT": str(out), "PY": "echo", "JOBS": "1"}
    subprocess.run(["bash", str(ROOT / "scripts" / "real_data.sh"), "run", "grid"], env=env, check=True)
    logs = sorted(out.glob("*.log"), key=lambda path: path.stat().st_mtime_ns)
    names = [path.stem for path in logs]
    assert len(names) == 207 and finished.name not in names and not (out / f"{finished.name}.log").exists()
    assert all(path.read_text().startswith("scripts/real_data_finetune.py ") for path in logs)
    assert f"--output_dir {out}/grid-attribution-2048-bert-scratch-chosen-s2" in logs[-1].read_text()
    order = [(GRID_RUN.match(name)["task"] + GRID_RUN.match(name)["length"], bool(GRID_RUN.match(name)["chosen"]))
             for name in names]  # fmt: skip
    tasks = ["attribution128", "attribution512", "pairs128", "attribution2048"]
    assert order == sorted(order, key=lambda key: (tasks.index(key[0]), key[1]))


# ---------------------------------------------------------------------------------------------
# The long-context comparison (experiments/real_data/long_context.py, scripts/long_context_eval.py, the report's
# long-context blocks, scripts/real_data.sh's long-context stage)
# ---------------------------------------------------------------------------------------------

WORDS = ["anne", "walked", "home", "captain", "wentworth", "came", "to", "bath", "and", "the", "sea"]


def word_tokenizer(folder: Path):
    """A lower-cased WordPiece tokenizer of SPECIALS and WORDS, saved in ``folder`` (a tokenizer folder)."""
    from transformers import BertTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(SPECIALS + WORDS) + "\n")
    tokenizer = BertTokenizer.from_pretrained(folder, do_lower_case=True)
    tokenizer.save_pretrained(folder)
    return tokenizer


def word_text(paragraphs: int, seed: int = 0, words: list[str] = WORDS) -> str:
    """Paragraphs of ``words`` drawn at random, one a line."""
    rng = np.random.default_rng(seed)
    return "\n".join(" ".join(rng.choice(words, size=rng.integers(5, 30))) for _ in range(paragraphs)) + "\n"


def test_the_held_out_stream_is_masked_once_and_categorised(tmp_path):
    """The stream joins documents with [SEP] as the recipe packs them; masks follow BERT's rule, never touch special
    tokens and depend on the seed alone; a masked token is local, far or absent by where else its token stands
    unmasked, and rare by its training count."""
    from experiments.real_data.long_context import context_categories, mask_stream, seen_in_block, token_stream

    tokenizer = word_tokenizer(tmp_path / "tok")
    ids = {word: tokenizer.convert_tokens_to_ids(word) for word in WORDS}
    sep = tokenizer.sep_token_id
    assert token_stream(tokenizer, ["Anne walked", "  ", "home"]).tolist() == [ids["anne"], ids["walked"], sep,
                                                                               ids["home"], sep]  # fmt: skip
    with pytest.raises(ValueError, match="every document is blank"):
        token_stream(tokenizer, ["", " "])

    stream = token_stream(tokenizer, word_text(2000).splitlines())
    special = tokenizer.all_special_ids
    inputs, labels = mask_stream(stream, special, len(tokenizer), tokenizer.mask_token_id, 0.3, seed=0)
    selected = labels != -100
    assert abs(selected[stream != sep].mean() - 0.3) < 0.02 and not selected[stream == sep].any()
    assert (labels[selected] == stream[selected]).all() and (inputs[~selected] == stream[~selected]).all()
    masked = (inputs[selected] == tokenizer.mask_token_id).mean()
    kept = (inputs[selected] == stream[selected]).mean()
    assert abs(masked - 0.8) < 0.03 and 0.07 < kept < 0.15  # 10% kept, plus random draws that hit the token
    again, _ = mask_stream(stream, special, len(tokenizer), tokenizer.mask_token_id, 0.3, seed=0)
    other, _ = mask_stream(stream, special, len(tokenizer), tokenizer.mask_token_id, 0.3, seed=1)
    assert (again == inputs).all() and not (other == inputs).all()

    # Blocks of 5 (3 tokens of text) and 8 (6): a b e | a e e. Masked: b (1), the second a (3), the first e of the
    # second short block (4).
    a, b, e = ids["anne"], ids["walked"], ids["home"]
    stream = np.array([a, b, e, a, e, e])
    labels = np.full(6, -100)
    labels[[1, 3, 4]] = stream[[1, 3, 4]]
    assert np.flatnonzero(seen_in_block(stream, labels, 5)).tolist() == [4]
    assert np.flatnonzero(seen_in_block(stream, labels, 8)).tolist() == [3, 4]
    counts = np.full(len(tokenizer), 10)
    counts[a] = 0
    categories = context_categories(stream, labels, 5, 8, counts, rare_below=5)
    assert {name: np.flatnonzero(where).tolist() for name, where in categories.items()} == {
        "all": [1, 3, 4], "local": [4], "far": [3], "absent": [1], "rare": [3], "far, rare": [3]}  # fmt: skip
    with pytest.raises(ValueError, match="short=8, long=5"):
        context_categories(stream, labels, 8, 5, counts, 5)


class EchoMaskedLM(torch.nn.Module):
    """Logits that predict each position's input token, after checking each block as predict builds it: [CLS]
    first, [SEP] last, padding after it and masked out."""

    def __init__(self, vocab_size: int, cls: int, sep: int, pad: int, length: int):
        super().__init__()
        self.vocab_size, self.cls, self.sep, self.pad, self.length = vocab_size, cls, sep, pad, length
        self.rows = []

    def forward(self, input_ids, attention_mask):
        assert input_ids.shape[1] <= self.length
        for ids, mask in zip(input_ids, attention_mask):
            real = int(mask.sum())
            assert mask[:real].all() and not mask[real:].any() and (ids[real:] == self.pad).all()
            assert ids[0] == self.cls and ids[real - 1] == self.sep
            self.rows.append(real)
        return type("Output", (), {"logits": 5.0 * torch.nn.functional.one_hot(input_ids, self.vocab_size).float()})


def test_every_context_length_scores_the_same_masked_tokens(tmp_path):
    """predict cuts the masked stream into blocks of each length (the last one shorter, padded) and puts each
    prediction back at its stream position: a model that echoes its input predicts the masked input exactly there,
    at every length and batch size."""
    from experiments.real_data.long_context import mask_stream, predict, token_stream

    tokenizer = word_tokenizer(tmp_path / "tok")
    stream = token_stream(tokenizer, word_text(40).splitlines())
    inputs, labels = mask_stream(stream, tokenizer.all_special_ids, len(tokenizer), tokenizer.mask_token_id, 0.3, 0)
    special = {"cls": tokenizer.cls_token_id, "sep": tokenizer.sep_token_id, "pad": tokenizer.pad_token_id}
    selected = labels != -100
    for length, tokens_per_batch in ((8, 32), (8, 8), (64, 256), (64, 64), (len(stream) + 2, 4096)):
        model = EchoMaskedLM(len(tokenizer), special["cls"], special["sep"], special["pad"], length)
        predictions, losses = predict(model, inputs, labels, length, special, tokens_per_batch)
        assert (predictions[selected] == inputs[selected]).all() and (predictions[~selected] == -1).all()
        assert np.isfinite(losses[selected]).all() and np.isnan(losses[~selected]).all()
        assert sum(model.rows) == len(stream) + 2 * len(model.rows)  # every token read once, in blocks of length
        assert model.rows[:-1] == [length] * (len(model.rows) - 1)
    with pytest.raises(ValueError, match="length must be >= 3"):
        predict(model, inputs, labels, 2, special)


def save_masked_lms(folder: Path, tokenizer) -> dict[str, Path]:
    """A tiny Orchid of 256 positions (transform lengths 128 and 256) and a tiny BERT of 256, each saved with the
    tokenizer."""
    from transformers import BertConfig, BertForMaskedLM

    from orchid_hf import OrchidConfig, OrchidForMaskedLM

    common = dict(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, intermediate_size=32,
                  max_position_embeddings=256, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    models = {"orchid": OrchidForMaskedLM(OrchidConfig(**common, filter_width=16)),
              "bert": BertForMaskedLM(BertConfig(**common, num_attention_heads=2))}  # fmt: skip
    folders = {}
    for name, model in models.items():
        folders[name] = folder / name
        model.save_pretrained(folders[name])
        tokenizer.save_pretrained(folders[name])
    return folders


def test_long_context_evaluation_reads_each_model_at_the_lengths_it_can(tmp_path):
    """scripts/long_context_eval.py: every length scores the same masked tokens; BERT is not read beyond its
    positions, Orchid is read there extended without training, and with one transform length it reads shorter blocks
    at its longest transform length."""
    from experiments.real_data.long_context import load_masked_lm

    tokenizer = word_tokenizer(tmp_path / "tok")
    folders = save_masked_lms(tmp_path, tokenizer)
    (tmp_path / "validation.txt").write_text(word_text(60, seed=1))
    others = [word for word in WORDS if word != "wentworth"]
    (tmp_path / "train.txt").write_text(word_text(20, seed=2, words=others) + "wentworth " * 3 + "\n")
    script = load_script("long_context_eval")
    results = {}
    for name, folder in folders.items():
        results[name] = script.main(["--model_name_or_path", str(folder), "--validation_file",
                                     str(tmp_path / "validation.txt"), "--train_file", str(tmp_path / "train.txt"),
                                     "--lengths", "512", "64", "256", "--one_transform_length", "--threads", "1",
                                     "--output_dir", str(tmp_path / f"eval-{name}")])  # fmt: skip
        assert json.loads((tmp_path / f"eval-{name}" / "results.json").read_text()) == json.loads(
            json.dumps(results[name]))
    orchid, bert = results["orchid"], results["bert"]
    assert orchid["tokens"] == bert["tokens"] == 510 * (orchid["tokens"] // 510) > 0
    assert orchid["category_blocks"] == [64, 512]
    settings = [(e["length"], e["one_transform_length"], e["how"]) for e in orchid["evaluations"]]
    assert settings == [(64, False, "as trained"), (256, False, "as trained"),
                        (512, False, "extended from 256 to 512 positions without training"),
                        (64, True, "as trained, one transform length (256)")]  # fmt: skip
    assert [(e["length"], e["how"]) for e in bert["evaluations"]] == [
        (64, "as trained"), (256, "as trained"), (512, "its positions stop at 256")]  # fmt: skip
    assert "categories" not in bert["evaluations"][2]
    scored = [e["categories"] for r in (orchid, bert) for e in r["evaluations"] if "categories" in e]
    assert len(scored) == 6
    for categories in scored:
        assert {name: c["count"] for name, c in categories.items()} == {
            name: c["count"] for name, c in scored[0].items()}  # fmt: skip
        assert categories["far"]["count"] + categories["local"]["count"] + categories["absent"]["count"] == (
            categories["all"]["count"])
        assert 0.0 <= categories["all"]["accuracy"] <= 1.0 and categories["all"]["loss"] > 0
    # "wentworth" is the only word the training text holds fewer than 5 times.
    assert 0 < scored[0]["rare"]["count"] < scored[0]["all"]["count"] / 5
    # One transform length is a different reading of the same model at 64 tokens (256-point transforms, not 128).
    default, one = (next(e for e in orchid["evaluations"] if e["length"] == 64 and e["one_transform_length"] == flag)
                    for flag in (False, True))  # fmt: skip
    assert default["categories"]["all"]["loss"] != one["categories"]["all"]["loss"]
    for one_length, lengths in ((True, (256,)), (False, (128, 256))):
        model, _ = load_masked_lm(folders["orchid"], 64, one_transform_length=one_length)
        assert tuple(model.orchid.encoder.layer[0].mixer.transform_lengths) == lengths
    # Extended without training: the checkpoint's positions repeated, not drawn afresh.
    model, _ = load_masked_lm(folders["orchid"], 512)
    saved, _ = load_masked_lm(folders["orchid"], 256)
    table, old = model.orchid.embeddings.position_embeddings.weight, saved.orchid.embeddings.position_embeddings.weight
    assert table.shape == (512, 16) and torch.equal(table[:256], old) and torch.equal(table[256:], old)
    with pytest.raises(ValueError, match="one_transform_length is a setting of Orchid models"):
        load_masked_lm(folders["bert"], 64, one_transform_length=True)


def gnu_time_report(path: Path, megabytes: int) -> None:
    """GNU time's report on a Python process that holds ``megabytes`` MB, as the long-context stage writes one."""
    command = [sys.executable, "-c", f"block = bytearray({megabytes} * 2**20)"]
    subprocess.run(["/usr/bin/time", "-v", "-o", str(path), *command], check=True)


@pytest.mark.slow
def test_long_context_report_comes_from_the_runs(tmp_path):
    """Pretraining runs named as the long-context stage names them (from scratch at two lengths, a model to extend and
    its extension, by the recipe's own path) and their evaluations: the tables add an extended model's steps, tokens
    and time to its start's, take peak memory and commands from GNU time's reports, and show each evaluation's
    numbers; the plot is drawn and only the generated blocks change."""
    from experiments.real_data.report import CONTEXT_EVAL_RUN, check_same_masks

    word_tokenizer(tmp_path / "tok")
    (tmp_path / "train.txt").write_text(word_text(80, seed=3))
    (tmp_path / "validation.txt").write_text(word_text(30, seed=4))
    out = tmp_path / "runs"
    common = ["--train_file", str(tmp_path / "train.txt"), "--validation_file", str(tmp_path / "validation.txt"),
              "--eval_strategy", "steps", "--eval_steps", "2", "--logging_steps", "1", "--eval_before_training",
              "--max_eval_samples", "4", "--cache_dir", str(tmp_path / "cache"), *QUIET]  # fmt: skip
    tiny = "hidden_size=16,num_hidden_layers=1,intermediate_size=32,filter_width=16"
    runs = {  # name: (length, blocks a step, steps, model arguments)
        "ctx-orchid-16": (16, 4, 4, ["--config_overrides", f"{tiny},max_position_embeddings=16"]),
        "ctx-orchid-32": (32, 2, 4, ["--config_overrides", f"{tiny},max_position_embeddings=32"]),
        "ctx-bert-16": (16, 4, 4, ["--model_type", "bert", "--config_overrides",
                                   f"{tiny.rsplit(',', 1)[0]},num_attention_heads=2,max_position_embeddings=16"]),
        "ctx-orchid-16-base": (16, 4, 2, ["--config_overrides", f"{tiny},max_position_embeddings=16"]),
        "ctx-orchid-32-extended": (32, 2, 2, ["--model_name_or_path", str(out / "ctx-orchid-16-base")]),
    }  # fmt: skip
    for megabytes, (name, (length, blocks, steps, model)) in enumerate(runs.items(), start=20):
        tokenizer_args = [] if "--model_name_or_path" in model else ["--tokenizer_name", str(tmp_path / "tok")]
        pretrain([*common, "--max_seq_length", str(length), "--per_device_train_batch_size", str(blocks),
                  "--max_steps", str(steps), *model, *tokenizer_args, "--output_dir", str(out / name)])  # fmt: skip
        assert CONTEXT_RUN.match(name)
        if name != "ctx-orchid-16":  # a run without a report of GNU time shows no peak memory
            gnu_time_report(out / f"{name}.time", megabytes)
        evaluation = out / f"ctx-eval-{name.removeprefix('ctx-')}"
        assert CONTEXT_EVAL_RUN.match(evaluation.name)
        load_script("long_context_eval").main(["--model_name_or_path", str(out / name), "--validation_file",
                                               str(tmp_path / "validation.txt"), "--train_file",
                                               str(tmp_path / "train.txt"), "--lengths", "16", "32",
                                               "--one_transform_length", "--output_dir", str(evaluation)])  # fmt: skip
    extended = json.loads((out / "ctx-orchid-32-extended" / "results.json").read_text())
    assert extended["initialized_from"] == str(out / "ctx-orchid-16-base") and extended["max_seq_length"] == 32
    assert json.loads((out / "ctx-orchid-16" / "results.json").read_text())["initialized_from"] == "new orchid model"

    results = tmp_path / "results"
    names = collect_runs(out, results)
    assert sorted(names) == sorted([*runs, *(f"ctx-eval-{name.removeprefix('ctx-')}" for name in runs)])
    records = load_records(results)
    assert len(records["context"]) == 5 and len(records["context-eval"]) == 5
    record = json.loads((results / "ctx-orchid-32-extended.json").read_text())
    assert (record["length"], record["start"], record["initialized_from"]) == (32, "extended", "ctx-orchid-16-base")
    assert (record["steps"], record["blocks_per_step"], record["tokens"]) == (2, 2, 2 * 2 * 32)
    own = time_report(out / "ctx-orchid-32-extended.time")
    assert record["peak_memory_mib"] == own["peak_memory_mib"] > 24  # the process held 24 MB at least
    assert record["command"] == own["command"] and "bytearray(24 * 2**20)" in record["command"]
    assert json.loads((results / "ctx-orchid-16.json").read_text())["peak_memory_mib"] is None
    base = json.loads((results / "ctx-orchid-16-base.json").read_text())

    report = tmp_path / "long_context.md"
    report = skeleton(tmp_path / "long_context.md", ["context-training", "context-accuracy", "context-commands"])
    main_report = skeleton(tmp_path / "real_data.md", ["headline", "machine"])
    blocks = load_script("real_data_report").main(["--results", str(results), "--report", str(main_report),
                                                   "--readme", "", "--context_report", str(report)])  # fmt: skip
    text = report.read_text()
    assert text.startswith("# Report\n\nWritten by hand.") and text.endswith("The end.\n") and "\nold\n" not in text
    for name in ("context-training", "context-accuracy", "context-commands"):
        assert f"<!-- real-data:{name} -->\n{blocks[name]}\n<!-- /real-data:{name} -->" in text
    # The extended model: its start's steps, tokens and time added, the higher peak memory.
    row = next(line for line in blocks["context-training"].splitlines() if line.startswith("| Orchid 32, extended |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    seconds = (base["train_seconds"], record["train_seconds"])
    memory = max(base["peak_memory_mib"], record["peak_memory_mib"])
    assert cells[2:7] == ["2 at 16 + 2 at 32", "4 × 16 / 2 × 32", f"{(2 * 4 * 16 + 2 * 2 * 32) / 1e6:.2f}M",
                          f"{sum(seconds) / 60:.1f} min ({seconds[0] / 60:.1f} + {seconds[1] / 60:.1f})",
                          f"{memory:,.0f} MiB"]  # fmt: skip
    assert cells[7] == f"{record['eval']['loss']:.3f} / {100 * record['eval']['masked_accuracy']:.1f}%"
    assert "| Orchid 16 | 16 | 4 | 4 × 16 |" in blocks["context-training"] and "| – |" in blocks["context-training"]
    # The accuracy tables: each cell from the evaluation's file; BERT not read beyond its positions; Orchid's untrained
    # extension marked.
    evaluation = {name: json.loads((out / f"ctx-eval-{name}" / "results.json").read_text())["evaluations"]
                  for name in ("orchid-32", "orchid-16", "bert-16")}  # fmt: skip
    tables = {}
    lines = blocks["context-accuracy"].splitlines()
    for i, title in enumerate(lines):
        if title.startswith(("Every masked token", "Far tokens", "Far and rare tokens")):
            table = []
            for row in lines[i + 2 :]:  # the title, a blank line, then the table
                if not row.startswith("|"):
                    break
                table.append(row)
            tables[title.split(":")[0]] = {row.split(" | ")[0].strip("| "): row.strip(" |").split(" | ")[1:]
                                           for row in table[2:]}  # fmt: skip

    def cell(category, length_index, name):
        value = evaluation[name][length_index]["categories"][category]
        if value["accuracy"] is None:  # no masked token of the category (no rare words in this tiny corpus)
            return "–"
        return f"{100 * value['accuracy']:.1f}{{}} ({value['loss']:.2f})"

    assert tables["Far tokens"]["Orchid 32"] == ["32", cell("far", 0, "orchid-32").format(""),
                                                 cell("far", 1, "orchid-32").format("")]  # fmt: skip
    assert evaluation["orchid-16"][1]["how"] == "extended from 16 to 32 positions without training"
    assert tables["Every masked token"]["Orchid 16"] == ["16", cell("all", 0, "orchid-16").format(""),
                                                         cell("all", 1, "orchid-16").format("*")]  # fmt: skip
    assert tables["Far and rare tokens"]["BERT 16"] == ["16", cell("far, rare", 0, "bert-16").format(""), "–"]
    # The README's line: Orchid and BERT from scratch at the longest length both trained at, each read at it.
    line = next(row for row in blocks["headline"].splitlines() if row.startswith("| Austen MLM at 16 tokens"))
    accuracy = [evaluation[name][0]["categories"]["all"]["accuracy"] for name in ("orchid-16", "bert-16")]
    assert f"| {100 * accuracy[0]:.1f}% | BERT {100 * accuracy[1]:.1f}% |" in line
    one_length = next(e for e in evaluation["orchid-32"] if e["one_transform_length"])
    assert one_length["length"] == 16
    assert tables["Every masked token"]["Orchid 32, one transform length"][1] == (
        f"{100 * one_length['categories']['all']['accuracy']:.1f} ({one_length['categories']['all']['loss']:.2f})")
    assert f"Masked tokens per category: all (every masked token): {one_length['categories']['all']['count']:,};" in (
        blocks["context-accuracy"])
    assert blocks["context-commands"].count("bytearray") == 4
    assert (tmp_path / "long_context.png").stat().st_size > 0
    # Evaluations that scored different tokens are refused, not put side by side.
    changed = records["context-eval"]
    changed[0]["evaluations"][0]["categories"]["far"]["count"] += 1
    with pytest.raises(ValueError, match="score different masked tokens"):
        check_same_masks(changed)
    (tmp_path / "not-time.txt").write_text("elapsed: 3\n")
    with pytest.raises(ValueError, match="is not a report of GNU time -v"):
        time_report(tmp_path / "not-time.txt")


def test_the_long_context_jobs_train_on_equal_tokens(tmp_path):
    """scripts/real_data.sh's long-context stage: every run from scratch trains the same steps on the same tokens a
    step at its length; the extensions start from the shortest length's model and finish the same steps; `run` goes
    phase by phase (with `echo` as the Python, under GNU time), and every model is evaluated at every length."""
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PY": "echo", "JOBS": "2", "CONTEXT_STEPS": "40", "CONTEXT_BASE_STEPS": "30",
           "CONTEXT_BERT_LENGTHS": "128 512"}  # fmt: skip
    lines = subprocess.run(["bash", str(ROOT / "scripts" / "real_data.sh"), "jobs", "long-context"], env=env,
                           capture_output=True, text=True, check=True).stdout.splitlines()  # fmt: skip
    name = {line: re.search(r"--output_dir \S+/(\S+)", line)[1] for line in lines}
    training = [line for line in lines if "pretrain_mlm.py" in line]
    assert [name[line] for line in training] == [
        "ctx-orchid-128", "ctx-bert-128", "ctx-orchid-512", "ctx-bert-512", "ctx-orchid-2048", "ctx-orchid-128-base",
        "ctx-orchid-512-extended", "ctx-orchid-2048-extended"]  # fmt: skip
    for line in training:
        match = CONTEXT_RUN.match(name[line])
        length = int(re.search(r"--max_seq_length (\d+) ", line)[1])
        blocks = int(re.search(r"--per_device_train_batch_size (\d+) ", line)[1])
        steps = int(re.search(r"--max_steps (\d+) ", line)[1])
        assert length == int(match["length"]) and blocks * length == 4096
        assert steps == {None: 40, "base": 30, "extended": 10}[match["start"]]
        assert line.startswith(f"/usr/bin/time -v -o {out}/{name[line]}.time echo scripts/pretrain_mlm.py ")
        assert f"--train_file {out}/austen/mlm/train.txt --validation_file {out}/austen/mlm/validation.txt " in line
        assert f"--max_eval_samples {32768 // length} " in line and "--seed 0 " in line
        if match["start"] == "extended":
            assert f"--model_name_or_path {out}/ctx-orchid-128-base " in line and "--config_overrides" not in line
        else:
            overrides = re.search(r"--config_overrides (\S+)", line)[1]
            assert overrides.startswith("hidden_size=128,num_hidden_layers=4,intermediate_size=512,")
            assert overrides.endswith(f"max_position_embeddings={length}")
            assert ("num_attention_heads=4" in overrides) == (match["arch"] == "bert")
    evaluations = [line for line in lines if "long_context_eval.py" in line]
    assert [name[line] for line in evaluations] == [f"ctx-eval-{name[line].removeprefix('ctx-')}" for line in training]
    assert all("--lengths 128 512 2048 " in line for line in evaluations)

    subprocess.run(["bash", str(ROOT / "scripts" / "real_data.sh"), "run", "long-context"], env=env, check=True)
    logs = sorted(out.glob("*.log"), key=lambda path: path.stat().st_mtime_ns)
    runs = [CONTEXT_RUN.match(p.stem) for p in logs]  # None for an evaluation's log
    phases = [2 if run is None else 0 if run["start"] in (None, "base") else 1 for run in runs]
    assert len(logs) == 16 and phases == sorted(phases)
    report = time_report(out / "ctx-orchid-2048-extended.time")
    assert report["command"].startswith("echo scripts/pretrain_mlm.py ") and report["peak_memory_mib"] > 0


def test_logistic_regression_floor_on_idx_files(tmp_path):
    """The floor of the Fashion-MNIST comparison: the same IDX loading and confusion matrix as the recipe."""
    root = write_idx_folder(tmp_path / "idx", train=60, test=30)
    out = tmp_path / "logreg"
    results = load_script("image_baseline").main(
        ["--train_dir", str(root), "--output_dir", str(out), "--class_names", "left", "middle", "right",
         "--max_iter", "50"]
    )  # fmt: skip
    matrix = np.array(results["confusion_matrix"])
    assert matrix.shape == (3, 3) and matrix.sum() == 30 and results["num_train"] == 60
    assert results["accuracy"] == np.trace(matrix) / 30 == 1.0  # the bands are linearly separable
    assert results["num_parameters"] == 3 * 28 * 28 + 3
    assert json.loads((out / "results.json").read_text())["accuracy"] == results["accuracy"]
    assert np.array_equal(np.loadtxt(out / "confusion_matrix.csv", delimiter=",", dtype=int), matrix)
    assert (out / "confusion_matrix.png").stat().st_size > 0
    with pytest.raises(ValueError, match="class_names gives 2 names, but the labels have 3 classes"):
        logistic_regression_baseline(root, out, class_names=["a", "b"])
    (tmp_path / "train-only").mkdir()
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte"):
        (tmp_path / "train-only" / name).write_bytes((root / name).read_bytes())
    with pytest.raises(ValueError, match="no t10k-images/t10k-labels IDX files"):
        logistic_regression_baseline(tmp_path / "train-only", out)


def _context_run_file(folder: Path, name: str, seed: int, accuracy: float, loss: float) -> None:
    """A run file in the layout of docs/results/long_context_causes/: every category at ``accuracy``, 0.1 points more
    reading 512 tokens and 0.2 more reading 2,048."""
    evaluations = [{"length": length, "one_transform_length": False, "categories": {
        category: {"accuracy": accuracy + step / 1000, "loss": loss} for category in ("all", "far")}}
        for step, length in enumerate((128, 512, 2048))]  # fmt: skip
    evaluations.append({"length": 128, "one_transform_length": True, "categories": {
        "all": {"accuracy": 0.99, "loss": 0.0}, "far": {"accuracy": 0.99, "loss": 0.0}}})  # fmt: skip
    run = {"run": name, "commands": [f"python scripts/pretrain_mlm.py --seed {seed} --max_steps 4", "python eval"],
           "recipe": {"eval_loss": loss}, "evaluation": {"evaluations": evaluations}}
    (folder / f"{name}.json").write_text(json.dumps(run))


def test_long_context_seeds_come_from_the_run_files_and_differences_need_three_seeds(tmp_path, capsys):
    """scripts/long_context_seeds.py: each setting's seeds from SETTING.json and SETTING-sN.json (not from another
    setting whose name begins the same), the mean with each seed's value, each block read at its own transform length,
    and a difference with its interval only from three seeds a side."""
    for seed, accuracy in enumerate((0.20, 0.22, 0.21)):
        _context_run_file(tmp_path, "long" + (f"-s{seed}" if seed else ""), seed, accuracy, 5.0 + seed / 10)
    for seed, accuracy in enumerate((0.10, 0.11, 0.12)):
        _context_run_file(tmp_path, "short" + (f"-s{seed}" if seed else ""), seed, accuracy, 6.0)
    _context_run_file(tmp_path, "short-std03", 0, 0.5, 4.0)  # another setting
    script = load_script("long_context_seeds")
    tables = script.main(["--runs", str(tmp_path), "--setting", "long=Long", "--setting", "short=Short",
                          "--compare", "long", "short"])  # fmt: skip
    assert tables == capsys.readouterr().out
    rows = [line for line in tables.splitlines() if line.startswith("| ")]
    assert rows[1] == ("| Long | 0, 1, 2 | 21.0 (20.0 / 22.0 / 21.0) | 21.1 (20.1 / 22.1 / 21.1) | "
                       "21.2 (20.2 / 22.2 / 21.2) | 21.0 (20.0 / 22.0 / 21.0) | 21.1 (20.1 / 22.1 / 21.1) | "
                       "21.2 (20.2 / 22.2 / 21.2) | 5.10 (5.00 / 5.10 / 5.20) |")
    assert rows[2].startswith("| Short | 0, 1, 2 | 11.0 (10.0 / 11.0 / 12.0) |")
    # Long − Short: +10.0 points with 3 seeds a side, an interval above zero (Welch's t, 95%).
    assert rows[4].startswith("| Long − Short | +10.0 (") and rows[4].count("beats") == 6

    (tmp_path / "long-s2.json").unlink()
    two = script.main(["--runs", str(tmp_path), "--setting", "long", "--setting", "short", "--compare", "long",
                       "short", "--output", str(tmp_path / "t.md")])  # fmt: skip
    assert (tmp_path / "t.md").read_text() == two and "+10.0, not sized" in two  # two seeds: no difference stated

    _context_run_file(tmp_path, "short-s5", 4, 0.1, 6.0)  # its name says seed 5, its command seed 4
    with pytest.raises(ValueError, match=r"short-s5.json: its recipe ran with --seed 4"):
        script.main(["--runs", str(tmp_path), "--setting", "short"])
    with pytest.raises(ValueError, match="no run files of 'none'"):
        script.main(["--runs", str(tmp_path), "--setting", "none"])
    with pytest.raises(SystemExit):
        script.main(["--runs", str(tmp_path), "--setting", "long", "--compare", "long", "short"])
