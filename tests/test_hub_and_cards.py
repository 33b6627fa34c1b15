"""Model cards (text and image) and the Hub helpers, against a mocked HfApi and snapshot_download."""

import json
import os
import shutil
import subprocess
import sys
import time
from fnmatch import fnmatch
from pathlib import Path

import pytest
import torch
import yaml
from huggingface_hub import EvalResult, ModelCard
from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

from orchid_hf import OrchidConfig, OrchidForImageClassification, OrchidForSequenceClassification
from orchid_hf.cards import usage_snippets, write_model_card
from orchid_hf.demo_data import make_corpus
from orchid_hf.hub import HubUnavailableError, pull_from_hub, push_to_hub, upload_file_list
from orchid_hf.tokenization import train_wordpiece_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


SENTENCES = ["the soup at the kitchen was not good .", "anna said the song was wonderful ."]


def _front_matter(path: Path) -> dict:
    return yaml.safe_load(path.read_text().split("---")[1])


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    """A saved tiny sequence classifier with its tokenizer, a card and some training leftovers."""
    folder = tmp_path_factory.mktemp("hub") / "orchid-tiny-sst2"
    tokenizer = train_wordpiece_tokenizer(make_corpus(100), vocab_size=200)
    config = OrchidConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, intermediate_size=64,
        max_position_embeddings=32, filter_width=16, num_labels=2, id2label={0: "negative", 1: "positive"},
        label2id={"negative": 0, "positive": 1},
    )  # fmt: skip
    OrchidForSequenceClassification(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    write_model_card(
        folder, task="text-classification", repo_id="me/orchid-tiny-sst2",
        results=[dict(dataset_type="glue", dataset_name="GLUE SST-2", dataset_config="sst2",
                      dataset_split="validation", metric_type="accuracy", metric_value=91.5)],
        datasets=["nyu-mll/glue"], base_model="me/orchid-tiny-mlm", training={"learning rate": 3e-5},
    )  # fmt: skip
    (folder / "checkpoint-10").mkdir()
    (folder / "checkpoint-10" / "optimizer.pt").write_bytes(b"x")
    (folder / "training_args.bin").write_bytes(b"x")
    return folder


def test_text_card_metadata_and_snippets(text_model):
    meta = _front_matter(text_model / "README.md")
    assert meta["pipeline_tag"] == "text-classification" and meta["license"] == "apache-2.0"
    assert meta["datasets"] == ["nyu-mll/glue"] and meta["base_model"] == "me/orchid-tiny-mlm"
    assert meta["language"] == "en" and meta["library_name"] == "transformers" and "orchid" in meta["tags"]
    (index,) = meta["model-index"]
    (result,) = index["results"]
    assert result["task"]["type"] == "text-classification"
    assert result["dataset"] == {"name": "GLUE SST-2", "type": "glue", "config": "sst2", "split": "validation"}
    assert result["metrics"] == [{"type": "accuracy", "value": 91.5}]
    card = ModelCard.load(text_model / "README.md")
    assert card.data.eval_results[0].metric_value == 91.5
    text = card.text
    assert "import orchid_hf" in text and 'pipeline("text-classification", model="me/orchid-tiny-sst2")' in text
    assert 'AutoModelForSequenceClassification.from_pretrained("me/orchid-tiny-sst2", trust_remote_code=True)' in text
    assert "| learning rate | 3e-05 |" in text and "| GLUE SST-2 (sst2) | validation | accuracy | 91.5 |" in text


def test_image_card_is_generic(tmp_path):
    card = write_model_card(
        tmp_path, task="image-classification", model_name="orchid-vit-cifar-s",
        results=[EvalResult(task_type="image-classification", dataset_type="cifar10", dataset_name="CIFAR-10",
                            metric_type="accuracy", metric_value=0.885)],
        datasets=["uoft-cs/cifar10"],
    )  # fmt: skip
    meta = _front_matter(tmp_path / "README.md")
    assert meta["pipeline_tag"] == "image-classification" and "language" not in meta
    assert meta["model-index"][0]["results"][0]["metrics"][0]["value"] == 0.885
    assert "AutoImageProcessor" in card.text and "image_processor=processor" in card.text
    installed, remote = usage_snippets("fill-mask", "me/m", example_input='"a [MASK] ."')
    assert 'pipe("a [MASK] .")' in installed and "AutoModelForMaskedLM" in remote
    with pytest.raises(ValueError, match="task must be one of"):
        write_model_card(tmp_path, task="translation")
    with pytest.raises(ValueError, match=r"a result needs \['metric_value'\]"):
        write_model_card(
            tmp_path, task="fill-mask", results=[dict(dataset_type="c4", dataset_name="c4", metric_type="a")]
        )
    with pytest.raises(ValueError, match="does not exist"):
        write_model_card(tmp_path / "missing", task="fill-mask")


def test_push_refuses_incomplete_folders(text_model, tmp_path):
    for missing, message in [
        ("model.safetensors", "model.safetensors"),
        ("modeling_orchid.py", "modeling_orchid.py"),
        ("config.json", "config.json"),
        ("tokenizer.json", "tokenizer.json"),
        ("README.md", "write_model_card"),
    ]:
        folder = tmp_path / missing
        shutil.copytree(text_model, folder)
        (folder / missing).unlink()
        with pytest.raises(ValueError, match=f"cannot be pushed, it lacks: .*{message}"):
            push_to_hub(folder, "me/x", api=object())
    image = tmp_path / "image"
    config = OrchidConfig.from_preset("orchid-vit-cifar-s", hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    OrchidForImageClassification(config).save_pretrained(image)
    write_model_card(image, task="image-classification")
    with pytest.raises(ValueError, match="preprocessor_config.json"):
        upload_file_list(image)


def test_push_offline_fails_fast(text_model):
    start = time.perf_counter()
    with pytest.raises(HubUnavailableError, match="HF_HUB_OFFLINE is set"):
        push_to_hub(text_model, "me/orchid-tiny-sst2")
    with pytest.raises(HubUnavailableError, match="not in the local Hugging Face cache"):
        pull_from_hub("me/definitely-not-cached-orchid")
    assert time.perf_counter() - start < 5


class FakeHub:
    """An HfApi stand-in that stores uploads in a folder, and a snapshot_download that reads them back."""

    def __init__(self, root: Path):
        self.root, self.calls = root, []

    def create_repo(self, repo_id, *, private=False, exist_ok=False, repo_type=None):
        self.calls.append(("create_repo", repo_id, private, exist_ok, repo_type))
        (self.root / repo_id).mkdir(parents=True, exist_ok=exist_ok)

    def upload_folder(self, *, repo_id, folder_path, allow_patterns, **kwargs):
        self.calls.append(("upload_folder", repo_id, sorted(allow_patterns), kwargs["commit_message"]))
        for path in Path(folder_path).rglob("*"):
            relative = path.relative_to(folder_path).as_posix()
            if path.is_file() and any(fnmatch(relative, pattern) for pattern in allow_patterns):
                target = self.root / repo_id / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, target)

        class Commit:
            commit_url = f"https://huggingface.co/{repo_id}/commit/0"

        return Commit()

    def snapshot_download(self, repo_id, *, revision=None, local_dir=None, token=None, local_files_only=False):
        self.calls.append(("snapshot_download", repo_id, revision))
        target = Path(local_dir)
        shutil.copytree(self.root / repo_id, target, dirs_exist_ok=True)
        return str(target)


@pytest.mark.slow
def test_push_and_pull_round_trip(text_model, tmp_path, monkeypatch, hf_modules_cache):
    hub = FakeHub(tmp_path / "hub")
    url = push_to_hub(text_model, "me/orchid-tiny-sst2", api=hub, private=True, commit_message="v1")
    assert url == "https://huggingface.co/me/orchid-tiny-sst2/commit/0"
    expected = [
        "README.md", "config.json", "configuration_orchid.py", "model.safetensors", "modeling_orchid.py",
        "orchid_layers.py", "orchid_ops.py", "tokenizer.json", "tokenizer_config.json",
    ]  # fmt: skip
    assert hub.calls[:2] == [
        ("create_repo", "me/orchid-tiny-sst2", True, True, "model"),
        ("upload_folder", "me/orchid-tiny-sst2", expected, "v1"),
    ]
    assert sorted(p.name for p in (tmp_path / "hub/me/orchid-tiny-sst2").iterdir()) == expected

    monkeypatch.setattr("orchid_hf.hub.snapshot_download", hub.snapshot_download)
    pulled = pull_from_hub("me/orchid-tiny-sst2", local_dir=tmp_path / "pulled", revision="main")
    assert hub.calls[-1] == ("snapshot_download", "me/orchid-tiny-sst2", "main")

    tokenizer = AutoTokenizer.from_pretrained(pulled)
    inputs = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    original = OrchidForSequenceClassification.from_pretrained(text_model).eval()
    model = AutoModelForSequenceClassification.from_pretrained(pulled).eval()
    with torch.no_grad():
        expected_logits = original(**inputs).logits
        assert torch.equal(model(**inputs).logits, expected_logits)
    predictions = pipeline("text-classification", model=model, tokenizer=tokenizer)(SENTENCES)
    assert [p["label"] for p in predictions] == [model.config.id2label[int(i)] for i in expected_logits.argmax(-1)]

    # The card's second snippet: a process that never imports orchid_hf loads the pulled folder as remote code.
    code = (
        "import json, sys, torch\n"
        "from transformers import AutoModelForSequenceClassification, AutoTokenizer\n"
        "path = sys.argv[1]\n"
        "model = AutoModelForSequenceClassification.from_pretrained(path, trust_remote_code=True).eval()\n"
        "assert 'orchid_hf' not in sys.modules, 'the package was imported'\n"
        "tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)\n"
        f"inputs = tokenizer({SENTENCES!r}, padding=True, return_tensors='pt')\n"
        "with torch.no_grad():\n"
        "    print(json.dumps(model(**inputs).logits.tolist()))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(hf_modules_cache), "PYTHONPATH": ""}
    done = subprocess.run(
        [sys.executable, "-c", code, str(pulled)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    remote_logits = torch.tensor(json.loads(done.stdout.strip().splitlines()[-1]))
    assert torch.allclose(remote_logits, expected_logits, atol=1e-6)


def test_a_sentence_transformers_folder_is_pushed_whole_and_loads_as_it_was_saved(tmp_path):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense

    from orchid_hf import OrchidModel
    from orchid_hf.embeddings import sentence_transformer

    tokenizer = train_wordpiece_tokenizer(make_corpus(100), vocab_size=200)
    config = OrchidConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, intermediate_size=64,
                          max_position_embeddings=32, filter_width=16)  # fmt: skip
    torch.manual_seed(0)
    embedder = sentence_transformer(OrchidModel(config).eval(), tokenizer, pooling="max", normalize=True)
    # A module of another kind with weights of its own, in its own folder: a Dense layer before the normalisation.
    embedder = SentenceTransformer(modules=[*list(embedder)[:2], Dense(32, 8), embedder[2]], device="cpu")
    folder = tmp_path / "embedder"
    embedder.save(str(folder))
    write_model_card(folder, task="sentence-similarity", repo_id="me/orchid-embedder")
    (folder / "checkpoint-10").mkdir()
    (folder / "checkpoint-10" / "optimizer.pt").write_bytes(b"x")
    expected = embedder.encode(SENTENCES, convert_to_tensor=True)

    hub = FakeHub(tmp_path / "hub")
    push_to_hub(folder, "me/orchid-embedder", api=hub)
    uploaded = tmp_path / "hub" / "me" / "orchid-embedder"
    files = {path.relative_to(uploaded).as_posix() for path in uploaded.rglob("*") if path.is_file()}
    assert {"modules.json", "config_sentence_transformers.json", "sentence_bert_config.json", "1_Pooling/config.json",
            "2_Dense/config.json", "2_Dense/model.safetensors", "3_Normalize/config.json"} <= files
    assert not any(name.startswith("checkpoint-") for name in files)
    loaded = SentenceTransformer(str(uploaded), device="cpu")
    assert [type(module).__name__ for module in loaded] == ["Transformer", "Pooling", "Dense", "Normalize"]
    assert loaded[1].get_config_dict()["pooling_mode"] == "max"
    torch.testing.assert_close(loaded.encode(SENTENCES, convert_to_tensor=True), expected, atol=0, rtol=0)
    assert upload_file_list(uploaded) == sorted(files)  # what pull_from_hub checks

    # A module folder that modules.json names but the folder lacks is named.
    shutil.rmtree(folder / "1_Pooling")
    with pytest.raises(ValueError, match=r"cannot be pushed, it lacks: 1_Pooling/ \(module 1 of modules.json"):
        push_to_hub(folder, "me/x", api=object())


def test_the_onnx_graphs_of_a_sentence_transformers_folder_are_pushed_with_it(tmp_path):
    from orchid_hf import OrchidModel
    from orchid_hf.embeddings import sentence_transformer

    tokenizer = train_wordpiece_tokenizer(make_corpus(100), vocab_size=200)
    config = OrchidConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, intermediate_size=64,
                          max_position_embeddings=32, filter_width=16)  # fmt: skip
    folder = tmp_path / "embedder"
    sentence_transformer(OrchidModel(config).eval(), tokenizer, normalize=True).save(str(folder))
    write_model_card(folder, task="sentence-similarity", repo_id="me/orchid-embedder")
    # The files as export_embedder_onnx names them, and the external weights of a graph over 2 GB (torch.onnx's and
    # optimum's names): only their names matter to the upload.
    onnx_files = ["onnx/model.onnx", "onnx/model.onnx.data", "onnx/model_qint8.onnx", "onnx/model_qint8.onnx_data"]
    for name in onnx_files:
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_bytes(b"x")

    hub = FakeHub(tmp_path / "hub")
    push_to_hub(folder, "me/orchid-embedder", api=hub)
    (_, _, pushed, _) = hub.calls[1]
    assert set(onnx_files) <= set(pushed) and {"modules.json", "2_Normalize/config.json"} <= set(pushed)
    uploaded = tmp_path / "hub" / "me" / "orchid-embedder"
    assert sorted(path.relative_to(uploaded).as_posix() for path in (uploaded / "onnx").iterdir()) == onnx_files
    assert upload_file_list(uploaded) == pushed  # what pull_from_hub checks
