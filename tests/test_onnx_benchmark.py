"""The ONNX Runtime benchmark (benchmarks/onnx_runtime.py) at toy sizes: both runtimes on padded batches of every
shape that fits each model, equal outputs, and its files with their commit and machine."""

import json

import pytest
import torch

from benchmarks import onnx_runtime

pytestmark = pytest.mark.usefixtures("one_thread")


def test_padded_batches_mix_lengths():
    import torch

    batch = onnx_runtime.padded_batch(4, 16, 100, torch.Generator().manual_seed(0))
    assert batch["attention_mask"].sum(dim=1).tolist() == [16, 14, 12, 10]
    assert batch["input_ids"].shape == (4, 16) and int(batch["input_ids"].min()) >= 5


def test_both_runtimes_on_every_shape_that_fits(tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    from orchid_hf import OrchidConfig

    preset = OrchidConfig.from_preset
    monkeypatch.setattr(OrchidConfig, "from_preset", lambda name, **overrides: preset(
        name, **{**overrides, "hidden_size": 32, "intermediate_size": 64, "vocab_size": 100, "filter_width": 16}))
    result = onnx_runtime.main(["--positions", "32", "128", "--shapes", "3x32", "1x128", "--layers", "1",
                                "--repeats", "3", "--profile", "--out-dir", str(tmp_path)])  # fmt: skip
    rows = [(row["positions"], tuple(row["shape"])) for row in result["rows"]]
    assert rows == [(32, (3, 32)), (128, (3, 32)), (128, (1, 128))]  # (1, 128) does not fit 32 positions
    for row in result["rows"]:
        assert row["max_abs_difference"] < 1e-4 and row["rounds"] == 3 and row["ratio"] > 0
        shares = [entry["share"] for entry in row["profile"]]
        assert 0 < sum(shares) <= 1 + 1e-9 and shares == sorted(shares, reverse=True)
        assert {"Gemm", "MatMul"} & {entry["op"] for entry in row["profile"]}  # the projections, by ONNX's names
    saved = json.loads((tmp_path / "onnx_runtime_cpu_threads1.json").read_text())
    assert len(saved["commit"]) == 40 and saved["machine"]["torch_threads"] == 1
    assert saved["command"].startswith("python scripts/onnx_benchmark.py --positions 32 128")
    text = (tmp_path / "onnx_runtime_cpu_threads1.md").read_text()
    assert "| 128 | (3, 32) | 81 |" in text and "kernel time by operator, 128 positions, (1, 128)" in text


@pytest.mark.parametrize("argv,message", [(["--shapes", "8by128"], "a shape is BxL"),
                                          (["--threads", "0"], "--threads must be at least 1"),
                                          (["--positions", "0"], "--positions must be at least 1")])  # fmt: skip
def test_bad_arguments_are_refused_by_name(argv, message, capsys):
    with pytest.raises(SystemExit):
        onnx_runtime.main(argv)
    assert message in capsys.readouterr().err


def test_int8_benchmark_scores_orchid_and_bert_in_every_runtime(tmp_path):
    pytest.importorskip("onnxruntime")
    from transformers import BertConfig, BertForMaskedLM

    from benchmarks import int8
    from orchid_hf import OrchidConfig, OrchidForMaskedLM
    from orchid_hf.demo_data import make_corpus
    from orchid_hf.tokenization import train_wordpiece_tokenizer

    tokenizer = train_wordpiece_tokenizer(make_corpus(200, seed=0), vocab_size=300)
    (tmp_path / "held_out.txt").write_text("\n".join(make_corpus(20, seed=1)) + "\n")
    torch.manual_seed(0)
    sizes = dict(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, intermediate_size=64,
                 max_position_embeddings=32)  # fmt: skip
    models = {"orchid": OrchidForMaskedLM(OrchidConfig(**sizes, filter_width=16)),
              "bert": BertForMaskedLM(BertConfig(**sizes, num_attention_heads=2))}  # fmt: skip
    for name, model in models.items():
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    result = int8.main(["--models", str(tmp_path / "orchid"), str(tmp_path / "bert"), "--validation_file",
                        str(tmp_path / "held_out.txt"), "--length", "32", "--max-tokens", "600",
                        "--out-dir", str(tmp_path / "out")])  # fmt: skip
    rows = {(row["model_type"], row["runtime"]): row for row in result["rows"]}
    assert len(rows) == 6 and result["tokens"] == 600 and 100 < result["masked_tokens"] < 260
    for kind in ("orchid", "bert"):
        exact, onnx = rows[kind, "PyTorch"], rows[kind, "ONNX Runtime, float32"]
        assert onnx["loss"] == pytest.approx(exact["loss"], rel=1e-4)  # the same predictions, read by ONNX Runtime
        quantized = rows[kind, "ONNX Runtime, int8"]
        assert 0 < quantized["file_mib"] and 0 <= quantized["accuracy"] <= 1 and onnx["file_mib"] > 0.05
        assert quantized["loss"] == pytest.approx(exact["loss"], rel=0.05)
    assert "| orchid (orchid) | ONNX Runtime, int8 |" in (tmp_path / "out" / "int8_cpu_threads1.md").read_text()
