#!/usr/bin/env python
"""scripts/finetune_glue.py for the grid of docs/results/real_data.md: the same recipe and flags, with --pooling
(first or mean) setting BERT's classifier pooling as it sets Orchid's (experiments/real_data/pooling.py); without
--pooling, BERT takes the recipe's default as Orchid does (the mean, for own data):

    python scripts/real_data_finetune.py --model_name_or_path outputs/real_data/pretrain-bert --pooling mean \\
        --train_file train.csv --validation_file validation.csv --output_dir out/
"""

import sys
from pathlib import Path

from orchid_hf.glue import main
from orchid_hf.runs import run_cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/ is not installed
from experiments.real_data.pooling import register_bert_pooling  # noqa: E402

if __name__ == "__main__":
    register_bert_pooling()
    run_cli(main)
