#!/usr/bin/env python
"""Logistic regression on token frequencies, the floor of a text-classification comparison on the novels:

    python scripts/text_baseline.py --task_dir outputs/real_data/austen/attribution-128 \
        --tokenizer_name outputs/real_data/austen/tokenizer --output_dir outputs/real_data/floor-attribution-128

fits on train.csv for each --C, chooses C on validation.csv, scores the chosen model on test.csv and writes
results.json. Pairs (sentence1, sentence2) are described by the tokens both passages contain and those only one of
them contains.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchid_hf.runs import run_cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/ is not installed
from experiments.real_data.baselines import text_logistic_regression_baseline  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task_dir", required=True, help="A task folder of scripts/prepare_novels.py.")
    parser.add_argument("--tokenizer_name", required=True, help="The tokenizer folder the models use.")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--C", type=float, nargs="+", default=[0.1, 1.0, 10.0],
                        help="Inverse L2 strengths to choose from on the validation file.")  # fmt: skip
    parser.add_argument("--max_iter", type=int, default=1000, help="lbfgs iterations at most.")
    args = parser.parse_args(argv)
    results = text_logistic_regression_baseline(**vars(args))
    print(f"logistic regression on token frequencies: C {results['chosen_C']:g} chosen on validation "
          f"({results['validation_accuracy']}), test accuracy {results['accuracy']:.4f} on {results['num_eval']} "
          f"examples (majority class {results['majority_class_accuracy']:.4f})")  # fmt: skip
    return results


if __name__ == "__main__":
    run_cli(main)
