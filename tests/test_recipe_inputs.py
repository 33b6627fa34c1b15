"""Bad input files of the three recipes: each gives one ValueError naming the file, the line (or, for formats
without lines, the 1-based row) and what is wrong, and ``run_cli`` prints it as one line."""

import gzip
import json
import logging
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from orchid_hf import glue, glue_data, pretraining
from orchid_hf.demo_data import make_corpus
from orchid_hf.tokenization import train_wordpiece_tokenizer
from orchid_hf.vision import main as train_image

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tokenizer")
    train_wordpiece_tokenizer(make_corpus(50, seed=0), vocab_size=200).save_pretrained(folder)
    return folder


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _jsonl(path: Path, rows: list) -> Path:
    return _write(path, "".join(json.dumps(row) + "\n" for row in rows))


GOOD_CSV = "sentence,label\nthe cat sat,0\na dog ran,1\nthe mat is red,0\n"


def _finetune(tmp_path, tokenizer_dir, *flags):
    return glue.main([
        *flags, "--tokenizer_name", str(tokenizer_dir), "--output_dir", str(tmp_path / "out"), "--use_cpu",
        "--cache_dir", str(tmp_path / "cache"), "--disable_tqdm", "True",
    ])  # fmt: skip


def _own(tmp_path, tokenizer_dir, train, validation=None, *flags):
    validation = validation or _write(tmp_path / "dev.csv", GOOD_CSV)
    return _finetune(tmp_path, tokenizer_dir, "--train_file", str(train), "--validation_file", str(validation), *flags)


# ---------------------------------------------------------------------------------------------
# Text classification: own files
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, text, problem",
    [
        ("train.csv", "", r"is empty"),
        ("train.csv", "\n\n  \n", r"holds no text: its 3 lines are blank"),
        ("train.csv", "sentence,label\n", r"has a header but no rows"),
        ("train.jsonl", "", r"is empty"),
        ("train.jsonl", '{"sentence": "a b", "label": 0}\n{"sentence": "c d", "label": 1\n', r"line 2: not valid JSON"),
    ],
)
def test_empty_or_unreadable_train_file(tmp_path, tokenizer_dir, name, text, problem):
    path = _write(tmp_path / name, text)
    with pytest.raises(ValueError, match=rf"train file {path}.*{problem}"):
        _own(tmp_path, tokenizer_dir, path)


def test_csv_missing_label_value_names_the_line(tmp_path, tokenizer_dir):
    path = _write(tmp_path / "train.csv", "sentence,label\nthe cat sat,0\na dog ran,\nthe mat is red,1\n")
    with pytest.raises(ValueError, match=rf"train file {path}, line 3: the label cell \('label'\) is empty"):
        _own(tmp_path, tokenizer_dir, path)


def test_line_numbers_follow_quoted_newlines_and_blank_lines(tmp_path, tokenizer_dir):
    # Row 3 starts on line 6: a quoted cell spans lines 2-3, and line 5 is blank.
    text = 'sentence,label\n"two\nlines",0\na dog ran,1\n\nthe mat,\n'
    path = _write(tmp_path / "train.csv", text)
    with pytest.raises(ValueError, match=rf"{path}, line 6: the label cell"):
        _own(tmp_path, tokenizer_dir, path)


def test_jsonl_missing_label_and_missing_key(tmp_path, tokenizer_dir):
    path = _jsonl(tmp_path / "train.jsonl", [{"sentence": "a b", "label": 0}, {"sentence": "c d", "label": None}])
    with pytest.raises(ValueError, match=rf"train file {path}, line 2: the label cell \('label'\) is empty"):
        _own(tmp_path, tokenizer_dir, path, _jsonl(tmp_path / "dev.jsonl", [{"sentence": "a", "label": 0}]))
    path = _jsonl(tmp_path / "train.jsonl", [{"sentence": "a b", "label": 0}, {"sentence": "c d"}])
    with pytest.raises(ValueError, match=rf"train file {path}, line 2: the label cell \('label'\) is empty"):
        _own(tmp_path, tokenizer_dir, path, _jsonl(tmp_path / "dev.jsonl", [{"sentence": "a", "label": 0}]))


def test_missing_label_or_text_column_names_the_file(tmp_path, tokenizer_dir):
    path = _write(tmp_path / "train.csv", "sentence,category\nthe cat,0\na dog,1\n")
    with pytest.raises(ValueError, match=rf"train file {path} has no label column 'label' \(columns"):
        _own(tmp_path, tokenizer_dir, path)
    path = _write(tmp_path / "train.csv", "label\n0\n1\n")
    with pytest.raises(ValueError, match=rf"train file {path} has no text column"):
        _own(tmp_path, tokenizer_dir, path)
    path = _write(tmp_path / "train.csv", GOOD_CSV)
    with pytest.raises(ValueError, match=rf"train file {path} has no column 'text'"):
        _own(tmp_path, tokenizer_dir, path, None, "--text_column_names", "text")
    path = _jsonl(tmp_path / "train.jsonl", [{"text": "a b", "label": 0}, {"text": "c d", "label": 1}])
    dev = _jsonl(tmp_path / "dev.jsonl", [{"sentence": "a b", "label": 0}])
    with pytest.raises(ValueError, match=rf"validation file {dev} has no column 'text'"):
        _own(tmp_path, tokenizer_dir, path, dev)


def test_empty_text_cells_are_allowed_and_reported(tmp_path, caplog):
    # run_glue's rule: an empty sentence is an input like any other ([CLS] [SEP]). CSV readers turn an empty cell
    # into a missing value, JSON may hold "" or null: all become "", with a warning naming the file and line.
    path = _write(tmp_path / "train.csv", "sentence1,sentence2,label\nthe cat,sat,0\n,a dog,1\nthe mat,,0\n")
    args = glue.parse_args(["--train_file", str(path), "--cache_dir", str(tmp_path / "cache")])
    with caplog.at_level(logging.WARNING, logger="orchid_hf"):
        data = glue_data.load_own_data(args.data_args, {"do_train"}, str(tmp_path / "cache"), None)
    assert data.splits["train"]["sentence1"] == ["the cat", "", "the mat"]
    assert data.splits["train"]["sentence2"] == ["sat", "a dog", ""]
    assert f"{path}: 2 empty text cells (first: line 3, 'sentence1')" in caplog.text
    # A column with no text at all is the wrong column, not data.
    path = _write(tmp_path / "blank.csv", "sentence,label\n,0\n,1\n")
    args = glue.parse_args(["--train_file", str(path), "--cache_dir", str(tmp_path / "cache")])
    with pytest.raises(ValueError, match=rf"train file {path}: the text column 'sentence' is empty in all 2 rows"):
        glue_data.load_own_data(args.data_args, {"do_train"}, str(tmp_path / "cache"), None)


def test_text_column_of_numbers_is_an_error(tmp_path, tokenizer_dir):
    path = _jsonl(tmp_path / "train.jsonl", [{"sentence": 3, "label": 0}, {"sentence": 4, "label": 1}])
    dev = _jsonl(tmp_path / "dev.jsonl", [{"sentence": "a", "label": 0}])
    with pytest.raises(ValueError, match=rf"train file {path}: the text column 'sentence' holds int64 values"):
        _own(tmp_path, tokenizer_dir, path, dev, "--text_column_names", "sentence")


@pytest.mark.parametrize(
    "column, values, found",
    [
        ("label", [1, "1"], r"integer \(line 1\), string \(line 2\)"),
        ("label", [0, 1, [1]], r"integer \(line 1\), list \(line 3\)"),
        ("sentence", ["a b", 3], r"string \(line 1\), integer \(line 2\)"),
        ("label", [[1], [0]], None),
        ("label", [{"x": 1}, {"x": 0}], None),
        ("sentence", [["a"], ["b"]], None),
    ],
)
def test_a_json_column_of_mixed_types_lists_or_records_is_named(tmp_path, tokenizer_dir, column, values, found):
    rows = [{"sentence": "a b", "label": 0, column: value} for value in values]
    path = _jsonl(tmp_path / "train.jsonl", rows)
    dev = _jsonl(tmp_path / "dev.jsonl", [{"sentence": "a", "label": 0}])
    what = "label" if column == "label" else "text"
    problem = rf"mixes JSON types: {found}" if found else rf"holds (List|{{).* values, not one {what} per row"
    with pytest.raises(ValueError, match=rf"train file {path}: the {what} column '{column}' {problem}"):
        _own(tmp_path, tokenizer_dir, path, dev)


def test_validation_and_test_files_are_checked_too(tmp_path, tokenizer_dir):
    train = _write(tmp_path / "train.csv", GOOD_CSV)
    dev = _write(tmp_path / "dev.csv", "sentence,label\nthe cat,0\nthe dog,2\n")
    with pytest.raises(ValueError, match=rf"validation file {dev}, line 3: label '2' is not among the training "
                       r"labels \['0', '1'\]"):  # fmt: skip
        _own(tmp_path, tokenizer_dir, train, dev)
    dev = _write(tmp_path / "dev.csv", "sentence,label\nthe cat,\n")
    with pytest.raises(ValueError, match=rf"validation file {dev}, line 2: the label cell"):
        _own(tmp_path, tokenizer_dir, train, dev)
    test = _write(tmp_path / "test.csv", "")
    with pytest.raises(ValueError, match=rf"test file {test} is empty"):
        _own(tmp_path, tokenizer_dir, train, None, "--test_file", str(test), "--do_predict")
    # A test file needs no labels: an empty label cell there is no error (the column is dropped).
    test = _write(tmp_path / "test.csv", "sentence,label\nthe cat,\n")
    args = glue.parse_args(["--train_file", str(train), "--test_file", str(test)])
    data = glue_data.load_own_data(args.data_args, {"do_train", "do_predict"}, str(tmp_path / "cache"), None)
    assert len(data.splits["test"]) == 1


# ---------------------------------------------------------------------------------------------
# Text classification: GLUE tasks from --data_dir
# ---------------------------------------------------------------------------------------------


def _sst2(tmp_path, train_text):
    data = tmp_path / "glue"
    _write(data / "sst2/train.tsv", train_text)
    _write(data / "sst2/validation.tsv", "sentence\tlabel\nthe cat\t0\na dog\t1\n")
    return data


@pytest.mark.parametrize(
    "text, problem",
    [
        ("", "is empty"),
        ("sentence\tlabel\n", "has a header but no rows"),
        ("sentence\tlabel\nthe cat\t0\na dog\t\n", r"line 3: the label cell \('label'\) is empty"),
        ("sentence\tlabel\nthe cat\t0\na dog\t7\n", r"line 3: sst2 label '?7'? is outside 0\.\.1"),
        ("sentence\tlabel\nthe cat\t0\na dog\tgreat\n", r"line 3: sst2 label 'great' is neither"),
        ("text\tlabel\nthe cat\t0\n", r"lacks the columns \['sentence'\]"),
    ],
)
def test_glue_data_dir_files(tmp_path, tokenizer_dir, text, problem):
    data = _sst2(tmp_path, text)
    path = data / "sst2/train.tsv"
    with pytest.raises(ValueError, match=rf"train file {path}.*{problem}"):
        _finetune(tmp_path, tokenizer_dir, "--task_name", "sst2", "--data_dir", str(data))


def test_glue_label_names_are_mapped_and_checked(tmp_path):
    data = tmp_path / "glue"
    _write(data / "rte/train.tsv", "sentence1\tsentence2\tlabel\na\tb\tentailment\nc\td\tmaybe\n")
    with pytest.raises(ValueError, match=rf"train file {data / 'rte/train.tsv'}, line 3: rte label 'maybe' is "
                       r"neither one of \['entailment', 'not_entailment'\] nor a class id"):  # fmt: skip
        glue_data.load_glue_task("rte", splits=("train",), data_dir=data, cache_dir=str(tmp_path / "cache"))
    # Each GLUE label cell is mapped on its own, so a JSON file mixing label names and class ids is read.
    _jsonl(data / "rte/train.jsonl", [{"sentence1": "a", "sentence2": "b", "label": "entailment"},
                                      {"sentence1": "c", "sentence2": "d", "label": 1}])  # fmt: skip
    (data / "rte/train.tsv").unlink()
    splits = glue_data.load_glue_task("rte", splits=("train",), data_dir=data, cache_dir=str(tmp_path / "cache"))
    assert glue_data.encode_labels("rte", splits["train"])["label"] == [0, 1]


# ---------------------------------------------------------------------------------------------
# Masked-LM pretraining
# ---------------------------------------------------------------------------------------------


def _pretrain(tmp_path, tokenizer_dir, train, *flags):
    return pretraining.main([
        "--train_file", str(train), "--tokenizer_name", str(tokenizer_dir), "--max_seq_length", "16",
        "--config_overrides", "hidden_size=32,num_hidden_layers=1,intermediate_size=64,max_position_embeddings=16",
        "--output_dir", str(tmp_path / "out"), "--use_cpu", "--cache_dir", str(tmp_path / "cache"), "--max_steps", "1",
        *flags,
    ])  # fmt: skip


@pytest.mark.parametrize(
    "name, text, problem",
    [
        ("corpus.txt", "", "is empty"),
        ("corpus.txt", "\n  \n\n", r"holds no text: its 3 lines are blank"),
        ("corpus.jsonl", "", "is empty"),
        ("corpus.jsonl", '{"text": "a b c"}\n{"text": "d e\n', r"line 2: not valid JSON"),
        ("corpus.csv", "", "is empty"),
        ("corpus.csv", "text\n", "has a header but no rows"),
    ],
)
def test_pretraining_empty_or_unreadable_file(tmp_path, tokenizer_dir, name, text, problem):
    path = _write(tmp_path / name, text)
    with pytest.raises(ValueError, match=rf"train file {path}.*{problem}"):
        _pretrain(tmp_path, tokenizer_dir, path)


def test_pretraining_text_column_problems(tmp_path, tokenizer_dir):
    path = _jsonl(tmp_path / "corpus.jsonl", [{"body": "a b c"}, {"body": "d e f"}])
    with pytest.raises(ValueError, match=rf"train file {path} has no column 'text' \(columns \['body'\]"):
        _pretrain(tmp_path, tokenizer_dir, path, "--text_column_name", "text")
    path = _jsonl(tmp_path / "corpus.jsonl", [{"text": 1}, {"text": 2}])
    with pytest.raises(ValueError, match=rf"train file {path}: the text column 'text' holds int64 values"):
        _pretrain(tmp_path, tokenizer_dir, path)
    document = _write(tmp_path / "corpus.json", json.dumps([{"text": "a b c"}, {"text": ["d", "e"]}]))
    with pytest.raises(ValueError, match=rf"train file {document}: the text column 'text' mixes JSON types: string "
                       r"\(row 1\), list \(row 2\)"):  # fmt: skip
        _pretrain(tmp_path, tokenizer_dir, document)
    good = _write(tmp_path / "good.txt", "the cat sat on the mat\n")
    bad = _write(tmp_path / "validation.txt", "\n\n")
    with pytest.raises(ValueError, match=rf"validation file {bad} holds no text"):
        _pretrain(tmp_path, tokenizer_dir, good, "--validation_file", str(bad))


# ---------------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------------


def _train_image(tmp_path, *flags):
    return train_image([*flags, "--output_dir", str(tmp_path / "out"), "--use_cpu", "--cache_dir",
                        str(tmp_path / "cache"), "--max_steps", "1"])  # fmt: skip


def test_image_folder_without_images(tmp_path):
    (tmp_path / "images/cat").mkdir(parents=True)
    with pytest.raises(ValueError, match=rf"image folder {tmp_path / 'images'} contains no images"):
        _train_image(tmp_path, "--train_dir", str(tmp_path / "images"))


def test_corrupt_image_is_named(tmp_path):
    for name in ("cat", "dog"):
        (tmp_path / "images" / name).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (4, 4)).save(tmp_path / "images" / name / f"{i}.png")
    bad = tmp_path / "images/dog/2.png"
    bad.write_bytes(b"not a png")
    with pytest.raises(ValueError, match=rf"cannot be read: {bad} \("):
        _train_image(tmp_path, "--train_dir", str(tmp_path / "images"))


def test_idx_wrong_magic_or_damaged_gzip(tmp_path):
    folder = tmp_path / "idx"
    folder.mkdir()
    images = folder / "train-images-idx3-ubyte"
    images.write_bytes(bytes([0, 1, 8, 3]) + struct.pack(">3I", 1, 2, 2) + bytes(4))
    (folder / "train-labels-idx1-ubyte").write_bytes(bytes([0, 0, 8, 1]) + struct.pack(">I", 1) + bytes(1))
    with pytest.raises(ValueError, match=rf"{images} is not an IDX file: it starts with bytes \[0, 1, 8, 3\]"):
        _train_image(tmp_path, "--train_dir", str(folder))
    images.unlink()
    damaged = folder / "train-images-idx3-ubyte.gz"
    damaged.write_bytes(gzip.compress(bytes([0, 0, 8, 3]) + struct.pack(">3I", 1, 2, 2) + bytes(4))[:-6])
    with pytest.raises(ValueError, match=rf"{damaged} is not a complete gzip file"):
        _train_image(tmp_path, "--train_dir", str(folder))


# ---------------------------------------------------------------------------------------------
# The command line prints one line
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_run_cli_prints_one_line(tmp_path, tokenizer_dir):
    path = _write(tmp_path / "train.csv", "sentence,label\nthe cat sat,0\na dog ran,\n")
    dev = _write(tmp_path / "dev.csv", GOOD_CSV)
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts/finetune_glue.py"), "--train_file", str(path), "--validation_file",
         str(dev), "--tokenizer_name", str(tokenizer_dir), "--output_dir", str(tmp_path / "out"), "--use_cpu",
         "--cache_dir", str(tmp_path / "cache"), "--log_level", "error"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: train file {path}, line 3: the label cell ('label') is empty; every training and validation row "
        "needs a label"
    )
    assert "Traceback" not in result.stderr



# ---------------------------------------------------------------------------------------------
# Evaluating or predicting with a trained classifier: its labels are the label list
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory, tokenizer_dir):
    from transformers import AutoTokenizer

    from orchid_hf import OrchidConfig, OrchidForSequenceClassification

    folder = tmp_path_factory.mktemp("classifier")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = OrchidConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, intermediate_size=64,
        max_position_embeddings=32, filter_width=16, num_labels=2, id2label={0: "neg", 1: "pos"},
        label2id={"neg": 0, "pos": 1},
    )  # fmt: skip
    OrchidForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _evaluate(tmp_path, classifier_dir, *flags):
    return glue.main([
        "--model_name_or_path", str(classifier_dir), *flags, "--max_seq_length", "32", "--output_dir",
        str(tmp_path / "out"), "--use_cpu", "--cache_dir", str(tmp_path / "cache"), "--disable_tqdm", "True",
    ])  # fmt: skip


def test_evaluation_uses_the_model_labels(tmp_path, classifier_dir):
    # A validation set with one of the model's two classes is scored against the model's label ids.
    dev = _write(tmp_path / "dev.csv", "sentence,label\nthe cat,pos\na dog,pos\n")
    result = _evaluate(tmp_path, classifier_dir, "--validation_file", str(dev), "--do_eval")["tasks"]["own"]
    assert 0.0 <= result["metrics"]["validation"]["accuracy"] <= 1.0
    dev = _write(tmp_path / "dev.csv", "sentence,label\nthe cat,pos\na dog,neutral\n")
    with pytest.raises(ValueError, match=rf"validation file {dev}, line 3: label 'neutral' is not among the model's "
                       r"labels \['neg', 'pos'\]"):  # fmt: skip
        _evaluate(tmp_path, classifier_dir, "--validation_file", str(dev), "--do_eval")


def test_prediction_alone_takes_the_model_labels(tmp_path, classifier_dir):
    test = _write(tmp_path / "test.csv", "sentence\nthe cat\na dog\n")
    _evaluate(tmp_path, classifier_dir, "--test_file", str(test), "--do_predict")
    lines = (tmp_path / "out/predict_results_own.txt").read_text().splitlines()
    assert lines[0] == "index\tprediction" and {line.split("\t")[1] for line in lines[1:]} <= {"neg", "pos"}
