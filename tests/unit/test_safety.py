"""What a review found leaking, each shut: secrets interpolated into other values, the launcher's settings in a
runner job's environment, a bus password in a message, links a sandbox planted served by the tracker, run ids that
could collide."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from runctl.bus.client import masked_url
from runctl.config import resolve_text
from runctl.errors import BusUnreachableError, ConfigError
from runctl.sdk import new_run_id, submission_event

CONFIG = (
    "RUN_TYPE=eval\nPROJECT_NAME=p\nEXP_NAME=e\nMODEL_PATH=/m\nDATASET_PATH=/d\nSCAFFOLD=installed\n"
    'AGENT_COMMAND="HF=${HF_TOKEN} WB=${WANDB_API_KEY} run-agent --verbose"\n'
)
SECRETS = {"HF_TOKEN": "hf-tok-123456", "WANDB_API_KEY": "wandb-key-abcdef"}


def test_an_interpolated_secret_is_redacted_wherever_the_config_goes() -> None:
    resolved = resolve_text(CONFIG, "run.env", environ=SECRETS)
    assert resolved.model.agent_command == "HF=hf-tok-123456 WB=wandb-key-abcdef run-agent --verbose"  # it runs here
    shown = json.dumps(resolved.redacted_settings()) + resolved.to_env() + resolved.redacted_text()
    for secret in SECRETS.values():
        assert secret not in shown
    assert resolved.redacted_settings()["AGENT_COMMAND"]["value"] == "HF=*** WB=*** run-agent --verbose"
    foreground = submission_event(resolved, via="foreground")  # `runctl run` publishes its config redacted
    assert not any(secret in foreground.to_json().decode() for secret in SECRETS.values())


def test_a_submission_that_would_carry_a_secret_in_another_key_is_refused() -> None:
    resolved = resolve_text(CONFIG, "run.env", environ=SECRETS)
    with pytest.raises(ConfigError) as raised:
        submission_event(resolved, via="cli")
    (issue,) = raised.value.issues
    assert issue.code == "schema.secret_in_value" and issue.key == "AGENT_COMMAND" and issue.line == 7
    assert "runctl run" in issue.fix
    plain = resolve_text(CONFIG.replace("${HF_TOKEN}", "x").replace("${WANDB_API_KEY}", "y"), "run.env", environ={})
    assert submission_event(plain).data.resolved["AGENT_COMMAND"]["value"] == "HF=x WB=y run-agent --verbose"


def test_the_run_folders_config_json_redacts_interpolated_secrets(tmp_path: Path) -> None:
    from services.launcher.engines.local import write_resolved_config

    resolved = resolve_text(CONFIG, "run.env", environ=SECRETS)
    write_resolved_config(resolved.model, tmp_path, resolved.secret_values)
    written = (tmp_path / "config.json").read_text()
    assert json.loads(written)["AGENT_COMMAND"] == "HF=*** WB=*** run-agent --verbose"
    assert not any(secret in written for secret in SECRETS.values())


def test_a_runner_job_gets_only_the_settings_the_runner_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    from services.launcher.carry.as_job import JobCarrier
    from services.launcher.carry.books import Books

    for name, value in {
        "RUNCTL_DB_URL": "postgresql://tracker:dbpass@db/runctl",
        "RUNCTL_PROXY_ADMIN_TOKEN": "admin-token",
        "RUNCTL_SANDBOX_CAPS": "nlp=4",
        "RUNCTL_HOME": "/srv/runctl",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("RUNCTL_SANDBOX_CGROUP", raising=False)  # each test worker sets its own (tests/conftest.py)
    books = Books(SimpleNamespace(url="nats://runctl:pw@bus:4222"), None, "/runctl/launcher")  # type: ignore[arg-type]
    env = JobCarrier(books, None).job_env("nats://run.nlp.r1:runpw@bus:4222")  # type: ignore[arg-type]
    assert env == {
        "RUNCTL_NATS_URL": "nats://run.nlp.r1:runpw@bus:4222",  # the run's own login, never the launcher's
        "RUNCTL_HOME": "/srv/runctl",
        "RUNCTL_SANDBOX_CAPS": "nlp=4",  # the runner books its sandboxes against the team's cap
    }


def test_a_bus_url_is_never_shown_with_its_password() -> None:
    assert masked_url("nats://runctl:s3cret@host:4222") == "nats://runctl:***@host:4222"
    assert masked_url("nats://127.0.0.1:4222") == "nats://127.0.0.1:4222"
    assert "s3cret" not in BusUnreachableError(masked_url("nats://u:s3cret@h:1"), "refused").message


async def test_the_unreachable_bus_error_masks_the_password() -> None:
    from runctl.bus import Bus

    with pytest.raises(BusUnreachableError) as raised:
        await Bus.connect("nats://runctl:s3cret-pass@127.0.0.1:1")
    assert "s3cret-pass" not in raised.value.message and "runctl:***@127.0.0.1:1" in raised.value.message


def test_run_ids_carry_64_random_bits() -> None:
    ids = {new_run_id("exp") for _ in range(1000)}
    assert len(ids) == 1000
    assert all(re.fullmatch(r"exp-\d{8}-[0-9a-f]{16}", run_id) for run_id in ids)


def _run_row(tmp_path: Path) -> Any:
    return SimpleNamespace(team="nlp", run_id="r1", run_type="eval", resolved={"OUTPUT_DIR": {"value": str(tmp_path)}})


def test_the_tracker_never_serves_a_file_through_a_link_in_a_trial_folder(tmp_path: Path) -> None:
    from services.tracker.artifacts import trial_detail

    folder = tmp_path / "trials" / "t" / "trial-0"
    (folder / "logs" / "agent").mkdir(parents=True)
    (folder / "logs" / "verifier").mkdir(parents=True)
    (folder / "trial.json").write_text(json.dumps({"task": "t", "trial": 0, "reward": 1.0}))
    (folder / "logs" / "agent" / "out.txt").write_text("the agent's own output\n")
    secret = tmp_path / "outside.txt"
    secret.write_text("a file of this machine\n")
    os.symlink(secret, folder / "logs" / "agent" / "x")
    os.symlink(secret, folder / "logs" / "verifier" / "test-stdout.txt")
    os.symlink(tmp_path, folder / "logs" / "agent" / "everything")  # a linked folder is not walked either
    detail = trial_detail(_run_row(tmp_path), "t", 0)
    assert detail["found"] is True
    assert detail["logs"] == {"logs/agent/out.txt": "the agent's own output\n"}
    assert detail["verifier"] == {}
    assert "a file of this machine" not in json.dumps(detail)
    # A record that is itself a link is not a record.
    (folder / "trial.json").unlink()
    os.symlink(secret, folder / "trial.json")
    assert trial_detail(_run_row(tmp_path), "t", 0)["found"] is False
