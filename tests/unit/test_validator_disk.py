"""paths.disk_space: checkpoints (model size × kept checkpoints) against the free space under the output folder."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import NamedTuple

import pytest

from runctl.config import resolve_text
from runctl.events import CheckResult
from services.validator.library import registered
from services.validator.registry import Context
from tests.conftest import ROOT

DATA = ROOT / "tests" / "data"
GIB = 1024**3


class Usage(NamedTuple):
    total: int
    used: int
    free: int


def disk_check(tmp_path: Path, extra: str = "") -> CheckResult:
    text = (DATA / "configs" / "good" / "train-dense.env").read_text() + f"OUTPUT_DIR={tmp_path}/out/run\n" + extra
    config = resolve_text(text, "run.env", environ={"RUNCTL_TEST_DATA": str(DATA)}).model
    check = next(c for c in registered() if c.id == "paths.disk_space")
    return check.run(Context.build(config, live=True))


@pytest.fixture
def free_gib(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Set ``free_gib[0]`` to pretend the disk has that much free; the folder probed is recorded after it."""
    state: list[float] = [0.0]

    def usage(path: str | Path) -> Usage:
        state.append(float(Path(path).exists()))
        return Usage(10**15, 0, int(state[0] * GIB))

    monkeypatch.setattr(shutil, "disk_usage", usage)
    return state


def test_kept_checkpoints_that_do_not_fit_are_fatal(tmp_path: Path, free_gib: list[float]) -> None:
    free_gib[0] = 500  # one 8B checkpoint is ~92 GiB (12 bytes per parameter)
    result = disk_check(tmp_path, "MAX_CKPT_TO_KEEP=10\n")
    assert result.severity == "fatal", result
    assert "10 checkpoints (MAX_CKPT_TO_KEEP=10)" in result.message and "lower MAX_CKPT_TO_KEEP" in result.fix
    assert free_gib[1] == 1.0  # it measured an existing ancestor of the output folder


def test_checkpoints_that_fit_pass_and_unbounded_ones_warn(tmp_path: Path, free_gib: list[float]) -> None:
    free_gib[0] = 500
    assert disk_check(tmp_path, "MAX_CKPT_TO_KEEP=3\n").severity == "ok"
    steps = disk_check(tmp_path, "TOTAL_TRAINING_STEPS=40\nSAVE_FREQ=10\n")
    assert steps.severity == "ok" and "4 saves over TOTAL_TRAINING_STEPS=40" in steps.message
    unbounded = disk_check(tmp_path)
    assert unbounded.severity == "warn" and "room for 5" in unbounded.message


def test_one_checkpoint_that_does_not_fit_is_fatal(tmp_path: Path, free_gib: list[float]) -> None:
    free_gib[0] = 50
    result = disk_check(tmp_path, "MAX_CKPT_TO_KEEP=1\n")
    assert result.severity == "fatal" and "the first save fails" in result.message


def test_the_real_disk_is_measured_for_a_tiny_model(tmp_path: Path) -> None:
    text = f"MODEL_PATH={DATA}/models/llama-tiny\nMAX_CKPT_TO_KEEP=2\nTOOL_CALL_PARSER=llama3_json\n"
    result = disk_check(tmp_path, text)
    assert result.severity == "ok", result
    assert f"{tmp_path}/out/run" in result.message


def test_static_validation_skips_the_disk_probe(tmp_path: Path) -> None:
    text = (DATA / "configs" / "good" / "train-dense.env").read_text()
    config = resolve_text(text, "run.env", environ={"RUNCTL_TEST_DATA": str(DATA)}).model
    check = next(c for c in registered() if c.id == "paths.disk_space")
    assert check.run(Context.build(config, live=False)).severity == "skip"
