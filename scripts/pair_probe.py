#!/usr/bin/env python
"""Linear probes on a frozen model's features for the novels' pair task (same novel or not):

    python scripts/pair_probe.py --task_dir outputs/real_data/austen/pairs-128 \
        --model_name_or_path outputs/real_data/pretrain-orchid \
        --output_dir outputs/real_data/probe-pairs-128-orchid-pretrained

encodes every passage alone with the model (never trained here; --init random takes its configuration at random
initialisation instead), pools the mean of its real tokens at the embeddings and at the last layer, describes a pair
by the product and the absolute difference of its passages' standardised features, fits a logistic regression on
train.csv for each --C, chooses C on validation.csv, scores it on test.csv and writes results.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchid_hf.runs import run_cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/ is not installed
from experiments.real_data.probes import INITS, frozen_feature_pair_probe  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task_dir", required=True, help="A pair-task folder of scripts/prepare_novels.py.")
    parser.add_argument("--model_name_or_path", required=True, help="A model folder with its tokenizer.")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--init", choices=INITS, default="pretrained",
                        help="The model's weights, or its configuration at random initialisation.")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="Seed of the random initialisation.")
    parser.add_argument("--C", type=float, nargs="+", default=[0.1, 1.0, 10.0],
                        help="Inverse L2 strengths to choose from on the validation file.")  # fmt: skip
    parser.add_argument("--max_iter", type=int, default=1000, help="lbfgs iterations at most.")
    parser.add_argument("--batch_size", type=int, default=64, help="Passages encoded at a time.")
    args = parser.parse_args(argv)
    results = frozen_feature_pair_probe(**vars(args))
    for layer, probe in results["layers"].items():
        print(f"{results['model_type']} ({args.init}), {layer}: C {probe['chosen_C']:g} chosen on validation "
              f"({probe['validation_accuracy']}), test accuracy {probe['accuracy']:.4f} on {probe['num_eval']} pairs "
              f"(majority class {probe['majority_class_accuracy']:.4f})")  # fmt: skip
    return results


if __name__ == "__main__":
    run_cli(main)
