"""The training path's custom autograd Functions and recomputed steps (modeling/orchid_ops.py): gradients checked
numerically, what each keeps for backward, and results equal to the written-out computation they replace, for the
step alone and for a whole model, with hooks, padding and gradient checkpointing."""

import contextlib

import pytest
import torch
from orchid_hf.modeling import modeling_orchid, orchid_ops
from orchid_hf.modeling.modeling_orchid import OrchidMLP, masked_lm_loss
from orchid_hf.modeling.orchid_layers import OrchidOperator
from orchid_hf.modeling.orchid_ops import GatedActivation, gated_activation_ref
from torch.nn import CrossEntropyLoss
from transformers.activations import ACT2FN

from benchmarks.measure import retained_bytes
from orchid_hf import OrchidConfig, OrchidForMaskedLM

ACTIVATIONS = ["gelu", "gelu_new", "silu", "relu"]


def plain_call(function, *args, modules=(), **kwargs):
    return function(*args, **kwargs)


@pytest.fixture
def written_out(monkeypatch):
    """Within the test, after the fixture's call: nothing recomputed in backward, every step's graph recorded as
    autograd writes it (the reference of recomputed_in_backward and saved_as_recomputation)."""

    def write_out():
        monkeypatch.setattr(orchid_ops, "recomputed_in_backward", plain_call)
        monkeypatch.setattr(modeling_orchid, "saved_as_recomputation", lambda *args, **kwargs: contextlib.nullcontext())

    return write_out


@pytest.mark.parametrize("activation", ["gelu", "gelu_new", "silu"])
def test_gated_activation_gradcheck_and_gradgradcheck(activation):
    torch.manual_seed(0)
    act = ACT2FN[activation]
    hidden = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda h: GatedActivation.apply(h, act), (hidden,))
    assert torch.autograd.gradgradcheck(lambda h: GatedActivation.apply(h, act), (hidden,))


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_gated_activation_equals_its_reference(activation):
    torch.manual_seed(0)
    act = ACT2FN[activation]
    hidden = torch.randn(4, 7, 16)
    grad = torch.randn(4, 7, 8)
    results = []
    for glu in (lambda h: GatedActivation.apply(h, act), lambda h: gated_activation_ref(h, act)):
        leaf = hidden.clone().requires_grad_(True)
        out = glu(leaf)
        out.backward(grad)
        results.append((out.detach(), leaf.grad))
    (out, grad_hidden), (reference_out, reference_grad) = results
    torch.testing.assert_close(out, reference_out, rtol=0, atol=0)
    torch.testing.assert_close(grad_hidden, reference_grad, rtol=1e-6, atol=1e-7)


def glu_config(**overrides) -> OrchidConfig:
    settings = dict(hidden_size=32, intermediate_size=128, mlp_type="glu", mlp_num_blocks=4, hidden_dropout_prob=0.0)
    return OrchidConfig(**{**settings, **overrides})


@pytest.mark.parametrize("num_blocks", [1, 4])
def test_the_glu_mlp_keeps_only_the_up_projection_for_backward(num_blocks, written_out):
    """Its own steps keep only up_proj's output (tokens x 2 intermediate): the GLU's output, which the down projection
    would keep (its blocks each a view of it), is recomputed. Written out, the down projection keeps it
    (tokens x intermediate)."""
    torch.manual_seed(0)
    mlp = OrchidMLP(glu_config(mlp_num_blocks=num_blocks)).train()
    x = torch.randn(2, 64, 32, requires_grad=True)
    tokens, intermediate, hidden = 2 * 64, 128, 32
    kept = retained_bytes(mlp, x)
    assert kept == 4 * tokens * (2 * intermediate + hidden)  # up_proj's output, and the MLP's output
    written_out()
    assert retained_bytes(mlp, x) - kept == 4 * tokens * intermediate


@pytest.mark.parametrize("num_blocks", [1, 4])
def test_the_glu_mlp_gradients_equal_the_written_out_ones_with_or_without_hooks(num_blocks, written_out):
    torch.manual_seed(0)
    mlp = OrchidMLP(glu_config(mlp_num_blocks=num_blocks)).train()
    x = torch.randn(2, 9, 32)
    grad = torch.randn(2, 9, 32)

    def gradients():
        leaf = x.clone().requires_grad_(True)
        mlp.zero_grad(set_to_none=True)
        out = mlp(leaf)
        out.backward(grad)
        return [out.detach(), leaf.grad] + [p.grad for p in mlp.parameters()]

    recomputed = gradients()
    calls = []
    handle = mlp.down_proj.register_forward_hook(lambda module, inputs, output: calls.append(1))
    hooked = gradients()
    handle.remove()
    written_out()
    reference = gradients()
    assert calls == [1]
    for ours, theirs, plain in zip(recomputed, hooked, reference):
        torch.testing.assert_close(ours, plain, rtol=0, atol=0)
        torch.testing.assert_close(theirs, plain, rtol=0, atol=0)


def test_a_hook_that_changes_the_activation_gives_the_gradients_of_the_hooked_glu():
    """GatedActivation's backward and the recomputed GLU output call act.forward; a hook on act (which may change
    its output) makes the MLP take the written-out GLU, so the gradients follow what the hook did."""
    torch.manual_seed(0)
    mlp = OrchidMLP(glu_config()).train()
    mlp.act.register_forward_hook(lambda module, inputs, output: 2 * output + 1)
    x = torch.randn(2, 5, 32, requires_grad=True)
    mlp(x).square().sum().backward()
    grads = [x.grad] + [p.grad for p in mlp.parameters()]
    leaf = x.detach().requires_grad_(True)
    mlp.zero_grad()
    mlp.dropout(mlp.down_proj(gated_activation_ref(mlp.up_proj(leaf), mlp.act))).square().sum().backward()
    for ours, reference in zip(grads, [leaf.grad] + [p.grad for p in mlp.parameters()]):
        torch.testing.assert_close(ours, reference, rtol=0, atol=0)


def test_the_glu_mlp_double_backward_and_gradgradcheck():
    torch.manual_seed(0)
    mlp = OrchidMLP(glu_config(hidden_size=8, intermediate_size=8, mlp_num_blocks=2)).double().train()
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(mlp, (x,))
    assert torch.autograd.gradgradcheck(mlp, (x,))


def test_an_in_place_change_of_the_up_projection_before_backward_raises():
    """As autograd does for a tensor it keeps: the recomputed GLU output would otherwise be computed from the changed
    values."""
    torch.manual_seed(0)
    mlp = OrchidMLP(glu_config()).train()
    captured = []
    mlp.up_proj.register_forward_hook(lambda module, inputs, output: captured.append(output))
    out = mlp(torch.randn(2, 5, 32, requires_grad=True))
    with torch.no_grad():
        captured[0].mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


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


# ---------------------------------------------------------------------------------------------
# The operator between its projections, recomputed in backward (orchid_ops.recomputed_in_backward)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("transform", ["dct", "fft"])
def test_the_operator_keeps_only_its_projections_inputs_for_backward(transform, written_out):
    """Recomputed, the operator keeps in_proj's output (B, L, 3d), out_proj's input and its own output (B, L, d each);
    the filters' responses and inner activations, the short convolution's output, the conditioning network's spectra
    and the transforms are recomputed. Written out, autograd keeps each of those."""
    torch.manual_seed(0)
    batch, length, n, d = 2, 24, 32, 16
    op = OrchidOperator(d, n, transform=transform, filter_width=8)
    x = torch.randn(batch, length, d, requires_grad=True)
    kept = retained_bytes(op, x)
    assert kept == 4 * batch * length * 5 * d
    written_out()
    assert retained_bytes(op, x) > 2 * kept


@pytest.mark.parametrize("transform,conditioning", [("dct", "abs"), ("fft", "xcorr")])
def test_model_gradients_equal_the_written_out_ones(transform, conditioning, written_out):
    """The masked-LM model's loss and every parameter's gradient, with padding on the left of one row and on the right
    of another, equal those of the same model with nothing recomputed (float32, 1e-6)."""
    model = tiny_mlm(transform=transform, conditioning=conditioning)
    batch = mlm_batch_padded_on_both_sides()
    result = mlm_loss_and_grads(model, *batch)
    written_out()
    assert_same_gradients(result, mlm_loss_and_grads(model, *batch), 1e-6)


def test_hooks_on_the_recomputed_modules_fire_once_and_see_the_plain_path(written_out):
    """A hook on a module the operator would run again in backward (the short convolution, the conditioning
    network's convolutions, a filter's FFN) makes that step a plain one: the hook fires once per forward, and the
    gradients are those of the written-out model."""
    model = tiny_mlm()
    batch = mlm_batch_padded_on_both_sides()
    mixer = model.orchid.encoder.layer[0].mixer
    calls = []
    for module in (mixer.short_conv, mixer.conditioning.freq_conv.layers[0], mixer.static_filter.ffn[0]):
        module.register_forward_hook(lambda module, inputs, output: calls.append(type(module).__name__))
    result = mlm_loss_and_grads(model, *batch)
    assert sorted(calls) == ["Linear", "ShortConvolution", "ShortConvolution"]
    written_out()
    assert_same_gradients(result, mlm_loss_and_grads(model, *batch), 0)


def test_gradient_checkpointing_gives_the_gradients_of_the_plain_model():
    """Under transformers' gradient checkpointing (saved-tensor hooks of its own around each layer), the recomputed
    steps nest in it or step aside, and the gradients are the plain model's."""
    model = tiny_mlm()
    batch = mlm_batch_padded_on_both_sides()
    result = mlm_loss_and_grads(model, *batch)
    model.activation_checkpointing_enable()
    assert_same_gradients(mlm_loss_and_grads(model, *batch), result, 1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("transform", ["dct", "fft"])
def test_the_operator_gradgradcheck_through_the_recomputed_steps(transform):
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
