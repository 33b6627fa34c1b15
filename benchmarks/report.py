"""Reporting: the ratios of a run's records (Orchid's speed relative to the baseline, memory relative to it), the
Markdown tables, and the plot of the operator part (runtime and memory against length, as the paper's Figure C.4)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from benchmarks.candidates import (
    CANDIDATES,
    MLM_PROBABILITY,
    ORCHID_CANDIDATES,
    REFERENCE,
    baseline_of,
    candidates_in,
)
from benchmarks.harness import commit_text, fit_power_law, machine_text, table_lines
from benchmarks.parts import TRAIN_LEVELS, measured
from benchmarks.settings import BenchmarkSettings

LABELS = {name: candidate.label for name, candidate in CANDIDATES.items()}


def summarize(records: list[dict], settings: BenchmarkSettings) -> dict:
    """The ratios of a run's records (rounded for the JSON): ``exponents`` of time against length of each operator
    candidate (fitted over ``settings.exponent_range``); ``model_speedups`` (BertModel's time / each Orchid
    candidate's, ``memory_ratio`` the candidate's peak / BERT's, ``reference_ratio`` the reference version's time /
    each Orchid candidate's, also where BERT has no time); ``memory_ratios`` of the operators' peaks at
    ``settings.memory_length``; ``train_speedups`` (:func:`summarize_train`)."""
    summary: dict = {"exponents": {}, "model_speedups": {}, "memory_ratios": {}, "train_speedups": {}}
    lo, hi = settings.exponent_range
    for impl in dict.fromkeys(r["impl"] for r in records if r["part"] == "operator"):
        for mode in settings.modes:
            own = [r for r in measured(records) if r["part"] == "operator" and r["impl"] == impl
                   and r["mode"] == mode and lo <= r["length"] <= hi]
            fit = fit_power_law([r["length"] for r in own], [r["time_s"] for r in own])
            if fit is not None:
                summary["exponents"][f"{impl}/{mode}"] = {"exponent": round(fit[0], 3), "range": [lo, hi],
                                                         "points": len(own)}
    model_baseline = baseline_of("model")
    for mode in dict.fromkeys(r["mode"] for r in records if r["part"] == "model"):
        for batch, length in settings.model_shapes:
            point = {r["impl"]: r for r in measured(records)
                     if r["part"] == "model" and r["mode"] == mode and (r["batch"], r["length"]) == (batch, length)}
            speedups = summary["model_speedups"].setdefault(mode, {})
            if model_baseline in point:
                base = point[model_baseline]
                speedups[f"{batch}x{length}"] = {
                    impl: {
                        "speedup": round(base["time_s"] / r["time_s"], 3),
                        "memory_ratio": None if r["peak_bytes"] is None
                        else round(r["peak_bytes"] / max(base["peak_bytes"], 1), 3),
                    }
                    for impl, r in point.items() if impl != model_baseline
                }
            # Against the reference version also where BERT has no time (out of memory).
            if REFERENCE in point:
                reference = point[REFERENCE]["time_s"]
                speedups.setdefault(f"{batch}x{length}", {})["reference_ratio"] = {
                    impl: round(reference / r["time_s"], 3) for impl, r in point.items() if impl in ORCHID_CANDIDATES
                }
        if not summary["model_speedups"].get(mode):
            summary["model_speedups"].pop(mode, None)
    memory_length = settings.memory_length
    attentions = [name for name in candidates_in("operator") if CANDIDATES[name].baseline]
    for mode in settings.modes:
        point = {r["impl"]: r for r in records
                 if r["part"] == "operator" and r["mode"] == mode and r["length"] == memory_length
                 and not r.get("failed")}
        for impl in ORCHID_CANDIDATES:
            if impl not in point:
                continue
            for attention in attentions:
                if attention in point and point[attention]["peak_bytes"]:
                    summary["memory_ratios"][f"{mode}/{impl}_vs_{attention}"] = {
                        "ratio": round(point[impl]["peak_bytes"] / point[attention]["peak_bytes"], 4),
                        "length": memory_length,
                        "attention_extrapolated": point[attention]["extrapolated"],
                    }
    summarize_train(records, summary)
    return summary


def summarize_train(records: list[dict], summary: dict) -> None:
    """The train part's ratios against the baseline of each level (BertForMaskedLM, attention) at every shape where
    both were measured: ``speedup`` (baseline's forward + backward time / the candidate's), ``memory_ratio`` (the
    candidate's peak / the baseline's), ``optimizer_speedup``; and ``reference_ratio`` against the reference
    version."""
    train = [r for r in measured(records) if r["part"] == "train"]
    for level in TRAIN_LEVELS:
        own = [r for r in train if r["level"] == level]
        baseline = baseline_of(f"train_{level}")
        for batch, length in dict.fromkeys((r["batch"], r["length"]) for r in own):
            shape = f"{batch}x{length}"
            point = {r["impl"]: r for r in own if (r["batch"], r["length"]) == (batch, length)}
            ratios = {}
            if baseline in point:
                base = point[baseline]
                for impl, r in point.items():
                    if impl == baseline:
                        continue
                    ratios[impl] = {"speedup": round(base["time_s"] / r["time_s"], 3),
                                    "memory_ratio": round(r["peak_bytes"] / max(base["peak_bytes"], 1), 3)}
                    if r.get("optimizer_time_s") and base.get("optimizer_time_s"):
                        ratios[impl]["optimizer_speedup"] = round(base["optimizer_time_s"] / r["optimizer_time_s"], 3)
            if REFERENCE in point:
                reference = point[REFERENCE]["time_s"]
                ratios["reference_ratio"] = {impl: round(reference / r["time_s"], 3)
                                             for impl, r in point.items() if impl in ORCHID_CANDIDATES}
            if ratios:
                summary["train_speedups"].setdefault(level, {})[shape] = ratios


def format_ratio(ratio: float) -> str:
    """A ratio as the tables show it: ``7.47x``."""
    return f"{ratio:.2f}x"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1e3 * seconds:,.1f}"


def _mib(num_bytes: float | None) -> str:
    return "-" if num_bytes is None else f"{num_bytes / 2**20:,.1f}"


def markdown_report(result: dict, settings: BenchmarkSettings) -> str:
    """The Markdown report of a run: the machine, then a table per part and mode, times (ms), ratios to the baseline
    and peak memory (MiB)."""
    records, summary = result["records"], result["summary"]
    lines = [f"# Orchid benchmark ({result['tag'] or 'untagged'})", ""]
    machine = result["machine"]
    lines += [
        f"Machine: {machine_text(machine)}, {machine.get('memory_total_gib', '?')} GiB; device "
        f"{machine.get('device', 'cpu')}, {settings.dtype}, {settings.threads} thread(s); transformers "
        f"{machine.get('versions', {}).get('transformers', '?')}; {commit_text(result)}. Started {result['started']}, "
        f"load average {result['load'][0]} -> {result['load'][1]}.",
        f"Environment: {' '.join(f'{k}={v}' for k, v in machine.get('environment', {}).items()) or 'defaults'}.",
        f"Command: `{result['command']}`" + (f"; reference: `{settings.reference}`" if settings.reference else ""),
        "",
        "Times are medians of interleaved repeats (ms), each candidate in its own worker process; memory is the peak "
        "of tensor allocations during one call (MiB; torch.profiler on CPU, the CUDA allocator's peak on a GPU). `*` "
        "marks values extrapolated from a power law, not measured. A speed-up is the baseline's time divided by the "
        "candidate's (above 1: the candidate is faster); a memory ratio the candidate's peak divided by the "
        "baseline's.",
        "",
    ]
    operator = [r for r in records if r["part"] == "operator"]
    if operator:
        for mode in settings.modes:
            impls = list(dict.fromkeys(r["impl"] for r in operator if r["mode"] == mode))
            lines += [f"## Operator, {mode.replace('_', ' + ')} (batch 1, hidden {settings.hidden})", ""]
            header = ["L"] + [f"{LABELS[i]} ms" for i in impls] + [f"{LABELS[i]} MiB" for i in impls]
            rows = []
            for length in settings.lengths:
                cells_t, cells_m = [], []
                for impl in impls:
                    rec = next((r for r in operator if r["impl"] == impl and r["mode"] == mode
                                and r["length"] == length), None)
                    mark = "*" if rec and rec["extrapolated"] else ""
                    if rec and rec.get("failed"):
                        cells_t.append("failed²")
                    else:
                        cells_t.append(_ms(rec["time_s"]) + mark if rec else "-")
                    cells_m.append(_mib(rec["peak_bytes"]) + mark if rec and rec["peak_bytes"] else "-")
                rows.append([length, *cells_t, *cells_m])
            lines += table_lines(header, rows) + [""]
            lines += failure_notes([r for r in operator if r["mode"] == mode])
        if summary["exponents"]:
            rows = []
            for key, value in summary["exponents"].items():
                impl, mode = key.split("/")
                rows.append([LABELS[impl], mode, f"{value['exponent']:.3f}", f"{value['range'][0]}-{value['range'][1]}",
                             value["points"]])
            lines += ["## Time-versus-length exponents", ""]
            lines += table_lines(["candidate", "mode", "exponent", "lengths", "points"], rows) + [""]
        if summary["memory_ratios"]:
            rows = []
            for key, value in summary["memory_ratios"].items():
                mode, versus = key.split("/")
                mark = " (attention extrapolated)" if value["attention_extrapolated"] else ""
                rows.append([mode, versus, f"{value['ratio']:.3f}{mark}"])
            lines += [f"## Memory at L = {settings.memory_length}", ""]
            lines += table_lines(["mode", "Orchid / attention", "ratio"], rows) + [""]
    model = [r for r in records if r["part"] == "model"]
    for mode in dict.fromkeys(r["mode"] for r in model):
        impls = list(dict.fromkeys(r["impl"] for r in model if r["mode"] == mode))
        baseline = baseline_of("model")
        orchids = [impl for impl in impls if impl != baseline]
        header = ["(B, L)"] + [f"{LABELS[i]} ms" for i in impls]
        header += [f"{LABELS[i]} speed-up over {LABELS[baseline]}" for i in orchids]
        header += [f"{LABELS[i]} MiB" for i in impls] + ["load"]
        lines += [f"## Model, {mode.replace('_', ' + ')}, {settings.dtype}, {settings.layers} layers: orchid-bert-base "
                  f"vs {LABELS[baseline]}", ""]
        rows = []
        for batch, length in settings.model_shapes:
            point = {r["impl"]: r for r in model if r["mode"] == mode and (r["batch"], r["length"]) == (batch, length)}
            if baseline not in point:
                continue
            base_time = point[baseline]["time_s"]
            cells = [f"({batch}, {length})"]
            cells += ["failed²" if point[i].get("failed") else
                      _ms(point[i]["time_s"]) + ("¹" if point[i].get("single_call") else "") for i in impls]
            cells += ["-" if base_time is None or point[i].get("failed")
                      else format_ratio(base_time / point[i]["time_s"]) for i in orchids]
            cells += [_mib(point[i]["peak_bytes"]) for i in impls]
            load = next(r["load"] for r in point.values() if r.get("load"))
            cells.append(f"{load[0]}-{load[1]}")
            rows.append(cells)
        lines += table_lines(header, rows) + [""]
        lines += failure_notes([r for r in model if r["mode"] == mode])
        unseen = [LABELS[impl] for impl in impls if not CANDIDATES[impl].torch_memory]
        if unseen:
            lines += [f"{', '.join(unseen)}: allocates outside PyTorch, so its memory is not measured (`-`); `--rss` "
                      "gives each call's peak RSS growth.", ""]
        if any(r.get("single_call") for r in model if r["mode"] == mode):
            lines += ["¹ a single call (the profiled warm-up): at this size one call takes minutes.", ""]
    lines += train_markdown([r for r in records if r["part"] == "train"], settings)
    return "\n".join(lines)


def train_markdown(records: list[dict], settings: BenchmarkSettings) -> list[str]:
    """The train part's tables: per level, each shape's forward + backward times, the speed-ups over the baseline, the
    optimizer steps (model level), peak memory and its ratio to the baseline's."""
    lines: list[str] = []
    for level in TRAIN_LEVELS:
        own = [r for r in records if r["level"] == level]
        if not own:
            continue
        table = f"train_{level}"
        labels = {name: candidate.table_label(table) for name, candidate in CANDIDATES.items()}
        baseline = baseline_of(table)
        impls = list(dict.fromkeys(r["impl"] for r in own))
        orchids = [impl for impl in impls if impl != baseline]
        header = ["(B, L)"] + [f"{labels[i]} ms" for i in impls]
        header += [f"{labels[i]} speed-up over {labels[baseline]}" for i in orchids]
        if level == "model":
            header += [f"{labels[i]} optimizer step ms" for i in impls]
        header += [f"{labels[i]} MiB" for i in impls] + [f"{labels[i]} memory / {labels[baseline]}" for i in orchids]
        header.append("load")
        if level == "model":
            lines += [f"## Training step, model, {settings.dtype}, {settings.layers} layers, dropout 0: "
                      f"{labels['orchid']} vs {labels[baseline]}", "",
                      f"Forward + backward of the model's own MLM loss ({MLM_PROBABILITY:.0%} of the positions "
                      "labelled), then apart the AdamW step (`optimizer.step()` and `zero_grad(set_to_none=True)`); "
                      "MiB: the peak of the forward + backward call.", ""]
        else:
            lines += [f"## Training step, operator alone, forward + backward (hidden {settings.hidden}): "
                      f"{labels['orchid']} vs {labels[baseline]}", ""]
        rows = []
        for batch, length in dict.fromkeys((r["batch"], r["length"]) for r in own):
            point = {r["impl"]: r for r in own if (r["batch"], r["length"]) == (batch, length)}
            cells = [f"({batch}, {length})"]
            cells += [_train_cell(point, i, "time_s", _ms) + ("¹" if point.get(i, {}).get("single_call") else "")
                      for i in impls]
            cells += [_train_ratio(point, i, baseline, "time_s") for i in orchids]
            if level == "model":
                cells += [_train_cell(point, i, "optimizer_time_s", _ms) for i in impls]
            cells += [_train_cell(point, i, "peak_bytes", _mib) for i in impls]
            cells += [_train_ratio(point, i, baseline, "peak_bytes") for i in orchids]
            load = next((r["load"] for r in point.values() if r.get("load")), None)
            cells.append("-" if load is None else f"{load[0]}-{load[1]}")
            rows.append(cells)
        lines += table_lines(header, rows) + [""]
        lines += failure_notes(own, labels)
        if any(r.get("single_call") for r in own):
            lines += ["¹ a single call (the profiled warm-up; the optimizer step after it): at this size one call "
                      "takes minutes.", ""]
    return lines


def _train_cell(point: dict[str, dict], impl: str, key: str, fmt: Callable) -> str:
    record = point.get(impl)
    return "-" if record is None else "failed²" if record.get("failed") else fmt(record.get(key))


def _train_ratio(point: dict[str, dict], impl: str, baseline: str, key: str) -> str:
    """A candidate's ratio to the baseline at a point: of times as a speed-up (baseline / candidate), of peak memory as
    a fraction (candidate / baseline)."""
    record, base = point.get(impl), point.get(baseline)
    if not (record and base and record.get(key) and base.get(key)):  # failed, or not measured
        return "-"
    memory = key == "peak_bytes"
    value = record[key] / base[key] if memory else base[key] / record[key]
    return format_ratio(value)


def failure_notes(records: list[dict], labels: dict[str, str] = LABELS) -> list[str]:
    """The footnote that says why the candidates marked ``failed²`` failed."""
    failures = [f"{labels[r['impl']]} at (B={r['batch']}, L={r['length']}): {r['failed']}"
                for r in records if r.get("failed")]
    return ["² failed: " + "; ".join(failures) + ".", ""] if failures else []


def plot(result: dict, settings: BenchmarkSettings, path: Path) -> None:
    """Runtime against length like Figure C.4 (forward; forward + backward) and peak memory."""
    from orchid_hf.extras import require_extra

    require_extra("matplotlib", "plot").use("Agg")
    import matplotlib.pyplot as plt

    operator = [r for r in result["records"] if r["part"] == "operator"]
    panels = [(mode, "time_s", 1e3, "Runtime (ms)") for mode in settings.modes]
    panels.append(("forward", "peak_bytes", 2.0**-20, "Peak tensor memory, forward (MiB)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2))
    impls = list(dict.fromkeys(r["impl"] for r in operator))
    for ax, (mode, key, scale, ylabel) in zip(axes, panels):
        for impl in impls:
            own = sorted((r for r in operator if r["impl"] == impl and r["mode"] == mode and r[key]
                          and not r.get("failed")), key=lambda r: r["length"])
            drawn = [r for r in own if not r["extrapolated"]]
            predicted = [r for r in own if r["extrapolated"]]
            if drawn:
                ax.plot([r["length"] for r in drawn], [scale * r[key] for r in drawn], "o-",
                        color=CANDIDATES[impl].color, label=LABELS[impl])
            if predicted:
                bridge = drawn[-1:] + predicted
                ax.plot([r["length"] for r in bridge], [scale * r[key] for r in bridge], "o--",
                        color=CANDIDATES[impl].color, markerfacecolor="none", label=f"{LABELS[impl]} (extrapolated)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("Sequence length L")
        ax.set_ylabel(ylabel)
        title = "Memory" if key == "peak_bytes" else mode.replace("_", " + ").capitalize()
        ax.set_title(f"{title} (hidden {settings.hidden}, batch 1)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    where = result["machine"].get("device", "cpu")
    where = result["machine"].get("processor", "CPU") + f", {settings.threads} thread(s)" if where == "cpu" else where
    fig.suptitle(f"Orchid vs attention on {where}, {str(settings.dtype).replace('torch.', '')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
