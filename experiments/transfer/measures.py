"""Measurements of an encoder: linear probes on frozen features of every layer, hidden-state norms, and, for
Orchid, how far each position sees through the long convolution (static and data-dependent kernels), the
conditioning network's scale, the size of the implicit filters' kernels; the pooler's tanh saturation."""

from __future__ import annotations

import numpy as np
import torch
from orchid_hf.modeling.orchid_ops import dct, idct, masked
from torch import nn


@torch.no_grad()
def layer_features(encoder: nn.Module, split: dict, batch_size: int = 128) -> dict[str, np.ndarray]:
    """``first`` and ``mean`` (over real tokens) features of every hidden state (embeddings, then each layer's
    output), shape (layers + 1, examples, hidden); and ``norm``: the mean L2 norm of a real token's state per
    layer, ``first_norm`` that of position 0."""
    encoder.eval()
    first, mean, norm, first_norm = [], [], [], []
    for start in range(0, len(split["labels"]), batch_size):
        ids = split["input_ids"][start : start + batch_size]
        mask = split["attention_mask"][start : start + batch_size]
        states = torch.stack(encoder(ids, attention_mask=mask, output_hidden_states=True).hidden_states)
        real = mask.unsqueeze(-1).to(states.dtype)
        first.append(states[:, :, 0])
        mean.append((states * real).sum(2) / real.sum(1))
        token_norms = states.norm(dim=-1)  # (layers + 1, batch, length)
        norm.append((token_norms * mask).sum((1, 2)) / mask.sum())
        first_norm.append(token_norms[:, :, 0].mean(1))
    return {
        "first": torch.cat(first, 1).numpy(),
        "mean": torch.cat(mean, 1).numpy(),
        "norm": torch.stack(norm).mean(0).numpy(),
        "first_norm": torch.stack(first_norm).mean(0).numpy(),
    }


def probe_accuracy(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray,
                   c: float = 1.0, max_iter: int = 500) -> float:
    """Test accuracy of a logistic regression (lbfgs, L2 strength 1/c) on standardised features."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(train_x)
    model = LogisticRegression(C=c, max_iter=max_iter).fit(scaler.transform(train_x), train_y)
    return float((model.predict(scaler.transform(test_x)) == test_y).mean())


def bag_of_words_accuracy(train: dict, test: dict, vocab_size: int = 30522, c: float = 1.0) -> float:
    """The floor every encoder's features should clear: logistic regression on token frequencies."""
    from scipy.sparse import csr_matrix
    from sklearn.linear_model import LogisticRegression

    def counts(split):
        ids = split["input_ids"].numpy()
        rows = np.repeat(np.arange(len(ids)), ids.shape[1])
        matrix = csr_matrix((np.ones(ids.size), (rows, ids.ravel())), shape=(len(ids), vocab_size))
        return matrix.multiply(1.0 / matrix.sum(1)).tocsr()

    model = LogisticRegression(C=c, max_iter=1000).fit(counts(train) * 100, train["labels"].numpy())
    return float((model.predict(counts(test) * 100) == test["labels"].numpy()).mean())


def position_zero_response(multiplier: torch.Tensor) -> torch.Tensor:
    """What position 0 reads from each position through the DCT-domain long convolution ``idct(dct(x) * M)``:
    the operator ``C^T diag(M) C`` is symmetric, so its row 0 is its response to an impulse at 0. ``multiplier``
    (..., n, channels); returns (..., n, channels)."""
    impulse = torch.zeros_like(multiplier)
    impulse[..., 0, :] = 1.0
    return idct(dct(impulse, dim=-2) * multiplier, dim=-2)


def energy_within(response: torch.Tensor, lags: int) -> torch.Tensor:
    """The fraction of a response's energy (..., n, channels) within the first ``lags`` positions, per channel."""
    energy = response.pow(2)
    return energy[..., :lags, :].sum(-2) / energy.sum(-2).clamp_min(1e-30)


def effective_width(response: torch.Tensor, fraction: float = 0.9) -> torch.Tensor:
    """The number of positions from 0 that hold ``fraction`` of the response's energy, per channel (1 for an
    impulse)."""
    energy = response.pow(2)
    cumulative = energy.cumsum(-2) / energy.sum(-2, keepdim=True).clamp_min(1e-30)
    return (cumulative < fraction - 1e-6).sum(-2) + 1


def summarise_response(response: torch.Tensor, lags=(1, 4, 16, 64)) -> dict:
    widths = effective_width(response).float()
    summary = {"median_width_90": float(widths.median()), "mean_width_90": float(widths.mean())}
    for lag in lags:
        summary[f"energy_within_{lag}"] = float(energy_within(response, lag).mean())
    return summary


@torch.no_grad()
def orchid_operator_stats(encoder: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> list[dict]:
    """Per layer of an Orchid encoder, on a batch: how far position 0 sees through the static kernel, the
    data-dependent kernel (static + conditioning network's output) and the residual long convolution; the RMS of
    the static multiplier and of the conditioning network's output; the RMS of the mixer's input and output."""
    inputs: dict[int, tuple] = {}
    outputs: dict[int, torch.Tensor] = {}
    layers = encoder.encoder.layer
    hooks = []
    for index, layer in enumerate(layers):
        hooks.append(layer.mixer.register_forward_pre_hook(
            lambda module, args, index=index: inputs.__setitem__(index, args)))
        hooks.append(layer.mixer.register_forward_hook(
            lambda module, args, out, index=index: outputs.__setitem__(index, out)))
    encoder.eval()
    encoder(ids, attention_mask=mask)
    for hook in hooks:
        hook.remove()
    stats = []
    real = mask.bool().unsqueeze(-1)
    for index, layer in enumerate(layers):
        mixer = layer.mixer
        x = inputs[index][0]
        d, n = mixer.d_model, mixer.max_len
        static = mixer.static_filter.spectrum(torch.float32)  # (n, d)
        entry = {"layer": index, "static": summarise_response(position_zero_response(static)),
                 "static_multiplier_rms": float(static.pow(2).mean().sqrt()),
                 "mixer_input_rms": float(x[real.expand_as(x)].pow(2).mean().sqrt()),
                 "mixer_output_rms": float(outputs[index][real.expand_as(x)].pow(2).mean().sqrt())}
        if mixer.conditioning is not None:
            source = masked(mixer.in_proj(masked(x, real)), real)[..., 2 * d :]
            conditioned = mixer.conditioning(source, n, real)  # (B, n, d)
            entry["conditioning_rms"] = float(conditioned.pow(2).mean().sqrt())
            entry["data_dependent"] = summarise_response(position_zero_response(static + conditioned))
        if mixer.residual_filter is not None:
            entry["residual"] = summarise_response(
                position_zero_response(mixer.residual_filter.spectrum(torch.float32)))
        stats.append(entry)
    return stats


@torch.no_grad()
def pooler_saturation(pooled_input: torch.Tensor, dense: nn.Linear) -> dict:
    """Of the pooler's tanh: the RMS of its input, the fraction of units beyond |tanh| > 0.95 (saturated), and
    the RMS of the features it pools (the encoder's output at the pooled position)."""
    pre = dense(pooled_input)
    return {"pooled_feature_rms": float(pooled_input.pow(2).mean().sqrt()),
            "tanh_input_rms": float(pre.pow(2).mean().sqrt()),
            "saturated_fraction": float((pre.tanh().abs() > 0.95).float().mean())}


def participation_ratio(features: np.ndarray) -> float:
    """The effective number of dimensions of features (examples, hidden): ``(sum l)^2 / sum l^2`` over the
    eigenvalues l of their covariance; 1 when all variance lies along one direction, hidden when it is spread
    evenly."""
    centred = features - features.mean(0, keepdims=True)
    eigenvalues = np.clip(np.linalg.eigvalsh(centred.T @ centred / max(len(features) - 1, 1)), 0, None)
    return float(eigenvalues.sum() ** 2 / max((eigenvalues**2).sum(), 1e-30))


@torch.no_grad()
def implicit_kernel_rms(model: nn.Module) -> dict[str, float]:
    """The root mean square of the time-domain kernel h0 of every implicit filter of an Orchid model (the static
    kernel and the residual long convolution of each layer), by module name: how much of the long convolution its
    training has left beside the skip term D."""
    return {name: float(module().float().pow(2).mean().sqrt()) for name, module in model.named_modules()
            if type(module).__name__ == "ImplicitFilter"}  # fmt: skip
