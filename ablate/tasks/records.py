"""Where a task's problems come from: a JSONL, JSON or parquet file, a folder shaped like a hub download, or a hub
dataset id, read into records, and each record's problem, answer and solution found by the task's field names.

JSONL is read here, line by line, so that an error names its line; everything else goes through
`datasets.load_dataset` (the split and revision apply to folders and hub ids). A field name may be a dotted path
(`reward_model.ground_truth`). A problem is a string, or a conversation: a list of `{"role", "content"}` turns.
"""

from __future__ import annotations

import json
from pathlib import Path

FILE_KINDS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
FIELDS = ("problem", "answer", "solution")  # what a task reads of a record; task.fields maps each to a column


def read_records(source: str, split: str = "train", revision: str | None = None) -> list[tuple[int, dict]]:
    """The records of `source`, each with its number (a JSONL file's line; else its row, from 1): a file by its
    suffix, a local folder or a hub id through datasets."""
    path = Path(source).expanduser()
    if path.is_file():
        if path.suffix not in FILE_KINDS:
            raise ValueError(f"task.data_path={source}: a {path.suffix or 'suffix-less'} file; known: "
                             f"{', '.join(FILE_KINDS)} (or a folder, or a hub dataset id)")
        if path.suffix == ".jsonl":
            return _jsonl(path)
        return _load(f"datasets.load_dataset({FILE_KINDS[path.suffix]!r})", FILE_KINDS[path.suffix],
                     data_files=str(path), split="train")
    if path.is_dir():
        return _load(f"datasets.load_dataset({str(path)!r}, split={split!r})", str(path), split=split)
    if path.suffix in FILE_KINDS or source.startswith(("/", ".", "~")) or source.count("/") != 1:
        raise FileNotFoundError(f"task.data_path={source}: no such file or folder (nor a hub id: owner/name)")
    return _load(f"the hub dataset {source} (split {split!r}, revision {revision})", source, split=split,
                 revision=revision)


def _jsonl(path: Path) -> list[tuple[int, dict]]:
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"task.data_path: {path}:{number}: not a JSON object ({error})") from None
        if not isinstance(record, dict):
            raise TypeError(f"task.data_path: {path}:{number}: not a JSON object")
        records.append((number, record))
    return records


def _load(what: str, *args, **kwargs) -> list[tuple[int, dict]]:
    try:
        import datasets
    except ImportError:
        raise ImportError(f"task.data_path: reading {what} needs the `datasets` package (pip install datasets); "
                          f"a .jsonl file does not") from None
    try:
        rows = datasets.load_dataset(*args, **kwargs).to_list()
    except Exception as error:  # datasets raises many kinds; the first line of each says what
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"task.data_path: could not read {what}: {first}") from None
    return list(enumerate(rows, start=1))


def field(record: dict, name: str):
    """`record[name]`, a dotted name walking into nested records; None when any step is missing."""
    value = record
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def problem_of(record: dict, name: str, where: str):
    """The problem: a non-empty string, or a conversation as a tuple of (role, content) pairs."""
    value = field(record, name)
    if isinstance(value, str) and value.strip():
        return value.strip()
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(turn, dict) and isinstance(turn.get("role"), str) and isinstance(turn.get("content"), str)
            for turn in value):
        return tuple((turn["role"], turn["content"]) for turn in value)
    raise ValueError(f"{where}: needs a non-empty string or a list of {{role, content}} turns in `{name}` "
                     f"(task.fields.problem; keys found: {sorted(record)})")


def answer_of(record: dict, name: str, where: str) -> str:
    """The reference answer: a non-empty string (a number is read as its text)."""
    value = field(record, name)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: needs a non-empty string `{name}` (task.fields.answer; keys found: "
                         f"{sorted(record)})")
    return value.strip()
