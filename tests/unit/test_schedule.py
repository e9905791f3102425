"""The suite's own xdist scheduler (tests/infra/schedule.py), driven as xdist's controller drives it: workers that
record what they are sent and finish their tests one at a time, in turn."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.infra import schedule, shared

#: unit -> (its tests, exclusive, light, served by no replica), in the order the workers sorted them (longest first).
UNITS: dict[str, tuple[list[str], bool, bool, bool]] = {
    "demo": ([f"demo_{n}" for n in range(6)], True, False, False),  # six tests: long
    "train": (["train"], True, False, False),
    "runner": ([f"runner_{n}" for n in range(6)], False, False, False),  # six tests: long
    "proxy": (["proxy_a", "proxy_b"], False, False, False),
    "stack": (["stack"], False, False, True),  # long, but served by no replica
    "admission": (["admission"], False, True, True),
    "bus": (["bus"], False, True, True),
    "cli": (["cli_a", "cli_b"], False, True, True),
    "served": (["served"], False, False, False),
    "envfile": (["envfile"], False, True, True),
    "units": (["units"], False, True, True),
}
COLLECTION = [test for tests, *_ in UNITS.values() for test in tests]
UNIT_OF = {test: unit for unit, (tests, *_) in UNITS.items() for test in tests}
LIGHT = [unit for unit, (_, _, light, _) in UNITS.items() if light]
UNSERVED = [unit for unit, (*_, unserved) in UNITS.items() if unserved]
EXCLUSIVE = {unit for unit, (_, exclusive, *_) in UNITS.items() if exclusive}


@dataclass(eq=False)
class Worker:
    number: int
    sent: list[str] = field(default_factory=list)
    done: list[str] = field(default_factory=list)
    shutting_down: bool = False

    @property
    def gateway(self) -> Any:
        return SimpleNamespace(id=f"gw{self.number}")

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent += [COLLECTION[i] for i in indices]

    def shutdown(self) -> None:
        self.shutting_down = True

    def units(self) -> list[str]:
        return list(dict.fromkeys(UNIT_OF[test] for test in self.sent))


def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int, light: int) -> list[Worker]:
    """Schedule the collection on ``workers`` workers (the last ``light`` of them light) and drive it to the end,
    checking at every step that no two workers hold an unfinished exclusive unit."""
    monkeypatch.setenv(shared.ENV, str(tmp_path))
    monkeypatch.setenv(schedule.LIGHT_WORKERS, str(light))
    written = {"groups": UNIT_OF, "exclusive": sorted(EXCLUSIVE), "light": LIGHT, "unserved": UNSERVED}
    (tmp_path / schedule.GROUPS_FILE).write_text(json.dumps(written))
    config = SimpleNamespace(getvalue=lambda name: [f"{workers}*popen"], option=SimpleNamespace())
    sched = schedule.GroupScheduling(config)
    nodes = [Worker(n) for n in range(workers)]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, COLLECTION)
    sched.schedule()
    while not sched.tests_finished:
        moved = False
        for node in nodes:
            pending = [test for test in node.sent if test not in node.done]
            if pending:
                node.done.append(pending[0])
                sched.mark_test_complete(node, COLLECTION.index(pending[0]))
                moved = True
            holding = {n.number for n in nodes for t in n.sent if t not in n.done and UNIT_OF[t] in EXCLUSIVE}
            assert len(holding) <= 1, f"workers {holding} hold exclusive units at once"
        assert moved, "no worker has work, and the queue is not empty"
    assert sorted(test for node in nodes for test in node.sent) == sorted(COLLECTION), "a test sent twice or never"
    return nodes


def test_a_light_worker_takes_light_units_from_the_end_and_the_others_from_the_front(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second, light = run(tmp_path, monkeypatch, workers=3, light=1)
    # Shortest first; with no light unit left, the long one served by no replica; never "served".
    assert light.units() == ["units", "envfile", "cli", "bus", "admission", "stack"]
    # The train run waits for the demo, then goes to the worker that ran it.
    assert first.units() == ["demo", "train", "served"]
    assert second.units() == ["runner", "proxy"]


def test_without_light_workers_every_worker_takes_from_the_front(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = run(tmp_path, monkeypatch, workers=3, light=0)
    assert [node.units() for node in nodes] == [
        ["demo", "train", "envfile"],
        ["runner", "served", "units"],
        ["proxy", "stack", "admission", "bus", "cli"],
    ]


def test_the_light_count_leaves_one_full_worker_at_least(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (only,) = run(tmp_path, monkeypatch, workers=1, light=1)
    assert only.units() == list(UNITS)


def test_a_light_unit_is_short_and_served_by_no_replica() -> None:
    def item(*markers: str, fixtures: tuple[str, ...] = ()) -> Any:
        marks = {name: object() for name in markers}
        return SimpleNamespace(get_closest_marker=marks.get, fixturenames=fixtures)

    assert schedule.is_light([item("integration"), item()], schedule.LIGHT_MAX_S)
    assert not schedule.is_light([item("integration")], schedule.LIGHT_MAX_S + 1)
    assert schedule.unserved([item("integration")]) and not schedule.unserved([item("vllm")])
    assert not schedule.is_light([item(), item("vllm")], 1)
    assert not schedule.is_light([item("exclusive")], 1)
    assert not schedule.is_light([item(fixtures=("tmp_path", "served_model"))], 1)
