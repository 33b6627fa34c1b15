"""Measurements of an encoder: linear probes on frozen features of every layer, hidden-state norms, and, for
Orchid, how far each position sees through its long convolutions (the static kernel h0, the residual convolution's
kernel, the data-dependent kernel), the conditioning network's scale, the size of the implicit filters' kernels; the
pooler's tanh saturation.

Orchid's kernels are read from what the operator's modules return while the model runs (forward hooks): its
``static_filter`` and ``residual_filter`` return their kernel h0 in the time domain, (n, channels), and its
``conditioning`` network the spectrum of the data-dependent kernel, (batch, n, channels), n being the transform length
each row is mixed at. Nothing of the operator is computed here again.
"""

from __future__ import annotations

import numpy as np
import torch
from orchid_hf.modeling.orchid_ops import dct, idct
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


def summarise_responses(responses: list[torch.Tensor], lags=(1, 4, 16, 64)) -> dict:
    """The 90%-energy width (:func:`effective_width`) of every channel of ``responses`` (each (..., n, channels),
    of any n), its median and mean, and the mean fraction of the energy within each of ``lags``."""
    widths = torch.cat([effective_width(response).flatten().float() for response in responses])
    summary = {"median_width_90": float(widths.median()), "mean_width_90": float(widths.mean())}
    for lag in lags:
        fractions = torch.cat([energy_within(response, lag).flatten() for response in responses])
        summary[f"energy_within_{lag}"] = float(fractions.mean())
    return summary


def root_mean_square(tensors: list[torch.Tensor]) -> float:
    """The root mean square of every entry of ``tensors`` together."""
    squares = torch.cat([tensor.detach().float().pow(2).flatten() for tensor in tensors])
    return float(squares.mean().sqrt())


def mixer_real_tokens(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """Which of the tokens an operator is called on are real, from the arguments of the call: the ``layout``'s
    ``real`` where the model passes one (its tokens; None: all of them real), else the ``attention_mask``, (..., 1)."""
    layout = kwargs.get("layout")
    if layout is not None:
        return layout.real
    mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
    return None if mask is None else mask.bool().unsqueeze(-1)


def real_entries(tensor: torch.Tensor, real: torch.Tensor | None) -> torch.Tensor:
    """The entries of ``tensor`` (..., d) at the tokens that ``real`` (..., 1) marks; all of them for None."""
    return tensor if real is None else tensor[real.expand_as(tensor)]


@torch.no_grad()
def orchid_operator_stats(encoder: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> list[dict]:
    """Per layer of an Orchid encoder (DCT), on a batch, from what the operator's modules return during the forward:
    how far position 0 sees through the static kernel h0 (``static``: its ``static_filter``'s output over the lags),
    the residual long convolution's kernel (``residual``) and the data-dependent kernel (``data_dependent``: row 0 of
    the long convolution with the spectrum that its ``conditioning`` network returns, :func:`position_zero_response`);
    the RMS of h0 (``static_kernel_rms``) and of that spectrum (``conditioning_rms``); the RMS of the mixer's input
    and output at the real tokens."""
    layers = encoder.encoder.layer
    seen: dict[tuple[int, str], list] = {}
    hooks = []

    def keep(index: int, name: str):
        def hook(module, args, output):
            seen.setdefault((index, name), []).append(output)

        return hook

    def keep_input(index: int):
        def hook(module, args, kwargs):
            seen[(index, "input")] = [args[0]]
            seen[(index, "real")] = [mixer_real_tokens(args, kwargs)]

        return hook

    for index, layer in enumerate(layers):
        mixer = layer.mixer
        if mixer.transform != "dct":
            raise ValueError(f"orchid_operator_stats reads kernels of the DCT, but layer {index} has transform "
                             f"{mixer.transform!r}")  # fmt: skip
        hooks.append(mixer.register_forward_pre_hook(keep_input(index), with_kwargs=True))
        hooks.append(mixer.register_forward_hook(keep(index, "output")))
        for name in ("static_filter", "residual_filter", "conditioning"):
            if getattr(mixer, name) is not None:
                hooks.append(getattr(mixer, name).register_forward_hook(keep(index, name)))
    encoder.eval()
    try:
        encoder(ids, attention_mask=mask)
    finally:
        for hook in hooks:
            hook.remove()
    stats = []
    for index in range(len(layers)):
        static = seen[(index, "static_filter")]
        real = seen[(index, "real")][0]
        entry = {"layer": index, "static": summarise_responses(static), "static_kernel_rms": root_mean_square(static),
                 "mixer_input_rms": root_mean_square([real_entries(seen[(index, "input")][0], real)]),
                 "mixer_output_rms": root_mean_square([real_entries(seen[(index, "output")][0], real)])}  # fmt: skip
        if (index, "conditioning") in seen:
            spectra = seen[(index, "conditioning")]
            entry["conditioning_rms"] = root_mean_square(spectra)
            entry["data_dependent"] = summarise_responses([position_zero_response(s.float()) for s in spectra])
        if (index, "residual_filter") in seen:
            entry["residual"] = summarise_responses(seen[(index, "residual_filter")])
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
