"""Attacks on the trial browser's reading of run folders (services/tracker/artifacts.py): a FIFO or a huge file a
sandbox left in its trial folder, and a run config that names another team's folder as its own."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from runctl.layout import TRIAL_RECORD, trial_folder
from services.tracker.artifacts import trial_detail
from services.tracker.db import RunRow


def run_row(team: str, output_dir: Path) -> RunRow:
    resolved = {"OUTPUT_DIR": {"value": str(output_dir), "layer": "run", "source": "x.env:1"}}
    return RunRow(run_id="r1", team=team, run_type="eval", resolved=resolved, num_trials=0, num_events=0)


def trial(output_dir: Path) -> Path:
    folder = trial_folder(output_dir / "trials", "say-yes", 0)
    folder.mkdir(parents=True)
    (folder / TRIAL_RECORD).write_text(json.dumps({"reward": 1.0}))
    return folder


def test_a_fifo_or_a_huge_file_in_a_trial_folder_does_not_hold_the_tracker(tmp_path: Path) -> None:
    folder = trial(tmp_path / "run")
    (folder / "logs" / "agent").mkdir(parents=True)
    os.mkfifo(folder / "logs" / "agent" / "stuck.log")  # opening it for reading would wait for a writer
    os.mkfifo(folder / "trajectory.json")
    with (folder / "logs" / "agent" / "huge.log").open("wb") as out:
        out.truncate(1 << 30)  # sparse
    answer: list[dict[str, object]] = []
    worker = threading.Thread(
        target=lambda: answer.append(trial_detail(run_row("nlp", tmp_path / "run"), "say-yes", 0))
    )
    started = time.monotonic()
    worker.daemon = True
    worker.start()
    worker.join(20)
    assert answer, "the trial browser blocked on a FIFO"
    detail = answer[0]
    assert detail["found"] and detail["reward"] == 1.0 and time.monotonic() - started < 20
    logs = detail["logs"]
    assert isinstance(logs, dict) and "logs/agent/stuck.log" not in logs
    assert len(logs["logs/agent/huge.log"]) == 64 * 1024  # its tail, not a gigabyte


def test_a_run_naming_another_teams_folder_is_served_nothing_from_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNCTL_TEAM_PATHS", str(tmp_path / "data" / "{team}"))
    victim = tmp_path / "data" / "vision" / "run"
    trial(victim)
    assert trial_detail(run_row("vision", victim), "say-yes", 0)["found"]  # the owner sees its trial
    stolen = trial_detail(run_row("nlp", victim), "say-yes", 0)  # nlp's run says OUTPUT_DIR is vision's folder
    assert not stolen["found"] and stolen["trial"] is None and stolen["folder"] == ""
