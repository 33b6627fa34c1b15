#!/usr/bin/env python
"""Logistic regression on standardised pixels, the floor of an image-classification comparison:

    python scripts/image_baseline.py --train_dir ../shared/data/fashion-mnist --output_dir outputs/fmnist-logreg

reads the IDX files of --train_dir (t10k files are the test set) and writes results.json, confusion_matrix.csv and
confusion_matrix.png as scripts/train_image.py does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchid_hf.runs import run_cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ and experiments/ are not installed
from experiments.real_data.baselines import logistic_regression_baseline  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train_dir", required=True, help="A folder of IDX files (train-* and t10k-*).")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--class_names", nargs="+", default=None, help="The names of the classes, in label order.")
    parser.add_argument("--max_iter", type=int, default=200, help="lbfgs iterations at most.")
    parser.add_argument("--C", type=float, default=1.0, help="Inverse L2 regularisation strength.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max_train_samples", type=int, default=None)
    args = parser.parse_args(argv)
    results = logistic_regression_baseline(**vars(args))
    print(f"logistic regression: test accuracy {results['accuracy']:.4f} on {results['num_eval']} images, "
          f"fitted in {results['train_seconds']:.0f} s ({results['model']['iterations']} iterations)")  # fmt: skip
    return results


if __name__ == "__main__":
    run_cli(main)
