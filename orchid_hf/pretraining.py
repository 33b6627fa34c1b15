"""Masked-language-model pretraining (App. C.3) as transformers' ``run_mlm.py`` does it: ``scripts/pretrain_mlm.py``
is the command line.

The paper's recipe (``--recipe orchid-bert-base-mlm``, the default) sets every default: C4 (``allenai/c4``, ``en``,
streamed from the Hub), the bert-base-uncased tokenizer, blocks of 128 tokens, 30% masking, decoupled AdamW with betas
(0.9, 0.98), eps 1e-6, lr 8e-4, decoupled weight decay 1e-5, linear warmup over the first 6% of the steps then linear
decay to 0.02x (M2-BERT's schedule), the implicit filters in a parameter group of their own (lr 1e-3, as in M2-BERT,
without weight decay, as in the authors' layer: M2-BERT's 0.1 under decoupled AdamW removes them), gradient clipping
1.0, 70k steps, bf16 where the hardware has it. Local text, json, parquet or csv files and a tokenizer folder replace
the Hub for offline runs. Any masked-LM model type trains with the same data and recipe (``--model_type bert``), which
is how baselines are compared.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

from .extras import require_extra

require_extra("datasets", "train")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForMaskedLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    Trainer,
    TrainingArguments,
)

from .arguments import ModelArguments, ParsedArguments, parse_recipe_arguments, recipe_dataclasses  # noqa: E402
from .data_files import DATA_BUILDERS, DataFile, check_text_columns, read_data_file  # noqa: E402
from .hub import from_pretrained, require_hub  # noqa: E402
from .metrics import load_metric  # noqa: E402
from .model_loading import build_model  # noqa: E402
from .modeling import OrchidPreTrainedModel  # noqa: E402
from .optimization import OptimizerPlan, describe_schedule, plan_for_model  # noqa: E402
from .recipes import Recipe, list_recipes  # noqa: E402
from .runs import card_base_model, finish_run, save_metrics, setup_logging, start_run, train_and_save  # noqa: E402
from .trainer import RecipeTrainer  # noqa: E402

logger = logging.getLogger(__name__)

LOCAL_DATA_HINT = (
    "Offline, pass local files instead: --train_file corpus.txt [more files] (text, one document per line, or "
    "json/jsonl/parquet/csv with a 'text' column; --text_column_name names another), optionally --validation_file, "
    "and --tokenizer_name pointing to a tokenizer folder (for example one saved by "
    "orchid_hf.tokenization.train_wordpiece_tokenizer(...).save_pretrained(folder))."
)
FILE_BUILDERS = {suffix: builder for suffix, builder in DATA_BUILDERS.items() if suffix != ".tsv"}
# A streamed validation set is cut to this many blocks unless --max_eval_samples says otherwise.
STREAMED_EVAL_BLOCKS = 2048


@dataclass
class MlmModelArguments(ModelArguments):
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Tokenizer name or folder (default: the one saved with --model_name_or_path)."}
    )


@dataclass
class MlmDataArguments:
    """What to train on."""

    dataset_name: str | None = field(default=None, metadata={"help": "Hub dataset (not used with --train_file)."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Configuration of the Hub dataset."})
    streaming: bool = field(default=False, metadata={"help": "Stream the Hub dataset instead of downloading it."})
    train_file: list[str] | None = field(
        default=None, metadata={"help": "Local training files: .txt (one document per line), .json(l), .parquet, .csv."}
    )
    validation_file: list[str] | None = field(default=None, metadata={"help": "Local validation files."})
    validation_split_percentage: float = field(
        default=5.0, metadata={"help": "Share of the local documents held out when no --validation_file is given."}
    )
    text_column_name: str | None = field(
        default=None, metadata={"help": "Column holding the text in json/parquet/csv data (default: text, else the "
                                "first column)."}
    )  # fmt: skip
    max_seq_length: int = field(default=128, metadata={"help": "Tokens per training block ([CLS] and [SEP] included)."})
    mlm_probability: float = field(default=0.15, metadata={"help": "Share of the tokens that are masked."})
    padding_free: bool = field(
        default=False,
        metadata={"help": "Orchid only: each document is a sequence of its own (cut into pieces of at most "
                          "--max_seq_length tokens), and the sequences of a batch are packed in one row with "
                          "position_ids restarting at each, as DataCollatorWithFlattening packs them, instead of "
                          "blocks cut from the stream of documents joined by [SEP]: no token is padding, and no "
                          "sequence reads another."},
    )  # fmt: skip
    max_train_samples: int | None = field(default=None, metadata={"help": "Use at most this many training blocks."})
    max_eval_samples: int | None = field(
        default=None, metadata={"help": f"Use at most this many validation blocks ({STREAMED_EVAL_BLOCKS} streamed)."}
    )
    eval_before_training: bool = field(
        default=False, metadata={"help": "Evaluate the model before the first step (reported with the prefix init_)."}
    )
    shuffle_buffer_size: int = field(default=10_000, metadata={"help": "Shuffle buffer of a streamed dataset."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Tokenize again instead of using the cache."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})


DATACLASSES = recipe_dataclasses(MlmModelArguments, MlmDataArguments)


def parse_args(argv: list[str] | None = None) -> ParsedArguments:
    """The command line with the recipe's values as defaults, checked."""
    parsed = parse_recipe_arguments(
        DATACLASSES,
        argv,
        kind="mlm",
        default_recipe="orchid-bert-base-mlm",
        description=f"Masked-LM pretraining. Recipes: {', '.join(list_recipes('mlm'))}",
    )
    check_arguments(parsed.data_args, parsed.training_args)
    return parsed


def check_arguments(data_args: MlmDataArguments, training_args: TrainingArguments) -> None:
    if not 0.0 < data_args.mlm_probability < 1.0:
        raise ValueError(f"mlm_probability must be in (0, 1), got {data_args.mlm_probability}")
    if data_args.max_seq_length < 3:
        raise ValueError(f"max_seq_length must be >= 3 ([CLS], one token, [SEP]), got {data_args.max_seq_length}")
    if not 0.0 <= data_args.validation_split_percentage < 100.0:
        raise ValueError(
            f"validation_split_percentage must be in [0, 100), got {data_args.validation_split_percentage}"
        )
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


def load_raw_datasets(args: MlmDataArguments, seed: int, cache_dir: str | None = None, token: str | None = None):
    """(train, validation) datasets of documents: local files or the Hub (streamed when --streaming)."""
    from datasets import load_dataset

    if args.train_file:
        builder = file_builder(args.train_file)
        if args.validation_file and file_builder(args.validation_file) != builder:
            raise ValueError("validation_file must have the same type as train_file")
        train = _read_documents(args.train_file, "train", args.text_column_name, cache_dir)
        if args.validation_file:
            validation = _read_documents(args.validation_file, "validation", args.text_column_name, cache_dir)
        elif args.validation_split_percentage > 0:
            split = train.train_test_split(test_size=args.validation_split_percentage / 100, seed=seed)
            train, validation = split["train"], split["test"]
        else:
            validation = None
        return train, validation

    require_hub(args.dataset_name, what="dataset", how_to_local=LOCAL_DATA_HINT)
    load = dict(streaming=args.streaming, cache_dir=cache_dir, token=token)
    train = load_dataset(args.dataset_name, args.dataset_config_name, split="train", **load)
    validation = load_dataset(args.dataset_name, args.dataset_config_name, split="validation", **load)
    if args.streaming:
        train = train.shuffle(seed=seed, buffer_size=args.shuffle_buffer_size)
    return train, validation


def _read_documents(files: list[str], role: str, column_name: str | None, cache_dir: str | None):
    """The documents of local files, one after the other; each file is checked for text on its own, so that an
    error names it."""
    from datasets import concatenate_datasets

    datasets = []
    for name in files:
        source = DataFile(name, role)
        dataset = read_data_file(source, cache_dir, suffixes=FILE_BUILDERS)
        check_text_columns(dataset, source, [text_column(dataset, column_name, source)])
        datasets.append(dataset)
    return datasets[0] if len(datasets) == 1 else concatenate_datasets(datasets)


def text_column(dataset, name: str | None, source: DataFile | str = "the data") -> str:
    """``name``, or ``text``, or the first column (run_mlm's rule)."""
    columns = list(dataset.features) if dataset.features is not None else ["text"]
    if name is not None:
        if name not in columns:
            raise ValueError(
                f"{source} has no column {name!r} (columns {columns}); name the text column with --text_column_name"
            )
        return name
    return "text" if "text" in columns else columns[0]


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


def document_splitter(tokenizer, block_size: int, text_column: str):
    """A batched ``map`` function for ``--padding_free``: each document as sequences ``[CLS] <at most block_size - 2
    tokens> [SEP]``, one after the other, of every length (nothing dropped, nothing padded)."""
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    special_ids = set(tokenizer.all_special_ids)
    content = block_size - 2

    def split(batch: dict) -> dict:
        texts = [text for text in batch[text_column] if text and text.strip()]
        pieces = [[cls_id, *ids[i : i + content], sep_id]
                  for ids in tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
                  for i in range(0, max(len(ids), 1), content)]  # fmt: skip
        return {"input_ids": pieces, "special_tokens_mask": [[int(t in special_ids) for t in p] for p in pieces]}

    return split


def pack_dataset(dataset, tokenizer, block_size: int, text_column: str, data_args: MlmDataArguments | None = None):
    """Blocks of ``block_size`` tokens from a dataset of documents (map-style or streamed); with ``--padding_free``,
    each document's own sequences (:func:`document_splitter`)."""
    from datasets import IterableDataset

    padding_free = data_args is not None and data_args.padding_free
    pack = (document_splitter if padding_free else block_packer)(tokenizer, block_size, text_column)
    if isinstance(dataset, IterableDataset):
        columns = list(dataset.features) if dataset.features is not None else [text_column]
        return dataset.map(pack, batched=True, batch_size=1000, remove_columns=columns)
    return dataset.map(
        pack,
        batched=True,
        batch_size=1000,
        remove_columns=dataset.column_names,
        num_proc=data_args.preprocessing_num_workers if data_args else None,
        load_from_cache_file=not (data_args and data_args.overwrite_cache),
        desc=f"Splitting documents into sequences of at most {block_size} tokens" if padding_free else
        f"Packing blocks of {block_size} tokens",
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


@dataclass
class PaddingFreeMLMCollator(ReproducibleMLMCollator):
    """``--padding_free``: the sequences of a batch packed in one row with position_ids restarting at each (as
    ``DataCollatorWithFlattening`` packs them), masked as :class:`ReproducibleMLMCollator` masks a batch."""

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        from transformers import DataCollatorWithFlattening

        flat = DataCollatorWithFlattening()([{"input_ids": feature["input_ids"]} for feature in features])
        special = torch.tensor([[flag for feature in features for flag in feature["special_tokens_mask"]]])
        inputs, labels = self.torch_mask_tokens(flat["input_ids"].clone(), special_tokens_mask=special)
        return {"input_ids": inputs, "position_ids": flat["position_ids"], "labels": labels}


def preprocess_logits_for_metrics(logits, labels):
    """Keep, per token, the arg-max and the cross-entropy of the label: the full (batch, length, vocab) logits of a
    whole evaluation set do not fit in memory."""
    if isinstance(logits, tuple):
        logits = logits[0]
    losses = F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100, reduction="none"
    )
    return logits.argmax(dim=-1), losses.view(labels.shape)


def masked_lm_metrics():
    """A Trainer ``compute_metrics``: masked-token accuracy and perplexity from the ``masked_lm`` metric module."""
    metric = load_metric("masked_lm")

    def compute(eval_prediction) -> dict:
        predictions, losses = eval_prediction.predictions
        labels = eval_prediction.label_ids
        scored = labels != -100
        return metric.compute(predictions=predictions[scored], references=labels[scored], losses=losses[scored])

    return compute


# ---------------------------------------------------------------------------------------------
# Model and trainer
# ---------------------------------------------------------------------------------------------


def build_mlm_model(model_args: MlmModelArguments, recipe: Recipe, data_args: MlmDataArguments, tokenizer):
    model = build_model(
        AutoModelForMaskedLM,
        model_args,
        recipe,
        how_to_local=LOCAL_DATA_HINT,
        new_model_defaults=dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id),
    )
    config = model.config
    if len(tokenizer) > config.vocab_size:
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {config.vocab_size}")
    max_positions = getattr(config, "max_position_embeddings", None)
    if max_positions is not None and data_args.max_seq_length > max_positions:
        if not (model_args.model_name_or_path and isinstance(model, OrchidPreTrainedModel)):
            raise ValueError(
                f"max_seq_length={data_args.max_seq_length} exceeds the model's max_position_embeddings={max_positions}"
            )
        # A pretrained Orchid model is extended to the longer blocks (docs/model.md, "Context extension").
        logger.info(f"extending the model's context from {max_positions} to {data_args.max_seq_length} tokens")
        model.resize_position_embeddings(data_args.max_seq_length)
    return model


@dataclass
class PretrainingRun:
    trainer: Trainer
    parsed: ParsedArguments
    training_args: TrainingArguments  # with the recipe's resolved values
    tokenizer: object
    plan: OptimizerPlan
    results: dict = field(default_factory=dict)


def build_trainer(parsed: ParsedArguments, callbacks=None) -> PretrainingRun:
    """Tokenizer, packed datasets, model, collator and Trainer for one pretraining run."""
    model_args, data_args = parsed.model_args, parsed.data_args
    # Settings derived here go to a copy, so the parsed arguments can build another run unchanged.
    training_args, plan = start_run(parsed)

    # The recipe's tokenizer is that of a new model; a checkpoint brings its own unless --tokenizer_name is given.
    tokenizer_name = model_args.tokenizer_name
    if model_args.model_name_or_path and "tokenizer_name" not in parsed.explicit:
        tokenizer_name = model_args.model_name_or_path
    if not tokenizer_name:
        raise ValueError("a new model needs a tokenizer: pass --tokenizer_name (a folder or Hub id)")
    tokenizer = from_pretrained(
        AutoTokenizer, tokenizer_name, what="tokenizer", how_to_local=LOCAL_DATA_HINT,
        cache_dir=model_args.cache_dir, token=model_args.token, trust_remote_code=model_args.trust_remote_code,
    )  # fmt: skip
    if tokenizer.mask_token is None:
        raise ValueError(f"tokenizer {tokenizer_name!r} has no mask token; masked-LM pretraining needs one")
    training_args.remove_unused_columns = False

    with training_args.main_process_first(desc="loading and packing the data"):
        seed = training_args.data_seed or training_args.seed
        train_raw, validation_raw = load_raw_datasets(data_args, seed, model_args.cache_dir, model_args.token)
        column = text_column(train_raw, data_args.text_column_name)
        train = pack_dataset(train_raw, tokenizer, data_args.max_seq_length, column, data_args)
        validation = None
        if validation_raw is not None:
            validation = pack_dataset(validation_raw, tokenizer, data_args.max_seq_length, column, data_args)
    train, validation = _limit(train, validation, data_args)
    if training_args.do_train and train is None:
        raise ValueError("--do_train needs training data")
    if training_args.do_eval and validation is None:
        raise ValueError("--do_eval needs validation data: pass --validation_file or --validation_split_percentage")

    model = build_mlm_model(model_args, parsed.recipe, data_args, tokenizer)
    plan = plan_for_model(plan, model)
    # Saved with the model: pipelines then truncate to what the model accepts (an extended checkpoint's new length,
    # not the length its tokenizer was saved with; a long model's, not a short tokenizer's).
    max_positions = getattr(model.config, "max_position_embeddings", None)
    if max_positions:
        tokenizer.model_max_length = max_positions
    if data_args.padding_free and not isinstance(model, OrchidPreTrainedModel):
        raise ValueError(
            f"--padding_free packs a batch's sequences in one row, which Orchid mixes apart; {type(model).__name__} "
            "would mix them into each other: leave it out for this model"
        )
    collator = (PaddingFreeMLMCollator if data_args.padding_free else ReproducibleMLMCollator)(
        tokenizer=tokenizer, mlm_probability=data_args.mlm_probability, mask_seed=training_args.seed
    )
    if validation is None and training_args.eval_strategy != "no":
        training_args.eval_strategy = "no"
    run = PretrainingRun(None, parsed, training_args, tokenizer, plan)
    run.trainer = RecipeTrainer(
        model=model,
        args=training_args,
        train_dataset=train if training_args.do_train else None,
        eval_dataset=validation,
        data_collator=collator,
        processing_class=tokenizer,
        compute_metrics=masked_lm_metrics(),
        preprocess_logits_for_metrics=preprocess_logits_for_metrics,
        callbacks=callbacks,
        optimizer_plan=plan,
        card_writer=lambda: _write_card(run),
    )
    return run


def _limit(train, validation, args: MlmDataArguments):
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
        count = args.max_eval_samples or STREAMED_EVAL_BLOCKS
        validation = Dataset.from_list(list(islice(iter(validation), count)))
    elif validation is not None and args.max_eval_samples is not None:
        validation = validation.select(range(min(args.max_eval_samples, len(validation))))
    if validation is not None and len(validation) == 0:
        validation = None
    return train, validation


def main(argv: list[str] | None = None) -> dict:
    """Pretrain and evaluate as the command line says; returns the metrics (``init`` with
    --eval_before_training, ``train``, ``eval``) as written to ``results.json``."""
    parsed = parse_args(argv)
    setup_logging(parsed.training_args)
    run = build_trainer(parsed)
    trainer, training_args, data_args = run.trainer, run.training_args, parsed.data_args
    results = run.results
    results.update(
        recipe=parsed.recipe.name,
        model_type=trainer.model.config.model_type,
        initialized_from=parsed.model_args.model_name_or_path or f"new {trainer.model.config.model_type} model",
        max_seq_length=data_args.max_seq_length,
        num_parameters=sum(p.numel() for p in trainer.model.parameters()),
        learning_rate=training_args.learning_rate,
        optimizer=run.plan.describe(),
        world_size=training_args.world_size,
    )
    if data_args.eval_before_training and trainer.eval_dataset is not None:
        results["init"] = trainer.evaluate(metric_key_prefix="init")
    if training_args.do_train:
        num_samples = len(trainer.train_dataset) if hasattr(trainer.train_dataset, "__len__") else None
        _, results["train"] = train_and_save(trainer, num_samples)
    if training_args.do_eval and trainer.eval_dataset is not None:
        # The last step may have just been evaluated; do not pay for the same evaluation twice.
        step = trainer.state.global_step
        done = [e for e in trainer.state.log_history if "eval_loss" in e and e.get("step") == step and step > 0]
        metrics = dict(done[-1]) if done else trainer.evaluate()
        metrics = {k: v for k, v in metrics.items() if k.startswith("eval_") or k == "epoch"}
        metrics["eval_samples"] = len(trainer.eval_dataset)
        save_metrics(trainer, "eval", metrics)
        results["eval"] = metrics
    finish_run(trainer, results, "Masked-LM pretraining")
    return results


def _write_card(run: PretrainingRun) -> None:
    from .cards import write_model_card

    model_args, data_args = run.parsed.model_args, run.parsed.data_args
    args, results = run.training_args, run.results
    dataset_name = data_args.dataset_name if not data_args.train_file else "local corpus"
    eval_results = []
    names = {"masked_accuracy": "masked-token accuracy", "perplexity": "perplexity", "loss": "MLM loss"}
    for metric, name in names.items():
        value = results.get("eval", {}).get(f"eval_{metric}")
        if value is not None:
            eval_results.append(
                dict(
                    task_type="fill-mask",
                    dataset_type=dataset_name,
                    dataset_name=dataset_name,
                    dataset_config=data_args.dataset_config_name if not data_args.train_file else None,
                    dataset_split="validation",
                    metric_type="accuracy" if metric == "masked_accuracy" else metric,
                    metric_name=name,
                    metric_value=round(float(value), 4),
                )
            )
    repo_id = args.hub_model_id if args.push_to_hub else None
    write_model_card(
        args.output_dir,
        task="fill-mask",
        model_name=repo_id or Path(args.output_dir).name,
        repo_id=repo_id,
        datasets=[data_args.dataset_name] if not data_args.train_file else [],
        results=eval_results,
        base_model=card_base_model(model_args.model_name_or_path),
        example_input=f'"the capital of france is {run.tokenizer.mask_token} ."',
        training={
            "recipe": results.get("recipe"),
            "objective": f"masked language modelling, {data_args.mlm_probability:.0%} of the tokens masked",
            "sequence length": data_args.max_seq_length,
            "optimizer": f"AdamW, betas ({args.adam_beta1}, {args.adam_beta2}), eps {args.adam_epsilon}",
            "learning rate": describe_schedule(args),
            **run.plan.describe(),
            "steps": args.max_steps if args.max_steps > 0 else f"{args.num_train_epochs} epochs",
            "batch size": args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size,
            "gradient clipping": args.max_grad_norm,
            "precision": "bf16" if args.bf16 else "fp32",
        },
    )


__all__ = [
    "DATACLASSES",
    "MlmDataArguments",
    "MlmModelArguments",
    "PretrainingRun",
    "PaddingFreeMLMCollator",
    "ReproducibleMLMCollator",
    "block_packer",
    "document_splitter",
    "build_trainer",
    "main",
    "masked_lm_metrics",
    "pack_dataset",
    "parse_args",
    "preprocess_logits_for_metrics",
]
