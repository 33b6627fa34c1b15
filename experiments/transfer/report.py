"""Tables of the diagnosis's JSON results (docs/results/transfer/*.json), in Markdown."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.harness import table_lines


def _load(results: Path, prefix: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(results.glob(f"{prefix}-*.json"))]


def _pct(value: float) -> str:
    return f"{100 * value:.1f}"


def pretraining_table(results: Path) -> list[str]:
    if not _load(results, "pretrain"):
        return []
    rows = ["| model | steps x batch x tokens | final training loss | held-out masked-token accuracy | minutes |",
            "|---|---|---|---|---|"]
    for run in _load(results, "pretrain"):
        steps = run["curve"][-1]["step"]
        rows.append(f"| {run['model']} | {steps} x {run['batch_size']} x {run['block_tokens']} | "
                    f"{run['curve'][-1]['loss']:.3f} | {_pct(run['held_out_masked_lm']['accuracy'])}% | "
                    f"{run['train_seconds'] / 60:.1f} |")
    return rows


def probe_table(results: Path) -> list[str]:
    runs = _load(results, "probe")
    if not runs:
        return []
    layers = len(runs[0]["token_norm"])
    names = ["embeddings"] + [f"layer {i}" for i in range(1, layers)]
    rows = ["| model | pooling | " + " | ".join(names) + " |", "|---|---|" + "---|" * layers]
    for run in runs:
        for pooling, accuracies in run["layers"].items():
            rows.append(f"| {run['model']} | {pooling} | " + " | ".join(_pct(a) for a in accuracies) + " |")
    rows += ["", "| model | mean token norm per layer | position-0 norm per layer | participation ratio of "
             "first-token / mean features per layer |", "|---|---|---|---|"]
    for run in runs:
        ratios = run.get("participation_ratio", {})
        ratio = "; ".join(" / ".join(f"{v:.1f}" for v in ratios.get(p, [])) for p in ("first", "mean"))
        rows.append(f"| {run['model']} | {' / '.join(f'{v:.1f}' for v in run['token_norm'])} | "
                    f"{' / '.join(f'{v:.1f}' for v in run['first_token_norm'])} | {ratio} |")
    return rows


def _kernel(entry: dict, name: str) -> str:
    k = entry.get(name)
    return "-" if k is None else f"{k['median_width_90']:.0f}, {_pct(k['energy_within_1'])}%"


# How an operator run measured the kernels (the key of its static kernel's RMS tells): what position 0 reads through
# the multipliers in the transform domain, or through what the operator's modules return (measures.py).
KERNEL_MEASURES = {
    "static_multiplier_rms": ("static multiplier", "position 0's row of each long convolution C^T diag(M) C, M the "
                              "multiplier: static dct(h0) + skip, data-dependent that plus the conditioning's output"),
    "static_kernel_rms": ("static kernel h0", "the kernels the operator's modules return: the static and residual "
                          "kernels h0 over the lags, and row 0 of the convolution with the conditioning network's "
                          "spectrum alone"),
}  # fmt: skip


def operator_table(results: Path) -> list[str]:
    runs = _load(results, "operator")
    if not runs:
        return []
    rows = []
    for key, (static_name, measured) in KERNEL_MEASURES.items():
        measured_runs = [run for run in runs if any(key in entry for entry in run.get("layers", []))]
        if not measured_runs:
            continue
        cells = []
        for run in measured_runs:
            for entry in run["layers"]:
                conditioning = entry.get("conditioning_rms", float("nan"))
                ratio = conditioning / entry[key]
                cells.append([run["model"], entry["layer"], _kernel(entry, "static"), _kernel(entry, "data_dependent"),
                              _kernel(entry, "residual"), f"{conditioning:.2f} / {entry[key]:.2f} = {ratio:.2f}",
                              f"{entry['mixer_output_rms']:.2f} / {entry['mixer_input_rms']:.2f}"])
        header = ["model", "layer", "static kernel: width (90%), energy at lag 0",
                  "data-dependent: width, energy at lag 0", "residual conv: width, energy at lag 0",
                  f"conditioning RMS / {static_name} RMS", "mixer out / in RMS"]
        rows += [f"Kernels measured on {measured}:", "", *table_lines(header, cells), ""]
    cells = []
    for run in runs:
        for pooling in ("first", "mean"):
            for init, key in (("random", f"pooler_{pooling}"), ("MLM transform", f"pooler_{pooling}_mlm_init")):
                p = run[key]
                cells.append([run["model"], pooling, init, f"{p['pooled_feature_rms']:.2f}",
                              f"{p['tanh_input_rms']:.3f}", f"{_pct(p['saturated_fraction'])}%"])
    header = ["model", "pooling", "pooler init", "pooled feature RMS", "tanh input RMS", "saturated (abs tanh > 0.95)"]
    return rows + table_lines(header, cells)


def finetune_table(results: Path) -> list[str]:
    runs = _load(results, "finetune")
    if not runs:
        return []
    rows = ["| model | pooling | pooler init | epochs | lr | seed | validation % | test % | "
            "first-step gradient norm: embeddings / layers / head | minutes |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        grads = run["first_step_gradient_norms"]
        layers = " / ".join(f"{grads[k][0]:.3f}" for k in sorted(grads) if k.startswith("layer"))
        rows.append(f"| {run['model']} | {run['pooling']} | {run['pooler_init']} | {run['epochs']} | {run['lr']:g} | "
                    f"{run['seed']} | {_pct(run['final']['validation'])} | {_pct(run['final']['test'])} | "
                    f"{grads['embeddings'][0]:.3f} / {layers} / {grads['head'][0]:.3f} | "
                    f"{run['train_seconds'] / 60:.1f} |")
    best: dict[tuple, dict] = {}
    for run in runs:
        key = (run["model"], run["pooling"], run["pooler_init"])
        grid = [r for r in runs if (r["model"], r["pooling"], r["pooler_init"]) == key]
        if len(grid) > 1 and key not in best:
            best[key] = max(grid, key=lambda r: r["final"]["validation"])
    if best:
        rows += ["", "| model | pooling | pooler init | chosen on validation | validation % | test % |",
                 "|---|---|---|---|---|---|"]
        for (model, pooling, init), run in best.items():
            rows.append(f"| {model} | {pooling} | {init} | {run['epochs']} epochs, lr {run['lr']:g} | "
                        f"{_pct(run['final']['validation'])} | {_pct(run['final']['test'])} |")
    return rows + seed_means(runs)


def seed_means(runs: list[dict]) -> list[str]:
    """Each setting fine-tuned with more than one seed: the seeds' mean accuracy on validation and on test."""
    settings: dict[tuple, list[dict]] = {}
    for run in runs:
        key = (run["model"], run["pooling"], run["pooler_init"], run["epochs"], run["lr"])
        settings.setdefault(key, []).append(run)
    rows = [(key, group) for key, group in settings.items() if len(group) > 1]
    if not rows:
        return []
    lines = ["", "| model | pooling | pooler init | epochs | lr | seeds | mean validation % | mean test % |",
             "|---|---|---|---|---|---|---|---|"]
    for (model, pooling, init, epochs, lr), group in rows:
        seeds = ", ".join(str(r["seed"]) for r in sorted(group, key=lambda r: r["seed"]))
        validation = sum(r["final"]["validation"] for r in group) / len(group)
        test = sum(r["final"]["test"] for r in group) / len(group)
        lines.append(f"| {model} | {pooling} | {init} | {epochs} | {lr:g} | {seeds} | {_pct(validation)} | "
                     f"{_pct(test)} |")
    return lines


def table(results: Path) -> str:
    parts = []
    bow = results / "bag-of-words.json"
    if bow.exists():
        b = json.loads(bow.read_text())
        parts.append(f"Bag of words (logistic regression on token frequencies): {_pct(b['test_accuracy'])}% on the "
                     f"probes' passages, {_pct(b['test_accuracy_all_passages'])}% fitted on every training passage "
                     f"and scored on every test passage; majority class {_pct(b['majority_class'])}%.")
    for builder in (pretraining_table, probe_table, operator_table, finetune_table):
        rows = builder(results)
        if rows:
            parts.append("\n".join(rows))
    return "\n\n".join(parts)
