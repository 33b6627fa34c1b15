"""Model cards for trained Orchid folders, rendered with ``huggingface_hub.ModelCard`` / ``ModelCardData``
from the template in ``model_cards/``: YAML metadata (model-index with the results, datasets, license,
pipeline tag) and usage snippets for both ways of loading the model. Text and image models alike."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from .extras import require_extra

TEMPLATE_NAME = "orchid_model_card.md"

# pipeline tag -> (Auto model class, preprocessing class, example input)
PIPELINES: dict[str, tuple[str, str, str]] = {
    "fill-mask": ("AutoModelForMaskedLM", "AutoTokenizer", '"the capital of france is [MASK] ."'),
    "text-classification": ("AutoModelForSequenceClassification", "AutoTokenizer", '"a gripping, funny film ."'),
    "token-classification": ("AutoModelForTokenClassification", "AutoTokenizer", '"anna flew from paris to rome ."'),
    "feature-extraction": ("AutoModel", "AutoTokenizer", '"an example sentence ."'),
    "image-classification": ("AutoModelForImageClassification", "AutoImageProcessor", '"image.png"'),
    # A sentence-transformers folder (orchid_hf.embeddings): its snippets use SentenceTransformer, not a pipeline.
    "sentence-similarity": ("SentenceTransformer", "AutoTokenizer", '["a cat sat on the mat .", "a dog ran ."]'),
}


def template_path() -> Path:
    """``model_cards/orchid_model_card.md``: packaged next to this module, or at the root of a source checkout."""
    here = Path(__file__).resolve().parent
    for folder in (here / "model_cards", here.parent / "model_cards"):
        if (folder / TEMPLATE_NAME).is_file():
            return folder / TEMPLATE_NAME
    raise FileNotFoundError(f"model card template {TEMPLATE_NAME} not found next to {__file__} or in the repository")


def usage_snippets(task: str, repo_id: str, example_input: str | None = None) -> tuple[str, str]:
    """Python snippets that run the model: with ``orchid_hf`` installed, and with remote code only."""
    if task not in PIPELINES:
        raise ValueError(f"task must be one of {sorted(PIPELINES)}, got {task!r}")
    model_class, processor_class, default_input = PIPELINES[task]
    example = example_input if example_input is not None else default_input
    if task == "sentence-similarity":
        return _sentence_transformer_snippets(repo_id, example)
    installed = (
        "import orchid_hf  # registers the Orchid model type with the Auto classes\n"
        "from transformers import pipeline\n\n"
        f'pipe = pipeline("{task}", model="{repo_id}")\n'
        f"print(pipe({example}))"
    )
    remote = (
        f"from transformers import {model_class}, {processor_class}, pipeline\n\n"
        f'model = {model_class}.from_pretrained("{repo_id}", trust_remote_code=True)\n'
        "# config.json names the remote code, so the preprocessing class needs trust_remote_code too.\n"
        f'processor = {processor_class}.from_pretrained("{repo_id}", trust_remote_code=True)\n'
        f'pipe = pipeline("{task}", model=model, '
        + ("image_processor=processor)\n" if processor_class == "AutoImageProcessor" else "tokenizer=processor)\n")
        + f"print(pipe({example}))"
    )
    return installed, remote


def _sentence_transformer_snippets(repo_id: str, sentences: str) -> tuple[str, str]:
    body = (
        f"embeddings = model.encode({sentences})\n"
        "print(model.similarity(embeddings, embeddings))"
    )
    installed = (
        "import orchid_hf  # registers the Orchid model type with the Auto classes\n"
        "from sentence_transformers import SentenceTransformer\n\n"
        f'model = SentenceTransformer("{repo_id}")\n' + body
    )
    remote = (
        "from sentence_transformers import SentenceTransformer\n\n"
        f'model = SentenceTransformer("{repo_id}", trust_remote_code=True)\n' + body
    )
    return installed, remote


def _embedding_settings(folder: Path) -> dict[str, object] | None:
    """Pooling, dimension and input length of a sentence-transformers folder; None for a transformers folder."""
    if not (folder / "modules.json").is_file():
        return None
    settings: dict[str, object] = {}
    for module in json.loads((folder / "modules.json").read_text()):
        config = folder / module.get("path", "") / "config.json"
        if module["type"].endswith("Pooling") and config.is_file():
            pooling = json.loads(config.read_text())
            settings["pooling"] = pooling.get("pooling_mode", pooling)
            settings["dimension"] = pooling.get("embedding_dimension")
        elif module["type"].endswith("Normalize"):
            settings["normalized"] = "yes (unit length)"
    # sentence-transformers keeps the input length as the tokenizer's model_max_length.
    tokenizer_config = folder / "tokenizer_config.json"
    if tokenizer_config.is_file():
        settings["max_seq_length"] = json.loads(tokenizer_config.read_text()).get("model_max_length")
    return settings


def _eval_result(result: EvalResult | Mapping, task: str) -> EvalResult:
    if isinstance(result, EvalResult):
        return result
    values = dict(result)
    values.setdefault("task_type", task)
    missing = [key for key in ("dataset_type", "dataset_name", "metric_type", "metric_value") if key not in values]
    if missing:
        raise ValueError(f"a result needs {missing}; got the keys {sorted(values)}")
    return EvalResult(**values)


def write_model_card(
    folder: str | Path,
    *,
    task: str,
    datasets: Iterable[str] | None = None,
    results: Iterable[EvalResult | Mapping] | None = None,
    base_model: str | None = None,
    model_name: str | None = None,
    repo_id: str | None = None,
    license: str = "apache-2.0",
    language: str | list[str] | None = None,
    tags: Iterable[str] | None = None,
    description: str | None = None,
    training: Mapping[str, object] | None = None,
    extra: str | None = None,
    example_input: str | None = None,
) -> ModelCard:
    """Render the card of the model in ``folder`` and write it to ``folder/README.md``.

    task: the pipeline tag (fill-mask, text-classification, token-classification, feature-extraction,
        image-classification, or sentence-similarity for a sentence-transformers folder, whose card gets an
        "Embeddings" section: pooling, dimension, input length); it selects the usage snippets.
    results: ``huggingface_hub.EvalResult`` objects or dicts of their fields (``task_type`` defaults to
        ``task``); they become the model-index and the results table.
    datasets: Hub dataset ids for the metadata (local data is better described in ``training``).
    training: settings shown as a table (optimizer, learning rate, steps, ...).
    repo_id: the Hub id used in the snippets (defaults to ``model_name``, then the folder name).
    """
    if task not in PIPELINES:
        raise ValueError(f"task must be one of {sorted(PIPELINES)}, got {task!r}")
    require_extra("jinja2", "train")  # ModelCard.from_template renders with it
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"model folder {folder} does not exist")
    model_name = model_name or folder.name
    repo_id = repo_id or model_name
    eval_results = [_eval_result(result, task) for result in (results or [])]
    embedding = _embedding_settings(folder) if task == "sentence-similarity" else None
    if task == "sentence-similarity" and embedding is None:
        raise ValueError(f"task 'sentence-similarity' needs a sentence-transformers folder (modules.json): {folder}")
    if embedding is not None:
        tags = ["sentence-transformers", "sentence-similarity", *(tags or [])]
    datasets = list(datasets or [])
    if language is None and task != "image-classification":
        language = "en"
    card_data = ModelCardData(
        model_name=model_name,
        base_model=base_model,
        datasets=datasets or None,
        eval_results=eval_results or None,
        language=language,
        library_name="sentence-transformers" if embedding is not None else "transformers",
        license=license,
        metrics=sorted({result.metric_type for result in eval_results}) or None,
        pipeline_tag=task,
        tags=list(dict.fromkeys(["orchid", "long-convolution", *(tags or [])])),
    )
    installed, remote = usage_snippets(task, repo_id, example_input)
    default_description = f"An Orchid model for {task.replace('-', ' ')}" + (
        f", fine-tuned from `{base_model}`." if base_model else "."
    )
    card = ModelCard.from_template(
        card_data,
        template_path=str(template_path()),
        model_name=model_name,
        description=description or default_description,
        usage_installed=installed,
        usage_remote=remote,
        datasets=datasets,
        training=dict(training or {}),
        results=eval_results,
        extra=extra,
        embedding=embedding,
    )
    card.save(folder / "README.md")
    return card


__all__ = ["PIPELINES", "template_path", "usage_snippets", "write_model_card"]
