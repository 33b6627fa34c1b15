#!/usr/bin/env python
"""Masked-LM pretraining of Orchid-BERT with the Trainer: the paper's C4 recipe by default, local files offline.

    python scripts/pretrain_mlm.py --output_dir outputs/orchid-bert-base            # C4 from the Hub
    python scripts/pretrain_mlm.py --train_file corpus.txt --tokenizer_name tok/ \\
        --config_overrides hidden_size=64,num_hidden_layers=2 --max_steps 200      # local data

Runs unchanged under ``torchrun`` and ``accelerate launch``. All options: ``--help``; docs/training.md.
"""

from orchid_hf.pretraining import main
from orchid_hf.training import run_cli

if __name__ == "__main__":
    run_cli(main)
