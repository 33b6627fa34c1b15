"""The transfer diagnosis's pieces (experiments/transfer/) on tiny models and generated text: the kernel-width
measure, linear probes, per-layer features and norms, Orchid's operator measurements read through forward hooks, the
chapter split, masking by transformers' collator, the package's and transformers' classifiers on the pretrained
encoder (first-token and mean pooling) and a fine-tuning step."""

import json

import numpy as np
import pytest
import torch
from transformers import BertTokenizer

from experiments.transfer import measures
from experiments.transfer.data import build_corpus, chapter_split, load_corpus, load_tensors, subset
from experiments.transfer.models import (
    build_classifier,
    build_mlm_model,
    finetune,
    init_pooler_from_mlm,
    masking,
    parameter_group,
    pooled_features,
    pooler_dense,
)
from orchid_hf import OrchidConfig, OrchidModel
from tests.test_novels import SPECIALS, chapter_words, write_novel
from tests.test_real_data import RunsCodeWhenLoaded, load_script

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(hidden=32, layers=2, intermediate=64, max_positions=32)
PAD_ID, CLS_ID, SEP_ID, MASK_ID = 0, 101, 102, 103  # bert-base-uncased's


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A WordPiece tokenizer with bert-base-uncased's special token ids and 2,000 tokens."""
    specials = {PAD_ID: "[PAD]", 100: "[UNK]", CLS_ID: "[CLS]", SEP_ID: "[SEP]", MASK_ID: "[MASK]"}
    vocab = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    vocab.write_text("\n".join(specials.get(i, f"word{i}") for i in range(2000)) + "\n")
    return BertTokenizer(str(vocab), do_lower_case=True)


def tiny_split(count: int = 12, length: int = 10, seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 2000, (count, length), generator=generator)
    ids[:, 0] = CLS_ID
    mask = torch.ones(count, length, dtype=torch.long)
    for row in range(count):  # real lengths 6 .. 10, padded on the right
        real = 6 + row % 5
        ids[row, real - 1] = SEP_ID
        ids[row, real:] = 0
        mask[row, real:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.arange(count) % 3}


def test_an_impulse_kernel_has_width_one_lag_and_a_low_pass_kernel_is_wider():
    n, channels = 64, 3
    identity = torch.full((n, channels), 2.0)  # a constant multiplier: the operator is 2 * identity
    response = measures.position_zero_response(identity)
    assert torch.allclose(response[0], torch.full((channels,), 2.0), atol=1e-5)
    assert torch.equal(measures.effective_width(response), torch.ones(channels, dtype=torch.long))
    assert torch.allclose(measures.energy_within(response, 1), torch.ones(channels))
    # Keeping only the zero frequency averages the whole sequence: position 0 sees every position alike, and 90% of
    # the energy lies in the first 58 of 64 positions.
    average = torch.zeros(n, channels)
    average[0] = 1.0
    flat = measures.position_zero_response(average)
    assert torch.allclose(flat, torch.full_like(flat, 1 / n), atol=1e-6)
    assert torch.equal(measures.effective_width(flat), torch.full((channels,), 58))
    summary = measures.summarise_responses([response], lags=(1, 4))
    assert summary["median_width_90"] == 1 and summary["energy_within_1"] == pytest.approx(1.0)


def test_a_probe_on_separable_features_is_exact_and_on_noise_is_at_chance():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(3), 40)
    separable = rng.normal(size=(120, 5)) * 0.1
    separable[np.arange(120), labels] += 3.0
    assert measures.probe_accuracy(separable, labels, separable, labels) == 1.0
    noise_train, noise_test = rng.normal(size=(120, 5)), rng.normal(size=(300, 5))
    test_labels = np.repeat(np.arange(3), 100)
    assert measures.probe_accuracy(noise_train, labels, noise_test, test_labels) < 0.5


def test_participation_ratio_counts_the_directions_that_hold_the_variance():
    rng = np.random.default_rng(0)
    isotropic = rng.normal(size=(4000, 8))
    assert measures.participation_ratio(isotropic) == pytest.approx(8, rel=0.05)
    one_direction = np.outer(rng.normal(size=4000), rng.normal(size=8))
    assert measures.participation_ratio(one_direction) == pytest.approx(1, rel=1e-6)


@pytest.mark.parametrize("arch", ["orchid", "bert"])
def test_layer_features_cover_every_layer_and_ignore_padding(arch):
    encoder = build_mlm_model(arch, **TINY).base_model
    split = tiny_split()
    features = measures.layer_features(encoder, split, batch_size=5)
    assert features["first"].shape == features["mean"].shape == (TINY["layers"] + 1, 12, TINY["hidden"])
    assert features["norm"].shape == (TINY["layers"] + 1,) and (features["norm"] > 0).all()
    # Other token ids at padded positions change nothing of the mean over real tokens.
    changed = dict(split, input_ids=split["input_ids"].masked_fill(split["attention_mask"] == 0, 1500))
    again = measures.layer_features(encoder, changed, batch_size=5)
    np.testing.assert_allclose(again["mean"], features["mean"], atol=1e-5)


def test_orchid_operator_stats_read_the_kernels_the_operator_computes_and_a_pooler_measure():
    model = build_mlm_model("orchid", **TINY)
    split = tiny_split()
    stats = measures.orchid_operator_stats(model.base_model, split["input_ids"], split["attention_mask"])
    assert [entry["layer"] for entry in stats] == list(range(TINY["layers"]))
    for entry in stats:
        for kernel in ("static", "data_dependent", "residual"):
            assert 1 <= entry[kernel]["median_width_90"] <= TINY["max_positions"]
            assert 0 <= entry[kernel]["energy_within_1"] <= entry[kernel]["energy_within_16"] <= 1 + 1e-6
        assert entry["conditioning_rms"] > 0 and entry["static_kernel_rms"] > 0 and entry["mixer_output_rms"] > 0
    # Rows of the model's full length are mixed at its transform length, 32: the static kernel measured is what the
    # layer's static filter returns there, h0 over its 32 lags.
    full = torch.randint(1000, 2000, (3, TINY["max_positions"]), generator=torch.Generator().manual_seed(1))
    stats = measures.orchid_operator_stats(model.base_model, full, torch.ones_like(full))
    for entry, layer in zip(stats, model.base_model.encoder.layer):
        with torch.no_grad():
            kernel = layer.mixer.static_filter(TINY["max_positions"])
        assert entry["static"] == pytest.approx(measures.summarise_responses([kernel]))
        assert entry["static_kernel_rms"] == pytest.approx(kernel.pow(2).mean().sqrt().item(), rel=1e-5)
    with pytest.raises(ValueError, match="reads kernels of the DCT, but layer 0 has transform 'fft'"):
        measures.orchid_operator_stats(OrchidModel(OrchidConfig(**TINY_CONFIG, transform="fft")), full,
                                       torch.ones_like(full))  # fmt: skip
    dense = torch.nn.Linear(4, 4)
    with torch.no_grad():
        dense.weight.copy_(torch.eye(4) * 100)
        dense.bias.zero_()
    assert measures.pooler_saturation(torch.ones(2, 4), dense)["saturated_fraction"] == 1.0
    assert measures.pooler_saturation(torch.full((2, 4), 1e-4), dense)["saturated_fraction"] == 0.0


TINY_CONFIG = dict(vocab_size=2000, hidden_size=32, num_hidden_layers=1, intermediate_size=64,
                   max_position_embeddings=32, filter_width=16)  # fmt: skip


def test_masking_never_touches_special_tokens_and_keeps_the_rate(tokenizer):
    ids = torch.randint(1000, 2000, (64, 32))
    ids[:, 0], ids[:, -1], ids[:, -4:-1] = CLS_ID, SEP_ID, PAD_ID
    batch = masking(tokenizer, 0.3, seed=0)(list(ids))
    inputs, labels = batch["input_ids"], batch["labels"]
    special = (ids == CLS_ID) | (ids == SEP_ID) | (ids == PAD_ID)
    assert (labels[special] == -100).all() and torch.equal(inputs[special], ids[special])
    chosen = labels != -100
    assert 0.25 < chosen.float().sum() / (~special).sum() < 0.35
    assert torch.equal(labels[chosen], ids[chosen]) and torch.equal(inputs[~chosen], ids[~chosen])
    assert 0.7 < (inputs[chosen] == MASK_ID).float().mean() < 0.9
    assert torch.equal(masking(tokenizer, 0.3, seed=0)(list(ids))["input_ids"], inputs)  # seeded: the same masks


def test_the_corpus_keeps_test_chapters_out_of_pretraining(tmp_path):
    write_novel(tmp_path / "alpha.txt", 0, 7, "CHAPTER {roman}")
    write_novel(tmp_path / "beta.txt", 1, 6, "Chapter {n}")
    words = [w for n, c in ((0, range(7)), (1, range(6))) for i in c for w in chapter_words(n, i)]
    (tmp_path / "vocab.txt").write_text("\n".join(SPECIALS + [".", ","] + words) + "\n")
    tokenizer = BertTokenizer(str(tmp_path / "vocab.txt"), do_lower_case=True)
    corpus = build_corpus([tmp_path / "alpha.txt", tmp_path / "beta.txt"], tokenizer, 12, 8)
    assert corpus["names"] == ["alpha", "beta"]
    test_words = {w for n, chapters in ((0, 7), (1, 6)) for c in range(chapters) if chapter_split(c) == "test"
                  for w in chapter_words(n, c)}
    test_ids = set(tokenizer.convert_tokens_to_ids(sorted(test_words)))
    assert corpus["mlm"].shape[1] == 8 and not test_ids & set(corpus["mlm"].flatten().tolist())
    for split in ("train", "validation", "test"):
        assert corpus[split]["input_ids"].shape[1] == 12
        assert len(corpus[split]["labels"]) == len(corpus[split]["texts"]) > 0
    assert all(set(text.split()) & test_words for text in corpus["test"]["texts"])
    half = subset(corpus["train"], 3)
    assert len(half["labels"]) == len(half["texts"]) == 3


def test_the_corpus_cache_loads_back_as_tensors_and_a_crafted_one_runs_no_code(tmp_path):
    data, vocab = tmp_path / "novels", tmp_path / "vocab"
    data.mkdir(), vocab.mkdir()
    write_novel(data / "alpha.txt", 0, 6, "CHAPTER {roman}")
    write_novel(data / "beta.txt", 1, 6, "Chapter {n}")
    words = [w for n in (0, 1) for c in range(6) for w in chapter_words(n, c)]
    (vocab / "vocab.txt").write_text("\n".join(SPECIALS + [".", ","] + words) + "\n")
    cache = tmp_path / "cache" / "corpus.pt"
    built = load_corpus(data, vocab, cache, passage_tokens=12, block_tokens=8)
    cached = load_corpus(tmp_path / "elsewhere", tmp_path / "elsewhere", cache)  # read from the cache alone
    assert cached["names"] == built["names"] and torch.equal(cached["mlm"], built["mlm"])
    assert cached["test"]["texts"] == built["test"]["texts"]
    assert torch.equal(cached["test"]["input_ids"], built["test"]["input_ids"])

    # A cache (or a saved model's state dict) that unpickles an object would run code when loaded with
    # weights_only=False: it is refused, and the code never runs.
    marker = tmp_path / "marker"
    torch.save({"names": ["alpha"], "payload": RunsCodeWhenLoaded(marker)}, cache)
    with pytest.raises(ValueError, match=r"corpus.pt holds more than tensors, numbers and strings.*delete it"):
        load_corpus(data, vocab, cache)
    with pytest.raises(ValueError, match=r"corpus.pt holds more than tensors"):
        load_tensors(cache)
    assert not marker.exists()


@pytest.mark.slow
def test_finetuning_learns_a_separable_task_and_records_gradients_per_layer():
    torch.manual_seed(0)
    split = tiny_split(count=48)
    split["labels"] = (split["input_ids"][:, 1] >= 1500).long()  # the first word's id tells the class
    split["input_ids"][:, 1] = torch.where(split["labels"] == 1, 1900, 1100)
    model = build_classifier(build_mlm_model("orchid", **TINY), 2, "mean")
    log = finetune(model, split, {"train": split}, epochs=6, lr=3e-3, batch_size=8, grad_steps=2)
    assert log["final"]["train"] == 1.0
    assert set(log["first_step_gradient_norms"]) == {"embeddings", "layer.0", "layer.1", "head"}
    assert all(len(norms) == 2 for norms in log["first_step_gradient_norms"].values())
    assert parameter_group("orchid.encoder.layer.1.mixer.in_proj.weight") == "layer.1"
    assert parameter_group("bert.pooler.dense.weight") == parameter_group("classifier.bias") == "head"


@pytest.mark.parametrize("arch", ["orchid", "bert"])
@pytest.mark.parametrize("pooling", ["first", "mean"])
def test_the_classifier_is_the_library_class_on_the_pretrained_encoder_and_pools_as_asked(arch, pooling):
    mlm = build_mlm_model(arch, **TINY)
    classifier = build_classifier(mlm, 3, pooling).eval()
    assert type(classifier).__name__ == f"{'Orchid' if arch == 'orchid' else 'Bert'}ForSequenceClassification"
    assert classifier.config.num_labels == 3
    for name, tensor in mlm.base_model.state_dict().items():
        assert torch.equal(classifier.base_model.state_dict()[name], tensor), name
    split = tiny_split()
    ids, mask = split["input_ids"], split["attention_mask"]
    with torch.no_grad():
        hidden = mlm.base_model.eval()(ids, attention_mask=mask).last_hidden_state
    real = mask.unsqueeze(-1).float()
    expected = hidden[:, 0] if pooling == "first" else (hidden * real).sum(1) / real.sum(1)
    torch.testing.assert_close(pooled_features(classifier, ids, mask), expected, atol=1e-5, rtol=1e-5)
    logits = classifier(input_ids=ids, attention_mask=mask).logits
    dense = pooler_dense(classifier)
    torch.testing.assert_close(logits, classifier.classifier(torch.tanh(dense(expected))), atol=1e-5, rtol=1e-5)
    init_pooler_from_mlm(classifier, mlm)
    source = mlm.lm_head.dense if arch == "orchid" else mlm.cls.predictions.transform.dense
    assert torch.equal(dense.weight, source.weight) and torch.equal(dense.bias, source.bias)
    with pytest.raises(ValueError, match="pooling must be one of"):
        build_classifier(mlm, 3, "max")


def test_the_finetuning_table_gives_the_seeds_mean_of_each_setting_run_with_several(tmp_path):
    from experiments.transfer import report

    def write(model, seed, validation, test, lr=1e-3):
        run = {"model": model, "pooling": "mean", "pooler_init": "random", "epochs": 3, "lr": lr, "seed": seed,
               "final": {"validation": validation, "test": test}, "train_seconds": 60.0,
               "first_step_gradient_norms": {"embeddings": [0.1], "layer0": [0.2], "head": [0.3]}}
        (tmp_path / f"finetune-{model}-{seed}-{lr:g}.json").write_text(json.dumps(run))

    write("orchid-pt600-s0", 0, 0.40, 0.44)
    write("orchid-pt600-s0", 1, 0.50, 0.48)
    write("orchid-pt600-s0", 0, 0.30, 0.30, lr=2e-4)  # one seed only: no mean row
    rows = report.finetune_table(tmp_path)
    header = "| model | pooling | pooler init | epochs | lr | seeds | mean validation % | mean test % |"
    assert rows[rows.index(header) + 2:] == ["| orchid-pt600-s0 | mean | random | 3 | 0.001 | 0, 1 | 45.0 | 46.0 |"]


def test_the_operator_table_says_how_each_run_measured_its_kernels(tmp_path):
    from experiments.transfer import report

    model = build_mlm_model("orchid", **TINY)
    split = tiny_split()
    layers = measures.orchid_operator_stats(model.base_model, split["input_ids"], split["attention_mask"])
    pooler = {"pooled_feature_rms": 1.0, "tanh_input_rms": 0.2, "saturated_fraction": 0.0}
    poolers = {f"pooler_{p}{init}": pooler for p in ("first", "mean") for init in ("", "_mlm_init")}
    (tmp_path / "operator-orchid-random-s0.json").write_text(json.dumps({"model": "orchid-random-s0", "layers": layers,
                                                                          **poolers}))
    earlier = [{("static_multiplier_rms" if key == "static_kernel_rms" else key): value for key, value in entry.items()}
               for entry in layers]  # fmt: skip
    (tmp_path / "operator-orchid-random-s1.json").write_text(json.dumps({"model": "orchid-random-s1", "layers": earlier,
                                                                          **poolers}))
    text = "\n".join(report.operator_table(tmp_path))
    assert "Kernels measured on position 0's row of each long convolution C^T diag(M) C" in text
    assert "Kernels measured on the kernels the operator's modules return" in text
    assert "| conditioning RMS / static kernel h0 RMS |" in text
    assert "| conditioning RMS / static multiplier RMS |" in text
    assert text.count("| orchid-random-s0 | 0 |") == text.count("| orchid-random-s1 | 1 |") == 1


def test_filter_table_reads_saved_models(tmp_path):
    """`transfer_diagnosis.py filters`: a run file per saved Orchid model, with its commit and machine, and one row per
    implicit filter, the saved kernel's RMS beside the same configuration's at initialisation; a model whose filters
    were zeroed shows 0."""
    from experiments.transfer.diagnose import filter_table
    from orchid_hf import OrchidConfig, OrchidForMaskedLM

    config = OrchidConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                          max_position_embeddings=32, filter_width=16)  # fmt: skip
    torch.manual_seed(0)
    OrchidForMaskedLM(config).save_pretrained(tmp_path / "initial")
    torch.manual_seed(0)
    zeroed = OrchidForMaskedLM(config)
    with torch.no_grad():
        for name, parameter in zeroed.named_parameters():
            if ".static_filter.ffn." in name:
                parameter.zero_()
    zeroed.save_pretrained(tmp_path / "zeroed")
    threads = torch.get_num_threads()  # the script runs on one thread
    load_script("transfer_diagnosis").main(["filters", str(tmp_path / "initial"), str(tmp_path / "zeroed"),
                                            "--results_dir", str(tmp_path / "results")])  # fmt: skip
    torch.set_num_threads(threads)
    records = [json.loads((tmp_path / "results" / f"filters-{name}.json").read_text()) for name in ("initial",
                                                                                                   "zeroed")]
    assert all(len(record["commit"]) == 40 and record["machine"] for record in records)
    rows = [line.split(" | ") for line in filter_table(records).splitlines()[2:]]
    assert len(rows) == 8  # 2 models x 2 layers x (static, residual)
    expected = measures.implicit_kernel_rms(OrchidForMaskedLM.from_pretrained(tmp_path / "initial"))
    for row in rows:
        model, name, initial, saved = row[0].strip("| "), row[1], float(row[2]), float(row[3])
        assert initial == pytest.approx(expected[f"orchid.encoder.layer.{name}"], rel=1e-2)
        if model == "zeroed" and "static" in name:
            assert saved == 0.0
        else:
            assert saved == pytest.approx(initial, rel=1e-2) and saved > 0
