"""What the three recipes share: the registry of named recipes, parsing (recipe defaults, flags, config files), the
weight-decay rule, the implicit filters' parameter group, the schedule's end point, and the extras helper."""

import json
import sys

import pytest
import torch
from orchid_hf.modeling.orchid_layers import ImplicitFilter
from transformers import BertConfig, BertForMaskedLM, TrainingArguments

from orchid_hf import OrchidConfig, OrchidForMaskedLM
from orchid_hf.arguments import ModelArguments, RecipeArguments
from orchid_hf.extras import require_extra
from orchid_hf.glue import parse_args as glue_args
from orchid_hf.model_loading import parse_overrides
from orchid_hf.optimization import (
    OptimizerPlan,
    decoupled_to_torch_weight_decay,
    filter_parameter_names,
    resolve_optimizer,
    resolve_weight_decay,
)
from orchid_hf.pretraining import parse_args as mlm_args
from orchid_hf.recipes import EXCLUSIVE_DECAYS, GLUE_TABLE_C2, get_recipe, list_recipes, register_recipe
from orchid_hf.runs import resolve_stages
from orchid_hf.trainer import RecipeTrainer
from orchid_hf.vision import parse_args as image_args
from orchid_hf.vision.train import DATACLASSES as IMAGE_DATACLASSES

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(vocab_size=64, hidden_size=32, num_hidden_layers=1, intermediate_size=64, max_position_embeddings=32,
            filter_width=16)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------


def test_registry_lists_the_recipes_of_each_script():
    assert list_recipes("mlm") == ["orchid-bert-base-mlm", "orchid-bert-large-mlm"]
    assert list_recipes("text-classification") == [
        "orchid-bert-base-glue", "orchid-bert-classification", "orchid-bert-large-glue",
    ]  # fmt: skip
    assert list_recipes("image-classification") == [
        "orchid-vit-cifar-m", "orchid-vit-cifar-s", "orchid-vit-digits", "orchid-vit-imagenet",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="unknown recipe 'orchid-vit-huge'; the image-classification recipes are"):
        get_recipe("orchid-vit-huge", "image-classification")
    with pytest.raises(ValueError, match="unknown recipe 'orchid-bert-base-mlm'; the text-classification"):
        get_recipe("orchid-bert-base-mlm", "text-classification")  # another script's recipe
    with pytest.raises(ValueError, match="already registered"):
        register_recipe("orchid-vit-digits", kind="image-classification", description="", source="", arguments={})
    with pytest.raises(ValueError, match="sets both weight_decay and decoupled_weight_decay"):
        register_recipe("x", kind="mlm", description="", source="", arguments={"weight_decay": 0.1,
                        "decoupled_weight_decay": 1e-5})  # fmt: skip


def test_every_recipe_value_is_a_flag_of_its_script():
    """A recipe key that no dataclass of its script has would be a typo (parse_dict would reject the recipe)."""
    from orchid_hf.glue import DATACLASSES as GLUE_DATACLASSES
    from orchid_hf.pretraining import DATACLASSES as MLM_DATACLASSES

    fields = {
        kind: {f for cls in classes.values() for f in cls.__dataclass_fields__}
        for kind, classes in (
            ("mlm", MLM_DATACLASSES),
            ("text-classification", GLUE_DATACLASSES),
            ("image-classification", IMAGE_DATACLASSES),
        )
    }
    for kind, names in fields.items():
        for name in list_recipes(kind):
            recipe = get_recipe(name)
            for task in [None, *recipe.tasks]:
                unknown = set(recipe.defaults(task)) - names
                assert not unknown, (name, task, unknown)
                values = recipe.defaults(task)
                for torch_name, decoupled_name in EXCLUSIVE_DECAYS:
                    assert values.get(torch_name) is None or values.get(decoupled_name) is None


def test_paper_values_are_the_defaults():
    parsed = mlm_args(["--output_dir", "x"])
    data, recipe, args = parsed.data_args, parsed.recipe_args, parsed.training_args
    assert (data.dataset_name, data.dataset_config_name, data.streaming) == ("allenai/c4", "en", True)
    assert (data.max_seq_length, data.mlm_probability) == (128, 0.3)
    assert (args.learning_rate, args.adam_beta1, args.adam_beta2, args.adam_epsilon) == (8e-4, 0.9, 0.98, 1e-6)
    assert (args.warmup_steps, args.max_steps, args.max_grad_norm, args.per_device_train_batch_size) == (
        0.06, 70_000, 1.0, 128,
    )  # fmt: skip
    assert args.lr_scheduler_type.value == "polynomial" and recipe.min_lr_ratio == 0.02
    assert (recipe.decoupled_weight_decay, args.weight_decay) == (1e-5, 0.0)  # converted when a run is built
    assert (recipe.filter_learning_rate, recipe.filter_decoupled_weight_decay) == (1e-3, 0.0)
    assert args.bf16 == (torch.cuda.is_available() and torch.cuda.is_bf16_supported())

    large = mlm_args(["--output_dir", "x", "--recipe", "orchid-bert-large-mlm"]).recipe
    assert large.preset == "orchid-bert-large"
    # Table C.2 per task: SST-2 base is D-AdamW (decoupled 3e-6), RTE base AdamW (0.01); large RTE D-AdamW.
    parsed = glue_args(["--task_name", "sst2", "--output_dir", "x"], task="sst2")
    data, recipe, args = parsed.data_args, parsed.recipe_args, parsed.training_args
    assert (args.learning_rate, recipe.decoupled_weight_decay, args.num_train_epochs) == (3e-5, 3e-6, 3)
    assert args.per_device_train_batch_size == 16 and data.pooling == "first" and data.max_seq_length == 128
    parsed = glue_args(["--task_name", "rte", "--output_dir", "x"], task="rte")
    recipe, args = parsed.recipe_args, parsed.training_args
    assert (args.learning_rate, args.weight_decay, recipe.decoupled_weight_decay) == (5e-5, 0.01, None)
    assert (recipe.filter_weight_decay, recipe.filter_decoupled_weight_decay) == (0.0, None)
    assert glue_args(["--task_name", "qnli", "--output_dir", "x"], task="qnli").data_args.pooling == "mean"
    parsed = glue_args(["--task_name", "rte", "--recipe", "orchid-bert-large-glue", "--output_dir", "x"], task="rte")
    recipe, args = parsed.recipe_args, parsed.training_args
    assert (args.learning_rate, recipe.decoupled_weight_decay, args.num_train_epochs) == (1e-5, 1e-6, 3)
    assert GLUE_TABLE_C2["large"]["cola"] == ("adamw", 5e-5, 5e-6, 10)

    # Table C.3: CIFAR's base learning rate from the tuned set (1e-3, 5e-3, 1e-2), constant after 500 warmup steps.
    parsed = image_args(["--dataset_name", "cifar10", "--output_dir", "x"])
    assert parsed.recipe.name == "orchid-vit-cifar-s"
    augmentation, args = parsed.augmentation_args, parsed.training_args
    assert args.learning_rate in (1e-3, 5e-3, 1e-2) and args.learning_rate == 1e-3
    assert (args.lr_scheduler_type.value, args.warmup_steps, args.weight_decay) == ("constant_with_warmup", 500, 0.05)
    assert (args.per_device_train_batch_size, args.num_train_epochs, args.label_smoothing_factor) == (512, 500, 0.1)
    assert (augmentation.crop_padding, augmentation.hflip, augmentation.mixup_alpha) == (4, True, 0.0)
    parsed = image_args(["--dataset_name", "imagenet-1k", "--output_dir", "x"])
    augmentation, args = parsed.augmentation_args, parsed.training_args
    assert parsed.recipe.name == "orchid-vit-imagenet" and args.lr_scheduler_type.value == "cosine"
    assert (args.learning_rate, augmentation.warmup_epochs, args.num_train_epochs) == (1e-3, 10, 300)
    assert (augmentation.randaugment, augmentation.mixup_alpha, augmentation.cutmix_alpha) == ("2,9,0.5", 0.8, 1.0)
    assert augmentation.random_erasing == 0.25 and augmentation.resample == "bicubic"
    assert image_args([]).recipe.name == "orchid-vit-digits"
    # A folder replaces the recipe's dataset.
    assert image_args(["--train_dir", "somewhere"]).data_args.dataset_name is None


def test_own_data_pools_the_mean_and_glue_keeps_table_c2():
    """The classification recipe (own files or a Hub dataset without --task_name) pools Orchid's real tokens' mean;
    every GLUE task keeps Table C.2 / App. C.3's choice (mean for QNLI-base only); the model class keeps "first"."""
    for source in (["--train_file", "t.csv"], ["--validation_file", "v.csv"], ["--dataset_name", "someone/data"]):
        parsed = glue_args([*source, "--output_dir", "x"])
        assert (parsed.recipe.name, parsed.data_args.pooling) == ("orchid-bert-classification", "mean")
        assert "pooling" not in parsed.explicit
    assert glue_args(["--train_file", "t.csv", "--pooling", "first", "--output_dir", "x"]).data_args.pooling == "first"
    for size in ("base", "large"):
        for task in GLUE_TABLE_C2[size]:
            argv = ["--task_name", task, "--recipe", f"orchid-bert-{size}-glue", "--output_dir", "x"]
            pooling = glue_args(argv, task=task).data_args.pooling
            assert pooling == ("mean" if (size, task) == ("base", "qnli") else "first"), (size, task)
    # A GLUE task read from local files is still GLUE.
    parsed = glue_args(["--task_name", "rte", "--train_file", "t.csv", "--output_dir", "x"], task="rte")
    assert (parsed.recipe.name, parsed.data_args.pooling) == ("orchid-bert-base-glue", "first")
    assert OrchidConfig().classifier_pooling == OrchidConfig.from_preset("orchid-bert-base").classifier_pooling


def test_the_recipe_pooling_is_for_new_heads():
    """--pooling always sets an Orchid config's pooling; the recipe's value sets it for a new head only, so a saved
    sequence classifier keeps the pooling its pooler was trained with; other model types pool as their class does."""
    from orchid_hf.glue import _set_pooling

    recipe, flag = _set_pooling("mean", frozenset()), _set_pooling("mean", frozenset({"pooling"}))
    new = OrchidConfig(**TINY)
    recipe(new)
    assert new.classifier_pooling == "mean"
    encoder = OrchidConfig(**TINY, architectures=["OrchidForMaskedLM"])
    recipe(encoder)
    assert encoder.classifier_pooling == "mean"
    classifier = OrchidConfig(**TINY, architectures=["OrchidForSequenceClassification"])
    recipe(classifier)
    assert classifier.classifier_pooling == "first"
    flag(classifier)
    assert classifier.classifier_pooling == "mean"
    bert = BertConfig()
    recipe(bert)
    assert not hasattr(bert, "classifier_pooling")
    with pytest.raises(ValueError, match="--pooling applies to Orchid models; bert pools as its class does"):
        flag(bert)


def test_flags_and_config_files_override_the_recipe(tmp_path):
    argv = ["--output_dir", "x", "--learning_rate", "1e-3", "--lr_scheduler_type", "cosine", "--max_steps", "10",
            "--eval_strategy", "no", "--bf16", "False", "--gradient_checkpointing", "--torch_compile", "False",
            "--report_to", "none", "--load_best_model_at_end", "False", "--save_strategy", "no"]  # fmt: skip
    parsed = mlm_args(argv)
    args = parsed.training_args
    assert (args.learning_rate, args.lr_scheduler_type.value, args.max_steps) == (1e-3, "cosine", 10)
    assert args.gradient_checkpointing and {"learning_rate", "lr_scheduler_type", "gradient_checkpointing"} <= set(
        parsed.explicit
    )
    assert "warmup_steps" not in parsed.explicit and args.warmup_steps == 0.06  # still the recipe's
    # The same in a JSON and a YAML file, as the examples read them.
    values = {"output_dir": "x", "learning_rate": 1e-3, "max_steps": 10, "recipe": "orchid-bert-large-mlm"}
    (tmp_path / "run.json").write_text(json.dumps(values))
    (tmp_path / "run.yaml").write_text("\n".join(f"{k}: {v}" for k, v in values.items()))
    for name in ("run.json", "run.yaml"):
        parsed = mlm_args([str(tmp_path / name)])
        args = parsed.training_args
        assert (args.learning_rate, args.max_steps, args.adam_beta2) == (1e-3, 10, 0.98)
        assert parsed.recipe.name == "orchid-bert-large-mlm" and parsed.explicit == set(values)
    (tmp_path / "typo.json").write_text(json.dumps({"output_dir": "x", "learning_rat": 1e-3}))
    with pytest.raises(ValueError, match="learning_rat"):
        mlm_args([str(tmp_path / "typo.json")])
    # Abbreviated flags count as given, as argparse reads them.
    assert "learning_rate" in mlm_args(["--output_dir", "x", "--learning_r", "1e-4"]).explicit


def test_config_overrides_only_for_a_new_model():
    with pytest.raises(ValueError, match="--config_overrides can't be used in combination with --config_name or "
                       "--model_name_or_path.*'hidden_size=64' with --model_name_or_path 'some/model'"):  # fmt: skip
        ModelArguments(model_name_or_path="some/model", config_overrides="hidden_size=64")
    with pytest.raises(ValueError, match="with --config_name 'orchid-bert-large'"):
        mlm_args(["--output_dir", "x", "--config_name", "orchid-bert-large", "--config_overrides", "hidden_size=64"])
    assert parse_overrides("hidden_size=64, transform=fft,residual_long_conv=false") == {
        "hidden_size": 64, "transform": "fft", "residual_long_conv": False,
    }  # fmt: skip
    with pytest.raises(ValueError, match="key=value"):
        parse_overrides("hidden_size")


def test_stages_follow_the_examples():
    args = TrainingArguments(output_dir="x", do_eval=True)
    resolve_stages(args, frozenset({"do_eval"}), default=("do_train", "do_eval"))
    assert (args.do_train, args.do_eval, args.do_predict) == (False, True, False)  # only what was asked
    args = TrainingArguments(output_dir="x")
    resolve_stages(args, frozenset({"learning_rate"}), default=("do_train", "do_eval"))
    assert (args.do_train, args.do_eval, args.do_predict) == (True, True, False)  # none asked: the recipe's


# ---------------------------------------------------------------------------------------------
# Weight decay
# ---------------------------------------------------------------------------------------------


def test_weight_decay_keeps_trainers_meaning():
    # A habitual --weight_decay 0.01 at lr 8e-4 stays 0.01 (it used to become 12.5).
    parsed = mlm_args(["--output_dir", "x", "--weight_decay", "0.01"])
    recipe, args = parsed.recipe_args, parsed.training_args
    plan = resolve_optimizer(args, recipe, parsed.explicit)
    assert args.weight_decay == 0.01 and plan.decoupled_weight_decay is None
    # The paper's decoupled value has its own flag, converted in one place: 1e-5 / 8e-4.
    parsed = mlm_args(["--output_dir", "x"])
    recipe, args = parsed.recipe_args, parsed.training_args
    plan = resolve_optimizer(args, recipe, parsed.explicit)
    assert args.weight_decay == pytest.approx(0.0125) and plan.decoupled_weight_decay == 1e-5
    parsed = mlm_args(["--output_dir", "x", "--decoupled_weight_decay", "2e-5", "--learning_rate", "1e-3"])
    plan = resolve_optimizer(parsed.training_args, parsed.recipe_args, parsed.explicit)
    assert plan.weight_decay == pytest.approx(0.02)
    # A value given beats the recipe's value of the other flag: RTE's recipe is AdamW 0.01.
    parsed = glue_args(["--task_name", "rte", "--output_dir", "x", "--decoupled_weight_decay", "1e-5"], task="rte")
    plan = resolve_optimizer(parsed.training_args, parsed.recipe_args, parsed.explicit)
    assert plan.weight_decay == pytest.approx(1e-5 / 5e-5) and plan.decoupled_weight_decay == 1e-5
    # Both given is an error naming both numbers.
    parsed = mlm_args(["--output_dir", "x", "--weight_decay", "0.01", "--decoupled_weight_decay", "1e-5"])
    with pytest.raises(ValueError, match=r"--weight_decay .* or --decoupled_weight_decay .* not both: got "
                       r"weight_decay=0.01 and decoupled_weight_decay=1e-05"):  # fmt: skip
        resolve_optimizer(parsed.training_args, parsed.recipe_args, parsed.explicit)
    with pytest.raises(ValueError, match="filter_weight_decay.*filter_decoupled_weight_decay.*not both"):
        resolve_weight_decay(0.1, 0.1, 1e-3, {"filter_weight_decay", "filter_decoupled_weight_decay"},
                             names=("filter_weight_decay", "filter_decoupled_weight_decay"))  # fmt: skip
    with pytest.raises(ValueError, match="needs learning_rate > 0 to be converted, got learning_rate=0.0"):
        decoupled_to_torch_weight_decay(1e-5, 0.0)


def test_decoupled_weight_decay_matches_composer_rule():
    """torch AdamW with weight_decay / lr_peak applies Composer DecoupledAdamW's decay (lr_t / lr_peak) * wd."""
    lr, wd, betas, eps = 0.1, 0.3, (0.9, 0.98), 1e-6
    weight = torch.nn.Parameter(torch.randn(5, dtype=torch.float64))
    optimizer = torch.optim.AdamW(
        [weight], lr=lr, betas=betas, eps=eps, weight_decay=decoupled_to_torch_weight_decay(wd, lr)
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: [0.5, 1.0, 0.25, 0.0][step])
    reference, m, v = weight.detach().clone(), torch.zeros(5, dtype=torch.float64), torch.zeros(5, dtype=torch.float64)
    for step in range(3):
        grad = torch.randn(5, dtype=torch.float64)
        weight.grad = grad.clone()
        lr_t = optimizer.param_groups[0]["lr"]
        optimizer.step()
        schedule.step()
        # Composer DecoupledAdamW: p *= 1 - (lr_t / lr_peak) * wd, then the Adam update.
        reference *= 1 - (lr_t / lr) * wd
        m = betas[0] * m + (1 - betas[0]) * grad
        v = betas[1] * v + (1 - betas[1]) * grad**2
        m_hat, v_hat = m / (1 - betas[0] ** (step + 1)), v / (1 - betas[1] ** (step + 1))
        reference -= lr_t * m_hat / (v_hat.sqrt() + eps)
        assert torch.allclose(weight.detach(), reference, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# The implicit filters' parameter group and the schedule
# ---------------------------------------------------------------------------------------------


def _trainer(model, tmp_path, plan, **overrides):
    args = TrainingArguments(
        output_dir=str(tmp_path), learning_rate=8e-4, weight_decay=0.0125, lr_scheduler_type="polynomial",
        lr_scheduler_kwargs={"power": 1.0, "lr_end": 0.02 * 8e-4}, warmup_steps=2, max_steps=10, use_cpu=True,
        report_to="none", **overrides,
    )  # fmt: skip
    return RecipeTrainer(model=model, args=args, optimizer_plan=plan)


def test_filter_parameters_get_their_own_group(tmp_path):
    model = OrchidForMaskedLM(OrchidConfig(**TINY))
    filters = filter_parameter_names(model)
    assert filters and all(".static_filter.ffn." in n or ".residual_filter.ffn." in n for n in filters)
    assert not any(n.endswith(".skip") for n in filters)  # the skip term D trains in the main group, as in M2
    plan = OptimizerPlan(0.0125, 1e-5, 1e-3, 100.0, 0.1)
    trainer = _trainer(model, tmp_path, plan)
    trainer.create_optimizer_and_scheduler(num_training_steps=10)
    decayed, undecayed, filter_group = trainer.optimizer.param_groups
    named = dict(model.named_parameters())
    assert {id(p) for p in filter_group["params"]} == {id(named[n]) for n in filters}
    assert (filter_group["initial_lr"], filter_group["weight_decay"]) == (1e-3, 100.0)
    assert decayed["weight_decay"] == 0.0125 and undecayed["weight_decay"] == 0.0
    assert sum(len(g["params"]) for g in trainer.optimizer.param_groups) == len(list(model.parameters()))
    # Linear warmup, then linear decay to 0.02x: every group ends at 2% of its own peak (M2's alpha_f).
    lrs = []
    for _ in range(10):
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        lrs.append([group["lr"] for group in trainer.optimizer.param_groups])
    assert lrs[0] == pytest.approx([4e-4, 4e-4, 5e-4])  # halfway through the warmup
    assert lrs[1] == pytest.approx([8e-4, 8e-4, 1e-3])
    assert lrs[-1] == pytest.approx([1.6e-5, 1.6e-5, 2e-5])
    # BERT has no implicit filters: Trainer's two groups.
    bert = BertForMaskedLM(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=64))  # fmt: skip
    assert filter_parameter_names(bert) == []
    trainer = _trainer(bert, tmp_path, plan)
    trainer.create_optimizer()
    assert len(trainer.optimizer.param_groups) == 2


def implicit_kernel_rms(model: torch.nn.Module) -> dict[str, float]:
    """The root mean square of the kernel h0 that each implicit filter of ``model`` returns when called, by module
    name."""
    with torch.no_grad():
        return {name: module().float().pow(2).mean().sqrt().item() for name, module in model.named_modules()
                if isinstance(module, ImplicitFilter)}  # fmt: skip


@pytest.mark.parametrize("decay", ["recipe", "m2"])
def test_the_recipe_trains_the_implicit_filters_and_keeps_them(tmp_path, decay):
    """60 steps of the masked-LM recipe's optimizer and schedule on a tiny model: the static and residual kernels
    learn (their size grows). M2-BERT's filter decay of 0.1 under decoupled AdamW scales them by 0.9 at every peak
    step, and they vanish: the reason the recipe trains them without decay."""
    extra = [] if decay == "recipe" else ["--filter_decoupled_weight_decay", "0.1"]
    parsed = mlm_args(["--output_dir", str(tmp_path), "--max_steps", "60", "--eval_strategy", "no", *extra])
    recipe, args = parsed.recipe_args, parsed.training_args
    args.use_cpu, args.report_to = True, "none"
    plan = resolve_optimizer(args, recipe, parsed.explicit)
    torch.manual_seed(0)
    model = OrchidForMaskedLM(OrchidConfig(**TINY))
    trainer = RecipeTrainer(model=model, args=args, optimizer_plan=plan)
    trainer.create_optimizer_and_scheduler(num_training_steps=60)
    before = implicit_kernel_rms(model)
    tokens = torch.randint(5, TINY["vocab_size"], (8, 32), generator=torch.Generator().manual_seed(0))
    labels = torch.where(torch.rand(tokens.shape, generator=torch.Generator().manual_seed(1)) < 0.3, tokens, -100)
    for _ in range(60):
        model(input_ids=tokens, labels=labels).loss.backward()
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        trainer.optimizer.zero_grad()
    after = implicit_kernel_rms(model)
    assert len(before) == 2
    if decay == "recipe":
        assert all(after[name] > before[name] for name in before), (before, after)
    else:
        assert all(after[name] < 1e-3 * before[name] for name in before), (before, after)


def test_no_recipe_decays_the_implicit_filters():
    """Every recipe's filter group, once resolved: lr 1e-3, no weight decay (pretraining, Table C.2's AdamW and
    D-AdamW GLUE tasks, the classification recipe)."""
    parsed = mlm_args(["--output_dir", "x"])
    plans = [resolve_optimizer(parsed.training_args, parsed.recipe_args, parsed.explicit)]
    for task in ("sst2", "rte"):  # D-AdamW and AdamW
        parsed = glue_args(["--task_name", task, "--output_dir", "x"], task=task)
        plans.append(resolve_optimizer(parsed.training_args, parsed.recipe_args, parsed.explicit))
    parsed = glue_args(["--train_file", "x.csv", "--recipe", "orchid-bert-classification", "--output_dir", "x"])
    plans.append(resolve_optimizer(parsed.training_args, parsed.recipe_args, parsed.explicit))
    assert [(plan.filter_learning_rate, plan.filter_weight_decay) for plan in plans] == [(1e-3, 0.0)] * 4


def test_filter_group_flags(tmp_path):
    parsed = mlm_args(["--output_dir", "x", "--filter_learning_rate", "5e-4", "--filter_weight_decay", "0.01"])
    plan = resolve_optimizer(parsed.training_args, parsed.recipe_args, parsed.explicit)
    assert (plan.filter_learning_rate, plan.filter_weight_decay, plan.filter_decoupled_weight_decay) == (
        5e-4, 0.01, None,
    )  # fmt: skip
    parsed = mlm_args(["--output_dir", "x", "--filter_param_group", "False"])
    plan = resolve_optimizer(parsed.training_args, parsed.recipe_args, parsed.explicit)
    assert plan.filter_learning_rate is None
    model = OrchidForMaskedLM(OrchidConfig(**TINY))
    trainer = _trainer(model, tmp_path, plan)
    trainer.create_optimizer()
    assert len(trainer.optimizer.param_groups) == 2
    # The schedule's end point: a ratio of the learning rate, or lr_end itself, not both.
    parsed = mlm_args(["--output_dir", "x", "--learning_rate", "1e-3"])
    args = parsed.training_args
    resolve_optimizer(args, parsed.recipe_args, parsed.explicit)
    assert args.lr_scheduler_kwargs == {"power": 1.0, "lr_end": pytest.approx(2e-5)}
    parsed = mlm_args(["--output_dir", "x", "--lr_scheduler_kwargs", '{"lr_end": 1e-6}'])
    resolve_optimizer(parsed.training_args, parsed.recipe_args, parsed.explicit)
    assert parsed.training_args.lr_scheduler_kwargs == {"lr_end": 1e-6}
    parsed = mlm_args(["--output_dir", "x", "--lr_scheduler_kwargs", '{"lr_end": 1e-6}', "--min_lr_ratio", "0.1"])
    with pytest.raises(ValueError, match="not both: got min_lr_ratio=0.1 and lr_end=1e-06"):
        resolve_optimizer(parsed.training_args, parsed.recipe_args, parsed.explicit)
    assert RecipeArguments().filter_param_group


# ---------------------------------------------------------------------------------------------
# Extras
# ---------------------------------------------------------------------------------------------


def test_a_missing_extra_names_the_install_command(monkeypatch):
    assert require_extra("json", "train") is json
    monkeypatch.setitem(sys.modules, "evaluate", None)  # as if it were not installed
    message = r'evaluate is needed here but is not installed: pip install "orchid-hf\[train\]"'
    with pytest.raises(ImportError, match=message):
        require_extra("evaluate", "train")
    from orchid_hf.metrics import load_metric

    with pytest.raises(ImportError, match=r"orchid-hf\[train\]"):
        load_metric("glue", "sst2")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    from orchid_hf.vision import plot_confusion_matrix

    with pytest.raises(ImportError, match=r"orchid-hf\[plot\]"):
        plot_confusion_matrix(torch.eye(2).numpy(), ["a", "b"], "x.png")
    with pytest.raises(ValueError, match="extra must be one of"):
        require_extra("json", "gpu")


WITHOUT_EXTRAS = """
import importlib.machinery, sys

BLOCKED = {"datasets", "evaluate", "accelerate", "PIL", "matplotlib", "sklearn", "jinja2"}


class WithoutExtras(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        return None if name.split(".")[0] in BLOCKED else super().find_spec(name, path, target)


sys.meta_path = [WithoutExtras if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
import torch
from orchid_hf import OrchidConfig, OrchidForMaskedLM

config = OrchidConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, intermediate_size=64,
                      max_position_embeddings=16, filter_width=16)
print(tuple(OrchidForMaskedLM(config)(input_ids=torch.randint(0, 50, (2, 16))).logits.shape))
for module in ("orchid_hf.glue", "orchid_hf.pretraining", "orchid_hf.vision"):
    try:
        __import__(module)
    except ImportError as error:
        print(module, error)
print(sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED))
"""


@pytest.mark.slow
def test_the_model_needs_no_extra_and_the_recipes_name_theirs(tmp_path):
    """In a process where the extras' packages cannot be found, the model works and each recipe says what to
    install."""
    import subprocess

    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", WITHOUT_EXTRAS], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "(2, 16, 50)"
    for line, (module, extra) in zip(lines[1:4], [("glue", "train"), ("pretraining", "train"), ("vision", "vision")]):
        assert line.startswith(f"orchid_hf.{module} ") and "is needed here but is not installed" in line, line
        assert f'pip install "orchid-hf[{extra}]"' in line, line
    assert lines[4] == "[]"  # none of them was imported
