"""Associative recall (Sec. 4.1, App. C.1-C.2 of the Orchid paper): data, models, training and the results table.

Task. Each sequence draws its own dictionary that maps every key to a random value (keys are the first half of
the vocabulary, values the second half, so the two never overlap). The sequence lists key-value pairs drawn
from that dictionary and ends with a query key taken from one of the listed pairs; the model predicts the
query's value from its output at the last position. Token ``vocab_size`` is a start token that fills the
first position when ``seq_len - 1`` is odd, so every sequence has exactly ``seq_len`` tokens.

Models are the library's and transformers' own classes, of width 64 and depth 2 by default, trained the same way:

- ``orchid``: :class:`OrchidForMaskedLM` with the ``orchid-recall`` preset (the App. C.1 model);
- ``static``: the same class with ``data_dependent=False``, the static implicit kernel only (Hyena / CKConv);
- ``transformer``: transformers' ``BertForMaskedLM`` of the same width and depth (4 heads, learned positions,
  no dropout);
- ``gpt2``: transformers' ``GPT2LMHeadModel`` of the same width and depth: a causal, pre-norm Transformer, the
  baseline of Hyena's set-up.

Two objectives (``RecallConfig.objective``):

- ``query``: cross-entropy on the query position only, the head's logits there;
- ``next_token``: the objective of Hyena's synthetics and of the paper: cross-entropy of the next token at every
  position, the query's value at the last. Keys are drawn independently of everything before them, so a causal
  model predicts a key at chance (``2 / vocab_size``); the runs record how often a model predicts the keys
  (``next_key_accuracy``), which measures how much of the following tokens it reads.

Both are tested on the last position only.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from orchid_hf.modeling.configuration_orchid import OrchidConfig
from orchid_hf.modeling.modeling_orchid import OrchidForMaskedLM
from orchid_hf.modeling.orchid_layers import (
    CONDITIONING_ACTIVATIONS,
    CONDITIONINGS,
    FILTER_SPECTRA,
    TRANSFORMS,
    OrchidOperator,
)
from torch import nn

from benchmarks.harness import block_names, provenance, replace_block, table_lines

MODELS = ("orchid", "static", "transformer", "gpt2")
OBJECTIVES = ("query", "next_token")
TRANSFORMER_POSITIONS = ("learned", "sinusoidal", "rotary")
# Seeds of the held-out splits (plus a term for the task's size). Learning rates and warm-ups are chosen on the
# validation split; the test split is reported.
SPLIT_SEEDS = {"validation": 2_000_029, "test": 1_000_003}
# App. C.2: spatial then spectral (Eq. 2), two spatial layers only, two spectral layers only.
CONDITIONING_LAYOUTS = {"spatial+spectral": (1, 1), "spatial": (2, 0), "spectral": (0, 2)}


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def check_task(vocab_size: int, seq_len: int) -> int:
    """Validates the task size and returns the number of key-value pairs per sequence."""
    if vocab_size < 4 or vocab_size % 2:
        raise ValueError(
            f"vocab_size must be an even number >= 4 (keys and values are its two halves), got {vocab_size}"
        )
    pairs = (seq_len - 1) // 2
    if pairs < 2:
        raise ValueError(
            f"seq_len={seq_len} leaves room for {pairs} key-value pair(s) before the query; "
            "the task needs at least 2 pairs, so seq_len >= 5"
        )
    return pairs


def generate_batch(
    batch_size: int, vocab_size: int, seq_len: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of recall sequences: inputs (batch, seq_len) int64 and the query's value (batch,) int64."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    pairs = check_task(vocab_size, seq_len)
    half = vocab_size // 2
    # The per-sequence dictionary: key k maps to value half + dictionary[k].
    dictionary = torch.randint(0, half, (batch_size, half), generator=generator) + half
    keys = torch.randint(0, half, (batch_size, pairs), generator=generator)
    values = dictionary.gather(1, keys)
    # The query repeats the key of a random listed pair, so its value is always in the context.
    pick = torch.randint(0, pairs, (batch_size, 1), generator=generator)
    query = keys.gather(1, pick)
    target = dictionary.gather(1, query).squeeze(1)
    body = torch.stack([keys, values], dim=-1).reshape(batch_size, 2 * pairs)
    start = torch.full((batch_size, seq_len - 1 - 2 * pairs), vocab_size, dtype=torch.long)
    return torch.cat([start, body, query], dim=1), target


def next_token_labels(inputs: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The labels of the ``next_token`` objective, (batch, seq_len): each position's next token, the query's value at
    the last position, and -100 (ignored) where the next token is the start token."""
    labels = torch.cat([inputs[:, 1:], targets[:, None]], dim=1)
    return labels.masked_fill(labels == vocab_size, -100)


def check_answers(inputs: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> bool:
    """True when every target is the value that follows the query key in its sequence (a slow, direct check)."""
    half = vocab_size // 2
    for row, target in zip(inputs.tolist(), targets.tolist()):
        query, body = row[-1], [t for t in row[:-1] if t != vocab_size]
        seen = {body[i + 1] for i in range(0, len(body), 2) if body[i] == query}
        if not query < half or seen != {target}:
            return False
    return True


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------


@dataclass
class RecallConfig:
    """One run: the task, the model, and the training recipe (AdamW, linear warmup then cosine decay to zero)."""

    model: str = "orchid"
    objective: str = "query"
    vocab_size: int = 20
    seq_len: int = 128
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4  # transformer and gpt2 only
    transform: str = "dct"
    conditioning: str = "abs"
    activation: str = "identity"
    conditioning_layout: str = "spatial+spectral"
    conditioning_depth: int = 1  # layers per domain in the spatial+spectral layout (3 for vocabulary 40)
    filter_spectrum: str = "listing1"  # dct(h0) as the static multiplier, as the authors' code; or "convolution"
    # Experiment only, not an option of the library operator: LayerNorm over channels after the conditioning
    # network's time and frequency convolutions, as the authors' standalone code configures it (add_conditioning_norm).
    conditioning_norm: bool = False
    # Transformer only: "learned" (BertForMaskedLM's table, from N(0, embedding_init_std^2)), "sinusoidal" (the same
    # table started from sinusoids) or "rotary" (RoFormerForMaskedLM: BERT's blocks with rotary attention).
    transformer_positions: str = "learned"
    # Transformer only, a diagnostic: a depthwise convolution of length 3 over the word embeddings, so that every
    # position starts with its neighbours' tokens (the "shift" that the short convolutions of H3, Hyena and Orchid
    # provide). Not the paper's Transformer.
    transformer_shift: bool = False
    # Word embeddings ~ N(0, embedding_init_std^2): the preset's value for Orchid; for the transformer, word and
    # position embeddings alike (attention finds the pair by position, which a 50x weaker table would hide).
    embedding_init_std: float = 1.0
    steps: int = 3000
    batch_size: int = 64
    lr: float = 2e-3
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 250
    eval_size: int = 2000
    seed: int = 0
    threads: int = 1
    config_overrides: dict = field(default_factory=dict)  # any OrchidConfig / BertConfig field

    def validate(self) -> None:
        check_task(self.vocab_size, self.seq_len)
        choices = {
            "model": (self.model, MODELS),
            "objective": (self.objective, OBJECTIVES),
            "transform": (self.transform, TRANSFORMS),
            "conditioning": (self.conditioning, CONDITIONINGS),
            "activation": (self.activation, CONDITIONING_ACTIVATIONS),
            "conditioning_layout": (self.conditioning_layout, tuple(CONDITIONING_LAYOUTS)),
            "filter_spectrum": (self.filter_spectrum, FILTER_SPECTRA),
            "transformer_positions": (self.transformer_positions, TRANSFORMER_POSITIONS),
        }
        for name, (value, allowed) in choices.items():
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        positive = ("hidden_size", "num_layers", "num_heads", "conditioning_depth", "steps", "batch_size")
        for name in (*positive, "eval_every", "eval_size", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("lr", "embedding_init_std"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.warmup_steps < 0 or self.weight_decay < 0 or self.grad_clip < 0:
            raise ValueError(
                f"warmup_steps, weight_decay and grad_clip must be >= 0, got {self.warmup_steps}, "
                f"{self.weight_decay} and {self.grad_clip}"
            )
        if self.model in ("transformer", "gpt2") and self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size={self.hidden_size} must be divisible by num_heads={self.num_heads}")
        if self.model != "transformer" and (self.transformer_shift or self.transformer_positions != "learned"):
            raise ValueError(
                f"transformer_shift and transformer_positions apply to model='transformer' only, got "
                f"model={self.model!r}, transformer_shift={self.transformer_shift}, "
                f"transformer_positions={self.transformer_positions!r}"
            )
        if self.conditioning_norm and (self.model != "orchid" or self.conditioning != "abs"):
            raise ValueError(
                "conditioning_norm applies to model='orchid' with conditioning='abs' only, got "
                f"model={self.model!r}, conditioning={self.conditioning!r}"
            )

    def orchid_config(self) -> OrchidConfig:
        """The ``orchid-recall`` preset at this task's size (one more token: the start token), with the settings of
        this run."""
        time_layers, freq_layers = CONDITIONING_LAYOUTS[self.conditioning_layout]
        if self.conditioning_layout == "spatial+spectral":
            time_layers = freq_layers = self.conditioning_depth
        settings = dict(
            vocab_size=self.vocab_size + 1,
            max_position_embeddings=self.seq_len,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_layers,
            word_embedding_init_std=self.embedding_init_std,
            transform=self.transform,
            conditioning=self.conditioning,
            conditioning_activation=self.activation,
            conditioning_time_layers=time_layers,
            conditioning_freq_layers=freq_layers,
            data_dependent=self.model == "orchid",
            filter_spectrum=self.filter_spectrum,
        )
        return OrchidConfig.from_preset("orchid-recall", **{**settings, **self.config_overrides})

    def gpt2_config(self):
        """transformers' GPT2Config of the causal Transformer, of the same width and depth; the start token stands
        for GPT-2's beginning and end of text."""
        from transformers import GPT2Config

        settings = dict(
            vocab_size=self.vocab_size + 1,
            n_positions=self.seq_len,
            n_embd=self.hidden_size,
            n_layer=self.num_layers,
            n_head=self.num_heads,
            n_inner=4 * self.hidden_size,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=self.vocab_size,
            eos_token_id=self.vocab_size,
        )
        return GPT2Config(**{**settings, **self.config_overrides})

    def bert_config(self):
        """transformers' config of the Transformer: BertConfig (learned or sinusoidal positions) or RoFormerConfig
        (rotary positions), of the same width and depth; no padding token (token 0 is a key)."""
        from transformers import BertConfig, RoFormerConfig

        settings = dict(
            vocab_size=self.vocab_size + 1,
            max_position_embeddings=self.seq_len,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            intermediate_size=4 * self.hidden_size,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            type_vocab_size=1,
            pad_token_id=None,
        )
        config_class = RoFormerConfig if self.transformer_positions == "rotary" else BertConfig
        return config_class(**{**settings, **self.config_overrides})


def add_conditioning_norm(model: nn.Module) -> None:
    """LayerNorm over channels after the time and the frequency convolutions of every conditioning network of
    ``model``, as the authors' standalone code configures it (``norm: layernorm``) and the library operator does not.

    The two norms become modules of the conditioning network (trained and saved with it) and act through forward hooks
    on its two convolution stacks, so that the network itself runs as the package has it. Positions that the mask
    marks as padding stay zero after the time convolution's norm, as they are without it."""
    for module in model.modules():
        if not isinstance(module, OrchidOperator) or module.conditioning is None:
            continue
        conditioning = module.conditioning
        conditioning.time_norm = nn.LayerNorm(module.d_model)  # over the channels of (B, L, C) and (B, N, C)
        conditioning.freq_norm = nn.LayerNorm(module.d_model)

        def normalized_time(stack, args, output, norm=conditioning.time_norm):
            mask = args[1] if len(args) > 1 else None  # the stack's (x, mask, wrap)
            normalized = norm(output)
            return normalized if mask is None else normalized.masked_fill(~mask, 0.0)

        conditioning.time_conv.register_forward_hook(normalized_time)
        conditioning.freq_conv.register_forward_hook(lambda stack, args, output, norm=conditioning.freq_norm:
                                                     norm(output))


def sinusoids(length: int, width: int) -> torch.Tensor:
    """The Transformer's sinusoidal positions (sin and cos at frequencies 10000^(-2i/width), interleaved), scaled to
    entries of variance 1; (length, width)."""
    frequencies = torch.exp(-math.log(10000.0) * torch.arange(0, width, 2) / width)
    angles = torch.arange(length)[:, None] * frequencies
    return math.sqrt(2) * torch.stack([angles.sin(), angles.cos()], dim=-1).reshape(length, width)


class ShiftedEmbedding(nn.Module):
    """Word embeddings followed by a depthwise convolution of length 3 along the sequence: each position's vector
    mixes its own token with the previous and the next one, channel by channel. Keeps the embedding's ``weight``, so
    that the masked-LM decoder stays tied to it."""

    def __init__(self, embedding: nn.Embedding):
        super().__init__()
        self.embedding = embedding
        width = embedding.embedding_dim
        self.shift = nn.Conv1d(width, width, kernel_size=3, padding=1, groups=width)
        nn.init.normal_(self.shift.weight)  # each channel its own mix of the three tokens, at the words' scale

    @property
    def weight(self) -> nn.Parameter:
        return self.embedding.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.shift(self.embedding(input_ids).transpose(1, 2)).transpose(1, 2)


def build_model(config: RecallConfig) -> nn.Module:
    """The run's model, freshly initialised: OrchidForMaskedLM (orchid, static), BertForMaskedLM (transformer) or
    GPT2LMHeadModel (gpt2)."""
    config.validate()
    if config.model == "gpt2":
        from transformers import GPT2LMHeadModel

        model = GPT2LMHeadModel(config.gpt2_config())
        with torch.no_grad():  # words and positions at the same scale as the other models' (embedding_init_std)
            model.transformer.wte.weight.normal_(0.0, config.embedding_init_std)
            model.transformer.wpe.weight.normal_(0.0, config.embedding_init_std)
        return model
    if config.model == "transformer":
        from transformers import BertForMaskedLM, RoFormerForMaskedLM

        if config.transformer_positions == "rotary":
            model = RoFormerForMaskedLM(config.bert_config())
            embeddings = model.roformer.embeddings
        else:
            model = BertForMaskedLM(config.bert_config())
            embeddings = model.bert.embeddings
        with torch.no_grad():
            embeddings.word_embeddings.weight.normal_(0.0, config.embedding_init_std)
            if config.transformer_positions == "learned":
                embeddings.position_embeddings.weight.normal_(0.0, config.embedding_init_std)
            elif config.transformer_positions == "sinusoidal":
                table = sinusoids(config.seq_len, config.hidden_size)
                embeddings.position_embeddings.weight.copy_(config.embedding_init_std * table)
        if config.transformer_shift:
            embeddings.word_embeddings = ShiftedEmbedding(embeddings.word_embeddings)
        return model
    model = OrchidForMaskedLM(config.orchid_config())
    if config.conditioning_norm:
        add_conditioning_norm(model)
    return model


def query_logits(model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """The head's logits at the last (query) position, (batch, vocabulary)."""
    return model(input_ids=inputs).logits[:, -1]


def objective_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, config: RecallConfig) -> torch.Tensor:
    """The training loss of ``config.objective``: cross-entropy at the query position (``query``), or averaged over
    every position's next token (``next_token``)."""
    if config.objective == "query":
        return F.cross_entropy(query_logits(model, inputs), targets)
    logits = model(input_ids=inputs).logits
    return F.cross_entropy(logits.flatten(0, 1), next_token_labels(inputs, targets, config.vocab_size).flatten())


@torch.no_grad()
def earlier_positions_changed(model: nn.Module, inputs: torch.Tensor, vocab_size: int) -> float:
    """The fraction of positions before the middle of the sequence whose logits change when the middle token does
    (each key swapped for another key, a value for another value): 0 for a causal model, whatever it learned."""
    model.eval()
    middle = inputs.shape[1] // 2
    half = vocab_size // 2
    changed = inputs.clone()
    token = changed[:, middle]
    changed[:, middle] = torch.where(token < half, (token + 1) % half, half + (token - half + 1) % half)
    before = model(input_ids=inputs).logits[:, :middle]
    after = model(input_ids=changed).logits[:, :middle]
    model.train()
    # Above float32 rounding of the logits' scale; a causal model's earlier logits stay bit for bit the same.
    moved = (after - before).abs().amax(dim=-1) > 1e-6 * before.abs().amax()
    return moved.float().mean().item()


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------


def learning_rate(step: int, config: RecallConfig) -> float:
    """Linear warmup (App. C.1), then cosine decay to zero at the last step."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


@torch.no_grad()
def evaluate(
    model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, vocab_size: int, batch_size: int = 500
) -> dict:
    """Loss and accuracy at the last (query) position, and ``next_key_accuracy``: how often the prediction at a
    position whose next token is a key is that key (chance, ``2 / vocab_size``, for a model that cannot read it)."""
    model.eval()
    loss, correct, key_hits, keys = 0.0, 0, 0, 0
    for start in range(0, len(inputs), batch_size):
        rows = inputs[start : start + batch_size]
        target = targets[start : start + batch_size]
        logits = model(input_ids=rows).logits
        loss += F.cross_entropy(logits[:, -1], target, reduction="sum").item()
        correct += (logits[:, -1].argmax(-1) == target).sum().item()
        next_tokens = rows[:, 1:]
        is_key = next_tokens < vocab_size // 2
        key_hits += ((logits[:, :-1].argmax(-1) == next_tokens) & is_key).sum().item()
        keys += is_key.sum().item()
    model.train()
    return {"loss": loss / len(inputs), "accuracy": correct / len(inputs), "next_key_accuracy": key_hits / keys}


def held_out_set(config: RecallConfig, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``eval_size`` fixed sequences of the ``"validation"`` or ``"test"`` split. Each split's seed depends on the task
    and the split only, so every model and run sees the same sequences, and the two splits differ from each other
    and from the training batches (seeded by the run's seed)."""
    if split not in SPLIT_SEEDS:
        raise ValueError(f"split must be one of {tuple(SPLIT_SEEDS)}, got {split!r}")
    generator = torch.Generator().manual_seed(SPLIT_SEEDS[split] + 7919 * config.vocab_size + config.seq_len)
    return generate_batch(config.eval_size, config.vocab_size, config.seq_len, generator)


def most_frequent_value(inputs: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The plateau's prediction: the value that occurs most often in each sequence (the lowest token of a tie),
    (batch,) int64."""
    values = inputs[:, :-1]
    counts = F.one_hot(values, vocab_size + 1)[..., vocab_size // 2 : vocab_size].sum(dim=1)
    return counts.argmax(dim=-1) + vocab_size // 2


@functools.cache
def plateau_accuracy(vocab_size: int, seq_len: int, eval_size: int, split: str = "test") -> float:
    """How often the most frequent value is the answer on a held-out split: the accuracy of the plateau that every
    run starts on."""
    config = RecallConfig(vocab_size=vocab_size, seq_len=seq_len, eval_size=eval_size)
    inputs, targets = held_out_set(config, split)
    return (most_frequent_value(inputs, vocab_size) == targets).sum().item() / len(targets)


def train(
    config: RecallConfig,
    log_path: str | Path | None = None,
    progress: bool = True,
    result_path: str | Path | None = None,
    extra: dict | None = None,
    checkpoint_path: str | Path | None = None,
    device: str | torch.device = "cpu",
    stop: Callable[[], bool] | None = None,
) -> dict:
    """Trains on freshly generated batches and returns the final metrics and the learning curve.

    Every ``eval_every`` steps the model is evaluated on the validation and the test split. ``result_path`` gets the
    summary (:func:`run_summary`, with the commit and the machine of :func:`benchmarks.harness.provenance`, plus
    ``extra``) after every evaluation, marked ``finished: false`` until the last step, so that a run
    stopped early still leaves its numbers. With ``checkpoint_path`` the model, optimizer, data stream and curve are
    saved there at every evaluation, and a run of the same config resumes from that file; it is removed at the end.
    ``device``: where the model trains (the batches are drawn on the CPU, from the same generator whatever the
    device). ``stop``: called after every step; when it returns True the run evaluates once more and ends there,
    before its schedule does (a time budget, say).
    """
    from tqdm.auto import tqdm

    config.validate()
    torch.set_num_threads(config.threads)
    extra = {**provenance(config.threads, device), **(extra or {})}
    torch.manual_seed(config.seed)
    model = build_model(config).to(device)
    data = torch.Generator().manual_seed(config.seed + 1)
    held_out = {
        split: tuple(tensor.to(device) for tensor in held_out_set(config, split)) for split in ("validation", "test")
    }
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embedding" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2 or "embedding" in n]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr,
        betas=(0.9, 0.999),
    )
    checkpoint = Path(checkpoint_path) if checkpoint_path else None
    first, curve, spent = 0, [], 0.0
    if checkpoint and checkpoint.exists():
        state = torch.load(checkpoint, weights_only=True, map_location=device)
        if state["config"] != asdict(config):
            changed = {k: (v, asdict(config)[k]) for k, v in state["config"].items() if asdict(config).get(k) != v}
            raise ValueError(f"checkpoint {checkpoint} belongs to another run; (saved, asked) differ in {changed}")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        data.set_state(state["data"])
        first, curve, spent = state["step"], state["curve"], state["seconds"]
    log = open(log_path, "a" if first else "w") if log_path else None  # noqa: SIM115 - closed below
    running, began = [], time.time() - spent
    bar = tqdm(range(first, config.steps), disable=not progress, mininterval=10)
    summary = None
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, config)
        inputs, targets = (
            tensor.to(device) for tensor in generate_batch(config.batch_size, config.vocab_size, config.seq_len, data)
        )
        loss = objective_loss(model, inputs, targets, config)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        running.append(loss.detach())  # read at the evaluations only: on a GPU each read waits for the queue
        stopping = stop is not None and stop()
        if (step + 1) % config.eval_every == 0 or step + 1 == config.steps or stopping:
            point = {"step": step + 1, "train_loss": torch.stack(running).mean().item()}
            for split, name in (("validation", "val"), ("test", "test")):
                metrics = evaluate(model, *held_out[split], config.vocab_size)
                point.update({f"{name}_{k}": v for k, v in metrics.items()})
            point["seconds"] = round(time.time() - began, 1)
            running = []
            curve.append(point)
            bar.set_postfix(loss=f"{point['train_loss']:.3f}", val=f"{point['val_accuracy']:.3f}")
            if log:
                log.write(json.dumps(point) + "\n")
                log.flush()
            summary = run_summary(config, model, curve, held_out["validation"][0][:100], extra)
            if result_path:
                Path(result_path).write_text(json.dumps(summary, indent=1))
            if checkpoint and step + 1 < config.steps and not stopping:
                state = {
                    "config": asdict(config),
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "data": data.get_state(),
                    "step": step + 1,
                    "curve": curve,
                    "seconds": point["seconds"],
                }
                partial = checkpoint.with_name(checkpoint.name + ".tmp")
                torch.save(state, partial)
                partial.replace(checkpoint)  # a stop while saving leaves the previous checkpoint whole
        if stopping:
            break
    if log:
        log.close()
    if checkpoint:
        checkpoint.unlink(missing_ok=True)
    return summary


def run_summary(
    config: RecallConfig, model: nn.Module, curve: list[dict], probe: torch.Tensor, extra: dict | None = None
) -> dict:
    """A run's result: its config, size, whether it is causal (:func:`earlier_positions_changed` on the ``probe``
    sequences), the last evaluation and the whole curve."""
    last = curve[-1]
    return {
        "config": asdict(config),
        "parameters": sum(p.numel() for p in model.parameters()),
        "earlier_positions_changed": earlier_positions_changed(model, probe, config.vocab_size),
        "finished": last["step"] == config.steps,
        "steps_done": last["step"],
        "val_accuracy": last["val_accuracy"],
        "test_accuracy": last["test_accuracy"],
        "best_test_accuracy": max(p["test_accuracy"] for p in curve),
        "seconds": last["seconds"],
        **(extra or {}),
        "curve": curve,
    }


# ---------------------------------------------------------------------------------------------
# Results table
# ---------------------------------------------------------------------------------------------

# Tables 4.1 and 4.2 of the paper, accuracy in %: {(model, vocab, seq_len): accuracy}.
PAPER = {
    ("orchid", 20, 128): 100.0, ("orchid", 30, 128): 99.4, ("orchid", 40, 128): 99.2,
    ("static", 20, 128): 93.0, ("static", 30, 128): 38.8, ("static", 40, 128): 12.4,
    ("transformer", 20, 128): 100.0, ("transformer", 30, 128): 100.0, ("transformer", 40, 128): 100.0,
    ("orchid", 20, 512): 100.0, ("orchid", 20, 2048): 100.0, ("orchid", 20, 8192): 100.0,
    ("static", 20, 512): 99.0, ("static", 20, 2048): 99.6, ("static", 20, 8192): 100.0,
    ("transformer", 20, 512): 100.0, ("transformer", 20, 2048): 100.0, ("transformer", 20, 8192): 100.0,
}  # fmt: skip
PAPER.update({("gpt2", *task): value for (model, *task), value in PAPER.items() if model == "transformer"})
PAPER_NAMES = {"orchid": "Orchid", "static": "Hyena", "transformer": "Transformer", "gpt2": "Transformer"}


def describe(config: dict) -> str:
    """A short label of a run's model and its non-default ablation settings."""
    if config["model"] == "gpt2":
        return "transformer (GPT2LMHeadModel, causal, pre-norm)" + other_settings(config)
    if config["model"] == "transformer":
        positions = config.get("transformer_positions", "learned")
        name = {"learned": "BertForMaskedLM", "sinusoidal": "BertForMaskedLM, sinusoidal positions",
                "rotary": "RoFormerForMaskedLM, rotary positions"}[positions]  # fmt: skip
        shift = " + shift convolution" if config.get("transformer_shift") else ""
        return f"transformer ({name}){shift}" + other_settings(config)
    if config["model"] != "orchid":
        return config["model"] + filter_label(config) + other_settings(config)
    parts = ["orchid", config["transform"], config["conditioning"]]
    if config["conditioning"] == "xcorr":
        parts.append(config["activation"])
    parts.append(config["conditioning_layout"])
    if config["conditioning_depth"] != 1:
        parts.append(f"depth {config['conditioning_depth']}")
    if config["conditioning_norm"]:
        parts.append("LayerNorm")
    return " / ".join(parts) + filter_label(config) + other_settings(config)


def other_settings(config: dict) -> str:
    """The settings of a run, outside the model's own label, that differ from the defaults."""
    defaults = asdict(RecallConfig())
    names = {"hidden_size": "width", "num_layers": "depth", "num_heads": "heads", "embedding_init_std": "embedding std",
             "weight_decay": "weight decay", "grad_clip": "clipping"}  # fmt: skip
    parts = [f"{label} {config[name]:g}" for name, label in names.items() if config[name] != defaults[name]]
    parts += [f"{name} {value}" for name, value in config["config_overrides"].items()]
    if config.get("objective", "query") != defaults["objective"]:
        parts.append(f"{config['objective'].replace('_', '-')} loss")
    return "".join(f" / {part}" for part in parts)


def filter_label(config: dict) -> str:
    """Which static multiplier a DCT run used."""
    if config["transform"] != "dct":
        return ""
    return " / h0 " + ("dct(h0), Listing 1" if config["filter_spectrum"] == "listing1" else "convolution")


def results_table(paths: list[str | Path]) -> str:
    """A markdown table of run results (JSON files written by the CLI), with the paper's number beside each.

    "val" and "test" are the accuracies after the run's last step on the two held-out splits ("-" for runs that
    predate the validation split), "most frequent value" the plateau's accuracy on the test split; a run stopped
    before its schedule ended shows the steps it reached."""
    rows = [
        "| model | parameters | vocab | length | seed | steps | batch | lr | warm-up | val acc. % | test acc. % | "
        "most frequent value % | paper % | wall time | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    results = [json.loads(Path(p).read_text()) for p in paths]
    results.sort(key=lambda r: (r["config"]["seq_len"], r["config"]["vocab_size"], describe(r["config"]),
                                r["config"]["steps"], r["config"]["lr"], r["config"]["warmup_steps"],
                                r["config"]["seed"]))  # fmt: skip
    for r in results:
        c = r["config"]
        key = (c["model"], c["vocab_size"], c["seq_len"])
        default = c["model"] != "orchid" or describe(c).startswith("orchid / dct / abs / spatial+spectral")
        paper = PAPER.get(key) if default else None
        paper_text = f"{paper:g} ({PAPER_NAMES[c['model']]})" if paper is not None else "-"
        steps = str(c["steps"]) if r.get("finished", True) else f"{r['steps_done']} of {c['steps']} (stopped)"
        val = f"{100 * r['val_accuracy']:.1f}" if "val_accuracy" in r else "-"
        plateau = plateau_accuracy(c["vocab_size"], c["seq_len"], c["eval_size"])
        rows.append(
            f"| {describe(c)} | {r['parameters'] / 1e3:.0f}K | {c['vocab_size']} | {c['seq_len']} | {c['seed']} | "
            f"{steps} | {c['batch_size']} | {c['lr']:g} | {c['warmup_steps']} | {val} | "
            f"{100 * r['test_accuracy']:.1f} | {100 * plateau:.1f} | {paper_text} | {r['seconds'] / 60:.0f} min | "
            f"{r.get('note', '')} |"
        )
    return "\n".join(rows) + "\n"


def paper_table(paths: list[str | Path]) -> str:
    """Runs beside the paper's Table 4.2: a row per model (its conditioning depth aside, which App. C.1 raises for
    vocabulary 40), a column per vocabulary, each cell the test accuracies of the seeds (%) and the paper's number;
    then, per vocabulary, how often the model predicted a key it cannot know (``next_key_accuracy`` on the validation
    split, mean over seeds; chance is ``2 / vocab_size``), and whether its earlier outputs moved with a later token
    (:func:`earlier_positions_changed`), both from the runs' last evaluation."""
    results = [json.loads(Path(p).read_text()) for p in paths]
    vocabs = sorted({r["config"]["vocab_size"] for r in results})
    groups: dict[tuple, dict[int, list[dict]]] = {}
    for r in sorted(results, key=lambda r: (MODELS.index(r["config"]["model"]), r["config"]["seed"])):
        c = r["config"]
        groups.setdefault((describe({**c, "conditioning_depth": 1}), c["model"]), {}).setdefault(
            c["vocab_size"], []).append(r)  # fmt: skip
    rows = []
    for (label, model), by_vocab in groups.items():
        cells, keys, moved = [], [], []
        for vocab in vocabs:
            runs = by_vocab.get(vocab, [])
            seeds = " / ".join(f"{100 * r['test_accuracy']:.1f}" for r in runs) or "-"
            paper = PAPER.get((model, vocab, runs[0]["config"]["seq_len"])) if runs else None
            cells.append(f"{seeds} ({paper:g})" if paper is not None else seeds)
            guessed = [r["curve"][-1]["val_next_key_accuracy"] for r in runs]
            keys.append(f"{100 * sum(guessed) / len(guessed):.0f}" if guessed else "-")
            moved += [r["earlier_positions_changed"] for r in runs]
        moved_text = f"{100 * min(moved):.0f}" + (f"-{100 * max(moved):.0f}" if min(moved) != max(moved) else "")
        rows.append([label, *cells, " / ".join(keys), moved_text])
    chance = " / ".join(f"{200 / v:.3g}" for v in vocabs)
    header = ["model", *(f"vocabulary {v}: test % by seed (paper)" for v in vocabs),
              f"next key predicted %, by vocabulary (chance {chance})", "earlier positions moved by a later token %"]
    return "\n".join(table_lines(header, rows)) + "\n"


def plot_curves(paths: list[str | Path], out_png: str | Path) -> None:
    """Validation accuracy against training step for each run (test accuracy for runs without a validation split),
    one panel per model and task (vocabulary, length); each legend names what differs from the model's defaults."""
    from orchid_hf.extras import require_extra

    require_extra("matplotlib", "plot").use("Agg")
    import matplotlib.pyplot as plt

    results = [json.loads(Path(p).read_text()) for p in paths]
    order = {name: i for i, name in enumerate(MODELS)}
    panels = sorted({(r["config"]["seq_len"], r["config"]["vocab_size"], r["config"]["model"]) for r in results},
                    key=lambda k: (k[0], k[1], order[k[2]]))  # fmt: skip
    columns = min(3, len(panels))
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(6 * columns, 5.5 * rows), squeeze=False)
    for ax, (length, vocab, model) in zip(axes.flat, panels):
        for r in results:
            c = r["config"]
            if (c["seq_len"], c["vocab_size"], c["model"]) == (length, vocab, model):
                split = "val" if "val_accuracy" in r["curve"][0] else "test"
                default = describe(asdict(RecallConfig(model=model))).split(" / ")
                variant = [part for part in describe(c).split(" / ") if part not in default]
                schedule = [f"seed {c['seed']}", f"{c['steps']} steps", f"lr {c['lr']:g}"]
                schedule.append(f"warm-up {c['warmup_steps']}")
                label = ", ".join([*variant, *schedule, *([] if split == "val" else ["test split"])])
                steps = [p["step"] for p in r["curve"]]
                ax.plot(steps, [100 * p[f"{split}_accuracy"] for p in r["curve"]], marker=".", label=label)
        ax.set(title=f"{model}, vocabulary {vocab}, length {length}", xlabel="step", ylabel="accuracy (%)",
               ylim=(0, 101))  # fmt: skip
        ax.grid(alpha=0.3)
        # Below the axes: inside, the legend would hide the curves that matter.
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=1)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.subplots_adjust(hspace=0.75, wspace=0.25)
    fig.savefig(out_png, dpi=100, bbox_inches="tight")
    plt.close(fig)


BLOCKS = "recall"  # the generated blocks of a results page: <!-- recall:NAME --> ... <!-- /recall:NAME -->


def render_page(text: str, runs: str | Path, figures: str | Path | None = None) -> str:
    """The page ``text`` with every generated block rebuilt from the run files under ``runs``; with ``figures`` (a
    folder), the figures are drawn there too.

    A block's name says what it holds: ``table PATTERN`` (:func:`results_table` of the run files that the glob
    PATTERN matches under ``runs``), ``paper PATTERN`` (:func:`paper_table` of them) or ``figure PATTERN PNG`` (a
    link to PNG, the :func:`plot_curves` of those run files). A ValueError names a block of another form, or one
    whose pattern matches no run file."""
    runs = Path(runs)
    for name in block_names(text, BLOCKS):
        kind, pattern, *png = name.split(" ")
        if (kind, len(png)) not in (("table", 0), ("paper", 0), ("figure", 1)):
            raise ValueError(
                f"a {BLOCKS} block is named 'table PATTERN', 'paper PATTERN' or 'figure PATTERN PNG', got {name!r}"
            )
        paths = sorted(runs.glob(pattern))
        if not paths:
            raise ValueError(f"no run files match {pattern!r} under {runs}")
        if kind == "table":
            content = results_table(paths).rstrip("\n")
        elif kind == "paper":
            content = paper_table(paths).rstrip("\n")
        else:
            if figures is not None:
                plot_curves(paths, Path(figures) / png[0])
            content = f"![learning curves]({png[0]})"
        text = replace_block(text, BLOCKS, name, content)
    return text
