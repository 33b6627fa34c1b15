#!/usr/bin/env python
"""GLUE fine-tuning of a pretrained Orchid MLM with the Table C.2 hyperparameters of the paper.

    python scripts/finetune_glue.py --model_name_or_path outputs/orchid-bert-base --all_tasks --from_mnli
    python scripts/finetune_glue.py --model_name_or_path MODEL --task sst2 --data_dir glue_data/   # offline

Writes OUTPUT_DIR/<task>/ (model, card, results.json) and OUTPUT_DIR/glue_results.{json,md} (Table C.1 layout).
Runs unchanged under ``torchrun`` and ``accelerate launch``. All options: ``--help``; docs/training.md.
"""

from orchid_hf.glue import main
from orchid_hf.training import run_cli

if __name__ == "__main__":
    run_cli(main)
