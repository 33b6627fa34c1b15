"""The diagnosis runs: pretraining, probes, operator measurements and fine-tuning of small Orchid and BERT models on
the novels, each writing one JSON file; and the table of results. Entry point: scripts/transfer_diagnosis.py."""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.harness import provenance, write_json
from experiments.transfer import measures
from experiments.transfer.data import load_corpus, load_tensors, subset
from experiments.transfer.models import (
    build_classifier,
    build_mlm_model,
    finetune,
    init_pooler_from_mlm,
    masked_lm_accuracy,
    pooled_features,
    pooler_dense,
    pretrain,
)

# The small models: the real-data comparison's shape (hidden 256, 4 layers, positions 512, passages of 128) at half
# the width, half the depth and half the lengths, so that a passage fills a quarter of Orchid's transform as there.
SIZE = dict(hidden=128, layers=2, intermediate=512, max_positions=256)
PASSAGE_TOKENS = 64
BLOCK_TOKENS = 64
# Passages per split for probes and fine-tuning (fixed subsets, the same for every model), to keep each run to
# minutes on one thread.
PROBE_TRAIN, PROBE_TEST = 3000, 1500
FINETUNE_TRAIN, FINETUNE_EVAL = 2000, 1000


def model_name(arch: str, steps: int, seed: int, dropout: float = 0.1, pre_norm: bool = False) -> str:
    """``orchid-random-s0``, ``bert-pt300-s0``, ``orchid-pt300-dropout0-prenorm-s1``, ..."""
    name = f"{arch}-{'random' if steps == 0 else f'pt{steps}'}"
    if dropout != 0.1:
        name += f"-dropout{dropout:g}"
    if pre_norm:
        name += "-prenorm"
    return f"{name}-s{seed}"


def parse_name(name: str) -> dict:
    parts = name.split("-")
    spec = {"arch": parts[0], "steps": 0 if parts[1] == "random" else int(parts[1][2:]), "seed": int(parts[-1][1:]),
            "dropout": 0.1, "pre_norm": False}
    for part in parts[2:-1]:
        if part.startswith("dropout"):
            spec["dropout"] = float(part[7:])
        elif part == "prenorm":
            spec["pre_norm"] = True
    return spec


def write_result(results_dir: str | Path, name: str, result: dict) -> Path:
    """A result as ``NAME.json`` in ``results_dir``, with the commit and the machine it was measured on."""
    return write_json(Path(results_dir) / f"{name}.json", {**result, **provenance(torch.get_num_threads())})


class Workspace:
    """The diagnosis's corpus (cached under the work folder), its tokenizer, and where its results go."""

    def __init__(self, data_dir: str, vocab_dir: str, work_dir: str, results_dir: str):
        self.work = Path(work_dir)
        self.results = Path(results_dir)
        self.results.mkdir(parents=True, exist_ok=True)
        self.vocab_dir = vocab_dir
        self.corpus = load_corpus(data_dir, vocab_dir, self.work / f"corpus-{PASSAGE_TOKENS}.pt", PASSAGE_TOKENS,
                                  BLOCK_TOKENS)

    @functools.cached_property
    def tokenizer(self):
        """The corpus's tokenizer (bert-base-uncased's vocabulary), which the masking reads its special tokens from."""
        from transformers import BertTokenizer

        return BertTokenizer.from_pretrained(str(self.vocab_dir), do_lower_case=True)

    def write(self, name: str, result: dict) -> Path:
        return write_result(self.results, name, result)

    def mlm_model(self, name: str, batch_size: int = 32):
        """The named masked-LM model: built (random) or pretrained and cached under the work folder."""
        spec = parse_name(name)
        model = build_mlm_model(spec["arch"], dropout=spec["dropout"], pre_norm=spec["pre_norm"], seed=spec["seed"],
                                **SIZE)
        if spec["steps"] == 0:
            return model.eval()
        path = self.work / "models" / f"{name}.pt"
        if path.exists():
            model.load_state_dict(load_tensors(path))
            return model.eval()
        torch.manual_seed(spec["seed"])
        log = pretrain(model, self.corpus["mlm"], self.tokenizer, spec["steps"], batch_size=batch_size,
                       seed=spec["seed"])
        test = self.corpus["test"]
        log["held_out_masked_lm"] = masked_lm_accuracy(model, test["input_ids"][:1024], test["attention_mask"][:1024],
                                                       self.tokenizer)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), path)
        self.write(f"pretrain-{name}", {"model": name, "size": SIZE, "block_tokens": BLOCK_TOKENS,
                                        "batch_size": batch_size, **log})
        return model.eval()


def run_probe(ws: Workspace, name: str) -> dict:
    """Logistic regression on frozen first-token and mean features of every layer; hidden-state norms."""
    encoder = ws.mlm_model(name).base_model
    train_split, test_split = subset(ws.corpus["train"], PROBE_TRAIN), subset(ws.corpus["test"], PROBE_TEST)
    train = measures.layer_features(encoder, train_split)
    test = measures.layer_features(encoder, test_split)
    y_train, y_test = train_split["labels"].numpy(), test_split["labels"].numpy()
    result = {"model": name, "layers": {}}
    for pooling in ("first", "mean"):
        result["layers"][pooling] = [
            measures.probe_accuracy(train[pooling][i], y_train, test[pooling][i], y_test)
            for i in range(len(train[pooling]))
        ]
    result["participation_ratio"] = {
        pooling: [measures.participation_ratio(layer) for layer in test[pooling]] for pooling in ("first", "mean")
    }
    result["token_norm"] = test["norm"].tolist()
    result["first_token_norm"] = test["first_norm"].tolist()
    ws.write(f"probe-{name}", result)
    return result


def run_bag_of_words(ws: Workspace) -> dict:
    train, test = subset(ws.corpus["train"], PROBE_TRAIN), subset(ws.corpus["test"], PROBE_TEST)
    result = {"test_accuracy": measures.bag_of_words_accuracy(train, test),
              "test_accuracy_all_passages": measures.bag_of_words_accuracy(ws.corpus["train"], ws.corpus["test"]),
              "majority_class": float(np.bincount(ws.corpus["test"]["labels"].numpy()).max()
                                      / len(ws.corpus["test"]["labels"]))}
    ws.write("bag-of-words", result)
    return result


def run_operator(ws: Workspace, name: str, examples: int = 64) -> dict:
    """Orchid's kernels and conditioning scale per layer (Orchid models only), and for either architecture the
    pooler's saturation at the start of fine-tuning, first-token and mean pooling (the head's seed 0)."""
    mlm = ws.mlm_model(name)
    test = ws.corpus["test"]
    ids, mask = test["input_ids"][:examples], test["attention_mask"][:examples]
    result = {"model": name}
    if parse_name(name)["arch"] == "orchid":
        result["layers"] = measures.orchid_operator_stats(mlm.base_model, ids, mask)
    for pooling in ("first", "mean"):
        torch.manual_seed(0)
        classifier = build_classifier(mlm, len(ws.corpus["names"]), pooling)
        pooled = pooled_features(classifier, ids, mask)
        result[f"pooler_{pooling}"] = measures.pooler_saturation(pooled, pooler_dense(classifier))
        init_pooler_from_mlm(classifier, mlm)
        result[f"pooler_{pooling}_mlm_init"] = measures.pooler_saturation(pooled, pooler_dense(classifier))
    ws.write(f"operator-{name}", result)
    return result


def filter_record(folder: str) -> dict:
    """The RMS of every implicit filter's kernel h0 in a saved Orchid model (a folder of ``save_pretrained``, e.g. the
    real-data comparison's pretrained model) against the same configuration at its initialisation (seed 0), and of
    its skip term D: whether pretraining kept the static and residual long convolutions."""
    from transformers import AutoConfig, AutoModelForMaskedLM

    import orchid_hf  # noqa: F401  (registers the model type)

    model = AutoModelForMaskedLM.from_pretrained(folder)
    torch.manual_seed(0)
    initial = measures.implicit_kernel_rms(AutoModelForMaskedLM.from_config(AutoConfig.from_pretrained(folder)))
    skips = {name: float(module.skip.detach().pow(2).mean().sqrt()) for name, module in model.named_modules()
             if name in initial}  # fmt: skip
    filters = {name.split("layer.")[-1]: {"initial_h0_rms": initial[name], "saved_h0_rms": rms,
                                          "saved_skip_rms": skips[name]}
               for name, rms in measures.implicit_kernel_rms(model).items()}  # fmt: skip
    return {"model": Path(folder).name, "folder": str(folder), "filters": filters}


def filter_table(records: list[dict]) -> str:
    """A markdown table of :func:`filter_record`'s records, one row per implicit filter."""
    lines = ["| model | filter | h0 RMS at initialisation | h0 RMS saved | skip term D RMS saved |",
             "|---|---|---|---|---|"]  # fmt: skip
    for record in records:
        for name, rms in record["filters"].items():
            lines.append(f"| {record['model']} | {name} | {rms['initial_h0_rms']:.2e} | {rms['saved_h0_rms']:.2e} | "
                         f"{rms['saved_skip_rms']:.2f} |")  # fmt: skip
    return "\n".join(lines)


def run_finetune(ws: Workspace, name: str, epochs: int, lr: float, pooling: str = "first", seed: int = 0,
                 pooler_init: str = "random") -> dict:
    tag = f"finetune-{name}-{pooling}-{pooler_init}-e{epochs}-lr{lr:g}-ft{seed}"
    path = ws.results / f"{tag}.json"
    if path.exists():
        return json.loads(path.read_text())
    mlm = ws.mlm_model(name)
    torch.manual_seed(1000 + seed)
    model = build_classifier(mlm, len(ws.corpus["names"]), pooling)
    if pooler_init == "mlm":
        init_pooler_from_mlm(model, mlm)
    started = time.time()
    evaluate = {"validation": subset(ws.corpus["validation"], FINETUNE_EVAL),
                "test": subset(ws.corpus["test"], FINETUNE_EVAL)}
    log = finetune(model, subset(ws.corpus["train"], FINETUNE_TRAIN), evaluate, epochs, lr, seed=seed)
    result = {"model": name, "pooling": pooling, "pooler_init": pooler_init, "epochs": epochs, "lr": lr,
              "seed": seed, "wall_seconds": time.time() - started, **log}
    ws.write(tag, result)
    return result
