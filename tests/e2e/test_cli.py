"""The runctl command as a user runs it: a real process, a real embedded stack on free ports, in a temp home."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from runctl.home import is_same_process, read_stack_state
from tests.conftest import ROOT, Services, free_port, wait_until
from tests.e2e.conftest import PREVIEW, RUNCTL, Cli, admin_bus_url, port_args


def test_help_answers_without_importing_anything_heavy() -> None:
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import runctl.cli.main"], capture_output=True, text=True, check=True
    )
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    for heavy in ("nats", "sqlalchemy", "fastapi", "uvicorn", "pydantic", "httpx", "torch", "ray", "vllm"):
        assert heavy not in imported, f"`runctl --help` imports {heavy}"
    help_text = subprocess.run([RUNCTL, "--help"], capture_output=True, text=True, check=True).stdout
    for command in ("init", "validate", "submit", "runs", "show", "watch", "cancel", "up", "down", "status"):
        assert command in help_text


def test_validate_static_imports_nothing_heavy() -> None:
    """`runctl validate --static` is the check users run on every edit: it loads the config and the validator, and
    nothing that talks to a bus, a database, a cluster or a model (bench/validate.py times it)."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "runctl.cli.main", "validate", "--static", str(PREVIEW)],
        capture_output=True,
        text=True,
        check=True,
    )
    imported = {line.split("|")[-1].strip().split(".")[0] for line in result.stderr.splitlines() if "|" in line}
    assert {"runctl", "services", "pydantic"} <= imported, "the walk of -X importtime's output is broken"
    heavy = {"nats", "sqlalchemy", "alembic", "fastapi", "uvicorn", "httpx", "rich", "pydantic_settings", "docker"}
    heavy |= {"kubernetes", "pyarrow", "numpy", "torch", "ray", "vllm", "transformers"}
    assert not heavy & imported, f"`runctl validate --static` imports {sorted(heavy & imported)}"


def test_init_writes_a_template_that_only_needs_its_placeholders_filled(cli: Cli, tmp_path: Path) -> None:
    cli("init", "train", "my_run", "--dir", str(tmp_path))
    path = tmp_path / "my_run.env"
    text = path.read_text()
    assert "EXP_NAME=my_run" in text and "MODEL_PATH=CHANGEME" in text
    result = cli("validate", str(path), check=False)
    assert result.returncode == 1
    assert "PROJECT_NAME is still the placeholder CHANGEME" in result.stdout
    data = ROOT / "tests" / "data"
    filled = text.replace("MODEL_PATH=CHANGEME", f"MODEL_PATH={data}/models/qwen3-moe")
    path.write_text(filled.replace("TRAIN_FILES=CHANGEME", f"TRAIN_FILES={data}/tasks").replace("CHANGEME", "x"))
    # --static: the live disk probe rightly finds no room here for a 30B model's checkpoints. What is left is a
    # warning about the MoE model, not a refusal.
    result = cli("validate", "--static", str(path))
    assert "0 fatal problems" in result.stdout and "⚠ engine.r3" in result.stdout
    path.write_text(path.read_text() + "ENGINE=fake\n")
    assert "0 fatal problems" in cli("validate", "--static", str(path)).stdout
    assert cli("init", "train", "my_run", "--dir", str(tmp_path), check=False).returncode == 1


def test_validate_reports_every_problem_with_file_line_and_fix(cli: Cli, tmp_path: Path) -> None:
    bad = tmp_path / "bad.env"
    bad.write_text(PREVIEW.read_text() + "GEN_TPP=2\nBACKEND=dockr\n")
    result = cli("validate", str(bad), check=False)
    assert result.returncode == 1
    lines = len(PREVIEW.read_text().splitlines())
    assert f"bad.env:{lines + 1}" in result.stdout and "did you mean GEN_TP" in result.stdout
    assert f"bad.env:{lines + 2}" in result.stdout and "'local', 'docker' or 'k8s'" in result.stdout
    as_json = json.loads(cli("validate", str(bad), "--json", check=False).stdout)
    assert as_json["ok"] is False
    assert {c["id"] for c in as_json["checks"]} == {"schema.unknown_key", "schema.value"}
    assert json.loads(cli("validate", str(PREVIEW), "--json").stdout)["ok"] is True
    static = json.loads(cli("validate", str(PREVIEW), "--json", "--static").stdout)["checks"]
    probes = [c for c in static if c["id"].startswith("services.")]
    assert probes and all(c["severity"] == "skip" and "--static" in c["message"] for c in probes)


def test_usage_errors_exit_2(cli: Cli) -> None:
    assert cli("validate", check=False).returncode == 2
    assert cli("init", "training", "x", check=False).returncode == 2
    assert cli("no-such-command", check=False).returncode == 2


def test_commands_that_need_the_bus_say_so_in_one_line_when_it_is_down(cli: Cli) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    for args in (("submit", str(PREVIEW)), ("cancel", "r-1", "--team", "demo"), ("watch", "r-1")):
        result = cli(*args, check=False, RUNCTL_NATS_URL=url)
        assert result.returncode == 1
        errors = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(errors) == 1, result.stderr
        assert errors[0].startswith("BusUnreachableError: ")
        assert "runctl up" in errors[0] and "RUNCTL_NATS_URL" in errors[0]


def test_preflight_only_and_dry_run_validate_and_publish_nothing(stack: Cli) -> None:
    result = stack("submit", str(PREVIEW), PREFLIGHT_ONLY="1")
    assert "nothing was published" in result.stdout
    dry = stack("submit", str(PREVIEW), DRY_RUN="1")
    assert "nothing was published" in dry.stdout
    assert 'ENGINE="fake"  # run:' in dry.stdout and 'DRY_RUN="1"  # env: environment $DRY_RUN' in dry.stdout
    assert "no runs recorded yet" in stack("runs").stdout
    assert _stream_messages(stack.home, "RUNS") == 0


def _stream_messages(home: Path, stream: str) -> int:
    """Messages in every team's stream of a family."""
    import asyncio

    from runctl.bus import Bus

    async def count() -> int:
        bus = await Bus.connect(admin_bus_url(home))
        try:
            from runctl.subjects import stream_team

            names = [name for name in await bus.stream_names() if stream_team(name, stream) is not None]
            return sum([int((await bus.js.stream_info(name)).state.messages) for name in names])
        finally:
            await bus.close()

    return asyncio.run(count())


def test_the_whole_tour_on_the_embedded_stack(stack: Cli) -> None:
    status = stack("status").stdout
    for name in ("nats-server", "validator", "launcher", "tracker", "proxy", "sandbox"):
        assert re.search(rf"{name}\s+\d+\s+ok", status), status
    submitted = stack("submit", str(PREVIEW), "--watch")
    out = submitted.stdout
    run_id = re.search(r"submitted (\S+)", out).group(1)  # type: ignore[union-attr]
    assert "ENGINE=fake" in out and "synthetic" in out
    order = ["config.submitted", "config.validated", "run.admitted", "cluster.ready", "replicas.ready", "step.done"]
    positions = [out.index(name) for name in order + ["checkpoint.saved", "run.succeeded"]]
    assert positions == sorted(positions)
    assert run_id in stack("runs").stdout and "succeeded" in stack("runs").stdout
    shown = stack("show", run_id).stdout
    assert "run.succeeded" in shown and "phase outputs" in shown
    record = json.loads(stack("show", run_id, "--json").stdout)
    assert record["run"]["state"] == "succeeded" and record["run"]["synthetic"] is True
    watched = stack("watch", run_id).stdout
    assert watched.count("step.done") == 4 and watched.rstrip().splitlines()[-1].find("run.succeeded") > 0
    assert watched.count("trial.finished") == 32
    quiet = stack("watch", run_id, "--no-trials").stdout
    assert "trial.finished" not in quiet and quiet.count("step.done") == 4
    missing = stack("show", "no-such-run", check=False)
    assert missing.returncode == 1 and missing.stderr.startswith("RunNotFoundError")
    used = json.loads(stack("usage", "--json").stdout)
    (demo,) = [team for team in used["teams"] if team["team"] == "demo"]
    assert demo["cpu_hours"] > 0 and run_id in {run["run_id"] for run in used["runs"]}  # a CPU run's CPUs, held
    table = stack("usage", "--team", "demo", "--since", "2026-01-01", "--runs").stdout
    assert "since 2026-01-01" in table and "CPU-h" in table and run_id in table
    bad = stack("usage", "--since", "soon", check=False)
    assert bad.returncode == 2 and "--since 2026-12-01" in bad.stderr
    # The tracker wants a token: the embedded stack's admin token, which the CLI read from the stack's home above;
    # `dashboard --open` hands it to the browser in the link's fragment (and never prints it).
    token = (stack.home / "admin-token").read_text().strip()
    opened, browser = stack.home.parent / "opened", stack.home.parent / "browser.sh"
    browser.write_text(f'#!/bin/sh\necho "$1" > {opened}\n')
    browser.chmod(0o755)
    shown = stack("dashboard", "--open", BROWSER=f"{browser} %s").stdout
    assert opened.read_text().strip() == f"{shown.strip()}#token={token}" and token not in shown
    assert stack("runs", RUNCTL_ADMIN_TOKEN="rca_not-this-one", check=False).stderr.startswith("TrackerError")


def test_cancel_from_the_cli(stack: Cli, tmp_path: Path) -> None:
    slow = tmp_path / "slow.env"
    slow.write_text(PREVIEW.read_text().replace("FAKE_NUM_STEPS=4", "FAKE_NUM_STEPS=500"))
    run_id = re.search(r"submitted (\S+)", stack("submit", str(slow)).stdout).group(1)  # type: ignore[union-attr]

    def running() -> bool:
        return '"running"' in stack("show", run_id, "--json", check=False).stdout

    wait_until(running, 30, "the run to be running")
    stack("cancel", run_id, "--reason", "test")
    watched = stack("watch", run_id)
    assert "run.cancelled" in watched.stdout.splitlines()[-1]


def test_the_supervisor_restarts_a_dead_service_and_down_stops_exactly_its_processes(stack: Cli) -> None:
    state = read_stack_state(stack.home)
    assert state is not None
    victim = state.children["launcher"]
    os.kill(victim.pid, signal.SIGKILL)

    def restarted() -> bool:
        now = read_stack_state(stack.home)
        return bool(now and now.children.get("launcher") and now.children["launcher"].pid != victim.pid)

    wait_until(restarted, 30, "the launcher to be restarted")
    wait_until(lambda: stack("status", check=False).returncode == 0, 30, "every service healthy again")
    now = read_stack_state(stack.home)
    assert now is not None and now.children["launcher"].restarts == 1
    assert "launcher" in stack("status").stdout
    records = [now.supervisor, *now.children.values()]
    assert all(is_same_process(r) for r in records)
    stack("down")
    assert not any(is_same_process(r) for r in records)
    assert read_stack_state(stack.home) is None
    assert "no stack recorded" in stack("status", check=False).stdout


def test_up_twice_shows_the_running_stack_and_a_taken_port_is_named(stack: Cli) -> None:
    before = read_stack_state(stack.home)
    again = stack("up", *port_args())
    assert "already up" in again.stdout and re.search(r"launcher\s+\d+\s+ok", again.stdout)
    state = read_stack_state(stack.home)
    assert state == before
    assert state is not None
    other = Cli(stack.home.parent / "other", {**stack.env, "RUNCTL_HOME": str(stack.home.parent / "other")})
    port = state.nats_url.rsplit(":", 1)[1]
    taken = other("up", "--nats-port", port, "--tracker-port", str(free_port()), check=False)
    assert taken.returncode == 1 and f"port {port}" in taken.stderr and "--nats-port" in taken.stderr


def test_status_probes_a_cluster_bus_given_by_url(services: Services, cli: Cli) -> None:
    services.start("validator")
    result = cli("status", check=False, RUNCTL_NATS_URL=services.nats_url)
    assert result.returncode == 1
    assert re.search(r"validator\s+\d+\s+ok", result.stdout), result.stdout
    assert re.search(r"launcher\s+—\s+down", result.stdout), result.stdout


def test_submit_watch_exits_1_when_the_run_fails(stack: Cli, tmp_path: Path) -> None:
    failing = tmp_path / "failing.env"
    failing.write_text(PREVIEW.read_text() + "FAKE_FAIL_AT=replicas\n")
    result = stack("submit", str(failing), "--watch", check=False, timeout=60)
    assert result.returncode == 1
    last = result.stdout.rstrip().splitlines()[-1]
    assert "run.failed" in last and "in phase replicas" in last


def test_up_gives_up_on_a_service_that_keeps_exiting_and_shows_its_log(cli: Cli) -> None:
    """A tracker that cannot reach its database exits at every start: `up` stops the stack after its third exit and
    prints the end of its log, in seconds, rather than waiting out its whole timeout (300 s here)."""
    import time

    from runctl.stack import UP_RESTARTS_MAX

    began = time.monotonic()
    result = cli("up", *port_args(), check=False, RUNCTL_DB_URL="postgresql+psycopg://u:p@127.0.0.1:1/none")
    took = time.monotonic() - began
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"tracker exited {UP_RESTARTS_MAX} times before the stack came up" in result.stderr, result.stderr
    assert "Connection refused" in result.stderr and "tracker.log" in result.stderr
    assert took < 120, f"`runctl up` took {took:.0f}s to give up"
    assert read_stack_state(cli.home) is None


def test_when_the_supervisor_dies_down_still_stops_every_recorded_process(stack: Cli) -> None:
    state = read_stack_state(stack.home)
    assert state is not None
    os.kill(state.supervisor.pid, signal.SIGKILL)
    wait_until(lambda: not is_same_process(state.supervisor), 10, "the supervisor to die")
    status = stack("status", check=False)
    assert status.returncode == 1 and "not running" in status.stdout
    up = stack("up", *port_args(), check=False)
    assert up.returncode == 1 and "runctl down" in up.stderr and "still run" in up.stderr
    children = list(state.children.values())
    assert all(is_same_process(r) for r in children)
    stack("down")
    assert not any(is_same_process(r) for r in children)


def test_commands_that_need_the_tracker_say_so_in_one_line_when_it_is_down(cli: Cli) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    for args in (("runs",), ("show", "r-1"), ("usage",)):
        result = cli(*args, check=False, RUNCTL_TRACKER_URL=url)
        assert result.returncode == 1
        errors = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(errors) == 1 and errors[0].startswith("TrackerError: "), result.stderr
        assert "runctl up" in errors[0] and "RUNCTL_TRACKER_URL" in errors[0]
