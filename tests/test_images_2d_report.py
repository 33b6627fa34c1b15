"""The report of the comparison of images in two dimensions (experiments/images_2d.py, scripts/images_2d_report.py):
the learning rate chosen on validation, the tables and the README's line from the runs' own files, each model against
ViT with the interval of the difference, and the commit and machine every kept file records."""

import json

import pytest

from experiments import images_2d
from experiments.images_2d import choose_learning_rate, collect_runs, load_records, render_report, runs_in


def fake_run(folder, accuracy: float, train_seconds: float = 10.0, epochs: float = 1.0) -> None:
    folder.mkdir(parents=True)
    results = {"accuracy": accuracy, "eval_split": "test", "num_train": 100, "num_eval": 50, "num_parameters": 1234,
               "steps": 2, "train_seconds": train_seconds, "epochs": epochs, "hyperparameters": {}}  # fmt: skip
    (folder / "results.json").write_text(json.dumps(results))
    (folder / "all_results.json").write_text(json.dumps({"eval_samples": 50, "eval_runtime": 2.0}))


def test_the_report_chooses_on_validation_and_fills_its_blocks(tmp_path):
    runs, rates = tmp_path / "runs", ["1e-3", "2e-3", "4e-3"]
    for lr, accuracy in zip(rates, [0.80, 0.85, 0.85]):
        fake_run(runs / f"p4-orchid-2d-hybrid-lr{lr}-s0", accuracy)
    with pytest.raises(ValueError, match=r"grid p4-vit: no finished run for the learning rates"):
        choose_learning_rate(runs_in(runs), 4, "vit", rates)
    assert choose_learning_rate(runs_in(runs), 4, "orchid-2d-hybrid", rates) == "2e-3"  # a tie: the lower
    fake_run(runs / "p4-orchid-2d-hybrid-chosen-s0", 0.86, train_seconds=60.0)
    fake_run(runs / "p4-orchid-2d-hybrid-chosen-s1", 0.88, train_seconds=120.0)
    fake_run(runs / "logreg", 0.83)
    (runs / "unrelated").mkdir()
    results = tmp_path / "results"
    assert len(collect_runs(runs, results)) == 6
    report, readme = tmp_path / "report.md", tmp_path / "README.md"
    blocks = ("test", "floor", "grid", "machine")
    report.write_text("".join(f"<!-- images-2d:{b} -->\n<!-- /images-2d:{b} -->\n" for b in blocks))
    readme.write_text("top\n<!-- images-2d:headline -->\nold\n<!-- /images-2d:headline -->\nend\n")
    render_report(results, report, rates, readme)
    text = report.read_text()
    # No ViT at 4x4 here: no difference to give.
    assert "| 4x4 (49 tokens) | Orchid 2-D hybrid (2-D first, then attention) | 1,234 | 2e-3 | 86.00 / 88.00 | " \
        "**87.00** | – | 1.5 min | 1 | 25 |" in text
    assert "| 4x4 | Orchid 2-D hybrid (2-D first, then attention) | 80.00 | 85.00 | 85.00 |" in text
    assert "**83.00%** on the 50 test images" in text
    assert "old" not in readme.read_text() and "2-D hybrid 87.00%" in readme.read_text()
    assert "| 2 seeds; 100 training images each, one pass; logistic regression 83.00%" in readme.read_text()
    # A second set of runs on the same page fills its own blocks, and names a choice at the grid's end.
    second = tmp_path / "second"
    for lr, accuracy in zip(rates, [0.80, 0.85, 0.90]):
        fake_run(second / f"p4-vit-lr{lr}-s0", accuracy)
    fake_run(second / "p4-vit-chosen-s0", 0.91, epochs=2.0)
    collect_runs(second, tmp_path / "second-results")
    second_blocks = ("test", "grid", "machine")
    report.write_text(text + "".join(f"<!-- images-2d:epoch-{b} -->\n<!-- /images-2d:epoch-{b} -->\n"
                                     for b in second_blocks))
    readme.write_text("<!-- images-2d:epoch-headline -->\n<!-- /images-2d:epoch-headline -->\n")
    render_report(tmp_path / "second-results", report, rates, readme, prefix="epoch-")
    assert "100 training images each, 2 passes" in readme.read_text()
    assert report.read_text().startswith(text)  # the first set's blocks as they were
    assert "| 4x4 (49 tokens) | ViT (transformers) | 1,234 | 4e-3 (the grid's edge) | 91.00 |" in report.read_text()


def test_each_model_is_compared_with_vit_at_its_patch_size(tmp_path):
    runs = tmp_path / "runs"
    for model, accuracies in (("vit", (0.80, 0.82, 0.84)), ("orchid-2d", (0.90, 0.92, 0.94)),
                              ("orchid-1d", (0.76, 0.88, 0.79)), ("orchid-2d-hybrid", (0.90, 0.92))):
        fake_run(runs / f"p4-{model}-lr1e-3-s0", 0.5)
        for seed, accuracy in enumerate(accuracies):
            fake_run(runs / f"p4-{model}-chosen-s{seed}", accuracy)
    results = tmp_path / "results"
    collect_runs(runs, results)
    kept = json.loads((results / "p4-vit-chosen-s0.json").read_text())
    assert len(kept["commit"]) == 40 and kept["machine"]["device"] == "cpu"
    machine = json.loads((results / "machine.json").read_text())
    assert (machine["threads_per_run"], machine["runs_at_a_time"]) == (1, 2) and "commit" in machine
    table = images_2d.test_table(load_records(results), ["1e-3"])
    # Three seeds each, variance 4 (points²) on both sides: a standard error of sqrt(4 / 3 + 4 / 3) = 1.633 on Welch's
    # 4 degrees of freedom (t = 2.776), so +10.0 ± 4.53: Orchid 2-D beats ViT. The 1-D model's seeds spread wider
    # (variance 39): -1.0, level. The hybrid has two seeds: too few to size a difference.
    rows = {line.split(" | ")[1]: line for line in table.splitlines()[2:] if line.startswith("| 4x4")}
    assert rows["ViT (transformers)"].split(" | ")[6] == "–"
    assert rows["Orchid 2-D (over the patch grid)"].split(" | ")[6] == "+10.00 (+5.47 to +14.53), beats"
    assert rows["Orchid 1-D (patches as one sequence)"].split(" | ")[6].endswith("level")
    assert rows["Orchid 2-D hybrid (2-D first, then attention)"].split(" | ")[6] == "+9.00, not sized"
    assert "Against ViT at the same patch size: the difference of the mean test accuracies" in table
    readme = tmp_path / "README.md"
    readme.write_text("<!-- images-2d:headline -->\n<!-- /images-2d:headline -->\n")
    report = tmp_path / "report.md"
    blocks = ("test", "grid", "machine")
    report.write_text("".join(f"<!-- images-2d:{b} -->\n<!-- /images-2d:{b} -->\n" for b in blocks))
    render_report(results, report, ["1e-3"], readme)
    assert ("4x4: Orchid 2-D beats ViT by 10.00 points (95% interval of Orchid 2-D − ViT: +5.47 to +14.53)"
            in readme.read_text())
    assert "| 2-3 seeds; 100 training images each" in readme.read_text()  # the hybrid has two
    assert "test accuracy, seeds 0 / 1 / 2 (%)" in table
    with pytest.raises(ValueError, match="holds no records"):
        render_report(tmp_path / "runs" / "p4-vit-chosen-s0" / "missing", report, ["1e-3"])
