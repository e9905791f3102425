"""The bus attack harness (tests/infra/bus_attacks.py) is able to fail: against a configuration that lets a team
publish on every subject, it reports what got through; against runctl's own, a team still reads its own events."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from runctl.bus import Bus as RunctlBus
from runctl.natsauth import SERVICES_ACCOUNT, team_account, view_subject
from tests.infra.bus_attacks import ATTACKER, OWN_EVENT, VICTIM_EVENT, attack, nats_bus

pytestmark = pytest.mark.integration


def too_wide(config: dict[str, Any]) -> None:
    """A team account that imports every runctl subject as a service and every team's view as a stream (and the
    services' account exporting them)."""
    account, services = config["accounts"][team_account(ATTACKER)], config["accounts"][SERVICES_ACCOUNT]
    account["imports"].append({"service": {"account": SERVICES_ACCOUNT, "subject": "runctl.>"}})
    account["imports"].append({"stream": {"account": SERVICES_ACCOUNT, "subject": "runctl.>"}, "to": "view.runctl.>"})
    services["exports"].append({"service": "runctl.>", "accounts": [team_account(ATTACKER)]})
    services["exports"].append({"stream": "runctl.>", "accounts": [team_account(ATTACKER)]})


@pytest.mark.parametrize(
    ("name", "reported"),
    [("publish as the victim", "RUNS holds"), ("subscribe to the victim's view", "the attacker got")],
)
def test_the_harness_reports_what_a_too_wide_import_lets_through(tmp_path: Path, name: str, reported: str) -> None:
    with nats_bus(tmp_path, too_wide) as bus:
        changes = asyncio.run(attack(bus, name))
    assert any(change.startswith(reported) for change in changes), changes


def test_a_team_reads_its_own_events_in_its_view(tmp_path: Path) -> None:
    async def own_events(url: str) -> list[str]:
        client = await RunctlBus.connect(url)
        client.team = ATTACKER
        try:
            await client.ensure_view()
            sub = await client.js.subscribe(view_subject(f"runctl.{ATTACKER}.>"), stream="VIEW", ordered_consumer=True)
            msg = await sub.next_msg(timeout=10)
            return [msg.subject]
        finally:
            await client.close()

    with nats_bus(tmp_path) as bus:
        assert asyncio.run(own_events(bus.url(ATTACKER))) == [view_subject(OWN_EVENT)]
        assert VICTIM_EVENT not in str(asyncio.run(own_events(bus.url(ATTACKER))))
