"""conftest.spawn_ranks: ranks started once more after a SIGABRT, and only then."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch.multiprocessing

from conftest import spawn_ranks


def _aborts_on_the_first_try(rank: int, init_file: str, out: str) -> None:
    if Path(out).parent.name == "try-1":
        os.abort()
    Path(out).write_text(f"rank {rank}")


def _always_aborts(rank: int, init_file: str, out: str) -> None:
    Path(out).with_name(f"started.{rank}").touch()
    os.abort()


def _raises(rank: int, init_file: str, out: str) -> None:
    Path(out).with_name("started").touch()
    raise ValueError("a rank's own error")


def _exits_with_3(rank: int, init_file: str, out: str) -> None:
    Path(out).with_name("started").touch()
    os._exit(3)


def test_a_rank_that_dies_by_sigabrt_once_is_started_again_in_a_fresh_folder(tmp_path):
    with pytest.warns(UserWarning, match="rank 0 died by SIGABRT; starting the 1 ranks once more"):
        where = spawn_ranks(_aborts_on_the_first_try, tmp_path, nprocs=1)
    assert where == tmp_path / "try-2" and (where / "out").read_text() == "rank 0"
    assert not (tmp_path / "try-1" / "out").exists()


def test_twice_is_a_failure_and_a_ranks_own_error_or_exit_code_is_not_retried(tmp_path):
    with pytest.warns(UserWarning), pytest.raises(torch.multiprocessing.ProcessExitedException, match="SIGABRT"):
        spawn_ranks(_always_aborts, tmp_path / "abort", nprocs=1)
    assert sorted(p.parent.name for p in (tmp_path / "abort").glob("*/started.0")) == ["try-1", "try-2"]
    with pytest.raises(torch.multiprocessing.ProcessRaisedException, match="a rank's own error"):
        spawn_ranks(_raises, tmp_path / "raise", nprocs=1)
    assert [p.parent.name for p in (tmp_path / "raise").glob("*/started")] == ["try-1"]
    with pytest.raises(torch.multiprocessing.ProcessExitedException, match="exit code 3"):
        spawn_ranks(_exits_with_3, tmp_path / "exit", nprocs=1)
    assert [p.parent.name for p in (tmp_path / "exit").glob("*/started")] == ["try-1"]
