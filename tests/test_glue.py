"""GLUE recipe: Table C.1 layout, local data, offline failures, a tiny suite (MNLI, then RTE from the MNLI model, and
the STS-B regression) with GLUE submission files, own CSV data with a BERT baseline, and a JSON config file."""

import json
import time

import numpy as np
import pytest
from datasets import Dataset

from orchid_hf import OrchidConfig, OrchidForMaskedLM
from orchid_hf.demo_data import make_corpus
from orchid_hf.glue import main
from orchid_hf.glue_data import encode_labels, load_glue_task
from orchid_hf.glue_tasks import glue_average, results_markdown, task_score
from orchid_hf.hub import HubUnavailableError
from orchid_hf.tokenization import train_wordpiece_tokenizer

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
    """Local files for MNLI (string labels) with its test sets and AX, RTE and STS-B, and a tiny pretrained model
    with its tokenizer."""
    root = tmp_path_factory.mktemp("glue")
    rng = np.random.default_rng(0)
    header = ("premise", "hypothesis", "label", "idx")
    nli_labels = ["entailment", "neutral", "contradiction"]
    _write_tsv(root / "data/mnli/train.tsv", header, _pair_rows(rng, 24, nli_labels))
    _write_tsv(root / "data/mnli/validation_matched.tsv", header, _pair_rows(rng, 9, nli_labels))
    _write_tsv(root / "data/mnli/validation_mismatched.tsv", header, _pair_rows(rng, 9, nli_labels))
    # GLUE's test files have an index column and no labels.
    test_rows = [(i + 100, a, b) for a, b, _, i in _pair_rows(rng, 5, [0])]
    _write_tsv(root / "data/mnli/test_matched.tsv", ("idx", "premise", "hypothesis"), test_rows)
    _write_tsv(root / "data/mnli/test_mismatched.tsv", ("idx", "premise", "hypothesis"), test_rows[:4])
    _write_tsv(root / "data/ax/test.tsv", ("idx", "premise", "hypothesis"), test_rows[:3])
    pair = ("sentence1", "sentence2", "label", "idx")
    _write_tsv(root / "data/rte/train.tsv", pair, _pair_rows(rng, 16, [0, 1]))
    _write_tsv(root / "data/rte/validation.tsv", pair, _pair_rows(rng, 8, [0, 1]))
    _write_tsv(root / "data/rte/test.tsv", ("idx", "sentence1", "sentence2"), test_rows)
    _write_tsv(root / "data/stsb/train.tsv", pair, _pair_rows(rng, 16, [0.0, 1.5, 3.2, 5.0]))
    _write_tsv(root / "data/stsb/validation.tsv", pair, _pair_rows(rng, 8, [0.5, 2.0, 4.0, 4.5]))
    _write_tsv(root / "data/stsb/test.tsv", ("idx", "sentence1", "sentence2"), test_rows)

    tokenizer = train_wordpiece_tokenizer([*make_corpus(50), " ".join(WORDS)], vocab_size=200)
    tokenizer.save_pretrained(root / "tokenizer")
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
    test = load_glue_task("mnli", splits=("test_matched",), data_dir=glue_setup / "data", cache_dir=str(tmp_path))
    assert test["test_matched"]["idx"][:2] == [100, 101] and "label" not in test["test_matched"].column_names

    _write_tsv(tmp_path / "bad/sst2/train.tsv", ("text", "label"), [("a b", 0)])
    _write_tsv(tmp_path / "bad/sst2/validation.tsv", ("sentence", "label"), [("a b", 0)])
    with pytest.raises(ValueError, match=r"sst2 train data lacks the columns \['sentence'\]"):
        load_glue_task("sst2", data_dir=tmp_path / "bad", cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="no train file for cola"):
        load_glue_task("cola", data_dir=tmp_path / "bad", cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"rte label 5 is outside 0\.\.1"):
        encode_labels("rte", Dataset.from_dict({"sentence1": ["a"], "sentence2": ["b"], "label": [5]}))


def test_offline_hub_names_fail_fast(glue_setup):
    start = time.perf_counter()
    with pytest.raises(HubUnavailableError, match="--data_dir DIR"):
        main(["--model_name_or_path", str(glue_setup / "pretrained"), "--task_name", "sst2", "--use_cpu"])
    with pytest.raises(HubUnavailableError, match="not in the Hugging Face cache"):
        main(["--model_name_or_path", "some-user/not-a-local-model", "--task_name", "sst2", "--data_dir", "x"])
    with pytest.raises(HubUnavailableError, match="--push_to_hub"):
        main(["--model_name_or_path", str(glue_setup / "pretrained"), "--task_name", "sst2", "--push_to_hub"])
    assert time.perf_counter() - start < 5
    with pytest.raises(ValueError, match="unknown GLUE task 'squad'"):
        main(["--model_name_or_path", str(glue_setup / "pretrained"), "--task_name", "squad"])


@pytest.mark.slow
def test_tiny_suite_with_mnli_start_and_submission_files(glue_setup, tmp_path):
    out = tmp_path / "glue"
    common = [
        "--model_name_or_path", str(glue_setup / "pretrained"), "--data_dir", str(glue_setup / "data"),
        "--output_dir", str(out), "--max_seq_length", "32", "--max_steps", "2", "--use_cpu",
        "--cache_dir", str(tmp_path / "cache"), "--disable_tqdm", "True", "--per_device_train_batch_size", "8",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="starts from the MNLI model"):
        main([*common, "--task_name", "rte", "--from_mnli"])
    summary = main(
        [*common, "--task_name", "stsb", "rte", "mnli", "--from_mnli", "--do_train", "--do_eval", "--do_predict"]
    )

    assert list(summary["tasks"]) == ["mnli", "rte", "stsb"]  # MNLI first, as RTE and STS-B start from it
    mnli, rte, stsb = (summary["tasks"][t] for t in ("mnli", "rte", "stsb"))
    assert set(mnli["metrics"]) == {"validation_matched", "validation_mismatched"}
    assert len(mnli["score"]) == 2 and all(0.0 <= s <= 100.0 for s in mnli["score"])
    assert rte["initialized_from"] == str(out / "mnli") and stsb["initialized_from"] == str(out / "mnli")
    assert mnli["initialized_from"] == str(glue_setup / "pretrained")
    assert set(stsb["metrics"]["validation"]) == {"pearson", "spearmanr", "combined_score", "loss"}
    assert rte["hyperparameters"]["weight decay"] == "0.01"  # AdamW in Table C.2
    assert mnli["hyperparameters"]["weight decay"] == "5e-06 decoupled (torch AdamW weight_decay=0.1)"

    # run_glue's files: all_results.json, with MNLI's mismatched metrics suffixed _mm.
    mnli_results = json.loads((out / "mnli" / "all_results.json").read_text())
    assert {"eval_accuracy", "eval_accuracy_mm", "train_loss", "train_samples"} <= set(mnli_results)
    saved = json.loads((out / "glue_results.json").read_text())
    assert set(saved["tasks"]) == {"mnli", "rte", "stsb"} and saved["glue_average"] is None
    table = (out / "glue_results.md").read_text()
    assert "| Model | MNLI (m / mm) |" in table and f"{stsb['score']:.2f}" in table
    for task in ("mnli", "rte", "stsb"):
        folder = out / task
        assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
        assert "pipeline_tag: text-classification" in (folder / "README.md").read_text()
    config = json.loads((out / "stsb" / "config.json").read_text())
    assert config["problem_type"] == "regression" and len(config.get("id2label", {"0": ""})) == 1

    # GLUE's submission files: index and prediction, label names for the NLI tasks, 0-5 scores for STS-B.
    submission = out / "submission"
    assert sorted(p.name for p in submission.iterdir()) == ["AX.tsv", "MNLI-m.tsv", "MNLI-mm.tsv", "RTE.tsv",
                                                             "STS-B.tsv"]  # fmt: skip
    lines = (submission / "MNLI-m.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 6
    assert [line.split("\t")[0] for line in lines[1:]] == ["100", "101", "102", "103", "104"]
    assert {line.split("\t")[1] for line in lines[1:]} <= {"entailment", "neutral", "contradiction"}
    assert len((submission / "MNLI-mm.tsv").read_text().splitlines()) == 5
    assert len((submission / "AX.tsv").read_text().splitlines()) == 4
    assert {line.split("\t")[1] for line in (submission / "RTE.tsv").read_text().splitlines()[1:]} <= {
        "entailment", "not_entailment",
    }  # fmt: skip
    scores = [float(line.split("\t")[1]) for line in (submission / "STS-B.tsv").read_text().splitlines()[1:]]
    assert len(scores) == 5 and all(0.0 <= s <= 5.0 for s in scores)
    assert (out / "rte" / "predict_results_rte.txt").read_text().startswith("index\tprediction\n100\t")


@pytest.mark.slow
def test_own_csv_data_with_a_bert_baseline_and_a_config_file(glue_setup, tmp_path):
    """run_glue's --train_file/--validation_file/--test_file path, BERT trained through the same script, and the
    arguments read from a JSON file."""
    rng = np.random.default_rng(1)
    for split, count in (("train", 24), ("validation", 12), ("test", 6)):
        rows = ["passage,author,label" if split != "test" else "passage,author"]
        for index in range(count):
            label = ("austen", "other")[index % 2]
            text = " ".join(rng.choice(WORDS, 7))
            rows.append(f"{text},{'x' * (index % 3)},{label}" if split != "test" else f"{text},y")
        (tmp_path / f"{split}.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "bert"
    values = {
        "model_type": "bert", "tokenizer_name": str(glue_setup / "tokenizer"),
        "config_overrides": "hidden_size=32,num_hidden_layers=1,num_attention_heads=2,intermediate_size=64",
        "train_file": str(tmp_path / "train.csv"), "validation_file": str(tmp_path / "validation.csv"),
        "test_file": str(tmp_path / "test.csv"), "text_column_names": "passage", "max_seq_length": 32,
        "max_steps": 2, "per_device_train_batch_size": 8, "do_train": True, "do_eval": True, "do_predict": True,
        "output_dir": str(out), "use_cpu": True, "disable_tqdm": True, "cache_dir": str(tmp_path / "cache"),
    }  # fmt: skip
    (tmp_path / "args.json").write_text(json.dumps(values))
    summary = main([str(tmp_path / "args.json")])
    result = summary["tasks"]["own"]
    assert result["recipe"] == "orchid-bert-classification" and result["model_type"] == "bert"
    assert set(result["metrics"]["validation"]) == {"accuracy", "loss"}
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "bert" and config["id2label"] == {"0": "austen", "1": "other"}
    predictions = (out / "predict_results_own.txt").read_text().splitlines()
    assert predictions[0] == "index\tprediction" and len(predictions) == 7
    assert {line.split("\t")[1] for line in predictions[1:]} <= {"austen", "other"}
    assert "orchid" not in (out / "README.md").read_text().lower()  # Trainer's own card for other models
    assert not (out / "glue_results.json").exists() and not (out / "submission").exists()

    # The same data and flags on the command line, with the Orchid model.
    summary = main([
        "--model_name_or_path", str(glue_setup / "pretrained"), "--train_file", str(tmp_path / "train.csv"),
        "--validation_file", str(tmp_path / "validation.csv"), "--text_column_names", "passage",
        "--max_seq_length", "32", "--max_steps", "1", "--output_dir", str(tmp_path / "orchid"), "--use_cpu",
        "--disable_tqdm", "True", "--cache_dir", str(tmp_path / "cache"),
    ])  # fmt: skip
    assert summary["tasks"]["own"]["model_type"] == "orchid"
    assert 0.0 <= summary["tasks"]["own"]["metrics"]["validation"]["accuracy"] <= 1.0
    # The recipe pools the mean for a new head; a saved classifier keeps its own pooling when it is evaluated.
    assert summary["tasks"]["own"]["hyperparameters"]["pooling"] == "mean"
    config_file = tmp_path / "orchid" / "config.json"
    saved = json.loads(config_file.read_text())
    assert saved["classifier_pooling"] == "mean"
    config_file.write_text(json.dumps({**saved, "classifier_pooling": "first"}))
    summary = main([
        "--model_name_or_path", str(tmp_path / "orchid"), "--validation_file", str(tmp_path / "validation.csv"),
        "--text_column_names", "passage", "--max_seq_length", "32", "--do_eval", "--output_dir",
        str(tmp_path / "evaluated"), "--use_cpu", "--disable_tqdm", "True", "--cache_dir", str(tmp_path / "cache"),
    ])  # fmt: skip
    assert summary["tasks"]["own"]["hyperparameters"]["pooling"] == "first"
    with pytest.raises(ValueError, match=r"train file .*train\.csv has no column .body. \(columns"):
        main(["--model_name_or_path", str(glue_setup / "pretrained"), "--train_file", str(tmp_path / "train.csv"),
              "--validation_file", str(tmp_path / "validation.csv"), "--text_column_names", "body",
              "--output_dir", str(tmp_path / "x"), "--cache_dir", str(tmp_path / "cache")])  # fmt: skip
