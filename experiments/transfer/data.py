"""The novels split by chapter three ways: test chapters (one in five, as the real-data comparison), and the rest
split into training and validation chapters; masked-LM blocks from the training and validation chapters only;
attribution passages of every split."""

from __future__ import annotations

import pickle
from pathlib import Path

import torch

from experiments.real_data.novels import SPLITS, chapter_passages, chapter_split, novel_name, read_novel
from orchid_hf.pretraining import block_packer


def build_corpus(novels: list[str | Path], tokenizer, passage_tokens: int, block_tokens: int) -> dict:
    """Tokenized data: ``mlm`` (blocks of ``block_tokens`` from the non-test chapters, packed as the pretraining
    recipe packs them), and for each split ``input_ids``/``attention_mask`` (passages padded to ``passage_tokens``)
    and ``labels`` (the novel's index in ``names``)."""
    names = [novel_name(p) for p in sorted(novels)]
    passages = {split: ([], []) for split in SPLITS}
    paragraphs = []
    for label, path in enumerate(sorted(novels)):
        for index, chapter in enumerate(read_novel(path)):
            split = chapter_split(index)
            texts = chapter_passages(chapter, tokenizer, passage_tokens)
            passages[split][0].extend(texts)
            passages[split][1].extend([label] * len(texts))
            if split != "test":
                paragraphs.extend(chapter)
    corpus = {"names": names, "passage_tokens": passage_tokens}
    blocks = block_packer(tokenizer, block_tokens, "text")({"text": paragraphs})["input_ids"]
    corpus["mlm"] = torch.tensor(blocks, dtype=torch.long)
    for split, (texts, labels) in passages.items():
        encoded = tokenizer(
            texts, padding="max_length", max_length=passage_tokens, truncation=True, return_tensors="pt"
        )
        corpus[split] = {
            "input_ids": encoded["input_ids"],
            "attention_mask": encoded["attention_mask"],
            "labels": torch.tensor(labels, dtype=torch.long),
            "texts": texts,
        }
    return corpus


def load_corpus(data_dir: str | Path, vocab_dir: str | Path, cache: str | Path, passage_tokens: int = 64,
                block_tokens: int = 64) -> dict:
    """:func:`build_corpus` of ``data_dir/*.txt``, cached in ``cache``."""
    cache = Path(cache)
    if cache.exists():
        return load_tensors(cache)
    from transformers import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(str(vocab_dir), do_lower_case=True)
    corpus = build_corpus(sorted(Path(data_dir).glob("*.txt")), tokenizer, passage_tokens, block_tokens)
    cache.parent.mkdir(parents=True, exist_ok=True)
    torch.save(corpus, cache)
    return corpus


def load_tensors(path: str | Path):
    """What ``torch.save`` wrote to ``path`` (the corpus cache, a model's state dict), read with
    ``weights_only=True``: tensors, numbers, strings, lists and dicts only, since unpickling anything else can run
    code. A file that holds more is refused with a ValueError naming it."""
    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as error:
        raise ValueError(
            f"{path} holds more than tensors, numbers and strings, so it was not written by this code and is not "
            f"loaded (unpickling it could run code); delete it to build it again ({error})"
        ) from None


def subset(split: dict, count: int | None, seed: int = 0) -> dict:
    """``count`` passages of a split drawn without replacement by a fixed permutation (all of them for None), so
    that every model is measured on the same passages."""
    total = len(split["labels"])
    if count is None or count >= total:
        return split
    index = torch.randperm(total, generator=torch.Generator().manual_seed(seed))[:count].sort().values
    return {key: ([value[i] for i in index] if isinstance(value, list) else value[index])
            for key, value in split.items()}
