"""Sentence embeddings on real text: a passage's chapter among all chapters of a held-out novel.

An embedding model (Orchid, or BERT of the same size) is trained contrastively on novels in Project Gutenberg's
layout (``experiments/real_data/novels.py`` splits them into chapters): the anchor is a passage of a chapter, its
positive a longer span of other passages of the same chapter, and the other positives of the batch are the negatives
(MultipleNegativesRankingLoss). On the held-out novel, every chapter is embedded whole (or truncated to a length),
and each query passage should find its own chapter: recall@1 and MRR through sentence-transformers'
InformationRetrievalEvaluator. ``scripts/sentence_embeddings.py`` is the command line; docs/results/
sentence_embeddings.md the results on Jane Austen's novels.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import torch

from benchmarks.harness import provenance, write_json
from experiments.real_data.novels import chapter_passages, novel_name, read_novel

MODEL_KINDS = ("orchid", "bert")


def chapter_pairs(
    chapters: list[list[str]],
    tokenizer,
    anchor_tokens: int = 128,
    positive_passages: int = 4,
    pairs_per_chapter: int = 4,
    seed: int = 0,
) -> list[tuple[str, str]]:
    """(anchor, positive) pairs: the anchor a passage of ``anchor_tokens`` tokens, the positive ``positive_passages``
    consecutive passages of the same chapter that do not contain the anchor (so that matching needs more than the
    anchor's own words). Chapters with fewer than ``positive_passages + 1`` passages give no pair. The pairs of a
    chapter are spread over the list, so that a batch rarely holds two pairs of one chapter (whose positives would
    be false negatives)."""
    if positive_passages < 1 or pairs_per_chapter < 1:
        raise ValueError(
            f"positive_passages and pairs_per_chapter must be >= 1, got {positive_passages} and {pairs_per_chapter}"
        )
    rng = random.Random(seed)
    rounds: list[list[tuple[str, str]]] = [[] for _ in range(pairs_per_chapter)]
    for chapter in chapters:
        passages = chapter_passages(chapter, tokenizer, anchor_tokens)
        if len(passages) < positive_passages + 1:
            continue
        anchors = rng.sample(range(len(passages)), min(pairs_per_chapter, len(passages)))
        for round_, anchor in zip(rounds, anchors):
            # The span after the anchor where it fits, else the one before it; else one that skips the anchor.
            if anchor + positive_passages < len(passages):
                span = range(anchor + 1, anchor + 1 + positive_passages)
            elif anchor >= positive_passages:
                span = range(anchor - positive_passages, anchor)
            else:
                others = [i for i in range(len(passages)) if i != anchor]
                span = others[:positive_passages]
            round_.append((passages[anchor], " ".join(passages[i] for i in span)))
    pairs = []
    for round_ in rounds:
        rng.shuffle(round_)
        pairs += round_
    return pairs


def retrieval_task(
    chapters: list[list[str]], tokenizer, query_tokens: int = 128, queries_per_chapter: int = 8
) -> tuple[dict[str, str], dict[str, str], dict[str, set[str]]]:
    """Queries (passages of ``query_tokens`` tokens, at most ``queries_per_chapter`` per chapter, evenly spread),
    the corpus (every chapter whole, its paragraphs joined) and each query's relevant chapter, as
    InformationRetrievalEvaluator takes them."""
    if queries_per_chapter < 1:
        raise ValueError(f"queries_per_chapter must be >= 1, got {queries_per_chapter}")
    queries, corpus, relevant = {}, {}, {}
    for index, chapter in enumerate(chapters):
        chapter_id = f"chapter-{index + 1}"
        corpus[chapter_id] = " ".join(chapter)
        passages = chapter_passages(chapter, tokenizer, query_tokens)
        step = max(1, len(passages) // queries_per_chapter)
        for number, passage in enumerate(passages[::step][:queries_per_chapter]):
            query_id = f"{chapter_id}-passage-{number + 1}"
            queries[query_id] = passage
            relevant[query_id] = {chapter_id}
    if not queries:
        raise ValueError(f"no chapter has a passage of {query_tokens} tokens")
    return queries, corpus, relevant


def build_model(kind: str, tokenizer, folder: str | Path, max_length: int, **sizes):
    """A SentenceTransformer with mean pooling over a new Orchid or BERT encoder with the same width, depth, MLP size
    and positions (``sizes``: hidden_size, num_hidden_layers, intermediate_size; BERT also num_attention_heads)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling
    from transformers import BertConfig, BertModel

    from orchid_hf import OrchidConfig, OrchidModel
    from orchid_hf.embeddings import sentence_transformer

    if kind not in MODEL_KINDS:
        raise ValueError(f"kind must be one of {MODEL_KINDS}, got {kind!r}")
    common = dict(vocab_size=len(tokenizer), max_position_embeddings=max_length, pad_token_id=tokenizer.pad_token_id)
    if kind == "orchid":
        orchid_sizes = {key: value for key, value in sizes.items() if key != "num_attention_heads"}
        return sentence_transformer(OrchidModel(OrchidConfig(**common, **orchid_sizes)), tokenizer)
    BertModel(BertConfig(**common, **sizes)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    transformer = Transformer(str(folder), max_seq_length=max_length)
    return SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean")])


def train(model, pairs: list[tuple[str, str]], output_dir: str | Path, steps: int, batch_size: int,
          learning_rate: float, seed: int = 0) -> dict:  # fmt: skip
    """``steps`` steps of SentenceTransformerTrainer with MultipleNegativesRankingLoss; the losses and the time."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.base.sampler import BatchSamplers
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    data = Dataset.from_dict({"anchor": [a for a, _ in pairs], "positive": [p for _, p in pairs]})
    args = SentenceTransformerTrainingArguments(
        output_dir=str(output_dir),
        max_steps=steps,
        per_device_train_batch_size=batch_size,
        learning_rate=learning_rate,
        warmup_steps=max(1, steps // 10),
        batch_sampler=BatchSamplers.NO_DUPLICATES,
        logging_steps=max(1, steps // 20),
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=seed,
        disable_tqdm=True,
    )
    trainer = SentenceTransformerTrainer(
        model=model, args=args, train_dataset=data, loss=MultipleNegativesRankingLoss(model)
    )
    wall, cpu = time.perf_counter(), time.process_time()
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return {
        "steps": steps,
        "losses": losses,
        "train_wall_seconds": time.perf_counter() - wall,
        "train_cpu_seconds": time.process_time() - cpu,
    }


def evaluate(model, queries, corpus, relevant, max_seq_length: int, name: str, batch_size: int = 8) -> dict:
    """Recall@1 and MRR (over all chapters) of the query passages' chapters, the chapters truncated to
    ``max_seq_length`` tokens; with the time the evaluation took. A length whose activations do not fit in memory
    gives ``{"error": ...}``."""
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator

    model.max_seq_length = max_seq_length
    evaluator = InformationRetrievalEvaluator(
        queries,
        corpus,
        relevant,
        name=name,
        accuracy_at_k=[1, 5],
        precision_recall_at_k=[1, 5],
        mrr_at_k=[len(corpus)],
        ndcg_at_k=[10],
        map_at_k=[10],
        batch_size=batch_size,
        show_progress_bar=False,
    )
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        with torch.no_grad():
            scores = evaluator(model)
    except (RuntimeError, MemoryError) as error:  # out of memory at this length
        return {"max_seq_length": max_seq_length, "error": str(error).splitlines()[0][:200]}
    prefix = f"{name}_cosine_"
    return {
        "max_seq_length": max_seq_length,
        "recall@1": scores[prefix + "recall@1"],
        "recall@5": scores[prefix + "recall@5"],
        f"mrr@{len(corpus)}": scores[prefix + f"mrr@{len(corpus)}"],
        "eval_wall_seconds": time.perf_counter() - wall,
        "eval_cpu_seconds": time.process_time() - cpu,
    }


def longest_chapter(chapters: list[list[str]], tokenizer) -> int:
    """The token count of the longest chapter with [CLS] and [SEP]."""
    return max(len(tokenizer.tokenize(" ".join(chapter))) + 2 for chapter in chapters)


def run(
    kind: str,
    novels: list[str | Path],
    held_out: str,
    tokenizer,
    output_dir: str | Path,
    *,
    hidden_size: int = 128,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 2,
    steps: int = 200,
    batch_size: int = 32,
    learning_rate: float = 1e-3,
    anchor_tokens: int = 128,
    positive_passages: int = 4,
    pairs_per_chapter: int = 4,
    queries_per_chapter: int = 8,
    truncated_length: int = 512,
    seed: int = 0,
) -> dict:
    """Train one model on every novel but ``held_out`` and evaluate it on ``held_out``: the chapters whole and
    truncated to ``truncated_length`` tokens. Writes and returns ``results.json``."""
    names = [novel_name(path) for path in novels]
    if held_out not in names:
        raise ValueError(f"held_out={held_out!r} is not one of the novels {names}")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    chapters = {novel_name(path): read_novel(path) for path in novels}
    training_chapters = [chapter for name in names if name != held_out for chapter in chapters[name]]
    pairs = chapter_pairs(training_chapters, tokenizer, anchor_tokens, positive_passages, pairs_per_chapter, seed)
    queries, corpus, relevant = retrieval_task(chapters[held_out], tokenizer, anchor_tokens, queries_per_chapter)
    # Positions for the held-out novel's longest chapter, for both models (rounded up to a multiple of 128).
    full_length = -(-longest_chapter(chapters[held_out], tokenizer) // 128) * 128
    training_length = anchor_tokens * positive_passages
    if full_length < truncated_length or truncated_length < training_length:
        raise ValueError(
            f"truncated_length={truncated_length} must lie between the training length {training_length} and the "
            f"longest chapter ({full_length} tokens)"
        )

    torch.manual_seed(seed)
    sizes = dict(hidden_size=hidden_size, num_hidden_layers=num_hidden_layers, intermediate_size=4 * hidden_size)
    if kind == "bert":
        sizes["num_attention_heads"] = num_attention_heads
    model = build_model(kind, tokenizer, output_dir / "initial", full_length, **sizes)
    parameters = sum(p.numel() for p in model.parameters())
    model.max_seq_length = training_length
    training = train(model, pairs, output_dir / "trainer", steps, batch_size, learning_rate, seed)
    evaluations = [
        evaluate(model, queries, corpus, relevant, length, f"{held_out}-{length}")
        for length in (truncated_length, full_length)
    ]
    results = {
        "model": kind,
        "parameters": parameters,
        "sizes": sizes,
        "held_out": held_out,
        "training_novels": [name for name in names if name != held_out],
        "pairs": len(pairs),
        "batch_size": batch_size,
        "learning_rate": learning_rate,
        "anchor_tokens": anchor_tokens,
        "training_length": training_length,
        "queries": len(queries),
        "chapters": len(corpus),
        "threads": torch.get_num_threads(),
        **training,
        "evaluations": evaluations,
        **provenance(),
    }
    write_json(output_dir / "results.json", results)
    return results


def report(results: list[dict], command: str) -> str:
    """The Markdown table of several runs' ``results.json``."""
    lines = [
        "| model | parameters | chapters embedded at | recall@1 | recall@5 | MRR | train (CPU s / wall s) | "
        "evaluation (CPU s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        for evaluation in result["evaluations"]:
            mrr = next((value for key, value in evaluation.items() if key.startswith("mrr@")), None)
            train_time = f"{result['train_cpu_seconds']:.0f} / {result['train_wall_seconds']:.0f}"
            if "error" in evaluation:
                cells = ["did not fit: " + evaluation["error"], "", "", "", ""]
            else:
                cells = [f"{evaluation['recall@1']:.3f}", f"{evaluation['recall@5']:.3f}", f"{mrr:.3f}", train_time,
                         f"{evaluation['eval_cpu_seconds']:.0f}"]  # fmt: skip
            lines.append(
                f"| {result['model']} | {result['parameters'] / 1e6:.2f}M | {evaluation['max_seq_length']} tokens | "
                + " | ".join(cells)
                + " |"
            )
    return "\n".join(lines) + f"\n\nCommand: `{command}`\n"


__all__ = ["MODEL_KINDS", "build_model", "chapter_pairs", "evaluate", "longest_chapter", "report", "retrieval_task",
           "run", "train"]  # fmt: skip
