"""ONNX Runtime against PyTorch for the same Orchid model, on padded batches: the time of a forward call of the
exported graph (``orchid_hf.onnx.export_onnx``, one CPU session with the benchmark's threads) beside the plain model's
in eager PyTorch (``torch.inference_mode``), timed in alternating rounds, and the largest difference of their outputs
at the real positions.

A model is ``orchid-bert-base`` (``--layers`` deep) with ``max_position_embeddings`` of each of ``--positions`` and its
default ladder of transform lengths, exported once and run on every shape that fits it. A batch (B, L) has rows of
L, then fewer real tokens (row i holds L - i L / 2B, padded on the right), so that a batch of several rows mixes
lengths, as fine-tuning and serving batches do.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks.harness import (
    check_at_least,
    interleaved_times,
    load_average,
    provenance,
    table_lines,
    timed_call,
    write_result,
)

DEFAULT_POSITIONS = (512, 8192)
DEFAULT_SHAPES = ((8, 128), (1, 4096))


def padded_batch(batch: int, length: int, vocab_size: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Token ids and a right-padded attention mask: row i holds ``length - i * length // (2 * batch)`` real tokens."""
    input_ids = torch.randint(5, vocab_size, (batch, length), generator=generator)
    attention_mask = torch.ones(batch, length, dtype=torch.long)
    for row in range(batch):
        attention_mask[row, length - row * length // (2 * batch) :] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": torch.zeros_like(input_ids)}


def compare(model, session, feed: dict, repeats: int, budget_s: float) -> dict:
    """Median seconds of the model in PyTorch and of its session in ONNX Runtime on ``feed``, in alternating rounds,
    and the largest difference of their outputs at the real positions."""
    from orchid_hf.onnx import run_onnxruntime

    def pytorch():
        with torch.inference_mode():
            return model(**feed).last_hidden_state

    def onnxruntime():
        return run_onnxruntime(session, feed)["last_hidden_state"]

    real = feed["attention_mask"].bool().unsqueeze(-1)
    error = ((onnxruntime() - pytorch()).abs() * real).max().item()  # also the warm-up
    steps = {"pytorch": lambda: timed_call(pytorch), "onnxruntime": lambda: timed_call(onnxruntime)}
    times = interleaved_times(steps, repeats, 3, budget_s)
    median = {name: statistics.median(values) for name, values in times.items()}
    return {"real_tokens": int(real.sum()), "pytorch_s": median["pytorch"], "onnxruntime_s": median["onnxruntime"],
            "ratio": median["onnxruntime"] / median["pytorch"], "rounds": len(times["pytorch"]),
            "max_abs_difference": error, "load_average": load_average()}  # fmt: skip


def operator_profile(path: Path, feed: dict, threads: int, calls: int = 3, top: int = 8) -> list[dict]:
    """Where ONNX Runtime spends a call: its own profiler's kernel times over ``calls`` calls, summed by operator type,
    the ``top`` types by time, each with its milliseconds per call, share of all kernel time and nodes per call."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.enable_profiling, options.profile_file_prefix = True, str(path.parent / "profile")
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    arrays = {value.name: feed[value.name].numpy() for value in session.get_inputs()}
    for _ in range(calls):
        session.run(None, arrays)
    totals, nodes = {}, {}
    for event in json.loads(Path(session.end_profiling()).read_text()):
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            op = event["args"]["op_name"]
            totals[op], nodes[op] = totals.get(op, 0) + event["dur"], nodes.get(op, 0) + 1
    everything = sum(totals.values())
    ranked = sorted(totals, key=totals.get, reverse=True)[:top]
    return [{"op": op, "ms_per_call": totals[op] / 1e3 / calls, "share": totals[op] / everything,
             "nodes_per_call": nodes[op] // calls} for op in ranked]  # fmt: skip


def measure(positions: int, shapes, layers: int, threads: int, repeats: int, budget_s: float, seed: int = 0,
            profile: bool = False) -> list:  # fmt: skip
    """Rows of one model: :func:`compare` on every shape that fits it (and :func:`operator_profile` with
    ``profile``)."""
    from orchid_hf import OrchidConfig, OrchidModel
    from orchid_hf.onnx import export_onnx, onnxruntime_session

    torch.manual_seed(seed)
    config = OrchidConfig.from_preset("orchid-bert-base", num_hidden_layers=layers,
                                      max_position_embeddings=positions)  # fmt: skip
    model = OrchidModel(config).eval()
    ladder = list(config.resolved_transform_lengths(positions))
    rows = []
    with tempfile.TemporaryDirectory(prefix="orchid-onnx-") as folder:
        path = export_onnx(model, Path(folder) / "model.onnx")
        session = onnxruntime_session(path, threads=threads)
        for batch, length in shapes:
            if length <= positions:
                feed = padded_batch(batch, length, config.vocab_size, torch.Generator().manual_seed(seed))
                row = compare(model, session, feed, repeats, budget_s)
                if profile:
                    row["profile"] = operator_profile(path, feed, threads)
                rows.append({"positions": positions, "transform_lengths": ladder, "shape": [batch, length], **row})
    return rows


def run(positions=DEFAULT_POSITIONS, shapes=DEFAULT_SHAPES, layers: int = 2, threads: int = 1, repeats: int = 7,
        budget_s: float = 60.0, profile: bool = False) -> dict:  # fmt: skip
    """Every model of ``positions`` on every shape that fits it, at ``threads`` torch and ONNX Runtime threads."""
    torch.set_num_threads(threads)
    rows = [row for n in positions for row in measure(n, shapes, layers, threads, repeats, budget_s, profile=profile)]
    return {"benchmark": "onnx_runtime", "layers": layers, "threads": threads, "rows": rows,
            **provenance(threads)}  # fmt: skip


def markdown(result: dict) -> str:
    header = ("positions", "batch (B, L)", "real tokens", "PyTorch ms", "ONNX Runtime ms", "ONNX Runtime / PyTorch",
              "largest difference")  # fmt: skip
    rows = [(f"{row['positions']:,}", f"({row['shape'][0]}, {row['shape'][1]:,})", f"{row['real_tokens']:,}",
             f"{1e3 * row['pytorch_s']:.1f}", f"{1e3 * row['onnxruntime_s']:.1f}", f"{row['ratio']:.2f}x",
             f"{row['max_abs_difference']:.1e}") for row in result["rows"]]  # fmt: skip
    title = f"orchid-bert-base, {result['layers']} layers, {result['threads']} thread(s), forward of a padded batch"
    lines = [title, "", *table_lines(header, rows), ""]
    for row in result["rows"]:
        if "profile" in row:
            lines += [f"ONNX Runtime's kernel time by operator, {row['positions']:,} positions, "
                      f"({row['shape'][0]}, {row['shape'][1]:,}):", "",
                      *table_lines(("operator", "ms per call", "share", "nodes"),
                                   [(p["op"], f"{p['ms_per_call']:.1f}", f"{100 * p['share']:.1f}%",
                                     p["nodes_per_call"]) for p in row["profile"]]), ""]  # fmt: skip
    return "\n".join(lines)


def parse_shape(text: str) -> tuple[int, int]:
    batch, _, length = text.partition("x")
    if not (batch.isdigit() and length.isdigit() and int(batch) > 0 and int(length) > 0):
        raise argparse.ArgumentTypeError(f"a shape is BxL with positive integers (8x128), got {text!r}")
    return int(batch), int(length)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--positions", type=int, nargs="+", default=list(DEFAULT_POSITIONS),
                        help="max_position_embeddings of each model")
    parser.add_argument("--shapes", type=parse_shape, nargs="+", default=list(DEFAULT_SHAPES), metavar="BxL",
                        help="padded batches, each run by every model it fits")
    parser.add_argument("--layers", type=int, default=2, help="encoder layers of orchid-bert-base")
    parser.add_argument("--threads", type=int, default=1, help="torch and ONNX Runtime intra-op threads")
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds per shape")
    parser.add_argument("--budget-s", type=float, default=60.0, help="stop repeating a shape after this (3 rounds)")
    parser.add_argument("--profile", action="store_true",
                        help="also profile ONNX Runtime's kernels on each shape (time by operator type)")
    parser.add_argument("--out-dir", default="docs/results", help="folder of onnx_runtime_cpu_threadsN.json and .md")
    args = parser.parse_args(argv)
    check_at_least(parser, args, "--layers", "--threads", "--repeats")
    if min(args.positions) < 1:
        parser.error(f"--positions must be at least 1, got {args.positions}")
    result = run(args.positions, args.shapes, args.layers, args.threads, args.repeats, args.budget_s, args.profile)
    result["command"] = "python scripts/onnx_benchmark.py " + " ".join(sys.argv[1:] if argv is None else argv)
    write_result(result, args.out_dir, f"onnx_runtime_cpu_threads{args.threads}", markdown)
    return result
