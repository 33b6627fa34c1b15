"""The benchmark at tiny sizes (correctness only: no timing is asserted anywhere), and the fast paths it
measures: they must compute what the plain paths compute, and run under torch.compile."""

import json

import pytest
import torch
from orchid_hf.modeling import modeling_orchid, orchid_layers
from orchid_hf.modeling.orchid_layers import BlockDiagonalLinear, OrchidOperator

from orchid_hf import benchmark

# ---------------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------------


def test_benchmark_runs_at_tiny_sizes_and_writes_json_markdown_and_plot(tmp_path):
    lengths = [16, 32, 64]
    result = benchmark.main(
        [
            "--quick",
            "--lengths", ",".join(map(str, lengths)),
            "--model-shapes", "2x16,1x32",
            "--repeats", "2",
            "--out-dir", str(tmp_path),
            "--tag", "tiny",
            "--silent",
            "--reference-layers", orchid_layers.__file__,
        ]
    )
    records = result["records"]
    operator = [r for r in records if r["part"] == "operator"]
    impls = set(benchmark.OPERATOR_IMPLS) | {"orchid_reference"}
    for mode in benchmark.MODES:
        for impl in impls:
            points = sorted(r["length"] for r in operator if r["impl"] == impl and r["mode"] == mode)
            assert points == lengths, (impl, mode)
    for record in records:
        assert record["time_s"] > 0 and all(t > 0 for t in record["times_s"])
        assert record["peak_bytes"] > 0
        assert not record["extrapolated"]
    for record in operator:
        if record["impl"] == "orchid" and record["mode"] == "forward":
            # profiled again after timing: no more cache building, so never more than the first call
            assert 0 < record["later_peak_bytes"] <= record["peak_bytes"]
    model = {(r["impl"], r["batch"], r["length"]) for r in records if r["part"] == "model"}
    assert model == {(impl, b, n) for impl in ("orchid", "bert", "orchid_reference") for b, n in ((2, 16), (1, 32))}
    assert result["summary"]["exponents"]["orchid/forward"]["points"] == len(lengths)
    assert set(result["summary"]["model_speedups"]) == {"2x16", "1x32"}

    saved = json.loads((tmp_path / "benchmark_tiny.json").read_text())
    assert saved["finished"] and len(saved["records"]) == len(records)
    markdown = (tmp_path / "benchmark_tiny.md").read_text()
    assert "## Operator, forward" in markdown and "## Model, forward" in markdown
    assert "Peak memory of a later forward call" in markdown and "later_calls_vs_attention_sdpa" in markdown
    assert (tmp_path / "benchmark_tiny.png").stat().st_size > 10_000


def test_a_reference_operator_without_out_runs_in_an_encoder_that_lends_no_outputs(monkeypatch):
    # Layers lend their outputs' memory through OrchidOperator.forward's `out`; older operators lack it.
    monkeypatch.setattr(modeling_orchid, "MLP_CHUNK_ELEMENTS", 1)  # the layers' token-chunk path, as on long inputs
    monkeypatch.setattr(modeling_orchid, "MLP_MIN_CHUNK_TOKENS", 7)
    reference = benchmark.load_reference_layers(orchid_layers.__file__)

    class OperatorWithoutOut(reference.OrchidOperator):
        def forward(self, x, attention_mask=None, conditioning_input=None, conditioning_mask=None):
            return super().forward(x, attention_mask, conditioning_input, conditioning_mask)

    assert benchmark.build_model("orchid_reference", True, 32, reference).encoder.reuse_outputs
    reference.OrchidOperator = OperatorWithoutOut
    model = benchmark.build_model("orchid_reference", True, 32, reference)
    assert not model.encoder.reuse_outputs and type(model.encoder.layer[0].mixer) is OperatorWithoutOut
    input_ids = torch.randint(1, model.config.vocab_size, (1, 32))
    with torch.no_grad():
        assert model.encoder.layer[0]._runs_in_chunks(model.embeddings(input_ids))
        model(input_ids)


def test_interleaved_rounds_start_with_each_candidate_in_turn():
    calls = []
    steps = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    times = benchmark.interleaved_times(steps, repeats=4, min_repeats=4, budget_s=1e9)
    assert calls == list("abc" "bca" "cab" "abc")
    assert {name: len(t) for name, t in times.items()} == {"a": 4, "b": 4, "c": 4}


def test_operator_memory_grows_with_length_and_attention_math_fastest():
    # Peak tensor memory of one forward call: linear for Orchid, quadratic for materialised attention.
    peaks = {}
    for impl in ("orchid", "attention_math"):
        for length in (64, 256):
            module = benchmark.build_operator(impl, 32, 4, length).eval()
            step = benchmark.make_step(module, "forward", torch.randn(1, length, 32), is_model=False)
            peaks[impl, length] = benchmark.profiled_peak_bytes(step)
    assert peaks["orchid", 256] > peaks["orchid", 64]
    assert peaks["attention_math", 256] / peaks["attention_math", 64] > peaks["orchid", 256] / peaks["orchid", 64]


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
    # 184,979.5 / 23,130.8 = 7.9972: two decimals would print "8.00x" next to "NOT met".
    assert benchmark.format_speedup(184979.5 / 23130.8, 8.0) == "7.997x"
    assert benchmark.format_speedup(7.99996, 8.0) == "7.99996x"
    assert benchmark.format_speedup(7.4712, 8.0) == "7.47x"
    assert benchmark.format_speedup(8.0, 8.0) == "8.00x" and benchmark.format_speedup(1.5749) == "1.57x"
    records = [
        dict(part="model", impl=impl, batch=1, length=16384, time_s=time_s, peak_bytes=2**20)
        for impl, time_s in (("orchid", 1.0), ("bert", 7.99996))
    ]
    cfg = dict(exponent_range=(8192, 65536), operator_impls=[], modes=["forward"], model_shapes=[(1, 16384)],
               memory_length=16384)
    summary = benchmark.summarize(records, cfg)
    assert summary["model_speedups"]["1x16384"]["speedup"] == 8.0  # rounded for the JSON
    assert summary["targets"] == {"speedup 1x16384 >= 8.0": False}
    records[1]["time_s"] = 8.0
    assert benchmark.summarize(records, cfg)["targets"] == {"speedup 1x16384 >= 8.0": True}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--parts", "operatr"], "parts must be comma-separated names from ('operator', 'model'), got 'operatr'"),
        (["--parts", "model,"], "parts must be"),
        (["--lengths", "1024,-4"], "lengths must be comma-separated positive integers, e.g. 1024,4096; got '1024,-4'"),
        (["--lengths", "1k"], "lengths must be"),
        (["--model-shapes", "8x128,1x"], "model_shapes must be comma-separated BxL with positive B and L"),
        (["--model-shapes", "8x0"], "model_shapes must be"),
        (["--profile", "1x4096x2"], "profile must be comma-separated BxL"),
        (["--repeats", "0"], "repeats must be at least 1, got 0"),
        (["--threads", "0"], "threads must be at least 1, got 0"),
        (["--max-call-s", "0"], "max_call_s must be positive, got 0.0"),
        (["--point-budget-s", "-1"], "point_budget_s must be positive, got -1.0"),
        (["--device", "tpu"], "device must be cpu or cuda (optionally cuda:N), got 'tpu'"),
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
# Fast paths compute what the plain paths compute
# ---------------------------------------------------------------------------------------------


DCT_ALGORITHMS = {  # (POCKETFFT_DCT, MATMUL_DCT_MAX_LEN) that make dct_algorithm choose each on the CPU
    "pocketfft": (True, 128),
    "matmul": (False, 1024),
    "makhoul": (False, 0),
}


def use_dct_algorithm(monkeypatch, algorithm: str) -> None:
    pocketfft, matmul_max_len = DCT_ALGORITHMS[algorithm]
    monkeypatch.setattr(orchid_layers, "POCKETFFT_DCT", pocketfft)
    monkeypatch.setattr(orchid_layers, "MATMUL_DCT_MAX_LEN", matmul_max_len)
    assert orchid_layers.dct_algorithm(torch.zeros(1, dtype=torch.float64), 40) == algorithm


@pytest.mark.parametrize("conditioning", ["abs", "xcorr"])
def test_the_three_dct_algorithms_give_the_same_operator(monkeypatch, conditioning):
    # On the CPU the DCT runs through pocketfft; elsewhere as a GEMM up to MATMUL_DCT_MAX_LEN, beyond it through
    # Makhoul's FFT algorithm in pair form. All three must give the same operator, with masks, shorter inputs,
    # cross-conditioning and gradients, and without autograd, where they work in place.
    torch.manual_seed(0)
    op = OrchidOperator(6, 40, conditioning=conditioning, conditioning_time_layers=2).double()
    x = torch.randn(2, 33, 6, dtype=torch.float64, requires_grad=True)
    full = torch.randn(2, 40, 6, dtype=torch.float64)
    u = torch.randn(2, 21, 6, dtype=torch.float64)
    mask = torch.ones(2, 33)
    mask[1, 20:] = 0

    def run(algorithm):
        use_dct_algorithm(monkeypatch, algorithm)
        x.grad = None
        y = op(x, mask) + op(x, conditioning_input=u)
        y.square().sum().backward()
        with torch.no_grad():
            eval_out = op(x, mask), op(full)
        return y.detach(), x.grad.clone(), *eval_out

    results = {algorithm: run(algorithm) for algorithm in DCT_ALGORITHMS}
    for algorithm in ("matmul", "makhoul"):
        for a, b in zip(results["pocketfft"], results[algorithm]):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize(("n", "length"), [(16, 16), (16, 9), (45, 31)])
def test_pocketfft_dct_gradients(n, length):
    # The autograd rules of the pocketfft transforms: the orthonormal, zero-padded DCT's gradient is the inverse DCT
    # cut to the input's length, and the other way round; their own gradients again (double backward).
    x = torch.randn(2, length, 3, dtype=torch.float64, requires_grad=True)
    spectrum = torch.randn(2, n, 3, dtype=torch.float64, requires_grad=True)
    assert orchid_layers.dct_algorithm(x, n) == "pocketfft"
    transforms = ((lambda t: orchid_layers.dct_seq(t, n), x), (lambda t: orchid_layers.idct_seq(t, length), spectrum))
    for fn, arg in transforms:
        assert torch.autograd.gradcheck(fn, (arg,))
        assert torch.autograd.gradgradcheck(fn, (arg,))


def test_pocketfft_dct_writes_over_its_input_only_when_told_and_never_under_autograd():
    n = 32
    rows = torch.randn(2, n, 9, dtype=torch.float64)
    x = rows[..., :3]  # a strided view, as the operator's gates are
    expected = orchid_layers.dct(x.transpose(1, 2)).transpose(1, 2)
    before = rows.clone()
    with torch.no_grad():
        copied = orchid_layers.dct_seq(x, n)
        assert torch.equal(rows, before)
        in_place = orchid_layers.dct_seq(x, n, in_place=True)
        assert in_place.data_ptr() == x.data_ptr() and torch.equal(rows[..., 3:], before[..., 3:])
    torch.testing.assert_close(copied, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(in_place, expected, atol=1e-12, rtol=0)
    x = before[..., :3].clone().requires_grad_()
    spectrum = orchid_layers.dct_seq(x, n, in_place=True)
    assert torch.equal(x.detach(), before[..., :3]) and spectrum.requires_grad


def test_pocketfft_dct_results_are_counted_by_the_benchmarks_memory_profile():
    # pocketfft writes into tensors of torch's own, so the profiler that measures peak memory sees them.
    x = torch.randn(1, 4096, 16)
    with torch.no_grad():
        peak = benchmark.profiled_peak_bytes(lambda: orchid_layers.dct_seq(x, 4096))
    assert peak >= x.numel() * x.element_size()


def test_the_dct_falls_back_to_torch_without_scipy_off_the_cpu_and_under_compile(monkeypatch):
    x = torch.zeros(1, 8, 2)
    assert orchid_layers.dct_algorithm(x, 128) == "pocketfft"
    assert orchid_layers.dct_algorithm(x.half(), 128) == "matmul"
    assert orchid_layers.dct_algorithm(torch.zeros(1, 8, 2, device="meta"), 129) == "makhoul"
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert orchid_layers.dct_algorithm(x, 128) == "matmul"
    monkeypatch.undo()
    monkeypatch.setattr(orchid_layers, "scipy_fft", None)
    assert orchid_layers.dct_algorithm(x, 129) == "makhoul"


@pytest.mark.parametrize("algorithm", list(DCT_ALGORITHMS))
@pytest.mark.parametrize("n,length", [(16, 16), (16, 9), (300, 300), (301, 250)])
def test_sequence_axis_dct_equals_the_last_axis_dct(n, length, algorithm, monkeypatch):
    use_dct_algorithm(monkeypatch, algorithm)
    x = torch.randn(2, length, 3, dtype=torch.float64)
    padded = torch.nn.functional.pad(x, (0, 0, 0, n - length))
    expected = orchid_layers.dct(padded.transpose(1, 2)).transpose(1, 2)
    torch.testing.assert_close(orchid_layers.dct_seq(x, n), expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(orchid_layers.dct_seq(x, n, magnitude=True), expected.abs(), atol=1e-12, rtol=0)
    spectrum = torch.randn(2, n, 3, dtype=torch.float64)
    inverse = orchid_layers.idct(spectrum.transpose(1, 2)).transpose(1, 2)[:, :length]
    torch.testing.assert_close(orchid_layers.idct_seq(spectrum, length), inverse, atol=1e-12, rtol=0)


@pytest.mark.parametrize("onednn", [True, False])
def test_block_diagonal_linear_direct_path_equals_the_batched_path(onednn, monkeypatch):
    monkeypatch.setattr(orchid_layers, "ONEDNN_LINEAR", onednn)  # one oneDNN call per block, or MKL's addmm
    layer = BlockDiagonalLinear(16, 24, num_blocks=4)
    x = torch.randn(3, 5, 16)
    batched = layer(x)  # autograd on: the bmm path
    with torch.autocast("cpu", dtype=torch.bfloat16):
        batched_autocast = layer(x)
    with torch.no_grad():
        direct = layer(x)  # slices of the output written by one GEMM per block
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fallback = layer(x)  # under autocast the bmm path again, with autocast's dtypes
    torch.testing.assert_close(direct, batched.detach())
    assert fallback.dtype == batched_autocast.dtype
    torch.testing.assert_close(fallback, batched_autocast.detach())


# ---------------------------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_len", [48, 200])  # the matmul DCT and the FFT-based DCT
def test_operator_compiles_as_one_graph(max_len):
    # aot_eager traces the whole operator (dynamo + AOTAutograd, forward and backward) in seconds; inductor
    # compiles it too (docs/performance.md), but its C++ build takes minutes on a small CPU machine.
    torch._dynamo.reset()
    torch.manual_seed(0)
    op = OrchidOperator(8, max_len, filter_width=8)
    compiled = torch.compile(op, backend="aot_eager", fullgraph=True)
    x = torch.randn(2, max_len, 8, requires_grad=True)
    mask = torch.ones(2, max_len)
    mask[1, max_len // 2 :] = 0
    expected = op(x, mask)
    got = compiled(x, mask)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    got.square().sum().backward()
    assert torch.isfinite(x.grad).all()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, mask), expected.detach(), atol=1e-5, rtol=1e-5)
