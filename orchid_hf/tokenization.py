"""Train a BERT-style WordPiece tokenizer on local text, for offline runs (the demo, the tests)."""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def train_wordpiece_tokenizer(
    texts: Iterable[str], vocab_size: int = 1000, model_max_length: int | None = None
) -> PreTrainedTokenizerFast:
    """A lower-casing WordPiece tokenizer with BERT's special tokens and ``[CLS] a [SEP] b [SEP]`` templates.

    ``[PAD]`` gets id 0, matching ``OrchidConfig.pad_token_id``'s default. ``model_max_length`` (the model's
    ``max_position_embeddings``) lets pipelines and ``truncation=True`` cut long inputs to what the model takes.
    """
    if vocab_size < len(SPECIAL_TOKENS) + 1:
        raise ValueError(f"vocab_size must be > {len(SPECIAL_TOKENS)}, got {vocab_size}")
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    limit = {} if model_max_length is None else {"model_max_length": model_max_length}
    return PreTrainedTokenizerFast(
        **limit,
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )
