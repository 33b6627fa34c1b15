#!/usr/bin/env python
"""Image classification with transformers' run_image_classification.py flags and Table C.3's recipes as defaults.

    python scripts/train_image.py --threads 1                                     # embedded digits, offline, minutes
    python scripts/train_image.py --dataset_name cifar10 --config_overrides patch_size=2 --output_dir out/cifar
    python scripts/train_image.py --recipe orchid-vit-imagenet --dataset_name imagenet-1k --bf16 --output_dir out/in
    python scripts/train_image.py --train_dir data/fashion-mnist --recipe orchid-vit-digits \\
        --config_overrides num_channels=1,image_size=28,patch_size=4 --output_dir out/fmnist   # IDX files
    python scripts/train_image.py --train_dir data/fashion-mnist --recipe orchid-vit-digits --model_type vit \\
        --config_overrides num_channels=1,image_size=28,patch_size=4,hidden_size=64,num_hidden_layers=3,\\
num_attention_heads=4,intermediate_size=128 --output_dir out/fmnist-vit        # a ViT baseline, same recipe

The output folder holds the model and its image processor (pipeline("image-classification", model=folder) works),
all_results.json, results.json and the confusion matrix. Any TrainingArguments flag works; --help lists them.
See docs/image_classification.md.
"""

from __future__ import annotations

import json

from orchid_hf.runs import run_cli
from orchid_hf.vision import main as train

SUMMARY = ("dataset", "eval_split", "accuracy", "epochs", "steps", "train_seconds", "total_seconds", "num_parameters")


def main(argv: list[str] | None = None) -> dict:
    results = train(argv)
    summary = {key: results[key] for key in SUMMARY if key in results}
    summary["epoch_stats"] = results.get("epoch_stats", [])[-3:]
    print(json.dumps(summary, indent=1))
    if "accuracy" in results:
        print(
            f"held-out accuracy {results['accuracy']:.4f} on {results['num_eval']} images ({results['eval_split']}) "
            f"after {results['total_seconds']:.0f} s; model in {results['output_dir']}"
        )
    return results


if __name__ == "__main__":
    run_cli(main)
