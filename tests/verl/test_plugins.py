"""The step log and the checkpoint callback with verl's own classes: verl's FileLogger writes the lines, verl's
``build_checkpoint_callback`` builds runctl's callback from the composed config and the tests call it as verl's
trainer does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from runctl.events import CheckpointSaved, PluginFailed
from services.launcher.engines.verl.callback import CheckpointAnnouncer
from services.launcher.engines.verl.outbox import OutboxReader, post
from services.launcher.engines.verl.steplog import StepLog
from tests.verl.conftest import composed, verl_train_config


@pytest.fixture
def verl_logger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "steps.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    return path


def steps(reader: StepLog) -> list[int]:
    return [step for step, _ in reader.poll()]


def test_each_step_is_read_once_whole_lines_only_and_numbers_only(verl_logger: Path) -> None:
    from verl.utils.tracking import FileLogger

    logger = FileLogger("p", "e")
    reader = StepLog(verl_logger)
    logger.log({"critic/score/mean": np.float32(0.25), "actor/pg_loss": -0.5, "val/generations": [["text"]]}, step=1)
    assert list(reader.poll()) == [(1, {"critic/score/mean": 0.25, "actor/pg_loss": -0.5})]
    assert list(reader.poll()) == []
    logger.fp.write(b'{"step": 2, "data": {"critic/score/mean"')  # verl is writing the line now
    assert list(reader.poll()) == []
    logger.fp.write(b": 0.5}}\n")
    assert list(reader.poll()) == [(2, {"critic/score/mean": 0.5})]
    logger.finish()


def test_a_resumed_trainer_truncating_the_log_gives_only_the_steps_not_yet_published(verl_logger: Path) -> None:
    from verl.utils.tracking import FileLogger

    first = FileLogger("p", "e")
    reader = StepLog(verl_logger)
    for step in (1, 2, 3):
        first.log({"critic/score/mean": step / 10}, step=step)
    assert steps(reader) == [1, 2, 3]
    first.finish()
    # verl died after step 3 and resumes from its checkpoint of step 2: its logger truncates the file ("wb").
    second = FileLogger("p", "e")
    second.log({"critic/score/mean": 0.99}, step=3)
    assert steps(reader) == []  # step 3 keeps the figures first published
    second.log({"critic/score/mean": 0.4}, step=4)
    assert list(reader.poll()) == [(4, {"critic/score/mean": 0.4})]
    second.finish()


def test_a_log_rewritten_past_the_old_offset_before_a_look_is_read_again_from_its_start(verl_logger: Path) -> None:
    from verl.utils.tracking import FileLogger

    first = FileLogger("p", "e")
    reader = StepLog(verl_logger)
    first.log({"x": 1.0}, step=1)
    assert steps(reader) == [1]
    first.finish()
    second = FileLogger("p", "e")  # resumed from nothing: steps 1.. again, longer lines, unseen by the reader
    for step in (1, 2, 3):
        second.log({"x": float(step), "a/long/metric/name/that/makes/the/file/grow": 0.0}, step=step)
    assert steps(reader) == [2, 3]
    # A runner started again reads the whole file, skipping what its predecessor published.
    assert steps(StepLog(verl_logger, last_step=2)) == [3]
    second.finish()


def test_verls_trainer_builds_runctls_callback_and_it_announces_the_hugging_face_folder(tmp_path: Path) -> None:
    from verl.trainer.ppo.checkpoint_callback import build_checkpoint_callback

    run_dir = tmp_path / "run"
    callback = build_checkpoint_callback(composed(verl_train_config(), run_dir))
    assert isinstance(callback, CheckpointAnnouncer)
    folder = run_dir / "checkpoints" / "global_step_2"
    hf = folder / "actor" / "huggingface"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"\0" * 4000)
    (folder / "actor" / "model_world_size_1_rank_0.pt").write_bytes(b"\0" * 6000)
    callback.on_save(trainer=object(), global_step=2, checkpoint_dir=str(folder), async_save=False)
    ((_, key, payload),) = OutboxReader(run_dir).pending()
    assert key == "checkpoint.2"
    assert payload == CheckpointSaved(step=2, path=str(hf), format="hf", num_bytes=10002)


def test_a_checkpoint_without_its_hugging_face_folder_is_reported_never_raised_into_verl(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    callback = CheckpointAnnouncer(composed(verl_train_config(), run_dir))
    folder = run_dir / "checkpoints" / "global_step_4"
    (folder / "actor").mkdir(parents=True)
    callback.on_save(trainer=object(), global_step=4, checkpoint_dir=str(folder), async_save=False)
    callback.on_save(trainer=object(), global_step=5, checkpoint_dir=str(folder), async_save=True)
    failures = [payload for _, _, payload in OutboxReader(run_dir).pending()]
    assert [type(p) for p in failures] == [PluginFailed, PluginFailed]
    assert isinstance(failures[0], PluginFailed) and failures[0].step == 4
    assert "hf_model" in failures[0].message and "no eval run" in failures[0].message
    # Even the outbox unwritable (a file where its folder should be): nothing reaches verl.
    (run_dir / "verl" / "outbox").rename(run_dir / "verl" / "moved")
    (run_dir / "verl" / "outbox").write_text("not a folder")
    callback.on_save(trainer=object(), global_step=6, checkpoint_dir=str(folder))


def test_an_event_is_read_once_and_a_torn_or_foreign_file_is_set_aside(tmp_path: Path) -> None:
    post(tmp_path, "checkpoint.1", CheckpointSaved(step=1, path="/x", format="hf", num_bytes=1))
    (tmp_path / "verl" / "outbox" / "0-bad.json").write_text("{not json")
    reader = OutboxReader(tmp_path)
    ((path, key, _),) = reader.pending()
    assert key == "checkpoint.1"
    reader.sent(path)
    assert reader.pending() == []
    assert (tmp_path / "verl" / "outbox" / "sent" / "0-bad.json.bad").is_file()
