"""Gradients of the model and its losses: the operator's second derivatives, gradient checkpointing against the plain
model, and the masked-LM loss over the labelled positions against the loss over all positions."""

import pytest
import torch
from orchid_hf.modeling.modeling_orchid import masked_lm_loss
from orchid_hf.modeling.orchid_layers import OrchidOperator
from torch.nn import CrossEntropyLoss

from orchid_hf import OrchidConfig, OrchidForMaskedLM


def mlm_loss_and_grads(model, ids, mask, labels):
    """The masked-LM loss of one forward and every parameter's gradient after its backward."""
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def tiny_mlm(**overrides) -> OrchidForMaskedLM:
    torch.manual_seed(0)
    settings = dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                    max_position_embeddings=16, hidden_dropout_prob=0.0, filter_width=8, mlp_num_blocks=4)
    return OrchidForMaskedLM(OrchidConfig(**{**settings, **overrides})).train()


def mlm_batch_padded_on_both_sides():
    ids = torch.randint(0, 50, (3, 16))
    labels = torch.where(torch.rand(3, 16) < 0.3, ids, torch.full_like(ids, -100))
    mask = torch.ones(3, 16, dtype=torch.long)
    mask[1, 11:] = 0
    mask[2, :5] = 0
    return ids, mask, labels


def assert_same_gradients(result, reference, tolerance):
    (loss, grads), (reference_loss, reference_grads) = result, reference
    torch.testing.assert_close(loss, reference_loss, rtol=0, atol=0)
    assert grads.keys() == reference_grads.keys() and len(grads) > 20
    for name, grad in grads.items():
        torch.testing.assert_close(grad, reference_grads[name], rtol=tolerance, atol=tolerance, msg=name)


def test_gradient_checkpointing_gives_the_gradients_of_the_plain_model():
    """transformers' gradient checkpointing recomputes each layer in backward: the loss and gradients are the plain
    model's, with padding on either side."""
    model = tiny_mlm()
    batch = mlm_batch_padded_on_both_sides()
    result = mlm_loss_and_grads(model, *batch)
    model.activation_checkpointing_enable()
    assert_same_gradients(mlm_loss_and_grads(model, *batch), result, 1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("transform", ["dct", "fft"])
def test_the_operator_gradgradcheck(transform):
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
