"""The ONNX Runtime benchmark (benchmarks/onnx_runtime.py) at toy sizes: both runtimes on padded batches of every
shape that fits each model, equal outputs, and its files with their commit and machine."""

import json

import pytest

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
