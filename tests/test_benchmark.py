"""The benchmark at tiny sizes (correctness only: no timing is asserted anywhere): candidates in worker processes of
their own, an older version of the model code as reference, the training step, reports, and arguments checked before
anything runs."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from benchmarks import speed as benchmark

MODELING = Path(benchmark.__file__).resolve().parent.parent / "modeling"


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


def test_benchmark_runs_at_tiny_sizes_and_writes_json_markdown_and_plot(tmp_path, reference_checkout):
    lengths = [16, 32]
    result = benchmark.main(
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
    for mode in benchmark.MODES:
        impls = set(benchmark.candidates(benchmark.build_config(benchmark.parse_args(["--quick"])), "operator", mode))
        impls.add("orchid_reference")
        if mode == "forward_backward":
            assert "orchid_optimized" not in impls  # the optimised copy does not train
        for impl in impls:
            points = sorted(r["length"] for r in operator if r["impl"] == impl and r["mode"] == mode)
            assert points == lengths, (impl, mode)
    for record in records:
        assert record["time_s"] > 0 and all(t > 0 for t in record["times_s"])
        assert record["peak_bytes"] > 0 and record["later_peak_bytes"] > 0
        assert record["rss_peak_bytes"] is not None
        assert not record["extrapolated"]
    model = {(r["impl"], r["mode"]) for r in records if r["part"] == "model"}
    assert model == {(impl, "forward") for impl in ("orchid", "orchid_optimized", "orchid_reference", "bert")} | {
        (impl, "forward_backward") for impl in ("orchid", "orchid_reference", "bert")
    }
    summary = result["summary"]
    assert summary["exponents"]["orchid/forward"]["points"] == len(lengths)
    assert set(summary["model_speedups"]["forward"]["2x16"]) >= {"orchid", "orchid_optimized", "reference_ratio"}
    assert "orchid_optimized forward 2x16 no slower than the reference" in summary["targets"]
    assert "orchid forward_backward 2x16 no slower than the reference" in summary["targets"]

    saved = json.loads((tmp_path / "benchmark_tiny.json").read_text())
    assert saved["finished"] and len(saved["records"]) == len(records)
    markdown = (tmp_path / "benchmark_tiny.md").read_text()
    assert "## Operator, forward" in markdown and "## Model, forward, torch.float32, 2 layers" in markdown
    assert "## Model, forward + backward" in markdown and "Orchid, reference version" in markdown
    assert (tmp_path / "benchmark_tiny.png").stat().st_size > 10_000


def test_the_reference_is_another_package_built_through_its_own_public_classes(reference_checkout):
    reference = benchmark.load_modeling(reference_checkout)
    assert reference.__name__ == "orchid_reference" and reference.OrchidModel.__module__.startswith("orchid_reference")
    model = benchmark.build_model("orchid_reference", True, 32, reference)
    assert type(model) is reference.OrchidModel
    assert benchmark.modeling_folder(reference_checkout / "modeling") == (reference_checkout / "modeling").resolve()
    with pytest.raises(ValueError, match=r"holds no Orchid model code \(modeling/modeling_orchid.py\)"):
        benchmark.modeling_folder(reference_checkout.parent)


def test_a_reference_with_smaller_default_filters_is_built_with_this_versions_filter_sizes(tmp_path):
    # An older version whose presets and operator defaults had filters of width 64 with one inner layer.
    layers_file = copy_modeling(tmp_path) / "modeling" / "orchid_layers.py"
    source = layers_file.read_text()
    assert "    filter_width: int = 128\n    filter_depth: int = 2\n" in source
    layers_file.write_text(source.replace("filter_width: int = 128", "filter_width: int = 64").replace(
        "filter_depth: int = 2", "filter_depth: int = 1"))
    reference = benchmark.load_modeling(tmp_path, name="orchid_smaller_filters")
    assert reference.OrchidConfig.from_preset("orchid-bert-base").filter_width == 64

    def linear_shapes(implicit_filter):
        return [tuple(layer.weight.shape) for layer in implicit_filter.ffn if isinstance(layer, torch.nn.Linear)]

    ours = linear_shapes(benchmark.build_model("orchid", True, 32).encoder.layer[0].mixer.static_filter)
    assert ours == [(128, 5), (128, 128), (128, 128), (64, 128)]
    model = benchmark.build_model("orchid_reference", True, 32, reference)
    assert linear_shapes(model.encoder.layer[0].mixer.static_filter) == ours
    masked_lm = benchmark.build_masked_lm("orchid_reference", True, 32, reference)
    assert linear_shapes(masked_lm.orchid.encoder.layer[0].mixer.residual_filter) == ours
    operator = benchmark.build_operator("orchid_reference", 64, 4, 32, reference)
    our_operator = benchmark.build_operator("orchid", 64, 4, 32)
    assert linear_shapes(operator.static_filter) == linear_shapes(our_operator.static_filter)


def test_a_failing_candidate_is_reported_and_the_others_are_measured():
    cfg = benchmark.build_config(benchmark.parse_args(["--quick", "--repeats", "2"]))
    workers = benchmark.Workers(cfg)
    try:
        worker = workers.get_worker("orchid")
        spec = dict(part="operator", mode="forward", length=2, batch=1, hidden=8, heads=2, quick=True)
        with pytest.raises(benchmark.WorkerFailure, match=r"short_conv_size=3 is longer") as failure:
            worker.request("build", spec=dict(spec, impl="orchid"))
        assert failure.value.reason.startswith("ValueError: OrchidOperator.short_conv_size=3")
        # A length the operator refuses: Orchid fails at this point, attention is measured, Orchid runs at the next.
        out = benchmark.measure_point(workers, ["orchid", "attention_sdpa"], spec, cfg)
        assert out["orchid"] == {"failed": failure.value.reason}
        assert len(out["attention_sdpa"]["times_s"]) == 2
        out = benchmark.measure_point(workers, ["orchid"], dict(spec, length=8), cfg)
        assert len(out["orchid"]["times_s"]) == 2
    finally:
        workers.close()
    record = benchmark.failed_record("model", "bert", "forward", 1, 16384, "killed (signal 9: out of memory?)")
    ok = dict(part="model", impl="orchid", mode="forward", batch=1, length=16384, time_s=1.0, times_s=[1.0],
              peak_bytes=1, single_call=False, extrapolated=False, load=[1.0, 1.0])
    cfg.update(model_shapes=[(1, 16384)], layers=12)
    result = dict(config={**cfg, "dtype": "torch.float32"}, records=[ok, record], tag="", machine={"torch": "x"},
                  started="", load=[1.0, 1.0], command="")
    result["summary"] = benchmark.summarize(result["records"], cfg)
    assert result["summary"]["model_speedups"] == {}  # no BERT time, no speed-up
    markdown = benchmark.markdown_report(result)
    assert "| (1, 16384) | 1,000.0 | failed² |" in markdown
    assert "² failed: BertModel (SDPA) at (B=1, L=16384): killed (signal 9: out of memory?)." in markdown
    # Where BERT has no time, the comparison with the reference version still counts.
    training = [dict(r, mode="forward_backward") for r in (ok, record)]
    training.append(dict(training[0], impl="orchid_reference", time_s=2.0, times_s=[2.0]))
    summary = benchmark.summarize(training, cfg)
    assert summary["targets"] == {"orchid forward_backward 1x16384 no slower than the reference": True}
    assert summary["model_speedups"] == {
        "forward_backward": {"1x16384": {"reference_ratio": {"orchid": 2.0, "orchid_reference": 1.0}}}
    }


def test_interleaved_rounds_start_with_each_candidate_in_turn():
    calls = []
    steps = {name: (lambda name=name: calls.append(name) or 1.0) for name in "abc"}
    times = benchmark.interleaved_times(steps, repeats=4, min_repeats=4, budget_s=1e9)
    assert calls == list("abc" "bca" "cab" "abc")
    assert times == {"a": [1.0] * 4, "b": [1.0] * 4, "c": [1.0] * 4}
    assert benchmark.interleaved_times({}, repeats=4, min_repeats=2, budget_s=1e9) == {}  # every candidate failed


def test_operator_memory_grows_with_length_and_attention_math_fastest():
    # Peak tensor memory of one forward call: linear for Orchid, quadratic for materialised attention.
    peaks = {}
    for impl in ("orchid", "attention_math"):
        for length in (64, 256):
            module = benchmark.build_operator(impl, 32, 4, length)
            step = benchmark.make_step(module, "forward", torch.randn(1, length, 32), is_model=False)
            peaks[impl, length] = benchmark.profiled_peak_bytes(step)
    assert peaks["orchid", 256] > peaks["orchid", 64]
    assert peaks["attention_math", 256] / peaks["attention_math", 64] > peaks["orchid", 256] / peaks["orchid", 64]


def test_pocketfft_results_are_counted_by_the_memory_profile():
    # pocketfft writes into tensors of torch's own, so the profiler that measures peak memory sees them.
    from orchid_hf.modeling.orchid_layers import dct

    x = torch.randn(1, 4096, 16)
    with torch.no_grad():
        peak = benchmark.profiled_peak_bytes(lambda: dct(x, dim=1))
    assert peak >= x.numel() * x.element_size()


def test_profiled_peak_counts_live_tensors_not_total_allocations():
    def step():
        a = torch.empty(1_000_000)  # 4 MB
        b = torch.empty(500_000)  # 2 MB, live with a
        del a
        c = torch.empty(250_000)  # 1 MB, a is gone
        return b, c

    assert benchmark.profiled_peak_bytes(step) == pytest.approx(6_000_000, rel=0.01)


def test_power_law_fit_recovers_the_exponent():
    lengths = [1024, 2048, 4096, 8192]
    slope, intercept = benchmark.fit_power_law(lengths, [3e-6 * n**1.5 for n in lengths])
    assert slope == pytest.approx(1.5)
    assert benchmark.fit_power_law([1024], [1.0]) is None


def test_math_attention_memory_guard_is_quadratic():
    assert benchmark.math_attention_bytes(1, 12, 2 * 4096, "forward") == 4 * benchmark.math_attention_bytes(
        1, 12, 4096, "forward"
    )


def test_a_speedup_just_below_its_target_is_shown_and_counted_as_missed():
    # 6 x 0.99994 = 5.99964: two decimals would print "6.00x" next to "NOT met".
    assert benchmark.format_speedup(5.99964, 6.0) == "5.9996x"
    assert benchmark.format_speedup(5.4712, 6.0) == "5.47x"
    assert benchmark.format_speedup(6.0, 6.0) == "6.00x" and benchmark.format_speedup(1.5749) == "1.57x"
    records = [
        dict(part="model", impl=impl, mode="forward", batch=1, length=16384, time_s=time_s, peak_bytes=2**20)
        for impl, time_s in (("orchid", 1.0), ("bert", 5.99996))
    ]
    cfg = dict(exponent_range=(8192, 65536), modes=["forward"], model_shapes=[(1, 16384)], memory_length=16384)
    summary = benchmark.summarize(records, cfg)
    assert summary["model_speedups"]["forward"]["1x16384"]["orchid"]["speedup"] == 6.0  # rounded for the JSON
    assert summary["targets"] == {"orchid forward 1x16384 >= 6.0x BERT": False}
    records[1]["time_s"] = 6.0
    assert benchmark.summarize(records, cfg)["targets"] == {"orchid forward 1x16384 >= 6.0x BERT": True}


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
        benchmark.main(["--quick", "--silent", "--out-dir", str(tmp_path), *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_cuda_device_without_cuda_is_refused_with_a_clear_message(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = benchmark.parse_args(["--quick"])
    args.device = "cuda"
    with pytest.raises(ValueError, match="device 'cuda' asked for, but this torch build sees no CUDA device"):
        benchmark.build_config(args)


def test_shapes_and_lengths_parse():
    assert benchmark.parse_shapes("8x128,1x4096") == [(8, 128), (1, 4096)]
    assert benchmark.parse_lengths("1024,4096") == [1024, 4096]


# ---------------------------------------------------------------------------------------------
# The train part
# ---------------------------------------------------------------------------------------------


def test_train_part_runs_at_tiny_sizes_and_reports_every_candidate_and_shape(tmp_path, reference_checkout):
    shapes = [(2, 16), (1, 32)]
    result = benchmark.main(["--quick", "--parts", "train", "--train-shapes", "2x16,1x32", "--repeats", "2",
                             "--out-dir", str(tmp_path), "--tag", "train", "--silent",
                             "--reference", str(reference_checkout)])
    records = result["records"]
    assert {r["part"] for r in records} == {"train"}
    found = sorted((r["level"], r["impl"], r["batch"], r["length"]) for r in records)
    assert found == sorted((level, impl, *shape) for level, impls in benchmark.TRAIN_IMPLS.items()
                           for impl in (*impls, "orchid_reference") for shape in shapes)
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
    for level, baseline in benchmark.TRAIN_BASELINES.items():
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
    assert result["summary"]["targets"] == {}  # no target at tiny sizes

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
    model = benchmark.build_masked_lm(impl, quick=True, length=16, layers=1)
    assert type(model).__name__ == ("OrchidForMaskedLM" if impl == "orchid" else "BertForMaskedLM")
    assert all(m.p == 0 for m in model.modules() if isinstance(m, torch.nn.Dropout))  # dropout off in both
    if impl == "bert":
        assert model.config._attn_implementation == "sdpa" and model.config.num_attention_heads == 4
    input_ids, labels = benchmark.mlm_batch(model.config.vocab_size, 2, 16)
    step, optimizer_step = benchmark.make_train_step(model, input_ids, labels)
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
    input_ids, labels = benchmark.mlm_batch(1000, 8, 128)
    again = benchmark.mlm_batch(1000, 8, 128)
    assert torch.equal(input_ids, again[0]) and torch.equal(labels, again[1])
    assert input_ids.shape == labels.shape == (8, 128) and input_ids.min() >= 1 and input_ids.max() < 1000
    labelled = labels != -100
    assert torch.equal(labels[labelled], input_ids[labelled])
    assert 0.1 < labelled.float().mean() < 0.2
    assert (benchmark.mlm_batch(1000, 1, 2)[1] != -100).any()  # never a loss over no position


def test_a_reference_without_a_masked_lm_is_reported_as_failed_in_the_train_part(tmp_path, reference_checkout):
    reference = benchmark.load_modeling(reference_checkout)
    assert type(benchmark.build_masked_lm("orchid_reference", True, 16, reference)) is reference.OrchidForMaskedLM
    older = tmp_path / "older"
    shutil.copytree(reference_checkout / "modeling", older / "modeling")
    with open(older / "modeling" / "__init__.py", "a") as init:
        init.write("\ndel OrchidForMaskedLM\n")  # as a version from before the class
    cfg = benchmark.build_config(benchmark.parse_args(["--quick", "--repeats", "2", "--reference", str(older)]))
    workers = benchmark.Workers(cfg)
    spec = dict(part="train", mode="forward_backward", batch=2, length=16, quick=True, layers=1, hidden=16, heads=2)
    try:
        out = benchmark.measure_point(workers, ["orchid_reference"], dict(spec, level="model"), cfg)
    finally:
        workers.close()
    reason = "ValueError: the orchid_reference model code (orchid_reference) has no OrchidForMaskedLM"
    assert out == {"orchid_reference": {"failed": reason}}
    record = benchmark.point_record("train", "orchid_reference", "forward_backward", 2, 16, out["orchid_reference"],
                                    [0.0, 0.0], level="model")
    assert record["failed"] == reason and record["time_s"] is None and record["level"] == "model"


def test_train_targets_count_from_unrounded_ratios_only_where_both_models_were_measured():
    def record(impl, batch, length, time_s, peak, **fields):
        return dict(part="train", level="model", impl=impl, mode="forward_backward", batch=batch, length=length,
                    time_s=time_s, times_s=[time_s], peak_bytes=peak, optimizer_time_s=0.1, optimizer_times_s=[0.1],
                    single_call=False, extrapolated=False, load=[1.0, 1.0], **fields)

    records = [
        record("orchid", 8, 128, 1.0, 100), record("bert", 8, 128, 1.39996, 90),  # 1.39996x: missed
        record("orchid", 1, 4096, 1.0, 100), record("bert", 1, 4096, 2.5, 90),  # exactly 2.5x: met
        record("orchid", 1, 16384, 1.0, 50_020), record("bert", 1, 16384, 6.0, 100_000),  # memory 0.5002x: missed
        record("orchid", 32, 128, 1.0, 100), record("bert", 32, 128, 1.0, 100),  # no target at 32x128
    ]
    cfg = dict(exponent_range=(8192, 65536), modes=["forward"], model_shapes=[], memory_length=16384, layers=12)
    # The targets are set for orchid-bert-base's 12 layers: a shallower run reports its ratios, but no targets.
    assert benchmark.summarize(records, dict(cfg, layers=2))["targets"] == {}
    summary = benchmark.summarize(records, cfg)
    assert summary["targets"] == {
        "orchid training step (forward + backward) 8x128 >= 1.4x BertForMaskedLM": False,
        "orchid training step (forward + backward) 1x4096 >= 2.5x BertForMaskedLM": True,
        "orchid training step (forward + backward) 1x16384 >= 5.0x BertForMaskedLM": True,
        "orchid training peak memory 1x16384 <= 0.5x BertForMaskedLM": False,
    }
    assert summary["train_speedups"]["model"]["8x128"]["orchid"]["speedup"] == 1.4  # rounded for the JSON
    assert summary["train_speedups"]["model"]["1x16384"]["orchid"]["memory_ratio"] == 0.5
    # BERT out of memory at 16K: no speed-up, no target there; the table says why.
    records[5] = benchmark.failed_record("train", "bert", "forward_backward", 1, 16384, "killed", level="model")
    summary = benchmark.summarize(records, cfg)
    assert not any("16384" in name for name in summary["targets"]) and "1x16384" not in summary["train_speedups"][
        "model"]
    markdown = "\n".join(benchmark.train_markdown(records, dict(cfg, dtype="torch.float32", layers=12, hidden=768)))
    assert "| (8, 128) | 1,000.0 | 1,400.0 | 1.39996x |" in markdown
    assert "| (1, 16384) | 1,000.0 | failed² | - | 100.0 | failed² | 0.0 | failed² | - | 1.0-1.0 |" in markdown
    assert "² failed: BertForMaskedLM (SDPA) at (B=1, L=16384): killed." in markdown
    assert benchmark.format_speedup(0.50024, 0.5, at_most=True) == "0.5002x"
    assert benchmark.format_speedup(0.4999, 0.5, at_most=True) == "0.50x"


def test_profile_train_writes_a_table_of_the_training_steps_top_ops(tmp_path, capsys):
    result = benchmark.main(["--quick", "--profile-train", "2x16", "--out-dir", str(tmp_path), "--tag", "t"])
    assert result["records"] == []  # profiling instead of timing
    profile, saved = (tmp_path / "profile_t.md").read_text().split("### Activations saved for backward, per layer")
    title = "### OrchidForMaskedLM, training step (forward + backward), 2 layers, (B=2, L=16): "
    assert title in profile
    assert "| (2, 16) | " in saved and "BertForMaskedLM (SDPA) MiB" in saved
    rows = [line for line in profile.splitlines() if line.startswith("| ") and not line.startswith("| op |")]
    assert len(rows) == 15 and any("Backward" in row for row in rows)  # the backward's ops are in it
    assert all(row.rstrip(" |").split(" | ")[-1].isdigit() for row in rows)  # calls per call
    assert title in capsys.readouterr().out  # printed too
    assert not (tmp_path / "benchmark_t.json").exists()


def test_saved_bytes_per_layer_counts_what_one_layer_saves_for_backward():
    """The two-layer-minus-one-layer count equals a direct count of what one OrchidLayer's forward saves."""
    cfg = benchmark.build_config(benchmark.parse_args(["--quick"]))
    per_layer = benchmark.saved_bytes_per_layer("orchid", 2, 16, cfg)
    torch.manual_seed(0)
    model = benchmark.build_masked_lm("orchid", True, 16, layers=1).train()
    hidden = torch.randn(2, 16, model.config.hidden_size, requires_grad=True)
    assert per_layer == benchmark.saved_storage_bytes(model.orchid.encoder.layer[0], hidden) > 0


def test_train_checkpointing_adds_a_candidate_with_the_plain_models_gradients():
    cfg = benchmark.build_config(benchmark.parse_args(["--quick", "--train-checkpointing"]))
    assert benchmark.candidates(cfg, "train", "forward_backward", "model") == ["orchid", "orchid_checkpointing", "bert"]
    assert benchmark.candidates(cfg, "train", "forward_backward", "operator") == ["orchid", "attention_sdpa"]
    plain_cfg = benchmark.build_config(benchmark.parse_args(["--quick"]))
    assert "orchid_checkpointing" not in benchmark.candidates(plain_cfg, "train", "forward_backward", "model")
    grads = {}
    for impl in ("orchid", "orchid_checkpointing"):
        torch.manual_seed(0)
        model = benchmark.build_masked_lm(impl, True, 16, layers=2)
        name = "is_activation_checkpointing" if hasattr(type(model), "is_activation_checkpointing") else (
            "is_gradient_checkpointing"
        )
        assert getattr(model, name) == (impl == "orchid_checkpointing")
        step, _ = benchmark.make_train_step(model, *benchmark.mlm_batch(model.config.vocab_size, 2, 16))
        step()
        grads[impl] = {name: p.grad for name, p in model.named_parameters()}
    for name, grad in grads["orchid"].items():
        torch.testing.assert_close(grads["orchid_checkpointing"][name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_profile_times_the_plain_models_implicit_filters(tmp_path, capsys):
    result = benchmark.main(["--quick", "--profile", "2x16", "--out-dir", str(tmp_path), "--tag", "t"])
    assert result["records"] == []
    profile = (tmp_path / "profile_t.md").read_text()
    table = profile.split("### The plain model's implicit filters, computed on every forward call (2 layers)")[1]
    row = next(line for line in table.splitlines() if line.startswith("| (2, 16) | "))
    forward_ms, filters_ms, share = row.replace(",", "").strip("| ").split(" | ")[1:]  # no thousands separators
    assert float(forward_ms) > 0 and filters_ms.endswith("(4 filters)") and float(filters_ms.split()[0]) > 0
    assert share.endswith("%")
    assert "### Orchid, (B=2, L=16)" in profile  # the operator's op table is still there
    assert "implicit filters" in capsys.readouterr().out
