"""What the benchmark compares: one registry of candidates, each declared once with the modules it can build, and the
calls (steps) that are timed on them.

A candidate builds up to three kinds of module: ``operator`` (a sequence mixer, (B, L, d) -> (B, L, d)), ``model`` (a
base model of orchid-bert-base's size) and ``masked_lm`` (the train part's model, with its MLM loss). Every candidate
is reached through public entry points only. ``orchid_reference`` is another version of the model code, given as a
``modeling/`` folder (``--reference PATH``) and built through that version's own ``OrchidConfig.from_preset`` and
classes, with this version's implicit-filter sizes where it has those settings (``FILTER_SIZE_FIELDS``), so that the
two versions run models of the same size.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

MLM_PROBABILITY = 0.15  # share of positions with a label, as in BERT's pre-training
LEARNING_RATE = 1e-4
MODULE_KINDS = ("operator", "model", "masked_lm")
REFERENCE = "orchid_reference"  # the candidate built from another version's model code (--reference)

# The tables a candidate can run in: the operator part, the model part, and the train part's two levels.
TABLES = ("operator", "model", "train_model", "train_operator")
TABLE_MODULE = {"operator": "operator", "model": "model", "train_model": "masked_lm", "train_operator": "operator"}


# ---------------------------------------------------------------------------------------------
# The modules
# ---------------------------------------------------------------------------------------------


class AttentionBlock(nn.Module):
    """Multi-head self-attention with the Orchid operator's interface: (B, L, d) -> (B, L, d). ``backend``: SDPA's
    choice (``"default"``), or its ``"math"`` (L x L scores) or ``"flash"`` kernel forced."""

    def __init__(self, d_model: int, num_heads: int, backend: str = "default"):
        super().__init__()
        self.num_heads = num_heads
        self.backend = backend
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, d = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.num_heads, d // self.num_heads).permute(2, 0, 3, 1, 4)
        with self._kernel():
            y = F.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(batch, length, d))

    def _kernel(self):
        if self.backend in ("math", "flash"):
            from torch.nn.attention import SDPBackend, sdpa_kernel

            return sdpa_kernel(SDPBackend.MATH if self.backend == "math" else SDPBackend.FLASH_ATTENTION)
        return contextlib.nullcontext()


def modeling_folder(path: str | Path) -> Path:
    """The model-code folder of a checkout (``PATH/modeling``) or the folder itself; a ValueError if neither holds
    ``modeling_orchid.py``."""
    path = Path(path).expanduser().resolve()
    for folder in (path / "modeling", path):
        if (folder / "modeling_orchid.py").is_file() and (folder / "__init__.py").is_file():
            return folder
    raise ValueError(f"reference {str(path)!r} holds no Orchid model code (modeling/modeling_orchid.py)")


def load_modeling(path: str | Path, name: str = "orchid_reference"):
    """Another version's model code (a ``modeling/`` folder, whose files import each other only relatively), imported
    as the package ``name`` beside the installed one."""
    folder = modeling_folder(path)
    locations = [str(folder)]
    spec = importlib.util.spec_from_file_location(name, folder / "__init__.py", submodule_search_locations=locations)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# The settings that size the static implicit filters. A reference version is built with this version's values of
# them: older versions had smaller filters by default, and two versions of the code are compared on models of the
# same size.
FILTER_SIZE_FIELDS = ("filter_emb_dim", "filter_width", "filter_depth")


def reference_filter_sizes(reference) -> dict:
    """This version's filter sizes (orchid-bert-base's, which are also the operator's defaults) for those of
    ``FILTER_SIZE_FIELDS`` that the ``reference`` package's configuration has (its operator takes the same
    settings)."""
    from orchid_hf import OrchidConfig

    ours = OrchidConfig.from_preset("orchid-bert-base")
    known = reference.OrchidConfig.from_preset("orchid-bert-base").to_dict()
    return {name: getattr(ours, name) for name in FILTER_SIZE_FIELDS if name in known}


def model_sizes(quick: bool, layers: int | None = None) -> dict:
    """Overrides of orchid-bert-base's sizes: tiny with ``quick``, and ``layers`` deep if given."""
    sizes = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=256, vocab_size=1000) if quick else {}
    return sizes if layers is None else dict(sizes, num_hidden_layers=layers)


def bert_config(quick: bool, length: int, layers: int | None = None, **overrides):
    """transformers' BERT of orchid-bert-base's width and depth, with SDPA attention (and any field overridden)."""
    from transformers import BertConfig

    from orchid_hf import OrchidConfig

    orchid = OrchidConfig.from_preset("orchid-bert-base", **model_sizes(quick, layers))
    return BertConfig(
        vocab_size=orchid.vocab_size,
        hidden_size=orchid.hidden_size,
        num_hidden_layers=orchid.num_hidden_layers,
        num_attention_heads=4 if quick else 12,
        intermediate_size=orchid.intermediate_size,
        max_position_embeddings=max(length, 512),
        attn_implementation="sdpa",
        **overrides,
    )


def orchid_config(package, quick: bool, length: int, layers: int | None = None, **overrides):
    """orchid-bert-base's configuration in ``package`` (``orchid_hf`` or a reference version, with this version's
    filter sizes) with ``max_position_embeddings = length``, tiny with ``quick``, ``layers`` deep if given, any other
    field overridden."""
    import orchid_hf

    sizes = model_sizes(quick, layers)
    if package is not orchid_hf:
        sizes = {**reference_filter_sizes(package), **sizes}
    return package.OrchidConfig.from_preset("orchid-bert-base", max_position_embeddings=length, **sizes, **overrides)


# The builders. An operator builder takes (hidden, heads, length, reference); a model or masked-LM builder takes
# (quick, length, reference, layers). The transform length of Orchid's operator is the input length, as in a text
# model with ``max_position_embeddings = L``. The train part's models run without dropout: with dropout SDPA on the
# CPU takes its math path (L x L scores), without it BERT gets its strongest kernel (flash).


def _orchid_operator(hidden, heads, length, reference):
    from orchid_hf import OrchidOperator

    return OrchidOperator(hidden, length)


def _optimized_operator(hidden, heads, length, reference):
    from orchid_hf import optimize_for_inference

    return optimize_for_inference(_orchid_operator(hidden, heads, length, reference))


def _reference_operator(hidden, heads, length, reference):
    return reference.OrchidOperator(hidden, length, **reference_filter_sizes(reference))


def _attention(backend: str):
    return lambda hidden, heads, length, reference: AttentionBlock(hidden, heads, backend)


def _orchid_model(package_of: Callable):
    def build(quick, length, reference, layers):
        package = package_of(reference)
        return package.OrchidModel(orchid_config(package, quick, length, layers))

    return build


def _compiled_operator(hidden, heads, length, reference):
    return torch.compile(_orchid_operator(hidden, heads, length, reference))


def _compiled_model(quick, length, reference, layers):
    import orchid_hf

    return torch.compile(_orchid_model(lambda _: orchid_hf)(quick, length, reference, layers))


def _optimized_model(quick, length, reference, layers):
    import orchid_hf

    return orchid_hf.optimize_for_inference(_orchid_model(lambda _: orchid_hf)(quick, length, reference, layers))


def _orchid_masked_lm(package_of: Callable, checkpointing: bool = False):
    def build(quick, length, reference, layers):
        package = package_of(reference)
        if not hasattr(package, "OrchidForMaskedLM"):
            raise ValueError(f"the model code {package.__name__} has no OrchidForMaskedLM")
        model = package.OrchidForMaskedLM(orchid_config(package, quick, length, layers, hidden_dropout_prob=0.0))
        if checkpointing:
            # transformers renamed it; versions that have both warn on the older name.
            enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
            enable()
        return model

    return build


class OnnxRuntimeModel(nn.Module):
    """An Orchid model exported to ONNX (``orchid_hf.onnx.export_onnx``, into a temporary folder) and run by an ONNX
    Runtime CPU session with as many intra-op threads as torch has (the benchmark's ``--threads``), called as the model
    is: ``forward(input_ids=...)`` returns its ``last_hidden_state`` (an attention mask of ones, token types 0)."""

    def __init__(self, model: nn.Module):
        import tempfile

        from transformers.modeling_outputs import BaseModelOutput

        from orchid_hf.onnx import export_onnx, onnxruntime_session

        super().__init__()
        self.config = model.config
        self.output_class = BaseModelOutput
        self.folder = tempfile.TemporaryDirectory(prefix="orchid-onnx-")
        path = export_onnx(model, Path(self.folder.name) / "model.onnx")
        self.session = onnxruntime_session(path, threads=torch.get_num_threads())
        self.inputs = [value.name for value in self.session.get_inputs()]

    def forward(self, input_ids: torch.Tensor):
        from orchid_hf.onnx import run_onnxruntime

        feed = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids),
                "token_type_ids": torch.zeros_like(input_ids)}
        outputs = run_onnxruntime(self.session, {name: feed[name] for name in self.inputs})
        return self.output_class(last_hidden_state=outputs["last_hidden_state"])


def _onnxruntime_model(quick, length, reference, layers):
    import orchid_hf

    # The plain model's config, ladder included: the exported graph runs each transform length on its own rows.
    config = orchid_config(orchid_hf, quick, length, layers)
    return OnnxRuntimeModel(orchid_hf.OrchidModel(config).eval())


def _bert_model(quick, length, reference, layers):
    from transformers import BertModel

    return BertModel(bert_config(quick, length, layers), add_pooling_layer=False)


def _bert_masked_lm(quick, length, reference, layers):
    from transformers import BertForMaskedLM

    return BertForMaskedLM(
        bert_config(quick, length, layers, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    )


def _this_version(reference):
    import orchid_hf

    return orchid_hf


def _the_reference(reference):
    return reference


# ---------------------------------------------------------------------------------------------
# The registry
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """One thing the benchmark measures. ``builds``: module kind -> builder; ``tables``: the tables it runs in (it
    builds the module kind of each); ``trains``: whether it runs forward + backward (the
    frozen copy of ``optimize_for_inference`` does not); ``baseline``: a reference point the Orchid candidates are
    compared with; ``wanted``: the settings field that must be set for it to run (``reference``, an opt-in flag);
    ``needs_module``: a module that must be installed for it to run; ``torch_memory``: False where the candidate
    allocates outside PyTorch (ONNX Runtime), whose peak memory the profiler cannot see and is not reported;
    ``masked_lm_label``: its name in the train part's model table."""

    name: str
    label: str
    builds: dict[str, Callable] = field(repr=False)
    tables: tuple[str, ...]
    trains: bool = True
    baseline: bool = False
    wanted: str | None = None
    needs_module: str | None = None  # runs only where this module can be imported (an optional dependency)
    torch_memory: bool = True  # allocates through PyTorch, so that the profiler sees its memory
    masked_lm_label: str | None = None
    materialises_scores: bool = False  # holds L x L attention scores: not run where they would not fit in memory
    color: str = "C9"  # in the plot

    def __post_init__(self):
        missing = [table for table in self.tables if TABLE_MODULE[table] not in self.builds]
        if missing:
            raise ValueError(f"candidate {self.name} runs in {missing} but builds only {list(self.builds)}")

    def installed(self) -> bool:
        """Whether what it needs is installed (``needs_module``)."""
        return self.needs_module is None or importlib.util.find_spec(self.needs_module) is not None

    def build(self, kind: str, *args) -> nn.Module:
        if kind not in self.builds:
            raise ValueError(f"candidate {self.name} builds no {kind} (it builds {', '.join(self.builds)})")
        return self.builds[kind](*args)

    def table_label(self, table: str) -> str:
        return self.masked_lm_label if table == "train_model" and self.masked_lm_label else self.label


CANDIDATES: dict[str, Candidate] = {
    c.name: c
    for c in (
        Candidate(
            "orchid", "Orchid",
            dict(operator=_orchid_operator, model=_orchid_model(_this_version),
                 masked_lm=_orchid_masked_lm(_this_version)),
            tables=TABLES, masked_lm_label="OrchidForMaskedLM", color="C2",
        ),
        Candidate(
            "orchid_optimized", "Orchid, optimize_for_inference",
            dict(operator=_optimized_operator, model=_optimized_model),
            tables=("operator", "model"), trains=False, color="C1",
        ),
        Candidate(
            "orchid_compiled", "Orchid, torch.compile", dict(operator=_compiled_operator, model=_compiled_model),
            tables=("operator", "model"), trains=False, wanted="compiled", color="C6",
        ),
        # The plain model exported to ONNX and run by ONNX Runtime, where onnxruntime is installed (the onnx extra).
        Candidate(
            "orchid_onnxruntime", "Orchid, ONNX Runtime", dict(model=_onnxruntime_model),
            tables=("model",), trains=False, needs_module="onnxruntime", torch_memory=False, color="C5",
        ),
        Candidate(
            "orchid_checkpointing", "Orchid, gradient checkpointing",
            dict(masked_lm=_orchid_masked_lm(_this_version, checkpointing=True)),
            tables=("train_model",), wanted="train_checkpointing",
            masked_lm_label="OrchidForMaskedLM, gradient checkpointing", color="C4",
        ),
        Candidate(
            REFERENCE, "Orchid, reference version",
            dict(operator=_reference_operator, model=_orchid_model(_the_reference),
                 masked_lm=_orchid_masked_lm(_the_reference)),
            tables=TABLES, wanted="reference", masked_lm_label="OrchidForMaskedLM, reference version", color="C7",
        ),
        Candidate(
            "bert", "BertModel (SDPA)", dict(model=_bert_model, masked_lm=_bert_masked_lm),
            tables=("model", "train_model"), baseline=True, masked_lm_label="BertForMaskedLM (SDPA)", color="C0",
        ),
        Candidate(
            "attention_sdpa", "Attention (SDPA, flash CPU kernel)", dict(operator=_attention("default")),
            tables=("operator", "train_operator"), baseline=True, color="C0",
        ),
        # Materialises the L x L scores, as the paper's "Attention" does; too large to train at the train part's
        # lengths.
        Candidate(
            "attention_math", "Attention (SDPA math, L x L scores)", dict(operator=_attention("math")),
            tables=("operator",), baseline=True, materialises_scores=True, color="C3",
        ),
    )
}
ORCHID_CANDIDATES = tuple(name for name, c in CANDIDATES.items() if not c.baseline)


def candidates_in(table: str, mode: str = "forward_backward", settings=None) -> list[str]:
    """The candidates of a table (``TABLES``) in a mode, in registry order: those that run in it, train if the mode
    does, whose ``wanted`` setting is set (none is without ``settings``) and whose ``needs_module`` is installed."""
    return [
        c.name for c in CANDIDATES.values()
        if table in c.tables and (c.trains or mode == "forward")
        and (c.wanted is None or (settings is not None and getattr(settings, c.wanted)))
        and c.installed()
    ]


def baseline_of(table: str) -> str:
    """The candidate a table's ratios are taken against: its first baseline."""
    return next(name for name in candidates_in(table) if CANDIDATES[name].baseline)


def build_operator(name: str, hidden: int, heads: int, length: int, reference=None) -> nn.Module:
    """Candidate ``name``'s sequence mixer of width ``hidden`` for inputs of ``length``."""
    return CANDIDATES[name].build("operator", hidden, heads, length, reference)


def build_model(name: str, quick: bool, length: int, reference=None, layers: int | None = None) -> nn.Module:
    """Candidate ``name``'s base model of orchid-bert-base's size (``quick``: tiny; ``layers`` deep if given) with
    ``max_position_embeddings = length``."""
    return CANDIDATES[name].build("model", quick, length, reference, layers)


def build_masked_lm(name: str, quick: bool, length: int, reference=None, layers: int | None = None) -> nn.Module:
    """Candidate ``name``'s masked-LM model of orchid-bert-base's size, without dropout."""
    return CANDIDATES[name].build("masked_lm", quick, length, reference, layers)


# ---------------------------------------------------------------------------------------------
# The calls that are timed
# ---------------------------------------------------------------------------------------------


def mlm_batch(vocab_size: int, batch: int, length: int, device: str = "cpu", seed: int = 0):
    """Random token ids of shape (batch, length) and MLM labels: MLM_PROBABILITY of the positions (at least one) carry
    their token as label, the rest -100. Drawn from a generator of their own, so that every model gets the same batch
    whatever its initialisation drew before."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, vocab_size, (batch, length), generator=generator)
    labelled = torch.rand(batch, length, generator=generator) < MLM_PROBABILITY
    labelled.view(-1)[0] = True  # a loss over no position would be NaN
    labels = torch.where(labelled, input_ids, torch.full_like(input_ids, -100))
    return input_ids.to(device), labels.to(device)


def synchronizer(device: torch.device | str) -> Callable[[], None]:
    """What a step calls last: on a GPU it waits for the kernels, so that wall time is the call's time."""
    return torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)


def make_train_step(model: nn.Module, input_ids: torch.Tensor, labels: torch.Tensor):
    """Two closures over a model in train mode and its AdamW optimizer (torch's defaults, lr 1e-4): ``step`` runs the
    forward with ``labels`` and ``loss.backward()`` on the model's own loss, starting without gradients as after
    ``zero_grad(set_to_none=True)``; ``optimizer_step`` runs ``optimizer.step()`` and
    ``optimizer.zero_grad(set_to_none=True)`` on the gradients the last ``step`` left."""
    sync = synchronizer(input_ids.device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)

    def step():
        model.zero_grad(set_to_none=True)
        model(input_ids=input_ids, labels=labels).loss.backward()
        sync()

    def optimizer_step():
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()

    return step, optimizer_step


def make_step(module: nn.Module, mode: str, inputs: torch.Tensor, is_model: bool) -> Callable[[], None]:
    """A closure that runs one forward call (inference mode, eval) or one forward + backward call (train mode, a random
    output gradient); on a GPU it waits for the kernels, so that wall time is the call's time."""
    sync = synchronizer(inputs.device)

    def output(x: torch.Tensor) -> torch.Tensor:
        return module(input_ids=x).last_hidden_state if is_model else module(x)

    if mode == "forward":
        module.eval()

        def step():
            with torch.inference_mode():
                output(inputs)
            sync()

        return step

    module.train()
    x = inputs if is_model else inputs.detach().requires_grad_(True)
    grad = None

    def step():
        nonlocal grad
        module.zero_grad(set_to_none=True)
        if not is_model:
            x.grad = None
        y = output(x)
        if grad is None:
            grad = torch.randn_like(y)
        y.backward(grad)
        sync()

    return step


def build_steps(spec: dict, reference=None, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """Candidate ``spec["impl"]`` at one point (``spec``: part, mode, batch, length and sizes; in the train part its
    level) as (step, optimizer_step): the call that is timed, and in the train part's model level the optimizer step
    that follows it (else None)."""
    name, batch, length = spec["impl"], spec["batch"], spec["length"]
    if spec["part"] == "train" and spec["level"] == "model":
        model = build_masked_lm(name, spec["quick"], length, reference, spec.get("layers")).to(device, dtype)
        return make_train_step(model, *mlm_batch(model.config.vocab_size, batch, length, device))
    if spec["part"] == "model":
        module = build_model(name, spec["quick"], length, reference, spec.get("layers")).to(device, dtype)
        inputs = torch.randint(1, module.config.vocab_size, (batch, length), device=device)
        return make_step(module, spec["mode"], inputs, is_model=True), None
    module = build_operator(name, spec["hidden"], spec["heads"], length, reference).to(device, dtype)
    inputs = torch.randn(batch, length, spec["hidden"], device=device, dtype=dtype)
    mode = "forward_backward" if spec["part"] == "train" else spec["mode"]
    return make_step(module, mode, inputs, is_model=False), None
