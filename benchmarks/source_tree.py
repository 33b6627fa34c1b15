"""Importing ``orchid_hf`` from the source tree, for machines where the package is not installed (a GPU machine that
receives a copy of the working tree, say).

The installed package's layout is not the tree's: pyproject.toml's ``package-dir`` maps ``orchid_hf.modeling`` to the
folder ``modeling/`` (and ``orchid_hf.model_cards`` to ``model_cards/``), which sit beside ``orchid_hf/``, not inside
it. Putting the repository root on ``sys.path`` therefore finds ``orchid_hf`` but not ``orchid_hf.modeling``.
:func:`import_orchid_hf` reads that mapping from pyproject.toml and installs an import finder that follows it, as the
installed package's files would.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import re
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def package_dirs(pyproject: Path) -> dict[str, Path]:
    """pyproject.toml's ``[tool.setuptools] package-dir`` table: package name -> folder (absolute). Read with a regular
    expression, since ``tomllib`` needs Python 3.11; the table is one line of ``"name" = "folder"`` pairs."""
    text = pyproject.read_text()
    table = re.search(r"^package-dir\s*=\s*\{(.*)\}\s*$", text, re.MULTILINE)
    if table is None:
        raise ValueError(f"{pyproject} has no one-line package-dir table under [tool.setuptools]")
    pairs = re.findall(r'"([\w.]+)"\s*=\s*"([^"]+)"', table.group(1))
    return {name: (pyproject.parent / folder).resolve() for name, folder in pairs}


class SourceTreeFinder(importlib.abc.MetaPathFinder):
    """Finds the packages named in ``package-dir`` in their folders. Their modules and subpackages are then found by
    Python's own machinery through each package's ``__path__`` (the folder)."""

    def __init__(self, folders: dict[str, Path]):
        self.folders = folders

    def find_spec(self, name, path=None, target=None):
        folder = self.folders.get(name)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(
            name, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )


def import_orchid_hf(root: Path = REPO_ROOT) -> str:
    """Import ``orchid_hf``: the installed package where there is one, else the source tree under ``root``. Returns
    where it came from: ``"installed"`` or ``"source tree"``."""
    try:
        importlib.import_module("orchid_hf")
        return "installed"
    except ModuleNotFoundError as error:
        if error.name != "orchid_hf":  # the package is there but one of its dependencies is not
            raise
    for name in [name for name in sys.modules if name == "orchid_hf" or name.startswith("orchid_hf.")]:
        del sys.modules[name]  # a half-imported attempt
    sys.meta_path.insert(0, SourceTreeFinder(package_dirs(root / "pyproject.toml")))
    importlib.import_module("orchid_hf")
    return "source tree"
