"""Masked-LM pretraining throughput end to end: ``scripts/pretrain_mlm.py``'s recipe for Orchid-BERT-base and for
BERT-base, the same data, batch, steps and thread count, in tokens per second.

    python scripts/pretraining_throughput.py --train_file ../shared/data/austen/emma.txt \\
        --tokenizer_name ../shared/data/bert-base-uncased --threads 1

Each model runs the recipe's own code path (``orchid_hf.pretraining.main``: data packing, the collator's masking, the
recipe's optimizer, ``Trainer``'s loop, logging every step), in a process of its own, one after the other. The
throughput counts the steps after ``--warmup_steps`` between the training clock's readings (``train_seconds`` of
each step's log entry, which leaves evaluation out), so model building, data packing and the first steps' allocator
warm-up are not in it. A JSON file with both runs, the commit and the machine is written to ``--out-dir``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import check_at_least, provenance, write_json

REPO_ROOT = Path(__file__).resolve().parents[1]
# The recipe's default model for Orchid (orchid-bert-base); BERT through --model_type bert is BertConfig's default,
# BERT-base: the paper's pair.
MODELS = {"orchid": [], "bert": ["--model_type", "bert"]}


def tokenizer_folder(name: str, work_dir: Path) -> str:
    """``name`` if it is a tokenizer folder; a folder holding only a WordPiece ``vocab.txt`` (as
    ../shared/data/bert-base-uncased does) becomes a lower-casing BERT tokenizer saved under ``work_dir``."""
    folder = Path(name)
    if (folder / "tokenizer_config.json").exists() or not (folder / "vocab.txt").exists():
        return name
    from transformers import BertTokenizer

    saved = work_dir / "tokenizer"
    BertTokenizer.from_pretrained(str(folder), do_lower_case=True).save_pretrained(saved)
    return str(saved)


def run_args(args: argparse.Namespace, model: str, output_dir: str, tokenizer: str) -> list[str]:
    argv = ["--train_file", *args.train_file, "--tokenizer_name", tokenizer,
            "--max_seq_length", str(args.max_seq_length), "--per_device_train_batch_size", str(args.batch_size),
            "--max_steps", str(args.warmup_steps + args.steps), "--logging_steps", "1", "--save_strategy", "no",
            "--do_train", "--report_to", "none", "--disable_tqdm", "True",
            "--bf16", "False", "--seed", "0", "--threads", str(args.threads), "--output_dir", output_dir,
            *MODELS[model]]
    if args.layers is not None:
        argv += ["--config_overrides", f"num_hidden_layers={args.layers}"]
    return argv


def throughput(log_history: list[dict], warmup_steps: int, tokens_per_step: int) -> dict:
    """Tokens per second over the steps after ``warmup_steps``, from the training clock's per-step readings."""
    clock = {entry["step"]: entry["train_seconds"] for entry in log_history
             if "loss" in entry and "train_seconds" in entry}
    last = max(clock)
    if warmup_steps not in clock or last <= warmup_steps:
        raise ValueError(f"the run logged steps {sorted(clock)}; the throughput needs step {warmup_steps} (the end "
                         f"of the warm-up) and a later one")
    seconds = clock[last] - clock[warmup_steps]
    steps = last - warmup_steps
    return {"steps": steps, "seconds": seconds, "seconds_per_step": seconds / steps,
            "tokens_per_second": steps * tokens_per_step / seconds}


def run_one(args: argparse.Namespace, model: str, tokenizer: str) -> dict:
    """One model's pretraining run in a fresh process; its log history and results, read back from the run's files."""
    with tempfile.TemporaryDirectory(prefix=f"pretraining-{model}-") as output_dir:
        command = [sys.executable, str(REPO_ROOT / "scripts/pretrain_mlm.py"),
                   *run_args(args, model, output_dir, tokenizer)]
        completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
        if completed.returncode != 0:
            raise RuntimeError(f"the {model} run failed ({' '.join(command)}):\n{completed.stderr[-4000:]}")
        state = json.loads((Path(output_dir) / "trainer_state.json").read_text())
        results = json.loads((Path(output_dir) / "results.json").read_text())
    tokens_per_step = args.batch_size * args.max_seq_length
    losses = [entry["loss"] for entry in state["log_history"] if "loss" in entry]
    if not any(loss > 0 for loss in losses):
        raise ValueError(f"the {model} run's loss was {losses} at every step: no token was masked (a tokenizer that "
                         f"maps the text to special tokens only?), so its steps are not training steps")
    return {"num_parameters": results.get("num_parameters"), "final_loss": losses[-1],
            **throughput(state["log_history"], args.warmup_steps, tokens_per_step)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train_file", nargs="+", required=True)
    parser.add_argument("--tokenizer_name", required=True,
                        help="a tokenizer folder, or a folder holding a WordPiece vocab.txt")
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10, help="timed steps (after the warm-up)")
    parser.add_argument("--warmup_steps", type=int, default=2)
    parser.add_argument("--layers", type=int, default=None, help="depth of both models (default: the base models' 12)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out-dir", default="outputs/bench")
    args = parser.parse_args(argv)
    check_at_least(parser, args, "--max_seq_length", "--batch_size", "--steps", "--warmup_steps", "--threads")
    result = {"runs": {}, "settings": {k: v for k, v in vars(args).items() if k != "out_dir"},
              **provenance(args.threads)}
    with tempfile.TemporaryDirectory(prefix="pretraining-tokenizer-") as work_dir:
        tokenizer = tokenizer_folder(args.tokenizer_name, Path(work_dir))
        for model in MODELS:
            result["runs"][model] = run_one(args, model, tokenizer)
    for model, run in result["runs"].items():
        print(f"{model}: {run['tokens_per_second']:.0f} tokens/s ({run['seconds_per_step']:.2f} s a step of "
              f"{args.batch_size} x {args.max_seq_length}, {run['steps']} steps after {args.warmup_steps})",
              flush=True)
    ratio = result["runs"]["orchid"]["tokens_per_second"] / result["runs"]["bert"]["tokens_per_second"]
    result["orchid_over_bert"] = ratio
    print(f"Orchid / BERT tokens per second at {args.threads} thread(s): {ratio:.2f}x", flush=True)
    write_json(Path(args.out_dir) / f"pretraining_throughput_{args.batch_size}x{args.max_seq_length}_threads"
               f"{args.threads}.json", result)
    return result
