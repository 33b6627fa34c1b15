"""Profiles instead of timings (``--profile``, ``--profile-train``, ``--thread-scaling``, ``--flops``): where the
time of a call goes, op by op, which ops gain least from a second thread, what the plain model's forward spends on its
static implicit filters, how many FLOPs a training step counts, and what it keeps for backward. Run in the
benchmark's own process, one candidate after the other."""

from __future__ import annotations

from collections.abc import Callable

import torch

from benchmarks.candidates import (
    CANDIDATES,
    REFERENCE,
    baseline_of,
    build_masked_lm,
    build_model,
    build_operator,
    build_steps,
    candidates_in,
    load_modeling,
    make_step,
    mlm_batch,
    orchid_config,
    synchronizer,
)
from benchmarks.harness import median_seconds, table_lines, timed_call
from benchmarks.measure import retained_bytes
from benchmarks.settings import BenchmarkSettings


def profile_table(title: str, step: Callable[[], None], calls: int = 3, rows: int = 15) -> str:
    """A Markdown table of the ops that cost most in ``calls`` calls of ``step`` (after a warm-up), by self CPU time:
    where the time goes, op by op; ``title`` is followed by the time per call."""
    from torch.profiler import ProfilerActivity, profile

    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            step()
    averages = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in averages)
    cells = [[event.key, f"{event.self_cpu_time_total / 1e3 / calls:,.2f}",
              f"{100 * event.self_cpu_time_total / max(total, 1):.1f}%", event.count // calls]
             for event in averages[:rows]]  # fmt: skip
    lines = [f"### {title}: {total / 1e3 / calls:,.1f} ms per call", ""]
    lines += table_lines(["op", "ms per call", "share", "calls per call"], cells)
    return "\n".join(lines + [""])


def profile_operator(impl: str, batch: int, length: int, settings: BenchmarkSettings, reference=None,
                     calls: int = 3) -> str:
    """The profile table of ``calls`` forward calls of one operator."""
    torch.manual_seed(0)
    module = build_operator(impl, settings.hidden, settings.heads, length, reference)
    module = module.to(settings.device, settings.dtype)
    x = torch.randn(batch, length, settings.hidden, device=settings.device, dtype=settings.dtype)
    step = make_step(module, "forward", x, is_model=False)
    return profile_table(f"{CANDIDATES[impl].label}, (B={batch}, L={length})", step, calls)


def training_step(impl: str, batch: int, length: int, settings: BenchmarkSettings, reference=None):
    """One training step (forward + backward of the MLM loss, as the train part times them; not the optimizer) of the
    masked-LM candidate ``impl`` at (batch, length), built with seed 0."""
    torch.manual_seed(0)
    spec = dict(impl=impl, level="model", batch=batch, length=length, quick=settings.quick, layers=settings.layers)
    step, _ = build_steps(dict(spec, part="train"), reference, settings.device, settings.dtype)
    return step


def profile_train(impl: str, batch: int, length: int, settings: BenchmarkSettings, reference=None,
                  calls: int = 3) -> str:
    """The profile table of ``calls`` training steps (:func:`training_step`) of the masked-LM candidate ``impl``."""
    step = training_step(impl, batch, length, settings, reference)
    title = (f"{CANDIDATES[impl].table_label('train_model')}, training step (forward + backward), {settings.layers} "
             f"layers, (B={batch}, L={length})")
    return profile_table(title, step, calls)


def op_times(step: Callable[[], None], calls: int) -> tuple[dict[str, float], float]:
    """Each op's self CPU time in ms per call over ``calls`` profiled calls of ``step`` (after a warm-up), and the
    wall time in ms per call. An op's self time is its time on the thread that called it, so an op that parallelises
    over more threads shows a shorter time."""
    from torch.profiler import ProfilerActivity, profile

    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        wall = timed_call(lambda: [step() for _ in range(calls)])
    return {e.key: e.self_cpu_time_total / 1e3 / calls for e in prof.key_averages()}, wall * 1e3 / calls


def thread_scaling_table(impl: str, batch: int, length: int, settings: BenchmarkSettings, reference=None,
                         calls: int = 3, rows: int = 15) -> str:
    """A Markdown table of the training step of the masked-LM candidate ``impl`` profiled at 1 thread and at
    ``settings.threads``: each op's self time at both counts, its speed-up, and the time it keeps over a perfect
    split across the threads (its time at N threads less its 1-thread time / N), the ops that keep most first."""
    step = training_step(impl, batch, length, settings, reference)
    n = settings.threads
    try:
        torch.set_num_threads(1)
        one, wall_one = op_times(step, calls)
        torch.set_num_threads(n)
        many, wall_many = op_times(step, calls)
    finally:
        torch.set_num_threads(n)
    kept = {op: many.get(op, 0.0) - one[op] / n for op in one}
    title = (f"{CANDIDATES[impl].table_label('train_model')}, training step (forward + backward), {settings.layers} "
             f"layers, (B={batch}, L={length}): {wall_one:,.1f} ms at 1 thread, {wall_many:,.1f} ms at {n} "
             f"({wall_one / wall_many:.2f}x)")
    total_many = sum(many.values())
    cells = []
    for op in sorted(kept, key=kept.get, reverse=True)[:rows]:
        speed_up = f"{one[op] / many[op]:.2f}x" if many.get(op) else "-"
        cells.append([op, f"{one[op]:,.2f}", f"{many.get(op, 0.0):,.2f}", speed_up, f"{kept[op]:,.2f}",
                      f"{100 * many.get(op, 0.0) / max(total_many, 1e-9):.1f}%"])
    header = ["op", "ms at 1 thread", f"ms at {n}", "speed-up", "ms over a perfect split",
              f"share of the {n}-thread step"]
    return "\n".join([f"### {title}", "", *table_lines(header, cells), ""])


def convolution_backward_flops(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                               _output_padding, _groups, output_mask, out_shape=None, **kwargs) -> int:
    """The FLOPs of a convolution's backward: each gradient asked for (input, weight) is a product as large as the
    forward's. ``FlopCounterMode``'s own formula counts grouped (depthwise) convolutions as if they were dense."""
    from torch.utils.flop_counter import conv_flop_count

    forward = conv_flop_count(list(x_shape), list(w_shape), list(grad_out_shape), transposed=transposed)
    return forward * (int(output_mask[0]) + int(output_mask[1]))


def cpu_flash_attention_flops(query_shape, key_shape, value_shape, *args, **kwargs) -> int:
    """SDPA's CPU flash kernel, forward: the scores and the weighted sum (``FlopCounterMode`` counts SDPA's GPU kernels
    only)."""
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(list(query_shape), list(key_shape), list(value_shape))


def cpu_flash_attention_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args, **kwargs) -> int:
    """SDPA's CPU flash kernel, backward, as ``FlopCounterMode`` counts the GPU flash kernel's backward."""
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return sdpa_backward_flop_count(list(grad_out_shape), list(query_shape), list(key_shape), list(value_shape))


# What FlopCounterMode misses or miscounts in these models' training steps.
FLOP_FORMULAS = {
    torch.ops.aten.convolution_backward: convolution_backward_flops,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: cpu_flash_attention_flops,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: cpu_flash_attention_backward_flops,
}


def training_step_flops(impl: str, batch: int, length: int, settings: BenchmarkSettings, reference=None) -> int:
    """The floating-point operations of one training step (forward + backward of the MLM loss) of the masked-LM
    candidate ``impl``, as ``torch.utils.flop_counter.FlopCounterMode`` counts them with :data:`FLOP_FORMULAS`: matrix
    products, convolutions and attention, including what backward recomputes; not transforms or elementwise ops."""
    from torch.utils.flop_counter import FlopCounterMode

    step = training_step(impl, batch, length, settings, reference)
    with FlopCounterMode(display=False, custom_mapping=FLOP_FORMULAS) as counter:
        step()
    return counter.get_total_flops()


def flops_table(shapes: list[tuple[int, int]], settings: BenchmarkSettings, reference=None) -> str:
    """A Markdown table of each masked-LM candidate's training-step GFLOPs at ``shapes`` and the baseline's count over
    each Orchid candidate's: the speed-up a step would have if every counted operation ran at the same rate and the
    rest cost nothing."""
    names = candidates_in("train_model", settings=settings)
    baseline = next(name for name in names if CANDIDATES[name].baseline)
    others = [name for name in names if name != baseline]
    label = CANDIDATES[baseline].table_label("train_model")
    header = ["(B, L)", *(CANDIDATES[n].table_label("train_model") for n in names)]
    header += [f"{label} / {CANDIDATES[n].table_label('train_model')}" for n in others]
    rows = []
    for batch, length in shapes:
        counts = {name: training_step_flops(name, batch, length, settings, reference) for name in names}
        rows.append([f"({batch}, {length})", *(f"{counts[n] / 1e9:,.1f}" for n in names),
                     *(f"{counts[baseline] / counts[n]:.2f}x" for n in others)])
    title = f"### Training-step GFLOPs (matrix products, convolutions, attention), {settings.layers} layers"
    return "\n".join([title, "", *table_lines(header, rows), ""])


def implicit_filter_cost(batch: int, length: int, settings: BenchmarkSettings, calls: int = 3) -> dict:
    """What the plain model's forward (orchid-bert-base's sizes, ``max_position_embeddings = length``) spends on its
    static implicit filters: every layer's two kernels ``FFN(PosEmb(t)) * decay(t)`` over the N lags and their
    multipliers (:meth:`ImplicitFilter.spectrum`), which depend on the weights alone and are computed on every call.
    Median seconds of the model's forward and of the filters alone, each over ``calls`` calls."""
    torch.manual_seed(0)
    model = build_model("orchid", settings.quick, length, layers=settings.layers).to(settings.device, settings.dtype)
    inputs = torch.randint(1, model.config.vocab_size, (batch, length), device=settings.device)
    forward = make_step(model, "forward", inputs, is_model=True)
    mixers = [layer.mixer for layer in model.encoder.layer]
    filters = [f for mixer in mixers for f in (mixer.static_filter, mixer.residual_filter) if f is not None]
    compute_dtype = torch.promote_types(settings.dtype, torch.float32)  # the operator's transform dtype
    sync = synchronizer(settings.device)

    def filters_step():
        with torch.inference_mode():
            for implicit_filter in filters:
                implicit_filter.spectrum(compute_dtype)
        sync()

    forward_s = median_seconds(forward, calls, settings.device)
    filters_s = median_seconds(filters_step, calls, settings.device)
    return dict(batch=batch, length=length, forward_s=forward_s, filters_s=filters_s, filters=len(filters))


def implicit_filter_table(shapes: list[tuple[int, int]], settings: BenchmarkSettings) -> str:
    """A Markdown table of :func:`implicit_filter_cost` at each shape."""
    rows = []
    for batch, length in shapes:
        cost = implicit_filter_cost(batch, length, settings)
        rows.append([f"({batch}, {length})", f"{1e3 * cost['forward_s']:,.1f}",
                     f"{1e3 * cost['filters_s']:,.1f} ({cost['filters']} filters)",
                     f"{100 * cost['filters_s'] / cost['forward_s']:.1f}%"])
    header = ["(B, L)", "forward ms", "the filters' kernels and multipliers ms", "share"]
    title = f"### The plain model's implicit filters, computed on every forward call ({settings.layers} layers)"
    return "\n".join([title, "", *table_lines(header, rows), ""])


def saved_bytes_per_layer(impl: str, batch: int, length: int, settings: BenchmarkSettings, reference=None) -> int:
    """The bytes that one layer of the masked-LM model ``impl`` keeps for backward at (batch, length): the distinct
    storages that the forward of a two-layer model leaves alive (:func:`retained_bytes`) less those of a one-layer
    model, so that the embeddings and the head cancel. What a training step holds at its peak grows with this times
    the depth."""
    totals = []
    for layers in (1, 2):
        torch.manual_seed(0)
        model = build_masked_lm(impl, settings.quick, length, reference, layers)
        model = model.to(settings.device, settings.dtype).train()
        input_ids, labels = mlm_batch(model.config.vocab_size, batch, length, settings.device)
        model(input_ids=input_ids, labels=labels)  # what the first call caches (the DCT's matrices) is no activation
        totals.append(retained_bytes(model, input_ids=input_ids, labels=labels))
    return totals[1] - totals[0]


def saved_activations_table(shapes: list[tuple[int, int]], settings: BenchmarkSettings, reference=None) -> str:
    """A Markdown table of :func:`saved_bytes_per_layer` for the train part's models at each shape, also in units of
    one (batch, length, hidden) activation."""
    import orchid_hf

    impls = ["orchid"] + ([REFERENCE] if reference is not None else []) + [baseline_of("train_model")]
    header = ["(B, L)", *(f"{CANDIDATES[impl].table_label('train_model')} MiB (activations)" for impl in impls)]
    rows = []
    for batch, length in shapes:
        activation = batch * length * orchid_config(orchid_hf, settings.quick, length).hidden_size
        cells = []
        for impl in impls:
            saved = saved_bytes_per_layer(impl, batch, length, settings, reference)
            cells.append(f"{saved / 2**20:,.1f} ({saved / (activation * torch.finfo(settings.dtype).bits // 8):.1f})")
        rows.append([f"({batch}, {length})", *cells])
    return "\n".join(["### Activations kept for backward, per layer", "", *table_lines(header, rows), ""])


def profile_tables(settings: BenchmarkSettings, log: Callable[[str], None], show: bool = True) -> str:
    """The Markdown of ``--profile`` (each Orchid candidate's operator forward at ``settings.profile_shapes``, then the
    implicit filters' share) and ``--profile-train`` (each Orchid masked-LM candidate's training step at
    ``settings.profile_train_shapes``, then the activations kept per layer, at ``settings.activation_shapes`` if
    given); the summary tables printed if ``show``."""
    reference = load_modeling(settings.reference) if settings.reference else None
    tables = []

    def add(table: str, message: str, printed: bool) -> None:
        tables.append(table)
        log(message)
        if show and printed:
            print(table, flush=True)

    operators = [name for name in candidates_in("operator", "forward", settings) if not CANDIDATES[name].baseline]
    for batch, length in settings.profile_shapes:
        for name in operators:
            add(profile_operator(name, batch, length, settings, reference),
                f"profiled {name} at (B={batch}, L={length})", printed=False)
    if settings.profile_shapes:
        add(implicit_filter_table(settings.profile_shapes, settings), "timed the plain model's implicit filters",
            printed=True)
    masked_lms = [name for name in candidates_in("train_model", settings=settings) if not CANDIDATES[name].baseline]
    for batch, length in settings.profile_train_shapes:
        for name in masked_lms:
            add(profile_train(name, batch, length, settings, reference),
                f"profiled the training step of {name} at (B={batch}, L={length})", printed=True)
    for batch, length in settings.thread_scaling_shapes:
        for name in candidates_in("train_model", settings=settings):
            add(thread_scaling_table(name, batch, length, settings, reference),
                f"profiled the training step of {name} at 1 and {settings.threads} threads at (B={batch}, L={length})",
                printed=True)
    if settings.flop_shapes:
        add(flops_table(settings.flop_shapes, settings, reference), "counted the training step's FLOPs", printed=True)
    activation_shapes = settings.activation_shapes or settings.profile_train_shapes
    if activation_shapes:
        add(saved_activations_table(activation_shapes, settings, reference),
            "counted the activations kept for backward", printed=True)
    return "\n".join(tables)
