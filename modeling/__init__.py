"""The Orchid model code. Its files import each other only relatively, so the folder ships to the Hub as
remote code; installed, it is ``orchid_hf.modeling``."""

from .configuration_orchid import PRESETS, OrchidConfig
from .modeling_orchid import (
    OrchidForImageClassification,
    OrchidForMaskedLM,
    OrchidForMultipleChoice,
    OrchidForQuestionAnswering,
    OrchidForSequenceClassification,
    OrchidForTokenClassification,
    OrchidModel,
    OrchidPreTrainedModel,
)
from .orchid_layers import BlockDiagonalLinear, OperatorSettings, OrchidOperator, OrchidOperator2d
from .orchid_ops import dct, idct, long_convolution

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
    "OperatorSettings",
    "OrchidOperator",
    "OrchidOperator2d",
    "OrchidPreTrainedModel",
    "dct",
    "idct",
    "long_convolution",
]
