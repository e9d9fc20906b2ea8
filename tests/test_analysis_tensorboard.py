"""TensorBoard event files read as runs (analysis/tensorboard_runs.py): files written by torch's own SummaryWriter
(legacy `simple_value` scalars, its `new_style` tensor scalars, `add_hparams`' subfolder) and by HF's own
TensorBoardCallback, read back point for point with their steps and wall times; a restart's repeated steps; each bad
directory gets its one line naming the path.
"""

import json
import sys
from importlib.util import find_spec

import numpy as np
import pytest

from analysis.tables import TableError
from analysis.tensorboard_runs import (
    CorruptEventFile,
    NoEventFiles,
    NoScalars,
    TensorBoardMissing,
    TensorBoardNotFound,
    read_tensorboard,
)

T0 = 1_700_000_000.0  # the wall clock the writers are given: the times read back must be these
needs_tensorboard = pytest.mark.skipif(find_spec("tensorboard") is None, reason="pip install tensorboard")


def writer_at(folder):
    """torch's own SummaryWriter (imported here: it needs the tensorboard package)."""
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(folder))


def write(folder, points, start=T0, **kwargs):
    """One SummaryWriter's run: points {tag: [(step, value)]}, logged at T0 + 10 * step + the tag's index."""
    writer = writer_at(folder)
    for index, (tag, found) in enumerate(points.items()):
        for step, value in found:
            writer.add_scalar(tag, value, step, walltime=start + 10 * step + index, **kwargs)
    writer.close()


def by_name(runs):
    return {run.name: run for run in runs}


@needs_tensorboard
def test_two_runs_read_point_for_point_with_their_steps_and_times(tmp_path):
    write(tmp_path / "base", {"eval/reward": [(0, 0.125), (10, 0.5), (20, 0.75)], "train/loss": [(5, 2.0)]})
    write(tmp_path / "no-kl" / "seed1", {"eval/reward": [(0, 0.25), (10, 0.1)]}, start=T0 - 50)
    runs = read_tensorboard(tmp_path)
    assert [run.name for run in runs] == ["no-kl/seed1", "base"]  # oldest first; a nested folder's path is its name
    base, no_kl = by_name(runs)["base"], by_name(runs)["no-kl/seed1"]
    assert base.metrics == ("eval/reward", "train/loss") and no_kl.metrics == ("eval/reward",)
    reward = base.history("eval/reward")
    assert reward.step.tolist() == [0, 10, 20] and reward.value.tolist() == [0.125, 0.5, 0.75]
    assert reward.time.tolist() == [T0, T0 + 100, T0 + 200]
    loss = base.history("train/loss")
    assert loss.step.tolist() == [5] and loss.value.tolist() == [2.0] and loss.time.tolist() == [T0 + 51]
    other = no_kl.history("eval/reward")
    assert other.step.tolist() == [0, 10] and other.time.tolist() == [T0 - 50, T0 + 50]
    assert other.value.tolist() == [0.25, float(np.float32(0.1))]  # a simple_value is a float32
    assert base.start_time <= T0 and no_kl.start_time <= T0 - 50  # the writer's first event (its file_version)
    with pytest.raises(TableError, match="no scalar 'eval/rewrd'"):
        base.history("eval/rewrd")


@needs_tensorboard
def test_tensor_stored_scalars_are_read_as_scalars(tmp_path):
    """SummaryWriter's new_style scalars are tensors (float, or double with double_precision), as TF2 writes them."""
    write(tmp_path / "f32", {"eval/reward": [(0, 0.5), (1, 0.75)]}, new_style=True)
    write(tmp_path / "f64", {"eval/reward": [(0, 0.1), (1, 0.2)]}, new_style=True, double_precision=True)
    runs = by_name(read_tensorboard(tmp_path))
    assert runs["f32"].history("eval/reward").value.tolist() == [0.5, 0.75]
    assert runs["f64"].history("eval/reward").value.tolist() == [0.1, 0.2]  # exactly: a double is kept whole
    assert runs["f64"].history("eval/reward").time.tolist() == [T0, T0 + 10]


@needs_tensorboard
def test_tf2_style_scalars_whose_metadata_comes_with_their_first_point_only(tmp_path):
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    from tensorboard.util import tensor_util

    writer = EventFileWriter(str(tmp_path / "tf2"))
    for step, value in [(0, 0.25), (1, 0.5), (2, 0.625)]:
        summary = summary_pb2.Summary()
        entry = summary.value.add(tag="eval/reward", tensor=tensor_util.make_tensor_proto(np.float32(value)))
        if step == 0:
            entry.metadata.plugin_data.plugin_name = "scalars"
        writer.add_event(event_pb2.Event(wall_time=T0 + step, step=step, summary=summary))
    writer.close()
    series = read_tensorboard(tmp_path)[0].history("eval/reward")
    assert series.step.tolist() == [0, 1, 2] and series.value.tolist() == [0.25, 0.5, 0.625]


@needs_tensorboard
def test_hf_trainers_own_callback_its_names_layout_and_args(tmp_path):
    """HF's TensorBoardCallback writes `<output_dir>/runs/<date>_<host>/`, `eval_reward` as `eval/reward` and `loss` as
    `train/loss`, and its TrainingArguments as the text `args`, which become params."""
    from transformers import TrainerControl, TrainerState, TrainingArguments
    from transformers.integrations.integration_utils import TensorBoardCallback

    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=3, learning_rate=0.25,
                             report_to=[], use_cpu=True)
    callback, state, control = TensorBoardCallback(), TrainerState(), TrainerControl()
    callback.on_train_begin(args, state, control)
    for step, logs in [(1, {"loss": 2.5, "learning_rate": 0.25}), (2, {"eval_reward": 0.375}),
                       (3, {"loss": 1.5, "learning_rate": 0.125}), (4, {"eval_reward": 0.625})]:
        state.global_step = step
        callback.on_log(args, state, control, logs=logs)
    callback.on_train_end(args, state, control)

    (run,) = read_tensorboard(tmp_path)
    assert run.name.startswith("runs/") and (tmp_path / run.name).is_dir()
    assert run.metrics == ("eval/reward", "train/learning_rate", "train/loss")
    assert run.history("eval/reward").step.tolist() == [2, 4]
    assert run.history("eval/reward").value.tolist() == [0.375, 0.625]
    assert run.history("train/loss").value.tolist() == [2.5, 1.5]
    assert run.params["per_device_train_batch_size"] == "3" and run.params["learning_rate"] == "0.25"
    times = run.history("train/loss").time
    assert times[0] <= times[1] and run.start_time <= times[0]


@needs_tensorboard
def test_add_hparams_subfolder_is_its_runs_params_not_a_run(tmp_path):
    writer = writer_at(tmp_path / "lr-1e-2")
    for step, value in [(0, 0.25), (1, 0.5)]:
        writer.add_scalar("eval/reward", value, step, walltime=T0 + step)
    writer.add_hparams({"lr": 0.01, "batch": 8, "optimizer": "adam", "kl": False}, {"eval/reward": 0.875})
    writer.close()
    assert len(list((tmp_path / "lr-1e-2").iterdir())) == 2  # its events file, and add_hparams' subfolder
    (run,) = read_tensorboard(tmp_path)
    assert run.name == "lr-1e-2"
    assert run.params == {"lr": "0.01", "batch": "8", "optimizer": "adam", "kl": "0"}  # torch: a bool is a number
    reward = run.history("eval/reward")  # add_hparams' summary point (0.875, at step 0) is not in the curve
    assert reward.step.tolist() == [0, 1] and reward.value.tolist() == [0.25, 0.5]


@needs_tensorboard
def test_the_directory_itself_holding_event_files_is_one_run(tmp_path):
    folder = tmp_path / "my-run"
    write(folder, {"reward": [(0, 0.5), (3, 0.75)]})
    (run,) = read_tensorboard(folder)
    assert run.name == "my-run" and run.history("reward").step.tolist() == [0, 3]


@needs_tensorboard
def test_a_restart_that_logs_steps_again_keeps_the_points_logged_last(tmp_path):
    """A resumed run writes a second events file beside the first and logs steps 3 and 4 again: those win."""
    write(tmp_path / "run", {"eval/reward": [(s, 0.125 * s) for s in range(5)]})
    write(tmp_path / "run", {"eval/reward": [(s, 0.5 + 0.0625 * s) for s in range(3, 7)]}, start=T0 + 1000)
    assert len(list((tmp_path / "run").glob("events.out.tfevents.*"))) == 2
    series = read_tensorboard(tmp_path)[0].history("eval/reward")
    assert series.step.tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert series.value.tolist() == [0.0, 0.125, 0.25, 0.6875, 0.75, 0.8125, 0.875]
    assert series.time.tolist() == [T0, T0 + 10, T0 + 20, T0 + 1030, T0 + 1040, T0 + 1050, T0 + 1060]


@needs_tensorboard
@pytest.mark.parametrize("damage", ["truncated", "flipped", "not-tfrecord"])
def test_a_corrupt_event_file_is_refused_with_its_name(tmp_path, damage):
    write(tmp_path / "good", {"reward": [(0, 0.5), (1, 0.75)]})
    write(tmp_path / "bad", {"reward": [(0, 0.5), (1, 0.75), (2, 0.875)]})
    (file,) = (tmp_path / "bad").glob("events.out.tfevents.*")
    data = file.read_bytes()
    if damage == "truncated":  # a writer killed mid-record
        file.write_bytes(data[:-7])
    elif damage == "flipped":  # one byte of the last record's payload
        file.write_bytes(data[:-6] + bytes([data[-6] ^ 0xFF]) + data[-5:])
    else:
        file.write_text("step,reward\n0,0.5\n")
    with pytest.raises(CorruptEventFile) as caught:
        read_tensorboard(tmp_path)
    message = str(caught.value)
    assert str(file) in message and "\n" not in message
    assert ("truncated" in message) == (damage == "truncated")


@needs_tensorboard
def test_empty_and_missing_directories_are_refused(tmp_path):
    (tmp_path / "empty" / "runs").mkdir(parents=True)
    (tmp_path / "empty" / "runs" / "notes.txt").write_text("no events here")
    with pytest.raises(NoEventFiles, match=r"empty: no TensorBoard event files \(events\.out\.tfevents\.\*\)"):
        read_tensorboard(tmp_path / "empty")
    with pytest.raises(TensorBoardNotFound, match="no directory of TensorBoard runs at .*nowhere"):
        read_tensorboard(tmp_path / "nowhere")
    (tmp_path / "file.csv").write_text("run,step\n")
    with pytest.raises(TensorBoardNotFound, match=r"\(a file"):
        read_tensorboard(tmp_path / "file.csv")


@needs_tensorboard
def test_a_run_with_no_scalars_is_refused_by_name(tmp_path):
    write(tmp_path / "good", {"reward": [(0, 0.5)]})
    writer = writer_at(tmp_path / "crashed")
    writer.add_text("args", json.dumps({"learning_rate": 0.1}))  # HF's first write; a crash before its first log
    writer.add_text("note", "starting")
    writer.close()
    with pytest.raises(NoScalars, match=r"crashed: run 'crashed' has no scalars \(its event files hold text "
                                        r"'note/text_summary'\)"):
        read_tensorboard(tmp_path)


def test_without_tensorboard_the_one_line_says_what_to_install(tmp_path, monkeypatch):
    for name in [name for name in sys.modules if name == "tensorboard" or name.startswith("tensorboard.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    with pytest.raises(TensorBoardMissing, match=r"needs the tensorboard package: pip install 'ablate\[tensorboard\]'"):
        read_tensorboard(tmp_path)
