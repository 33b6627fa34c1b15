#!/usr/bin/env python
"""The Orchid-HF demo, end to end on a CPU without network (``make demo``).

1. Generate a small English-like corpus and an SST-2-style sentiment task (orchid_hf/demo_data.py).
2. Train a WordPiece tokenizer on the corpus.
3. Pretrain a tiny Orchid masked LM with the pretraining recipe (scripts/pretrain_mlm.py's code).
4. Fine-tune it on the sentiment task with the GLUE code path (scripts/finetune_glue.py's code, task sst2).
5. Reload both models through the Auto classes and run the fill-mask and text-classification pipelines.
6. The model cards are written next to the models; everything lands in outputs/demo/.

It prints the masked-token accuracy before and after pretraining and the classification accuracy, and
exits with an error if they do not show learning.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import datasets  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    pipeline,
)

from orchid_hf import OrchidConfig, OrchidForMaskedLM, glue, pretraining  # noqa: E402  (registers the Auto classes)
from orchid_hf.demo_data import write_demo_data  # noqa: E402
from orchid_hf.tokenization import train_wordpiece_tokenizer  # noqa: E402

# A model small enough to pretrain in a few minutes on two cores.
MODEL = "hidden_size=64,num_hidden_layers=2,intermediate_size=128,filter_width=32"
FILL_MASK_EXAMPLES = [
    "ben cooked the fresh soup at the [MASK] .",
    "anna loved the concert because it was [MASK] .",
    "the storm was [MASK] and the wind was strong .",
]
CLASSIFICATION_EXAMPLES = [
    "the pasta at the restaurant was excellent .",
    "the pasta at the restaurant was not excellent .",
    "grace said the flight was terrible .",
    "honestly , the telescope was not really awful .",
]


def log(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def run_demo(
    output_dir: str | Path = "outputs/demo",
    *,
    train_documents: int = 4000,
    train_examples: int = 2000,
    validation_examples: int = 500,
    vocab_size: int = 600,
    seq_length: int = 32,
    pretrain_steps: int = 1500,
    pretrain_batch_size: int = 32,
    pretrain_lr: float = 2e-3,
    finetune_epochs: float = 3,
    finetune_lr: float = 1e-3,
    baseline: bool = True,
    quiet: bool = True,
    min_masked_accuracy: float = 0.3,
    min_classification_accuracy: float = 0.8,
) -> dict:
    start = time.time()
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if quiet:
        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        datasets.disable_progress_bars()
    common = ["--use_cpu", "--disable_tqdm", "True", "--cache_dir", str(out / "cache")]

    log("1/6 generating the corpus and the sentiment task")
    paths = write_demo_data(
        out / "data", train_documents=train_documents, train_examples=train_examples,
        validation_examples=validation_examples,
    )  # fmt: skip

    log("2/6 training a WordPiece tokenizer")
    corpus = paths["corpus_train"].read_text().splitlines()
    tokenizer = train_wordpiece_tokenizer(corpus, vocab_size=vocab_size, model_max_length=seq_length)
    tokenizer.save_pretrained(out / "tokenizer")

    log(f"3/6 pretraining a tiny Orchid MLM for {pretrain_steps} steps (scripts/pretrain_mlm.py)")
    mlm_dir = out / "mlm"
    mlm = pretraining.main(
        [
            "--train_file", str(paths["corpus_train"]), "--validation_file", str(paths["corpus_validation"]),
            "--tokenizer_name", str(out / "tokenizer"),
            "--config_overrides", f"{MODEL},max_position_embeddings={seq_length}",
            "--max_seq_length", str(seq_length), "--output_dir", str(mlm_dir),
            "--max_steps", str(pretrain_steps), "--per_device_train_batch_size", str(pretrain_batch_size),
            "--learning_rate", str(pretrain_lr), "--eval_before_training", "--eval_strategy", "no",
            "--save_strategy", "no", "--logging_steps", str(max(1, pretrain_steps // 8)), *common,
        ]
    )  # fmt: skip
    before, after = mlm["init"]["init_masked_accuracy"], mlm["eval"]["eval_masked_accuracy"]
    log(f"masked-token accuracy: {before:.1%} before pretraining -> {after:.1%} after (chance {1 / vocab_size:.2%})")

    log("4/6 fine-tuning on the sentiment task with the GLUE code path (task sst2, scripts/finetune_glue.py)")
    finetune = [
        "--task_name", "sst2", "--data_dir", str(out / "data"), "--max_seq_length", str(seq_length),
        "--learning_rate", str(finetune_lr), "--num_train_epochs", str(finetune_epochs), "--pooling", "mean",
        "--per_device_train_batch_size", "32", "--logging_steps", "100", *common,
    ]  # fmt: skip
    glue_dir = out / "glue"
    summary = glue.main(["--model_name_or_path", str(mlm_dir), "--output_dir", str(glue_dir), *finetune])
    accuracy = summary["tasks"]["sst2"]["metrics"]["validation"]["accuracy"]
    log(f"sentiment accuracy on {validation_examples} validation sentences: {accuracy:.1%} (chance 50%)")
    scratch_accuracy = None
    if baseline:
        # The same fine-tuning from random weights shows what the pretraining contributed.
        scratch_dir = out / "scratch"
        transformers.set_seed(0)
        OrchidForMaskedLM(OrchidConfig.from_pretrained(mlm_dir)).save_pretrained(scratch_dir)
        tokenizer.save_pretrained(scratch_dir)
        scratch = glue.main(
            ["--model_name_or_path", str(scratch_dir), "--output_dir", str(out / "glue_scratch"), *finetune]
        )
        scratch_accuracy = scratch["tasks"]["sst2"]["metrics"]["validation"]["accuracy"]
        log(f"the same fine-tuning from random weights instead of the pretrained ones: {scratch_accuracy:.1%}")

    log("5/6 reloading through the Auto classes and running the pipelines")
    classifier_dir = glue_dir / "sst2"
    fill_mask = pipeline(
        "fill-mask",
        model=AutoModelForMaskedLM.from_pretrained(mlm_dir),
        tokenizer=AutoTokenizer.from_pretrained(mlm_dir),
    )
    for text in FILL_MASK_EXAMPLES:
        guesses = ", ".join(f"{g['token_str']} ({g['score']:.2f})" for g in fill_mask(text, top_k=3))
        log(f"  fill-mask  {text!r}: {guesses}")
    classify = pipeline(
        "text-classification",
        model=AutoModelForSequenceClassification.from_pretrained(classifier_dir),
        tokenizer=AutoTokenizer.from_pretrained(classifier_dir),
    )
    for text, prediction in zip(CLASSIFICATION_EXAMPLES, classify(CLASSIFICATION_EXAMPLES), strict=True):
        log(f"  classify   {text!r}: {prediction['label']} ({prediction['score']:.2f})")

    log("6/6 model cards")
    for folder in (mlm_dir, classifier_dir):
        log(f"  {folder / 'README.md'}")

    elapsed = time.time() - start
    result = {
        "masked_accuracy_before": before,
        "masked_accuracy_after": after,
        "masked_accuracy_chance": 1 / vocab_size,
        "classification_accuracy": accuracy,
        "classification_accuracy_from_scratch": scratch_accuracy,
        "seconds": round(elapsed, 1),
        "mlm_dir": str(mlm_dir),
        "classifier_dir": str(classifier_dir),
    }
    (out / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    log(
        f"done in {elapsed / 60:.1f} min: masked-token accuracy {before:.1%} -> {after:.1%}, "
        f"sentiment accuracy {accuracy:.1%}; outputs in {out}"
    )
    result["learned"] = after >= max(min_masked_accuracy, 10 * before) and accuracy >= min_classification_accuracy
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="outputs/demo")
    parser.add_argument("--pretrain_steps", type=int, default=1500)
    parser.add_argument("--finetune_epochs", type=float, default=3)
    parser.add_argument("--no_baseline", action="store_true", help="Skip the fine-tuning from random weights.")
    parser.add_argument(
        "--threads", type=int, default=1,
        help="Torch threads. One is fastest for this tiny model: more threads cost more in synchronisation "
        "than they save, and far more when other processes share the cores.",
    )  # fmt: skip
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    result = run_demo(
        args.output_dir,
        pretrain_steps=args.pretrain_steps,
        finetune_epochs=args.finetune_epochs,
        baseline=not args.no_baseline,
    )
    if not result["learned"]:
        log("the accuracies above do not show learning: something is wrong")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
