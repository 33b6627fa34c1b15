#!/usr/bin/env python
"""Masked-LM pretraining with transformers' run_mlm.py flags and the paper's recipe as the defaults.

    python scripts/pretrain_mlm.py --output_dir outputs/orchid-bert-base          # the paper's run: C4 from the Hub
    python scripts/pretrain_mlm.py --train_file corpus.txt --tokenizer_name tok/ \\
        --config_overrides hidden_size=64,num_hidden_layers=2 --max_steps 200 --output_dir out/     # local data
    python scripts/pretrain_mlm.py --model_type bert --train_file corpus.txt --tokenizer_name tok/ \\
        --config_overrides hidden_size=64,num_hidden_layers=2,num_attention_heads=2 --output_dir bert/  # a baseline
    python scripts/pretrain_mlm.py config.yaml                                    # the same flags in a file

Any TrainingArguments flag works; --help lists them. Runs unchanged under torchrun and accelerate launch.
See docs/training.md.
"""

from orchid_hf.pretraining import main
from orchid_hf.runs import run_cli

if __name__ == "__main__":
    run_cli(main)
