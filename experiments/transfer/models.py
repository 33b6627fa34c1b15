"""The two architectures at the same small size, masked-LM pretraining and fine-tuning in plain loops.

Plain PyTorch loops rather than the package's Trainer recipes: each run here is minutes on one thread, and a loop
lets the diagnosis read gradients and activations at any step. The loops follow the recipes' settings: pretraining
as ``orchid-bert-base-mlm`` (30% masking, 80/10/10, AdamW betas (0.9, 0.98), eps 1e-6, 6% warmup then linear decay
to 0.02x; Orchid's implicit filters in their own group at the recipe's learning rate and weight decay), fine-tuning
as ``orchid-bert-classification`` (AdamW, weight decay 0.01, 6% warmup then linear decay to 0, gradient clipping at
1, batch 32).
"""

from __future__ import annotations

import math
import time

import torch
from orchid_hf.modeling import OrchidConfig, OrchidForMaskedLM
from torch import nn
from transformers import BertConfig, BertForMaskedLM

from orchid_hf.recipes import FILTER_LEARNING_RATE, FILTER_WEIGHT_DECAY

ARCHS = ("orchid", "bert")
FILTER_NAMES = ("static_filter", "residual_filter")
CLS_ID, SEP_ID, MASK_ID, PAD_ID = 101, 102, 103, 0


def build_mlm_model(arch: str, hidden: int, layers: int, intermediate: int, max_positions: int, dropout: float = 0.1,
                    pre_norm: bool = False, seed: int = 0) -> nn.Module:
    """``OrchidForMaskedLM`` (the ``orchid-bert-base`` preset at this size, as docs/results/real_data.md) or
    ``BertForMaskedLM`` of the same width, depth, MLP size and positions (heads of 64 channels)."""
    torch.manual_seed(seed)
    size = dict(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=intermediate,
                max_position_embeddings=max_positions, hidden_dropout_prob=dropout)
    if arch == "orchid":
        return OrchidForMaskedLM(OrchidConfig.from_preset("orchid-bert-base", pre_norm=pre_norm, **size))
    if arch == "bert":
        if pre_norm:
            raise ValueError("BertConfig has no pre-norm option; pre_norm=True is for arch='orchid' only")
        config = BertConfig(num_attention_heads=max(1, hidden // 64), attention_probs_dropout_prob=dropout, **size)
        return BertForMaskedLM(config)
    raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")


def encoder_of(model: nn.Module) -> nn.Module:
    """The encoder (embeddings and layers) of a masked-LM or classifier model of either architecture."""
    for name in ("orchid", "bert", "encoder_model"):
        if hasattr(model, name):
            return getattr(model, name)
    raise ValueError(f"{type(model).__name__} has no orchid, bert or encoder_model attribute")


def mlm_head_of(model: nn.Module) -> nn.Module:
    return model.lm_head if hasattr(model, "lm_head") else model.cls


def mask_tokens(ids: torch.Tensor, probability: float, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT masking of the non-special tokens: (inputs, labels with -100 where nothing is predicted)."""
    special = (ids == CLS_ID) | (ids == SEP_ID) | (ids == PAD_ID)
    chosen = (torch.rand(ids.shape, generator=generator) < probability) & ~special
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    draw = torch.rand(ids.shape, generator=generator)
    inputs = ids.clone()
    inputs[chosen & (draw < 0.8)] = MASK_ID
    random_tokens = torch.randint(1000, 30522, ids.shape, generator=generator)
    swap = chosen & (draw >= 0.8) & (draw < 0.9)
    inputs[swap] = random_tokens[swap]
    return inputs, labels


def masked_lm_step(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, attention_mask=None):
    """The loss and the number of correct predictions over the masked positions only (the vocabulary projection of
    the other positions would be most of the work and adds nothing)."""
    hidden = encoder_of(model)(inputs, attention_mask=attention_mask).last_hidden_state
    where = labels != -100
    logits = mlm_head_of(model)(hidden[where])
    target = labels[where]
    return nn.functional.cross_entropy(logits, target), (logits.argmax(-1) == target).sum().item(), target.numel()


def linear_schedule(step: int, total: int, warmup_fraction: float = 0.06, final: float = 0.0) -> float:
    warmup = max(1, math.ceil(warmup_fraction * total))
    if step < warmup:
        return (step + 1) / warmup
    return final + (1 - final) * max(0.0, (total - step) / max(1, total - warmup))


def pretrain(model: nn.Module, blocks: torch.Tensor, steps: int, batch_size: int = 32, lr: float = 8e-4,
             filter_lr: float = FILTER_LEARNING_RATE, seed: int = 0, probability: float = 0.3,
             log_every: int = 50) -> dict:
    """Masked-LM pretraining in the recipe's settings; returns the loss curve."""
    generator = torch.Generator().manual_seed(seed)
    filters = [p for n, p in model.named_parameters() if any(f in n for f in FILTER_NAMES)]
    others = [p for n, p in model.named_parameters() if not any(f in n for f in FILTER_NAMES)]
    groups = [{"params": others, "lr": lr, "weight_decay": 1e-5 / lr}]
    if filters:
        groups.append({"params": filters, "lr": filter_lr, "weight_decay": FILTER_WEIGHT_DECAY})
    optimizer = torch.optim.AdamW(groups, betas=(0.9, 0.98), eps=1e-6)
    peaks = [g["lr"] for g in groups]
    model.train()
    curve, running, start = [], [], time.time()
    for step in range(steps):
        factor = linear_schedule(step, steps, final=0.02)
        for group, peak in zip(optimizer.param_groups, peaks):
            group["lr"] = peak * factor
        index = torch.randint(0, len(blocks), (batch_size,), generator=generator)
        inputs, labels = mask_tokens(blocks[index], probability, generator)
        loss, _, _ = masked_lm_step(model, inputs, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        running.append(loss.item())
        if (step + 1) % log_every == 0 or step + 1 == steps:
            curve.append({"step": step + 1, "loss": sum(running) / len(running), "seconds": time.time() - start})
            running = []
    model.eval()
    return {"curve": curve, "train_seconds": time.time() - start}


@torch.no_grad()
def masked_lm_accuracy(model: nn.Module, ids: torch.Tensor, attention_mask: torch.Tensor, seed: int = 1234,
                       batch_size: int = 64) -> dict:
    """Masked-token accuracy and loss on held-out passages, the same masks for every model."""
    generator = torch.Generator().manual_seed(seed)
    model.eval()
    correct = total = 0
    loss_sum = 0.0
    for start in range(0, len(ids), batch_size):
        inputs, labels = mask_tokens(ids[start : start + batch_size], 0.15, generator)
        loss, right, count = masked_lm_step(model, inputs, labels, attention_mask[start : start + batch_size])
        correct, total, loss_sum = correct + right, total + count, loss_sum + loss.item() * count
    return {"accuracy": correct / total, "loss": loss_sum / total}


class Classifier(nn.Module):
    """Encoder, pooler (dense + tanh over the first token or the mean of the real tokens), dropout and a linear
    classifier: the same head for both architectures, as ``OrchidForSequenceClassification`` builds it."""

    def __init__(self, encoder: nn.Module, hidden: int, num_labels: int, pooling: str = "first", dropout: float = 0.1):
        super().__init__()
        if pooling not in ("first", "mean"):
            raise ValueError(f"pooling must be 'first' or 'mean', got {pooling!r}")
        self.encoder_model = encoder
        self.pooling = pooling
        self.dense = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden, num_labels)
        for layer in (self.dense, self.classifier):  # BERT's initialisation
            nn.init.normal_(layer.weight, std=0.02)
            nn.init.zeros_(layer.bias)

    def pooled_input(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.pooling == "first":
            return hidden[:, 0]
        real = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * real).sum(1) / real.sum(1).clamp_min(1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder_model(input_ids, attention_mask=attention_mask).last_hidden_state
        pooled = torch.tanh(self.dense(self.pooled_input(hidden, attention_mask)))
        return self.classifier(self.dropout(pooled))


def parameter_group(name: str) -> str:
    """embeddings, layer.<i>, or head, from a parameter's name in a :class:`Classifier`."""
    parts = name.split(".")
    if "embeddings" in parts:
        return "embeddings"
    if "layer" in parts:
        return f"layer.{parts[parts.index('layer') + 1]}"
    return "head"


@torch.no_grad()
def accuracy(model: Classifier, split: dict, batch_size: int = 128) -> float:
    model.eval()
    correct = 0
    for start in range(0, len(split["labels"]), batch_size):
        rows = slice(start, start + batch_size)
        logits = model(split["input_ids"][rows], split["attention_mask"][rows])
        correct += (logits.argmax(-1) == split["labels"][rows]).sum().item()
    return correct / len(split["labels"])


def finetune(model: Classifier, train: dict, evaluate: dict[str, dict], epochs: int, lr: float, seed: int = 0,
             batch_size: int = 32, grad_steps: int = 5) -> dict:
    """Fine-tuning in the classification recipe's settings; accuracy on each of ``evaluate`` after every epoch, and
    the gradient norm of each parameter group (:func:`parameter_group`) over the first ``grad_steps`` steps."""
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)
    count = len(train["labels"])
    per_epoch = count // batch_size
    total = per_epoch * epochs
    names = [(parameter_group(n), p) for n, p in model.named_parameters()]
    gradients: dict[str, list[float]] = {}
    history, step, train_seconds = [], 0, 0.0
    for epoch in range(epochs):
        start = time.time()
        model.train()
        order = torch.randperm(count, generator=generator)
        for batch in range(per_epoch):
            index = order[batch * batch_size : (batch + 1) * batch_size]
            for group in optimizer.param_groups:
                group["lr"] = lr * linear_schedule(step, total)
            logits = model(train["input_ids"][index], train["attention_mask"][index])
            loss = nn.functional.cross_entropy(logits, train["labels"][index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if step < grad_steps:
                squares: dict[str, float] = {}
                for group, parameter in names:
                    if parameter.grad is not None:
                        squares[group] = squares.get(group, 0.0) + parameter.grad.pow(2).sum().item()
                for group, square in squares.items():
                    gradients.setdefault(group, []).append(math.sqrt(square))
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            step += 1
        train_seconds += time.time() - start  # evaluation left out
        history.append({"epoch": epoch + 1, **{k: accuracy(model, v) for k, v in evaluate.items()}})
    return {"history": history, "final": history[-1], "first_step_gradient_norms": gradients,
            "train_seconds": train_seconds}
