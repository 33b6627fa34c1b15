#!/usr/bin/env python
"""Held-out masked-token accuracy of a masked LM at several context lengths, on the same masked tokens:

    python scripts/long_context_eval.py --model_name_or_path outputs/real_data/ctx-orchid-2048 \\
        --validation_file outputs/real_data/austen/mlm/validation.txt \\
        --train_file outputs/real_data/austen/mlm/train.txt --lengths 128 512 2048 \\
        --output_dir outputs/real_data/ctx-eval-orchid-2048

masks the validation text once and reads it in blocks of each length (an Orchid model with fewer positions extended
without training, a BERT model only up to its positions), with accuracy and loss per category of masked token (its
token seen elsewhere in its shortest block, only in its longest block, in neither; rare in the training text), and
writes results.json. See experiments/real_data/long_context.py and docs/results/long_context.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchid_hf.runs import run_cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/ is not installed
from experiments.real_data.long_context import MLM_PROBABILITY, evaluate_contexts  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_name_or_path", required=True, help="A masked-LM folder with its tokenizer.")
    parser.add_argument("--validation_file", required=True, help="Held-out text, one document a line.")
    parser.add_argument("--train_file", required=True, help="The training text, to tell rare tokens.")
    parser.add_argument("--lengths", type=int, nargs="+", required=True, help="Context lengths, [CLS] and [SEP] in.")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--mlm_probability", type=float, default=MLM_PROBABILITY)
    parser.add_argument("--seed", type=int, default=0, help="Seed of the masks.")
    parser.add_argument("--rare_below", type=int, default=5,
                        help="A token occurring fewer times in the training text is rare.")  # fmt: skip
    parser.add_argument("--tokens_per_batch", type=int, default=4096)
    parser.add_argument("--one_transform_length", action="store_true",
                        help="Also read an Orchid model at each shorter length with one transform length, its "
                        "longest.")  # fmt: skip
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's).")
    args = vars(parser.parse_args(argv))
    threads = args.pop("threads")
    if threads:
        import torch

        torch.set_num_threads(threads)
    results = evaluate_contexts(**args)
    for entry in results["evaluations"]:
        if "categories" not in entry:
            print(f"{entry['length']} tokens: not read ({entry['how']})")
            continue
        print(f"{entry['length']} tokens ({entry['how']}): " + ", ".join(
            f"{name} {c['accuracy']:.4f} ({c['count']})" for name, c in entry["categories"].items()
            if c["accuracy"] is not None))  # fmt: skip
    return results


if __name__ == "__main__":
    run_cli(main)
