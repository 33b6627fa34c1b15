"""Orchid-HF: Orchid encoders (data-dependent global convolution) for Hugging Face transformers.

``import orchid_hf`` registers the model type ``"orchid"`` with the Auto classes.
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForImageClassification,
    AutoModelForMaskedLM,
    AutoModelForMultipleChoice,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from .inference import optimize_for_inference
from .modeling import (
    PRESETS,
    BlockDiagonalLinear,
    OrchidConfig,
    OrchidForImageClassification,
    OrchidForMaskedLM,
    OrchidForMultipleChoice,
    OrchidForQuestionAnswering,
    OrchidForSequenceClassification,
    OrchidForTokenClassification,
    OrchidModel,
    OrchidOperator,
    OrchidOperator2d,
    OrchidPreTrainedModel,
)

__version__ = "0.1.0"

AutoConfig.register("orchid", OrchidConfig, exist_ok=True)
AutoModel.register(OrchidConfig, OrchidModel, exist_ok=True)
AutoModelForMaskedLM.register(OrchidConfig, OrchidForMaskedLM, exist_ok=True)
AutoModelForSequenceClassification.register(OrchidConfig, OrchidForSequenceClassification, exist_ok=True)
AutoModelForTokenClassification.register(OrchidConfig, OrchidForTokenClassification, exist_ok=True)
AutoModelForImageClassification.register(OrchidConfig, OrchidForImageClassification, exist_ok=True)
AutoModelForQuestionAnswering.register(OrchidConfig, OrchidForQuestionAnswering, exist_ok=True)
AutoModelForMultipleChoice.register(OrchidConfig, OrchidForMultipleChoice, exist_ok=True)

__all__ = [
    "PRESETS",
    "BlockDiagonalLinear",
    "OrchidConfig",
    "OrchidForImageClassification",
    "OrchidForMaskedLM",
    "OrchidForMultipleChoice",
    "OrchidForQuestionAnswering",
    "OrchidForSequenceClassification",
    "OrchidForTokenClassification",
    "OrchidModel",
    "OrchidOperator",
    "OrchidOperator2d",
    "OrchidPreTrainedModel",
    "__version__",
    "optimize_for_inference",
]
