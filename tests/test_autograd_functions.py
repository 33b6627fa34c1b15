"""The training path's custom autograd Functions and recomputed steps: gradients checked numerically, and results
equal to the written-out computation they replace, for the step alone and for a whole model."""

import pytest
import torch
from orchid_hf.modeling import orchid_layers
from orchid_hf.modeling.modeling_orchid import OrchidMLP, masked_lm_loss
from orchid_hf.modeling.orchid_layers import GatedActivation, OrchidOperator
from torch import nn
from torch.nn import CrossEntropyLoss
from transformers.activations import ACT2FN

from benchmarks.measure import saved_storage_bytes
from orchid_hf import OrchidConfig, OrchidForMaskedLM

ACTIVATIONS = ["gelu", "gelu_new", "silu", "relu"]


def written_out_glu(hidden: torch.Tensor, act: nn.Module) -> torch.Tensor:
    gate, value = hidden.chunk(2, dim=-1)
    return act(gate) * value


@pytest.mark.parametrize("activation", ["gelu", "gelu_new", "silu"])
def test_gated_activation_gradcheck_and_gradgradcheck(activation):
    torch.manual_seed(0)
    act = ACT2FN[activation]
    hidden = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda h: GatedActivation.apply(h, act), (hidden,))
    assert torch.autograd.gradgradcheck(lambda h: GatedActivation.apply(h, act), (hidden,))


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_gated_activation_equals_the_written_out_glu(activation):
    torch.manual_seed(0)
    act = ACT2FN[activation]
    hidden = torch.randn(4, 7, 16)
    grad = torch.randn(4, 7, 8)
    results = []
    for glu in (lambda h: GatedActivation.apply(h, act), lambda h: written_out_glu(h, act)):
        leaf = hidden.clone().requires_grad_(True)
        out = glu(leaf)
        out.backward(grad)
        results.append((out.detach(), leaf.grad))
    (out, grad_hidden), (reference_out, reference_grad) = results
    torch.testing.assert_close(out, reference_out, rtol=0, atol=0)
    torch.testing.assert_close(grad_hidden, reference_grad, rtol=1e-6, atol=1e-7)


def test_the_glu_mlp_saves_less_for_backward_than_the_written_out_glu():
    torch.manual_seed(0)
    config = OrchidConfig(
        hidden_size=32, intermediate_size=128, mlp_type="glu", mlp_num_blocks=4, hidden_dropout_prob=0.0
    )
    mlp = OrchidMLP(config)
    x = torch.randn(2, 64, 32, requires_grad=True)
    fused = saved_storage_bytes(mlp, x)
    gelu = mlp.act

    def written_out(inputs):
        return mlp.down_proj(written_out_glu(mlp.up_proj(inputs), gelu))

    intermediate_bytes = 2 * 64 * 128 * 4  # act(gate): tokens x intermediate_size float32
    assert saved_storage_bytes(written_out, x) - fused == intermediate_bytes


def test_the_activation_hooks_fire_once_per_call_in_training():
    torch.manual_seed(0)
    config = OrchidConfig(hidden_size=32, intermediate_size=64, mlp_type="glu", mlp_num_blocks=2)
    mlp = OrchidMLP(config)
    calls = []
    mlp.act.register_forward_hook(lambda module, inputs, output: calls.append(output.shape))
    mlp(torch.randn(2, 5, 32, requires_grad=True)).sum().backward()
    assert calls == [torch.Size([2, 5, 64])]


def mlm_loss_and_grads(model, ids, mask, labels):
    """The masked-LM loss of one forward and every parameter's gradient after its backward."""
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.slow
def test_model_gradients_equal_the_written_out_glu():
    """The whole masked-LM model, loss and every parameter's gradient, against the same weights with the GLU written
    out as autograd would record it (float32, 1e-5)."""
    torch.manual_seed(0)
    config = OrchidConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                          max_position_embeddings=16, hidden_dropout_prob=0.0, mlp_type="glu", mlp_num_blocks=4,
                          chunk_size_feed_forward=8)
    model = OrchidForMaskedLM(config).train()
    ids = torch.randint(0, 50, (3, 16))
    labels = torch.where(torch.rand(3, 16) < 0.3, ids, torch.full_like(ids, -100))
    mask = torch.ones(3, 16, dtype=torch.long)
    mask[1, 11:] = 0

    loss, grads = mlm_loss_and_grads(model, ids, mask, labels)
    original = OrchidMLP.forward

    def written_out_forward(self, hidden_states):
        return self.dropout(self.down_proj(written_out_glu(self.up_proj(hidden_states), self.act)))

    OrchidMLP.forward = written_out_forward
    try:
        reference_loss, reference_grads = mlm_loss_and_grads(model, ids, mask, labels)
    finally:
        OrchidMLP.forward = original
    torch.testing.assert_close(loss, reference_loss, rtol=0, atol=0)
    assert grads.keys() == reference_grads.keys() and len(grads) > 20
    for name, grad in grads.items():
        torch.testing.assert_close(grad, reference_grads[name], rtol=1e-5, atol=1e-5, msg=name)


# ---------------------------------------------------------------------------------------------
# The long convolutions, recomputed in backward (orchid_layers.recomputed_in_backward)
# ---------------------------------------------------------------------------------------------


def written_out(function, *args):
    """A plain call, as autograd would record the long convolutions without recomputation."""
    return function(*args)


@pytest.mark.parametrize("transform", ["dct", "fft"])
def test_the_long_convolutions_keep_less_for_backward(transform, monkeypatch):
    """Recomputed, the long convolutions keep only their inputs, which the layer keeps anyway. Written out, autograd
    keeps for each of the two convolutions the transform of its input (B, N, d), and the convolution before its gate;
    under the FFT, the transforms are complex (B, N/2 + 1, d), the input zero-padded to N is kept for each as well, and
    the gate's operand is a view of the whole (B, N, d) inverse transform."""
    torch.manual_seed(0)
    batch, length, n, d = 2, 24, 32, 16
    op = OrchidOperator(d, n, transform=transform, filter_width=8)
    x = torch.randn(batch, length, d, requires_grad=True)
    recomputed = saved_storage_bytes(op, x)
    monkeypatch.setattr(orchid_layers, "recomputed_in_backward", written_out)
    real = batch * d * 4  # bytes per position of a (B, ., d) float32 tensor
    if transform == "dct":
        kept = 2 * n * real + length * real
    else:
        kept = 2 * n * real + 2 * (n // 2 + 1) * 2 * real + n * real
    assert saved_storage_bytes(op, x) - recomputed == kept


@pytest.mark.parametrize("transform,conditioning", [("dct", "abs"), ("fft", "xcorr")])
def test_model_gradients_equal_the_written_out_long_convolutions(transform, conditioning, monkeypatch):
    """The masked-LM model's loss and every parameter's gradient, with padding on the left of one row and on the right
    of another, equal those of the same model with the long convolutions written out (float32, 1e-6)."""
    torch.manual_seed(0)
    config = OrchidConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                          max_position_embeddings=16, hidden_dropout_prob=0.0, transform=transform,
                          conditioning=conditioning, filter_width=8)  # fmt: skip
    model = OrchidForMaskedLM(config).train()
    ids = torch.randint(0, 50, (3, 16))
    labels = torch.where(torch.rand(3, 16) < 0.3, ids, torch.full_like(ids, -100))
    mask = torch.ones(3, 16, dtype=torch.long)
    mask[1, 11:] = 0
    mask[2, :5] = 0

    loss, grads = mlm_loss_and_grads(model, ids, mask, labels)
    monkeypatch.setattr(orchid_layers, "recomputed_in_backward", written_out)
    reference_loss, reference_grads = mlm_loss_and_grads(model, ids, mask, labels)
    torch.testing.assert_close(loss, reference_loss, rtol=0, atol=0)
    assert grads.keys() == reference_grads.keys() and len(grads) > 20
    for name, grad in grads.items():
        torch.testing.assert_close(grad, reference_grads[name], rtol=1e-6, atol=1e-6, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("transform", ["dct", "fft"])
def test_the_operator_gradgradcheck_through_the_recomputed_long_convolutions(transform):
    torch.manual_seed(0)
    op = OrchidOperator(3, 7, transform=transform, conditioning="xcorr", filter_width=8).double()
    x = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 1, 0]])
    assert torch.autograd.gradgradcheck(lambda inp: op(inp, mask), (x,), eps=1e-6, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# The masked-LM loss over the labelled positions (modeling_orchid.masked_lm_loss)
# ---------------------------------------------------------------------------------------------


def test_masked_lm_loss_equals_cross_entropy_over_all_positions():
    """The log-softmax over the labelled positions only gives the loss of CrossEntropyLoss over all positions (to
    rounding: the sum runs in another order) and exactly its gradients."""
    torch.manual_seed(0)
    logits = torch.randn(3, 40, 50, requires_grad=True)
    ids = torch.randint(0, 50, (3, 40))
    labels = torch.where(torch.rand(3, 40) < 0.15, ids, torch.full_like(ids, -100))
    loss = masked_lm_loss(logits, labels)
    (grad,) = torch.autograd.grad(loss, logits)
    reference = CrossEntropyLoss()(logits.view(-1, 50), labels.view(-1))
    (reference_grad,) = torch.autograd.grad(reference, logits)
    torch.testing.assert_close(loss, reference, rtol=1e-6, atol=0)
    assert torch.equal(grad, reference_grad)
    assert grad[labels == -100].abs().sum() == 0 and grad[labels != -100].abs().sum() > 0


def test_masked_lm_loss_without_labels_and_with_labels_of_another_shape():
    logits = torch.randn(2, 8, 10)
    nothing = torch.full((2, 8), -100)
    assert masked_lm_loss(logits, nothing).isnan() and CrossEntropyLoss()(logits.view(-1, 10), nothing.view(-1)).isnan()
    with pytest.raises(ValueError, match=r"labels has shape \(16,\), expected \(batch, length\) = \(2, 8\)"):
        masked_lm_loss(logits, torch.zeros(16, dtype=torch.long))
