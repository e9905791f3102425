"""The server decides paths and site settings: a team's runs write only under its folders, a run never adopts
another run's folder, and a submitted config is carried over the cluster's own site.env."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runctl.config import resolve_text
from runctl.config.loader import submitted_values
from runctl.errors import ConfigError
from runctl.layout import FolderTakenError, claim_folder
from runctl.sdk import submission_event
from services.validator.library import registered
from services.validator.registry import Context
from tests.conftest import ROOT

PREVIEW = (ROOT / "configs" / "examples" / "preview.env").read_text()
INFER = (ROOT / "configs" / "examples" / "infer-cpu.env").read_text()


def team_area(text: str, monkeypatch: pytest.MonkeyPatch, areas: str | None) -> tuple[str, str]:
    if areas is None:
        monkeypatch.delenv("RUNCTL_TEAM_PATHS", raising=False)
    else:
        monkeypatch.setenv("RUNCTL_TEAM_PATHS", areas)
    config = resolve_text(text, "run.env", environ={"HOME": "/home/u"}).model
    check = next(c for c in registered() if c.id == "paths.team_area")
    result = check.run(Context.build(config))
    return result.severity, result.message


def test_a_run_writes_only_under_its_teams_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    areas = f"{tmp_path}/data/{{team}},{tmp_path}/scratch/{{team}}"
    assert team_area(PREVIEW, monkeypatch, None)[0] == "skip"  # a single-user stack confines no one
    assert team_area(PREVIEW, monkeypatch, areas)[0] == "ok"  # OUTPUT_DIR unset: the team's default run folder
    own = PREVIEW.replace("TEAM=demo", "TEAM=nlp") + f"OUTPUT_DIR={tmp_path}/scratch/nlp/exp1\n"
    assert team_area(own, monkeypatch, areas)[0] == "ok"
    for where in (f"{tmp_path}/data/vision/x", f"{tmp_path}/data/nlp/../vision/x", "relative/out", "/etc"):
        severity, message = team_area(own.replace(f"{tmp_path}/scratch/nlp/exp1", where), monkeypatch, areas)
        assert severity == "fatal" and f"OUTPUT_DIR={where}" in message and "team nlp's folders" in message
    (tmp_path / "data" / "nlp").mkdir(parents=True)
    (tmp_path / "data" / "vision").mkdir(parents=True)
    os.symlink(tmp_path / "data" / "vision", tmp_path / "data" / "nlp" / "link")  # a way out by a symbolic link
    severity, _ = team_area(own.replace("scratch/nlp/exp1", "data/nlp/link/x"), monkeypatch, areas)
    assert severity == "fatal"
    infer = INFER.replace("TEAM=demo", "TEAM=nlp") + f"OUTPUT_INDEX={tmp_path}/data/vision/filtered.parquet\n"
    severity, message = team_area(infer, monkeypatch, areas)
    assert severity == "fatal" and "OUTPUT_INDEX=" in message and "OUTPUT_DIR" not in message


def test_a_run_never_adopts_another_runs_folder(tmp_path: Path) -> None:
    folder = tmp_path / "results"
    claim_folder(folder, "run-a", "RESULTS_DIR")
    claim_folder(folder, "run-a", "RESULTS_DIR")  # the same run, resumed
    with pytest.raises(FolderTakenError, match="is run run-a's folder") as caught:
        claim_folder(folder, "run-b", "RESULTS_DIR")
    assert "RESULTS_DIR of its own" in caught.value.fix


def test_a_submitted_config_is_carried_over_the_clusters_site_env_not_the_submitters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    theirs = "FAKE_NUM_STEPS=9\nPRIORITY=high\n"  # what the submitter's site.env said
    ours = tmp_path / "site.env"
    ours.write_text("PRIORITY=low\nVENV_PATH=/opt/runctl\nMAX_RESP=2048\n")
    resolved = resolve_text(PREVIEW.replace("FAKE_NUM_STEPS=4\n", ""), "run.env", site_text=theirs, environ={})
    rows = submission_event(resolved).data.resolved  # type: ignore[attr-defined]
    assert rows["PRIORITY"]["layer"] == "site"
    monkeypatch.setenv("RUNCTL_SITE_ENV", str(ours))
    values = submitted_values("train", rows)
    assert values["PRIORITY"] == "low" and values["VENV_PATH"] == "/opt/runctl" and "FAKE_NUM_STEPS" not in values
    assert values["ENGINE"] == "fake"  # the run's own keys stay as they were resolved
    ours.write_text("NO_SUCH_KEY=1\n")
    with pytest.raises(ConfigError, match="NO_SUCH_KEY"):
        submitted_values("train", rows)
