"""The benchmark's three parts, each a series of points (a candidate set at one shape) measured by
:func:`benchmarks.measure.measure_point`, and their records (one per candidate and point, as the JSON holds them).

* operator: one Orchid operator against a multi-head self-attention block of the same width (QKV projection,
  ``torch.nn.functional.scaled_dot_product_attention``, output projection) at batch 1 and growing length, forward and
  forward + backward. Attention runs twice: with SDPA's default backend (on the CPU its flash kernel, O(L) memory) and
  with SDPA forced to its math backend, which materialises the L x L scores as the paper's "Attention" does (App. C.6,
  Figure C.4). A candidate whose next call is predicted (power law through its last points) to take longer than
  ``max_call_s`` is not run at longer lengths; nor is one that would need more memory than is available (math
  attention's scores). Their later points are predicted from that power law and marked ``extrapolated``.
* model: ``orchid-bert-base`` against transformers' ``BertModel`` of the same width and depth (SDPA attention), at
  (batch, length) shapes, forward (``--model-modes forward_backward`` for a training step without the optimizer).
* train: a training step as users train these models. ``OrchidForMaskedLM`` (orchid-bert-base's sizes,
  ``max_position_embeddings = L``) against ``BertForMaskedLM`` of the same width, depth, intermediate size and
  vocabulary (12 heads, SDPA), in train mode, dropout 0, on seeded random token ids with MLM labels (15% of the
  positions, the same for both); forward + backward of the model's own loss, then apart the AdamW step
  (``step()`` and ``zero_grad(set_to_none=True)``). Then the operator alone against the attention block (SDPA's
  default backend), forward + backward at the same shapes.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from benchmarks.candidates import CANDIDATES, candidates_in
from benchmarks.harness import fit_power_law, load_average, predicted_seconds
from benchmarks.measure import Workers, available_bytes, math_attention_bytes, measure_point
from benchmarks.settings import BenchmarkSettings

TRAIN_LEVELS = ("model", "operator")


def measured(records: list[dict]) -> list[dict]:
    """The records with a measured time: neither extrapolated nor failed."""
    return [r for r in records if not r.get("extrapolated") and not r.get("failed")]


def _predicted_time(records: list[dict], impl: str, mode: str, length: int) -> float | None:
    own = sorted((r for r in measured(records) if r["impl"] == impl and r["mode"] == mode), key=lambda r: r["length"])
    return predicted_seconds([(r["batch"], r["length"], r["time_s"]) for r in own], 1, length)


def run_operator_part(settings: BenchmarkSettings, workers: Workers, log: Callable[[str], None],
                      save: Callable[[list[dict]], None]) -> list[dict]:
    """Orchid operator vs attention at batch 1 over lengths; one record per (impl, mode, length)."""
    records: list[dict] = []
    hidden, heads, batch = settings.hidden, settings.heads, 1
    for mode in settings.modes:
        impls = candidates_in("operator", mode, settings)
        stopped: dict[str, str] = {}
        for length in settings.lengths:
            for impl in impls:
                if impl in stopped:
                    continue
                predicted = _predicted_time(records, impl, mode, length)
                if predicted is not None and predicted > settings.max_call_s:
                    stopped[impl] = f"predicted {predicted:.0f} s per call > budget {settings.max_call_s:.0f} s"
                elif CANDIDATES[impl].materialises_scores:
                    need = math_attention_bytes(batch, heads, length, mode, settings.dtype.itemsize)
                    if need > 0.6 * available_bytes(settings.device):
                        stopped[impl] = f"needs about {need / 2**30:.0f} GiB for the L x L scores"
            active = [impl for impl in impls if impl not in stopped]
            if not active:
                break
            load_before = load_average()
            spec = dict(part="operator", mode=mode, length=length, batch=batch, hidden=hidden, heads=heads,
                        quick=settings.quick)
            results = measure_point(workers, active, spec, settings)
            load_after = load_average()
            for impl in active:
                m = results[impl]
                if "failed" in m:
                    stopped[impl] = m["failed"]
                    records.append(failed_record("operator", impl, mode, batch, length, m["failed"], hidden=hidden))
                    log(f"operator {mode:16s} L={length:6d} {impl:18s} failed: {m['failed']}")
                    continue
                records.append(point_record("operator", impl, mode, batch, length, m, [load_before, load_after],
                                            hidden=hidden))
                median = records[-1]["time_s"]
                log(f"operator {mode:16s} L={length:6d} {impl:18s} {1e3 * median:10.1f} ms "
                    f"(n={len(m['times_s'])})  peak {m['peak_bytes'] / 2**20:9.1f} MiB  "
                    f"load {load_before}->{load_after}")
            save(records)
        for impl, reason in stopped.items():
            log(f"operator {mode}: {impl} stopped: {reason}")
        records += _extrapolate(records, mode, settings.lengths, stopped)
        save(records)
    return records


def failed_record(part: str, impl: str, mode: str, batch: int, length: int, reason: str, **fields) -> dict:
    """The record of a candidate that failed at a point: no time, no memory, and why."""
    return dict(part=part, impl=impl, mode=mode, batch=batch, length=length, time_s=None, times_s=[],
                peak_bytes=None, later_peak_bytes=None, rss_peak_bytes=None, single_call=False, extrapolated=False,
                failed=reason, **fields)


def point_record(part: str, impl: str, mode: str, batch: int, length: int, m: dict, load: list[float],
                 **fields) -> dict:
    """The record of one candidate at one point from what ``measure_point`` measured (``m``): the median of its
    times, its peak memory and, in the train part, the median of its optimizer steps; or a failed record."""
    if "failed" in m:
        return failed_record(part, impl, mode, batch, length, m["failed"], **fields)
    record = dict(part=part, impl=impl, mode=mode, batch=batch, length=length, time_s=statistics.median(m["times_s"]),
                  times_s=m["times_s"], peak_bytes=m["peak_bytes"], later_peak_bytes=m.get("later_peak_bytes"),
                  rss_peak_bytes=m.get("rss_peak_bytes"), single_call=m["single_call"], extrapolated=False,
                  load=load, **fields)
    if m.get("optimizer_times_s"):
        record.update(optimizer_time_s=statistics.median(m["optimizer_times_s"]),
                      optimizer_times_s=m["optimizer_times_s"])
    return record


def _extrapolate(records: list[dict], mode: str, lengths: list[int], stopped: dict[str, str]) -> list[dict]:
    """Predicted points for candidates that stopped early, from a power law through their last 3 points."""
    predicted = []
    for impl, reason in stopped.items():
        own = sorted((r for r in measured(records) if r["impl"] == impl and r["mode"] == mode),
                     key=lambda r: r["length"])
        if len(own) < 2:
            continue
        last = own[-3:]
        time_fit = fit_power_law([r["length"] for r in last], [r["time_s"] for r in last])
        memory_fit = fit_power_law([r["length"] for r in last], [r["peak_bytes"] for r in last])
        for length in lengths:
            if length <= own[-1]["length"]:
                continue
            predicted.append(
                dict(part="operator", impl=impl, mode=mode, batch=own[-1]["batch"], length=length,
                     hidden=own[-1]["hidden"], time_s=math.exp(time_fit[1]) * length ** time_fit[0],
                     times_s=[], peak_bytes=math.exp(memory_fit[1]) * length ** memory_fit[0] if memory_fit else None,
                     rss_peak_bytes=None, extrapolated=True, reason=reason)
            )
    return predicted


def run_model_part(settings: BenchmarkSettings, workers: Workers, log: Callable[[str], None],
                   save: Callable[[list[dict]], None]) -> list[dict]:
    """orchid-bert-base (as built, optimised, and the reference version) vs BertModel at the configured shapes."""
    records: list[dict] = []
    for mode in settings.model_modes:
        impls = candidates_in("model", mode, settings)
        for batch, length in settings.model_shapes:
            load_before = load_average()
            spec = dict(part="model", mode=mode, length=length, batch=batch, quick=settings.quick,
                        layers=settings.layers)
            results = measure_point(workers, impls, spec, settings)
            load_after = load_average()
            for impl in impls:
                records.append(point_record("model", impl, mode, batch, length, results[impl],
                                            [load_before, load_after]))
            log(f"model {mode} (B={batch}, L={length}): {point_summary(records[-len(impls):])}, "
                f"load {load_before}->{load_after}")
            save(records)
    return records


def point_summary(point: list[dict]) -> str:
    """One point's records for the log: each candidate's time (and optimizer step), or why it failed."""
    def one(r: dict) -> str:
        if r.get("failed"):
            return f"{r['impl']} failed ({r['failed']})"
        optimizer = f" + optimizer {1e3 * r['optimizer_time_s']:.1f} ms" if r.get("optimizer_time_s") else ""
        return f"{r['impl']} {1e3 * r['time_s']:.1f} ms{optimizer}"

    return ", ".join(one(r) for r in point)


def run_train_part(settings: BenchmarkSettings, workers: Workers, log: Callable[[str], None],
                   save: Callable[[list[dict]], None]) -> list[dict]:
    """A training step at the configured shapes: OrchidForMaskedLM (and the reference version) vs BertForMaskedLM,
    forward + backward and the optimizer step; then the operator alone vs attention, forward + backward. One record
    per (level, impl, shape)."""
    records: list[dict] = []
    mode = "forward_backward"
    for level in TRAIN_LEVELS:
        impls = candidates_in(f"train_{level}", mode, settings)
        fields = dict(level=level) if level == "model" else dict(level=level, hidden=settings.hidden)
        for batch, length in settings.train_shapes:
            load_before = load_average()
            spec = dict(part="train", level=level, mode=mode, length=length, batch=batch, quick=settings.quick,
                        layers=settings.layers, hidden=settings.hidden, heads=settings.heads)
            results = measure_point(workers, impls, spec, settings)
            load_after = load_average()
            for impl in impls:
                record = point_record("train", impl, mode, batch, length, results[impl], [load_before, load_after],
                                      **fields)
                if level == "model":
                    record.setdefault("optimizer_time_s", None)
                    record.setdefault("optimizer_times_s", [])
                records.append(record)
            log(f"train {level} (B={batch}, L={length}): {point_summary(records[-len(impls):])}, "
                f"load {load_before}->{load_after}")
            save(records)
    return records
