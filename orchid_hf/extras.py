"""Optional dependencies. The package core (the model) needs torch, transformers, safetensors, huggingface_hub and
scipy; the recipes, metrics, image pipeline and plots need more, grouped into extras:

| extra | what for | packages |
|---|---|---|
| ``train`` | the MLM and GLUE recipes, metrics, model cards | datasets, evaluate, accelerate, jinja2 |
| ``vision`` | the image-classification recipe | ``train``, ``plot``, Pillow, scikit-learn |
| ``plot`` | figures (confusion matrices, benchmark and recall plots) | matplotlib |
| ``embeddings`` | sentence embeddings (``orchid_hf.embeddings``) | sentence-transformers |
| ``onnx`` | ONNX export and ONNX Runtime (``orchid_hf.onnx``) | onnx, onnxscript, onnxruntime |
| ``dev`` | the test suite and linting | all of the above, pytest, ruff, peft |

:func:`require_extra` imports a module of one of them, or says which extra to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType

EXTRAS = ("train", "vision", "plot", "embeddings", "onnx", "dev")


def require_extra(module: str, extra: str) -> ModuleType:
    """Import ``module``; where it is missing, raise ImportError naming the extra that installs it.

    >>> require_extra("matplotlib.pyplot", "plot")  # doctest: +SKIP
    """
    if extra not in EXTRAS:
        raise ValueError(f"extra must be one of {EXTRAS}, got {extra!r}")
    try:
        return importlib.import_module(module)
    except ImportError as error:
        package = module.split(".")[0]
        raise ImportError(
            f"{package} is needed here but is not installed: pip install \"orchid-hf[{extra}]\" ({error})"
        ) from error


__all__ = ["EXTRAS", "require_extra"]
