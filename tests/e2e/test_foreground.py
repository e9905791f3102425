"""`runctl run` in the foreground: published on the embedded stack's bus when one is up (the tracker, `runctl runs`,
`runctl show` and the dashboard see it as they see a submitted run; `runctl cancel` reaches it), and, without a
stack, saying in its last line that the tracker did not record it and how to change that."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from runctl.home import read_stack_state
from runctl.ports import free_ports
from tests.conftest import children, free_port, wait_until
from tests.e2e.conftest import PREVIEW, RUNCTL, Cli, port_args

pytestmark = pytest.mark.integration


def run_id_of(output: str) -> str:
    found = re.search(r"^run (\S+) \(", output, re.M)
    assert found, output
    return found.group(1)


def test_with_a_stack_up_a_foreground_run_is_recorded_like_a_submitted_one(stack: Cli) -> None:
    result = stack("run", str(PREVIEW))
    run_id = run_id_of(result.stdout)
    assert f"recorded by the tracker: `runctl show {run_id}`" in result.stdout.splitlines()[-1]
    shown = json.loads(stack("show", run_id, "--json").stdout)
    names = [e["name"] for e in shown["events"]]
    assert names[:2] == ["config.submitted", "config.validated"] and names[-1] == "run.succeeded"
    assert shown["events"][0]["data"]["via"] == "foreground"
    assert "run.admitted" not in names  # the launcher left it to `runctl run`: nothing ran it twice
    assert shown["run"]["state"] == "succeeded" and shown["run"]["num_trials"] == 32
    assert run_id in stack("runs").stdout
    # Every event the run wrote to its folder is on the bus, once.
    folder = stack.home / "runs" / "demo" / run_id
    local = [json.loads(line)["id"] for line in (folder / "events.jsonl").read_text().splitlines()]
    assert sorted(e["id"] for e in shown["events"]) == sorted(local)


def test_a_foreground_run_hears_runctl_cancel(stack: Cli, tmp_path: Path) -> None:
    slow = tmp_path / "slow.env"
    slow.write_text(PREVIEW.read_text().replace("FAKE_NUM_STEPS=4", "FAKE_NUM_STEPS=500"))
    proc = subprocess.Popen(
        [RUNCTL, "run", str(slow)], env=stack.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        folder = stack.home / "runs" / "demo"
        wait_until(lambda: folder.is_dir() and any(folder.iterdir()), 60, "the run folder")
        run_id = next(folder.iterdir()).name
        wait_until(lambda: '"running"' in stack("show", run_id, "--json", check=False).stdout, 60, "it to run")
        stack("cancel", run_id, "--reason", "enough")
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, stdout + stderr
    end = json.loads((folder / run_id / "events.jsonl").read_text().splitlines()[-1])
    assert end["type"] == "runctl.run.cancelled.v1" and end["data"]["requested_by"] != "signal"
    wait_until(lambda: '"cancelled"' in stack("show", run_id, "--json").stdout, 30, "the tracker to record it")


def test_without_a_stack_the_last_line_says_the_tracker_did_not_record_it_and_import_fixes_that(cli: Cli) -> None:
    result = cli("run", str(PREVIEW))
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("the tracker did not record this run (no runctl stack is up)")
    assert "`runctl up`" in last and "runctl tracker import" in last
    run_id = run_id_of(result.stdout)
    folder = cli.home / "runs" / "demo" / run_id
    cli("up", *port_args())
    try:
        imported = cli("tracker", "import", str(folder))
        count = len((folder / "events.jsonl").read_text().splitlines())
        assert f"published {count} of the {count} events" in imported.stdout
        wait_until(lambda: '"succeeded"' in cli("show", run_id, "--json").stdout, 30, "the tracker to record it")
        again = cli("tracker", "import", str(folder))  # the bus already has them: nothing is recorded twice
        assert f"published 0 of the {count} events" in again.stdout
        shown = json.loads(cli("show", run_id, "--json").stdout)
        assert len(shown["events"]) == count
    finally:
        cli("down", check=False)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None,
    reason="a network namespace of its own needs root, unshare and ip",
)
def test_a_run_in_a_loopback_only_namespace_reaches_the_stack_through_the_relay(stack: Cli) -> None:
    socket_path = f"/tmp/runctl-test-{os.getpid()}.sock"
    relay = subprocess.Popen([sys.executable, "-m", "runctl.loopback", "host", socket_path], env=stack.env)
    try:
        wait_until(lambda: Path(socket_path).exists(), 30, "the relay's socket")
        inside = 'ip link set lo up && exec "$@"'
        argv = ["unshare", "--net", "sh", "-c", inside, "sh", sys.executable, "-m", "runctl.loopback", "enter"]
        argv += [socket_path, "--", RUNCTL, "run", str(PREVIEW)]
        result = subprocess.run(argv, env=stack.env, capture_output=True, text=True, timeout=180)
    finally:
        relay.terminate()
        relay.wait(30)
    assert result.returncode == 0, result.stdout + result.stderr
    run_id = run_id_of(result.stdout)
    assert "recorded by the tracker" in result.stdout.splitlines()[-1]
    assert json.loads(stack("show", run_id, "--json").stdout)["run"]["state"] == "succeeded"
    assert not Path(socket_path).exists()  # the host side removes its socket when it stops


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None,
    reason="a network namespace of its own needs root, unshare and ip",
)
def test_the_stack_can_run_its_launcher_in_a_loopback_only_namespace_of_its_own(cli: Cli) -> None:
    # On a machine with a routable interface (auto) the stack isolates its launcher; here, already inside the
    # suite's loopback-only namespace, it is asked to (=1).
    nats_port, tracker_port = free_ports(2)
    env = {"RUNCTL_LAUNCHER_NETNS": "1"}
    cli("up", "--nats-port", str(nats_port), "--tracker-port", str(tracker_port), **env)
    try:
        state = read_stack_state(cli.home)
        assert state is not None and "bus-relay" in state.children
        wrapper = state.children["launcher"].pid
        (launcher,) = children(wrapper)
        assert "services.launcher" in Path(f"/proc/{launcher}/cmdline").read_text()
        ours = os.readlink("/proc/self/ns/net")
        assert os.readlink(f"/proc/{launcher}/ns/net") != ours  # a namespace of its own
        assert os.readlink(f"/proc/{state.children['tracker'].pid}/ns/net") == ours  # the rest stays here
        result = cli("submit", str(PREVIEW), "--watch", **env)  # admitted and carried by the isolated launcher
        assert "run.succeeded" in result.stdout, result.stdout
    finally:
        cli("down", check=False)
    assert not Path(f"/proc/{launcher}").exists() and not Path(f"/proc/{wrapper}").exists()
    assert not (cli.home / "bus.sock").exists()


def test_a_launcher_namespace_that_cannot_be_made_is_refused_by_runctl_up(cli: Cli) -> None:
    result = cli("up", "--nats-port", str(free_port()), check=False, RUNCTL_LAUNCHER_NETNS="yes")
    assert result.returncode == 1
    assert "RUNCTL_LAUNCHER_NETNS='yes' is not 0, 1 or auto" in result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert read_stack_state(cli.home) is None
