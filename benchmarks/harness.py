"""The harness of the research code: what the benchmarks (``benchmarks/``) and the experiments (``experiments/``) share.

* Timing: :func:`timed_call` (CUDA events on a GPU, the wall clock elsewhere), :func:`median_seconds`,
  :func:`interleaved_times`; and what a time is predicted to be at a larger size (:func:`fit_power_law`,
  :func:`predicted_seconds`).
* Peak memory: :func:`peak_bytes` (the CUDA allocator's peak, or the profiler's allocation events on the CPU),
  :func:`profiled_peak_bytes`, :func:`rss_peak_bytes`.
* Where a result was measured: :func:`provenance`, the commit of the working tree, whether it had uncommitted changes,
  and :func:`machine_description`, what every JSON file a benchmark or an experiment writes records;
  :func:`machine_text` says it in a line.
* Reports: :func:`table_lines` (Markdown tables), :func:`replace_block` and :func:`block_names` (the generated blocks
  of a page, between ``<!-- KIND:NAME -->`` and ``<!-- /KIND:NAME -->``), :func:`write_json`, :func:`write_result`,
  :func:`write_text_atomically`.
* Command lines: :func:`check_at_least`.

It imports torch and the standard library only: the GPU check (``benchmarks/gpu.py``) runs it on a machine where the
package is not installed, and records the machine before it imports anything else.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
import re
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
# The packages whose versions a machine description lists.
PACKAGES = ("torch", "transformers", "accelerate", "triton", "scipy", "numpy", "safetensors", "tokenizers",
            "huggingface_hub")  # fmt: skip
# lscpu's fields that a machine description keeps (besides the model name, its "processor").
LSCPU_FIELDS = ("CPU(s)", "Thread(s) per core", "L2 cache", "L3 cache", "Flags")


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------


def timed_call(step: Callable[[], object], device: str | torch.device = "cpu") -> float:
    """Seconds of one call of ``step``: CUDA events around it on a GPU (the kernels it queued included), the wall
    clock elsewhere."""
    if torch.device(device).type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    began = time.perf_counter()
    step()
    return time.perf_counter() - began


def median_seconds(step: Callable[[], object], calls: int, device: str | torch.device = "cpu") -> float:
    """The median of ``calls`` timed calls of ``step`` (:func:`timed_call`), after one untimed warm-up call."""
    step()
    return statistics.median(timed_call(step, device) for _ in range(calls))


def interleaved_times(
    steps: dict[str, Callable[[], float]], repeats: int, min_repeats: int, budget_s: float
) -> dict[str, list[float]]:
    """Seconds per call of each step (each returns the seconds its call took), timed in rounds of one call each;
    stops after ``repeats`` rounds, or after ``min_repeats`` rounds once ``budget_s`` is spent. Each round starts with
    the next step in turn, so that no step always runs right after the same other one and load from other processes
    hits them alike."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    start = time.perf_counter()
    for round_index in range(repeats if names else 0):  # none where every candidate at a point failed
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(steps[name]())
        if round_index + 1 >= min_repeats and time.perf_counter() - start > budget_s:
            break
    return times


def fit_power_law(lengths: Sequence[float], values: Sequence[float]) -> tuple[float, float] | None:
    """Least-squares fit of log(value) = exponent * log(length) + intercept over the positive values; None with fewer
    than two of them, or one length only."""
    points = [(math.log(n), math.log(v)) for n, v in zip(lengths, values) if v and v > 0]
    if len(points) < 2:
        return None
    mean_x = statistics.fmean(p[0] for p in points)
    mean_y = statistics.fmean(p[1] for p in points)
    var = sum((p[0] - mean_x) ** 2 for p in points)
    if var == 0:
        return None
    slope = sum((p[0] - mean_x) * (p[1] - mean_y) for p in points) / var
    return slope, mean_y - slope * mean_x


def predicted_seconds(
    points: Sequence[tuple[int, int, float]], batch: int, length: int, exponent: float | None = None
) -> float | None:
    """Seconds per call at (batch, length) from measured ``(batch, length, seconds)`` points, proportional to the
    batch: with ``exponent``, the last point grown as ``length ** exponent``; without, the power law fitted through
    the last three points (:func:`fit_power_law`). None where the points do not tell (none, or too few to fit)."""
    if not points:
        return None
    if exponent is not None:
        last_batch, last_length, seconds = points[-1]
        return seconds * (batch / last_batch) * (length / last_length) ** exponent
    last = points[-3:]
    fit = fit_power_law([n for _, n, _ in last], [seconds / b for b, _, seconds in last])
    return None if fit is None else batch * math.exp(fit[1]) * length ** fit[0]


# ---------------------------------------------------------------------------------------------
# Peak memory
# ---------------------------------------------------------------------------------------------


def peak_bytes(fn: Callable[[], object], device: str | torch.device = "cpu") -> int:
    """Peak tensor memory of one call of ``fn`` above what existed before it: the CUDA allocator's peak statistic on
    a GPU, the profiler's allocation events on the CPU (:func:`profiled_peak_bytes`)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    return profiled_peak_bytes(fn)


def profiled_peak_bytes(fn: Callable[[], object]) -> int:
    """Run fn once under the profiler; the peak of live tensor bytes it allocated (allocations minus frees): every
    tensor the call allocates through PyTorch's allocator, not MKL's or oneDNN's own workspaces."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    live = peak = 0
    for event in events:
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def rss_peak_bytes(fn: Callable[[], object]) -> int:
    """How far one call raises this process's peak resident set size above its size before the call (Linux): it sees
    everything, allocator slack included."""
    with open("/proc/self/clear_refs", "w") as clear:  # resets VmHWM to the current RSS
        clear.write("5")
    before = _status_kib("VmRSS")
    fn()
    return (_status_kib("VmHWM") - before) * 1024


# ---------------------------------------------------------------------------------------------
# Where a result was measured
# ---------------------------------------------------------------------------------------------


RESULTS_DIR = "docs/results"  # the run files of the docs, relative to the checkout's root


def git_state(root: str | Path = REPO_ROOT) -> dict:
    """``commit``: the full hash of the checkout's HEAD, and ``uncommitted_changes``: whether its working tree differs
    from it (tracked files changed, or files git does not ignore added) outside ``RESULTS_DIR``, where the runs write
    their own files (a run that writes several would otherwise see its first ones); both None where git or a
    repository is not there (a copied tree)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10,
                                check=True).stdout.strip()  # fmt: skip
        status = subprocess.run(["git", "status", "--porcelain", "--", ".", f":(exclude){RESULTS_DIR}"], cwd=root,
                                capture_output=True, text=True, timeout=30, check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "uncommitted_changes": None}
    return {"commit": commit, "uncommitted_changes": bool(status)}


def package_versions(names: Iterable[str] = PACKAGES) -> dict[str, str | None]:
    """The installed version of each package, None where it is not installed."""
    found = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def _lscpu() -> dict[str, str]:
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def machine_description(threads: int | None = None, device: str | torch.device = "cpu") -> dict:
    """The machine a result is measured on: ``device`` (``cpu``, or the GPU's name), ``processor`` (lscpu's model
    name where it has one), ``cpu_count``, ``platform``, ``python``, ``torch`` (its version), ``torch_threads``
    (``threads``, default torch's present count), ``cpu_capability`` (the instruction set of ATen's vectorised CPU
    kernels), ``memory_total_gib``, lscpu's cache and thread counts and its AVX / FMA flags, the ``versions`` of the
    packages that matter (:data:`PACKAGES`), the allocator, threading and kernel-choice variables of the
    ``environment``; on a GPU also ``cuda`` and ``gpu`` (name, memory, compute capability, cuDNN)."""
    device = torch.device(device)
    lscpu = _lscpu()
    info = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "processor": lscpu.get("Model name") or platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads() if threads is None else threads,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    for key in LSCPU_FIELDS:
        if key in lscpu:
            value = lscpu[key]
            if key == "Flags":
                value = " ".join(f for f in value.split() if f.startswith(("avx512f", "avx2", "fma")))
            info[key] = value
    try:
        info["memory_total_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    info["versions"] = package_versions()
    # Allocator and threading settings change CPU timings (page faults of fresh allocations), and ATen's kernel choice
    # changes rounding: recorded with them.
    prefixes = ("MALLOC_", "GLIBC_TUNABLES", "OMP_", "MKL_", "THP_", "LD_PRELOAD", "ATEN_")
    info["environment"] = {k: v for k, v in os.environ.items() if k.startswith(prefixes)}
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        info["cuda"] = torch.version.cuda
        info["gpu"] = {"name": properties.name, "memory_gib": round(properties.total_memory / 2**30, 1),
                       "capability": f"{properties.major}.{properties.minor}",
                       "cudnn": torch.backends.cudnn.version()}  # fmt: skip
    return info


def provenance(threads: int | None = None, device: str | torch.device = "cpu", commit: str | None = None) -> dict:
    """What every JSON file of a benchmark or an experiment records about where it was made: ``commit`` and
    ``uncommitted_changes`` (:func:`git_state`; ``commit`` given where git cannot tell, as in a copied tree, with
    ``uncommitted_changes`` then unknown) and ``machine`` (:func:`machine_description`)."""
    state = git_state() if commit is None else {"commit": commit, "uncommitted_changes": None}
    return {**state, "machine": machine_description(threads, device)}


def machine_text(machine: dict) -> str:
    """A machine description (:func:`machine_description`) in a line: processor, cores, platform and torch (``?``
    for what it lacks)."""
    fields = ("processor", "cpu_count", "platform", "torch")
    processor, cores, system, torch_version = (machine.get(name, "?") for name in fields)
    return f"{processor}, {cores} cores, {system}, torch {torch_version}"


def commit_text(record: dict) -> str:
    """A record's commit (:func:`provenance`) in words: its hash, and whether the tree had uncommitted changes."""
    commit = record.get("commit")
    if commit is None:
        return "commit unknown"
    changes = {True: " with uncommitted changes", False: "", None: " (uncommitted changes unknown)"}
    return f"commit {commit[:12]}{changes[record.get('uncommitted_changes')]}"


def load_average() -> float:
    """The system's load average over the last minute (NaN where the system does not tell)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return float("nan")


# ---------------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------------


def table_lines(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """A Markdown table: the header, its separator and a line per row, cells as ``str`` gives them; a ValueError
    naming the row whose cells do not match the header's."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [str(cell) for cell in row]
        if len(cells) != len(header):
            raise ValueError(f"a table row has {len(cells)} cells for {len(header)} columns: {cells}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def block_markers(kind: str, name: str) -> tuple[str, str]:
    """The markers of a generated block ``name`` of a page's ``kind`` of blocks: ``<!-- KIND:NAME -->`` and
    ``<!-- /KIND:NAME -->``."""
    return f"<!-- {kind}:{name} -->", f"<!-- /{kind}:{name} -->"


def block_names(text: str, kind: str) -> list[str]:
    """The names of the generated blocks of ``kind`` in ``text``, in order."""
    return re.findall(rf"<!-- {re.escape(kind)}:(.+?) -->", text)


def replace_block(text: str, kind: str, name: str, content: str) -> str:
    """``text`` with what lies between the markers of block ``name`` (:func:`block_markers`) replaced by
    ``content``, one line break after the start marker and one before the end marker; a ValueError naming the block
    where its markers are missing."""
    start, end = block_markers(kind, name)
    if start not in text or end not in text:
        raise ValueError(f"the text has no {start} ... {end} block to fill")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{content}\n{end}{tail}"


def write_text_atomically(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename: a process killed while writing leaves the
    previous version."""
    path = Path(path)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def write_json(path: str | Path, data: dict) -> Path:
    """``data`` as indented JSON in ``path`` (its folder made if missing); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    return path


def write_result(result: dict, out_dir: str | Path, stem: str, markdown: Callable[[dict], str]) -> None:
    """A benchmark's result as ``STEM.json`` and its tables as ``STEM.md`` in ``out_dir`` (made if missing); the
    tables are printed too."""
    write_json(Path(out_dir) / f"{stem}.json", result)
    text = markdown(result)
    (Path(out_dir) / f"{stem}.md").write_text(text)
    print(text)


# ---------------------------------------------------------------------------------------------
# Command lines
# ---------------------------------------------------------------------------------------------


def check_at_least(parser, args, *flags: str, minimum: int = 1) -> None:
    """``parser.error`` naming the first of ``flags`` (``--name`` or ``--some-name``; the value is ``args.name`` or
    ``args.some_name``) whose value is below ``minimum``; a flag left at None is not checked."""
    for flag in flags:
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is not None and value < minimum:
            parser.error(f"{flag} must be at least {minimum}, got {value}")
