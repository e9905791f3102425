"""What runctl writes on the machine is its owner's alone: another account on the machine reads no run folder, no
event record and no tracker database."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from runctl.config import resolve_text
from services.launcher.engines.local import write_resolved_config
from services.tracker.settings import TrackerSettings
from tests.conftest import ROOT


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_home_and_the_tracker_database_are_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNCTL_HOME", str(tmp_path / "home"))
    url = TrackerSettings(db_url=None).database()
    database = Path(url.removeprefix("sqlite:///"))
    assert mode(tmp_path / "home") == 0o700 and mode(database) == 0o600


def test_a_run_folder_is_private_even_where_output_dir_puts_it(tmp_path: Path) -> None:
    text = (ROOT / "tests" / "data" / "configs" / "good" / "train-dense.env").read_text()
    config = resolve_text(text, "train.env", environ={"RUNCTL_TEST_DATA": str(ROOT / "tests" / "data")}).model
    run_dir = tmp_path / "shared-disk" / "runs" / "r1"
    write_resolved_config(config, run_dir)
    assert mode(run_dir) == 0o700 and (run_dir / "config.json").is_file()
    # A folder that was there with looser bits is made private too.
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    write_resolved_config(config, loose)
    assert mode(loose) == 0o700
