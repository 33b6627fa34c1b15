"""The GPU check (``scripts/gpu_check.py``): one command that checks and measures Orchid on a GPU, in stages, each
under its own time budget, and writes one JSON and one Markdown report.

Stages (``--stages``, in this order):

- ``correctness``: every head and the operator (DCT and FFT, Type I and Type II conditioning) in float32 on the device
  against the same weights on the CPU; the operator also against a float64 run, and the transforms and long
  convolutions against their references (``*_ref`` in ``modeling/orchid_ops.py``); padding on the right and on the
  left; ``torch.compile`` against eager; parameter gradients as well.
- ``training``: ``OrchidForMaskedLM`` (``orchid-bert-base``'s width, ``--mlm-layers`` of its layers) trained on a
  learnable synthetic masked-LM task in float32, under bf16 autocast and with bf16 weights, side by side on the same
  batches, with fused AdamW; the loss curves and which parameters stayed float32.
- ``speed``: time and peak memory of the operator against an attention block (SDPA) and of the 12-layer
  ``OrchidModel`` (eager, and compiled) against transformers' ``BertModel`` (SDPA), forward and forward + backward,
  in bf16 autocast and float32, from (8, 128) to (1, 65536).
- ``recall``: associative recall at long lengths through ``experiments/recall.py``: accuracy on a held-out set
  against training steps.
- ``needle`` (only when named in ``--stages``: it needs a checkpoint and texts): the needle benchmark's pass key
  (``experiments/needle.py``) fine-tuned up a ladder of lengths (``--needle-train-lengths``, 128 to 8,192 tokens)
  and scored at lengths beyond a CPU's reach, from 32K to 128K tokens: accuracy by depth, seconds per haystack, peak
  memory.

Budgets: a stage checks its deadline between points and steps; one that reaches it ends there and is reported as
``cut``, with what it measured by then. A step that does not return in time is interrupted (SIGALRM) a grace period
after the deadline. An exception in a stage is recorded with its traceback and the next stage runs. The whole run has
a budget as well (``--total-budget-s``): later stages get what is left of it. Both reports are rewritten after every
check, point and stage, so that a run stopped at any moment leaves what it measured.

``orchid_hf`` and transformers are imported inside the stages, after the report's header is written: a machine where
they cannot be imported still gets a report that says why.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import functools
import gc
import json
import math
import os
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import torch
from torch import nn

from benchmarks.candidates import AttentionBlock, build_model, build_operator, make_step
from benchmarks.harness import (
    check_at_least,
    commit_text,
    machine_text,
    peak_bytes,
    predicted_seconds,
    provenance,
    table_lines,
    timed_call,
    write_text_atomically,
)
from benchmarks.settings import parse_lengths, parse_names, parse_shapes
from benchmarks.source_tree import import_orchid_hf

STAGES = ("correctness", "training", "speed", "recall", "needle")
DEFAULT_STAGES = STAGES[:4]  # the check; the needle stage is a second call with its own inputs
# Seconds per stage on the GPU. The run's own budget leaves room for the start-up (Python, imports) and one stage's
# grace period within eight minutes: a GPU machine runs one command for at most ten. The needle stage alone fits a
# call of five minutes.
BUDGETS = {"correctness": 85.0, "training": 80.0, "speed": 185.0, "recall": 100.0, "needle": 240.0}
TOTAL_BUDGET_S = 455.0
# --tiny: generous for the stages that end on their own; recall trains for whatever time its stage gets.
TINY_BUDGETS = {"correctness": 120.0, "training": 60.0, "speed": 120.0, "recall": 8.0, "needle": 120.0}
TINY_TOTAL_BUDGET_S = 400.0
JSON_NAME, MARKDOWN_NAME = "gpu_check.json", "gpu_check.md"


def hard_stop_grace(budget_s: float) -> float:
    """How long past its deadline a stage may run before it is interrupted: its own checks come first."""
    return max(10.0, 0.05 * budget_s)


# ---------------------------------------------------------------------------------------------
# Sizes: the GPU run's and --tiny's
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Sizes:
    # correctness
    head_hidden: int
    head_length: int
    wide_hidden: int  # an OrchidModel of this width, 2 layers: with 768 and 2 x 1024 tokens its operator mixes its
    wide_length: int  # channels a group at a time, as long inputs do
    operator_width: int
    operator_length: int
    reference_length: int  # the references' transform length (not a power of two)
    # training
    mlm_batch: int
    mlm_length: int
    mlm_log_every: int
    # speed
    speed_shapes: tuple[tuple[int, int], ...]
    speed_repeats: int
    compiled_shapes: int  # how many of the speed shapes the compiled model may reach
    # recall
    recall_batch: int
    recall_eval_size: int
    recall_probe_steps: int
    recall_max_steps: int | None  # the longest schedule a run gets (None: experiments/recall.py's default)
    # needle
    needle_depths: tuple[float, ...]
    needle_examples: int  # test haystacks per depth and length
    needle_train_examples: int
    needle_batch: int
    needle_steps: int  # per length of the ladder


GPU_SIZES = Sizes(
    head_hidden=64, head_length=128, wide_hidden=768, wide_length=1024, operator_width=256, operator_length=1024,
    reference_length=1000,
    mlm_batch=32, mlm_length=128, mlm_log_every=10,
    speed_shapes=((8, 128), (8, 512)) + tuple((1, 2**k) for k in range(11, 17)), speed_repeats=5, compiled_shapes=8,
    recall_batch=64, recall_eval_size=500, recall_probe_steps=10, recall_max_steps=None,
    needle_depths=(0, 25, 50, 75, 100), needle_examples=4, needle_train_examples=4096, needle_batch=8,
    needle_steps=1000,
)  # fmt: skip
TINY_SIZES = Sizes(
    head_hidden=32, head_length=32, wide_hidden=64, wide_length=64, operator_width=16, operator_length=48,
    reference_length=40,
    mlm_batch=8, mlm_length=32, mlm_log_every=5,
    speed_shapes=((2, 32), (1, 64)), speed_repeats=2, compiled_shapes=1,
    recall_batch=8, recall_eval_size=16, recall_probe_steps=2, recall_max_steps=16,
    needle_depths=(0, 100), needle_examples=1, needle_train_examples=8, needle_batch=2, needle_steps=2,
)  # fmt: skip


@dataclasses.dataclass
class CheckSettings:
    """One run's settings, from the command line (:func:`parse_args`)."""

    out: Path
    device: str
    tiny: bool
    command: str
    threads: int
    commit: str | None
    stages: list[str]
    budgets: dict[str, float]
    total_budget_s: float
    fail_stage: str | None
    compile_backend: str
    compile_scope: str
    compile_mode: str
    mlm_layers: int
    mlm_steps: int
    speed_shapes: list[tuple[int, int]]
    recall_vocabs: list[int]
    recall_lengths: list[int]
    needle_model: Path | None = None
    needle_baseline: Path | None = None
    needle_texts: Path | None = None
    needle_lengths: list[int] = dataclasses.field(default_factory=list)
    needle_train_lengths: list[int] = dataclasses.field(default_factory=list)
    needle_learning_rate: float = 0.0
    needle_baseline_learning_rate: float = 0.0
    started: float = dataclasses.field(default_factory=time.monotonic)

    @property
    def sizes(self) -> Sizes:
        return TINY_SIZES if self.tiny else GPU_SIZES

    def to_json(self) -> dict:
        values = dataclasses.asdict(self)
        values.pop("started")
        values["out"] = str(self.out)
        for name in ("needle_model", "needle_baseline", "needle_texts"):
            values[name] = None if values[name] is None else str(values[name])
        values["sizes"] = dataclasses.asdict(self.sizes)
        return values


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------


class Report:
    """The JSON (``data``) and its Markdown rendering, both rewritten whole by :meth:`save` (through a temporary file
    and a rename, so that a run killed while writing leaves the previous version)."""

    def __init__(self, out: Path, data: dict):
        self.out = out
        self.data = data
        out.mkdir(parents=True, exist_ok=True)

    def save(self) -> None:
        self.data["updated"] = now_utc()
        write_text_atomically(self.out / JSON_NAME, json.dumps(self.data, indent=1, default=str))
        try:
            markdown = render_markdown(self.data)
        except Exception:  # the JSON holds everything; a rendering bug must not lose it
            markdown = f"# GPU check\n\nThe report could not be rendered:\n\n```\n{traceback.format_exc()}```\n"
        write_text_atomically(self.out / MARKDOWN_NAME, markdown)


def now_utc() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


# ---------------------------------------------------------------------------------------------
# Stages, budgets and the runner
# ---------------------------------------------------------------------------------------------


class StageCut(BaseException):
    """A stage reached its deadline. A BaseException, so that the ``except Exception`` of a point that records its
    own failure (or of a library) does not swallow it."""


class Terminated(BaseException):
    """The process got SIGTERM (the machine's command limit): the report is saved and the run ends."""


class Stage:
    """What a stage function gets: the settings, its deadline (:meth:`check` raises :class:`StageCut` once it has
    passed), its part of the report (``results``) and :meth:`save`."""

    def __init__(self, name: str, settings: CheckSettings, report: Report, budget_s: float):
        self.name = name
        self.settings = settings
        self.report = report
        self.budget_s = budget_s
        self.started = time.monotonic()
        self.deadline = self.started + budget_s
        self.results: dict = report.data["stages"][name]["results"]

    @property
    def device(self) -> torch.device:
        return torch.device(self.settings.device)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def check(self) -> None:
        if self.left() <= 0:
            raise StageCut(f"its budget of {self.budget_s:.3g} s ran out")

    def save(self) -> None:
        self.report.save()

    def log(self, message: str) -> None:
        elapsed = time.monotonic() - self.settings.started
        print(f"[{elapsed:6.1f} s] {self.name}: {message}", flush=True)


@contextlib.contextmanager
def hard_stop(seconds: float):
    """Raise :class:`StageCut` in the main thread after ``seconds``, for a step that never returns to its stage's own
    deadline checks (a compilation that takes minutes, say). Python runs the handler between bytecodes, so a single
    long call into C++ ends first. Outside the main thread, or without SIGALRM, it does nothing."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        yield
        return

    def interrupt(signum, frame):
        raise StageCut(f"interrupted {seconds:.0f} s after it began (its budget and the grace period): a step did not "
                       "return in time")

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def release_memory() -> None:
    """What a stage leaves behind: Python garbage, the CUDA cache, compiled graphs."""
    gc.collect()
    if "torch._dynamo" in sys.modules:  # importing it only to reset it would take seconds
        with contextlib.suppress(Exception):
            torch._dynamo.reset()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_stages(settings: CheckSettings, report: Report, functions: dict[str, Callable[[Stage], None]]) -> bool:
    """Run the settings' stages in order, each under ``min(its budget, what is left of the run's)``; record each one's
    status (``completed``, ``cut``, ``error`` with its traceback, ``skipped``), seconds and results, and save the report
    after each. Returns False where SIGTERM ended the run (the stage running then is cut, the later ones skipped)."""
    run_deadline = settings.started + settings.total_budget_s
    previous_term = signal.getsignal(signal.SIGTERM)

    def terminate(signum, frame):
        raise Terminated("the process got SIGTERM")

    with contextlib.suppress(ValueError):  # only the main thread may set handlers
        signal.signal(signal.SIGTERM, terminate)
    try:
        for position, name in enumerate(settings.stages):
            record = report.data["stages"][name]
            budget = min(settings.budgets[name], run_deadline - time.monotonic())
            if budget <= 0:
                record.update(status="skipped", reason=f"the run's total budget of {settings.total_budget_s:.0f} s "
                                                       "was spent before it")
                report.save()
                continue
            stage = Stage(name, settings, report, budget)
            record.update(status="running", budget_s=round(budget, 1), started=now_utc())
            report.save()
            stage.log(f"started, budget {budget:.0f} s")
            try:
                with hard_stop(budget + hard_stop_grace(budget)):
                    if settings.fail_stage == name:
                        raise RuntimeError(f"a failure injected by --fail-stage {name}")
                    functions[name](stage)
                record["status"] = "completed"
            except StageCut as cut:
                record.update(status="cut", reason=str(cut))
            except Terminated:
                record.update(status="cut", reason="the process was terminated (SIGTERM)")
                for later in settings.stages[position + 1 :]:
                    report.data["stages"][later].update(status="skipped", reason="the process was terminated")
                raise
            except Exception:  # recorded in the report; the next stage runs
                record.update(status="error", error=traceback.format_exc())
            finally:
                record["seconds"] = round(time.monotonic() - stage.started, 1)
                stage.log(f"{record['status']} after {record['seconds']} s")
                release_memory()
                report.save()
    except Terminated:
        return False
    finally:
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGTERM, previous_term)
    return True


# ---------------------------------------------------------------------------------------------
# Helpers of the stages
# ---------------------------------------------------------------------------------------------


def difference(actual: torch.Tensor, expected: torch.Tensor, tolerance: float, floor: float = 0.0) -> dict:
    """How far ``actual`` is from ``expected``: the largest absolute difference, and that difference relative to the
    largest magnitude of ``expected`` (at least ``floor``); passed when it is finite and within ``tolerance``."""
    actual = actual.detach().to("cpu", torch.float64)
    expected = expected.detach().to("cpu", torch.float64)
    if actual.shape != expected.shape:
        return {"max_abs": None, "max_rel": None, "tolerance": tolerance, "passed": False,
                "detail": f"shapes differ: {tuple(actual.shape)} and {tuple(expected.shape)}"}
    max_abs = (actual - expected).abs().max().item() if actual.numel() else 0.0
    scale = max(expected.abs().max().item() if expected.numel() else 0.0, floor)
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    passed = bool(torch.isfinite(actual).all()) and max_rel <= tolerance
    return {"max_abs": max_abs, "max_rel": max_rel, "tolerance": tolerance, "passed": passed}


def gradient_difference(model: nn.Module, reference: nn.Module, tolerance: float) -> dict:
    """:func:`difference` of every parameter's gradient, each relative to its own largest entry (at least 1e-3 of the
    largest entry of any gradient of ``reference``, so that a nearly zero gradient is not judged on rounding); the
    worst parameter's numbers, and its name."""
    pairs = list(zip(model.named_parameters(), reference.named_parameters()))
    grads = [ref.grad for _, (_, ref) in pairs if ref.grad is not None]
    largest = max((grad.abs().max().item() for grad in grads), default=0.0)
    worst = {"max_abs": 0.0, "max_rel": 0.0, "tolerance": tolerance, "passed": True, "worst_parameter": None}
    for (name, param), (_, ref) in pairs:
        if param.grad is None and ref.grad is None:
            continue
        if param.grad is None or ref.grad is None:
            return dict(worst, passed=False, worst_parameter=name, detail="a gradient on one side only")
        result = difference(param.grad, ref.grad, tolerance, floor=1e-3 * largest)
        if not result["passed"] or result["max_rel"] > worst["max_rel"]:
            worst = dict(result, worst_parameter=name)
            if not result["passed"]:
                break
    return worst


@contextlib.contextmanager
def exact_float32():
    """float32 products and convolutions without TensorFloat-32 (cuDNN's convolutions allow it by default), so that
    the device is compared with the CPU in the same arithmetic. Yields whether the flags could be set (a torch whose
    newer ``fp32_precision`` settings conflict with them refuses)."""
    try:
        saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    except Exception:
        saved = None
    try:
        yield saved is not None
    finally:
        if saved is not None:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


class Autocast(nn.Module):
    """Runs ``module``'s forward under ``torch.autocast`` (its backward then runs outside it, as recommended)."""

    def __init__(self, module: nn.Module, device_type: str, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.module = module
        self.device_type = device_type
        self.dtype = dtype

    def forward(self, *args, **kwargs):
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.module(*args, **kwargs)


def encoder_layers(model: nn.Module) -> nn.ModuleList:
    return model.base_model.encoder.layer


def compile_model(model: nn.Module, settings: CheckSettings) -> nn.Module:
    """``torch.compile`` of the whole model (``compile_scope="model"``) or of each encoder layer in place
    (``"layers"``: regional compilation, where identical layers share one compiled graph and compile once)."""
    options = dict(backend=settings.compile_backend)
    if settings.compile_mode != "default":
        options["mode"] = settings.compile_mode
    if settings.compile_scope == "model":
        return torch.compile(model, **options)
    for layer in encoder_layers(model):
        layer.compile(**options)
    return model


def is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error).lower()


def built_on(device: torch.device, build: Callable[..., nn.Module], *args) -> nn.Module:
    """``build(*args)`` with its tensors created on ``device`` (a model of 77M parameters initialises in a fraction of
    the time there), or on the CPU and moved where a builder does not support that."""
    try:
        with device:
            return build(*args).to(device)
    except Exception:
        return build(*args).to(device)


# ---------------------------------------------------------------------------------------------
# Stage 1: correctness
# ---------------------------------------------------------------------------------------------

FORWARD_TOLERANCE = 1e-4  # float32 against float32 (or float64) of the same weights: rounding only
GRADIENT_TOLERANCE = 1e-3  # gradients sum over more terms, in another order on each device
REFERENCE_TOLERANCE = 1e-5  # one transform or long convolution in float32 against its float64 reference
HEADS = ("OrchidModel", "OrchidForMaskedLM", "OrchidForSequenceClassification", "OrchidForTokenClassification",
         "OrchidForQuestionAnswering", "OrchidForMultipleChoice", "OrchidForImageClassification")  # fmt: skip
NUM_CHOICES = 3


def text_config(sizes: Sizes, **overrides):
    from orchid_hf import OrchidConfig

    fields = dict(vocab_size=97, hidden_size=sizes.head_hidden, num_hidden_layers=2,
                  intermediate_size=2 * sizes.head_hidden, max_position_embeddings=sizes.head_length,
                  hidden_dropout_prob=0.0, num_labels=3, classifier_pooling="mean")  # fmt: skip
    return OrchidConfig(**{**fields, **overrides})


def head_inputs(head: str, config, batch: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Inputs and labels of a head, on the CPU; text rows after the first are padded on the right."""
    if head == "OrchidForImageClassification":
        size = config.image_size
        return {"pixel_values": torch.randn(batch, config.num_channels, size, size, generator=generator),
                "labels": torch.randint(0, config.num_labels, (batch,), generator=generator)}
    length = config.max_position_embeddings
    shape = (batch, NUM_CHOICES, length) if head == "OrchidForMultipleChoice" else (batch, length)
    ids = torch.randint(1, config.vocab_size, shape, generator=generator)
    mask = torch.ones_like(ids)
    mask[1:, ..., length - length // 4 :] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    if head == "OrchidForMaskedLM":
        labelled = (torch.rand(shape, generator=generator) < 0.3) & mask.bool()
        labelled[0, 0] = True
        inputs["labels"] = torch.where(labelled, ids, torch.full_like(ids, -100))
    elif head in ("OrchidForSequenceClassification", "OrchidForMultipleChoice"):
        classes = NUM_CHOICES if head == "OrchidForMultipleChoice" else config.num_labels
        inputs["labels"] = torch.randint(0, classes, (batch,), generator=generator)
    elif head == "OrchidForTokenClassification":
        labels = torch.randint(0, config.num_labels, shape, generator=generator)
        inputs["labels"] = labels.masked_fill(mask == 0, -100)
    elif head == "OrchidForQuestionAnswering":
        inputs["start_positions"] = torch.randint(0, length // 2, (batch,), generator=generator)
        inputs["end_positions"] = inputs["start_positions"] + 1
    return inputs


def main_outputs(output) -> list[torch.Tensor]:
    """The tensors a head returns (besides its loss)."""
    names = ("logits", "start_logits", "end_logits", "last_hidden_state")
    return [getattr(output, name) for name in names if getattr(output, name, None) is not None]


def training_loss(output) -> torch.Tensor:
    """The head's loss, or for the base model a function of all its outputs."""
    return output.loss if getattr(output, "loss", None) is not None else output.last_hidden_state.square().mean()


def on(device: torch.device, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.to(device) for name, tensor in inputs.items()}


def compare_across_devices(record, label: str, model: nn.Module, inputs: dict, device: torch.device) -> None:
    """``model`` (on the CPU) against a copy of it on ``device``: the outputs in eval mode, then the loss and every
    parameter's gradient in train mode."""
    copy_on_device = copy.deepcopy(model).to(device)
    with torch.no_grad():
        expected = main_outputs(model.eval()(**inputs))
        actual = main_outputs(copy_on_device.eval()(**on(device, inputs)))
    for index, (a, e) in enumerate(zip(actual, expected)):
        record(f"{label}: output {index} on {device.type} against the CPU", difference(a, e, FORWARD_TOLERANCE))
    expected_loss = training_loss(model.train()(**inputs))
    expected_loss.backward()
    actual_loss = training_loss(copy_on_device.train()(**on(device, inputs)))
    actual_loss.backward()
    record(f"{label}: loss on {device.type} against the CPU", difference(actual_loss, expected_loss, FORWARD_TOLERANCE))
    record(f"{label}: parameter gradients on {device.type} against the CPU",
           gradient_difference(copy_on_device, model, GRADIENT_TOLERANCE))


def stage_correctness(stage: Stage) -> None:
    import orchid_hf
    from orchid_hf import OrchidConfig, OrchidForSequenceClassification, OrchidModel, OrchidOperator

    sizes, device = stage.settings.sizes, stage.device
    checks = stage.results.setdefault("checks", [])
    stage.results["passed"] = True

    def record(name: str, result: dict) -> None:
        checks.append({"check": name, **result})
        stage.results["passed"] = all(check["passed"] for check in checks)
        stage.save()
        stage.check()

    generator = torch.Generator().manual_seed(0)
    with exact_float32() as exact:
        stage.results["tensorfloat32"] = (
            "off for this stage (cuda.matmul.allow_tf32 = cudnn.allow_tf32 = False)" if exact
            else f"torch's defaults (its flags could not be set): matmul {torch.get_float32_matmul_precision()}"
        )
        # Every head, with the same weights on both sides.
        for head in HEADS:
            torch.manual_seed(0)
            if head == "OrchidForImageClassification":
                config = OrchidConfig.from_preset("orchid-vit-cifar-s", num_hidden_layers=2, num_labels=5)
            else:
                config = text_config(sizes)
            model = getattr(orchid_hf, head)(config)
            compare_across_devices(record, head, model, head_inputs(head, config, 2, generator), device)
        stage.log("heads done")

        # A model of orchid-bert-base's width on enough tokens that its operators mix a group of channels at a time.
        torch.manual_seed(0)
        config = OrchidConfig.from_preset("orchid-bert-base", num_hidden_layers=2, hidden_size=sizes.wide_hidden,
                                          max_position_embeddings=sizes.wide_length, hidden_dropout_prob=0.0)
        inputs = head_inputs("OrchidModel", config, 2, generator)
        label = f"OrchidModel, width {sizes.wide_hidden}, 2 layers, (2, {sizes.wide_length})"
        compare_across_devices(record, label, OrchidModel(config), inputs, device)

        # The operator: float32 on the device against float32 and float64 on the CPU, with and without padding.
        width, length = sizes.operator_width, sizes.operator_length
        for transform in ("dct", "fft"):
            for conditioning in ("abs", "xcorr"):
                torch.manual_seed(0)
                operator = OrchidOperator(width, length, transform=transform, conditioning=conditioning)
                x = torch.randn(2, length, width, generator=generator)
                mask = torch.ones(2, length, dtype=torch.long)
                mask[1, length - length // 3 :] = 0
                label = f"OrchidOperator({width}, {length}), {transform}, {conditioning}"
                on_device = copy.deepcopy(operator).to(device)
                in_float64 = copy.deepcopy(operator).double()
                for case, arguments in (("full length", (x,)), ("row 2 padded", (x, mask)),
                                        ("shorter input", (x[:, : length - 5],))):
                    with torch.no_grad():
                        expected = operator(*arguments)
                        actual = on_device(*(argument.to(device) for argument in arguments))
                        exact = in_float64(*(a.double() if a.is_floating_point() else a for a in arguments))
                    record(f"{label}, {case}: on {device.type} against the CPU",
                           difference(actual, expected, FORWARD_TOLERANCE))
                    record(f"{label}, {case}: on {device.type} against float64",
                           difference(actual, exact, FORWARD_TOLERANCE))
                # Gradients of the input and of every parameter, padded rows included.
                x_cpu, x_device = x.clone().requires_grad_(True), x.to(device).requires_grad_(True)
                weights = torch.randn(2, length, width, generator=generator)
                (operator(x_cpu, mask) * weights).sum().backward()
                (on_device(x_device, mask.to(device)) * weights.to(device)).sum().backward()
                record(f"{label}: input gradient on {device.type} against the CPU",
                       difference(x_device.grad, x_cpu.grad, GRADIENT_TOLERANCE))
                record(f"{label}: parameter gradients on {device.type} against the CPU",
                       gradient_difference(on_device, operator, GRADIENT_TOLERANCE))
        stage.log("operator done")

        check_references(record, sizes, device, generator)
        check_padding(record, sizes, device, generator, OrchidModel, OrchidForSequenceClassification)
        stage.log("references and padding done")
        check_compiled(record, stage, generator)


def check_references(record, sizes: Sizes, device: torch.device, generator: torch.Generator) -> None:
    """The fast transforms and long convolutions in float32 on the device against their references in float64."""
    from orchid_hf.modeling import orchid_ops as ops

    n, channels = sizes.reference_length, 16
    for length in (n, n - 7):  # the whole transform, and zero padding up to it
        x = torch.randn(2, length, channels, generator=generator)
        expected = ops.dct_ref(x.double(), 1, n)
        record(f"dct, {length} samples to {n}, on {device.type} against dct_ref",
               difference(ops.dct(x.to(device), 1, n), expected, REFERENCE_TOLERANCE))
        record(f"idct, {n} to {length} samples, on {device.type} against idct_ref",
               difference(ops.idct(expected.float().to(device), 1, length), ops.idct_ref(expected, 1, length),
                          REFERENCE_TOLERANCE))
    length = n - 7
    x = torch.randn(2, length, channels, generator=generator)
    lags = torch.arange(n, dtype=torch.float64).unsqueeze(1)
    kernel = torch.randn(n, channels, generator=generator, dtype=torch.float64) * torch.exp(-lags / (0.1 * n))
    mask = torch.ones(2, length, 1, dtype=torch.bool)
    mask[1, length // 2 :] = False
    s1, v, s2 = (torch.randn(2, length, channels, generator=generator) for _ in range(3))
    for transform in ("dct", "fft"):
        multiplier = ops.kernel_spectrum(kernel, transform)  # complex for the FFT
        multiplier_32 = multiplier.to(torch.complex64 if multiplier.is_complex() else torch.float32).to(device)
        expected = ops.long_convolution_ref(x.double(), multiplier, transform, n)
        actual = ops.long_convolution(x.to(device), multiplier_32, transform, n)
        record(f"long_convolution, {transform}, on {device.type} against long_convolution_ref",
               difference(actual, expected, REFERENCE_TOLERANCE))
        expected = ops.gated_long_convolution_ref(s1.double(), v.double(), s2.double(), multiplier, mask, transform, n,
                                                  torch.float64)
        actual = ops.gated_long_convolution(*(t.to(device) for t in (s1, v, s2)), multiplier_32,
                                            mask.to(device), transform, n, torch.float32)
        record(f"gated_long_convolution, {transform}, on {device.type} against gated_long_convolution_ref",
               difference(actual, expected, REFERENCE_TOLERANCE))


def check_padding(record, sizes: Sizes, device: torch.device, generator: torch.Generator, *heads) -> None:
    """A sentence alone, padded on the right to the model's length, and in a batch with a longer sentence padded on
    the right and on the left: its real positions (or its pooled output) are the same, on the device."""
    short, long = 7, min(13, sizes.head_length)
    for head in heads:
        for transform in ("dct", "fft"):
            torch.manual_seed(0)
            model = head(text_config(sizes, transform=transform)).to(device).eval()
            sentence = torch.randint(5, 97, (1, short), generator=generator)
            other = torch.randint(5, 97, (1, long), generator=generator)
            pad = torch.zeros(1, long - short, dtype=torch.long)
            ones, zeros = torch.ones(1, short, dtype=torch.long), torch.zeros(1, long - short, dtype=torch.long)
            cases = {
                "right": (torch.cat([torch.cat([sentence, pad], 1), other]),
                          torch.cat([torch.cat([ones, zeros], 1), torch.ones(1, long, dtype=torch.long)])),
                "left": (torch.cat([torch.cat([pad, sentence], 1), other]),
                         torch.cat([torch.cat([zeros, ones], 1), torch.ones(1, long, dtype=torch.long)])),
            }
            full = sizes.head_length
            cases["right, to max_length"] = (
                torch.cat([sentence, torch.zeros(1, full - short, dtype=torch.long)], 1),
                torch.cat([ones, torch.zeros(1, full - short, dtype=torch.long)], 1),
            )
            with torch.no_grad():
                alone = main_outputs(model(input_ids=sentence.to(device)))[0]
                for side, (ids, mask) in cases.items():
                    output = main_outputs(model(input_ids=ids.to(device), attention_mask=mask.to(device)))[0][:1]
                    if output.dim() == 3:  # per-token outputs: the sentence's positions
                        real = mask[0].bool().to(device)
                        output = output[:, real]
                    record(f"{head.__name__}, {transform}: padded on the {side} against the sentence alone, on "
                           f"{device.type}", difference(output, alone, FORWARD_TOLERANCE))


def check_compiled(record, stage: Stage, generator: torch.Generator) -> None:
    """``torch.compile`` of a small OrchidModel against eager on the device: outputs (eval, a padded row) and every
    parameter's gradient (train)."""
    from orchid_hf import OrchidModel

    settings, device = stage.settings, stage.device
    torch.manual_seed(0)
    config = text_config(settings.sizes)
    model = OrchidModel(config).to(device)
    inputs = on(device, head_inputs("OrchidModel", config, 2, generator))
    with torch.no_grad():
        eager = main_outputs(model.eval()(**inputs))[0]
    training_loss(model.train()(**inputs)).backward()
    eager_grads = copy.deepcopy(model)  # a deep copy leaves the gradients behind: they are copied over
    for copied, param in zip(eager_grads.parameters(), model.parameters()):
        copied.grad = None if param.grad is None else param.grad.clone()
    model.zero_grad(set_to_none=True)
    label = f"torch.compile (backend {settings.compile_backend}, scope {settings.compile_scope})"
    stage.results["compile"] = {"backend": settings.compile_backend, "scope": settings.compile_scope,
                                "mode": settings.compile_mode}
    torch._dynamo.reset()
    compiled = compile_model(model, settings)
    began = time.monotonic()
    with torch.no_grad():
        output = main_outputs(compiled.eval()(**inputs))[0]
    stage.results["compile"]["forward_compile_s"] = round(time.monotonic() - began, 1)
    record(f"{label}: OrchidModel output against eager, on {device.type}", difference(output, eager, FORWARD_TOLERANCE))
    began = time.monotonic()
    training_loss(compiled.train()(**inputs)).backward()
    stage.results["compile"]["train_compile_s"] = round(time.monotonic() - began, 1)
    record(f"{label}: OrchidModel parameter gradients against eager, on {device.type}",
           gradient_difference(model, eager_grads, GRADIENT_TOLERANCE))


# ---------------------------------------------------------------------------------------------
# Stage 2: training in bf16
# ---------------------------------------------------------------------------------------------

MLM_LAYERS, MLM_STEPS = 4, 250
MASK_ID = 103  # [MASK] in bert-base-uncased's vocabulary
PROGRESSION_MODULUS = 100
MASK_PROBABILITY = 0.15
LEARNING_RATE = 8e-4  # the masked-LM recipe's peak (App. C), with its betas and epsilon
WARMUP_SHARE = 0.1
VARIANTS = ("float32", "bf16 autocast", "bf16 weights (from_config)", "bf16 weights (from_pretrained)")


def progression_batch(batch: int, length: int, vocab_size: int, generator: torch.Generator):
    """A learnable masked-LM task: each sequence counts in steps, token t = base + (start + stride * t) mod 100, with
    its own start and stride (1 to 7); 15% of the positions (at least one) are replaced by [MASK] and labelled with
    their token, so that every masked token follows from its neighbours. Returns (input_ids, labels)."""
    base = vocab_size // 2
    start = torch.randint(0, PROGRESSION_MODULUS, (batch, 1), generator=generator)
    stride = torch.randint(1, 8, (batch, 1), generator=generator)
    tokens = base + (start + stride * torch.arange(length)) % PROGRESSION_MODULUS
    masked = torch.rand(batch, length, generator=generator) < MASK_PROBABILITY
    masked[:, 0] |= ~masked.any(dim=1)
    input_ids = tokens.masked_fill(masked, MASK_ID)
    labels = tokens.masked_fill(~masked, -100)
    return input_ids, labels


def parameter_dtypes(model: nn.Module) -> dict:
    """Which parameters are float32 (names with the layer index replaced by ``*``), how many parameters of each
    dtype, and whether every parameter under a module of ``_keep_in_fp32_modules_strict`` is float32."""
    keep = list(getattr(model, "_keep_in_fp32_modules_strict", None) or [])
    counts: dict[str, int] = {}
    float32: list[str] = []
    kept = True
    for name, param in model.named_parameters():
        dtype = str(param.dtype).replace("torch.", "")
        counts[dtype] = counts.get(dtype, 0) + param.numel()
        if param.dtype == torch.float32:
            pattern = re.sub(r"\.\d+\.", ".*.", name)
            if pattern not in float32:
                float32.append(pattern)
        if any(f".{module}." in f".{name}" for module in keep) and param.dtype != torch.float32:
            kept = False
    return {"parameters_by_dtype": counts, "float32_parameters": float32, "keep_in_fp32_modules_strict": keep,
            "those_modules_stayed_float32": kept}


def build_variants(config, device: torch.device) -> tuple[dict[str, nn.Module], dict]:
    """The four models of the training stage, with the same initial weights: float32 (also trained under autocast),
    bf16 from ``from_config(config, dtype=torch.bfloat16)`` and bf16 from ``from_pretrained(folder,
    dtype=torch.bfloat16)``; and the parameter dtypes of those and of ``model.to(torch.bfloat16)``."""
    from transformers import AutoModelForMaskedLM

    from orchid_hf import OrchidForMaskedLM

    torch.manual_seed(0)
    reference = OrchidForMaskedLM(config)
    state = reference.state_dict()
    models = {"float32": copy.deepcopy(reference), "bf16 autocast": copy.deepcopy(reference)}
    try:
        from_config = AutoModelForMaskedLM.from_config(config, dtype=torch.bfloat16)
    except TypeError:  # transformers before 4.56 named it torch_dtype
        from_config = AutoModelForMaskedLM.from_config(config, torch_dtype=torch.bfloat16)
    from_config.load_state_dict(state)  # the same weights, each cast to its parameter's dtype
    models["bf16 weights (from_config)"] = from_config
    with tempfile.TemporaryDirectory(prefix="orchid-gpu-check-") as folder:
        reference.save_pretrained(folder)
        models["bf16 weights (from_pretrained)"] = OrchidForMaskedLM.from_pretrained(folder, dtype=torch.bfloat16)
    dtypes = {name: parameter_dtypes(model) for name, model in models.items() if name.startswith("bf16 weights")}
    dtypes["bf16 weights (model.to(torch.bfloat16))"] = parameter_dtypes(copy.deepcopy(reference).to(torch.bfloat16))
    return {name: model.to(device).train() for name, model in models.items()}, dtypes


def loss_verdict(curve: list[float], float32_curve: list[float]) -> dict:
    """Whether a loss curve falls (its last value below 3/4 of its first) and ends as float32's does (the difference
    of the last values within a quarter of float32's fall)."""
    first, last = curve[0], curve[-1]
    fall = float32_curve[0] - float32_curve[-1]
    return {"first": first, "last": last, "falls": last < 0.75 * first,
            "last_minus_float32": last - float32_curve[-1],
            "as_float32": abs(last - float32_curve[-1]) <= 0.25 * max(fall, 0.0)}


def stage_training(stage: Stage) -> None:
    from benchmarks.candidates import model_sizes
    from orchid_hf import OrchidConfig

    settings, sizes, device = stage.settings, stage.settings.sizes, stage.device
    config = OrchidConfig.from_preset(
        "orchid-bert-base", **dict(model_sizes(settings.tiny), num_hidden_layers=settings.mlm_layers),
        max_position_embeddings=sizes.mlm_length, hidden_dropout_prob=0.0,
    )
    models, dtypes = build_variants(config, device)
    steps = settings.mlm_steps
    results = stage.results
    results.update(model=f"OrchidForMaskedLM, orchid-bert-base with {config.num_hidden_layers} of its 12 layers "
                         f"(--mlm-layers), hidden {config.hidden_size}, vocabulary {config.vocab_size}, no dropout",
                   batch=[sizes.mlm_batch, sizes.mlm_length], planned_steps=steps, steps_done=0,
                   optimizer=f"torch.optim.AdamW(fused=True), lr {LEARNING_RATE:g}, betas (0.9, 0.98), eps 1e-6, "
                             f"no weight decay; {WARMUP_SHARE:.0%} linear warmup, then linear decay to 0; "
                             "gradient clipping 1.0",
                   task="counting sequences, 15% masked (benchmarks.gpu.progression_batch)",
                   parameter_dtypes=dtypes, curves={name: [] for name in models}, train_seconds={})
    stage.save()
    warmup = max(1, int(WARMUP_SHARE * steps))

    def schedule(step: int) -> float:
        return (step + 1) / warmup if step < warmup else max(0.0, (steps - step) / max(1, steps - warmup))

    optimizers, schedulers = {}, {}
    for name, model in models.items():
        optimizers[name] = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, betas=(0.9, 0.98), eps=1e-6,
                                             weight_decay=0.0, fused=True)
        schedulers[name] = torch.optim.lr_scheduler.LambdaLR(optimizers[name], schedule)
    seconds = dict.fromkeys(models, 0.0)
    losses: dict[str, list[torch.Tensor]] = {name: [] for name in models}
    generator = torch.Generator().manual_seed(1)

    def one_step(name: str, input_ids, labels) -> None:
        model, optimizer = models[name], optimizers[name]
        context = torch.autocast(device.type, dtype=torch.bfloat16) if name == "bf16 autocast" else (
            contextlib.nullcontext())
        with context:
            loss = model(input_ids=input_ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedulers[name].step()
        losses[name].append(loss.detach().float())

    def flush(step: int) -> None:
        for name in models:
            results["curves"][name].append([step, torch.stack(losses[name]).mean().item()])
            losses[name].clear()
        results["steps_done"] = step
        results["train_seconds"] = {name: round(value, 2) for name, value in seconds.items()}
        curves = {name: [loss for _, loss in curve] for name, curve in results["curves"].items()}
        results["verdicts"] = {name: loss_verdict(curve, curves["float32"]) for name, curve in curves.items()}
        stage.save()

    # The variants take their steps in turn on the same batches, so that a stage cut short leaves them at the same step.
    for step in range(steps):
        input_ids, labels = (tensor.to(device) for tensor in progression_batch(
            sizes.mlm_batch, sizes.mlm_length, config.vocab_size, generator))
        for name in models:
            seconds[name] += timed_call(functools.partial(one_step, name, input_ids, labels), device)
        if (step + 1) % sizes.mlm_log_every == 0 or step + 1 == steps:
            flush(step + 1)
            stage.log(f"step {step + 1}: " + ", ".join(f"{name} {curve[-1][1]:.3f}"
                                                         for name, curve in results["curves"].items()))
        if stage.left() <= 0:
            if losses["float32"]:
                flush(step + 1)
            stage.check()


# ---------------------------------------------------------------------------------------------
# Stage 3: speed and memory
# ---------------------------------------------------------------------------------------------

DTYPES = ("bf16 autocast", "float32")
MODES = ("forward", "forward_backward")
# How the time of a call grows with the length, to predict the next point: attention's quadratically, Orchid's a little
# faster than linearly (transforms of length L). Only used to skip points that would not fit in what is left.
GROWTH = {"attention": 2.0, "bert": 2.0, "orchid": 1.2, "orchid compiled": 1.2}
# The speed stage's parts and their shares of its budget (what one leaves unused goes to the next).
SPEED_PARTS = (("operator", 0.25), ("model", 0.45), ("compiled", 0.30))


class Series:
    """The points of one candidate in one dtype and mode, by growing size: what each measured point took, and why the
    series stopped (out of memory, predicted too slow, an error), after which its larger points are skipped."""

    def __init__(self):
        self.points: list[tuple[int, int, float]] = []  # (batch, length, seconds per call)
        self.first_call_s = 0.0  # the last point's first call: with torch.compile, its compilation
        self.stopped: str | None = None

    def predict(self, batch: int, length: int, growth: float) -> float | None:
        """Seconds per call at (batch, length), from the last point, growing as ``length ** growth``."""
        return predicted_seconds(self.points, batch, length, exponent=growth)


def measure_point(step: Callable[[], None], device: torch.device, repeats: int, deadline: float) -> dict:
    """Warm-up calls (the first compiles, plans transforms, tunes kernels), then up to ``repeats`` timed calls (at
    least one; fewer once ``deadline`` has passed); the median, every time, and on a GPU the peak memory of the timed
    calls above what existed before them (weights, inputs)."""
    first = timed_call(step, device)
    if first < 2.0:
        timed_call(step, device)
    times = []

    def timed_calls() -> None:
        for index in range(repeats if first < 1.0 else min(repeats, 3)):
            if index and time.monotonic() > deadline:
                break
            times.append(timed_call(step, device))

    peak = None
    if device.type == "cuda":
        peak = peak_bytes(timed_calls, device) / 2**20
    else:  # the CPU's peak would need the profiler, which would slow the timed calls
        timed_calls()
    return {"median_ms": 1e3 * statistics.median(times), "times_ms": [round(1e3 * t, 3) for t in times],
            "first_call_s": round(first, 3), "peak_mib": None if peak is None else round(peak, 1)}


class SpeedRun:
    """The speed stage's state: its points (``results["points"]``) and the series they belong to."""

    def __init__(self, stage: Stage):
        self.stage = stage
        self.settings = stage.settings
        self.device = stage.device
        self.points: list[dict] = stage.results.setdefault("points", [])
        self.series: dict[tuple, Series] = {}
        self.operator_hidden, self.operator_heads = (64, 4) if stage.settings.tiny else (768, 12)

    def run_point(self, part: str, candidate: str, module: nn.Module | None, dtype: str, mode: str, batch: int,
                  length: int, deadline: float, extra: dict | None = None) -> None:
        """Measure one point, or record why not (a smaller point of its series ran out of memory or failed; it is
        predicted not to fit in what is left of the part's time). Inputs: random (B, L, hidden) for the operator,
        random token ids for a model."""
        point = {"part": part, "candidate": candidate, "dtype": dtype, "mode": mode, "batch": batch, "length": length,
                 **(extra or {})}
        series = self.series.setdefault((part, candidate, dtype, mode), Series())
        repeats = self.settings.sizes.speed_repeats
        predicted = series.predict(batch, length, GROWTH[candidate])
        # A compiled candidate compiles again at every point (its transform length is the input's).
        overhead = series.first_call_s if part == "compiled" else 0.0
        if module is None:
            series.stopped = point["failed"] = f"out of memory building the module at ({batch}, {length})"
        elif series.stopped:
            point["skipped"] = series.stopped
        elif time.monotonic() > deadline:
            point["skipped"] = "the part's share of the stage's budget ran out"
        elif predicted is not None and overhead + predicted * (repeats + 2) > deadline - time.monotonic():
            compiling = f" and {overhead:.0f} s to compile" if overhead else ""
            last_batch, last_length, _ = series.points[-1]
            series.stopped = point["skipped"] = (f"predicted {predicted:.2f} s per call from ({last_batch}, "
                                                 f"{last_length}){compiling}: more than the part's time left")
        else:
            wrapped = Autocast(module, self.device.type) if dtype == "bf16 autocast" else module
            step = inputs = None
            try:
                if part == "operator":
                    inputs = torch.randn(batch, length, self.operator_hidden, device=self.device)
                else:
                    inputs = torch.randint(1, module.config.vocab_size, (batch, length), device=self.device)
                step = make_step(wrapped, mode, inputs, is_model=part != "operator")
                point.update(measure_point(step, self.device, repeats, deadline))
                series.points.append((batch, length, point["median_ms"] / 1e3))
                series.first_call_s = point["first_call_s"]
            except Exception as error:  # recorded; this series stops, the others go on
                reason = "out of memory" if is_out_of_memory(error) else f"error: {error!r}"[:300]
                self.free_memory()
                series.stopped = f"{reason} at ({batch}, {length})"
                point["failed"] = reason
                if not is_out_of_memory(error):
                    point["traceback"] = traceback.format_exc()[-3000:]
            finally:
                del step, wrapped, inputs
        self.points.append(point)
        self.stage.save()
        self.stage.check()

    def free_memory(self) -> None:
        """After a module is dropped, or a point ran out of memory: on a GPU, collect what cycles hold and return the
        cached blocks, so that the next (larger) point starts from free memory. (A collection costs a fraction of a
        second once torch.compile is imported: once per module, not per point.)"""
        if self.device.type == "cuda":
            gc.collect()
            torch.cuda.empty_cache()

    def build(self, build: Callable[..., nn.Module], *args) -> nn.Module | None:
        """``build(*args)`` on the device; None where it runs out of memory."""
        try:
            return built_on(self.device, build, *args)
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            return None

    def operator_part(self, deadline: float) -> bool:
        """The operator against an attention block of its width (QKV projection, SDPA, output projection): in bf16
        SDPA runs its flash kernel (forced on a GPU), in float32 its default. Returns whether the part was cut."""
        hidden, heads = self.operator_hidden, self.operator_heads
        flash = self.device.type == "cuda"
        self.stage.results["operator"] = {
            "orchid": f"OrchidOperator({hidden}, max_len=L), DCT, Type I conditioning",
            "attention": f"benchmarks.candidates.AttentionBlock({hidden}, {heads} heads): SDPA "
                         + ("flash backend (forced) in bf16, default backend in float32" if flash else
                            "default backend"),
        }
        for batch, length in self.settings.speed_shapes:
            if time.monotonic() > deadline:
                return True
            for candidate in ("orchid", "attention"):
                if candidate == "orchid":
                    module = self.build(build_operator, "orchid", hidden, heads, length)
                else:
                    module = self.build(AttentionBlock, hidden, heads)
                for dtype in DTYPES:
                    if module is not None and candidate == "attention":
                        module.backend = "flash" if flash and dtype == "bf16 autocast" else "default"
                    for mode in MODES:
                        self.run_point("operator", candidate, module, dtype, mode, batch, length, deadline)
                del module
                self.free_memory()
        return False

    def model_part(self, deadline: float) -> bool:
        """``OrchidModel`` (orchid-bert-base, ``max_position_embeddings = L``) against ``BertModel`` (SDPA) of the same
        size, eager. Returns whether the part was cut."""
        layers = 2 if self.settings.tiny else 12
        for batch, length in self.settings.speed_shapes:
            if time.monotonic() > deadline:
                return True
            for candidate in ("orchid", "bert"):
                module = self.build(build_model, candidate, self.settings.tiny, length, None, layers)
                for dtype in DTYPES:
                    for mode in MODES:
                        self.run_point("model", candidate, module, dtype, mode, batch, length, deadline)
                del module
                self.free_memory()
        return False

    def compiled_part(self, deadline: float) -> bool:
        """``torch.compile`` of the Orchid model, in bf16 autocast (what training on a GPU uses); each shape is a new
        model (its transform length is L) and a new compilation, whose time is the first call's. Returns whether the
        part was cut."""
        settings = self.settings
        layers = 2 if settings.tiny else 12
        shapes = settings.speed_shapes[: settings.sizes.compiled_shapes]
        for batch, length in shapes:
            if time.monotonic() > deadline:
                return True
            torch._dynamo.reset()
            module = self.build(build_model, "orchid", settings.tiny, length, None, layers)
            if module is not None:
                module = compile_model(module, settings)
            for mode in ("forward_backward", "forward"):
                self.run_point("compiled", "orchid compiled", module, "bf16 autocast", mode, batch, length, deadline,
                               extra={"compile_backend": settings.compile_backend,
                                      "compile_scope": settings.compile_scope, "compile_mode": settings.compile_mode})
            del module
            self.free_memory()
        return False


def stage_speed(stage: Stage) -> None:
    run = SpeedRun(stage)
    stage.results.update(
        model="OrchidModel (orchid-bert-base, max_position_embeddings = L) against transformers' BertModel of the "
              "same width, depth and intermediate size (SDPA, max_position_embeddings = max(L, 512)), random weights, "
              "no padding",
        timing="CUDA events around each call (the wall clock on the CPU); the median of the timed calls after two "
               "warm-up calls (one where the first took over 2 s); forward in eval mode under inference_mode, "
               "forward_backward in train mode with a random output gradient (no optimizer step)",
        float32_matmul_precision=torch.get_float32_matmul_precision(),
        parts={},
    )
    parts = {"operator": run.operator_part, "model": run.model_part, "compiled": run.compiled_part}
    share = 0.0
    for name, fraction in SPEED_PARTS:
        share += fraction
        deadline = min(stage.started + share * stage.budget_s, stage.deadline)
        stage.results["parts"][name] = "running"
        cut = parts[name](deadline)
        stage.results["parts"][name] = "cut (its share of the budget ran out)" if cut else "completed"
        stage.save()
        stage.log(f"{name} part {stage.results['parts'][name]}")
        release_memory()


# ---------------------------------------------------------------------------------------------
# Stage 4: associative recall
# ---------------------------------------------------------------------------------------------

EVALUATIONS_PER_RUN = 8


def stage_recall(stage: Stage) -> None:
    """Associative recall (``experiments/recall.py``, its defaults: the ``orchid-recall`` preset, AdamW lr 2e-3 with
    warmup then cosine decay) at each length and vocabulary, each run on an equal share of what is left of the stage.
    A short probe times a step first, and the schedule's length is set so that it ends within the run's share; the
    held-out set is evaluated ``EVALUATIONS_PER_RUN`` times along it."""
    from experiments.recall import RecallConfig, train

    settings, sizes, device = stage.settings, stage.settings.sizes, stage.device
    defaults = RecallConfig()
    runs = [(vocab, length) for length in settings.recall_lengths for vocab in settings.recall_vocabs]
    runs.sort(key=lambda run: (run[0] != settings.recall_vocabs[0], run[1]))  # the first vocabulary's lengths first
    results = stage.results.setdefault("runs", [])
    stage.results["recipe"] = (f"experiments/recall.py defaults: lr {defaults.lr:g}, warmup {defaults.warmup_steps} "
                               f"steps (a tenth of a shorter schedule), cosine decay to 0, batch {sizes.recall_batch}, "
                               f"weight decay {defaults.weight_decay:g}, gradient clipping {defaults.grad_clip:g}; "
                               f"held-out set of {sizes.recall_eval_size} sequences")
    for index, (vocab, length) in enumerate(runs):
        share = stage.left() / (len(runs) - index)
        run_deadline = time.monotonic() + share
        base = RecallConfig(vocab_size=vocab, seq_len=length, batch_size=sizes.recall_batch,
                            eval_size=sizes.recall_eval_size, threads=torch.get_num_threads())
        entry = {"vocab_size": vocab, "seq_len": length, "share_s": round(share, 1)}
        results.append(entry)
        # The probe: a few steps of a throwaway model, for the time of a step (an overestimate: it includes the build
        # and the first calls).
        probe = sizes.recall_probe_steps
        began = time.monotonic()
        train(dataclasses.replace(base, steps=probe, eval_every=probe, eval_size=base.batch_size,
                                  warmup_steps=1), progress=False, device=device)
        step_s = (time.monotonic() - began) / probe
        evaluation_s = step_s * base.eval_size / (3 * base.batch_size)  # a forward is about a third of a step
        left = run_deadline - time.monotonic()
        fits = int((0.9 * left - EVALUATIONS_PER_RUN * evaluation_s) / step_s)
        steps = min(sizes.recall_max_steps or defaults.steps, fits)
        entry.update(probe_step_s=round(step_s, 4), planned_steps=steps)
        if steps < EVALUATIONS_PER_RUN:
            entry["skipped"] = f"a step takes {step_s:.3f} s: {left:.0f} s leave room for {max(steps, 0)} steps"
            stage.save()
            stage.check()
            continue
        config = dataclasses.replace(base, steps=steps, warmup_steps=min(defaults.warmup_steps, steps // 10),
                                     eval_every=math.ceil(steps / EVALUATIONS_PER_RUN))
        stage.log(f"vocabulary {vocab}, length {length}: {steps} steps ({step_s * 1e3:.1f} ms per probe step)")
        result = train(config, progress=False, device=device,
                       stop=lambda deadline=run_deadline: time.monotonic() > deadline or stage.left() <= 0)
        entry.update(config={k: v for k, v in dataclasses.asdict(config).items() if k != "config_overrides"},
                     **{k: result[k] for k in ("parameters", "finished", "steps_done", "test_accuracy",
                                               "best_test_accuracy", "seconds", "curve")})
        stage.save()
        stage.check()


# ---------------------------------------------------------------------------------------------
# Stage 5: the needle benchmark at long lengths
# ---------------------------------------------------------------------------------------------

NEEDLE_SPLITS = ("train", "validation", "test")  # the folders of --needle-texts


def needle_length_entry(results: dict, length: int) -> dict:
    """A needle run's ``results.json`` of one length and the pass key alone: its accuracy over all haystacks and by
    depth, the share of needles in the model's window, seconds per haystack and the peak memory of reading one."""
    speed = results["speed_and_memory"][str(length)]
    return {
        "accuracy": results["overall_accuracy"],
        "by_depth": results["accuracy"]["passkey"][str(length)],
        "haystacks": speed["examples"],
        "needle_in_window": sum(c["needle_in_window"] * c["examples"] for c in results["cells"]) / speed["examples"],
        "read_tokens": speed["read_tokens"],
        "seconds_per_haystack": speed["seconds_per_example"],
        "peak_memory_mib": speed["peak_memory_mib"],
    }


def stage_needle(stage: Stage) -> None:
    """The needle benchmark's pass key (``experiments/needle.py``) for ``--needle-model`` and, where given,
    ``--needle-baseline`` (a model of a fixed window, BERT say, which reads the last tokens of a longer haystack):
    each fine-tuned at its own learning rate (``--needle-learning-rate``, ``--needle-baseline-learning-rate``) on
    pass-key haystacks from the texts' ``train/`` files at each of ``--needle-train-lengths`` in turn, every length
    from the model the last one left (a model fine-tuned straight at 2,048 tokens stays at chance, one that learned
    the pass key at 128 tokens first learns it there: the curriculum of docs/results/needle.md), its accuracy on
    haystacks of that length from ``validation/`` and ``test/`` recorded; then scored on haystacks from ``test/``
    at each of ``--needle-lengths``, shortest first; a length that does not fit in the device's memory ends that
    model's lengths."""
    from experiments.needle import run_needle_benchmark

    settings, sizes = stage.settings, stage.settings.sizes
    texts = {split: [settings.needle_texts / split] for split in NEEDLE_SPLITS}
    models = [("model", settings.needle_model, None, settings.needle_learning_rate)]
    if settings.needle_baseline is not None:
        models.append(("baseline", settings.needle_baseline, "left", settings.needle_baseline_learning_rate))
    ladder = settings.needle_train_lengths
    stage.results["recipe"] = (
        f"pass key; fine-tuned for {sizes.needle_steps} steps of {sizes.needle_batch} haystacks at each of "
        f"{', '.join(f'{n:,}' for n in ladder)} tokens in turn ({sizes.needle_train_examples} a length, drawn from "
        f"the train files) at lr {settings.needle_learning_rate:g}"
        + (f" (the baseline at {settings.needle_baseline_learning_rate:g})" if settings.needle_baseline else "")
        + f"; {sizes.needle_examples} test haystacks per depth "
        f"({', '.join(f'{d:g}%' for d in sizes.needle_depths)}) and length")
    runs = stage.results.setdefault("models", {})
    common = dict(tasks=("passkey",), depths=sizes.needle_depths, examples_per_cell=sizes.needle_examples,
                  device=str(stage.device), progress=False, heatmaps=False)  # fmt: skip
    with tempfile.TemporaryDirectory() as work:
        for role, path, truncation, learning_rate in models:
            entry = runs.setdefault(role, {"path": str(path), "learning_rate": learning_rate, "lengths": {},
                                           "finetuning": []})  # fmt: skip
            model = path
            for length in ladder:
                stage.check()
                stage.log(f"{role}: fine-tuning at {length} tokens")
                with warnings.catch_warnings():  # one learning rate, on purpose: its "edge of the grid" warning is moot
                    warnings.filterwarnings("ignore", message="the best learning rate on the validation haystacks")
                    tuned = run_needle_benchmark(
                        model, texts["test"], Path(work) / f"{role}-train{length}", train_files=texts["train"],
                        validation_files=texts["validation"], lengths=(length,),
                        learning_rates=(learning_rate,), train_examples=sizes.needle_train_examples,
                        max_steps=sizes.needle_steps, batch_size=sizes.needle_batch, truncation_side=truncation,
                        save_model=True, **common)  # fmt: skip
                model = Path(work) / f"{role}-train{length}" / "model"
                run = tuned["finetuning"]["runs"][0]
                entry["how"] = tuned["how"]
                entry["finetuning"].append({"length": length, **{key: run[key] for key in (
                    "train_seconds", "train_loss_first", "train_loss_last", "validation_accuracy")}})  # fmt: skip
                entry["lengths"][str(length)] = needle_length_entry(tuned, length)
                stage.save()
            for length in settings.needle_lengths:
                stage.check()
                try:
                    scored = run_needle_benchmark(model, texts["test"], Path(work) / f"{role}-{length}",
                                                  lengths=(length,), finetune=False, truncation_side=truncation,
                                                  **common)  # fmt: skip
                except Exception as error:
                    if not is_out_of_memory(error):
                        raise
                    entry["lengths"][str(length)] = {"out_of_memory": str(error).splitlines()[0]}
                    release_memory()
                    stage.save()
                    break
                entry["lengths"][str(length)] = needle_length_entry(scored, length)
                stage.log(f"{role}: {length} tokens, {100 * entry['lengths'][str(length)]['accuracy']:.0f}%")
                stage.save()


# ---------------------------------------------------------------------------------------------
# The Markdown report
# ---------------------------------------------------------------------------------------------


def render_markdown(data: dict) -> str:
    machine = data.get("machine", {})
    gpu = machine.get("gpu", {})
    lines = [
        "# Orchid on a GPU: correctness, bf16 training, speed and associative recall",
        "",
        f"Command: `{data.get('command')}`; {commit_text(data)}"
        f"{' (no git here: pass --commit)' if data.get('commit') is None else ''}; started {data.get('started')}, "
        f"last written {data.get('updated')}{'' if data.get('finished') else ' (the run had not finished)'}.",
        "",
        f"Machine: {machine.get('device')} ({gpu.get('memory_gib', '?')} GiB, compute capability "
        f"{gpu.get('capability', '?')}), CUDA {machine.get('cuda')}; host {machine_text(machine)}; "
        + ", ".join(f"{name} {version}" for name, version in machine.get("versions", {}).items() if version)
        + f"; Python {machine.get('python')}. orchid_hf: {data.get('orchid_hf_source')}.",
        "",
    ]
    if data.get("import_error"):
        lines += ["orchid_hf could not be imported:", "", "```", data["import_error"].rstrip(), "```", ""]
    rows = []
    for name, record in data.get("stages", {}).items():
        status = record.get("status", "not run")
        if record.get("reason"):
            status += f" ({record['reason']})"
        rows.append([name, status, record.get("seconds", ""), record.get("budget_s", "")])
    lines += table_lines(["stage", "status", "seconds", "budget s"], rows) + [""]
    renderers = {"correctness": markdown_correctness, "training": markdown_training, "speed": markdown_speed,
                 "recall": markdown_recall, "needle": markdown_needle}
    for name, record in data.get("stages", {}).items():
        lines += [f"## {name.capitalize()}", ""]
        if record.get("error"):
            lines += ["The stage stopped on an exception:", "", "```", record["error"].rstrip(), "```", ""]
        if record.get("results"):
            lines += renderers[name](record["results"])
    return "\n".join(lines) + "\n"


def number(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def markdown_correctness(results: dict) -> list[str]:
    checks = results.get("checks", [])
    failed = [check for check in checks if not check["passed"]]
    lines = [f"{len(checks) - len(failed)} of {len(checks)} checks passed. Differences: the largest absolute one, and "
             "that relative to the largest magnitude of the reference (for gradients, of each parameter's). "
             + (results.get("tensorfloat32", "") and f"TensorFloat-32 {results['tensorfloat32']}."), ""]
    if "compile" in results:
        lines += [f"torch.compile: {results['compile']}", ""]
    rows = []
    for check in checks:
        name = check["check"] + (f" (worst: {check['worst_parameter']})" if check.get("worst_parameter") else "")
        name += f" ({check['detail']})" if check.get("detail") else ""
        rows.append([name, number(check["max_abs"]), number(check["max_rel"]), number(check["tolerance"]),
                     "yes" if check["passed"] else "**no**"])
    return lines + table_lines(["check", "max abs", "max rel", "tolerance", "passed"], rows) + [""]


def markdown_training(results: dict) -> list[str]:
    rows = [[name, f"{verdict['first']:.3f}", f"{verdict['last']:.3f}", verdict["falls"],
             f"{verdict['last_minus_float32']:+.3f}", verdict["as_float32"], results.get("train_seconds", {}).get(name)]
            for name, verdict in results.get("verdicts", {}).items()]  # fmt: skip
    header = ["variant", "first loss", "last loss", "falls", "last - float32's", "as float32", "train seconds"]
    lines = [f"{results.get('model')}; batch {results.get('batch')}; {results.get('steps_done')} of "
             f"{results.get('planned_steps')} steps; {results.get('optimizer')}; task: {results.get('task')}.", "",
             *table_lines(header, rows)]
    lines += ["", "Loss curves (step: mean loss over the steps since the previous point):", ""]
    for name, curve in results.get("curves", {}).items():
        lines.append(f"- {name}: " + ", ".join(f"{step}: {loss:.3f}" for step, loss in curve))
    lines += ["", "Parameters by dtype:", ""]
    for name, dtypes in results.get("parameter_dtypes", {}).items():
        lines.append(f"- {name}: {dtypes['parameters_by_dtype']}; the modules of _keep_in_fp32_modules_strict "
                     f"({', '.join(dtypes['keep_in_fp32_modules_strict'])}) stayed float32: "
                     f"{dtypes['those_modules_stayed_float32']}; float32 parameters: "
                     + (", ".join(f"`{p}`" for p in dtypes["float32_parameters"]) or "none"))
    return lines + [""]


def point_text(point: dict | None) -> str:
    if point is None:
        return "-"
    if "median_ms" in point:
        return f"{point['median_ms']:,.2f}"
    return point.get("failed") or ("skipped" if point.get("skipped") else "-")


def ratio(numerator: dict | None, denominator: dict | None) -> str:
    if not numerator or not denominator or "median_ms" not in numerator or "median_ms" not in denominator:
        return "-"
    return f"{numerator['median_ms'] / denominator['median_ms']:.2f}x"


def peak_text(*points) -> str:
    return " / ".join(number(point.get("peak_mib"), 5) if point else "-" for point in points)


def markdown_speed(results: dict) -> list[str]:
    points = results.get("points", [])
    index = {(p["part"], p["candidate"], p["dtype"], p["mode"], p["batch"], p["length"]): p for p in points}
    shapes = sorted({(p["batch"], p["length"]) for p in points}, key=lambda shape: (shape[1], -shape[0]))
    lines = [f"Parts: {results.get('parts')}. {results.get('model', '')}. Timing: {results.get('timing', '')}. "
             "Ratios are the baseline's time divided by Orchid's (above 1, Orchid is faster); peaks are MiB above the "
             "weights and inputs.", ""]
    operator = results.get("operator", {})
    for dtype in DTYPES:
        for mode in MODES:
            rows = []
            for batch, length in shapes:
                orchid = index.get(("operator", "orchid", dtype, mode, batch, length))
                attention = index.get(("operator", "attention", dtype, mode, batch, length))
                if orchid or attention:
                    rows.append([f"({batch}, {length})", point_text(orchid), point_text(attention),
                                 ratio(attention, orchid), peak_text(orchid, attention)])
            if rows:
                header = ["(B, L)", "Orchid ms", "attention ms", "speed-up", "peak MiB Orchid / attention"]
                lines += [f"### Operator, {dtype}, {mode}", "",
                          f"{operator.get('orchid', 'Orchid')} against {operator.get('attention', 'attention')}.", "",
                          *table_lines(header, rows), ""]
    for dtype in DTYPES:
        for mode in MODES:
            rows = []
            for batch, length in shapes:
                orchid = index.get(("model", "orchid", dtype, mode, batch, length))
                compiled = index.get(("compiled", "orchid compiled", dtype, mode, batch, length))
                bert = index.get(("model", "bert", dtype, mode, batch, length))
                if orchid or bert or compiled:
                    rows.append([f"({batch}, {length})", point_text(orchid), point_text(compiled), point_text(bert),
                                 ratio(bert, orchid), ratio(bert, compiled), ratio(orchid, compiled),
                                 peak_text(orchid, compiled, bert),
                                 number(compiled.get("first_call_s")) if compiled else "-"])
            if rows:
                header = ["(B, L)", "Orchid ms", "Orchid compiled ms", "BERT ms", "speed-up", "speed-up compiled",
                          "compiled / eager speed-up", "peak MiB Orchid / compiled / BERT", "compiled: first call s"]
                lines += [f"### Model, {dtype}, {mode}", "", *table_lines(header, rows), ""]
    notes = [p for p in points if p.get("skipped") or p.get("failed")]
    if notes:
        lines += ["Points not measured:", ""]
        lines += [f"- {p['part']}, {p['candidate']}, {p['dtype']}, {p['mode']}, ({p['batch']}, {p['length']}): "
                  f"{p.get('failed') or p.get('skipped')}" for p in notes]
        lines.append("")
    return lines


def markdown_recall(results: dict) -> list[str]:
    rows = []
    for run in results.get("runs", []):
        if "curve" not in run:
            rows.append([run["vocab_size"], run["seq_len"], f"- / {run.get('planned_steps', '-')}", "-", "-", "-",
                         run.get("skipped", "not run")])
            continue
        rows.append([run["vocab_size"], run["seq_len"], f"{run['steps_done']} / {run['planned_steps']}",
                     f"{100 * run['test_accuracy']:.1f}%", f"{100 * run['best_test_accuracy']:.1f}%", run["seconds"],
                     run["finished"]])
    header = ["vocabulary", "length", "steps done / planned", "final accuracy", "best accuracy", "seconds", "finished"]
    lines = [f"Recipe: {results.get('recipe')}.", "", *table_lines(header, rows)]
    lines += ["", "Held-out accuracy against steps:", ""]
    for run in results.get("runs", []):
        if run.get("curve"):
            lines.append(f"- vocabulary {run['vocab_size']}, length {run['seq_len']}: "
                         + ", ".join(f"{p['step']}: {100 * p['test_accuracy']:.1f}%" for p in run["curve"]))
    return lines + [""]


def markdown_needle(results: dict) -> list[str]:
    rows, models = [], results.get("models", {})
    for role, entry in models.items():
        for tuned in entry.get("finetuning", []):
            rows.append([role, f"fine-tuning at {tuned['length']:,}", f"{100 * tuned['validation_accuracy']:.0f}% "
                         "(validation)", "", "", "", f"{tuned['train_seconds']:.0f} s, training loss "
                         f"{tuned['train_loss_first']:.2f} to {tuned['train_loss_last']:.2f}"])  # fmt: skip
        for length, point in entry.get("lengths", {}).items():
            if "out_of_memory" in point:
                rows.append([role, f"{int(length):,}", "-", "-", "-", "-", f"out of memory: {point['out_of_memory']}"])
                continue
            depths = " / ".join(f"{100 * value:.0f}" for value in point["by_depth"].values())
            inside = point["needle_in_window"]
            window = "" if inside == 1 else f"needle in the window: {100 * inside:.0f}%"
            rows.append([role, f"{int(length):,}", f"{100 * point['accuracy']:.0f}%", depths,
                         f"{point['seconds_per_haystack']:.3f}", f"{point['peak_memory_mib']:.0f}", window])
    header = ["model", "tokens", "accuracy", "by depth (%)", "seconds per haystack", "peak MiB", ""]
    paths = "; ".join(f"{role}: {entry['path']} ({entry.get('how', '')})" for role, entry in models.items())
    return [f"Recipe: {results.get('recipe')}. Models: {paths}.", "", *table_lines(header, rows), ""]


# ---------------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------------

STAGE_FUNCTIONS = {"correctness": stage_correctness, "training": stage_training, "speed": stage_speed,
                   "recall": stage_recall, "needle": stage_needle}


def positive_seconds(text: str) -> float:
    """A budget in seconds: a finite number above 0 (argparse names the flag when this refuses)."""
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def parse_args(argv: list[str] | None = None) -> CheckSettings:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", default=None,
                        help="folder of gpu_check.json and gpu_check.md (default: $OUT, the folder whose files come "
                             "back from the GPU machine)")
    parser.add_argument("--device", default="cuda", help="cuda (the check), or cpu with --tiny (a smoke test)")
    parser.add_argument("--tiny", action="store_true", help="every stage at toy sizes, in seconds")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's own on a GPU machine; 1 with --device cpu, where toy "
                             "models run faster on one thread of a shared machine)")
    parser.add_argument("--commit", default=None, help="the commit of the tree, where git cannot tell (a copied tree)")
    parser.add_argument("--stages", default=",".join(DEFAULT_STAGES),
                        help="comma-separated, from " + ", ".join(STAGES))
    for name in STAGES:
        parser.add_argument(f"--budget-{name}", type=positive_seconds, default=None, metavar="S",
                            help=f"seconds for the {name} stage (default {BUDGETS[name]:g}; "
                                 f"{TINY_BUDGETS[name]:g} with --tiny)")
    parser.add_argument("--total-budget-s", type=positive_seconds, default=None,
                        help=f"seconds for the whole run from start-up; later stages get what is left "
                             f"(default {TOTAL_BUDGET_S:g}; {TINY_TOTAL_BUDGET_S:g} with --tiny)")
    parser.add_argument("--compile-backend", default=None,
                        help="torch.compile backend (default inductor; eager, Dynamo's tracing alone, with --tiny on "
                             "the CPU, where inductor compiles C++ for minutes)")
    parser.add_argument("--compile-scope", default="layers", choices=("layers", "model"),
                        help="compile each encoder layer (regional compilation: identical layers compile once) or "
                             "the whole model")
    parser.add_argument("--compile-mode", default="default",
                        help="torch.compile mode (default, reduce-overhead, max-autotune, ...)")
    parser.add_argument("--mlm-layers", type=int, default=None,
                        help=f"layers of the training stage's OrchidForMaskedLM (default {MLM_LAYERS}: four variants "
                             "of the 12-layer preset take their steps in turn, and eager steps of small batches cost "
                             "about the same per layer whatever the width; 2 with --tiny)")
    parser.add_argument("--mlm-steps", type=int, default=None,
                        help=f"its steps (default {MLM_STEPS}; 20 with --tiny)")
    parser.add_argument("--speed-shapes", default=None, metavar="SHAPES",
                        help="BxL shapes of the speed stage (default 8x128,8x512,1x2048,...,1x65536)")
    parser.add_argument("--recall-vocabs", default=None,
                        help="vocabularies of the recall stage (default 20,30; 20 with --tiny)")
    parser.add_argument("--recall-lengths", default=None, help="its lengths (default 2048,8192; 32,64 with --tiny)")
    parser.add_argument("--needle-model", type=Path, default=None,
                        help="the needle stage's masked-LM checkpoint folder (with its tokenizer)")
    parser.add_argument("--needle-baseline", type=Path, default=None,
                        help="a second checkpoint for the needle stage, read as a model of a fixed window (the last "
                             "tokens of a longer haystack): BERT")
    parser.add_argument("--needle-texts", type=Path, default=None,
                        help="a folder with train/, validation/ and test/ folders of text files (the haystacks)")
    parser.add_argument("--needle-lengths", default=None,
                        help="haystack lengths scored (default 32768,65536,131072; 256,512 with --tiny)")
    parser.add_argument("--needle-train-lengths", default=None,
                        help="the fine-tuning haystacks' lengths, trained in turn, each from the model the last left "
                             "(default 128,512,2048,8192; 64,128 with --tiny)")
    parser.add_argument("--needle-learning-rate", type=float, default=1e-3,
                        help="--needle-model's fine-tuning learning rate, at every length of the ladder (the one at "
                             "which orchid-bert-long's settings learned the pass key at 128 tokens in each of three "
                             "seeds, up the curriculum of docs/results/needle.md; at 3e-3, the rate seed 0 chose on "
                             "validation, one seed of three did not learn, and a stage that has not learned leaves "
                             "every later one at chance)")
    parser.add_argument("--needle-baseline-learning-rate", type=float, default=1e-3,
                        help="--needle-baseline's fine-tuning learning rate (the one BERT 128 chose on the validation "
                             "haystacks of docs/results/needle.md)")
    parser.add_argument("--fail-stage", default=None, choices=STAGES,
                        help="raise an exception at the start of this stage (to see that the report records it and "
                             "the next stage runs)")
    args = parser.parse_args(argv)
    out = args.out or os.environ.get("OUT")
    if not out:
        parser.error("give --out DIR, or set $OUT (on the GPU machine, the folder whose files come back)")
    if args.device != "cpu" and not args.device.startswith("cuda"):
        parser.error(f"--device must be cuda (optionally cuda:N) or cpu, got {args.device!r}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: this torch ({torch.__version__}) sees no CUDA device; use --device cpu "
                     "--tiny for a smoke test")
    try:
        stages = parse_names(args.stages, "stages", STAGES)
        shapes = parse_shapes(args.speed_shapes, "speed_shapes") if args.speed_shapes else None
        vocabs = parse_lengths(args.recall_vocabs or ("20" if args.tiny else "20,30"), "recall_vocabs")
        lengths = parse_lengths(args.recall_lengths, "recall_lengths") if args.recall_lengths else None
        needle_lengths = parse_lengths(args.needle_lengths or ("256,512" if args.tiny else "32768,65536,131072"),
                                       "needle_lengths")  # fmt: skip
        needle_ladder = parse_lengths(args.needle_train_lengths or ("64,128" if args.tiny else "128,512,2048,8192"),
                                      "needle_train_lengths")  # fmt: skip
    except ValueError as error:
        parser.error(str(error))
    if "needle" in stages:
        if args.needle_model is None or args.needle_texts is None:
            parser.error("the needle stage needs --needle-model (a masked-LM checkpoint folder) and --needle-texts")
        missing = [split for split in NEEDLE_SPLITS if not (args.needle_texts / split).is_dir()]
        if missing:
            parser.error(f"--needle-texts {args.needle_texts} has no folder {', '.join(missing)}: it needs "
                         f"{', '.join(NEEDLE_SPLITS)}")  # fmt: skip
    budgets = dict(TINY_BUDGETS if args.tiny else BUDGETS)
    budgets.update({name: value for name in STAGES if (value := getattr(args, f"budget_{name}")) is not None})
    check_at_least(parser, args, "--mlm-layers", "--mlm-steps", "--threads")
    for flag in ("--needle-learning-rate", "--needle-baseline-learning-rate"):
        if not (value := getattr(args, flag[2:].replace("-", "_"))) > 0:
            parser.error(f"{flag} must be > 0, got {value}")
    sizes = TINY_SIZES if args.tiny else GPU_SIZES
    command = " ".join(["python3 scripts/gpu_check.py"] + (sys.argv[1:] if argv is None else list(argv)))
    return CheckSettings(
        out=Path(out), device=args.device, tiny=args.tiny, command=command,
        threads=args.threads or (1 if args.device == "cpu" else torch.get_num_threads()),
        commit=args.commit,
        stages=stages, budgets=budgets,
        total_budget_s=args.total_budget_s if args.total_budget_s is not None else (
            TINY_TOTAL_BUDGET_S if args.tiny else TOTAL_BUDGET_S),
        fail_stage=args.fail_stage,
        compile_backend=args.compile_backend or ("eager" if args.tiny and args.device == "cpu" else "inductor"),
        compile_scope=args.compile_scope,
        compile_mode=args.compile_mode,
        mlm_layers=args.mlm_layers or (2 if args.tiny else MLM_LAYERS),
        mlm_steps=args.mlm_steps or (20 if args.tiny else MLM_STEPS),
        speed_shapes=shapes or list(sizes.speed_shapes), recall_vocabs=vocabs,
        recall_lengths=lengths or ([32, 64] if args.tiny else [2048, 8192]),
        needle_model=args.needle_model, needle_baseline=args.needle_baseline, needle_texts=args.needle_texts,
        needle_lengths=needle_lengths, needle_train_lengths=needle_ladder,
        needle_learning_rate=args.needle_learning_rate,
        needle_baseline_learning_rate=args.needle_baseline_learning_rate,
    )


def main(argv: list[str] | None = None, functions: dict[str, Callable[[Stage], None]] | None = None) -> dict:
    """Run the check; return the report's data. ``functions`` replaces stage functions (for tests)."""
    settings = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here needs the Hub; the machine may not reach it
    torch.set_num_threads(settings.threads)
    device = torch.device(settings.device)
    data = {
        "command": settings.command,
        **provenance(settings.threads, device, settings.commit),
        "started": now_utc(),
        "finished": False,
        "settings": settings.to_json(),
        "stages": {name: {"status": "not run", "budget_s": settings.budgets[name], "results": {}}
                   for name in settings.stages},
    }
    print(f"GPU check: {data['machine'].get('device')}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"versions {data['machine']['versions']}", flush=True)
    report = Report(settings.out, data)
    report.save()
    try:
        data["orchid_hf_source"] = import_orchid_hf()
        import orchid_hf

        data["orchid_hf_source"] += f" ({Path(orchid_hf.__file__).parent})"
    except Exception:
        data["import_error"] = traceback.format_exc()
        for record in data["stages"].values():
            record.update(status="error", error="orchid_hf could not be imported (see import_error)")
        report.save()
        return data
    data["finished"] = run_stages(settings, report, {**STAGE_FUNCTIONS, **(functions or {})})
    data["seconds"] = round(time.monotonic() - settings.started, 1)
    report.save()
    print(f"GPU check: wrote {settings.out / JSON_NAME} and {settings.out / MARKDOWN_NAME} after {data['seconds']} s",
          flush=True)
    return data
