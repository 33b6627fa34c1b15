"""Masked-LM pretraining recipe: block packing, masking, offline failures, an end-to-end tiny run with a (mocked)
push through Trainer's hub strategy, a BERT baseline through the same script, evaluation alone, exact resumption
from a checkpoint, and the streamed C4 path."""

import json
import time
from concurrent.futures import Future
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForMaskedLM, DataCollatorForLanguageModeling, TrainerCallback

from orchid_hf.demo_data import make_corpus
from orchid_hf.hub import HubUnavailableError
from orchid_hf.pretraining import (
    PaddingFreeMLMCollator,
    ReproducibleMLMCollator,
    block_packer,
    build_trainer,
    document_splitter,
    main,
    parse_args,
)
from orchid_hf.runs import resolve_checkpoint
from orchid_hf.tokenization import train_wordpiece_tokenizer
from orchid_hf.trainer import TrainingClock

pytestmark = pytest.mark.usefixtures("one_thread")


TINY = "hidden_size=32,num_hidden_layers=1,intermediate_size=64,max_position_embeddings=32,filter_width=16"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Local corpus files and a WordPiece tokenizer folder."""
    root = tmp_path_factory.mktemp("corpus")
    (root / "train.txt").write_text("\n".join(make_corpus(60, seed=0)) + "\n")
    (root / "validation.txt").write_text("\n".join(make_corpus(8, seed=1)) + "\n")
    tokenizer = train_wordpiece_tokenizer(make_corpus(200, seed=2), vocab_size=300)
    tokenizer.save_pretrained(root / "tokenizer")
    return root


def tiny_args(corpus, output_dir, *extra):
    return [
        "--train_file", str(corpus / "train.txt"), "--validation_file", str(corpus / "validation.txt"),
        "--tokenizer_name", str(corpus / "tokenizer"), "--config_overrides", TINY, "--max_seq_length", "32",
        "--output_dir", str(output_dir), "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "16",
        "--learning_rate", "1e-3", "--logging_steps", "2", "--use_cpu", "--disable_tqdm", "True",
        "--cache_dir", str(output_dir.parent / "cache"), *extra,
    ]  # fmt: skip


def test_block_packing(corpus):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(corpus / "tokenizer")
    docs = make_corpus(10, seed=3)
    packed = block_packer(tokenizer, 16, "text")({"text": [*docs, "", "  "]})
    stream = []
    for doc in docs:
        stream += tokenizer(doc, add_special_tokens=False)["input_ids"] + [tokenizer.sep_token_id]
    assert len(packed["input_ids"]) == len(stream) // 14
    content = []
    for block, special in zip(packed["input_ids"], packed["special_tokens_mask"], strict=True):
        assert len(block) == 16 and block[0] == tokenizer.cls_token_id and block[-1] == tokenizer.sep_token_id
        assert special == [int(t in (tokenizer.cls_token_id, tokenizer.sep_token_id)) for t in block]
        content += block[1:-1]
    assert content == stream[: len(content)] and len(stream) - len(content) < 14  # only the tail is dropped


def test_masking_is_bert_masking_and_depends_only_on_the_batch(corpus):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(corpus / "tokenizer")
    collator = ReproducibleMLMCollator(tokenizer=tokenizer, mlm_probability=0.3, mask_seed=7)
    assert isinstance(collator, DataCollatorForLanguageModeling)
    packed = block_packer(tokenizer, 32, "text")({"text": make_corpus(200, seed=4)})
    examples = [{"input_ids": i, "special_tokens_mask": s} for i, s in zip(*packed.values(), strict=True)]
    batch = collator([dict(e) for e in examples])
    originals = torch.tensor([e["input_ids"] for e in examples])
    special = torch.tensor([e["special_tokens_mask"] for e in examples]).bool()
    masked = batch["labels"] != -100
    assert not masked[special].any()
    rate = masked.sum().item() / (~special).sum().item()
    assert 0.28 < rate < 0.32  # 30% of about 10k maskable tokens
    assert torch.equal(batch["labels"][masked], originals[masked])
    replaced = batch["input_ids"][masked] == tokenizer.mask_token_id
    assert 0.75 < replaced.float().mean().item() < 0.85  # BERT's 80% [MASK]
    # The same batch gets the same masks whatever came before; another batch or seed gets others.
    torch.manual_seed(123)
    collator([dict(e) for e in examples[:5]])
    again = collator([dict(e) for e in examples])
    assert torch.equal(again["input_ids"], batch["input_ids"]) and torch.equal(again["labels"], batch["labels"])
    other = ReproducibleMLMCollator(tokenizer=tokenizer, mlm_probability=0.3, mask_seed=8)([dict(e) for e in examples])
    assert not torch.equal(other["labels"], batch["labels"])


def test_offline_hub_names_fail_fast(corpus, tmp_path):
    start = time.perf_counter()
    with pytest.raises(HubUnavailableError, match="--tokenizer_name pointing to a tokenizer folder"):
        main(["--output_dir", str(tmp_path)])  # bert-base-uncased, allenai/c4
    with pytest.raises(HubUnavailableError, match="dataset 'allenai/c4'.*--train_file"):
        main(["--output_dir", str(tmp_path), "--tokenizer_name", str(corpus / "tokenizer")])
    with pytest.raises(HubUnavailableError, match="--push_to_hub me/model: HF_HUB_OFFLINE is set"):
        main([*tiny_args(corpus, tmp_path), "--max_steps", "1", "--push_to_hub", "--hub_model_id", "me/model"])
    assert time.perf_counter() - start < 10
    assert not (tmp_path / "model.safetensors").exists()
    with pytest.raises(ValueError, match="pass --tokenizer_name"):
        main(["--output_dir", str(tmp_path), "--tokenizer_name", "", "--train_file", str(corpus / "train.txt")])


class FakeHub:
    """Stands in for transformers' HfApi: records the repository and the uploads Trainer makes."""

    def __init__(self):
        self.calls = []

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", repo_id, kwargs))
        return SimpleNamespace(repo_id=repo_id)

    def upload_folder(self, **kwargs):
        self.calls.append(("upload_folder", kwargs))
        files = sorted(p.name for p in __import__("pathlib").Path(kwargs["folder_path"]).iterdir())
        self.calls[-1][1]["files"] = files
        done = Future()
        done.set_result("https://hub.example/commit/1")
        return done if kwargs.get("run_as_future") else "https://hub.example/commit/1"


@pytest.mark.slow
def test_tiny_pretraining_end_to_end_with_push(corpus, tmp_path, monkeypatch):
    # Pretend the Hub is reachable and let a fake hub receive Trainer's uploads.
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    hub = FakeHub()
    monkeypatch.setattr("transformers.trainer.hf_api", lambda: hub)
    out = tmp_path / "mlm"
    results = main(
        [*tiny_args(corpus, out), "--max_steps", "6", "--eval_steps", "3", "--save_steps", "3",
         "--eval_before_training", "--push_to_hub", "--hub_model_id", "me/tiny-orchid", "--hub_strategy", "checkpoint"]
    )  # fmt: skip
    assert results["world_size"] == 1 and results["model_type"] == "orchid"
    assert json.loads((out / "results.json").read_text())["learning_rate"] == results["learning_rate"] == 1e-3
    assert 0.0 <= results["init"]["init_masked_accuracy"] <= 1.0
    assert 0.0 <= results["eval"]["eval_masked_accuracy"] <= 1.0
    assert results["eval"]["eval_perplexity"] > 1.0 and results["eval"]["eval_masked_tokens"] > 0
    assert results["eval"]["eval_loss"] < results["init"]["init_loss"]
    # The examples' result files, and the resolved optimizer of the paper's recipe.
    all_results = json.loads((out / "all_results.json").read_text())
    expected = {"train_loss", "train_samples", "eval_masked_accuracy", "eval_perplexity", "eval_samples"}
    assert expected <= set(all_results)
    optimizer = results["optimizer"]
    assert optimizer["weight decay"] == "1e-05 decoupled (torch AdamW weight_decay=0.01)"
    assert optimizer["implicit filters"] == "lr 0.001, weight decay 0 decoupled (torch AdamW weight_decay=0)"
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert [e["step"] for e in history if "eval_masked_accuracy" in e] == [3, 6]
    # Every entry of the run (losses and evaluations) says how long training had run, for curves against time.
    seconds = [e["train_seconds"] for e in history]
    assert len(seconds) == len(history) and seconds == sorted(seconds) and seconds[0] > 0
    assert (out / "checkpoint-3").is_dir() and (out / "checkpoint-6").is_dir()

    model = AutoModelForMaskedLM.from_pretrained(out)
    assert model.config.hidden_size == 32 and model.config.vocab_size == 300
    assert model.lm_head.decoder.weight.data_ptr() == model.orchid.embeddings.word_embeddings.weight.data_ptr()
    card = (out / "README.md").read_text()
    assert "pipeline_tag: fill-mask" in card and "masked-token accuracy" in card and "me/tiny-orchid" in card

    # Trainer pushes as --hub_strategy checkpoint says: at each save the folder and the last checkpoint; then
    # save_model pushes ("Model save", as in the examples) and the run ends with the folder and our card.
    (create, repo_id, kwargs), *uploads = hub.calls
    assert (create, repo_id, kwargs["exist_ok"]) == ("create_repo", "me/tiny-orchid", True)
    paths = [(call[1].get("path_in_repo"), call[1]["commit_message"]) for call in uploads]
    assert paths == [
        (None, "Training in progress, step 3"), ("last-checkpoint", "Training in progress, step 3, checkpoint"),
        (None, "Training in progress, step 6"), ("last-checkpoint", "Training in progress, step 6, checkpoint"),
        (None, "Model save"), (None, "Masked-LM pretraining"),
    ]  # fmt: skip
    final = uploads[-1][1]
    assert final["repo_id"] == "me/tiny-orchid" and final["folder_path"] == str(out)
    assert {"README.md", "model.safetensors", "modeling_orchid.py", "tokenizer.json"} <= set(final["files"])
    assert "checkpoint-*" in final["ignore_patterns"]


def test_training_clock_leaves_out_evaluation_time(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("orchid_hf.trainer.time.perf_counter", lambda: now[0])
    clock = TrainingClock()
    outside = {"init_loss": 1.0, "init_runtime": 3.0}
    clock.add_to(outside)  # an evaluation before training: no training time yet
    assert "train_seconds" not in outside
    clock.on_train_begin(None, SimpleNamespace(log_history=[]), None)
    now[0] = 110.0
    logs = [{"loss": 2.0}]
    clock.add_to(logs[-1])
    now[0] = 125.0  # an evaluation of 5 s ends here
    logs.append({"eval_loss": 1.5, "eval_runtime": 5.0})
    clock.add_to(logs[-1])
    now[0] = 131.0
    logs.append({"loss": 1.0, "train_runtime": 31.0})
    clock.add_to(logs[-1])
    assert [entry["train_seconds"] for entry in logs] == [10.0, 20.0, 26.0]


class StopAt(TrainerCallback):
    """Interrupts training after ``step`` (the checkpoint of that step is written first)."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def _train(corpus, output_dir, *, callbacks=None, resume=None):
    """Run the Trainer of the pretraining recipe; return the batches it trained on and the final weights."""
    parsed = parse_args(
        tiny_args(
            corpus, output_dir, "--max_steps", "10", "--save_steps", "4", "--eval_strategy", "no",
            "--max_train_samples", "24",
        )  # fmt: skip
    )
    trainer = build_trainer(parsed, callbacks=callbacks).trainer
    seen = []
    training_step = trainer.training_step

    def recording_step(model, inputs, num_items_in_batch=None):
        seen.append((inputs["input_ids"].clone(), inputs["labels"].clone()))
        return training_step(model, inputs, num_items_in_batch)

    trainer.training_step = recording_step
    trainer.train(resume_from_checkpoint=resume)
    return seen, {name: p.detach().clone() for name, p in trainer.model.named_parameters()}, trainer


def test_resume_from_last_checkpoint(tmp_path):
    (tmp_path / "checkpoint-4").mkdir()
    (tmp_path / "checkpoint-12").mkdir()
    assert resolve_checkpoint("last", str(tmp_path)) == str(tmp_path / "checkpoint-12")
    assert resolve_checkpoint(None, str(tmp_path)) is None
    with pytest.raises(ValueError, match="no checkpoint-\\* folder in"):
        resolve_checkpoint("last", str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="is not a folder"):
        resolve_checkpoint(str(tmp_path / "checkpoint-99"), str(tmp_path))


@pytest.mark.slow
def test_resume_gives_the_same_weights_as_an_uninterrupted_run(corpus, tmp_path):
    full_batches, full_weights, trainer = _train(corpus, tmp_path / "full")
    steps_per_epoch = len(trainer.get_train_dataloader())
    assert steps_per_epoch == 6  # the run crosses an epoch boundary, and the restart happens mid-epoch

    first_batches, _, _ = _train(corpus, tmp_path / "resumed", callbacks=[StopAt(4)])
    assert len(first_batches) == 4
    checkpoint = str(tmp_path / "resumed" / "checkpoint-4")
    second_batches, resumed_weights, resumed = _train(corpus, tmp_path / "resumed", resume=checkpoint)
    # The training clock goes on from where the checkpoint's log history ends.
    seconds = [(e["step"], e["train_seconds"]) for e in resumed.state.log_history if "train_seconds" in e]
    assert [step for step, _ in seconds] == [2, 4, 6, 8, 10, 10]
    assert [value for _, value in seconds] == sorted(value for _, value in seconds)

    # Nothing lost, nothing repeated: the same 10 batches, with the same masks, in the same order.
    assert len(full_batches) == 10 and len(second_batches) == 6
    for (ids_a, labels_a), (ids_b, labels_b) in zip(full_batches, first_batches + second_batches, strict=True):
        assert torch.equal(ids_a, ids_b) and torch.equal(labels_a, labels_b)
    assert full_weights.keys() == resumed_weights.keys()
    for name, weight in full_weights.items():
        assert torch.equal(weight, resumed_weights[name]), name


@pytest.mark.slow
def test_hub_path_streams_c4(corpus, tmp_path, monkeypatch):
    """The real C4 path, with the Hub replaced by a local stream: streaming, shuffling, packing on the fly,
    a finite validation set taken from the stream, and Trainer on an IterableDataset."""
    import datasets

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    local_load = datasets.load_dataset
    requests = []

    def fake_hub(name, config=None, *, split, streaming, cache_dir=None, token=None):
        requests.append((name, config, split, streaming))
        path = corpus / ("train.txt" if split == "train" else "validation.txt")
        return local_load("text", data_files=str(path), split="train", streaming=True, cache_dir=str(tmp_path))

    monkeypatch.setattr(datasets, "load_dataset", fake_hub)
    parsed = parse_args(
        [
            "--tokenizer_name", str(corpus / "tokenizer"), "--config_overrides", TINY, "--max_seq_length", "32",
            "--output_dir", str(tmp_path / "c4"), "--max_steps", "2", "--per_device_train_batch_size", "4",
            "--max_eval_samples", "5", "--use_cpu", "--disable_tqdm", "True",
        ]
    )  # fmt: skip
    trainer = build_trainer(parsed).trainer
    assert requests == [("allenai/c4", "en", "train", True), ("allenai/c4", "en", "validation", True)]
    assert isinstance(trainer.train_dataset, datasets.IterableDataset)
    assert len(trainer.eval_dataset) == 5 and all(len(ids) == 32 for ids in trainer.eval_dataset["input_ids"])
    assert trainer.train().global_step == 2


@pytest.mark.slow
def test_bert_baseline_through_the_same_recipe_then_evaluation_alone(corpus, tmp_path):
    """--model_type bert trains transformers' BERT with the same data, tokenizer and recipe; --do_eval alone then
    evaluates a saved model without training it."""
    out = tmp_path / "bert"
    bert = "hidden_size=32,num_hidden_layers=1,num_attention_heads=2,intermediate_size=64,max_position_embeddings=32"
    args = tiny_args(corpus, out, "--max_steps", "2", "--eval_strategy", "no", "--save_strategy", "no")
    args[args.index("--config_overrides") + 1] = bert
    results = main([*args, "--model_type", "bert"])
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "bert" and config["vocab_size"] == 300 and results["model_type"] == "bert"
    assert "implicit filters" not in results["optimizer"]  # BERT has no filters for the recipe's group
    assert 0.0 <= results["eval"]["eval_masked_accuracy"] <= 1.0

    evaluated = main(["--model_name_or_path", str(out), "--do_eval", "--output_dir", str(tmp_path / "eval"),
                      *tiny_args(corpus, tmp_path / "eval")[:4], "--max_seq_length", "32", "--use_cpu",
                      "--cache_dir", str(tmp_path / "cache")])  # fmt: skip
    assert "train" not in evaluated and evaluated["eval"]["eval_loss"] > 0
    assert not (tmp_path / "eval" / "model.safetensors").exists()  # nothing trained, nothing saved
    with pytest.raises(ValueError, match="--config_overrides can't be used in combination"):
        main(["--model_name_or_path", str(out), "--config_overrides", "hidden_size=64", "--output_dir", "x"])


@pytest.mark.slow
def test_config_name_takes_a_preset_or_a_config_file(corpus, tmp_path):
    from orchid_hf import OrchidConfig

    config = OrchidConfig.from_preset("orchid-bert-base", hidden_size=32, num_hidden_layers=1, intermediate_size=64,
                                      max_position_embeddings=32, filter_width=16, vocab_size=300)  # fmt: skip
    config.save_pretrained(tmp_path / "config")
    args = tiny_args(corpus, tmp_path / "run", "--max_steps", "1", "--eval_strategy", "no", "--save_strategy", "no")
    del args[args.index("--config_overrides") : args.index("--config_overrides") + 2]
    run = build_trainer(parse_args([*args, "--config_name", str(tmp_path / "config" / "config.json")]))
    assert run.trainer.model.config.hidden_size == 32 and run.trainer.model.config.model_type == "orchid"
    with pytest.raises(HubUnavailableError, match="Orchid presets: orchid-bert-base"):
        build_trainer(parse_args([*args, "--config_name", "orchid-bert-huge"]))


@pytest.mark.slow
def test_pretraining_from_a_checkpoint_at_longer_blocks_extends_its_context(corpus, tmp_path):
    """--model_name_or_path with a --max_seq_length beyond the checkpoint's positions extends an Orchid model's
    context and trains it at the new length."""
    from orchid_hf import OrchidForMaskedLM

    short = tmp_path / "short"
    main(tiny_args(corpus, short, "--max_steps", "2", "--eval_strategy", "no", "--save_strategy", "no"))
    longer = tmp_path / "longer"
    results = main([
        "--model_name_or_path", str(short), "--train_file", str(corpus / "train.txt"), "--max_seq_length", "96",
        "--output_dir", str(longer), "--max_steps", "2", "--per_device_train_batch_size", "2", "--use_cpu",
        "--eval_strategy", "no", "--save_strategy", "no", "--disable_tqdm", "True",
        "--cache_dir", str(tmp_path / "cache"),
    ])  # fmt: skip
    assert results["train"]["train_loss"] > 0
    config = json.loads((longer / "config.json").read_text())
    assert (config["max_position_embeddings"], config["transform_lengths"], config["filter_lag_scale"]) == (
        96, [32, 96], 32)
    assert OrchidForMaskedLM.from_pretrained(longer).get_position_embeddings().num_embeddings == 96


def test_a_one_step_run_shortens_the_warm_up_that_would_take_every_step(corpus, tmp_path):
    """The recipe's 6% warm-up rounds up to the one step of --max_steps 1, where transformers' polynomial schedule
    would divide by the steps left after it: the warm-up leaves one step."""
    results = main(tiny_args(corpus, tmp_path / "one", "--max_steps", "1", "--eval_strategy", "no",
                             "--save_strategy", "no"))  # fmt: skip
    assert results["train"]["train_loss"] > 0


@pytest.mark.slow
def test_an_extended_checkpoint_saves_a_tokenizer_that_truncates_at_the_new_length(corpus, tmp_path):
    from transformers import AutoTokenizer

    main(tiny_args(corpus, tmp_path / "short", "--max_steps", "2", "--eval_strategy", "no", "--save_strategy", "no"))
    main([
        "--model_name_or_path", str(tmp_path / "short"), "--train_file", str(corpus / "train.txt"),
        "--max_seq_length", "96", "--output_dir", str(tmp_path / "longer"), "--max_steps", "1",
        "--per_device_train_batch_size", "2", "--use_cpu", "--eval_strategy", "no", "--save_strategy", "no",
        "--disable_tqdm", "True", "--cache_dir", str(tmp_path / "cache"),
    ])  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "longer")
    assert tokenizer.model_max_length == 96
    text = " ".join(["word"] * 200)
    assert len(tokenizer(text, truncation=True)["input_ids"]) == 96


def test_padding_free_sequences_are_each_document_cut_at_the_block_size(corpus):
    """--padding_free: each document's tokens, in order, as [CLS] ... [SEP] sequences of at most the block size;
    nothing dropped, nothing padded."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(corpus / "tokenizer")
    docs = make_corpus(6, seed=4)
    split = document_splitter(tokenizer, 16, "text")({"text": [*docs, "", "  "]})
    pieces, content = iter(split["input_ids"]), []
    for doc in docs:
        ids = tokenizer(doc, add_special_tokens=False)["input_ids"]
        got = []
        while len(got) < len(ids):
            piece = next(pieces)
            assert 3 <= len(piece) <= 16 and piece[0] == tokenizer.cls_token_id and piece[-1] == tokenizer.sep_token_id
            got += piece[1:-1]
        content.append(got)
        assert got == ids
    assert next(pieces, None) is None
    specials = (tokenizer.cls_token_id, tokenizer.sep_token_id)
    assert all(mask == [int(t in specials) for t in ids]
               for ids, mask in zip(split["input_ids"], split["special_tokens_mask"], strict=True))  # fmt: skip


def test_padding_free_collator_packs_one_row_with_restarting_positions_and_bert_masking(corpus):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(corpus / "tokenizer")
    split = document_splitter(tokenizer, 16, "text")({"text": make_corpus(4, seed=5)})
    features = [{"input_ids": ids, "special_tokens_mask": mask}
                for ids, mask in zip(split["input_ids"], split["special_tokens_mask"], strict=True)]  # fmt: skip
    collator = PaddingFreeMLMCollator(tokenizer=tokenizer, mlm_probability=0.5, mask_seed=0)
    batch = collator(features)
    lengths = [len(f["input_ids"]) for f in features]
    assert batch["input_ids"].shape == batch["labels"].shape == batch["position_ids"].shape == (1, sum(lengths))
    assert batch["position_ids"][0].tolist() == [i for n in lengths for i in range(n)]
    flat = torch.tensor([t for f in features for t in f["input_ids"]])
    labelled = batch["labels"][0] != -100
    assert labelled.any() and (batch["labels"][0][labelled] == flat[labelled]).all()
    assert not labelled[torch.tensor([m for f in features for m in f["special_tokens_mask"]], dtype=torch.bool)].any()
    assert (batch["input_ids"][0][~labelled] == flat[~labelled]).all()  # unlabelled tokens are left as they are


@pytest.mark.slow
def test_padding_free_pretraining_runs_for_orchid_and_is_refused_for_bert(corpus, tmp_path):
    results = main(tiny_args(corpus, tmp_path / "free", "--max_steps", "2", "--eval_strategy", "steps",
                             "--eval_steps", "2", "--save_strategy", "no", "--padding_free", "True"))  # fmt: skip
    assert results["train"]["train_loss"] > 0 and 0.0 <= results["eval"]["eval_masked_accuracy"] <= 1.0
    bert = "hidden_size=32,num_hidden_layers=1,num_attention_heads=2,intermediate_size=64,max_position_embeddings=32"
    args = tiny_args(corpus, tmp_path / "bert", "--max_steps", "1", "--eval_strategy", "no", "--save_strategy", "no",
                     "--padding_free", "True")  # fmt: skip
    args[args.index("--config_overrides") + 1] = bert
    with pytest.raises(ValueError, match="--padding_free packs a batch's sequences in one row.*BertForMaskedLM"):
        main([*args, "--model_type", "bert"])
