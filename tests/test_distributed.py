"""Both recipes run unchanged as 2 CPU processes (distributed data parallel over gloo): pretraining under
torchrun, GLUE fine-tuning under accelerate launch."""

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from orchid_hf import OrchidConfig, OrchidForMaskedLM
from orchid_hf.demo_data import make_corpus, write_demo_data
from orchid_hf.pretraining import block_packer
from orchid_hf.tokenization import train_wordpiece_tokenizer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TINY = "hidden_size=32,num_hidden_layers=1,intermediate_size=64,max_position_embeddings=32,filter_width=16"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(command, cwd):
    # One thread per process: two processes already fill the two cores.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp")
    sizes = dict(train_documents=60, validation_documents=8, train_examples=64, validation_examples=32)
    write_demo_data(root / "data", **sizes)
    train_wordpiece_tokenizer(make_corpus(200), vocab_size=300).save_pretrained(root / "tokenizer")
    return root


def test_pretraining_under_torchrun(data):
    out = data / "mlm"
    run(
        [
            str(BIN / "torchrun"), "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
            "--master_port", str(free_port()), str(ROOT / "scripts/pretrain_mlm.py"),
            "--train_file", str(data / "data/corpus/train.txt"),
            "--validation_file", str(data / "data/corpus/validation.txt"),
            "--tokenizer_name", str(data / "tokenizer"), "--config_overrides", TINY, "--max_seq_length", "32",
            "--output_dir", str(out), "--max_steps", "3", "--per_device_train_batch_size", "4",
            "--eval_strategy", "no", "--save_strategy", "no", "--use_cpu", "--disable_tqdm", "True",
            "--cache_dir", str(data / "cache"),
        ],
        cwd=data,
    )  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    assert results["world_size"] == 2
    # Each step consumed 2 processes x 4 blocks: the data was sharded, not duplicated.
    tokenizer = AutoTokenizer.from_pretrained(data / "tokenizer")
    documents = (data / "data/corpus/train.txt").read_text().splitlines()
    blocks = len(block_packer(tokenizer, 32, "text")({"text": documents})["input_ids"])
    assert results["train"]["epoch"] == pytest.approx(3 / math.ceil(blocks / 8))
    assert 0.0 <= results["eval"]["eval_masked_accuracy"] <= 1.0
    assert (out / "model.safetensors").is_file() and (out / "README.md").is_file()


def test_glue_under_accelerate_launch(data):
    # CPU processes come from --multi_gpu with no GPU (accelerate's --cpu starts a single process).
    model = data / "model"
    config = OrchidConfig(
        vocab_size=300, hidden_size=32, num_hidden_layers=1, intermediate_size=64, max_position_embeddings=32,
        filter_width=16,
    )  # fmt: skip
    OrchidForMaskedLM(config).save_pretrained(model)
    AutoTokenizer.from_pretrained(data / "tokenizer").save_pretrained(model)
    out = data / "glue"
    run(
        [
            str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
            str(ROOT / "scripts/finetune_glue.py"), "--model_name_or_path", str(model), "--task_name", "sst2",
            "--data_dir", str(data / "data"), "--output_dir", str(out), "--max_seq_length", "32",
            "--max_steps", "2", "--per_device_train_batch_size", "8", "--use_cpu", "--disable_tqdm", "True",
            "--cache_dir", str(data / "cache"),
        ],
        cwd=data,
    )  # fmt: skip
    result = json.loads((out / "sst2" / "results.json").read_text())
    assert result["world_size"] == 2
    # 2 steps x 2 processes x 8 examples = half an epoch of the 64 training sentences.
    assert result["epochs_done"] == pytest.approx(0.5)
    assert json.loads((out / "glue_results.json").read_text())["tasks"]["sst2"]["world_size"] == 2
    assert 0.0 <= result["metrics"]["validation"]["accuracy"] <= 1.0
