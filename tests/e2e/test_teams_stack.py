"""Two teams on one embedded stack: its bus is secured from the first `runctl up`, each team works with its token
alone, and neither can see, touch or stop the other's work through the bus, the tracker API or the CLI."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx
import pytest

from runctl.home import read_stack_state
from tests.conftest import login_refused, wait_until
from tests.e2e.conftest import PREVIEW, Cli
from tests.infra.bus_attacks import answers, was_refused

LIVE_ATTACKS = [
    "publish as the victim",
    "publish a services-only event of its own run",
    "update the launcher's consumer to its own filter",
    "list the subjects of RUNS",
    "direct get of the victim's last event",
    "pull from the launcher's consumer",
    "the victim's JetStream API",
]


def token_in(printed: str) -> str:
    return printed.split("RUNCTL_TOKEN=", 1)[1].split()[0]


def as_team(stack: Cli, token: str) -> Cli:
    return Cli(stack.home, {**stack.env, "RUNCTL_TOKEN": token})


@pytest.mark.timeout(600)
def test_two_teams_on_one_embedded_stack_cannot_see_touch_or_stop_each_others_work(stack: Cli, tmp_path: Path) -> None:
    state = read_stack_state(stack.home)
    assert state is not None
    # Secured from the start: no login, no bus; the services' and admin's passwords are the owner's alone.
    assert "Authorization" in asyncio.run(login_refused(state.nats_url))
    assert (stack.home / "bus-users.json").stat().st_mode & 0o777 == 0o600
    assert (stack.home / "nats.conf").stat().st_mode & 0o777 == 0o600

    # `team add` returns once the bus takes the team's user: its token works at once.
    tokens = {team: token_in(stack("team", "add", team).stdout) for team in ("vision", "nlp")}
    vision, nlp = as_team(stack, tokens["vision"]), as_team(stack, tokens["nlp"])
    slow = tmp_path / "vision.env"
    slow.write_text(
        PREVIEW.read_text().replace("TEAM=demo", "TEAM=vision").replace("FAKE_NUM_STEPS=4", "FAKE_NUM_STEPS=500")
    )
    run_id = re.search(r"submitted (\S+)", vision("submit", str(slow)).stdout).group(1)  # type: ignore[union-attr]

    def state_seen_by(who: Cli) -> str | None:
        shown = who("show", run_id, "--json", check=False)
        return json.loads(shown.stdout)["run"]["state"] if shown.returncode == 0 else None

    wait_until(lambda: state_seen_by(vision) == "running", 60, "vision's run to be running")

    # The CLI: nlp neither lists, shows, watches nor cancels vision's run.
    refused: list[str] = []
    assert run_id not in nlp("runs").stdout
    shown = nlp("show", run_id, check=False)
    if shown.returncode == 1 and shown.stderr.startswith("RunNotFoundError"):
        refused.append("cli show")
    watched = nlp("watch", run_id, check=False)
    if watched.returncode == 1 and "RunNotFoundError" in watched.stderr and "run." not in watched.stdout:
        refused.append("cli watch")
    cancelled = nlp("cancel", run_id, "--team", "vision", check=False)
    if cancelled.returncode == 1:
        refused.append("cli cancel")
    if nlp("cancel", run_id, check=False).returncode == 1:  # its team looked up in the tracker: not found
        refused.append("cli cancel, team looked up")

    # The tracker API: another team's run is a 404, like a missing one; no token is a 401.
    api = f"{state.tracker_url}/api/runs/{run_id}"
    for what, headers, status in (
        ("api run as nlp", {"Authorization": f"Bearer {tokens['nlp']}"}, 404),
        ("api events as nlp", {"Authorization": f"Bearer {tokens['nlp']}"}, 404),
        ("api run without a token", {}, 401),
    ):
        url = api + "/events" if "events" in what else api
        if httpx.get(url, headers=headers, timeout=10).status_code == status:
            refused.append(what)
    assert httpx.get(api, headers={"Authorization": f"Bearer {tokens['vision']}"}, timeout=10).status_code == 200

    # The bus (every attack is tried on its own nats-server in tests/security/test_bus_attacks.py): on the stack's,
    # with the configuration its supervisor wrote, the forgery and the reads of the services' streams are refused.
    login = state.nats_url.replace("nats://", f"nats://nlp:{tokens['nlp']}@")
    got = asyncio.run(answers(login, LIVE_ATTACKS))
    refused += [name for name, answer in got.items() if was_refused(answer)]
    print(f"refused {len(refused)} of {7 + len(LIVE_ATTACKS)} cross-team operations on the embedded stack")
    assert len(refused) == 7 + len(LIVE_ATTACKS), (refused, got)

    # Vision's run went on untouched, and the services still act on vision's own cancel.
    assert state_seen_by(vision) == "running"
    vision("cancel", run_id)
    assert "run.cancelled" in vision("watch", run_id, "--no-trials").stdout.splitlines()[-1]

    # Rotating nlp's token cuts the old one off from the bus and the API before `team rotate` returns.
    new = token_in(stack("team", "rotate", "nlp").stdout)
    assert "Authorization" in asyncio.run(login_refused(state.nats_url, user="nlp", password=tokens["nlp"]))
    assert nlp("runs", check=False).returncode == 1
    assert as_team(stack, new)("runs").returncode == 0
    # And removing a team cuts it off too.
    stack("team", "remove", "nlp")
    assert "Authorization" in asyncio.run(login_refused(state.nats_url, user="nlp", password=new))
