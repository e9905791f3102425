"""Attacks on the bus by a team's own login (runctl.natsauth: one account per team), each against a real nats-server
with the generated configuration: every one is refused and nothing of the victim team's or the services' changes
(tests/infra/bus_attacks.py says how that is judged)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from tests.infra.bus_attacks import ATTACKS, Bus, attack, nats_bus

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bus]:
    with nats_bus(tmp_path_factory.mktemp("bus")) as server:
        yield server


@pytest.mark.parametrize("name", list(ATTACKS))
def test_a_team_cannot_read_forge_or_stop_others_work_on_the_bus(bus: Bus, name: str) -> None:
    assert asyncio.run(attack(bus, name)) == []
