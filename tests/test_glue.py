"""GLUE recipe: task table, Table C.2 hyperparameters, offline metrics, Table C.1 layout, local data and a
tiny end-to-end suite (MNLI, then RTE from the MNLI checkpoint, and the STS-B regression)."""

import json
import time

import numpy as np
import pytest
from datasets import Dataset
from scipy.stats import pearsonr

from orchid_hf import OrchidConfig, OrchidForMaskedLM
from orchid_hf.glue import (
    ALL_TASKS,
    GLUE_TASKS,
    HYPERPARAMETERS,
    GlueArguments,
    encode_labels,
    glue_average,
    glue_metrics,
    load_glue_task,
    main,
    results_markdown,
    task_score,
)
from orchid_hf.synthetic_text import make_corpus
from orchid_hf.tokenization import train_wordpiece_tokenizer
from orchid_hf.training import HubUnavailableError

pytestmark = pytest.mark.usefixtures("one_thread")


# Table C.1 of the paper, Orchid-BERT-base and -large.
PAPER_BASE = {
    "mnli": [79.53, 80.52], "rte": 70.4, "qnli": 86.16, "qqp": 87.2, "sst2": 92.05, "stsb": 86.63, "cola": 51.76,
    "mrpc": 90.53,
}  # fmt: skip
PAPER_LARGE = {
    "mnli": [81.82, 82.74], "rte": 76.32, "qnli": 87.02, "qqp": 88.18, "sst2": 92.8, "stsb": 88.29, "cola": 56.97,
    "mrpc": 89.24,
}  # fmt: skip


def test_metrics_by_hand():
    predictions, labels = [1, 1, 0, 0], [1, 0, 0, 0]
    # TP=1, FP=1, TN=2, FN=0.
    assert glue_metrics("mrpc", predictions, labels) == pytest.approx({"accuracy": 0.75, "f1": 2 / 3})
    assert glue_metrics("qqp", predictions, labels) == pytest.approx({"accuracy": 0.75, "f1": 2 / 3})
    mcc = (1 * 2 - 1 * 0) / np.sqrt((1 + 1) * (1 + 0) * (2 + 1) * (2 + 0))
    assert glue_metrics("cola", predictions, labels) == pytest.approx({"matthews_correlation": mcc})
    assert glue_metrics("mnli", [0, 1, 2, 2], [0, 1, 2, 0]) == pytest.approx({"accuracy": 0.75})
    scores, targets = np.array([1.0, 2.0, 3.0, 4.0]), np.array([2.0, 4.0, 6.0, 8.5])
    stsb = glue_metrics("stsb", scores, targets)
    assert stsb["spearmanr"] == pytest.approx(1.0)
    assert stsb["pearson"] == pytest.approx(np.corrcoef(scores, targets)[0, 1]) and stsb["pearson"] < 1.0
    assert stsb["pearson"] == pytest.approx(pearsonr(scores, targets)[0])
    with pytest.raises(ValueError, match="3 predictions for 4 labels"):
        glue_metrics("sst2", [0, 1, 1], [0, 1, 1, 0])
    with pytest.raises(ValueError, match="unknown GLUE task 'squad'"):
        glue_metrics("squad", [0], [0])


def test_table_c1_average_and_layout():
    # The paper's averages: 80.6 (base) and 82.65 (large), MNLI as the mean of m and mm, WNLI left out.
    assert glue_average(PAPER_BASE) == pytest.approx(80.59, abs=0.01)
    assert glue_average(PAPER_LARGE) == pytest.approx(82.64, abs=0.01)
    assert glue_average({**PAPER_BASE, "wnli": 0.0}) == glue_average(PAPER_BASE)
    assert glue_average({k: v for k, v in PAPER_BASE.items() if k != "cola"}) is None
    table = results_markdown(PAPER_BASE, "Orchid-BERT-base")
    header, rule, row = table.strip().splitlines()
    assert header == "| Model | MNLI (m / mm) | RTE | QNLI | QQP | SST2 | STS-B | CoLA | MRPC | Average |"
    assert row == "| Orchid-BERT-base | 79.53 / 80.52 | 70.40 | 86.16 | 87.20 | 92.05 | 86.63 | 51.76 | 90.53 | 80.59 |"
    partial = results_markdown({"sst2": 91.0}, "m").strip().splitlines()[-1]
    assert partial == "| m | – | – | – | – | 91.00 | – | – | – | – |"
    metrics = {"validation_matched": {"accuracy": 0.8}, "validation_mismatched": {"accuracy": 0.81}}
    assert task_score("mnli", metrics) == pytest.approx([80.0, 81.0])
    assert task_score("stsb", {"validation": {"pearson": 0.5, "spearmanr": 0.9}}) == pytest.approx(90.0)


def test_table_c2_hyperparameters():
    for size in ("base", "large"):
        assert set(HYPERPARAMETERS[size]) == set(ALL_TASKS) == set(GLUE_TASKS)
    base, large = HYPERPARAMETERS["base"], HYPERPARAMETERS["large"]
    expected_base = {  # optimizer, lr, weight decay, epochs
        "mnli": ("d-adamw", 5e-5, 5e-6, 3), "rte": ("adamw", 5e-5, 0.01, 6), "qnli": ("adamw", 5e-5, 1e-5, 10),
        "qqp": ("adamw", 3e-5, 0.01, 10), "sst2": ("d-adamw", 3e-5, 3e-6, 3), "stsb": ("adamw", 7e-5, 0.01, 10),
        "cola": ("d-adamw", 5e-5, 5e-6, 10), "mrpc": ("adamw", 5e-5, 0.01, 10),
    }  # fmt: skip
    expected_large = {
        "mnli": ("d-adamw", 5e-5, 5e-6, 3), "rte": ("d-adamw", 1e-5, 1e-6, 3), "qnli": ("d-adamw", 5e-5, 1e-5, 10),
        "qqp": ("d-adamw", 3e-5, 3e-6, 5), "sst2": ("d-adamw", 3e-5, 3e-6, 3), "stsb": ("d-adamw", 7e-5, 3e-6, 10),
        "cola": ("adamw", 5e-5, 5e-6, 10), "mrpc": ("d-adamw", 8e-5, 8e-6, 10),
    }  # fmt: skip
    for table, expected in ((base, expected_base), (large, expected_large)):
        for task, values in expected.items():
            hp = table[task]
            assert (hp.optimizer, hp.learning_rate, hp.weight_decay, hp.epochs) == values, task
    # Mean pooling for QNLI base only; RTE, MRPC and STS-B may start from MNLI.
    assert [t for t, hp in base.items() if hp.pooling == "mean"] == ["qnli"]
    assert all(hp.pooling == "first" for hp in large.values())
    assert {t for t, hp in base.items() if hp.from_mnli} == {"rte", "mrpc", "stsb"}
    # Command-line overrides, and --from_mnli switches the MNLI start on.
    args = GlueArguments(model_name_or_path="m", learning_rate=1e-4, pooling="mean")
    assert args.hyperparameters("sst2").learning_rate == 1e-4 and args.hyperparameters("sst2").pooling == "mean"
    assert not args.hyperparameters("rte").from_mnli
    assert GlueArguments(model_name_or_path="m", from_mnli=True).hyperparameters("rte").from_mnli
    assert GlueArguments(model_name_or_path="m", all_tasks=True).tasks() == list(ALL_TASKS)
    assert GlueArguments(model_name_or_path="m", task=["RTE", "mnli"]).tasks() == ["mnli", "rte"]
    with pytest.raises(ValueError, match="pass --task"):
        GlueArguments(model_name_or_path="m").tasks()


def _write_tsv(path, header, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(["\t".join(header), *("\t".join(map(str, row)) for row in rows)]) + "\n")


WORDS = "the cat dog sat ran on a mat big small red blue is not".split()


def _pair_rows(rng, count, label_values):
    rows = []
    for index in range(count):
        a = " ".join(rng.choice(WORDS, 6))
        b = " ".join(rng.choice(WORDS, 5))
        rows.append((a, b, label_values[index % len(label_values)], index))
    return rows


@pytest.fixture(scope="module")
def glue_setup(tmp_path_factory):
    """Local files for MNLI (string labels), RTE and STS-B, and a tiny pretrained model with its tokenizer."""
    root = tmp_path_factory.mktemp("glue")
    rng = np.random.default_rng(0)
    header = ("premise", "hypothesis", "label", "idx")
    nli_labels = ["entailment", "neutral", "contradiction"]
    _write_tsv(root / "data/mnli/train.tsv", header, _pair_rows(rng, 24, nli_labels))
    _write_tsv(root / "data/mnli/validation_matched.tsv", header, _pair_rows(rng, 9, nli_labels))
    _write_tsv(root / "data/mnli/validation_mismatched.tsv", header, _pair_rows(rng, 9, nli_labels))
    pair = ("sentence1", "sentence2", "label", "idx")
    _write_tsv(root / "data/rte/train.tsv", pair, _pair_rows(rng, 16, [0, 1]))
    _write_tsv(root / "data/rte/validation.tsv", pair, _pair_rows(rng, 8, [0, 1]))
    _write_tsv(root / "data/stsb/train.tsv", pair, _pair_rows(rng, 16, [0.0, 1.5, 3.2, 5.0]))
    _write_tsv(root / "data/stsb/validation.tsv", pair, _pair_rows(rng, 8, [0.5, 2.0, 4.0, 4.5]))

    tokenizer = train_wordpiece_tokenizer([*make_corpus(50), " ".join(WORDS)], vocab_size=200)
    config = OrchidConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, intermediate_size=64,
        max_position_embeddings=32, filter_width=16, mlp_num_blocks=2,
    )  # fmt: skip
    model_dir = root / "pretrained"
    OrchidForMaskedLM(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return root


def test_local_glue_files(glue_setup, tmp_path):
    data = load_glue_task("mnli", data_dir=glue_setup / "data", cache_dir=str(tmp_path))
    assert set(data) == {"train", "validation_matched", "validation_mismatched"}
    encoded = encode_labels("mnli", data["train"])
    assert encoded["label"][:3] == [0, 1, 2]  # entailment, neutral, contradiction
    stsb = encode_labels("stsb", load_glue_task("stsb", data_dir=glue_setup / "data", cache_dir=str(tmp_path))["train"])
    assert stsb["label"][:4] == pytest.approx([0.0, 1.5, 3.2, 5.0])

    _write_tsv(tmp_path / "bad/sst2/train.tsv", ("text", "label"), [("a b", 0)])
    _write_tsv(tmp_path / "bad/sst2/validation.tsv", ("sentence", "label"), [("a b", 0)])
    with pytest.raises(ValueError, match=r"sst2 train data lacks the columns \['sentence'\]"):
        load_glue_task("sst2", data_dir=tmp_path / "bad", cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="no train file for cola"):
        load_glue_task("cola", data_dir=tmp_path / "bad", cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"rte label 5 is outside 0\.\.1"):
        encode_labels("rte", Dataset.from_dict({"sentence1": ["a"], "sentence2": ["b"], "label": [5]}))


def test_offline_hub_dataset_fails_fast(glue_setup):
    start = time.perf_counter()
    with pytest.raises(HubUnavailableError, match="--data_dir DIR"):
        main(["--model_name_or_path", str(glue_setup / "pretrained"), "--task", "sst2", "--use_cpu"])
    assert time.perf_counter() - start < 5
    with pytest.raises(HubUnavailableError, match="not in the Hugging Face cache"):
        main(["--model_name_or_path", "some-user/not-a-local-model", "--task", "sst2", "--data_dir", "x"])
    with pytest.raises(ValueError, match="--push_to_hub needs --hub_model_id"):
        main(["--model_name_or_path", str(glue_setup / "pretrained"), "--task", "sst2", "--push_to_hub", "True"])


def test_tiny_suite_with_mnli_start(glue_setup, tmp_path):
    out = tmp_path / "glue"
    common = [
        "--model_name_or_path", str(glue_setup / "pretrained"), "--data_dir", str(glue_setup / "data"),
        "--output_dir", str(out), "--max_seq_length", "32", "--max_steps", "2", "--use_cpu",
        "--cache_dir", str(tmp_path / "cache"), "--disable_tqdm", "True", "--per_device_train_batch_size", "8",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="starts from the MNLI checkpoint"):
        main([*common, "--task", "rte", "--from_mnli"])
    summary = main([*common, "--task", "stsb", "rte", "mnli", "--from_mnli"])

    assert list(summary["tasks"]) == ["mnli", "rte", "stsb"]  # MNLI first, as RTE and STS-B start from it
    mnli, rte, stsb = (summary["tasks"][t] for t in ("mnli", "rte", "stsb"))
    assert set(mnli["metrics"]) == {"validation_matched", "validation_mismatched"}
    assert len(mnli["score"]) == 2 and all(0.0 <= s <= 100.0 for s in mnli["score"])
    assert rte["initialized_from"] == str(out / "mnli") and stsb["initialized_from"] == str(out / "mnli")
    assert mnli["initialized_from"] == str(glue_setup / "pretrained")
    assert set(stsb["metrics"]["validation"]) == {"pearson", "spearmanr", "loss"}
    assert rte["hyperparameters"]["optimizer"] == "adamw" and rte["hyperparameters"]["learning_rate"] == 5e-5

    saved = json.loads((out / "glue_results.json").read_text())
    assert set(saved["tasks"]) == {"mnli", "rte", "stsb"} and saved["glue_average"] is None
    table = (out / "glue_results.md").read_text()
    assert "| Model | MNLI (m / mm) |" in table and f"{stsb['score']:.2f}" in table
    for task in ("mnli", "rte", "stsb"):
        folder = out / task
        assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
        assert "pipeline_tag: text-classification" in (folder / "README.md").read_text()
    config = json.loads((out / "stsb" / "config.json").read_text())
    assert config["num_labels"] == 1 if "num_labels" in config else len(config["id2label"]) == 1
    assert config["problem_type"] == "regression"
