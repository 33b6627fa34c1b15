"""transformers' own common model tests (``ModelTesterMixin``, ``ConfigTester``, ``TrainingTesterMixin``), from the
source distribution of the installed transformers version, run against every Orchid class, text and image.

The test files ship in transformers' source distribution, not in its wheel: ``make test`` fetches them with pip into
``.cache/transformers-tests`` (``make transformers-tests``; ``ORCHID_TRANSFORMERS_TESTS`` names another folder). The
distribution lacks three modules that ``test_modeling_common.py`` and ``test_configuration_common.py`` import; they
are stood in for here (see :func:`import_transformers_tests`). The testers follow transformers' BERT and ViT
testers, with ``has_attentions = False`` as transformers' attention-free models (Mamba, FNet) set it. What an
attention-free encoder does not have is skipped, each with its reason (``SKIPPED``).
"""

from __future__ import annotations

import importlib
import os
import sys
import types
import unittest
from pathlib import Path

import pytest
import torch
import transformers
from transformers.models.auto import modeling_auto

from orchid_hf import (
    OrchidConfig,
    OrchidForImageClassification,
    OrchidForMaskedLM,
    OrchidForMultipleChoice,
    OrchidForQuestionAnswering,
    OrchidForSequenceClassification,
    OrchidForTokenClassification,
    OrchidModel,
)

REPOSITORY = Path(__file__).resolve().parents[1]
TESTS_FOLDER = Path(os.environ.get("ORCHID_TRANSFORMERS_TESTS", REPOSITORY / ".cache" / "transformers-tests"))
PACKAGE = "transformers_common_tests"

# The common keyword arguments of every transformers config, with values other than their defaults, as transformers'
# tests/utils/test_configuration_utils.py (not in the source distribution) gives them to ConfigTester.
CONFIG_COMMON_KWARGS = {
    "return_dict": False,
    "output_hidden_states": True,
    "dtype": "float16",
    "chunk_size_feed_forward": 5,
    "architectures": ["OrchidForMaskedLM"],
    "finetuning_task": "translation",
    "id2label": {0: "label"},
    "label2id": {"label": "0"},
    "tokenizer_class": "BertTokenizerFast",
    "prefix": "prefix",
    "bos_token_id": 6,
    "pad_token_id": 7,
    "eos_token_id": 8,
    "sep_token_id": 9,
    "problem_type": "regression",
}


def import_transformers_tests():
    """``test_modeling_common``, ``test_configuration_common`` and ``test_training_mixin`` of the fetched source
    distribution, imported as the package ``transformers_common_tests``.

    Stood in for, as the distribution lacks them: ``exporters.test_export.ExportTesterMixin`` (the base class of
    ``ModelTesterMixin``) as an empty class, so its export tests do not run here (the ONNX and ``torch.export`` tests
    of this package are in tests/test_onnx.py); ``generation.test_utils.GenerationTesterMixin`` as an empty class
    (an encoder does not generate; ``ModelTesterMixin`` only checks that a tester without it has no generative
    model); ``utils.test_configuration_utils.config_common_kwargs`` as :data:`CONFIG_COMMON_KWARGS`."""
    tests = TESTS_FOLDER / "tests"
    version_file = TESTS_FOLDER / "VERSION"
    missing = None
    if not (tests / "__init__.py").is_file() or not version_file.is_file():
        missing = (
            f"transformers' common model tests are not in {TESTS_FOLDER}: `make transformers-tests` fetches them "
            "(pip download of the source distribution)"
        )
    elif (fetched := version_file.read_text().strip()) != transformers.__version__:
        missing = (
            f"{TESTS_FOLDER} holds the tests of transformers {fetched}, but {transformers.__version__} is installed: "
            "`make transformers-tests` fetches the installed version's"
        )
    if missing is not None:
        # `make test` fetches them first and sets ORCHID_REQUIRE_TRANSFORMERS_TESTS, so that there a missing copy is
        # a failure; a plain `pytest` on a fresh checkout skips this file with the command that fetches them.
        if os.environ.get("ORCHID_REQUIRE_TRANSFORMERS_TESTS"):
            raise RuntimeError(missing)
        pytest.skip(missing, allow_module_level=True)
    if PACKAGE not in sys.modules:
        package = types.ModuleType(PACKAGE)
        package.__path__ = [str(tests)]
        sys.modules[PACKAGE] = package
        stand_ins = {
            "exporters.test_export": {"ExportTesterMixin": type("ExportTesterMixin", (), {})},
            "generation.test_utils": {"GenerationTesterMixin": type("GenerationTesterMixin", (), {})},
            "utils.test_configuration_utils": {"config_common_kwargs": CONFIG_COMMON_KWARGS},
        }
        for name, attributes in stand_ins.items():
            parent = PACKAGE
            for part in name.split(".")[:-1]:
                parent = f"{parent}.{part}"
                sys.modules.setdefault(parent, types.ModuleType(parent)).__path__ = []
            module = types.ModuleType(f"{PACKAGE}.{name}")
            module.__dict__.update(attributes)
            sys.modules[module.__name__] = module
    return tuple(
        importlib.import_module(f"{PACKAGE}.{name}")
        for name in ("test_modeling_common", "test_configuration_common", "test_training_mixin")
    )


common, configuration_common, training_mixin = import_transformers_tests()
ids_tensor, floats_tensor, random_attention_mask = (
    common.ids_tensor, common.floats_tensor, common.random_attention_mask
)

# The Auto mappings by which the common tests tell a head's task (the inputs and labels each one gets): transformers'
# own models are listed there; a registered third-party model is not.
ORCHID_MAPPINGS = {
    "MODEL_MAPPING_NAMES": "OrchidModel",
    "MODEL_FOR_MASKED_LM_MAPPING_NAMES": "OrchidForMaskedLM",
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES": "OrchidForSequenceClassification",
    "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES": "OrchidForTokenClassification",
    "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES": "OrchidForQuestionAnswering",
    "MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES": "OrchidForMultipleChoice",
    "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES": "OrchidForImageClassification",
}


@pytest.fixture(autouse=True)
def transformers_default_verbosity():
    """transformers' tests read its warnings (the loading report): at the default verbosity, whatever an earlier test
    (a recipe run, which sets the level from its arguments) left."""
    from transformers.utils import logging

    verbosity = logging.get_verbosity()
    logging.set_verbosity_warning()
    yield
    logging.set_verbosity(verbosity)


@pytest.fixture(autouse=True, scope="module")
def orchid_in_the_auto_mappings():
    for name, class_name in ORCHID_MAPPINGS.items():
        getattr(modeling_auto, name)["orchid"] = class_name
    yield
    for name in ORCHID_MAPPINGS:
        getattr(modeling_auto, name).pop("orchid", None)


def skipped(reason: str):
    def test(self):
        self.skipTest(reason)

    return test


NO_ATTENTION = "Orchid has no attention: nothing to dispatch to SDPA, flash or flex attention kernels"
# What an attention-free encoder does not have, by test name pattern of ModelTesterMixin.
SKIPPED = {
    "test_sdpa": NO_ATTENTION,
    "test_eager_matches_sdpa": NO_ATTENTION,
    "test_flash_attn": NO_ATTENTION,
    "test_flex_attention": NO_ATTENTION,
    "test_attn_implementation": NO_ATTENTION,
    "test_can_set_attention_dynamically": NO_ATTENTION,
    "test_can_use_device_map": "accelerate's device maps need a GPU here",
}


def skip_what_orchid_does_not_have(cls):
    for name in dir(cls):
        for pattern, reason in SKIPPED.items():
            if name.startswith(pattern):
                setattr(cls, name, skipped(reason))
    return cls


class OrchidTextModelTester:
    """A tiny text config and its inputs, as transformers' BertModelTester builds them."""

    def __init__(
        self,
        parent,
        batch_size=13,
        seq_length=7,
        is_training=True,
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        max_position_embeddings=64,
        type_vocab_size=2,
        type_sequence_label_size=2,
        num_labels=3,
        num_choices=4,
    ):
        self.parent = parent
        self.batch_size = batch_size
        self.seq_length = seq_length
        self.is_training = is_training
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.intermediate_size = intermediate_size
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        self.type_sequence_label_size = type_sequence_label_size
        self.num_labels = num_labels
        self.num_choices = num_choices
        # The model TrainingTesterMixin's overfitting test trains: it takes its "causal LM" (then its sequence
        # classifier) and labels every position with its own token; the masked-LM head learns exactly that.
        self.causal_lm_class = OrchidForMaskedLM

    def get_config(self) -> OrchidConfig:
        return OrchidConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            intermediate_size=self.intermediate_size,
            max_position_embeddings=self.max_position_embeddings,
            type_vocab_size=self.type_vocab_size,
            filter_width=16,
            hidden_dropout_prob=0.1,
            num_labels=self.num_labels,
        )

    def prepare_config_and_inputs(self):
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        input_mask = random_attention_mask([self.batch_size, self.seq_length])
        token_type_ids = ids_tensor([self.batch_size, self.seq_length], self.type_vocab_size)
        return self.get_config(), input_ids, token_type_ids, input_mask

    def prepare_config_and_inputs_for_common(self):
        config, input_ids, token_type_ids, input_mask = self.prepare_config_and_inputs()
        return config, {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": input_mask}


class OrchidImageModelTester:
    """A tiny image config and its inputs, as transformers' ViTModelTester builds them."""

    def __init__(self, parent, batch_size=13, image_size=8, patch_size=2, num_channels=3, is_training=True,
                 hidden_size=32, num_hidden_layers=2, intermediate_size=64, type_sequence_label_size=10):
        self.parent = parent
        self.batch_size = batch_size
        self.image_size = image_size
        self.patch_size = patch_size
        self.num_channels = num_channels
        self.is_training = is_training
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.intermediate_size = intermediate_size
        self.type_sequence_label_size = type_sequence_label_size
        self.seq_length = (image_size // patch_size) ** 2

    preset = "orchid-vit-cifar-s"

    def get_config(self) -> OrchidConfig:
        return OrchidConfig.from_preset(
            self.preset,
            image_size=self.image_size,
            patch_size=self.patch_size,
            num_channels=self.num_channels,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            intermediate_size=self.intermediate_size,
            filter_width=16,
            num_labels=self.type_sequence_label_size,
        )

    def prepare_config_and_inputs_for_common(self):
        pixel_values = floats_tensor([self.batch_size, self.num_channels, self.image_size, self.image_size])
        return self.get_config(), {"pixel_values": pixel_values}


@skip_what_orchid_does_not_have
class OrchidTextModelTest(common.ModelTesterMixin, training_mixin.TrainingTesterMixin, unittest.TestCase):
    all_model_classes = (
        OrchidModel,
        OrchidForMaskedLM,
        OrchidForSequenceClassification,
        OrchidForTokenClassification,
        OrchidForQuestionAnswering,
        OrchidForMultipleChoice,
    )
    has_attentions = False

    def setUp(self):
        self._model_tester = OrchidTextModelTester(self)
        self.config_tester = configuration_common.ConfigTester(
            self, config_class=OrchidConfig, hidden_size=36, common_properties=["hidden_size", "num_hidden_layers"]
        )

    @property
    def model_tester(self):
        return self._model_tester

    @model_tester.setter
    def model_tester(self, value):
        self._model_tester = value

    def test_config(self):
        self.config_tester.run_common_tests()


@skip_what_orchid_does_not_have
class OrchidImageModelTest(common.ModelTesterMixin, unittest.TestCase):
    """The image models. TrainingTesterMixin is not run on them: its overfitting test builds text batches only (it
    raises "Modality image not supported yet")."""

    all_model_classes = (OrchidModel, OrchidForImageClassification)
    has_attentions = False
    test_resize_embeddings = False  # image models have no token embeddings to resize

    def setUp(self):
        self.model_tester = OrchidImageModelTester(self)
        self.config_tester = configuration_common.ConfigTester(
            self, config_class=OrchidConfig, has_text_modality=False, hidden_size=36, image_size=8, patch_size=2,
            common_properties=["hidden_size", "num_hidden_layers"],
        )

    def test_config(self):
        self.config_tester.run_common_tests()

    # As transformers' ViT tests have it: an image model takes pixel_values, and its input embeddings are the patch
    # projection.
    test_inputs_embeds = skipped("image models take pixel_values, not inputs_embeds (as transformers' ViT)")
    test_inputs_embeds_matches_input_ids = skipped(
        "image models take pixel_values, not input_ids or inputs_embeds (as transformers' ViT)"
    )

    def test_model_get_set_embeddings(self):
        config, _ = self.model_tester.prepare_config_and_inputs_for_common()
        for model_class in self.all_model_classes:
            model = model_class(config)
            self.assertIsInstance(model.get_input_embeddings(), torch.nn.Conv2d)
            self.assertIsNone(model.get_output_embeddings())


class OrchidImage2dModelTester(OrchidImageModelTester):
    """The image tester's sizes with the 2-D hybrid: a 2-D Orchid layer over the 4 x 4 grid, then ViT's attention."""

    preset = "orchid-vit-2d-hybrid-s"


@skip_what_orchid_does_not_have
class OrchidImage2dModelTest(OrchidImageModelTest):
    """The image models with ``image_mixer="2d"`` and a hybrid stack (``layer_types="orchid-first"``)."""

    def setUp(self):
        self.model_tester = OrchidImage2dModelTester(self)
        self.config_tester = configuration_common.ConfigTester(
            self, config_class=OrchidConfig, has_text_modality=False, hidden_size=36, image_size=8, patch_size=2,
            # A config stores layer_types as a list, one entry per layer (a short form such as "orchid-first" is
            # expanded when the config is built), so the tester, which reads back what it passed, passes the list.
            image_mixer="2d", num_hidden_layers=2, layer_types=["orchid", "full_attention"],
            common_properties=["hidden_size", "num_hidden_layers"],
        )
