"""Train Orchid-ViT image classifiers (Orchid paper, Sec. 4.3 and App. C.4) with the Hugging Face Trainer.

    python scripts/train_image.py                                   # embedded digits, no network, ~1-2 min
    python scripts/train_image.py --dataset cifar10 --preset orchid-vit-cifar-s --patch_size 2
    python scripts/train_image.py --dataset imagenet-1k --preset orchid-vit-imagenet --num_workers 8
    python scripts/train_image.py --dataset /data/my_images --preset orchid-vit-cifar-s --epochs 50

The output folder holds the model, its image processor (so pipeline("image-classification", model=folder)
works), results.json and confusion_matrix.png. See docs/image_classification.md.
"""

from __future__ import annotations

import json
import sys

from transformers import HfArgumentParser

from orchid_hf.vision import ImageTrainingConfig, train_image_classifier


def parse_args(argv: list[str] | None = None) -> ImageTrainingConfig:
    parser = HfArgumentParser(ImageTrainingConfig, description=__doc__)
    (config,) = parser.parse_args_into_dataclasses(args=argv)
    return config


def main(argv: list[str] | None = None) -> dict:
    config = parse_args(argv)
    results = train_image_classifier(config)
    summary = {
        k: results[k]
        for k in (
            "dataset",
            "eval_split",
            "accuracy",
            "epochs",
            "steps",
            "train_seconds",
            "total_seconds",
            "sequence_length",
            "num_parameters",
            "output_dir",
        )
    }
    summary["epoch_stats"] = results["epoch_stats"][-3:]
    print(json.dumps(summary, indent=1))
    print(
        f"held-out accuracy {results['accuracy']:.4f} on {results['num_eval']} images "
        f"({results['eval_split']}) after {results['total_seconds']:.0f} s; model in {results['output_dir']}"
    )
    return results


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (ValueError, ConnectionError) as error:  # bad input: the message says what to change
        sys.exit(f"error: {error}")
