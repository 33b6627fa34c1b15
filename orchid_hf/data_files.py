"""Local data files of the text recipes (csv, tsv, json lines, json, parquet, text), read with errors that name the
file, where in it, and what is wrong.

Where in a file: ``line N`` is the line of the file as an editor numbers it (1-based, the header is line 1 of a
csv/tsv file, a quoted cell that spans lines counts them all, blank lines count). Formats without lines (parquet, a
JSON document holding a list) give ``row N``: the N-th record, 1-based.

Cells: a missing label is an error (no example can be trained on, or scored, without one). A missing or empty text
cell is an input like any other, as in transformers' ``run_glue.py``: the example is the empty sentence, ``[CLS]
[SEP]``. CSV readers turn an empty cell into a missing value; it becomes ``""`` and a warning names the first one. A
text column empty in every row is the wrong column, an error.
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

# File suffix -> datasets builder.
DATA_BUILDERS = {
    ".csv": "csv",
    ".tsv": "csv",
    ".json": "json",
    ".jsonl": "json",
    ".parquet": "parquet",
    ".txt": "text",
    ".text": "text",
}
# GLUE's TSV files are read without quote handling: they contain unbalanced quotes that are part of the text.
TSV_OPTIONS = {"delimiter": "\t", "quoting": csv.QUOTE_NONE}
CHUNK_BYTES = 1 << 20


class DataFile:
    """One local file of a split: its path, its role in the run (``train``, ``validation``, ``test``) and its
    rows, with :meth:`where` telling where row ``index`` of the loaded dataset is in the file."""

    def __init__(self, path: str | Path, role: str):
        self.path = Path(path)
        self.role = role
        self.builder = DATA_BUILDERS.get(self.path.suffix.lower())
        self._lines: list[int] | None = None

    def __str__(self) -> str:
        return f"{self.role} file {self.path}"

    @property
    def options(self) -> dict:
        return dict(TSV_OPTIONS) if self.path.suffix.lower() == ".tsv" else {}

    def where(self, index: int, num_rows: int) -> str:
        """``"<role> file <path>, line N"`` (or ``row N`` where the file has no lines to count) of row ``index``."""
        if self._lines is None:
            self._lines = self._row_lines()
        if len(self._lines) == num_rows:
            return f"{self}, line {self._lines[index]}"
        return f"{self}, row {index + 1}"

    def _row_lines(self) -> list[int]:
        """The line each data row starts on, as the csv/json/text readers count rows (empty where unknown)."""
        if self.builder == "text":
            with self.path.open(encoding="utf-8", newline="") as stream:
                return list(range(1, sum(1 for _ in stream) + 1))
        if self.builder == "json":
            with self.path.open(encoding="utf-8") as stream:
                lines = [number for number, line in enumerate(stream, 1) if line.strip()]
            return [] if _is_json_document(self.path) else lines
        if self.builder != "csv":
            return []
        starts, end = [], 0
        with self.path.open(encoding="utf-8", newline="") as stream:
            options = self.options
            reader = csv.reader(stream, delimiter=options.get("delimiter", ","), quoting=options.get("quoting", 0))
            for record in reader:
                if record:  # a blank line is no row (pandas' skip_blank_lines)
                    starts.append(end + 1)
                end = reader.line_num
        return starts[1:]  # the first record is the header


def _is_json_document(path: Path) -> bool:
    with path.open(encoding="utf-8") as stream:
        head = stream.read(CHUNK_BYTES).lstrip()
    return head.startswith("[")


def _blank_lines(path: Path) -> int | None:
    """The number of lines of a file holding only whitespace; None as soon as a byte of text is found."""
    lines = 0
    with path.open("rb") as stream:
        while chunk := stream.read(CHUNK_BYTES):
            if chunk.strip():
                return None
            lines += chunk.count(b"\n")
    return lines


def _first_bad_json_line(path: Path) -> str | None:
    with path.open(encoding="utf-8") as stream:
        for number, line in enumerate(stream, 1):
            if line.strip():
                try:
                    json.loads(line)
                except json.JSONDecodeError as error:
                    return f"line {number}: not valid JSON ({error.msg}, column {error.colno})"
    return None


def read_data_file(data_file: DataFile, cache_dir: str | None = None, suffixes: Sequence[str] | None = None):
    """The rows of one file as a ``datasets.Dataset``; ValueError naming the file for a missing, empty or
    unreadable one, or one with a header and no rows."""
    from datasets import load_dataset
    from datasets.exceptions import DatasetGenerationError

    path = data_file.path
    suffixes = tuple(suffixes or DATA_BUILDERS)
    if path.suffix.lower() not in suffixes:
        raise ValueError(f"{data_file}: the file type {path.suffix!r} is not one of {', '.join(suffixes)}")
    if not path.is_file():
        raise ValueError(f"{data_file} does not exist")
    if path.stat().st_size == 0:
        raise ValueError(f"{data_file} is empty")
    blank = _blank_lines(path)
    if blank is not None:
        raise ValueError(f"{data_file} holds no text: its {blank} lines are blank")
    try:
        dataset = load_dataset(
            data_file.builder, data_files=str(path), split="train", cache_dir=cache_dir, **data_file.options
        )
    except (DatasetGenerationError, ValueError) as error:
        if "corresponds to no data" in str(error) and data_file.builder == "csv":
            raise ValueError(f"{data_file} has a header but no rows") from None
        bad_line = _first_bad_json_line(path) if data_file.builder == "json" else None
        cause = bad_line or str(error.__cause__ or error)
        raise ValueError(f"{data_file} cannot be read as {data_file.builder}: {cause}") from error
    if len(dataset) == 0:
        raise ValueError(f"{data_file} has no rows")
    return dataset


# ---------------------------------------------------------------------------------------------
# Cells
# ---------------------------------------------------------------------------------------------


def _first(mask) -> int:
    import pyarrow.compute as pc

    return int(pc.index(mask, True).as_py())


def _empty_text(column):
    """True where a text cell is missing or holds only whitespace."""
    import pyarrow.compute as pc

    blank = pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(column)), 0)
    return pc.fill_null(pc.or_kleene(pc.is_null(column), blank), True)


def require_columns(dataset, source: DataFile | str, names: Sequence[str], what: str = "column") -> None:
    missing = [name for name in names if name not in dataset.column_names]
    if missing:
        raise ValueError(f"{source} has no {what} {missing[0]!r} (columns {dataset.column_names})")


# The JSON types of the values of a column, by Python type as json.loads gives them.
JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "list", dict: "object"}


def _json_values(data_file: DataFile, column: str):
    """(where, value) of each record of a JSON or JSON-lines file that holds ``column``: ``line N``, or ``row N`` in
    a JSON document holding a list."""
    if _is_json_document(data_file.path):
        records = json.loads(data_file.path.read_text(encoding="utf-8"))
        numbered = ((f"row {number}", record) for number, record in enumerate(records, 1))
    else:
        with data_file.path.open(encoding="utf-8") as stream:
            lines = [(number, line) for number, line in enumerate(stream, 1) if line.strip()]
        numbered = ((f"line {number}", json.loads(line)) for number, line in lines)
    for where, record in numbered:
        if isinstance(record, dict) and record.get(column) is not None:
            yield where, record[column]


def check_column_type(dataset, source: DataFile | str, column: str, what: str) -> None:
    """ValueError for a column that does not hold one value per row: lists or records in every row, or JSON values
    of several types (``1`` and ``"1"``, text and numbers, lists), which ``datasets`` reads as a ``Json`` column,
    where the error names each type found and where it first occurs."""
    from datasets.features import ClassLabel, Json, Value

    feature = dataset.features[column]
    if isinstance(feature, (Value, ClassLabel)):
        return
    if not isinstance(feature, Json):
        raise ValueError(f"{source}: the {what} column {column!r} holds {feature} values, not one {what} per row")
    first: dict[str, str] = {}
    if isinstance(source, DataFile) and source.builder == "json":
        for where, value in _json_values(source, column):
            first.setdefault(JSON_TYPES.get(type(value), type(value).__name__), where)
    if not first:  # not a file of records, or a dataset from elsewhere: the values as datasets decodes them
        for index, value in enumerate(dataset[column]):
            if value is not None:
                where = locate(source, index, len(dataset)).rpartition(", ")[2]
                first.setdefault(JSON_TYPES.get(type(value), type(value).__name__), where)
    found = ", ".join(f"{name} ({where})" for name, where in first.items())
    hint = "numbers or all strings" if what == "label" else "strings"
    raise ValueError(f"{source}: the {what} column {column!r} mixes JSON types: {found}; make them all {hint}")


def check_text_columns(dataset, source: DataFile | str, columns: Sequence[str]) -> int:
    """ValueError for a text column that holds no text (numbers, values of mixed types, or every cell empty);
    returns the number of empty cells."""
    import pyarrow as pa

    table = _table(dataset)
    empty_cells = 0
    for name in columns:
        check_column_type(dataset, source, name, "text")
        column = table.column(name)
        is_text = pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
        if not is_text and column.null_count < len(column):
            raise ValueError(
                f"{source}: the text column {name!r} holds {dataset.features[name].dtype} values, not text; name the "
                "text column(s) with --text_column_names (fine-tuning) or --text_column_name (pretraining)"
            )
        count = int(_empty_text(column).to_numpy(zero_copy_only=False).sum()) if is_text else len(column)
        if count == len(column):
            raise ValueError(f"{source}: the text column {name!r} is empty in all {count} rows")
        empty_cells += count
    return empty_cells


def fill_empty_text(dataset, source: DataFile | str, columns: Sequence[str]):
    """``dataset`` with its missing text cells as ``""`` (the empty sentence), after :func:`check_text_columns`; a
    warning names the first empty cell."""
    if not check_text_columns(dataset, source, columns):
        return dataset
    table = _table(dataset)
    counts = {name: int(_empty_text(table.column(name)).to_numpy(zero_copy_only=False).sum()) for name in columns}
    first = min((_first(_empty_text(table.column(name))), name) for name in columns if counts[name])
    where = locate(source, first[0], len(dataset)).rpartition(", ")[2]
    logger.warning(
        "%s: %d empty text cells (first: %s, %r); each is classified as the empty sentence",
        source, sum(counts.values()), where, first[1],
    )  # fmt: skip
    missing = [name for name in columns if table.column(name).null_count]
    if not missing:
        return dataset
    return dataset.map(
        lambda batch: {name: [value or "" for value in batch[name]] for name in missing},
        batched=True,
        desc="empty text cells",
    )


def _table(dataset):
    return dataset.data.table if hasattr(dataset.data, "table") else dataset.data


def check_labels_present(dataset, source: DataFile | str, label: str) -> None:
    """ValueError naming the first row whose label cell is missing."""
    import pyarrow.compute as pc

    column = _table(dataset).column(label)
    if column.null_count:
        raise ValueError(
            f"{locate(source, _first(pc.is_null(column)), len(dataset))}: the label cell ({label!r}) is empty; every "
            "training and validation row needs a label"
        )


def locate(source: DataFile | str, index: int, num_rows: int) -> str:
    """Where row ``index`` is: a file's line (:meth:`DataFile.where`), or ``row N`` (1-based) of other data."""
    return source.where(index, num_rows) if isinstance(source, DataFile) else f"{source}, row {index + 1}"


__all__ = [
    "DATA_BUILDERS",
    "DataFile",
    "check_column_type",
    "check_labels_present",
    "check_text_columns",
    "fill_empty_text",
    "locate",
    "read_data_file",
    "require_columns",
]
