"""The GPU check (scripts/gpu_check.py, benchmarks/gpu.py): every stage at toy sizes on the CPU, from a tree where the
package is not installed; budgets that cut a stage, an exception in one, SIGTERM, and the pieces it is built from."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from benchmarks import gpu
from benchmarks.candidates import AttentionBlock
from benchmarks.source_tree import REPO_ROOT, package_dirs

pytestmark = pytest.mark.usefixtures("one_thread")

# Runs the script as the GPU machine would: with `import orchid_hf` failing, as where the package is not installed.
WITHOUT_THE_INSTALLED_PACKAGE = textwrap.dedent("""
    import runpy, sys

    class NotInstalled:
        def find_spec(self, name, path=None, target=None):
            if name == "orchid_hf":
                raise ModuleNotFoundError("No module named 'orchid_hf'", name="orchid_hf")

    sys.meta_path.insert(0, NotInstalled())
    sys.argv = ["scripts/gpu_check.py", *sys.argv[1:]]
    runpy.run_path("scripts/gpu_check.py", run_name="__main__")
""")


def read_report(out: Path) -> dict:
    assert (out / gpu.MARKDOWN_NAME).is_file()
    return json.loads((out / gpu.JSON_NAME).read_text())


@pytest.mark.slow
def test_every_stage_runs_at_toy_sizes_from_the_source_tree(tmp_path):
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    command = [sys.executable, "-c", WITHOUT_THE_INSTALLED_PACKAGE, "--device", "cpu", "--tiny", "--out", str(out)]
    run = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    data = read_report(out)
    assert data["finished"] and data["orchid_hf_source"].startswith("source tree")
    assert data["orchid_hf_source"].endswith(f"({REPO_ROOT / 'orchid_hf'})")
    stages = data["stages"]
    assert list(stages) == list(gpu.DEFAULT_STAGES)
    assert {name: stage["status"] for name, stage in stages.items()} == dict.fromkeys(gpu.DEFAULT_STAGES, "completed")

    correctness = stages["correctness"]["results"]
    assert correctness["passed"], [check for check in correctness["checks"] if not check["passed"]]
    names = " ".join(check["check"] for check in correctness["checks"])
    for expected in (*gpu.HEADS, "OrchidOperator", "fft, xcorr", "dct, abs", "against float64", "dct_ref",
                     "long_convolution_ref", "padded on the left", "padded on the right", "torch.compile",
                     "parameter gradients"):
        assert expected in names, expected
    assert all(check["max_rel"] <= check["tolerance"] for check in correctness["checks"])

    training = stages["training"]["results"]
    assert training["steps_done"] == training["planned_steps"] == 20
    assert set(training["curves"]) == set(gpu.VARIANTS)
    for name, curve in training["curves"].items():
        assert curve[-1][1] < 0.95 * curve[0][1], (name, curve)
    dtypes = training["parameter_dtypes"]
    assert dtypes["bf16 weights (from_pretrained)"]["those_modules_stayed_float32"]
    assert dtypes["bf16 weights (from_pretrained)"]["float32_parameters"]

    points = stages["speed"]["results"]["points"]
    measured = [point for point in points if "median_ms" in point]
    assert {(p["part"], p["candidate"]) for p in measured} == {
        ("operator", "orchid"), ("operator", "attention"), ("model", "orchid"), ("model", "bert"),
        ("compiled", "orchid compiled")}
    assert all(point["median_ms"] > 0 and min(point["times_ms"]) > 0 for point in measured)
    assert {(p["dtype"], p["mode"]) for p in measured} == {(d, m) for d in gpu.DTYPES for m in gpu.MODES}

    runs = stages["recall"]["results"]["runs"]
    trained = [run for run in runs if run.get("curve")]
    assert trained and all(run["steps_done"] > 0 and 0 <= run["test_accuracy"] <= 1 for run in trained)

    markdown = (out / gpu.MARKDOWN_NAME).read_text()
    for heading in ("## Correctness", "## Training", "## Speed", "### Operator, bf16 autocast, forward_backward",
                    "### Model, float32, forward", "## Recall"):
        assert heading in markdown
    assert "x |" in markdown  # the speed-up columns


def test_an_exception_in_one_stage_leaves_the_next_stage_to_run(tmp_path):
    # Whether the recall stage's short budget cuts it or it ends just in time depends on the machine's speed; the cut
    # itself is tested deterministically below (test_stages_are_cut_at_their_deadline_or_interrupted_...).
    out = tmp_path / "out"
    data = gpu.main(["--device", "cpu", "--tiny", "--out", str(out), "--stages", "correctness,recall",
                     "--fail-stage", "correctness", "--budget-recall", "0.3"])
    stages = read_report(out)["stages"]
    assert stages == data["stages"]
    assert stages["correctness"]["status"] == "error"
    assert "a failure injected by --fail-stage correctness" in stages["correctness"]["error"]
    assert "Traceback" in stages["correctness"]["error"]
    assert stages["recall"]["status"] in ("completed", "cut")
    assert stages["recall"]["results"]["runs"]  # each run recorded: trained, or skipped for want of time
    assert "a failure injected" in (out / gpu.MARKDOWN_NAME).read_text()


def stub(name):
    """A stage function standing in for the real ones, to test the runner."""

    def cooperative(stage):  # checks its deadline between steps, as the real stages do
        stage.results["steps"] = 0
        while True:
            stage.results["steps"] += 1
            time.sleep(0.01)
            stage.check()

    def blocking(stage):  # a step that never returns to the stage's checks
        stage.results["started"] = True
        time.sleep(30)

    def failing(stage):
        stage.results["before"] = 1
        raise ValueError("a bug in this stage")

    def fine(stage):
        stage.results["done"] = True

    return {"cooperative": cooperative, "blocking": blocking, "failing": failing, "fine": fine}[name]


def test_stages_are_cut_at_their_deadline_or_interrupted_and_the_others_run(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu, "hard_stop_grace", lambda budget: 0.3)
    out = tmp_path / "out"
    functions = {"correctness": stub("failing"), "training": stub("cooperative"), "speed": stub("blocking"),
                 "recall": stub("fine")}
    began = time.monotonic()
    gpu.main(["--device", "cpu", "--tiny", "--out", str(out), "--budget-training", "0.2", "--budget-speed", "0.2"],
             functions=functions)
    assert time.monotonic() - began < 20
    data = read_report(out)
    stages = data["stages"]
    assert data["finished"]
    assert stages["correctness"]["status"] == "error" and "a bug in this stage" in stages["correctness"]["error"]
    assert stages["correctness"]["results"] == {"before": 1}
    assert stages["training"]["status"] == "cut" and stages["training"]["results"]["steps"] > 1
    assert "budget of 0.2 s ran out" in stages["training"]["reason"]
    assert stages["speed"]["status"] == "cut" and "interrupted" in stages["speed"]["reason"]
    assert stages["speed"]["results"] == {"started": True} and stages["speed"]["seconds"] < 5
    assert stages["recall"]["status"] == "completed" and stages["recall"]["results"] == {"done": True}
    markdown = (out / gpu.MARKDOWN_NAME).read_text()
    assert "| training | cut (its budget of 0.2 s ran out) |" in markdown


def test_the_runs_total_budget_leaves_later_stages_skipped(tmp_path):
    out = tmp_path / "out"
    functions = {name: stub("cooperative") for name in gpu.STAGES}
    data = gpu.main(["--device", "cpu", "--tiny", "--out", str(out), "--total-budget-s", "1.5",
                     "--stages", "training,speed"], functions=functions)
    stages = data["stages"]
    assert stages["training"]["status"] == "cut"
    assert stages["speed"]["status"] == "skipped" and "total budget" in stages["speed"]["reason"]
    assert read_report(out)["stages"]["speed"]["status"] == "skipped"


def test_the_report_records_the_commit_and_the_machine(tmp_path):
    functions = {name: stub("fine") for name in gpu.STAGES}
    data = gpu.main(["--device", "cpu", "--tiny", "--out", str(tmp_path), "--commit", "0123456789abcdef"],
                    functions=functions)  # fmt: skip
    assert (data["commit"], data["uncommitted_changes"]) == ("0123456789abcdef", None)  # a copied tree: git cannot tell
    assert data["machine"]["device"] == "cpu" and data["machine"]["versions"]["torch"]
    markdown = (tmp_path / gpu.MARKDOWN_NAME).read_text()
    assert "commit 0123456789ab (uncommitted changes unknown)" in markdown
    assert f"host {data['machine']['processor']}, {data['machine']['cpu_count']} cores" in markdown
    data = gpu.main(["--device", "cpu", "--tiny", "--out", str(tmp_path)], functions=functions)
    assert len(data["commit"]) == 40 and isinstance(data["uncommitted_changes"], bool)  # this checkout's


def test_sigterm_saves_the_report_and_ends_the_run(tmp_path):
    out = tmp_path / "out"

    def terminated(stage):
        stage.results["before"] = True
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)

    functions = {"correctness": stub("fine"), "training": terminated, "speed": stub("fine")}
    handler = signal.getsignal(signal.SIGTERM)
    data = gpu.main(["--device", "cpu", "--tiny", "--out", str(out), "--stages", "correctness,training,speed"],
                    functions=functions)
    stages = read_report(out)["stages"]
    assert not data["finished"]
    assert stages["correctness"]["status"] == "completed"
    assert stages["training"]["status"] == "cut" and stages["training"]["results"] == {"before": True}
    assert stages["speed"]["status"] == "skipped"
    assert signal.getsignal(signal.SIGTERM) == handler


def test_an_import_failure_is_reported_for_every_stage(tmp_path, monkeypatch):
    def broken():
        raise ImportError("cannot import name 'PreTrainedConfig' from 'transformers'")

    monkeypatch.setattr(gpu, "import_orchid_hf", broken)
    data = gpu.main(["--device", "cpu", "--tiny", "--out", str(tmp_path)])
    assert "PreTrainedConfig" in data["import_error"]
    assert {stage["status"] for stage in data["stages"].values()} == {"error"}
    assert "PreTrainedConfig" in (tmp_path / gpu.MARKDOWN_NAME).read_text()


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--device", "cpu", "--tiny"], r"give --out DIR, or set \$OUT"),
        (["--device", "tpu", "--out", "x"], "--device must be cuda"),
        (["--stages", "speed,bogus", "--device", "cpu", "--out", "x"], "stages must be comma-separated names"),
        (["--budget-speed", "0", "--device", "cpu", "--out", "x"], "--budget-speed: must be a positive number of s"),
        (["--budget-recall", "nan", "--device", "cpu", "--out", "x"], "--budget-recall: must be a positive number"),
        (["--total-budget-s", "0", "--device", "cpu", "--out", "x"], "--total-budget-s: must be a positive number"),
        (["--total-budget-s", "inf", "--device", "cpu", "--out", "x"], "--total-budget-s: must be a positive number"),
        (["--speed-shapes", "8by128", "--device", "cpu", "--out", "x"], "speed_shapes must be"),
        (["--mlm-steps", "0", "--device", "cpu", "--out", "x"], "--mlm-steps must be at least 1"),
    ],
)
def test_bad_arguments_are_refused_by_name(monkeypatch, capsys, argv, message):
    monkeypatch.delenv("OUT", raising=False)
    with pytest.raises(SystemExit):
        gpu.parse_args(argv)
    assert re.search(message, capsys.readouterr().err)


def test_out_defaults_to_the_environment_and_cuda_is_refused_without_a_gpu(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("OUT", str(tmp_path))
    settings = gpu.parse_args(["--device", "cpu", "--tiny"])
    assert settings.out == tmp_path and settings.compile_backend == "eager" and settings.threads == 1
    assert settings.budgets == gpu.TINY_BUDGETS and settings.recall_lengths == [32, 64]
    assert settings.recall_vocabs == [20] and gpu.parse_args(["--device", "cpu"]).recall_vocabs == [20, 30]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        gpu.parse_args([])
    assert "sees no CUDA device" in capsys.readouterr().err


def test_the_default_budgets_fit_eight_minutes():
    # The run ends at its total budget at the latest, plus the grace period of the stage running then; Python and
    # torch start before the budget's clock does.
    assert sum(gpu.BUDGETS[name] for name in gpu.DEFAULT_STAGES) < gpu.TOTAL_BUDGET_S
    assert gpu.TOTAL_BUDGET_S + max(map(gpu.hard_stop_grace, gpu.BUDGETS.values())) + 10 < 8 * 60
    assert set(gpu.BUDGETS) == set(gpu.STAGES) == set(gpu.TINY_BUDGETS)
    # The needle stage is a call of its own, of five minutes at most.
    assert gpu.BUDGETS["needle"] + gpu.hard_stop_grace(gpu.BUDGETS["needle"]) + 30 < 5 * 60


def test_the_loader_follows_pyprojects_package_dirs():
    folders = package_dirs(REPO_ROOT / "pyproject.toml")
    assert folders["orchid_hf"] == REPO_ROOT / "orchid_hf"
    assert folders["orchid_hf.modeling"] == REPO_ROOT / "modeling"
    assert folders["orchid_hf.model_cards"] == REPO_ROOT / "model_cards"


def test_differences_are_relative_to_the_references_largest_magnitude():
    expected = torch.tensor([10.0, -20.0, 0.0])
    result = gpu.difference(expected + torch.tensor([0.0, 0.001, 0.0]), expected, tolerance=1e-4)
    assert result["max_abs"] == pytest.approx(0.001, rel=1e-3) and result["max_rel"] == pytest.approx(5e-5, rel=1e-3)
    assert result["passed"]
    assert not gpu.difference(expected + 1.0, expected, tolerance=1e-4)["passed"]
    assert not gpu.difference(torch.tensor([float("nan"), 0.0, 0.0]), expected, tolerance=1.0)["passed"]
    assert not gpu.difference(expected[:2], expected, tolerance=1.0)["passed"]


def test_gradient_differences_name_the_worst_parameter():
    reference = torch.nn.Linear(3, 2)
    model = torch.nn.Linear(3, 2)
    for module in (reference, model):
        module.weight.grad = torch.ones(2, 3)
        module.bias.grad = torch.ones(2)
    model.bias.grad = model.bias.grad + 0.5
    result = gpu.gradient_difference(model, reference, tolerance=1e-3)
    assert not result["passed"] and result["worst_parameter"] == "bias" and result["max_rel"] == pytest.approx(0.5)
    model.bias.grad = None
    assert gpu.gradient_difference(model, reference, 1e-3)["detail"] == "a gradient on one side only"


def test_the_synthetic_masked_lm_task_is_predictable_from_the_neighbours():
    ids, labels = gpu.progression_batch(16, 40, 1000, torch.Generator().manual_seed(0))
    masked = labels != -100
    assert masked.any(dim=1).all() and (ids[masked] == gpu.MASK_ID).all() and (ids[~masked] != gpu.MASK_ID).all()
    tokens = torch.where(masked, labels, ids)
    steps = (tokens[:, 1:] - tokens[:, :-1]) % gpu.PROGRESSION_MODULUS
    assert (steps == steps[:, :1]).all()  # each row counts in one stride
    assert ((tokens >= 500) & (tokens < 600)).all()


def test_parameter_dtypes_report_the_modules_kept_in_float32():
    from orchid_hf import OrchidForMaskedLM

    from .test_models import tiny_text_config

    model = OrchidForMaskedLM(tiny_text_config()).to(torch.bfloat16)
    report = gpu.parameter_dtypes(model)
    assert not report["those_modules_stayed_float32"] and report["float32_parameters"] == []
    model.orchid.encoder.layer[0].mixer.static_filter.float()
    assert not gpu.parameter_dtypes(model)["those_modules_stayed_float32"]
    for layer in model.orchid.encoder.layer:
        for name in model._keep_in_fp32_modules_strict:
            getattr(layer.mixer, name).float()
    report = gpu.parameter_dtypes(model)
    assert report["those_modules_stayed_float32"]
    assert "orchid.encoder.layer.*.mixer.static_filter.skip" in report["float32_parameters"]


@pytest.mark.parametrize("backend", ["flash", "math"])
def test_the_attention_blocks_forced_backends_compute_the_default(backend):
    block = AttentionBlock(32, 4).eval()
    x = torch.randn(2, 16, 32)
    with torch.no_grad():
        expected = block(x)
        block.backend = backend
        torch.testing.assert_close(block(x), expected, atol=1e-5, rtol=1e-5)


def test_the_docs_give_the_budgets_the_script_uses():
    section = (REPO_ROOT / "docs" / "performance.md").read_text().split("\n## On a GPU\n")[1]
    for name, budget in gpu.BUDGETS.items():
        assert f"| `{name}` | {budget:g} |" in section
    assert f"budget of {gpu.TOTAL_BUDGET_S:g} s" in section
    assert f"{gpu.MLM_LAYERS} of its layers" in section and f"for {gpu.MLM_STEPS} steps" in section


@pytest.fixture(scope="module")
def needle_inputs(tmp_path_factory):
    """The needle stage's inputs: generated novels in train/, validation/ and test/, and tiny masked LMs of 128
    positions with their tokenizer, Orchid without a position table (as orchid-bert-long) and BERT."""
    from transformers import BertConfig, BertForMaskedLM

    from orchid_hf import OrchidConfig, OrchidForMaskedLM
    from tests.test_needle import write_novel, write_vocabulary

    root = tmp_path_factory.mktemp("needle-stage")
    for split, seed in (("train", 1), ("validation", 2), ("test", 3)):
        (root / "texts" / split).mkdir(parents=True)
        write_novel(root / "texts" / split / f"novel{seed}.txt", seed)
    tokenizer = write_vocabulary(root / "tokenizer")
    common = dict(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                  max_position_embeddings=128, pad_token_id=0)  # fmt: skip
    torch.manual_seed(0)
    models = {"orchid": OrchidForMaskedLM(OrchidConfig(**common, filter_width=16, position_embedding_type="none")),
              "bert": BertForMaskedLM(BertConfig(**common, num_attention_heads=2))}  # fmt: skip
    for name, model in models.items():
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root


def test_the_needle_stage_fine_tunes_and_scores_longer_haystacks(tmp_path, needle_inputs):
    out = tmp_path / "out"
    data = gpu.main(["--device", "cpu", "--tiny", "--out", str(out), "--stages", "needle",
                     "--needle-model", str(needle_inputs / "orchid"), "--needle-baseline", str(needle_inputs / "bert"),
                     "--needle-texts", str(needle_inputs / "texts"), "--needle-learning-rate", "3e-3"])  # fmt: skip
    stage = read_report(out)["stages"]["needle"]
    assert list(data["stages"]) == ["needle"] and stage["status"] == "completed", stage.get("error")
    models = stage["results"]["models"]
    for role, window, learning_rate in (("model", 512, 3e-3), ("baseline", 128, 1e-3)):
        entry = models[role]
        # Each model fine-tuned at its own learning rate: the model's as given, the baseline's its default.
        assert entry["learning_rate"] == learning_rate and f"fine-tuned at lr {learning_rate:g}" in entry["how"]
        # Fine-tuned up the ladder, each length from the model the last one left, then scored at the longer ones.
        assert [rung["length"] for rung in entry["finetuning"]] == [64, 128]
        assert all(rung["train_seconds"] > 0 and 0 <= rung["validation_accuracy"] <= 1 for rung in entry["finetuning"])
        assert list(entry["lengths"]) == ["64", "128", "256", "512"]
        for length, point in entry["lengths"].items():
            assert point["haystacks"] == 2 and list(point["by_depth"]) == ["0", "100"]
            assert 0 <= point["accuracy"] <= 1 and point["seconds_per_haystack"] > 0 and point["peak_memory_mib"] > 0
            assert point["read_tokens"] == min(int(length), window)
    # Orchid reads every haystack whole; BERT's window of 128 tokens holds the needle at depth 100% but not at 0%.
    assert all(point["needle_in_window"] == 1 for point in models["model"]["lengths"].values())
    assert models["baseline"]["lengths"]["512"]["needle_in_window"] == 0.5
    markdown = (out / gpu.MARKDOWN_NAME).read_text()
    assert "## Needle" in markdown and "| baseline | 512 |" in markdown and "needle in the window: 50%" in markdown
    assert ("fine-tuned for 2 steps of 2 haystacks at each of 64, 128 tokens in turn (8 a length, drawn from the "
            "train files) at lr 0.003 (the baseline at 0.001)") in markdown
    assert "| model | fine-tuning at 64 |" in markdown and "| baseline | fine-tuning at 128 |" in markdown


def test_the_needle_stage_needs_its_inputs(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("OUT", raising=False)
    assert gpu.parse_args(["--device", "cpu", "--out", "x"]).stages == list(gpu.DEFAULT_STAGES)
    with pytest.raises(SystemExit):
        gpu.parse_args(["--device", "cpu", "--out", "x", "--stages", "needle", "--needle-texts", str(tmp_path)])
    assert "the needle stage needs --needle-model" in capsys.readouterr().err
    (tmp_path / "train").mkdir()
    with pytest.raises(SystemExit):
        gpu.parse_args(["--device", "cpu", "--out", "x", "--stages", "needle", "--needle-model", "m",
                        "--needle-texts", str(tmp_path)])  # fmt: skip
    assert f"--needle-texts {tmp_path} has no folder validation, test" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu.parse_args(["--device", "cpu", "--out", "x", "--needle-train-lengths", "128,0"])
    assert "needle_train_lengths must be comma-separated positive integers" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu.parse_args(["--device", "cpu", "--out", "x", "--needle-baseline-learning-rate", "0"])
    assert "--needle-baseline-learning-rate must be > 0, got 0.0" in capsys.readouterr().err
    assert gpu.parse_args(["--device", "cpu", "--out", "x"]).needle_train_lengths == [128, 512, 2048, 8192]
