"""Orchid in sentence-transformers, as a user runs it: load a saved folder, encode (batched, padded on either side),
train with SentenceTransformerTrainer and MultipleNegativesRankingLoss, save, load (also as remote code), card; the
folder's ONNX graphs (float32 and int8) run in ONNX Runtime and pooled as the folder pools."""

import json
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from datasets import Dataset
from safetensors.torch import save_file
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from sentence_transformers.base.modules import Transformer
from sentence_transformers.base.sampler import BatchSamplers
from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
from sentence_transformers.sentence_transformer.modules import Pooling
from transformers import AutoTokenizer, BertConfig, BertModel

from orchid_hf import OrchidForMaskedLM, OrchidModel
from orchid_hf.cards import write_model_card
from orchid_hf.embeddings import export_embedder_onnx, sentence_transformer
from orchid_hf.tokenization import train_wordpiece_tokenizer

from .test_models import tiny_image_config, tiny_text_config
from .test_onnx import needs_onnxruntime

PAIRS = [
    ("the cat sat on the mat", "a cat on a mat"),
    ("a dog ran in the park", "the dog in the park"),
    ("the bird sang in the tree", "a bird in a tree"),
    ("my friend read a good book", "a friend with a book"),
    ("the sun is warm today", "a warm sun today"),
    ("the fish swam in the sea", "a fish in the sea"),
    ("the man rode a red bike", "a red bike and a man"),
    ("she baked bread at night", "bread baked at night"),
]
# Lengths from 3 to 14 tokens, so that every batch is padded.
SENTENCES = [
    "the cat",
    "the cat sat on the mat",
    "a dog ran in the park and the bird sang in the tree",
    "my friend",
    "the sun is warm today and the fish swam in the sea all day",
    "bread",
    "the man rode a red bike",
]


@pytest.fixture(scope="module")
def tokenizer():
    return train_wordpiece_tokenizer([text for pair in PAIRS for text in pair] * 10, vocab_size=97)


def tiny_encoder(tokenizer, cls=OrchidModel, **overrides):
    torch.manual_seed(0)
    return cls(tiny_text_config(vocab_size=len(tokenizer), **overrides)).eval()


@pytest.fixture
def saved_encoder(tokenizer, tmp_path):
    """An OrchidModel folder with its tokenizer, as a pretraining run leaves it."""
    model = tiny_encoder(tokenizer)
    model.save_pretrained(tmp_path / "encoder")
    tokenizer.save_pretrained(tmp_path / "encoder")
    return model, tmp_path / "encoder"


def mean_over_real_tokens(model, tokenizer, texts):
    """The embeddings by hand: the encoder on each text alone, averaged over its tokens."""
    rows = []
    with torch.no_grad():
        for text in texts:
            encoded = tokenizer(text, return_tensors="pt")
            rows.append(model(**encoded).last_hidden_state[0].mean(dim=0))
    return torch.stack(rows)


def test_a_saved_orchid_folder_loads_as_a_sentence_transformer_with_mean_pooling(saved_encoder, tokenizer):
    model, folder = saved_encoder
    st = SentenceTransformer(str(folder), device="cpu")
    assert type(st[0].auto_model) is OrchidModel
    assert st[1].get_config_dict()["pooling_mode"] == "mean"
    embeddings = st.encode(SENTENCES, convert_to_tensor=True, batch_size=4)
    torch.testing.assert_close(embeddings, mean_over_real_tokens(model, tokenizer, SENTENCES), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pooling", ["mean", "cls", "lasttoken"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_embeddings_do_not_depend_on_the_padding_side_or_the_batch(saved_encoder, side, pooling):
    _, folder = saved_encoder
    st = sentence_transformer(folder, pooling=pooling)
    st.tokenizer.padding_side = side
    features = st.preprocess(SENTENCES[:3])
    mask = features["attention_mask"]
    assert not mask.all(), "the batch must be padded"
    padded_end = mask[:, 0] if side == "left" else mask[:, -1]
    assert padded_end.min() == 0, f"the tokenizer must pad on the {side}"
    one_by_one = torch.cat([st.encode([text], convert_to_tensor=True) for text in SENTENCES])
    batched = st.encode(SENTENCES, batch_size=4, convert_to_tensor=True)
    torch.testing.assert_close(batched, one_by_one, atol=1e-5, rtol=1e-5)


def test_encode_runs_in_batches_with_a_progress_bar(saved_encoder, capfd):
    _, folder = saved_encoder
    st = SentenceTransformer(str(folder), device="cpu")
    embeddings = st.encode(SENTENCES, batch_size=3, show_progress_bar=True)
    assert embeddings.shape == (len(SENTENCES), 32)
    assert "3/3" in capfd.readouterr().err  # 7 sentences in batches of 3


# ---------------------------------------------------------------------------------------------
# orchid_hf.embeddings.sentence_transformer
# ---------------------------------------------------------------------------------------------


def test_helper_takes_a_task_checkpoint_or_a_model_in_memory(tokenizer, tmp_path):
    mlm = tiny_encoder(tokenizer, OrchidForMaskedLM)
    mlm.save_pretrained(tmp_path / "mlm")
    tokenizer.save_pretrained(tmp_path / "mlm")
    expected = mean_over_real_tokens(mlm.orchid, tokenizer, SENTENCES)
    from_folder = sentence_transformer(tmp_path / "mlm")
    in_memory = sentence_transformer(mlm, tokenizer, normalize=True)
    assert from_folder.max_seq_length == mlm.config.max_position_embeddings
    assert [type(module).__name__ for module in in_memory] == ["Transformer", "Pooling", "Normalize"]
    torch.testing.assert_close(from_folder.encode(SENTENCES, convert_to_tensor=True), expected, atol=1e-5, rtol=1e-5)
    unit = torch.nn.functional.normalize(expected, dim=-1)
    torch.testing.assert_close(in_memory.encode(SENTENCES, convert_to_tensor=True), unit, atol=1e-5, rtol=1e-5)


def test_helper_unwraps_compiled_and_parallel_models_and_refuses_peft_and_other_modules_by_name(tokenizer):
    import peft

    model = tiny_encoder(tokenizer)
    expected = sentence_transformer(model, tokenizer).encode(SENTENCES, convert_to_tensor=True)
    for wrapped in (torch.compile(model, backend="eager"), torch.nn.DataParallel(model)):
        st = sentence_transformer(wrapped, tokenizer)
        torch.testing.assert_close(st.encode(SENTENCES, convert_to_tensor=True), expected, atol=0, rtol=0)
    lora = peft.get_peft_model(tiny_encoder(tokenizer), peft.LoraConfig(r=2, target_modules=["in_proj"]))
    with pytest.raises(ValueError, match=r"a peft model \(PeftModel\).*merge_and_unload\(\).*add_adapter"):
        sentence_transformer(lora, tokenizer)
    with pytest.raises(ValueError, match=r"model must be an Orchid model, a folder or a Hub id, got Linear"):
        sentence_transformer(torch.nn.Linear(2, 2), tokenizer)
    with pytest.raises(ValueError, match=r"model must be an Orchid model, a folder or a Hub id, got int"):
        sentence_transformer(3)


def test_helper_truncates_to_max_seq_length(saved_encoder, tokenizer):
    model, folder = saved_encoder
    st = sentence_transformer(folder, max_seq_length=6)
    assert st.max_seq_length == 6
    long = SENTENCES[4]
    ids = tokenizer(long, truncation=True, max_length=6, return_tensors="pt")
    with torch.no_grad():
        expected = model(**ids).last_hidden_state[0].mean(dim=0)
    torch.testing.assert_close(st.encode(long, convert_to_tensor=True), expected, atol=1e-5, rtol=1e-5)


def test_helper_rejects_what_it_cannot_build(saved_encoder, tokenizer, tmp_path, monkeypatch):
    model, folder = saved_encoder
    with pytest.raises(ValueError, match=r"max_seq_length must lie in \[1, max_position_embeddings=24\], got 25"):
        sentence_transformer(folder, max_seq_length=25)
    with pytest.raises(ValueError, match=r"pooling must be one of .*got 'median'"):
        sentence_transformer(folder, pooling="median")
    with pytest.raises(ValueError, match="a model in memory needs its tokenizer"):
        sentence_transformer(model)
    with pytest.raises(ValueError, match="image model"):
        sentence_transformer(OrchidModel(tiny_image_config()), tokenizer)
    BertModel(BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=1, num_attention_heads=2)).save_pretrained(
        tmp_path / "bert"
    )
    with pytest.raises(ValueError, match=r"an Orchid checkpoint, got model_type='bert'"):
        sentence_transformer(tmp_path / "bert")
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    with pytest.raises(ImportError, match=r'pip install "orchid-hf\[embeddings\]"'):
        sentence_transformer(folder)


# ---------------------------------------------------------------------------------------------
# Training, saving, loading
# ---------------------------------------------------------------------------------------------

REMOTE_ENCODER = textwrap.dedent(
    """
    import sys

    sys.modules["orchid_hf"] = None  # a user who never installed orchid_hf
    try:
        import orchid_hf
        raise SystemExit("orchid_hf is importable; the test would prove nothing")
    except ModuleNotFoundError:
        pass

    import torch
    from safetensors.torch import load_file
    from sentence_transformers import SentenceTransformer

    folder = sys.argv[1]
    model = SentenceTransformer(folder, device="cpu", trust_remote_code=True)
    assert type(model[0].auto_model).__module__.startswith("transformers_modules."), type(model[0].auto_model)
    expected = load_file(folder + "/expected.safetensors")["embeddings"]
    sentences = sys.argv[2:]
    torch.testing.assert_close(model.encode(sentences, convert_to_tensor=True), expected, atol=1e-6, rtol=1e-6)
    print("remote-ok", type(model[0].auto_model).__name__)
    """
)


def retrieval_accuracy(st):
    """How often a pair's first text is nearest to its own second text among all second texts."""
    anchors = st.encode([a for a, _ in PAIRS], convert_to_tensor=True)
    positives = st.encode([p for _, p in PAIRS], convert_to_tensor=True)
    return (st.similarity(anchors, positives).argmax(dim=1) == torch.arange(len(PAIRS))).float().mean().item()


@pytest.mark.slow
def test_train_with_multiple_negatives_ranking_loss_then_save_and_load(
    saved_encoder, tmp_path, hf_modules_cache, one_thread
):
    _, folder = saved_encoder
    st = sentence_transformer(folder)
    before = retrieval_accuracy(st)
    pairs = Dataset.from_dict({"anchor": [a for a, _ in PAIRS], "positive": [p for _, p in PAIRS]})
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path / "run"),
        max_steps=20,
        per_device_train_batch_size=len(PAIRS),
        learning_rate=3e-3,
        batch_sampler=BatchSamplers.NO_DUPLICATES,  # a text twice in a batch would be its own negative
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
    )
    loss = MultipleNegativesRankingLoss(st)
    trainer = SentenceTransformerTrainer(model=st, args=args, train_dataset=pairs, loss=loss)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 20 and losses[-1] < 0.1 * losses[0], losses
    assert before < 1.0 and retrieval_accuracy(st) == 1.0

    expected = st.encode(SENTENCES, convert_to_tensor=True)
    st.save(str(tmp_path / "trained"))
    loaded = SentenceTransformer(str(tmp_path / "trained"), device="cpu")
    assert loaded[1].get_config_dict()["pooling_mode"] == "mean"
    assert loaded.max_seq_length == st.max_seq_length
    torch.testing.assert_close(loaded.encode(SENTENCES, convert_to_tensor=True), expected, atol=0, rtol=0)

    save_file({"embeddings": expected.contiguous()}, str(tmp_path / "trained" / "expected.safetensors"))
    result = subprocess.run(
        [sys.executable, "-c", REMOTE_ENCODER, str(tmp_path / "trained"), *SENTENCES],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # not the repository, whose orchid_hf/ folder would be importable from the cwd
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "remote-ok OrchidModel" in result.stdout, result.stdout


def test_model_card_of_a_sentence_transformers_folder(saved_encoder, tmp_path):
    _, folder = saved_encoder
    sentence_transformer(folder, normalize=True).save(str(tmp_path / "embedder"))
    card = write_model_card(tmp_path / "embedder", task="sentence-similarity", repo_id="me/orchid-embedder")
    text = (tmp_path / "embedder" / "README.md").read_text()
    assert card.data.library_name == "sentence-transformers" and card.data.pipeline_tag == "sentence-similarity"
    assert "sentence-transformers" in card.data.tags
    assert "## Embeddings" in text and "| pooling | mean |" in text and "| dimension | 32 |" in text
    assert "| max_seq_length | 24 |" in text and "| normalized | yes (unit length) |" in text
    assert 'SentenceTransformer("me/orchid-embedder")' in text
    assert 'SentenceTransformer("me/orchid-embedder", trust_remote_code=True)' in text
    with pytest.raises(ValueError, match=r"needs a sentence-transformers folder \(modules.json\)"):
        write_model_card(folder, task="sentence-similarity")
    # A transformers folder's card has no embedding section.
    write_model_card(folder, task="feature-extraction")
    assert "## Embeddings" not in (folder / "README.md").read_text()


# ---------------------------------------------------------------------------------------------
# ONNX: orchid_hf.embeddings.export_embedder_onnx
# ---------------------------------------------------------------------------------------------


def onnx_embeddings(folder, path, texts, padding_side="right"):
    """The embeddings as a user computes them without sentence-transformers (docs/embeddings.md): the folder's
    tokenizer, the graph ``path`` in ONNX Runtime, the mean of ``last_hidden_state`` over the attention mask (the
    folder's Pooling module), and unit length where modules.json has a Normalize module."""
    import onnxruntime

    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode"] == "mean", "this pooling by hand is the mean's"
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    tokenizer = AutoTokenizer.from_pretrained(folder, padding_side=padding_side)
    inputs = tokenizer(texts, padding=True, truncation=True, return_tensors="np")
    assert not inputs["attention_mask"].all(), "the batch must be padded"
    (hidden,) = session.run(["last_hidden_state"], {value.name: inputs[value.name] for value in session.get_inputs()})
    mask = inputs["attention_mask"][..., None].astype(np.float32)
    embeddings = (hidden * mask).sum(axis=1) / mask.sum(axis=1)
    modules = json.loads((folder / "modules.json").read_text())
    if any(module["type"].endswith(".Normalize") for module in modules):
        embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)
    return torch.from_numpy(embeddings)


@needs_onnxruntime
def test_an_embedding_folder_gets_onnx_graphs_that_give_its_embeddings_in_onnx_runtime(saved_encoder, tmp_path):
    _, encoder = saved_encoder
    folder = tmp_path / "embedder"
    sentence_transformer(encoder, normalize=True).save(str(folder))
    paths = export_embedder_onnx(folder)
    assert paths == [folder / "onnx" / "model.onnx", folder / "onnx" / "model_qint8.onnx"]
    expected = SentenceTransformer(str(folder), device="cpu").encode(SENTENCES, convert_to_tensor=True)

    exact = onnx_embeddings(folder, paths[0], SENTENCES)
    torch.testing.assert_close(exact, expected, atol=1e-5, rtol=1e-5)

    # Dynamic int8 rounds each projection's weights and inputs to a step of their range, a small relative error per
    # token that the mean over the tokens averages further; the bound leaves room for other CPUs' int8 kernels and
    # lies well above the cosine between the embeddings of different sentences, so pooling the wrong tokens or a
    # wrong scale fails it.
    approximate = onnx_embeddings(folder, paths[1], SENTENCES)
    cosine = torch.nn.functional.cosine_similarity(approximate, expected, dim=-1)
    assert cosine.min() > 0.999 and not torch.equal(approximate, exact)  # close, and quantised
    nearest = (approximate @ expected.T).argmax(dim=1)
    assert torch.equal(nearest, torch.arange(len(SENTENCES)))  # every sentence is nearest to its own embedding


@needs_onnxruntime
def test_onnx_graph_without_normalize_or_int8_padded_on_the_left(saved_encoder, tmp_path):
    _, encoder = saved_encoder
    folder = tmp_path / "embedder"
    sentence_transformer(encoder).save(str(folder))
    assert export_embedder_onnx(folder, int8=False) == [folder / "onnx" / "model.onnx"]
    assert sorted(path.name for path in (folder / "onnx").iterdir()) == ["model.onnx"]
    expected = SentenceTransformer(str(folder), device="cpu").encode(SENTENCES, convert_to_tensor=True)
    embeddings = onnx_embeddings(folder, folder / "onnx" / "model.onnx", SENTENCES, padding_side="left")
    torch.testing.assert_close(embeddings, expected, atol=1e-5, rtol=1e-5)


def test_export_embedder_onnx_refuses_folders_it_cannot_export_by_name(saved_encoder, tokenizer, tmp_path):
    _, encoder = saved_encoder
    with pytest.raises(ValueError, match="does not exist"):
        export_embedder_onnx(tmp_path / "missing")
    with pytest.raises(ValueError, match=r"is not a sentence-transformers folder: it has no modules.json"):
        export_embedder_onnx(encoder)

    bert = tmp_path / "bert"
    BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64)).save_pretrained(bert)  # fmt: skip
    tokenizer.save_pretrained(bert)
    SentenceTransformer(modules=[Transformer(str(bert)), Pooling(32)], device="cpu").save(str(tmp_path / "bert-st"))
    with pytest.raises(ValueError, match=r"the module at its root is a 'bert' model, not an Orchid text model"):
        export_embedder_onnx(tmp_path / "bert-st")

    image = tmp_path / "image"
    sentence_transformer(encoder).save(str(image))
    OrchidModel(tiny_image_config()).save_pretrained(image)
    with pytest.raises(ValueError, match=r"an Orchid image model \(config.image_size is set\)"):
        export_embedder_onnx(image)

    pooling_only = tmp_path / "pooling-only"
    shutil.copytree(image, pooling_only)
    modules = json.loads((pooling_only / "modules.json").read_text())
    (pooling_only / "modules.json").write_text(json.dumps([m for m in modules if m["path"]]))
    with pytest.raises(ValueError, match="no module of its modules.json is saved at the folder's root"):
        export_embedder_onnx(pooling_only)
    assert not any((tmp_path / name / "onnx").exists() for name in ("bert-st", "image", "pooling-only"))
