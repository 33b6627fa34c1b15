"""The research code's harness (benchmarks/harness.py): timing and its predictions, peak memory, where a result was
made (commit, uncommitted changes, machine), Markdown tables, generated doc blocks, result files, argument checks."""

import argparse
import json
import math
import re
import subprocess
import time

import pytest
import torch

from benchmarks import harness


def test_a_timed_call_takes_at_least_what_the_step_sleeps():
    assert 0.02 <= harness.timed_call(lambda: time.sleep(0.02)) < 1.0
    calls = []
    seconds = harness.median_seconds(lambda: calls.append(time.sleep(0.005)), calls=3)
    assert len(calls) == 4 and seconds >= 0.005  # a warm-up call, then three timed


def test_interleaved_rounds_start_with_each_step_in_turn_and_stop_at_the_budget():
    order = []
    steps = {name: (lambda name=name: order.append(name) or 1.0) for name in "abc"}
    times = harness.interleaved_times(steps, repeats=3, min_repeats=3, budget_s=1e9)
    assert times == {name: [1.0, 1.0, 1.0] for name in "abc"}
    assert order == list("abc" "bca" "cab")
    order.clear()
    harness.interleaved_times(steps, repeats=10, min_repeats=2, budget_s=0.0)
    assert len(order) == 6  # two rounds, then the spent budget stops it


def test_predictions_follow_the_given_growth_or_the_fitted_power_law():
    assert harness.fit_power_law([10, 100, 1000], [2.0, 200.0, 20000.0]) == pytest.approx((2.0, math.log(0.02)))
    assert harness.fit_power_law([10, 10], [1.0, 2.0]) is None  # one length: no slope
    # From the last point (batch 2, length 100, 1 s) growing as L^2, at batch 4 and length 200: 2 x 4 = 8 s.
    assert harness.predicted_seconds([(1, 50, 9.0), (2, 100, 1.0)], 4, 200, exponent=2.0) == pytest.approx(8.0)
    # Fitted per sequence through the last three points: time = 1e-3 L at batch 1, so 1 s at (1, 1000), 4 s at
    # (2, 2000).
    points = [(1, 10, 5.0), (1, 100, 0.1), (1, 200, 0.2), (2, 400, 0.8)]
    assert harness.predicted_seconds(points, 2, 2000) == pytest.approx(4.0)
    assert harness.predicted_seconds([(1, 10, 1.0)], 1, 20) is None and harness.predicted_seconds([], 1, 20) is None


def test_the_peak_memory_of_a_call_is_what_it_allocates():
    assert harness.peak_bytes(lambda: torch.empty(250_000)) == pytest.approx(1_000_000, rel=0.01)

    def two_at_once():
        a = torch.empty(250_000)
        b = torch.empty(250_000)
        del a, b
        torch.empty(250_000)

    assert harness.profiled_peak_bytes(two_at_once) == pytest.approx(2_000_000, rel=0.01)


def test_provenance_records_the_commit_its_changes_and_the_machine(tmp_path):
    made = harness.provenance(threads=1)
    assert re.fullmatch(r"[0-9a-f]{40}", made["commit"]) and isinstance(made["uncommitted_changes"], bool)
    machine = made["machine"]
    assert machine["device"] == "cpu" and machine["torch_threads"] == 1 and machine["torch"] == torch.__version__
    assert machine["versions"]["torch"] is not None and machine["cpu_count"] >= 1
    assert machine["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    json.dumps(made)  # every value is JSON
    given = harness.provenance(commit="0123456789abcdef")
    assert (given["commit"], given["uncommitted_changes"]) == ("0123456789abcdef", None)
    assert harness.git_state(tmp_path) == {"commit": None, "uncommitted_changes": None}  # not a checkout


def test_a_run_file_under_docs_results_is_no_uncommitted_change(tmp_path):
    """A run that writes several files into docs/results records a clean tree in each; any other change counts."""
    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)  # fmt: skip

    git("init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", "code.py")
    git("commit", "-qm", "code")
    assert harness.git_state(tmp_path)["uncommitted_changes"] is False
    (tmp_path / harness.RESULTS_DIR / "runs").mkdir(parents=True)
    (tmp_path / harness.RESULTS_DIR / "runs" / "first.json").write_text("{}")
    assert harness.git_state(tmp_path)["uncommitted_changes"] is False
    (tmp_path / "other.py").write_text("y = 2\n")
    assert harness.git_state(tmp_path)["uncommitted_changes"] is True
    (tmp_path / "other.py").unlink()
    (tmp_path / "code.py").write_text("x = 2\n")
    assert harness.git_state(tmp_path)["uncommitted_changes"] is True


def test_the_machine_and_the_commit_in_words():
    machine = {"processor": "Some CPU", "cpu_count": 2, "platform": "Linux-x", "torch": "2.0"}
    assert harness.machine_text(machine) == "Some CPU, 2 cores, Linux-x, torch 2.0"
    assert harness.machine_text({"torch": "2.0"}) == "?, ? cores, ?, torch 2.0"
    commit = "0123456789abcdef0123"
    assert harness.commit_text({"commit": commit, "uncommitted_changes": False}) == "commit 0123456789ab"
    assert harness.commit_text({"commit": commit, "uncommitted_changes": True}).endswith("with uncommitted changes")
    unknown = harness.commit_text({"commit": commit, "uncommitted_changes": None})
    assert unknown.endswith("(uncommitted changes unknown)")
    assert harness.commit_text({}) == "commit unknown"


def test_a_table_has_its_header_separator_and_rows():
    assert harness.table_lines(["a", "b"], [[1, "x"], [2.5, None]]) == [
        "| a | b |", "|---|---|", "| 1 | x |", "| 2.5 | None |"]
    with pytest.raises(ValueError, match=r"a table row has 1 cells for 2 columns: \['1'\]"):
        harness.table_lines(["a", "b"], [[1]])


def test_generated_blocks_are_found_and_replaced_by_name():
    text = "top\n<!-- page:one x -->\nold\n<!-- /page:one x -->\nmiddle\n<!-- page:two -->\n<!-- /page:two -->\nend"
    assert harness.block_names(text, "page") == ["one x", "two"]
    assert harness.block_names(text, "other") == []
    replaced = harness.replace_block(text, "page", "one x", "new\nlines")
    assert replaced == text.replace("<!-- page:one x -->\nold\n", "<!-- page:one x -->\nnew\nlines\n")
    assert harness.replace_block(replaced, "page", "one x", "new\nlines") == replaced
    with pytest.raises(ValueError, match="no <!-- page:three --> ... <!-- /page:three --> block"):
        harness.replace_block(text, "page", "three", "x")


def test_a_result_is_written_as_json_and_markdown(tmp_path, capsys):
    harness.write_result({"value": 1}, tmp_path / "out", "run", lambda result: f"value {result['value']}\n")
    assert json.loads((tmp_path / "out" / "run.json").read_text()) == {"value": 1}
    assert (tmp_path / "out" / "run.md").read_text() == "value 1\n" and "value 1" in capsys.readouterr().out
    harness.write_text_atomically(tmp_path / "note.txt", "first")
    harness.write_text_atomically(tmp_path / "note.txt", "second")
    assert (tmp_path / "note.txt").read_text() == "second" and not (tmp_path / "note.txt.tmp").exists()


def test_arguments_below_their_minimum_are_refused_by_flag(capsys):
    parser = argparse.ArgumentParser()
    args = argparse.Namespace(mlm_layers=0, steps=None, threads=2)
    harness.check_at_least(parser, args, "--threads", "--steps")  # None is not checked
    with pytest.raises(SystemExit):
        harness.check_at_least(parser, args, "--threads", "--mlm-layers")
    assert "--mlm-layers must be at least 1, got 0" in capsys.readouterr().err
