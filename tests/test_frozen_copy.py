"""The copy made by ``optimize_for_inference`` is frozen: it holds spectra and packed weights derived from its
parameters, so every change of them that could leave its outputs behind is refused (an edit, a load, a cast, a
gradient) or, where torch gives no way to intercept it (a parameter or module replaced, a hook added), stops the
next forward; reading the weights, saving them and copying the model still work."""

import copy
import io
import pickle

import peft
import pytest
import torch
from torch import nn

from orchid_hf import OrchidForMaskedLM, OrchidForSequenceClassification, OrchidOperator, optimize_for_inference

from .test_inference import padded_batch
from .test_models import tiny_text_config

EDIT_REFUSED = "made by optimize_for_inference.*optimi[sz]e the .*plain model"


@pytest.fixture
def models():
    torch.manual_seed(0)
    model = OrchidForMaskedLM(tiny_text_config(mlp_num_blocks=2)).eval()
    return model, optimize_for_inference(model)


def logits(model, inputs):
    with torch.no_grad():
        return model(**inputs).logits


def mixer(fast):
    return fast.orchid.encoder.layer[0].mixer


def fused_adamw_step(fast):
    parameters = list(fast.parameters())
    for p in parameters:
        p.grad = torch.ones_like(p)
    torch.optim.AdamW(parameters, lr=0.1, fused=True).step()


def in_place_add(fast):
    with torch.no_grad():
        for p in fast.parameters():
            p += 0.01


# Each edit touches the first parameter (the word embeddings, read at every call) before the operator's projections
# and filters (held as packed weights and spectra): nothing may change before the refusal.
EDITS = {
    "p.data.mul_": lambda fast: [p.data.mul_(1.01) for p in fast.parameters()],
    "p.add_ under no_grad": lambda fast: [p.add_(0.01) for p in fast.parameters()],
    "p += under no_grad": in_place_add,
    "nn.init.normal_": lambda fast: [nn.init.normal_(p) for p in fast.parameters()],
    "p.data = tensor": lambda fast: [setattr(p, "data", p.detach() * 1.01) for p in fast.parameters()],
    "p.copy_ of a state_dict entry": lambda fast: [t.mul_(1.01) for t in fast.state_dict().values()],
    "vector_to_parameters": lambda fast: nn.utils.vector_to_parameters(
        nn.utils.parameters_to_vector(fast.parameters()) * 1.01, fast.parameters()
    ),
    "fused AdamW step": fused_adamw_step,
    "load_state_dict": lambda fast: fast.load_state_dict(
        OrchidForMaskedLM(tiny_text_config(mlp_num_blocks=2)).state_dict()
    ),
    "load_state_dict(assign=True)": lambda fast: fast.load_state_dict(
        OrchidForMaskedLM(tiny_text_config(mlp_num_blocks=2)).state_dict(), assign=True
    ),
    "load_state_dict of a submodule": lambda fast: mixer(fast).load_state_dict(
        OrchidOperator(32, 24).state_dict()
    ),
    "requires_grad_(True)": lambda fast: fast.requires_grad_(True),
    "p.requires_grad = True": lambda fast: setattr(mixer(fast).in_proj.weight, "requires_grad", True),
    "p.requires_grad_() of a head": lambda fast: fast.lm_head.dense.weight.requires_grad_(),
}


@pytest.mark.parametrize("edit", EDITS)
def test_edits_of_the_copy_are_refused_and_change_nothing(models, edit):
    model, fast = models
    inputs = padded_batch()
    before = logits(fast, inputs)
    with pytest.raises((RuntimeError, ValueError), match=EDIT_REFUSED):
        EDITS[edit](fast)
    torch.testing.assert_close(logits(fast, inputs), before, atol=0, rtol=0)
    torch.testing.assert_close(before, logits(model, inputs), atol=1e-5, rtol=1e-5)
    assert not any(p.requires_grad for p in fast.parameters())


# Changes torch lets through without a call the copy could refuse: they stop the next forward instead.
def replace_in_proj_weight(fast):
    mixer(fast).in_proj.weight = nn.Parameter(mixer(fast).in_proj.weight.detach() * 1.01, requires_grad=False)


def replace_up_proj_block(fast):
    blocks = fast.orchid.encoder.layer[1].mlp.up_proj.blocks
    blocks[0] = nn.Linear(blocks[0].in_features, blocks[0].out_features)


CHANGES = {
    "a parameter replaced": (replace_in_proj_weight, "orchid.encoder.layer.0.mixer.in_proj.weight was replaced"),
    "a module replaced": (replace_up_proj_block, "orchid.encoder.layer.1.mlp.up_proj.blocks.0 was replaced"),
    "peft LoRA on the copy": (
        lambda fast: peft.get_peft_model(fast, peft.LoraConfig(r=2, target_modules=["out_proj"])),
        "orchid.encoder.layer.0.mixer.out_proj was replaced",
    ),
    "a hook on in_proj": (
        lambda fast: mixer(fast).in_proj.register_forward_hook(lambda *args: None),
        "orchid.encoder.layer.0.mixer.in_proj has forward hooks, which this copy does not call",
    ),
    "a pre-hook on the MLP": (
        lambda fast: fast.orchid.encoder.layer[1].mlp.register_forward_pre_hook(lambda *args: None),
        "orchid.encoder.layer.1.mlp has forward hooks, which this copy does not call",
    ),
    "a global hook": (
        lambda fast: nn.modules.module.register_module_forward_hook(lambda *args: None),
        "global forward hooks are registered, which this copy would not call",
    ),
}


@pytest.mark.parametrize("change", CHANGES)
def test_changes_torch_cannot_refuse_stop_the_next_forward(models, change):
    _, fast = models
    edit, message = CHANGES[change]
    handle = edit(fast)
    try:
        with pytest.raises(RuntimeError, match=message + ".*optimi[sz]e"):
            fast(**padded_batch())
    finally:
        if change == "a global hook":
            handle.remove()


def test_functional_call_with_other_weights_is_refused(models):
    _, fast = models
    name = "orchid.encoder.layer.0.mixer.out_proj.weight"
    weights = {name: fast.get_parameter(name).detach() * 2}
    with pytest.raises(RuntimeError, match=f"{name} was replaced"):
        torch.func.functional_call(fast, weights, kwargs=padded_batch())


def test_hooks_on_the_modules_the_copy_calls_run(models):
    model, fast = models
    seen = []
    fast.orchid.encoder.layer[1].mixer.register_forward_hook(lambda module, args, output: seen.append(output.shape))
    fast.register_forward_hook(lambda module, args, kwargs, output: seen.append("root"), with_kwargs=True)
    inputs = padded_batch()
    torch.testing.assert_close(logits(fast, inputs), logits(model, inputs), atol=1e-5, rtol=1e-5)
    assert seen == [torch.Size([3, 20, 32]), "root"]


@pytest.mark.parametrize(
    "cast",
    [
        lambda m: m.to(torch.float64),
        lambda m: m.double(),
        lambda m: m.half(),
        lambda m: m.to(torch.bfloat16),
        lambda m: m.bfloat16(),
        lambda m: m.to("cpu", torch.float16),
    ],
    ids=["to(float64)", "double", "half", "to(bfloat16)", "bfloat16", "to(cpu, float16)"],
)
def test_casting_the_copy_is_refused_and_changes_nothing(models, cast):
    model, fast = models
    inputs = padded_batch()
    before = logits(fast, inputs)
    with pytest.raises(ValueError, match=r"runs in torch.float32 on the CPU.*torch\.\w+.*optimi[sz]e"):
        cast(fast)
    assert {p.dtype for p in fast.parameters()} == {torch.float32}
    assert {b.dtype for b in fast.buffers() if b.is_floating_point()} == {torch.float32}
    torch.testing.assert_close(logits(fast, inputs), before, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_optimize_says_which_dtype_it_takes(dtype):
    model = OrchidForMaskedLM(tiny_text_config()).to(dtype)
    with pytest.raises(ValueError, match=rf"needs a float32 model on the CPU.*{dtype}"):
        optimize_for_inference(model)


def test_what_leaves_the_copy_alone_still_works(models):
    model, fast = models
    inputs = padded_batch()
    expected = logits(model, inputs)
    # Moves and casts to what it is, eval, requires_grad_(False): no change, so allowed.
    assert fast.to("cpu").float().to(torch.float32).eval().requires_grad_(False) is fast
    # Reading: copies, arithmetic, numpy (read-only) and the state dict.
    weight = mixer(fast).in_proj.weight
    assert not (weight * 2).requires_grad and type(weight.clone()) is torch.Tensor
    with pytest.raises(ValueError, match="read-only"):
        weight.detach().numpy()[0, 0] = 1.0
    state = fast.state_dict()
    plain = OrchidForMaskedLM(tiny_text_config(mlp_num_blocks=2)).eval()
    plain.load_state_dict(state)
    torch.testing.assert_close(logits(plain, inputs), expected, atol=0, rtol=0)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)  # plain tensors: no class of ours to unpickle
    assert all(type(t) is torch.Tensor for t in loaded.values())
    loaded[next(iter(loaded))].mul_(2)  # a loaded copy is the caller's own
    torch.testing.assert_close(logits(fast, inputs), expected, atol=1e-5, rtol=1e-5)
    # Copies of the copy are frozen as well.
    for other in (copy.deepcopy(fast), pickle.loads(pickle.dumps(fast))):
        torch.testing.assert_close(logits(other, inputs), logits(fast, inputs), atol=0, rtol=0)
        with pytest.raises(RuntimeError, match=EDIT_REFUSED):
            next(other.parameters()).data.mul_(2)


def test_optimizing_the_copy_again_gives_the_same_outputs(models):
    model, fast = models
    inputs = padded_batch()
    again = optimize_for_inference(fast)
    torch.testing.assert_close(logits(again, inputs), logits(model, inputs), atol=1e-5, rtol=1e-5)


def test_training_the_plain_model_leaves_the_copy_alone():
    torch.manual_seed(0)
    model = OrchidForSequenceClassification(tiny_text_config())
    fast = optimize_for_inference(model)
    inputs = padded_batch()
    before = logits(fast, inputs)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    model(**inputs, labels=torch.tensor([0, 1, 2])).loss.backward()
    optimizer.step()
    torch.testing.assert_close(logits(fast, inputs), before, atol=0, rtol=0)
