"""Speed and memory of Orchid against BERT and attention, measured side by side on the same machine.

Three parts (``--parts``): ``operator``, one Orchid operator against a self-attention block of the same width at
batch 1 and growing length (paper App. C.6, Figure C.4); ``model``, orchid-bert-base against transformers'
``BertModel`` of the same width and depth; ``train``, a training step of ``OrchidForMaskedLM`` against
``BertForMaskedLM`` with the AdamW step, and the operator alone against attention. The report gives absolute times
(medians of interleaved rounds), peak memory, and ratios to the baseline (the baseline's time / Orchid's: above 1,
Orchid is faster). ``--profile`` and ``--profile-train`` profile instead of timing.

The candidates are in ``benchmarks/candidates.py``, what the parts run in ``benchmarks/parts.py``, how it is measured
(worker processes, rounds, memory) in ``benchmarks/measure.py``, the tables and the plot in ``benchmarks/report.py``.
Run ``python scripts/benchmark.py --help``; ``--quick`` runs tiny sizes in seconds. Bad arguments (an unknown part, a
shape that is not BxL, ``--device cuda`` where torch sees no GPU, a reference folder without model code) stop it with
a message that names them, before anything is built or written.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from benchmarks.harness import load_average, provenance, write_json
from benchmarks.measure import Workers, worker_main
from benchmarks.parts import run_model_part, run_operator_part, run_train_part
from benchmarks.profiles import profile_tables
from benchmarks.report import markdown_report, plot, summarize
from benchmarks.settings import MODEL_SHAPES, QUICK_SHAPES, TRAIN_SHAPES, BenchmarkSettings


def run(args: argparse.Namespace) -> dict:
    """Measure (or profile) what the command line asks for; write the JSON and Markdown after every point, the plot at
    the end; return the result (the JSON's content)."""
    settings = BenchmarkSettings.from_args(args)
    torch.set_num_threads(settings.threads)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"benchmark{('_' + args.tag) if args.tag else ''}"

    def log(message: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {message}"
        if not args.silent:
            print(line, flush=True)
        with open(out_dir / f"{stem}.log", "a") as handle:
            handle.write(line + "\n")

    result = {
        "tag": args.tag,
        "command": " ".join(["python scripts/benchmark.py"] + sys.argv[1:]) if args.command is None else args.command,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "load": [load_average(), None],
        **provenance(settings.threads, settings.device),
        "config": settings.to_json(),
        "records": [],
    }
    done: list[dict] = []

    def save(part_records: list[dict], final: bool = False) -> None:
        """Write everything measured so far: a long run that is stopped keeps its finished points."""
        result["records"] = done + part_records
        result["load"][1] = load_average()
        result["finished"] = final
        result["summary"] = summarize(result["records"], settings)
        write_json(out_dir / f"{stem}.json", result)
        (out_dir / f"{stem}.md").write_text(markdown_report(result, settings))

    profiled = settings.profile_shapes or settings.profile_train_shapes or settings.thread_scaling_shapes
    if profiled or settings.activation_shapes or settings.flop_shapes:
        tables = profile_tables(settings, log, show=not args.silent)
        header = (f"# Profiles ({args.tag or 'untagged'})\n\nCommand: `{result['command']}`; "
                  f"{settings.threads} thread(s), load average {load_average()}."
                  + (" Self CPU time of each op." if profiled else "")
                  + "\n\n")
        (out_dir / f"profile{('_' + args.tag) if args.tag else ''}.md").write_text(header + tables)
        return result
    workers = Workers(settings)
    try:
        if "operator" in settings.parts:
            done += run_operator_part(settings, workers, log, save)
        if "model" in settings.parts:
            done += run_model_part(settings, workers, log, save)
        if "train" in settings.parts:
            done += run_train_part(settings, workers, log, save)
    finally:
        workers.close()
    save([], final=True)
    if any(r["part"] == "operator" for r in done):
        plot(result, settings, out_dir / f"{stem}.png")
    log(f"wrote {out_dir / stem}.json, .md" + (", .png" if any(r["part"] == "operator" for r in done) else ""))
    return result


def shapes_text(shapes) -> str:
    return ",".join(f"{batch}x{length}" for batch, length in shapes)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, every value checked (``BenchmarkSettings.from_args``) before anything is built or written;
    ``--worker`` (hidden) runs a worker process instead, as ``python -m benchmarks.measure --worker`` does."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke test in seconds")
    parser.add_argument("--parts", default="operator,model",
                        help="comma-separated: operator, model, train (a training step: OrchidForMaskedLM vs "
                             "BertForMaskedLM with the AdamW step, and the operator alone vs attention; default "
                             "operator,model)")
    parser.add_argument("--lengths", default=None,
                        help="operator lengths, e.g. 1024,4096 (default 1024, 2048, ..., 131072; 64,128,256 with "
                             "--quick)")
    parser.add_argument("--model-shapes", default=None, metavar="SHAPES",
                        help=f"shapes BxL of the model part (default {shapes_text(MODEL_SHAPES)}; "
                             f"{shapes_text(QUICK_SHAPES)} with --quick)")
    parser.add_argument("--model-modes", default="forward",
                        help="comma-separated: forward, forward_backward (a training step without the optimizer)")
    parser.add_argument("--train-shapes", default=None, metavar="SHAPES",
                        help=f"shapes BxL of the train part (default {shapes_text(TRAIN_SHAPES)}; "
                             f"{shapes_text(QUICK_SHAPES)} with --quick)")
    parser.add_argument("--compiled", action="store_true",
                        help="also time torch.compile of the plain Orchid model and operator (forward; the warm-up "
                        "call compiles)")
    parser.add_argument("--train-checkpointing", action="store_true",
                        help="train part: also time OrchidForMaskedLM with gradient checkpointing "
                             "(model.gradient_checkpointing_enable(), which trades a recomputed forward for memory)")
    parser.add_argument("--layers", type=int, default=None,
                        help="depth of both models of the model and train parts (default: orchid-bert-base's 12; 2 "
                             "with --quick)")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds per point (default 7; 2 with --quick)")
    parser.add_argument("--point-budget-s", type=float, default=60.0,
                        help="stop repeating a point after this many seconds (at least 3 rounds)")
    parser.add_argument("--max-call-s", type=float, default=60.0,
                        help="an operator candidate predicted to take longer than this per call is not run at "
                             "longer lengths; a model whose warm-up call took longer is timed by that one call")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda on a GPU machine")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="weights and inputs; on a GPU, bfloat16 lets SDPA pick its flash kernel")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: on a shared machine, OpenMP threads that wait for a "
                             "descheduled peer make timings erratic)")
    parser.add_argument("--reference", default=None, metavar="PATH",
                        help="another version's model code, timed as candidate orchid_reference: a checkout holding "
                             "modeling/ (e.g. git worktree add ../orchid-old REV) or the modeling/ folder itself")
    parser.add_argument("--profile", default=None, metavar="SHAPES",
                        help="instead of timing, profile the operator's forward (and the reference's) at shapes like "
                             "8x128,1x4096, time the plain model's forward against its implicit filters alone "
                             "(--layers deep), and write profile_TAG.md")
    parser.add_argument("--profile-train", default=None, metavar="SHAPES",
                        help="instead of timing, profile OrchidForMaskedLM's training step (forward + backward of the "
                             "MLM loss; and the reference's) at shapes like 8x128,1x4096: the top ops by self CPU "
                             "time, printed and written to profile_TAG.md (with --profile's tables if both are given)")
    parser.add_argument("--activations", default=None, metavar="SHAPES",
                        help="instead of timing, count the activations one layer keeps for backward (OrchidForMaskedLM,"
                             " the reference, BertForMaskedLM) at shapes like 8x128,1x4096, in MiB and in units of "
                             "one (B, L, hidden) tensor; written to profile_TAG.md (with the profiles if given)")
    parser.add_argument("--thread-scaling", default=None, metavar="SHAPES",
                        help="instead of timing, profile the training step of every masked-LM candidate (BERT's too) "
                             "at 1 thread and at --threads (at least 2) at shapes like 8x128,1x4096: each op's self "
                             "CPU time at both counts, the ops that gain least from the extra threads first; written "
                             "to profile_TAG.md")
    parser.add_argument("--flops", default=None, metavar="SHAPES",
                        help="instead of timing, count the FLOPs (matrix products, convolutions, attention) of the "
                             "training step of every masked-LM candidate at shapes like 8x128,1x4096; written to "
                             "profile_TAG.md")
    parser.add_argument("--rss", action="store_true", help="also measure each call's peak RSS growth")
    parser.add_argument("--out-dir", default="outputs/bench",
                        help="where benchmark_TAG.json, .md, .log and .png (or profile_TAG.md) are written")
    parser.add_argument("--tag", default="", help="suffix of the output files, e.g. before / after")
    parser.add_argument("--silent", action="store_true", help="log to the .log file only, not to the terminal")
    parser.add_argument("--command", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is None:
        try:
            BenchmarkSettings.from_args(args)  # every value checked before anything is built or written
        except ValueError as error:
            parser.error(str(error))
    return args


def main(argv: list[str] | None = None) -> dict | None:
    args = parse_args(argv)
    if args.worker is not None:
        worker_main(json.loads(args.worker))
        return None
    return run(args)


if __name__ == "__main__":
    main()
