"""Runs from a directory of TensorBoard event files: `read_tensorboard(directory)` gives the `SourceRun`s it holds.

A run is a folder that holds event files (`events.out.tfevents.*`) itself, as TensorBoard's own run list has it:
named by its path relative to the directory (`runs/Dec01_12-00-00_host`, as HF Trainer's TensorBoardCallback writes
it under its output_dir), the directory's own name where the directory itself holds them. All of a folder's event
files are one run (a restart writes a new file beside the old one); of a step logged twice, the point logged last
wins (`series_of`).

Read with tensorboard's own reader (the package `tensorboard`, 2.21.0 when written): its TFRecord reader
(`tensorboard.compat.tensorflow_stub.pywrap_tensorflow.PyRecordReader_New`, which checks every record's crc32c) and
the read-time compat layers its `event_file_loader.EventFileLoader` applies (`data_compat`, `dataclass_compat`),
which give every value a data class. torch's `SummaryWriter.add_scalar` writes the legacy `simple_value` (a float32;
`new_style=True` writes a float32 tensor, `double_precision=True` a float64 one), newer writers (TF2's
`tf.summary.scalar`) a scalar tensor whose metadata comes with the tag's first point only. A legacy scalar is read as
is (the compat layers would make a tensor of the same float32, at three times the cost). `EventFileLoader` itself is
not used: it stops quietly at a bad record (a file TensorBoard watches may still be being written), where a report
must refuse it; nor is an `EventAccumulator`, which keeps a sample of each tag unless told otherwise (by default
event_accumulator's 10000 scalars a tag, plugin_event_accumulator's 500 tensors, where newer writers' scalars are;
`size_guidance` 0 keeps all). Every point is kept here, with its step and its wall time.

Only scalars are read: a tensor summary is a scalar where its data class (the first metadata of its tag in the run)
says DATA_CLASS_SCALAR. Params, where written: the hparams of `SummaryWriter.add_hparams` (which writes them to a
subfolder of the run, `<run>/<time.time()>/`, with its metric_dict as one point each at step 0: that folder is not a
run of its own, its params go to the run above it and its points, a summary not a curve, are dropped), and the
TrainingArguments JSON that HF's TensorBoardCallback writes as the text summary `args` (which torch's writer tags
`args/text_summary`). Params are text, as MLflow keeps them; torch's add_hparams stores a bool as a number (its
`isinstance(v, (int, float))` comes first), so False reads "0".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from analysis.sources import Series, SourceRun, series_of
from analysis.tables import TableError

EVENT_GLOB = "events.out.tfevents.*"
# HF's TensorBoardCallback: add_text("args", args.to_json_string()), which torch's SummaryWriter (and tensorboardX)
# tag "args/text_summary"
HF_ARGS_TAGS = ("args/text_summary", "args")
INSTALL = "reading TensorBoard needs the tensorboard package: pip install 'ablate[tensorboard]'"


class TensorBoardError(TableError):
    """A directory of event files that cannot be read as runs: the CLI prints its one line and exits 2."""


class TensorBoardMissing(TensorBoardError):
    pass


class TensorBoardNotFound(TensorBoardError):
    pass


class NoEventFiles(TensorBoardError):
    pass


class CorruptEventFile(TensorBoardError):
    pass


class NoScalars(TensorBoardError):
    pass


def read_tensorboard(directory) -> list[SourceRun]:
    """The runs of a directory of TensorBoard event files, oldest first (then by name)."""
    tb = _tensorboard()
    directory = Path(directory)
    if not directory.is_dir():
        raise TensorBoardNotFound(f"no directory of TensorBoard runs at {directory}"
                                  + (" (a file: give the folder that holds it)" if directory.is_file() else ""))
    folders = _event_folders(directory)
    if not folders:
        raise NoEventFiles(f"{directory}: no TensorBoard event files ({EVENT_GLOB}) under it")
    read = {folder: _read_folder(tb, files) for folder, files in folders.items()}
    runs = {folder: held for folder, held in read.items() if not _is_hparams_companion(folder, held, read)}
    for folder, held in read.items():
        if folder in runs:
            continue
        owner = next((runs[parent] for parent in folder.parents if parent in runs), None)
        if owner is not None:
            owner.params.update(held.params)  # add_hparams' subfolder: its params are its run's
        else:
            runs[folder] = held  # (above it only other such subfolders: a run of its own)
    made = [_source_run(directory, folder, held) for folder, held in runs.items()]
    made.sort(key=lambda run: (run.start_time, run.name))
    return made


def _tensorboard():
    """tensorboard's modules, imported here: only a directory of event files needs them."""
    try:
        from tensorboard import data_compat, dataclass_compat
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow
        from tensorboard.plugins.hparams import metadata as hparams_metadata
        from tensorboard.util import tensor_util
    except ImportError:
        raise TensorBoardMissing(INSTALL) from None
    return dict(data_compat=data_compat, dataclass_compat=dataclass_compat, event_pb2=event_pb2,
                summary_pb2=summary_pb2, errors=errors, records=pywrap_tensorflow.PyRecordReader_New,
                hparams=hparams_metadata, tensor_util=tensor_util)


def _event_folders(directory: Path) -> dict[Path, list[Path]]:
    """Every folder under `directory` (itself included) that holds event files, with its files in name order."""
    folders: dict[Path, list[Path]] = {}
    for file in sorted(directory.rglob(EVENT_GLOB)):
        if file.is_file():
            folders.setdefault(file.parent, []).append(file)
    return folders


# ---- one folder: its scalars' points, its params, and what else it holds ------------------------------------


@dataclass
class _Folder:
    """What one folder's event files hold."""

    points: dict[str, list] = field(default_factory=dict)  # scalar tag -> [(step, value, wall_time)], as read
    params: dict[str, str] = field(default_factory=dict)
    others: set[str] = field(default_factory=set)  # the summaries that are not scalars: "text 'args'", ...
    start: float = float("inf")  # the first event's wall time: the writer's start, as MLflow's run start


def _read_folder(tb, files: list[Path]) -> _Folder:
    held = _Folder()
    kinds: dict[str, int] = {}  # tag -> its data class, from its first metadata in the run
    initial: dict = {}  # dataclass_compat's memory of each tag's first metadata, one per run as TensorBoard keeps it
    for file in files:
        for event in _events(tb, file):
            held.start = min(held.start, event.wall_time)
            if _legacy_scalars(event):  # add_scalar's simple_value: read as is (data_compat's tensor of it is slow)
                for value in event.summary.value:
                    held.points.setdefault(value.tag, []).append((event.step, value.simple_value, event.wall_time))
                continue
            for migrated in tb["dataclass_compat"].migrate_event(tb["data_compat"].migrate_event(event), initial):
                for value in migrated.summary.value:
                    _read_value(tb, held, kinds, migrated, value)
    return held


def _legacy_scalars(event) -> bool:
    values = event.summary.value
    return bool(values) and all(value.WhichOneof("value") == "simple_value" for value in values)


def _read_value(tb, held: _Folder, kinds: dict[str, int], event, value) -> None:
    """One summary value, past tensorboard's compat layers: a scalar's point, params, or a kind of summary noted."""
    if value.HasField("metadata"):
        kinds.setdefault(value.tag, value.metadata.data_class)
    plugin = value.metadata.plugin_data.plugin_name
    if kinds.get(value.tag) == tb["summary_pb2"].DATA_CLASS_SCALAR:
        number = float(tb["tensor_util"].make_ndarray(value.tensor).item())
        held.points.setdefault(value.tag, []).append((event.step, number, event.wall_time))
    elif plugin == tb["hparams"].PLUGIN_NAME:
        held.params.update(_hparams(tb, value))
    elif plugin == "text" and value.tag in HF_ARGS_TAGS:
        held.params = {**_hf_args(tb, value), **held.params}  # add_hparams' own, where given, win
    else:
        held.others.add(f"{plugin or 'untyped'} {value.tag!r}")


def _events(tb, file: Path):
    """The events of one file as written; a bad record is refused (tensorboard's own loader stops at it quietly)."""
    try:
        reader = tb["records"](str(file).encode(), 0, b"", None)
    except tb["errors"].OpError as err:
        raise CorruptEventFile(f"{file}: cannot be opened as an event file ({err.message})") from None
    count = 0
    while True:
        try:
            reader.GetNext()
        except tb["errors"].OutOfRangeError:
            return
        except tb["errors"].DataLossError as err:
            raise CorruptEventFile(f"{file}: a corrupt event file: {_damage(file, err.message)} after {count} good "
                                   "events (a file still being written is read once its run has ended)") from None
        try:
            event = tb["event_pb2"].Event.FromString(reader.record())
        except Exception as err:  # protobuf's DecodeError, by whichever protobuf runtime is installed
            raise CorruptEventFile(f"{file}: record {count + 1} is not a TensorBoard event ({err})") from None
        count += 1
        yield event


def _damage(file: Path, message: str) -> str:
    """The reader's words without the file's name (its stub reader says "<name> has truncated record in data")."""
    return message.replace(repr(str(file).encode()), "").replace(str(file), "").strip().removeprefix("has ")


def _hparams(tb, value) -> dict[str, str]:
    """add_hparams' values (session_start_info), as MLflow keeps params: text."""
    if value.tag != tb["hparams"].SESSION_START_INFO_TAG:
        return {}
    info = tb["hparams"].parse_session_start_info_plugin_data(value.metadata.plugin_data.content)
    return {name: _param(_proto_value(held)) for name, held in info.hparams.items()}


def _proto_value(held):
    kind = held.WhichOneof("kind")
    return getattr(held, kind) if kind else None


def _hf_args(tb, value) -> dict[str, str]:
    """HF's TrainingArguments, which its TensorBoardCallback writes as JSON text (a markdown code block or not)."""
    text = tb["tensor_util"].make_ndarray(value.tensor).flatten()
    text = text[0].decode("utf-8", "replace") if text.size else ""
    text = text.strip().removeprefix("```json").removeprefix("```").removesuffix("```")
    try:
        args = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return {name: _param(held) for name, held in args.items()} if isinstance(args, dict) else {}


def _param(value) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # add_hparams stores 8 as 8.0
    return str(value)


# ---- folders to runs ----------------------------------------------------------------------------------------


def _is_hparams_companion(folder: Path, held: _Folder, read: dict) -> bool:
    """add_hparams' subfolder: hparams, at most one point a tag, and a folder above it that holds event files."""
    return bool(held.params) and all(len(found) <= 1 for found in held.points.values()) and any(
        parent in read for parent in folder.parents)


def _name(directory: Path, folder: Path) -> str:
    return directory.resolve().name if folder == directory else folder.relative_to(directory).as_posix()


def _source_run(directory: Path, folder: Path, held: _Folder) -> SourceRun:
    name = _name(directory, folder)
    if not held.points:
        found = ", ".join(sorted(held.others)[:5]) or "no summaries"
        raise NoScalars(f"{folder}: run {name!r} has no scalars (its event files hold {found}); a run is read from "
                        "its scalars: remove that folder, or point at the folders of the runs")
    series = {tag: series_of(found) for tag, found in sorted(held.points.items())}

    def load(metric: str) -> Series:
        if metric not in series:
            raise TensorBoardError(f"run {name!r} has no scalar {metric!r}; it has: "
                                   + ", ".join(repr(tag) for tag in series))
        return series[metric]

    return SourceRun(id=name, name=name, metrics=tuple(series), load=load, params=held.params, start_time=held.start)
