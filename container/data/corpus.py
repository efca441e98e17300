"""The documents a data set is packed from, as one stream of strings (never a whole corpus in
memory): text files (one document each), JSON Lines and Parquet records (the `text_field` of
each), or a `datasets` dataset (a Hub id, a local directory `load_dataset` reads, or a
`save_to_disk` directory).

Everything that can be checked before reading is checked when the stream is opened (paths,
Parquet schemas, the first record of every JSON Lines file, a dataset's columns), so a bad input
fails before any output is written; a bad record found later raises PackError naming the
file and line (or dataset row).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from itertools import chain
from pathlib import Path

from launcher.wire.datafiles import open_text

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py")
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz")
# Many .json files are one JSON document, not JSON Lines: read as records only when named.
NAMED_JSONL_SUFFIXES = JSONL_SUFFIXES + (".json", ".json.gz")
PARQUET_SUFFIX = ".parquet"


class PackError(Exception):
    """A bad input, option or output: reported as one line (what, the value, the fix), exit 2."""


def _kind(path: Path, named: bool) -> str | None:
    """How a file is read: 'jsonl', 'parquet' or 'text'; None for a file a directory skips.
    A file named on the command line with an unknown suffix is text (as it always was)."""
    if path.name.endswith(NAMED_JSONL_SUFFIXES if named else JSONL_SUFFIXES):
        return "jsonl"
    if path.name.endswith(PARQUET_SUFFIX):
        return "parquet"
    return "text" if named or path.suffix in TEXT_SUFFIXES else None


def _files(inputs: Sequence[str]) -> list[tuple[str, Path]]:
    files: list[tuple[str, Path]] = []
    for name in inputs:
        path = Path(name)
        if path.is_dir():
            found = [(kind, f) for f in sorted(path.rglob("*"))
                     if f.is_file() and (kind := _kind(f, named=False))]
            if not found:
                raise PackError(f"--input {name}: no {'/'.join(TEXT_SUFFIXES + JSONL_SUFFIXES)}/"
                                f"{PARQUET_SUFFIX} files in the directory; name the files to read")
            files.extend(found)
        elif path.is_file():
            files.append((_kind(path, named=True), path))
        else:
            raise PackError(f"--input {name}: no such file or directory")
    return files


def text_of(record: object, field: str, where: str) -> str:
    """The record's text, or PackError naming the record, the field and the fields it has."""
    if not isinstance(record, dict):
        raise PackError(f"{where}: expected an object with a {field!r} field, "
                        f"found {type(record).__name__}")
    if field not in record:
        has = ", ".join(map(repr, record)) or "none"
        raise PackError(f"{where}: no field {field!r} (this record's fields: {has}); "
                        f"name the text field with --text-field")
    value = record[field]
    if not isinstance(value, str):
        raise PackError(f"{where}: field {field!r} is {type(value).__name__}, not a string; "
                        f"name the text field with --text-field")
    return value


def _jsonl_records(path: Path) -> Iterator[tuple[str, object, int]]:
    """(where, record, the line's length in characters) of each record."""
    try:
        with open_text(path) as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        yield f"{path}:{lineno}", json.loads(line), len(line)
                    except json.JSONDecodeError as e:
                        raise PackError(f"{path}:{lineno}: not JSON ({e.msg}); a JSON Lines file "
                                        f"holds one JSON object per line") from None
    except (OSError, UnicodeDecodeError) as e:  # a corrupt .gz, a binary file
        raise PackError(f"{path}: cannot read it as UTF-8 JSON Lines ({e})") from None


def _check_jsonl(path: Path, field: str) -> None:
    for where, record, _ in _jsonl_records(path):
        text_of(record, field, where)
        return


def _check_parquet(path: Path, field: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as e:
        raise PackError(f"{path}: not a readable Parquet file ({e})") from None
    if field not in schema.names:
        raise PackError(f"{path}: no column {field!r} (its columns: {', '.join(map(repr, schema.names))}); "
                        f"name the text column with --text-field")
    kind = schema.field(field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise PackError(f"{path}: column {field!r} holds {kind}, not strings; "
                        f"name the text column with --text-field")


def _parquet_texts(path: Path, field: str) -> Iterator[str]:
    import pyarrow.parquet as pq

    row = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024, columns=[field]):
        for value in batch.column(0).to_pylist():
            if value is None:
                raise PackError(f"{path}: row {row}: field {field!r} is null, not a string")
            row += 1
            yield value


class Documents:
    """A stream of documents that knows how far it has got: `done` of `total` units (bytes of
    the input files, or rows of a dataset; total None where unknown: a streamed dataset). A
    compressed file counts whole when it ends (its uncompressed size is not known ahead)."""

    def __init__(self, texts: Iterator[str], total: int | None):
        self._texts, self.total, self.done = texts, total, 0

    def __iter__(self) -> Iterator[str]:
        return self._texts


def _texts(kind: str, path: Path, field: str, stream: Documents) -> Iterator[str]:
    size, start = path.stat().st_size, stream.done
    if kind == "text":
        yield path.read_text(encoding="utf-8", errors="replace")
    elif kind == "jsonl":
        plain = not path.name.endswith(".gz")
        for where, record, length in _jsonl_records(path):
            yield text_of(record, field, where)
            if plain:  # the record's line, in characters: bytes for ASCII text
                stream.done = min(start + size, stream.done + length)
    else:
        yield from _parquet_texts(path, field)
    stream.done = start + size


def file_documents(inputs: Sequence[str], text_field: str) -> Documents:
    """The documents of files and directories (each directory's text, JSON Lines and Parquet
    files in sorted name order); checks them all before returning the stream."""
    files = _files(inputs)
    for kind, path in files:
        if kind == "jsonl":
            _check_jsonl(path, text_field)
        elif kind == "parquet":
            _check_parquet(path, text_field)
    stream = Documents(iter(()), sum(path.stat().st_size for _, path in files))
    stream._texts = chain.from_iterable(_texts(kind, path, text_field, stream) for kind, path in files)
    return stream


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _load_dataset(name: str, config: str | None, split: str, streaming: bool):
    import datasets

    path = Path(name).expanduser()
    if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
        # A save_to_disk directory: memory-mapped Arrow, so streaming or not reads the same way.
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise PackError(f"--split {split}: {name} has the splits {', '.join(loaded)}; choose one")
            loaded = loaded[split]
        return loaded
    if name.startswith((".", "/", "~")) and not path.exists():  # not a Hub id: do not ask the Hub
        raise PackError(f"--dataset {name}: no such directory")
    try:
        return datasets.load_dataset(name, config, split=split, streaming=streaming)
    except (FileNotFoundError, ValueError, ConnectionError, datasets.exceptions.DatasetsError) as e:
        raise PackError(f"--dataset {name}: cannot load it ({_first_line(e)}); give a Hub dataset id "
                        f"(--dataset-config, --split; HF_TOKEN for gated data) or a local dataset "
                        f"directory") from None


def dataset_documents(name: str, *, config: str | None, split: str, streaming: bool,
                      text_field: str) -> Documents:
    """The `text_field` of every row of a `datasets` dataset, in its order."""
    dataset = _load_dataset(name, config, split, streaming)
    columns = dataset.column_names  # None for a streamed dataset of unknown features
    if columns is not None:
        if text_field not in columns:
            raise PackError(f"--dataset {name}: no field {text_field!r} (its fields: "
                            f"{', '.join(map(repr, columns))}); name the text field with --text-field")
        dataset = dataset.select_columns([text_field])  # no decoding of the other columns
    stream = Documents(iter(()), None if streaming and not hasattr(dataset, "__len__") else len(dataset))

    def rows() -> Iterator[str]:
        for i, row in enumerate(dataset):
            yield text_of(row, text_field, f"--dataset {name} row {i}")
            stream.done = i + 1

    stream._texts = rows()
    return stream
