#!/usr/bin/env python
"""GLUE fine-tuning and text classification, with transformers' run_glue.py flags and Table C.2's defaults.

    python scripts/finetune_glue.py --model_name_or_path outputs/orchid-bert-base --task_name all --from_mnli \\
        --output_dir outputs/glue-base                                               # the paper's suite (Hub)
    python scripts/finetune_glue.py --model_name_or_path MODEL --task_name sst2 --data_dir glue_data/ \\
        --do_train --do_eval --do_predict --output_dir out/                          # offline, with test predictions
    python scripts/finetune_glue.py --model_name_or_path MODEL --train_file train.csv --validation_file dev.csv \\
        --output_dir out/                                                            # your own data
    python scripts/finetune_glue.py config.json                                      # the same flags in a file

Writes OUTPUT_DIR/<task>/ (model, card, all_results.json, results.json), OUTPUT_DIR/glue_results.{json,md}
(Table C.1 layout) and, with --do_predict, OUTPUT_DIR/submission/<TASK>.tsv. Any TrainingArguments flag works;
--help lists them. Runs unchanged under torchrun and accelerate launch. See docs/training.md.
"""

from orchid_hf.glue import main
from orchid_hf.runs import run_cli

if __name__ == "__main__":
    run_cli(main)
