"""Measuring the CPU benchmark's candidates: each in a worker process of its own, called in interleaved rounds, with
the harness's timing and peak memory (``benchmarks/harness.py``).

Each candidate lives in a worker process of its own, so that no candidate inherits another's memory allocator state
(on the CPU, fresh pages of a large tensor cost about as much as the pass that fills them, and which tensors get fresh
pages depends on everything allocated and freed before). The workers are called in interleaved rounds, one call each,
each round starting with the next candidate in turn, so that load from other processes hits them alike; only one worker
runs at a time. A candidate's first call at a point is a warm-up, run under ``torch.profiler`` with
``profile_memory=True``: the peak of the running sum of tensor allocations minus frees during that call is the peak
memory reported (every tensor the call allocates through PyTorch's allocator; not the weights and inputs that exist
before it, nor MKL's or oneDNN's own workspaces). ``--rss`` also measures the growth of the worker's peak resident set
size over one call (``VmHWM`` after a reset through ``/proc/self/clear_refs``), which sees everything, allocator slack
included. A candidate whose warm-up call alone took longer than ``max_call_s`` is timed by that one call
(``single_call``). With ``--device cuda`` every step synchronises and memory is the CUDA allocator's peak.

A worker is ``python -m benchmarks.measure --worker SETTINGS`` run from the repository root.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.candidates import CANDIDATES, REFERENCE, build_steps, load_modeling
from benchmarks.harness import interleaved_times, peak_bytes, rss_peak_bytes, timed_call
from benchmarks.settings import BenchmarkSettings

# Calls up to this long are profiled a second time after timing, for the peak memory of later calls.
LATER_PEAK_MAX_CALL_S = 20.0
REPO_ROOT = Path(__file__).resolve().parents[1]  # workers run ``python -m benchmarks.measure`` from here
WORKER_MODULE = "benchmarks.measure"
WORKER_REPLY = "@@benchmark-worker "  # the prefix of a worker's replies on its stdout


class WorkerState:
    """What a worker process holds: the candidate built for the current point, its step, and in the train part its
    optimizer step (run after every profiled or timed step, and timed on its own)."""

    def __init__(self, settings: dict):
        torch.set_num_threads(settings["threads"])
        self.device = settings["device"]
        self.dtype = getattr(torch, settings["dtype"])
        self.reference = load_modeling(settings["reference"]) if settings.get("reference") else None
        self.step = self.optimizer_step = None

    def build(self, spec: dict) -> dict:
        self.step = self.optimizer_step = None
        torch.manual_seed(0)
        self.step, self.optimizer_step = build_steps(spec, self.reference, self.device, self.dtype)
        return {}

    def _then_optimizer(self, reply: dict) -> dict:
        """After a step of the train part, the optimizer step on its gradients, timed apart (``optimizer_s``)."""
        if self.optimizer_step is not None:
            reply["optimizer_s"] = timed_call(self.optimizer_step, self.device)
        return reply

    def handle(self, request: dict) -> dict:
        op = request["op"]
        if op == "build":
            return self.build(request["spec"])
        if op == "time":
            return self._then_optimizer({"seconds": timed_call(self.step, self.device)})
        if op == "profile":
            peak = []
            seconds = timed_call(lambda: peak.append(peak_bytes(self.step, self.device)), self.device)
            return self._then_optimizer({"peak_bytes": peak[0], "seconds": seconds})
        if op == "rss":
            return {"rss_peak_bytes": rss_peak_bytes(self.step)}
        if op == "release":
            self.step = self.optimizer_step = None
            return {}
        raise ValueError(f"unknown worker request {op!r}")


def worker_main(settings: dict) -> None:
    """A worker's loop: one JSON request per line on stdin, one reply per line on stdout after WORKER_REPLY."""
    state = WorkerState(settings)
    print(WORKER_REPLY + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "exit":
            break
        try:
            reply = state.handle(request)
        except Exception:  # reported to the coordinator, which raises it with the worker's traceback
            reply = {"error": traceback.format_exc()}
        print(WORKER_REPLY + json.dumps(reply), flush=True)


class WorkerFailure(RuntimeError):
    """A candidate's worker failed a request: an exception in it (``reason`` is its last line), or the process ended
    (killed by the kernel when memory runs out, for one)."""

    def __init__(self, impl: str, reason: str, details: str):
        super().__init__(f"benchmark worker {impl} failed: {reason}\n{details}")
        self.reason = reason


class Worker:
    """A candidate's worker process, seen from the coordinator."""

    def __init__(self, impl: str, settings: BenchmarkSettings):
        self.impl = impl
        worker_settings = settings.worker_settings
        if impl != REFERENCE:  # only its worker imports the other version's code
            worker_settings["reference"] = None
        self.log = tempfile.TemporaryFile("w+")  # the worker's stderr, shown if it fails
        command = [sys.executable, "-m", WORKER_MODULE, "--worker", json.dumps(worker_settings)]
        self.process = subprocess.Popen(
            command, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, bufsize=1
        )
        self._reply()

    def request(self, op: str, **fields) -> dict:
        self.process.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.process.stdin.flush()
        return self._reply()

    def _reply(self) -> dict:
        for line in self.process.stdout:
            if line.startswith(WORKER_REPLY):
                reply = json.loads(line[len(WORKER_REPLY) :])
                if "error" in reply:
                    raise WorkerFailure(self.impl, reply["error"].strip().splitlines()[-1], reply["error"])
                return reply
        self.log.seek(0)
        code = self.process.wait()
        reason = "killed (signal 9: out of memory?)" if code == -9 else f"exited with code {code}"
        raise WorkerFailure(self.impl, reason, self.log.read()[-4000:])

    def close(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(OSError):
                self.process.stdin.write(json.dumps({"op": "exit"}) + "\n")
                self.process.stdin.flush()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.log.close()


class Workers(dict):
    """One worker per candidate, started on first use and kept for every point of the run."""

    def __init__(self, settings: BenchmarkSettings):
        super().__init__()
        self.settings = settings

    def get_worker(self, impl: str) -> Worker:
        if impl not in self:
            self[impl] = Worker(impl, self.settings)
        return self[impl]

    def discard(self, impl: str) -> None:
        """Stop a candidate's worker (after a failure): the next point starts a new one."""
        worker = self.pop(impl, None)
        if worker is not None:
            worker.close()

    def close(self) -> None:
        for worker in self.values():
            worker.close()
        self.clear()


def measure_point(workers: Workers, impls: list[str], spec: dict, settings: BenchmarkSettings) -> dict:
    """Build every candidate at one point in its worker, run its warm-up call under the profiler (peak memory), then
    time all of them in interleaved rounds. A candidate whose warm-up took longer than ``max_call_s`` is timed by that
    single call (``single_call``): at that scale one more call would cost minutes and first-call effects are small.
    A candidate that fails to build or to run its warm-up (out of memory, typically) is reported as ``failed``.
    Where the worker also runs an optimizer step after each call (the train part), its times are ``optimizer_times_s``:
    those after the timed calls, or the one after a ``single_call`` warm-up (otherwise the warm-up's is left out, as
    the optimizer's first step allocates its state)."""
    out, timed = {}, {}
    for impl in impls:
        try:
            worker = workers.get_worker(impl)
            worker.request("build", spec=dict(spec, impl=impl))
            warmup = worker.request("profile")
        except WorkerFailure as failure:
            workers.discard(impl)
            out[impl] = {"failed": failure.reason}
            continue
        single = warmup["seconds"] > settings.max_call_s
        # The profiler sees PyTorch's allocations only: a candidate that allocates elsewhere has no peak to report.
        peak = warmup["peak_bytes"] if CANDIDATES[impl].torch_memory else None
        out[impl] = {"peak_bytes": peak, "warmup_s": warmup["seconds"], "single_call": single}
        if single:
            out[impl]["times_s"] = [warmup["seconds"]]
            if "optimizer_s" in warmup:
                out[impl]["optimizer_times_s"] = [warmup["optimizer_s"]]
        else:
            timed[impl] = worker

    def time_worker(impl: str, worker: Worker) -> float:
        reply = worker.request("time")
        if "optimizer_s" in reply:
            out[impl].setdefault("optimizer_times_s", []).append(reply["optimizer_s"])
        return reply["seconds"]

    steps = {impl: (lambda impl=impl, worker=worker: time_worker(impl, worker)) for impl, worker in timed.items()}
    for impl, times in interleaved_times(steps, settings.repeats, settings.min_repeats,
                                          settings.point_budget_s).items():
        out[impl]["times_s"] = times
    for impl, worker in timed.items():
        # Peak memory once more after the timed calls: what each later call needs on its own.
        if out[impl]["warmup_s"] <= LATER_PEAK_MAX_CALL_S and CANDIDATES[impl].torch_memory:
            out[impl]["later_peak_bytes"] = worker.request("profile")["peak_bytes"]
        if settings.rss:
            out[impl]["rss_peak_bytes"] = worker.request("rss")["rss_peak_bytes"]
    for impl in impls:
        if impl in workers:
            workers[impl].request("release")  # the next point starts with this one's memory freed
    return out


def available_bytes(device: str = "cpu") -> int:
    if device.startswith("cuda"):
        return torch.cuda.mem_get_info()[0]
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:  # pragma: no cover - psutil is a transformers dependency in practice
        return 8 << 30


def math_attention_bytes(batch: int, heads: int, length: int, mode: str, itemsize: int = 4) -> int:
    """L x L buffers of math attention: scores and probabilities (forward); twice that to train."""
    per_matrix = itemsize * batch * heads * length * length
    return per_matrix * (2 if mode == "forward" else 4)


def tensor_leaves(values) -> list[torch.Tensor]:
    return [leaf for leaf in torch.utils._pytree.tree_leaves(values) if isinstance(leaf, torch.Tensor)]


class AllocationRecorder(TorchDispatchMode):
    """Records every storage that an operation creates while it is active, by weak reference."""

    def __init__(self):
        super().__init__()
        self.created: dict[int, tuple[StorageWeakRef, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        # Views and in-place results share an input's storage (a weight's, say): only new storages are counted.
        inputs = {leaf.untyped_storage().data_ptr() for leaf in tensor_leaves((args, kwargs))}
        for tensor in tensor_leaves(out):
            storage = tensor.untyped_storage()
            address = storage.data_ptr()
            if not storage.nbytes() or address in inputs:
                continue
            known = self.created.get(address)
            if known is None or known[0].expired():  # new, or at the address of a storage since freed
                self.created[address] = (StorageWeakRef(storage), storage.nbytes())
        return out

    def alive_bytes(self) -> int:
        return sum(nbytes for ref, nbytes in self.created.values() if not ref.expired())


def retained_bytes(fn: Callable, *args, **kwargs) -> int:
    """The bytes of the distinct storages that ``fn(*args, **kwargs)`` creates and that are still alive when it returns,
    while its result is held: with autograd, what the forward keeps for backward (saved tensors, the inputs of
    recomputed steps) and the result itself.

    Unlike counting what autograd's saved-tensor hooks see, this also counts what steps recomputed in backward keep
    (a checkpoint keeps its inputs without saving them), and it leaves those steps as they run in training (the hooks
    would replace theirs)."""
    recorder = AllocationRecorder()
    with recorder:
        result = fn(*args, **kwargs)
    alive = recorder.alive_bytes()
    del result
    return alive


if __name__ == "__main__":
    if sys.argv[1:2] != ["--worker"] or len(sys.argv) != 3:
        raise SystemExit(f"usage: python -m {WORKER_MODULE} --worker SETTINGS_JSON (started by the benchmark)")
    worker_main(json.loads(sys.argv[2]))
