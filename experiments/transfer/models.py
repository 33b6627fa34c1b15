"""The two architectures at the same small size, as the package and transformers build them, masked-LM pretraining
and fine-tuning in plain loops.

Models: ``OrchidForMaskedLM`` and ``BertForMaskedLM`` for pretraining; for fine-tuning, the pretrained encoder in
``OrchidForSequenceClassification`` or ``BertForSequenceClassification`` (:func:`build_classifier`); masking by
transformers' ``DataCollatorForLanguageModeling``. Plain PyTorch loops rather than the package's Trainer recipes: each
run here is minutes on one thread, and a loop lets the diagnosis read gradients and activations at any step. The loops
follow the recipes' settings: pretraining as ``orchid-bert-base-mlm`` (30% masking, 80/10/10, AdamW betas (0.9, 0.98),
eps 1e-6, 6% warmup then linear decay to 0.02x; Orchid's implicit filters in their own group at the recipe's learning
rate and weight decay), fine-tuning as ``orchid-bert-classification`` (AdamW, weight decay 0.01, 6% warmup then linear
decay to 0, gradient clipping at 1, batch 32).
"""

from __future__ import annotations

import copy
import math
import time

import torch
from orchid_hf.modeling import OrchidConfig, OrchidForMaskedLM, OrchidForSequenceClassification
from torch import nn
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForSequenceClassification,
    DataCollatorForLanguageModeling,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from orchid_hf.recipes import FILTER_LEARNING_RATE, FILTER_WEIGHT_DECAY

ARCHS = ("orchid", "bert")
POOLINGS = ("first", "mean")
FILTER_NAMES = ("static_filter", "residual_filter")


def build_mlm_model(arch: str, hidden: int, layers: int, intermediate: int, max_positions: int, dropout: float = 0.1,
                    pre_norm: bool = False, seed: int = 0) -> PreTrainedModel:
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


def mlm_head_of(model: PreTrainedModel) -> nn.Module:
    """The masked-LM head (transform and decoder) of ``OrchidForMaskedLM`` or ``BertForMaskedLM``."""
    return model.lm_head if hasattr(model, "lm_head") else model.cls


def masking(tokenizer: PreTrainedTokenizerBase, probability: float, seed: int) -> DataCollatorForLanguageModeling:
    """BERT masking of the tokens that are not special (``[CLS]``, ``[SEP]``, padding, ...): ``probability`` of them
    chosen, 80% of those replaced by ``[MASK]``, 10% by a random token; its draws from a generator seeded by
    ``seed``. Called on a list of equally long rows of token ids, it returns their ``input_ids`` and ``labels``
    (-100 where nothing is predicted)."""
    return DataCollatorForLanguageModeling(tokenizer, mlm_probability=probability, seed=seed)


def masked_lm_step(model: PreTrainedModel, inputs: torch.Tensor, labels: torch.Tensor, attention_mask=None):
    """The loss and the number of correct predictions over the masked positions only: the model's encoder on every
    position, its head on the masked ones (the vocabulary projection of the other positions would be most of the
    work and adds nothing)."""
    hidden = model.base_model(inputs, attention_mask=attention_mask).last_hidden_state
    where = labels != -100
    logits = mlm_head_of(model)(hidden[where])
    target = labels[where]
    return nn.functional.cross_entropy(logits, target), (logits.argmax(-1) == target).sum().item(), target.numel()


def linear_schedule(step: int, total: int, warmup_fraction: float = 0.06, final: float = 0.0) -> float:
    warmup = max(1, math.ceil(warmup_fraction * total))
    if step < warmup:
        return (step + 1) / warmup
    return final + (1 - final) * max(0.0, (total - step) / max(1, total - warmup))


def pretrain(model: PreTrainedModel, blocks: torch.Tensor, tokenizer: PreTrainedTokenizerBase, steps: int,
             batch_size: int = 32, lr: float = 8e-4, filter_lr: float = FILTER_LEARNING_RATE, seed: int = 0,
             probability: float = 0.3, log_every: int = 50) -> dict:
    """Masked-LM pretraining in the recipe's settings on rows of ``blocks`` drawn at random; returns the loss
    curve."""
    generator = torch.Generator().manual_seed(seed)
    collator = masking(tokenizer, probability, seed)
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
        batch = collator(list(blocks[index]))
        loss, _, _ = masked_lm_step(model, batch["input_ids"], batch["labels"])
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
def masked_lm_accuracy(model: PreTrainedModel, ids: torch.Tensor, attention_mask: torch.Tensor,
                       tokenizer: PreTrainedTokenizerBase, seed: int = 1234, batch_size: int = 64) -> dict:
    """Masked-token accuracy and loss on held-out passages, the same masks for every model."""
    collator = masking(tokenizer, 0.15, seed)
    model.eval()
    correct = total = 0
    loss_sum = 0.0
    for start in range(0, len(ids), batch_size):
        batch = collator(list(ids[start : start + batch_size]))
        loss, right, count = masked_lm_step(model, batch["input_ids"], batch["labels"],
                                            attention_mask[start : start + batch_size])
        correct, total, loss_sum = correct + right, total + count, loss_sum + loss.item() * count
    return {"accuracy": correct / total, "loss": loss_sum / total}


# ---------------------------------------------------------------------------------------------
# Fine-tuning
# ---------------------------------------------------------------------------------------------


def build_classifier(mlm: PreTrainedModel, num_labels: int, pooling: str = "first") -> PreTrainedModel:
    """The sequence classifier of the masked-LM model's architecture, ``OrchidForSequenceClassification`` or
    ``BertForSequenceClassification``, with the same config and the masked-LM model's encoder weights; its pooler
    (dense + tanh) and classifier as the class initialises them.

    ``pooling``: the pooler reads the first token, or the mean of the real tokens. Orchid's pooler does either
    (``classifier_pooling``); BERT's reads the first token only, so for ``"mean"`` it reads the mean through
    :func:`pool_the_mean`."""
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    config = copy.deepcopy(mlm.config)
    config.num_labels = num_labels
    if isinstance(mlm, OrchidForMaskedLM):
        config.classifier_pooling = pooling
        model = OrchidForSequenceClassification(config)
    else:
        model = BertForSequenceClassification(config)
        if pooling == "mean":
            pool_the_mean(model)
    missing, unexpected = model.base_model.load_state_dict(mlm.base_model.state_dict(), strict=False)
    # BertForMaskedLM's encoder has no pooler; everything else must match.
    if unexpected or any(not name.startswith("pooler.") for name in missing):
        raise ValueError(f"the masked-LM encoder does not fit the classifier: missing {missing}, unexpected "
                         f"{unexpected}")  # fmt: skip
    return model


def pool_the_mean(model: BertForSequenceClassification) -> None:
    """Make BERT's pooler read the mean of the real tokens instead of the first token: a forward pre-hook on the model
    keeps the call's attention mask, and one on its pooler puts the mean of the hidden states over the real tokens
    where the pooler reads, at the first position."""
    call = {}

    def keep_mask(module, args, kwargs):
        call["attention_mask"] = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)

    def mean_first(pooler, args):
        hidden = args[0]
        mask = call.get("attention_mask")
        real = hidden.new_ones(hidden.shape[:2]) if mask is None else mask.to(hidden.dtype)
        real = real.unsqueeze(-1)
        return ((hidden * real).sum(1, keepdim=True) / real.sum(1, keepdim=True).clamp_min(1),)

    model.register_forward_pre_hook(keep_mask, with_kwargs=True)
    model.bert.pooler.register_forward_pre_hook(mean_first)


def pooler_dense(model: PreTrainedModel) -> nn.Linear:
    """The dense layer of a sequence classifier's pooler (before its tanh)."""
    pooler = model.pooler if hasattr(model, "pooler") else model.base_model.pooler
    return pooler.dense


@torch.no_grad()
def pooled_features(model: PreTrainedModel, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """What a sequence classifier's pooler reads (the first token's or the mean of the real tokens' last hidden state),
    (batch, hidden): the input of its dense layer, read by a forward pre-hook during an evaluation forward."""
    seen = []
    hook = pooler_dense(model).register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    try:
        model.eval()(input_ids=ids, attention_mask=attention_mask)
    finally:
        hook.remove()
    return seen[0]


def init_pooler_from_mlm(classifier: PreTrainedModel, mlm: PreTrainedModel) -> None:
    """The pooler's dense layer from the masked-LM head's transform (dense + GELU + LayerNorm in both
    architectures), the one pretrained layer that reads the last hidden states."""
    source = mlm_head_of(mlm)
    dense = source.dense if hasattr(source, "dense") else source.predictions.transform.dense
    pooler_dense(classifier).load_state_dict(dense.state_dict())


def parameter_group(name: str) -> str:
    """embeddings, layer.<i>, or head, from a parameter's name in a sequence classifier."""
    parts = name.split(".")
    if "embeddings" in parts:
        return "embeddings"
    if "layer" in parts:
        return f"layer.{parts[parts.index('layer') + 1]}"
    return "head"


@torch.no_grad()
def accuracy(model: PreTrainedModel, split: dict, batch_size: int = 128) -> float:
    model.eval()
    correct = 0
    for start in range(0, len(split["labels"]), batch_size):
        rows = slice(start, start + batch_size)
        logits = model(input_ids=split["input_ids"][rows], attention_mask=split["attention_mask"][rows]).logits
        correct += (logits.argmax(-1) == split["labels"][rows]).sum().item()
    return correct / len(split["labels"])


def finetune(model: PreTrainedModel, train: dict, evaluate: dict[str, dict], epochs: int, lr: float, seed: int = 0,
             batch_size: int = 32, grad_steps: int = 5) -> dict:
    """Fine-tuning in the classification recipe's settings, on the model's own loss; accuracy on each of ``evaluate``
    after every epoch, and the gradient norm of each parameter group (:func:`parameter_group`) over the first
    ``grad_steps`` steps."""
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
            loss = model(input_ids=train["input_ids"][index], attention_mask=train["attention_mask"][index],
                         labels=train["labels"][index]).loss  # fmt: skip
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
