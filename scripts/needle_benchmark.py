#!/usr/bin/env python
"""Needle in a haystack on real text for a masked LM: does it find what stands thousands of tokens back?

    python scripts/needle_benchmark.py --model outputs/real_data/ctx-orchid-2048 \\
        --train_files ../shared/data/austen/{emma,mansfield_park,northanger_abbey,pride_and_prejudice}.txt \\
        --validation_files ../shared/data/austen/sense_and_sensibility.txt \\
        --test_files ../shared/data/austen/persuasion.txt --output_dir outputs/needle/orchid-2048

builds haystacks of real text (--lengths tokens) with a pass key, a made-up fact or a repeated span placed at each
--depths percent and a question at the end whose answer is masked; fine-tunes the model on the training files'
haystacks at each --learning_rates (chosen on the validation files' haystacks), or with --no_finetune scores it as it
is; scores the test files' haystacks; and writes results.json (accuracy by task, length and depth, time per example,
peak memory), predictions.jsonl and heatmap_<task>.png. A model with fewer positions than a haystack reads its end
with --truncation_side left. See experiments/needle.py and docs/results/needle.md.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from orchid_hf.runs import run_cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/ is not installed
from experiments.needle import (  # noqa: E402
    DEFAULT_DEPTHS,
    DEFAULT_LEARNING_RATES,
    DEFAULT_LENGTHS,
    TASKS,
    TRUNCATION_SIDES,
    check_depths,
    check_learning_rates,
    check_lengths,
    check_tasks,
    run_needle_benchmark,
    text_files,
)


def parse_args(argv: list[str] | None = None) -> dict:
    """The flags as ``run_needle_benchmark``'s arguments (and ``threads``); a ``ValueError`` naming the flag and the
    value for a value out of range, an unknown task or a missing file."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="A masked-LM checkpoint folder (Orchid, BERT, ...).")
    parser.add_argument("--tokenizer", default=None, help="The tokenizer folder (default: the model's).")
    parser.add_argument("--train_files", nargs="+", default=None, help="Text files or folders of .txt files.")
    parser.add_argument("--validation_files", nargs="+", default=None, help="Text files or folders of .txt files.")
    parser.add_argument("--test_files", nargs="+", required=True, help="Text files or folders of .txt files.")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--lengths", type=int, nargs="+", default=list(DEFAULT_LENGTHS),
                        help="Haystack lengths in tokens, [CLS] and [SEP] in.")  # fmt: skip
    parser.add_argument("--train_lengths", type=int, nargs="+", default=None,
                        help="Lengths of the training and validation haystacks (default: --lengths): fine-tune short, "
                             "score long.")  # fmt: skip
    parser.add_argument("--depths", type=float, nargs="+", default=list(DEFAULT_DEPTHS),
                        help="Needle depths in percent of the text (0: first, 100: before the question).")  # fmt: skip
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), help=f"Among {', '.join(TASKS)}.")
    parser.add_argument("--examples_per_cell", type=int, default=10,
                        help="Test haystacks per task, length and depth.")  # fmt: skip
    parser.add_argument("--validation_examples_per_cell", type=int, default=None,
                        help="Validation haystacks per task, length and depth (default: "
                        "--examples_per_cell).")  # fmt: skip
    parser.add_argument("--no_finetune", action="store_true", help="Score the model as it is, without training.")
    parser.add_argument("--learning_rates", type=float, nargs="+", default=list(DEFAULT_LEARNING_RATES),
                        help="The grid, chosen on the validation haystacks.")  # fmt: skip
    parser.add_argument("--train_examples", type=int, default=512,
                        help="Training haystacks (random task, length and depth).")  # fmt: skip
    parser.add_argument("--epochs", type=float, default=1.0, help="Passes over the training haystacks.")
    parser.add_argument("--max_steps", type=int, default=None, help="Training steps (overrides --epochs).")
    parser.add_argument("--batch_size", type=int, default=8, help="Training haystacks per step.")
    parser.add_argument("--tokens_per_batch", type=int, default=16384,
                        help="Tokens per forward pass (a step's haystacks are split to fit).")  # fmt: skip
    parser.add_argument("--warmup_ratio", type=float, default=0.1)
    parser.add_argument("--weight_decay", type=float, default=0.01)
    parser.add_argument("--truncation_side", default=None,
                        help="'left': a haystack longer than the model's window is read from its end.")  # fmt: skip
    parser.add_argument("--max_length", type=int, default=None,
                        help="The model's window in tokens (default: an Orchid model's longest haystack; another "
                        "model's max_position_embeddings). A model with fewer positions is extended without training "
                        "(BERT: its learned position rows repeated, as Longformer extended RoBERTa).")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="Seed of the haystacks and of training.")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's).")
    parser.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if there is one).")
    parser.add_argument("--save_model", action="store_true", help="Save the fine-tuned model in OUTPUT_DIR/model.")
    args = vars(parser.parse_args(argv))
    check_arguments(args)
    args["model_name_or_path"] = args.pop("model")
    args["tokenizer_name"] = args.pop("tokenizer")
    args["finetune"] = not args.pop("no_finetune")
    return args


def check_arguments(args: dict) -> None:
    check_lengths(args["lengths"], "--lengths")
    if args["train_lengths"] is not None:
        check_lengths(args["train_lengths"], "--train_lengths")
    check_depths(args["depths"], "--depths")
    check_tasks(args["tasks"], "--tasks")
    text_files(args["test_files"], "--test_files")
    for flag in ("examples_per_cell", "validation_examples_per_cell", "train_examples", "max_steps", "batch_size",
                 "tokens_per_batch", "max_length", "threads"):  # fmt: skip
        value = args[flag]
        if value is not None and value < 1:
            raise ValueError(f"--{flag} {value}: must be a positive whole number")
    if args["truncation_side"] is not None and args["truncation_side"] not in TRUNCATION_SIDES:
        raise ValueError(f"--truncation_side {args['truncation_side']}: choose among {list(TRUNCATION_SIDES)} (the "
                         "question is at the end of a haystack, so a long one is read from its end)")  # fmt: skip
    if args["no_finetune"]:
        return
    for flag in ("train_files", "validation_files"):
        if not args[flag]:
            raise ValueError(f"--{flag} is needed to fine-tune (or score the model as it is with --no_finetune)")
        text_files(args[flag], f"--{flag}")
    check_learning_rates(args["learning_rates"], "--learning_rates")
    if not args["epochs"] > 0 or math.isinf(args["epochs"]):
        raise ValueError(f"--epochs {args['epochs']}: must be a positive number")
    if not 0 <= args["warmup_ratio"] < 1:
        raise ValueError(f"--warmup_ratio {args['warmup_ratio']}: must be in [0, 1)")
    if args["weight_decay"] < 0:
        raise ValueError(f"--weight_decay {args['weight_decay']}: must be >= 0")


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    threads = args.pop("threads")
    if threads:
        import torch

        torch.set_num_threads(threads)
    results = run_needle_benchmark(**args)
    tuning = results["finetuning"]
    if tuning:
        edge = " (at the edge of the grid: extend --learning_rates)" if tuning["best_at_edge"] else ""
        print(f"learning rate {tuning['best_learning_rate']:g} chosen on the validation haystacks{edge}")
    print(f"{results['model']} ({results['how']}), window {results['window']} tokens; accuracy on the test haystacks:")
    for task in results["tasks"]:
        for length in results["lengths"]:
            row = results["accuracy"][task][str(length)]
            outside = results["outside_window"][task][str(length)]
            note = f" (needle outside the window at depths {', '.join(f'{d:g}' for d in outside)})" if outside else ""
            print(f"  {task:8s} {length:>6d} tokens: " + "  ".join(f"{depth}% {value:.2f}" for depth, value in
                                                                   row.items()) + note)  # fmt: skip
    print(f"wrote {Path(args['output_dir']) / 'results.json'}")
    return results


if __name__ == "__main__":
    run_cli(main)
