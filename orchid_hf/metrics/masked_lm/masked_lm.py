"""Masked-language-model metrics: masked-token accuracy and perplexity, from the scored tokens of an evaluation.

    import evaluate
    masked_lm = evaluate.load("path/to/orchid_hf/metrics/masked_lm")   # or orchid_hf.metrics.load_metric("masked_lm")
    masked_lm.compute(predictions=[5, 7, 9], references=[5, 8, -100], losses=[0.1, 2.3, 0.0])
    # {'masked_accuracy': 0.5, 'perplexity': 3.32, 'masked_tokens': 2}

One entry per token: the arg-max prediction, the reference token id (-100 where the token was not masked and is not
scored, the labels DataCollatorForLanguageModeling writes) and the model's cross-entropy for the reference token.
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = """Masked-token accuracy (the share of scored tokens whose arg-max prediction is the original token) and
perplexity (exp of the mean cross-entropy over the scored tokens), as in BERT-style pretraining."""

_KWARGS_DESCRIPTION = """
Args:
    predictions: arg-max token ids, one per token.
    references: original token ids of the scored (masked) tokens, -100 for the others.
    losses: cross-entropy of the reference token, one per token (any value where the reference is -100).
    ignore_index (int, default -100): the reference value of tokens that are not scored.
Returns:
    "masked_accuracy": float; "perplexity": float; "masked_tokens": the number of scored tokens.
Example:
    >>> masked_lm = evaluate.load("orchid_hf/metrics/masked_lm")
    >>> masked_lm.compute(predictions=[1, 2], references=[1, -100], losses=[0.0, 9.0])
    {'masked_accuracy': 1.0, 'perplexity': 1.0, 'masked_tokens': 1}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class MaskedLM(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "predictions": datasets.Value("int64"),
                    "references": datasets.Value("int64"),
                    "losses": datasets.Value("float64"),
                }
            ),
            format="numpy",
        )

    def _compute(self, predictions, references, losses, ignore_index=-100):
        predictions, references = np.asarray(predictions), np.asarray(references)
        scored = references != ignore_index
        count = int(scored.sum())
        if count == 0:
            return {"masked_accuracy": float("nan"), "perplexity": float("nan"), "masked_tokens": 0}
        mean_loss = float(np.asarray(losses, dtype=np.float64)[scored].mean())
        return {
            "masked_accuracy": float((predictions[scored] == references[scored]).mean()),
            "perplexity": float(np.exp(mean_loss)) if mean_loss < 709 else float("inf"),
            "masked_tokens": count,
        }
