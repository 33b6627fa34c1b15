"""Masked-language-model pretraining of Orchid-BERT with the transformers Trainer (App. C.3).

The paper's recipe is the default: C4 (``allenai/c4``, ``en``, streamed from the Hub), the bert-base-uncased
tokenizer, blocks of 128 tokens, 30% masking, decoupled AdamW with betas (0.9, 0.98), eps 1e-6, lr 8e-4,
linear warmup over the first 6% of the steps then linear decay, weight decay 1e-5, gradient clipping 1.0,
70k steps, bf16 where the hardware has it. Local text/json/parquet/csv files and a tokenizer folder replace
the Hub for offline runs. ``scripts/pretrain_mlm.py`` is the command line; docs/training.md shows both paths.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import math
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

import numpy as np
import torch
from transformers import (
    AutoModelForMaskedLM,
    DataCollatorForLanguageModeling,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    set_seed,
)
from transformers.trainer_utils import get_last_checkpoint

from .modeling import OrchidForMaskedLM
from .training import (
    ADAM_BETAS,
    ADAM_EPSILON,
    MAX_GRAD_NORM,
    OPTIMIZERS,
    WARMUP_FRACTION,
    HubUnavailableError,
    bf16_available,
    from_pretrained,
    hub_offline,
    is_local_path,
    load_model_config,
    load_tokenizer,
    parse_overrides,
    require_hub,
    torch_weight_decay,
    write_json,
)

logger = logging.getLogger(__name__)

LOCAL_DATA_HINT = (
    "Offline, pass local files instead: --train_file corpus.txt [more files] (text, one document per line, or "
    "json/jsonl/parquet/csv with a 'text' column; --text_column names another), optionally --validation_file, "
    "and --tokenizer_name pointing to a tokenizer folder (for example one saved by "
    "orchid_hf.tokenization.train_wordpiece_tokenizer(...).save_pretrained(folder))."
)
FILE_BUILDERS = {
    ".txt": "text",
    ".text": "text",
    ".json": "json",
    ".jsonl": "json",
    ".parquet": "parquet",
    ".csv": "csv",
}

# The paper's recipe as TrainingArguments defaults; every one can still be given on the command line.
PAPER_TRAINING_DEFAULTS = dict(
    output_dir="outputs/pretrain_mlm",
    learning_rate=8e-4,
    adam_beta1=ADAM_BETAS[0],
    adam_beta2=ADAM_BETAS[1],
    adam_epsilon=ADAM_EPSILON,
    weight_decay=1e-5,
    lr_scheduler_type="linear",
    warmup_steps=WARMUP_FRACTION,
    max_grad_norm=MAX_GRAD_NORM,
    max_steps=70_000,
    per_device_train_batch_size=128,
    per_device_eval_batch_size=128,
    optim="adamw_torch",
    eval_strategy="steps",
    eval_steps=2000,
    save_steps=2000,
    save_total_limit=3,
    logging_steps=100,
    report_to="none",
    # Every parameter takes part in every step; DDP need not search the graph for unused ones.
    ddp_find_unused_parameters=False,
)


@dataclass
class PretrainingArguments:
    """What to train on and what to train; the optimizer and loop settings are TrainingArguments."""

    model_config: str = field(
        default="orchid-bert-base",
        metadata={"help": "Preset name (orchid-bert-base, orchid-bert-large), a config.json or a folder with one."},
    )
    config_overrides: str | None = field(
        default=None, metadata={"help": "Config fields to override, e.g. 'hidden_size=64,num_hidden_layers=2'."}
    )
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Start from these weights (an Orchid MLM folder) instead of a new model."}
    )
    tokenizer_name: str = field(
        default="bert-base-uncased", metadata={"help": "Hub name or local folder of the tokenizer."}
    )
    dataset_name: str | None = field(default="allenai/c4", metadata={"help": "Hub dataset (unused with --train_file)."})
    dataset_config_name: str | None = field(default="en", metadata={"help": "Configuration of the Hub dataset."})
    streaming: bool = field(default=True, metadata={"help": "Stream the Hub dataset instead of downloading it."})
    train_file: list[str] | None = field(
        default=None, metadata={"help": "Local training files: .txt (one document per line), .json(l), .parquet, .csv."}
    )
    validation_file: list[str] | None = field(default=None, metadata={"help": "Local validation files."})
    validation_split_percentage: float = field(
        default=5.0, metadata={"help": "Share of the local documents held out when no --validation_file is given."}
    )
    text_column: str = field(default="text", metadata={"help": "Column holding the text in json/parquet/csv files."})
    max_seq_length: int = field(default=128, metadata={"help": "Tokens per training block ([CLS] and [SEP] included)."})
    mlm_probability: float = field(default=0.3, metadata={"help": "Share of the tokens that are masked."})
    optimizer: str = field(
        default="d-adamw",
        metadata={
            "help": "d-adamw: --weight_decay is the paper's decoupled value (Composer DecoupledAdamW) and is "
            "converted for torch's AdamW; adamw: --weight_decay goes to torch's AdamW as it is.",
            "choices": list(OPTIMIZERS),
        },
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Use at most this many training blocks."})
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Use at most this many validation blocks (2048 when streaming)."}
    )
    eval_before_training: bool = field(
        default=False, metadata={"help": "Evaluate the model before the first step (reported with the prefix init_)."}
    )
    shuffle_buffer_size: int = field(default=10_000, metadata={"help": "Shuffle buffer of a streamed dataset."})
    cache_dir: str | None = field(default=None, metadata={"help": "Where datasets keeps its Arrow cache."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})


def build_parser() -> HfArgumentParser:
    parser = HfArgumentParser((PretrainingArguments, TrainingArguments))
    parser.set_defaults(**PAPER_TRAINING_DEFAULTS, bf16=bf16_available())
    return parser


def parse_args(argv: list[str] | None = None) -> tuple[PretrainingArguments, TrainingArguments]:
    data_args, training_args = build_parser().parse_args_into_dataclasses(args=argv)
    check_arguments(data_args, training_args)
    return data_args, training_args


def check_arguments(data_args: PretrainingArguments, training_args: TrainingArguments) -> None:
    if not 0.0 < data_args.mlm_probability < 1.0:
        raise ValueError(f"mlm_probability must be in (0, 1), got {data_args.mlm_probability}")
    if data_args.max_seq_length < 3:
        raise ValueError(f"max_seq_length must be >= 3 ([CLS], one token, [SEP]), got {data_args.max_seq_length}")
    if not 0.0 <= data_args.validation_split_percentage < 100.0:
        raise ValueError(
            f"validation_split_percentage must be in [0, 100), got {data_args.validation_split_percentage}"
        )
    if data_args.optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {data_args.optimizer!r}")
    if data_args.train_file is None and data_args.dataset_name is None:
        raise ValueError("pass --train_file (local files) or --dataset_name (a Hub dataset)")
    if data_args.train_file is None and data_args.streaming and training_args.max_steps <= 0:
        raise ValueError(f"a streamed dataset has no length: set --max_steps > 0, got {training_args.max_steps}")


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def file_builder(files: list[str]) -> str:
    """The datasets builder for local files, from their extension; all files must share one."""
    builders = set()
    for name in files:
        suffix = Path(name).suffix.lower()
        if suffix not in FILE_BUILDERS:
            raise ValueError(f"unsupported file type {suffix!r} for {name}; use one of {sorted(FILE_BUILDERS)}")
        if not Path(name).is_file():
            raise ValueError(f"data file {name} does not exist")
        builders.add(FILE_BUILDERS[suffix])
    if len(builders) != 1:
        raise ValueError(f"all data files must have the same type, got {sorted(builders)} for {files}")
    return builders.pop()


def load_raw_datasets(args: PretrainingArguments, seed: int):
    """(train, validation) datasets of documents with a ``text`` column: local files or the Hub (streamed)."""
    from datasets import load_dataset

    if args.train_file:
        builder = file_builder(args.train_file)
        files = {"train": list(args.train_file)}
        if args.validation_file:
            if file_builder(args.validation_file) != builder:
                raise ValueError("validation_file must have the same type as train_file")
            files["validation"] = list(args.validation_file)
        raw = load_dataset(builder, data_files=files, cache_dir=args.cache_dir)
        train = raw["train"]
        if "validation" in raw:
            validation = raw["validation"]
        elif args.validation_split_percentage > 0:
            split = train.train_test_split(test_size=args.validation_split_percentage / 100, seed=seed)
            train, validation = split["train"], split["test"]
        else:
            validation = None
        for name, dataset in (("train_file", train), ("validation_file", validation)):
            if dataset is not None and args.text_column not in dataset.column_names:
                raise ValueError(
                    f"{name} has columns {dataset.column_names}, none of them is text_column={args.text_column!r}"
                )
        return train, validation

    require_hub(args.dataset_name, what="dataset", how_to_local=LOCAL_DATA_HINT)
    train = load_dataset(
        args.dataset_name, args.dataset_config_name, split="train", streaming=args.streaming, cache_dir=args.cache_dir
    )
    validation = load_dataset(
        args.dataset_name,
        args.dataset_config_name,
        split="validation",
        streaming=args.streaming,
        cache_dir=args.cache_dir,
    )
    if args.streaming:
        train = train.shuffle(seed=seed, buffer_size=args.shuffle_buffer_size)
    return train, validation


def block_packer(tokenizer, block_size: int, text_column: str):
    """A batched ``map`` function: tokenize documents, join them with [SEP] and cut the stream into full
    blocks ``[CLS] <block_size - 2 tokens> [SEP]``; the tail that does not fill a block is dropped."""
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    if cls_id is None or sep_id is None:
        raise ValueError("the tokenizer needs [CLS] and [SEP] tokens (cls_token and sep_token) to build blocks")
    special_ids = set(tokenizer.all_special_ids)
    content = block_size - 2

    def pack(batch: dict) -> dict:
        texts = [text for text in batch[text_column] if text and text.strip()]
        stream: list[int] = []
        for ids in tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]:
            stream.extend(ids)
            stream.append(sep_id)
        blocks = [[cls_id, *stream[i : i + content], sep_id] for i in range(0, len(stream) - content + 1, content)]
        return {
            "input_ids": blocks,
            "special_tokens_mask": [[int(t in special_ids) for t in block] for block in blocks],
        }

    return pack


def pack_dataset(dataset, tokenizer, block_size: int, text_column: str, num_proc: int | None = None):
    """Blocks of ``block_size`` tokens from a dataset of documents (map-style or streamed)."""
    from datasets import IterableDataset

    pack = block_packer(tokenizer, block_size, text_column)
    if isinstance(dataset, IterableDataset):
        columns = list(dataset.features) if dataset.features is not None else [text_column]
        return dataset.map(pack, batched=True, batch_size=1000, remove_columns=columns)
    return dataset.map(
        pack, batched=True, batch_size=1000, remove_columns=dataset.column_names, num_proc=num_proc, desc="Packing"
    )


@dataclass
class ReproducibleMLMCollator(DataCollatorForLanguageModeling):
    """BERT masking (DataCollatorForLanguageModeling) whose random draws depend on the batch, not on history.

    Each batch's masks come from a generator seeded by its token ids and ``mask_seed``. A run resumed from a
    checkpoint therefore masks every batch exactly as the uninterrupted run did, whatever Trainer skipped,
    prefetched or handed to dataloader workers, and the validation set gets the same masks at every
    evaluation. Shuffling regroups the examples every epoch, so a block is masked afresh in each epoch.
    """

    mask_seed: int = 0

    def torch_mask_tokens(self, inputs, special_tokens_mask=None, offset_mapping=None):
        digest = hashlib.blake2b(inputs.numpy().astype(np.int64).tobytes(), digest_size=8).digest()
        seed = (int.from_bytes(digest, "little") ^ self.mask_seed) % (2**63)
        self.generator = torch.Generator().manual_seed(seed)
        return super().torch_mask_tokens(inputs, special_tokens_mask=special_tokens_mask, offset_mapping=offset_mapping)


def preprocess_logits_for_metrics(logits, labels):
    """Keep the arg-max only: the full (batch, length, vocab) logits of a whole eval set do not fit in memory."""
    if isinstance(logits, tuple):
        logits = logits[0]
    return logits.argmax(dim=-1)


def masked_token_accuracy(eval_prediction) -> dict:
    """Share of the masked positions (label != -100) whose arg-max prediction is the original token."""
    predictions, labels = eval_prediction.predictions, eval_prediction.label_ids
    scored = labels != -100
    total = int(scored.sum())
    return {"masked_accuracy": float((predictions[scored] == labels[scored]).sum() / total) if total else math.nan}


# ---------------------------------------------------------------------------------------------
# Model and trainer
# ---------------------------------------------------------------------------------------------


def build_model(args: PretrainingArguments, tokenizer):
    if args.model_name_or_path:
        model = from_pretrained(
            AutoModelForMaskedLM, args.model_name_or_path, what="model", how_to_local=LOCAL_DATA_HINT
        )
    else:
        overrides = parse_overrides(args.config_overrides)
        overrides.setdefault("vocab_size", len(tokenizer))
        overrides.setdefault("pad_token_id", tokenizer.pad_token_id)
        model = OrchidForMaskedLM(load_model_config(args.model_config, overrides))
    config = model.config
    if len(tokenizer) > config.vocab_size:
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {config.vocab_size}")
    if args.max_seq_length > config.max_position_embeddings:
        raise ValueError(
            f"max_seq_length={args.max_seq_length} exceeds the model's "
            f"max_position_embeddings={config.max_position_embeddings}"
        )
    return model


@dataclass
class PretrainingRun:
    trainer: Trainer
    data_args: PretrainingArguments
    training_args: TrainingArguments
    tokenizer: object
    push_to_hub: bool
    hub_model_id: str | None
    weight_decay: float  # as requested, before the conversion for torch's AdamW


def build_trainer(data_args: PretrainingArguments, training_args: TrainingArguments, callbacks=None) -> PretrainingRun:
    """Tokenizer, packed datasets, model, collator and Trainer for one pretraining run."""
    # Settings derived here go to a copy, so the caller's arguments can build another run unchanged.
    training_args = copy.copy(training_args)
    # The Trainer's own push would upload checkpoints with its generic card; we push once, at the end.
    push, hub_model_id = training_args.push_to_hub, training_args.hub_model_id
    training_args.push_to_hub = False
    if push:
        hub_model_id = hub_model_id or Path(training_args.output_dir).name
        if hub_offline():
            raise HubUnavailableError(
                f"--push_to_hub {hub_model_id}: HF_HUB_OFFLINE is set, so the Hub cannot be reached; drop "
                "--push_to_hub to train offline and push the output folder later with orchid_hf.hub.push_to_hub"
            )

    tokenizer = load_tokenizer(data_args.tokenizer_name, how_to_local=LOCAL_DATA_HINT)
    if tokenizer.mask_token is None:
        raise ValueError(f"tokenizer {data_args.tokenizer_name!r} has no mask token; masked-LM pretraining needs one")

    decoupled_decay = training_args.weight_decay
    # torch's AdamW with the value that reproduces the requested optimizer (see torch_weight_decay).
    training_args.weight_decay = torch_weight_decay(
        data_args.optimizer, decoupled_decay, training_args.learning_rate
    )
    logger.info(
        "optimizer %s: weight decay %g at lr %g -> torch AdamW weight_decay=%g",
        data_args.optimizer,
        decoupled_decay,
        training_args.learning_rate,
        training_args.weight_decay,
    )
    training_args.remove_unused_columns = False

    set_seed(training_args.seed)
    with training_args.main_process_first(desc="loading and packing the data"):
        train_raw, validation_raw = load_raw_datasets(data_args, training_args.data_seed or training_args.seed)
        num_proc = data_args.preprocessing_num_workers
        train = pack_dataset(train_raw, tokenizer, data_args.max_seq_length, data_args.text_column, num_proc)
        validation = (
            pack_dataset(validation_raw, tokenizer, data_args.max_seq_length, data_args.text_column, num_proc)
            if validation_raw is not None
            else None
        )
    train, validation = _limit(train, validation, data_args)

    model = build_model(data_args, tokenizer)
    # Saved with the model: pipelines then truncate to what the model accepts.
    tokenizer.model_max_length = min(tokenizer.model_max_length, model.config.max_position_embeddings)
    collator = ReproducibleMLMCollator(
        tokenizer=tokenizer, mlm_probability=data_args.mlm_probability, mask_seed=training_args.seed
    )
    if validation is None and training_args.eval_strategy != "no":
        training_args.eval_strategy = "no"
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train,
        eval_dataset=validation,
        data_collator=collator,
        processing_class=tokenizer,
        compute_metrics=masked_token_accuracy,
        preprocess_logits_for_metrics=preprocess_logits_for_metrics,
        callbacks=callbacks,
    )
    return PretrainingRun(trainer, data_args, training_args, tokenizer, push, hub_model_id, decoupled_decay)


def _limit(train, validation, args: PretrainingArguments):
    from datasets import Dataset, IterableDataset

    if isinstance(train, IterableDataset):
        if args.max_train_samples is not None:
            train = train.take(args.max_train_samples)
    else:
        if len(train) == 0:
            raise ValueError(
                f"the training data gives no full block of max_seq_length={args.max_seq_length} tokens; "
                "add text or lower max_seq_length"
            )
        if args.max_train_samples is not None:
            train = train.select(range(min(args.max_train_samples, len(train))))
    if isinstance(validation, IterableDataset):
        # A fixed, finite validation set: the first blocks of the validation stream.
        count = args.max_eval_samples or 2048
        validation = Dataset.from_list(list(islice(iter(validation), count)))
    elif validation is not None and args.max_eval_samples is not None:
        validation = validation.select(range(min(args.max_eval_samples, len(validation))))
    if validation is not None and len(validation) == 0:
        validation = None
    return train, validation


def resolve_checkpoint(value: str | None, output_dir: str) -> str | None:
    """``--resume_from_checkpoint last`` means the newest checkpoint in the output folder."""
    if value in (None, "", "False", "false"):
        return None
    if value in ("last", "True", "true"):
        last = get_last_checkpoint(output_dir) if Path(output_dir).is_dir() else None
        if last is None:
            raise ValueError(f"--resume_from_checkpoint {value}: no checkpoint-* folder in {output_dir}")
        return last
    if not Path(value).is_dir():
        raise ValueError(f"--resume_from_checkpoint {value} is not a folder")
    return value


def main(argv: list[str] | None = None) -> dict:
    """Pretrain; returns the metrics (``init`` when --eval_before_training, ``train``, ``eval``)."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    data_args, training_args = parse_args(argv)
    run = build_trainer(data_args, training_args)
    trainer = run.trainer
    results: dict = {"world_size": training_args.world_size}
    if data_args.eval_before_training and trainer.eval_dataset is not None:
        results["init"] = trainer.evaluate(metric_key_prefix="init")
    checkpoint = resolve_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir)
    train_output = trainer.train(resume_from_checkpoint=checkpoint)
    results["train"] = train_output.metrics
    if trainer.eval_dataset is not None:
        # The last step may have just been evaluated; do not pay for the same evaluation twice.
        step = trainer.state.global_step
        done = [entry for entry in trainer.state.log_history if "eval_loss" in entry and entry.get("step") == step]
        results["eval"] = done[-1] if done else trainer.evaluate()
    trainer.save_model()
    if trainer.is_world_process_zero():
        trainer.save_state()
        write_json(Path(training_args.output_dir) / "pretraining_results.json", results)
        _write_card(run, results)
        if run.push_to_hub:
            from .hub import push_to_hub

            push_to_hub(
                training_args.output_dir,
                run.hub_model_id,
                private=bool(training_args.hub_private_repo),
                token=training_args.hub_token,
                commit_message="Orchid masked-LM pretraining",
            )
    return results


def _write_card(run: PretrainingRun, results: dict) -> None:
    from .cards import write_model_card

    data_args, args = run.data_args, run.training_args
    datasets = [data_args.dataset_name] if not data_args.train_file else []
    eval_results = []
    if "eval" in results:
        dataset_name = data_args.dataset_name if not data_args.train_file else "local corpus"
        for metric, key in (("accuracy", "eval_masked_accuracy"), ("loss", "eval_loss")):
            if key in results["eval"]:
                eval_results.append(
                    dict(
                        task_type="fill-mask",
                        dataset_type=dataset_name,
                        dataset_name=dataset_name,
                        dataset_config=data_args.dataset_config_name if not data_args.train_file else None,
                        dataset_split="validation",
                        metric_type=metric,
                        metric_name="masked-token accuracy" if metric == "accuracy" else "MLM loss",
                        metric_value=round(float(results["eval"][key]), 4),
                    )
                )
    write_model_card(
        args.output_dir,
        task="fill-mask",
        model_name=run.hub_model_id or Path(args.output_dir).name,
        repo_id=run.hub_model_id,
        datasets=datasets,
        results=eval_results,
        # The card's base_model must be a Hub id, not a local folder.
        base_model=data_args.model_name_or_path if not is_local_path(data_args.model_name_or_path or ".") else None,
        example_input=f'"the capital of france is {run.tokenizer.mask_token} ."',
        training={
            "objective": f"masked language modelling, {data_args.mlm_probability:.0%} of the tokens masked",
            "sequence length": data_args.max_seq_length,
            "optimizer": f"{data_args.optimizer}, betas ({args.adam_beta1}, {args.adam_beta2}), "
            f"eps {args.adam_epsilon}",
            "learning rate": f"{args.learning_rate} (linear warmup {args.warmup_steps}, then linear decay)",
            "weight decay": f"{run.weight_decay} ({data_args.optimizer}; "
            f"torch AdamW weight_decay={args.weight_decay:g})",
            "steps": args.max_steps if args.max_steps > 0 else f"{args.num_train_epochs} epochs",
            "batch size": args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size,
            "gradient clipping": args.max_grad_norm,
            "precision": "bf16" if args.bf16 else "fp32",
        },
    )


__all__ = [
    "PAPER_TRAINING_DEFAULTS",
    "PretrainingArguments",
    "ReproducibleMLMCollator",
    "block_packer",
    "build_parser",
    "build_trainer",
    "main",
    "masked_token_accuracy",
    "pack_dataset",
    "parse_args",
]
