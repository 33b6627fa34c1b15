"""BERT's sequence classifier with the pooling choice of Orchid's, for the real-data comparison's grid.

``OrchidForSequenceClassification`` pools the first token or the mean of the real tokens (``classifier_pooling``);
``BertForSequenceClassification`` reads its ``[CLS]`` token only. So that both architectures are chosen over the same
poolings, :func:`register_bert_pooling` makes the Auto classes build BERT configs that carry ``classifier_pooling``
(default ``"first"``, BERT's own) and BERT classifiers that read the mean of the real tokens where it says ``"mean"``
(through the transfer diagnosis's :func:`~experiments.transfer.models.pool_the_mean`: the same dense + tanh pooler,
fed the mean instead of the first token). ``scripts/finetune_glue.py``'s ``--pooling`` then sets BERT's pooling as it
sets Orchid's, and the run's results record it; so does the recipe's default where ``--pooling`` is not given (the
mean, for own data), which is why the grid always passes it. ``scripts/real_data_finetune.py`` is that script with
the registration made.

The model type stays ``bert``: plain transformers reads a folder saved by such a run as a classifier of its
``[CLS]`` token, whatever its ``classifier_pooling``; only a process that made the registration reads it as trained.
The grid's folders are kept for their results, not reused.
"""

from __future__ import annotations

from transformers import AutoConfig, AutoModelForSequenceClassification, BertConfig, BertForSequenceClassification

from experiments.transfer.models import POOLINGS, pool_the_mean


class PoolingBertConfig(BertConfig):
    """``BertConfig`` with ``classifier_pooling`` (``"first"`` or ``"mean"``), as ``OrchidConfig`` has it."""

    def __init__(self, classifier_pooling: str = "first", **kwargs):
        super().__init__(**kwargs)
        self.classifier_pooling = classifier_pooling


class PoolingBertForSequenceClassification(BertForSequenceClassification):
    """``BertForSequenceClassification`` whose pooler reads the mean of the real tokens when the config's
    ``classifier_pooling`` is ``"mean"``, and the ``[CLS]`` token when it is ``"first"``."""

    config_class = PoolingBertConfig

    def __init__(self, config: PoolingBertConfig):
        if config.classifier_pooling not in POOLINGS:
            raise ValueError(f"classifier_pooling must be one of {POOLINGS}, got {config.classifier_pooling!r}")
        super().__init__(config)
        if config.classifier_pooling == "mean":
            pool_the_mean(self)


def register_bert_pooling() -> None:
    """Make ``AutoConfig`` read model type ``bert`` as :class:`PoolingBertConfig` and
    ``AutoModelForSequenceClassification`` build :class:`PoolingBertForSequenceClassification` for it, in this
    process."""
    AutoConfig.register("bert", PoolingBertConfig, exist_ok=True)
    AutoModelForSequenceClassification.register(PoolingBertConfig, PoolingBertForSequenceClassification,
                                                exist_ok=True)  # fmt: skip
