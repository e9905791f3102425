"""Usage derived from events: GPU-hours by role, CPU-hours, sandbox-minutes and tokens, per run and per team."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from runctl.events import (
    ConfigSubmitted,
    Event,
    RunAdmitted,
    RunSucceeded,
    SandboxCreated,
    SandboxDestroyed,
    TrialFinished,
    new_event,
)
from runctl.events.payloads import Payload
from runctl.usage import usage_by_run, usage_by_team

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)


def at(minutes: float, payload: Payload, run: str, team: str = "nlp") -> Event:
    return new_event(payload, team=team, run_id=run, source="t", time=T0 + timedelta(minutes=minutes))


def submitted(run_type: str) -> ConfigSubmitted:
    return ConfigSubmitted(run_type=run_type, project_name="p", exp_name="e", engine="local", config_path="x",  # type: ignore[arg-type]
                           raw_config="", resolved={}, submitter="me")  # fmt: skip


def admitted(**resources: float) -> RunAdmitted:
    return RunAdmitted(resources=resources, quota_decision="test")


def trial(completion: int) -> TrialFinished:
    return TrialFinished(
        task="t", trial=0, reward=1.0, termination_reason="agent_completed", tokens={"completion": completion}
    )


EVENTS = [
    # An infer run: 2 GPUs for 3 hours, rollout; two trials; a sandbox for 10 minutes, one held until the end.
    at(0, submitted("infer"), "inf"),
    at(0, admitted(gpus=2), "inf"),
    at(5, SandboxCreated(sandbox_id="a", backend="docker", owner="s1"), "inf"),
    at(15, SandboxDestroyed(sandbox_id="a", backend="docker", reason="released"), "inf"),
    at(150, SandboxCreated(sandbox_id="b", backend="docker", owner="s1"), "inf"),
    at(20, trial(100), "inf"),
    at(40, trial(50), "inf"),
    at(180, RunSucceeded(), "inf"),
    # A fully async train run: 8 training and 8 rollout GPUs for 2 hours.
    at(0, submitted("train"), "tr"),
    at(60, admitted(gpus=16, rollout_gpus=8), "tr"),
    at(180, RunSucceeded(), "tr"),
    # An eval run of another team, still running at "now": 1 GPU.
    at(0, submitted("eval"), "ev", "vision"),
    at(120, admitted(gpus=1), "ev", "vision"),
    # A CPU run: 4 CPUs for 30 minutes.
    at(0, submitted("infer"), "cpu", "vision"),
    at(0, admitted(gpus=0, cpus=4), "cpu", "vision"),
    at(30, RunSucceeded(), "cpu", "vision"),
]
NOW = T0 + timedelta(minutes=180)


def test_each_runs_usage_by_role_with_sandboxes_and_tokens() -> None:
    per_run = usage_by_run(EVENTS, NOW)
    inf = per_run["inf"][1]
    assert inf.gpu_hours == {"rollout": 6.0, "training": 0.0, "eval": 0.0}
    assert inf.sandbox_minutes == pytest.approx(10 + 30) and inf.tokens_generated == 150
    assert per_run["tr"][1].gpu_hours == {"rollout": 16.0, "training": 16.0, "eval": 0.0}
    assert per_run["ev"][1].gpu_hours["eval"] == pytest.approx(1.0)  # still running: counted until now
    cpu = per_run["cpu"][1]
    assert cpu.cpu_hours == pytest.approx(2.0) and sum(cpu.gpu_hours.values()) == 0


def test_a_teams_usage_adds_its_runs_and_a_window_counts_only_its_time() -> None:
    teams = usage_by_team(usage_by_run(EVENTS, NOW))
    assert teams["nlp"].as_dict() == {
        "gpu_hours": {"rollout": 22.0, "training": 16.0, "eval": 0.0},
        "cpu_hours": 0.0,
        "sandbox_minutes": 40.0,
        "tokens_generated": 150,
    }
    assert teams["vision"].gpu_hours["eval"] == pytest.approx(1.0) and teams["vision"].cpu_hours == pytest.approx(2.0)
    # From 2 h in: the infer run's last hour (2 GPU-h) and sandbox b's 30 minutes, the train run's last hour.
    late = usage_by_team(usage_by_run(EVENTS, NOW, since=T0 + timedelta(minutes=120)))
    assert late["nlp"].gpu_hours == {"rollout": 2.0 + 8.0, "training": 8.0, "eval": 0.0}
    assert late["nlp"].sandbox_minutes == pytest.approx(30) and late["nlp"].tokens_generated == 0
    assert late["vision"].cpu_hours == 0.0
