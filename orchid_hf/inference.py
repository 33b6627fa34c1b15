"""Inference as an explicit opt-in: :func:`optimize_for_inference`."""

from __future__ import annotations

import copy

from torch import nn

from .modeling.orchid_layers import FoldedFilter, ImplicitFilter, ImplicitFilter2d, OrchidOperator


def optimize_for_inference(model: nn.Module) -> nn.Module:
    """A copy of ``model`` (an Orchid model or operator) for inference, with the same outputs: in eval mode, without
    gradients, and with each static implicit filter folded into the multiplier it computes (:class:`FoldedFilter`),
    which the plain model computes from the filter's network on every call. ``model`` is left as it was.

    The copy is built from the model's own modules: every projection, convolution and norm is the plain model's, and
    the folded filters are buffers with no parameters behind them, so no edit can make the copy stale. It runs on any
    device and dtype, exports to ONNX and compiles like the plain model; it cannot be saved (save the plain model).
    """
    fast = copy.deepcopy(model).eval().requires_grad_(False)
    for module in list(fast.modules()):
        # An operator's filters serve each of its transform lengths: each is folded at every one.
        lengths = module.transform_lengths if isinstance(module, OrchidOperator) else None
        for name, child in module.named_children():
            if isinstance(child, (ImplicitFilter, ImplicitFilter2d)):
                setattr(module, name, FoldedFilter(child, lengths))
    return fast


__all__ = ["optimize_for_inference"]
