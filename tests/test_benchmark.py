"""The benchmark at tiny sizes (correctness only: no timing is asserted anywhere): candidates in worker processes of
their own, an older version of the model code as reference, the training step, reports, and arguments checked before
anything runs."""

import dataclasses
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from orchid_hf.modeling.orchid_ops import SequenceLayout

from benchmarks import candidates, harness, measure, parts, profiles, report, speed
from benchmarks.settings import MODES, BenchmarkSettings, parse_lengths, parse_shapes

MODELING = Path(speed.__file__).resolve().parent.parent / "modeling"


def quick_settings(*argv: str) -> BenchmarkSettings:
    return BenchmarkSettings.from_args(speed.parse_args(["--quick", *argv]))


def copy_modeling(root: Path) -> Path:
    """A copy of this version's model code in ``root/modeling``, as a git worktree of another commit would hold it;
    returns ``root``."""
    shutil.copytree(MODELING, root / "modeling", ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.fixture(scope="module")
def reference_checkout(tmp_path_factory) -> Path:
    """A copy of this version's model code in a folder of its own; the benchmark imports it as a package of its own,
    beside the installed one."""
    return copy_modeling(tmp_path_factory.mktemp("reference"))


@pytest.mark.slow
def test_benchmark_runs_at_tiny_sizes_and_writes_json_markdown_and_plot(tmp_path, reference_checkout):
    lengths = [16, 32]
    result = speed.main(
        [
            "--quick",
            "--lengths", ",".join(map(str, lengths)),
            "--model-shapes", "2x16",
            "--model-modes", "forward,forward_backward",
            "--repeats", "2",
            "--out-dir", str(tmp_path),
            "--tag", "tiny",
            "--silent",
            "--rss",
            "--reference", str(reference_checkout),
        ]
    )
    records = result["records"]
    operator = [r for r in records if r["part"] == "operator"]
    for mode in MODES:
        impls = set(candidates.candidates_in("operator", mode, quick_settings("--reference", str(reference_checkout))))
        assert "orchid_reference" in impls
        assert impls >= {"orchid", "attention_sdpa", "attention_math"}
        if mode == "forward_backward":
            assert "orchid_optimized" not in impls  # the optimised copy does not train
        for impl in impls:
            points = sorted(r["length"] for r in operator if r["impl"] == impl and r["mode"] == mode)
            assert points == lengths, (impl, mode)
    for record in records:
        assert record["time_s"] > 0 and all(t > 0 for t in record["times_s"])
        if record["impl"] == "orchid_onnxruntime":  # ONNX Runtime allocates outside PyTorch: only the RSS sees it
            assert record["peak_bytes"] is None and record["later_peak_bytes"] is None
        else:
            assert record["peak_bytes"] > 0 and record["later_peak_bytes"] > 0
        assert record["rss_peak_bytes"] is not None
        assert not record["extrapolated"]
    model = {(r["impl"], r["mode"]) for r in records if r["part"] == "model"}
    forward = ("orchid", "orchid_optimized", "orchid_onnxruntime", "orchid_reference", "bert")
    assert model == {(impl, "forward") for impl in forward} | {
        (impl, "forward_backward") for impl in ("orchid", "orchid_reference", "bert")
    }
    summary = result["summary"]
    assert summary["exponents"]["orchid/forward"]["points"] == len(lengths)
    assert set(summary["model_speedups"]["forward"]["2x16"]) >= {
        "orchid", "orchid_optimized", "orchid_onnxruntime", "reference_ratio"}
    assert summary["model_speedups"]["forward"]["2x16"]["orchid_onnxruntime"]["memory_ratio"] is None
    assert set(summary["model_speedups"]["forward_backward"]["2x16"]["reference_ratio"]) == {
        "orchid", "orchid_reference"}
    assert "targets" not in summary

    saved = json.loads((tmp_path / "benchmark_tiny.json").read_text())
    assert saved["finished"] and len(saved["records"]) == len(records)
    assert_records_where_it_was_made(saved)
    markdown = (tmp_path / "benchmark_tiny.md").read_text()
    assert f"commit {saved['commit'][:12]}" in markdown
    assert "## Operator, forward" in markdown and "## Model, forward, torch.float32, 2 layers" in markdown
    assert "## Model, forward + backward" in markdown and "Orchid, reference version" in markdown
    assert "Orchid speed-up over BertModel (SDPA)" in markdown
    assert "Orchid, ONNX Runtime: allocates outside PyTorch, so its memory is not measured" in markdown
    assert " met" not in markdown and "target" not in markdown.lower()
    assert (tmp_path / "benchmark_tiny.png").stat().st_size > 10_000


def assert_records_where_it_was_made(result: dict) -> None:
    """A benchmark's JSON records the commit, whether the tree had changes, and the machine (benchmarks/harness.py)."""
    assert len(result["commit"]) == 40 and isinstance(result["uncommitted_changes"], bool)
    assert result["machine"]["device"] == "cpu" and result["machine"]["torch"] == torch.__version__


def test_the_reference_is_another_package_built_through_its_own_public_classes(reference_checkout):
    reference = candidates.load_modeling(reference_checkout)
    assert reference.__name__ == "orchid_reference" and reference.OrchidModel.__module__.startswith("orchid_reference")
    model = candidates.build_model("orchid_reference", True, 32, reference)
    assert type(model) is reference.OrchidModel
    assert candidates.modeling_folder(reference_checkout / "modeling") == (reference_checkout / "modeling").resolve()
    with pytest.raises(ValueError, match=r"holds no Orchid model code \(modeling/modeling_orchid.py\)"):
        candidates.modeling_folder(reference_checkout.parent)


def test_a_reference_with_smaller_default_filters_is_built_with_this_versions_filter_sizes(tmp_path):
    # An older version whose presets and operator defaults had filters of width 64 with one inner layer.
    layers_file = copy_modeling(tmp_path) / "modeling" / "orchid_layers.py"
    source = layers_file.read_text()
    assert "    filter_width: int = 128\n    filter_depth: int = 2\n" in source
    layers_file.write_text(source.replace("filter_width: int = 128", "filter_width: int = 64").replace(
        "filter_depth: int = 2", "filter_depth: int = 1"))
    reference = candidates.load_modeling(tmp_path, name="orchid_smaller_filters")
    assert reference.OrchidConfig.from_preset("orchid-bert-base").filter_width == 64

    def linear_shapes(implicit_filter):
        return [tuple(layer.weight.shape) for layer in implicit_filter.ffn if isinstance(layer, torch.nn.Linear)]

    ours = linear_shapes(candidates.build_model("orchid", True, 32).encoder.layer[0].mixer.static_filter)
    assert ours == [(128, 5), (128, 128), (128, 128), (64, 128)]
    model = candidates.build_model("orchid_reference", True, 32, reference)
    assert linear_shapes(model.encoder.layer[0].mixer.static_filter) == ours
    masked_lm = candidates.build_masked_lm("orchid_reference", True, 32, reference)
    assert linear_shapes(masked_lm.orchid.encoder.layer[0].mixer.residual_filter) == ours
    operator = candidates.build_operator("orchid_reference", 64, 4, 32, reference)
    our_operator = candidates.build_operator("orchid", 64, 4, 32)
    assert linear_shapes(operator.static_filter) == linear_shapes(our_operator.static_filter)


@pytest.mark.slow
def test_a_failing_candidate_is_reported_and_the_others_are_measured():
    settings = quick_settings("--repeats", "2")
    workers = measure.Workers(settings)
    try:
        worker = workers.get_worker("orchid")
        spec = dict(part="operator", mode="forward", length=2, batch=1, hidden=8, heads=2, quick=True)
        with pytest.raises(measure.WorkerFailure, match=r"short_conv_size=3 is longer") as failure:
            worker.request("build", spec=dict(spec, impl="orchid"))
        assert failure.value.reason.startswith("ValueError: OrchidOperator.short_conv_size=3")
        # A length the operator refuses: Orchid fails at this point, attention is measured, Orchid runs at the next.
        out = measure.measure_point(workers, ["orchid", "attention_sdpa"], spec, settings)
        assert out["orchid"] == {"failed": failure.value.reason}
        assert len(out["attention_sdpa"]["times_s"]) == 2
        out = measure.measure_point(workers, ["orchid"], dict(spec, length=8), settings)
        assert len(out["orchid"]["times_s"]) == 2
    finally:
        workers.close()
    record = parts.failed_record("model", "bert", "forward", 1, 16384, "killed (signal 9: out of memory?)")
    ok = dict(part="model", impl="orchid", mode="forward", batch=1, length=16384, time_s=1.0, times_s=[1.0],
              peak_bytes=1, single_call=False, extrapolated=False, load=[1.0, 1.0])
    settings = dataclasses.replace(settings, model_shapes=[(1, 16384)], layers=12)
    result = dict(config=settings.to_json(), records=[ok, record], tag="", machine={"torch": "x"},
                  started="", load=[1.0, 1.0], command="")
    result["summary"] = report.summarize(result["records"], settings)
    assert result["summary"]["model_speedups"] == {}  # no BERT time, no speed-up
    markdown = report.markdown_report(result, settings)
    assert "| (1, 16384) | 1,000.0 | failed² |" in markdown
    assert "² failed: BertModel (SDPA) at (B=1, L=16384): killed (signal 9: out of memory?)." in markdown
    # Where BERT has no time, the comparison with the reference version still counts.
    training = [dict(r, mode="forward_backward") for r in (ok, record)]
    training.append(dict(training[0], impl="orchid_reference", time_s=2.0, times_s=[2.0]))
    summary = report.summarize(training, settings)
    assert summary["model_speedups"] == {
        "forward_backward": {"1x16384": {"reference_ratio": {"orchid": 2.0, "orchid_reference": 1.0}}}
    }


def test_operator_memory_grows_with_length_and_attention_math_fastest():
    # Peak tensor memory of one forward call: linear for Orchid, quadratic for materialised attention.
    peaks = {}
    for impl in ("orchid", "attention_math"):
        for length in (64, 256):
            module = candidates.build_operator(impl, 32, 4, length)
            step = candidates.make_step(module, "forward", torch.randn(1, length, 32), is_model=False)
            peaks[impl, length] = harness.profiled_peak_bytes(step)
    assert peaks["orchid", 256] > peaks["orchid", 64]
    assert peaks["attention_math", 256] / peaks["attention_math", 64] > peaks["orchid", 256] / peaks["orchid", 64]


def test_pocketfft_results_are_counted_by_the_memory_profile():
    # pocketfft writes into tensors of torch's own, so the profiler that measures peak memory sees them.
    from orchid_hf.modeling.orchid_ops import dct

    x = torch.randn(1, 4096, 16)
    with torch.no_grad():
        peak = harness.profiled_peak_bytes(lambda: dct(x, dim=1))
    assert peak >= x.numel() * x.element_size()


def test_power_law_fit_recovers_the_exponent():
    lengths = [1024, 2048, 4096, 8192]
    slope, intercept = harness.fit_power_law(lengths, [3e-6 * n**1.5 for n in lengths])
    assert slope == pytest.approx(1.5)
    assert harness.fit_power_law([1024], [1.0]) is None


def test_math_attention_memory_guard_is_quadratic():
    assert measure.math_attention_bytes(1, 12, 2 * 4096, "forward") == 4 * measure.math_attention_bytes(
        1, 12, 4096, "forward"
    )


def test_model_speedups_are_the_baselines_time_over_each_candidates_and_no_targets_are_judged():
    records = [
        dict(part="model", impl=impl, mode="forward", batch=1, length=16384, time_s=time_s, peak_bytes=peak)
        for impl, time_s, peak in (("orchid", 1.0, 2**20), ("orchid_optimized", 0.5, 2**19), ("bert", 5.99996, 2**22))
    ]
    settings = dataclasses.replace(BenchmarkSettings(), modes=["forward"], model_shapes=[(1, 16384)])
    summary = report.summarize(records, settings)
    assert summary["model_speedups"]["forward"]["1x16384"] == {
        "orchid": {"speedup": 6.0, "memory_ratio": 0.25},  # rounded for the JSON
        "orchid_optimized": {"speedup": 12.0, "memory_ratio": 0.125},
    }
    assert set(summary) == {"exponents", "model_speedups", "memory_ratios", "train_speedups"}
    assert report.format_ratio(5.99964) == "6.00x" and report.format_ratio(0.5004) == "0.50x"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--parts", "operatr"],
         "parts must be comma-separated names from ('operator', 'model', 'train'), got 'operatr'"),
        (["--parts", "model,"], "parts must be"),
        (["--model-modes", "train"], "model_modes must be comma-separated names from ('forward', 'forward_backward')"),
        (["--lengths", "1024,-4"], "lengths must be comma-separated positive integers, e.g. 1024,4096; got '1024,-4'"),
        (["--lengths", "1k"], "lengths must be"),
        (["--model-shapes", "8x128,1x"], "model_shapes must be comma-separated BxL with positive B and L"),
        (["--model-shapes", "8x0"], "model_shapes must be"),
        (["--profile", "1x4096x2"], "profile must be comma-separated BxL"),
        (["--train-shapes", "8x128,1x"], "train_shapes must be comma-separated BxL with positive B and L"),
        (["--train-shapes", "0x16"], "train_shapes must be"),
        (["--parts", "train", "--train-shapes", "8,128"], "train_shapes must be"),
        (["--profile-train", "2x16x1"], "profile_train must be comma-separated BxL"),
        (["--thread-scaling", "2x16"],
         "thread_scaling compares 1 thread with --threads, which must be at least 2, got 1"),
        (["--thread-scaling", "2x", "--threads", "2"], "thread_scaling must be comma-separated BxL"),
        (["--repeats", "0"], "repeats must be at least 1, got 0"),
        (["--threads", "0"], "threads must be at least 1, got 0"),
        (["--max-call-s", "0"], "max_call_s must be positive, got 0.0"),
        (["--point-budget-s", "-1"], "point_budget_s must be positive, got -1.0"),
        (["--device", "tpu"], "device must be cpu or cuda (optionally cuda:N), got 'tpu'"),
        (["--reference", "/nonexistent/checkout"], "holds no Orchid model code"),
    ],
)
def test_bad_arguments_are_refused_by_name_before_anything_runs(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        speed.main(["--quick", "--silent", "--out-dir", str(tmp_path), *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_cuda_device_without_cuda_is_refused_with_a_clear_message(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = speed.parse_args(["--quick"])
    args.device = "cuda"
    with pytest.raises(ValueError, match="device 'cuda' asked for, but this torch build sees no CUDA device"):
        BenchmarkSettings.from_args(args)


def test_shapes_and_lengths_parse():
    assert parse_shapes("8x128,1x4096") == [(8, 128), (1, 4096)]
    assert parse_lengths("1024,4096") == [1024, 4096]


# ---------------------------------------------------------------------------------------------
# The train part
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_train_part_runs_at_tiny_sizes_and_reports_every_candidate_and_shape(tmp_path, reference_checkout):
    shapes = [(2, 16), (1, 32)]
    result = speed.main(["--quick", "--parts", "train", "--train-shapes", "2x16,1x32", "--repeats", "2",
                             "--out-dir", str(tmp_path), "--tag", "train", "--silent",
                             "--reference", str(reference_checkout)])
    records = result["records"]
    assert {r["part"] for r in records} == {"train"}
    found = sorted((r["level"], r["impl"], r["batch"], r["length"]) for r in records)
    expected = {"model": ("orchid", "orchid_reference", "bert"), "operator": ("orchid", "orchid_reference",
                                                                           "attention_sdpa")}
    assert found == sorted((level, impl, *shape) for level, impls in expected.items() for impl in impls
                           for shape in shapes)
    for record in records:
        assert not record.get("failed") and record["mode"] == "forward_backward"
        assert len(record["times_s"]) == 2 and all(t > 0 for t in record["times_s"])
        assert record["time_s"] == pytest.approx(sum(record["times_s"]) / 2)  # the median of two rounds
        assert record["peak_bytes"] > 0
        if record["level"] == "model":  # the optimizer step after each timed backward, timed apart
            assert len(record["optimizer_times_s"]) == 2 and all(t > 0 for t in record["optimizer_times_s"])
            assert record["optimizer_time_s"] == pytest.approx(sum(record["optimizer_times_s"]) / 2)
        else:
            assert "optimizer_time_s" not in record and record["hidden"] == 64
    speedups = result["summary"]["train_speedups"]
    for level, baseline in {"model": "bert", "operator": "attention_sdpa"}.items():
        assert candidates.baseline_of(f"train_{level}") == baseline
        assert set(speedups[level]) == {"2x16", "1x32"}
        for batch, length in shapes:
            point = {r["impl"]: r for r in records if r["level"] == level and (r["batch"], r["length"]) == (batch,
                                                                                                             length)}
            entry = speedups[level][f"{batch}x{length}"]["orchid"]
            assert entry["speedup"] == round(point[baseline]["time_s"] / point["orchid"]["time_s"], 3)
            assert entry["memory_ratio"] == round(point["orchid"]["peak_bytes"] / point[baseline]["peak_bytes"], 3)
            if level == "model":
                assert entry["optimizer_speedup"] == round(
                    point["bert"]["optimizer_time_s"] / point["orchid"]["optimizer_time_s"], 3)
            reference = speedups[level][f"{batch}x{length}"]["reference_ratio"]
            assert reference["orchid"] == round(point["orchid_reference"]["time_s"] / point["orchid"]["time_s"], 3)
    assert "targets" not in result["summary"]

    saved = json.loads((tmp_path / "benchmark_train.json").read_text())
    assert saved["finished"] and saved["records"] == records and saved["config"]["train_shapes"] == [[2, 16], [1, 32]]
    markdown = (tmp_path / "benchmark_train.md").read_text()
    model_title = ("## Training step, model, torch.float32, 2 layers, dropout 0: OrchidForMaskedLM vs "
                   "BertForMaskedLM (SDPA)")
    assert model_title in markdown and "OrchidForMaskedLM optimizer step ms" in markdown
    assert "OrchidForMaskedLM, reference version ms" in markdown and "Orchid, reference version ms" in markdown
    assert "## Training step, operator alone, forward + backward (hidden 64): Orchid vs Attention (SDPA" in markdown
    rows = [line for line in markdown.splitlines() if line.startswith(("| (2, 16) |", "| (1, 32) |"))]
    assert len(rows) == 4  # two shapes at each level
    assert not (tmp_path / "benchmark_train.png").exists()  # the plot is the operator part's


@pytest.mark.parametrize("impl", ["orchid", "bert"])
def test_the_training_step_backpropagates_the_models_own_loss_and_the_optimizer_steps(impl):
    torch.manual_seed(0)
    model = candidates.build_masked_lm(impl, quick=True, length=16, layers=1)
    assert type(model).__name__ == ("OrchidForMaskedLM" if impl == "orchid" else "BertForMaskedLM")
    assert all(m.p == 0 for m in model.modules() if isinstance(m, torch.nn.Dropout))  # dropout off in both
    if impl == "bert":
        assert model.config._attn_implementation == "sdpa" and model.config.num_attention_heads == 4
    input_ids, labels = candidates.mlm_batch(model.config.vocab_size, 2, 16)
    step, optimizer_step = candidates.make_train_step(model, input_ids, labels)
    assert model.training
    step()
    parameters = dict(model.named_parameters())
    assert all(p.grad is not None for p in parameters.values())  # the loss reaches every parameter
    assert all(torch.isfinite(p.grad).all() for p in parameters.values())
    assert any(p.grad.abs().sum() > 0 for p in parameters.values())
    before = {name: p.detach().clone() for name, p in parameters.items()}
    optimizer_step()
    assert all(p.grad is None for p in parameters.values())  # zero_grad(set_to_none=True)
    assert any(not torch.equal(before[name], p) for name, p in parameters.items())
    step()  # a second step starts from no gradients again
    assert all(p.grad is not None for p in parameters.values())


def test_the_mlm_batch_is_seeded_the_same_for_every_model_and_labels_a_share_of_positions():
    input_ids, labels = candidates.mlm_batch(1000, 8, 128)
    again = candidates.mlm_batch(1000, 8, 128)
    assert torch.equal(input_ids, again[0]) and torch.equal(labels, again[1])
    assert input_ids.shape == labels.shape == (8, 128) and input_ids.min() >= 1 and input_ids.max() < 1000
    labelled = labels != -100
    assert torch.equal(labels[labelled], input_ids[labelled])
    assert 0.1 < labelled.float().mean() < 0.2
    assert (candidates.mlm_batch(1000, 1, 2)[1] != -100).any()  # never a loss over no position


@pytest.mark.slow
def test_a_reference_without_a_masked_lm_is_reported_as_failed_in_the_train_part(tmp_path, reference_checkout):
    reference = candidates.load_modeling(reference_checkout)
    assert type(candidates.build_masked_lm("orchid_reference", True, 16, reference)) is reference.OrchidForMaskedLM
    older = tmp_path / "older"
    shutil.copytree(reference_checkout / "modeling", older / "modeling")
    with open(older / "modeling" / "__init__.py", "a") as init:
        init.write("\ndel OrchidForMaskedLM\n")  # as a version from before the class
    settings = quick_settings("--repeats", "2", "--reference", str(older))
    workers = measure.Workers(settings)
    spec = dict(part="train", mode="forward_backward", batch=2, length=16, quick=True, layers=1, hidden=16, heads=2)
    try:
        out = measure.measure_point(workers, ["orchid_reference"], dict(spec, level="model"), settings)
    finally:
        workers.close()
    reason = "ValueError: the model code orchid_reference has no OrchidForMaskedLM"
    assert out == {"orchid_reference": {"failed": reason}}
    record = parts.point_record("train", "orchid_reference", "forward_backward", 2, 16, out["orchid_reference"],
                                    [0.0, 0.0], level="model")
    assert record["failed"] == reason and record["time_s"] is None and record["level"] == "model"


def test_train_ratios_are_reported_only_where_both_models_were_measured():
    def record(impl, batch, length, time_s, peak, **fields):
        return dict(part="train", level="model", impl=impl, mode="forward_backward", batch=batch, length=length,
                    time_s=time_s, times_s=[time_s], peak_bytes=peak, optimizer_time_s=0.1, optimizer_times_s=[0.1],
                    single_call=False, extrapolated=False, load=[1.0, 1.0], **fields)

    records = [
        record("orchid", 8, 128, 1.0, 100), record("bert", 8, 128, 1.39996, 90),
        record("orchid", 1, 16384, 1.0, 50_020), record("bert", 1, 16384, 6.0, 100_000),
    ]
    settings = dataclasses.replace(BenchmarkSettings(), modes=["forward"], model_shapes=[])
    summary = report.summarize(records, settings)
    assert summary["train_speedups"]["model"]["8x128"]["orchid"] == {
        "speedup": 1.4, "memory_ratio": 1.111, "optimizer_speedup": 1.0}  # rounded for the JSON
    assert summary["train_speedups"]["model"]["1x16384"]["orchid"]["memory_ratio"] == 0.5
    # The same ratios at any depth: they are reported, not judged.
    assert report.summarize(records, dataclasses.replace(settings, layers=2)) == summary
    # BERT out of memory at 16K: no ratio there; the table says why.
    records[3] = parts.failed_record("train", "bert", "forward_backward", 1, 16384, "killed", level="model")
    summary = report.summarize(records, settings)
    assert set(summary["train_speedups"]["model"]) == {"8x128"}
    markdown = "\n".join(report.train_markdown(records, settings))
    assert "OrchidForMaskedLM speed-up over BertForMaskedLM (SDPA)" in markdown
    assert "| (8, 128) | 1,000.0 | 1,400.0 | 1.40x | 100.0 | 100.0 | 0.0 | 0.0 | 1.11x | 1.0-1.0 |" in markdown
    assert "| (1, 16384) | 1,000.0 | failed² | - | 100.0 | failed² | 0.0 | failed² | - | 1.0-1.0 |" in markdown
    assert "² failed: BertForMaskedLM (SDPA) at (B=1, L=16384): killed." in markdown


def test_activations_writes_only_the_table_of_what_each_layer_keeps(tmp_path):
    result = speed.main(["--quick", "--activations", "2x16,1x32", "--out-dir", str(tmp_path), "--tag", "a",
                         "--silent"])
    assert result["records"] == []
    text = (tmp_path / "profile_a.md").read_text()
    assert "### Activations kept for backward, per layer" in text and "training step" not in text
    rows = [line for line in text.splitlines() if line.startswith("| (") and not line.startswith("| (B")]
    assert [row.split(" | ")[0] for row in rows] == ["| (2, 16)", "| (1, 32)"]
    for row in rows:  # MiB (units) for Orchid and BERT, each a positive count
        cells = row.strip("| ").split(" | ")[1:]
        assert len(cells) == 2 and all(float(cell.split(" (")[1].rstrip(")")) > 1 for cell in cells)


@pytest.mark.slow
def test_profile_train_writes_a_table_of_the_training_steps_top_ops(tmp_path, capsys):
    result = speed.main(["--quick", "--profile-train", "2x16", "--out-dir", str(tmp_path), "--tag", "t"])
    assert result["records"] == []  # profiling instead of timing
    profile, saved = (tmp_path / "profile_t.md").read_text().split("### Activations kept for backward, per layer")
    title = "### OrchidForMaskedLM, training step (forward + backward), 2 layers, (B=2, L=16): "
    assert title in profile
    assert "| (2, 16) | " in saved and "BertForMaskedLM (SDPA) MiB" in saved
    rows = [line for line in profile.splitlines() if line.startswith("| ") and not line.startswith("| op |")]
    assert len(rows) == 15 and any("Backward" in row for row in rows)  # the backward's ops are in it
    assert all(row.rstrip(" |").split(" | ")[-1].isdigit() for row in rows)  # calls per call
    assert title in capsys.readouterr().out  # printed too
    assert not (tmp_path / "benchmark_t.json").exists()


def test_flops_counts_the_matrix_products_of_both_training_steps(tmp_path):
    import orchid_hf

    speed.main(["--quick", "--flops", "2x16", "--layers", "1", "--out-dir", str(tmp_path), "--tag", "f", "--silent"])
    table = (tmp_path / "profile_f.md").read_text().split("### Training-step GFLOPs")[1]
    header, row = [line for line in table.splitlines() if line.startswith("| (")]
    assert header.startswith("| (B, L) | OrchidForMaskedLM | BertForMaskedLM (SDPA) | ")
    settings = quick_settings("--layers", "1")
    orchid = profiles.training_step_flops("orchid", 2, 16, settings)
    bert = profiles.training_step_flops("bert", 2, 16, settings)
    assert row.rstrip(" |").endswith(f" | {bert / orchid:.2f}x")
    # Both steps hold the MLM head's decoder over every position: its forward (2 * tokens * hidden * vocab) and the
    # two products of its backward, and more besides.
    config = candidates.orchid_config(orchid_hf, settings.quick, 16, settings.layers)
    head_forward = 2 * 2 * 16 * config.hidden_size * config.vocab_size
    assert orchid > 3 * head_forward and bert > 3 * head_forward


@pytest.mark.slow
def test_thread_scaling_profiles_both_masked_lms_at_one_thread_and_at_threads(tmp_path):
    try:
        result = speed.main(["--quick", "--thread-scaling", "2x16", "--threads", "2", "--out-dir", str(tmp_path),
                             "--tag", "t", "--silent"])
        assert torch.get_num_threads() == 2  # the run's own count, restored after the 1-thread profile
    finally:
        torch.set_num_threads(1)
    assert result["records"] == []
    profile = (tmp_path / "profile_t.md").read_text()
    for label in ("OrchidForMaskedLM", "BertForMaskedLM"):
        assert f"### {label}" in profile and "ms at 1 thread, " in profile
    tables = profile.split("### ")[1:]
    assert len(tables) == 2
    for table in tables:
        rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
        assert len(rows) == 15
        kept = [float(row[4].replace(",", "")) for row in rows]
        assert kept == sorted(kept, reverse=True)  # the ops that keep most over a perfect split first
        for row in rows:
            one, two = float(row[1].replace(",", "")), float(row[2].replace(",", ""))
            assert float(row[4].replace(",", "")) == pytest.approx(two - one / 2, abs=0.011)


def test_saved_bytes_per_layer_counts_what_one_layer_saves_for_backward():
    """The two-layer-minus-one-layer count equals a direct count of what one OrchidLayer's forward keeps alive."""
    per_layer = profiles.saved_bytes_per_layer("orchid", 2, 16, quick_settings())
    torch.manual_seed(0)
    model = candidates.build_masked_lm("orchid", True, 16, layers=1).train()
    hidden = torch.randn(2, 16, model.config.hidden_size, requires_grad=True)
    layout = SequenceLayout.from_mask(None, (16,), (2, 16), hidden.device)  # every position a token, one group
    assert per_layer == measure.retained_bytes(model.orchid.encoder.layer[0], hidden, layout) > 0


@pytest.mark.slow
def test_train_checkpointing_adds_a_candidate_with_the_plain_models_gradients():
    settings = quick_settings("--train-checkpointing")
    assert candidates.candidates_in("train_model", "forward_backward", settings) == [
        "orchid", "orchid_checkpointing", "bert"]
    assert candidates.candidates_in("train_operator", "forward_backward", settings) == ["orchid", "attention_sdpa"]
    assert "orchid_checkpointing" not in candidates.candidates_in("train_model", "forward_backward", quick_settings())
    grads = {}
    for impl in ("orchid", "orchid_checkpointing"):
        torch.manual_seed(0)
        model = candidates.build_masked_lm(impl, True, 16, layers=2)
        name = "is_activation_checkpointing" if hasattr(type(model), "is_activation_checkpointing") else (
            "is_gradient_checkpointing"
        )
        assert getattr(model, name) == (impl == "orchid_checkpointing")
        step, _ = candidates.make_train_step(model, *candidates.mlm_batch(model.config.vocab_size, 2, 16))
        step()
        grads[impl] = {name: p.grad for name, p in model.named_parameters()}
    for name, grad in grads["orchid"].items():
        torch.testing.assert_close(grads["orchid_checkpointing"][name], grad, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
def test_profile_times_the_plain_models_implicit_filters(tmp_path, capsys):
    result = speed.main(["--quick", "--profile", "2x16", "--out-dir", str(tmp_path), "--tag", "t"])
    assert result["records"] == []
    profile = (tmp_path / "profile_t.md").read_text()
    table = profile.split("### The plain model's implicit filters, computed on every forward call (2 layers)")[1]
    row = next(line for line in table.splitlines() if line.startswith("| (2, 16) | "))
    forward_ms, filters_ms, share = row.replace(",", "").strip("| ").split(" | ")[1:]  # no thousands separators
    assert float(forward_ms) > 0 and filters_ms.endswith("(4 filters)") and float(filters_ms.split()[0]) > 0
    assert share.endswith("%")
    assert "### Orchid, (B=2, L=16)" in profile  # the operator's op table is still there
    assert "implicit filters" in capsys.readouterr().out


def test_the_registry_declares_what_each_candidate_builds_and_refuses_the_rest():
    assert candidates.candidates_in("model", "forward") == ["orchid", "orchid_optimized", "orchid_onnxruntime", "bert"]
    assert candidates.candidates_in("model", "forward_backward") == ["orchid", "bert"]
    assert candidates.candidates_in("operator", "forward_backward") == ["orchid", "attention_sdpa", "attention_math"]
    assert {table: candidates.baseline_of(table) for table in candidates.TABLES} == {
        "operator": "attention_sdpa", "model": "bert", "train_model": "bert", "train_operator": "attention_sdpa"}
    with pytest.raises(ValueError, match=r"candidate attention_sdpa builds no masked_lm \(it builds operator\)"):
        candidates.build_masked_lm("attention_sdpa", True, 16)
    with pytest.raises(ValueError, match=r"candidate x runs in \['model'\] but builds only \['operator'\]"):
        candidates.Candidate("x", "X", dict(operator=lambda *args: None), tables=("model",))


def test_the_onnxruntime_candidate_runs_only_where_onnxruntime_is_installed(monkeypatch):
    real_find_spec = candidates.importlib.util.find_spec
    monkeypatch.setattr(candidates.importlib.util, "find_spec",
                        lambda name, *args: None if name == "onnxruntime" else real_find_spec(name, *args))
    assert candidates.candidates_in("model", "forward") == ["orchid", "orchid_optimized", "bert"]
    assert quick_settings().to_json()["model_impls"] == ["orchid", "orchid_optimized", "bert"]


def test_the_settings_are_written_to_the_json_with_the_fields_readers_expect():
    config = quick_settings("--parts", "model,train", "--model-shapes", "2x16").to_json()
    assert set(config) == {
        "quick", "parts", "hidden", "heads", "lengths", "modes", "model_modes", "operator_impls", "model_impls",
        "model_shapes", "train_shapes", "train_checkpointing", "compiled", "layers", "profile_shapes",
        "profile_train_shapes", "activation_shapes", "thread_scaling_shapes", "flop_shapes", "repeats", "min_repeats",
        "point_budget_s",
        "max_call_s", "threads", "rss", "device", "dtype", "reference", "exponent_range", "memory_length",
    }
    assert config["operator_impls"] == ["orchid", "orchid_optimized", "attention_sdpa", "attention_math"]
    assert config["model_impls"] == ["orchid", "orchid_optimized", "orchid_onnxruntime", "bert"]
    assert config["parts"] == ["model", "train"] and config["model_shapes"] == [(2, 16)]
    assert config["dtype"] == "torch.float32" and config["exponent_range"] == [64, 256]
    json.dumps(config)  # every value is JSON


@pytest.mark.slow
@pytest.mark.parametrize("head,checkpointing", [("sequence-classification", True), ("masked-lm", False)])
def test_long_step_runs_one_training_step_and_writes_what_it_measured(tmp_path, head, checkpointing):
    from benchmarks import long_step

    argv = ["--head", head, "--length", "64", "--layers", "1", "--out-dir", str(tmp_path)]
    result = long_step.main(argv + (["--checkpointing"] if checkpointing else []))
    name = f"long_step_{head}_64{'_checkpointing' if checkpointing else ''}.json"
    assert json.loads((tmp_path / name).read_text()) == json.loads(json.dumps(result))
    assert_records_where_it_was_made(result)
    assert result["length"] == 64 and result["checkpointing"] is checkpointing and result["seconds"] > 0
    assert math.isfinite(result["loss"]) and result["rss_peak_bytes"] >= 0 and result["parameters"] > 10**7


def test_pretraining_throughput_counts_the_steps_after_the_warm_up():
    from benchmarks.pretraining import throughput

    history = [{"loss": 9.0, "step": s, "train_seconds": 0.5 * s + (3.0 if s > 1 else 0.0)} for s in range(1, 7)]
    history.append({"train_runtime": 9.9, "step": 6})  # Trainer's summary entry carries no per-step clock
    result = throughput(history, warmup_steps=2, tokens_per_step=1024)
    assert result["steps"] == 4 and result["seconds"] == pytest.approx(2.0)
    assert result["tokens_per_second"] == pytest.approx(4 * 1024 / 2.0)
    with pytest.raises(ValueError, match="needs step 6"):
        throughput(history, warmup_steps=6, tokens_per_step=1024)


@pytest.mark.slow
def test_pretraining_throughput_runs_both_models_through_the_recipe(tmp_path):
    from benchmarks import pretraining
    from orchid_hf.demo_data import make_corpus

    (tmp_path / "train.txt").write_text("\n".join(make_corpus(80, seed=0)) + "\n")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *sorted({w for t in make_corpus(80, seed=0)
                                                                   for w in t.lower().split()})]
    (tmp_path / "vocab").mkdir()
    (tmp_path / "vocab" / "vocab.txt").write_text("\n".join(vocab) + "\n")
    argv = ["--train_file", str(tmp_path / "train.txt"), "--tokenizer_name", str(tmp_path / "vocab"), "--layers", "1",
            "--max_seq_length", "32", "--batch_size", "2", "--steps", "3", "--out-dir", str(tmp_path / "out")]
    result = pretraining.main(argv)
    written = json.loads((tmp_path / "out" / "pretraining_throughput_2x32_threads1.json").read_text())
    assert written == json.loads(json.dumps(result))
    assert_records_where_it_was_made(written)
    for model in ("orchid", "bert"):
        run = result["runs"][model]
        assert run["steps"] == 3 and run["tokens_per_second"] > 0 and 0 < run["final_loss"] < 100
    assert result["runs"]["orchid"]["num_parameters"] != result["runs"]["bert"]["num_parameters"]
    assert result["orchid_over_bert"] == pytest.approx(
        result["runs"]["orchid"]["tokens_per_second"] / result["runs"]["bert"]["tokens_per_second"])


@pytest.mark.parametrize("groups", [1, 4])
def test_convolution_backward_flops_are_twice_the_forwards_for_dense_and_depthwise_convolutions(groups):
    from torch.utils.flop_counter import FlopCounterMode

    conv = torch.nn.Conv1d(8, 8, 3, padding=2, groups=groups)
    x = torch.randn(2, 8, 16, requires_grad=True)
    mapping = {torch.ops.aten.convolution_backward: profiles.convolution_backward_flops}
    with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        out = conv(x)
        forward = counter.get_total_flops()
        out.sum().backward()
    assert forward == 2 * 2 * 8 * (8 // groups) * 3 * 18  # multiply-adds of every output position, times 2
    assert counter.get_total_flops() == 3 * forward  # the input's and the weight's gradients


def test_sdpa_on_the_cpu_is_counted_as_its_gpu_kernels_are():
    from torch.utils.flop_counter import FlopCounterMode

    q, k, v = (torch.randn(2, 3, 16, 8, requires_grad=True) for _ in range(3))
    with FlopCounterMode(display=False, custom_mapping=profiles.FLOP_FORMULAS) as counter:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        forward = counter.get_total_flops()
        out.sum().backward()
    assert forward == 2 * (2 * 2 * 3 * 16 * 16 * 8)  # q k^T and the weighted sum of v
    # Backward: the scores recomputed, the gradients of v, of the scores, of q and of k: five products of the size of
    # each of the forward's two.
    assert counter.get_total_flops() == forward + 5 * forward // 2


# ---------------------------------------------------------------------------------------------
# The small-model step and the cost of lengths (scripts/small_step.py, scripts/lengths_benchmark.py)
# ---------------------------------------------------------------------------------------------


def test_the_small_step_benchmark_times_every_model_against_its_baseline(tmp_path):
    from benchmarks import small_step

    result = small_step.main(["--repeats", "2", "--warmup", "1", "--out-dir", str(tmp_path), "--tag", "t"])
    rows = {(row["task"], row["model"]): row for row in result["rows"]}
    assert set(rows) == {("image", "Orchid"), ("image", "ViTForImageClassification"), ("text", "Orchid"),
                         ("text", "BertForMaskedLM (SDPA)")}
    assert all(len(row["times_s"]) == 2 and row["median_s"] > 0 for row in rows.values())
    assert rows["image", "ViTForImageClassification"]["speed_up"] == 1.0
    assert "| image | Orchid |" in (tmp_path / "small_step_t.md").read_text()
    assert_records_where_it_was_made(json.loads((tmp_path / "small_step_t.json").read_text()))


def test_the_lengths_benchmark_at_toy_sizes(tmp_path, monkeypatch):
    from benchmarks import lengths

    monkeypatch.setattr(lengths, "HIDDEN", 32)
    monkeypatch.setattr(lengths, "HEADS", 2)
    monkeypatch.setattr(lengths, "INTERMEDIATE", 64)
    monkeypatch.setattr(lengths, "VOCAB", 50)
    monkeypatch.setattr(lengths, "SHORT_POSITIONS", (128, 512))
    monkeypatch.setattr(lengths, "MIXED_POSITIONS", 512)
    monkeypatch.setattr(lengths, "MIXED_RANGE", (16, 512))
    monkeypatch.setattr(lengths, "orchid_model", lambda positions, layers: _tiny_orchid(positions, layers))
    result = lengths.main(["--layers", "1", "--repeats", "1", "--sequences", "6", "--batch", "3",
                           "--parts", "short,mixed,mixed-profile", "--out-dir", str(tmp_path)])
    short = [row for row in result["rows"] if row["part"] == "short"]
    assert [(row["model"], row["positions"]) for row in short] == [
        ("Orchid", 128), ("Orchid", 512), ("BERT (SDPA)", 128), ("BERT (SDPA)", 512)]
    assert all(row["ratio_to_128"] > 0 for row in short) and short[0]["ratio_to_128"] == 1.0
    mixed = {row["model"]: row for row in result["rows"] if row["part"] == "mixed"}
    assert list(mixed) == ["Orchid, padded", "Orchid, packed", "Orchid, one sequence a call", "BERT (SDPA), padded"]
    assert len({row["tokens"] for row in mixed.values()}) == 1 and mixed["Orchid, padded"]["tokens"] > 0
    assert mixed["BERT (SDPA), padded"]["throughput_to_bert"] == 1.0
    assert mixed["Orchid, one sequence a call"]["throughput_to_full_rows"] == 1.0
    assert all(row["peak_bytes"] > 0 for row in mixed.values())
    assert mixed["Orchid, packed"]["largest_batch"][0] == 1  # one row
    profile = [row for row in result["rows"] if row["part"] == "mixed_profile"]
    assert profile[-1]["op"] == "total (wall)" and profile[-1]["padded_ms"] > 0 and profile[-1]["single_ms"] > 0
    differences = [row["padded_ms"] - row["single_ms"] for row in profile[:-1]]
    assert differences == sorted(differences, reverse=True) and len(profile) <= 13
    assert "| total (wall) |" in (tmp_path / "lengths.md").read_text()
    assert_records_where_it_was_made(json.loads((tmp_path / "lengths.json").read_text()))
    batches = lengths.mixed_workload(6, 3)
    assert [tuple(b["input_ids"].shape)[0] for b in batches] == [3, 3]
    assert all(16 <= int(n) <= 512 for b in batches for n in b["attention_mask"].sum(1))


def test_the_lengths_benchmark_packs_a_batch_as_the_flattening_collator_does():
    from transformers import DataCollatorWithFlattening

    from benchmarks import lengths

    batch = lengths.mixed_workload(3, 3)[0]
    real = [ids[mask.bool()].tolist() for ids, mask in zip(batch["input_ids"], batch["attention_mask"])]
    expected = DataCollatorWithFlattening()([{"input_ids": ids} for ids in real])
    packed = lengths.packed(batch)
    assert torch.equal(packed["input_ids"], expected["input_ids"])
    assert torch.equal(packed["position_ids"], expected["position_ids"])
    assert [single["input_ids"][0].tolist() for single in lengths.one_by_one(batch)] == real


@pytest.mark.slow
def test_the_fine_tuning_epoch_of_the_lengths_benchmark(tmp_path):
    from benchmarks import lengths
    from tests.test_needle import write_novel, write_vocabulary

    write_vocabulary(tmp_path / "tokenizer")
    write_novel(tmp_path / "novel.txt", seed=0)
    result = lengths.main(["--parts", "finetune", "--text-file", str(tmp_path / "novel.txt"), "--tokenizer",
                           str(tmp_path / "tokenizer"), "--fine-tune-size", "32", "1", "--max-length", "64",
                           "--batch", "4", "--out-dir", str(tmp_path)])  # fmt: skip
    rows = {row["model"]: row for row in result["rows"]}
    assert list(rows) == ["Orchid, dynamic padding", "Orchid, packed", "BERT (SDPA), dynamic padding"]
    padded, packed = rows["Orchid, dynamic padding"], rows["Orchid, packed"]
    assert padded["tokens"] == packed["tokens"] == rows["BERT (SDPA), dynamic padding"]["tokens"] > 0
    assert packed["padded_tokens"] == packed["tokens"] < padded["padded_tokens"]  # packing computes no padding
    # The same masks and the same model: packing changes nothing of the loss (mixing each sequence alone).
    assert packed["mean_loss"] == pytest.approx(padded["mean_loss"], rel=1e-4)
    assert "| Orchid, packed |" in (tmp_path / "lengths.md").read_text()


def _tiny_orchid(positions: int, layers: int):
    from orchid_hf import OrchidConfig, OrchidModel

    config = OrchidConfig(vocab_size=50, hidden_size=32, num_hidden_layers=layers, intermediate_size=64,
                          max_position_embeddings=positions, filter_width=16)
    return OrchidModel(config).eval()
