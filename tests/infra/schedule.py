"""The order the suite's tests are handed to xdist's workers in: longest work first, fixtures set up once.

``scripts/test.sh`` runs pytest with ``-n <cores>``, and the controller schedules with :class:`GroupScheduling`: a
unit of work is a test, or every test of one group, and a worker that is nearly done takes the next unit in
collection order. Each worker sorts its collection (the same on every worker) by unit, the longest unit first (the
longest-processing-time rule: the run then ends with short units on both workers, not one long test on one while
the other idles), using the durations a run of the suite measured (``tests/durations.json``, written by ``python
-m tests.infra.timings --durations``); a test not measured yet counts by its markers. The groups go to the
controller in a file of the run's shared folder (tests/infra/shared.py): xdist's own ``loadgroup`` marks a group by
rewriting node ids, which pytest 9.2 no longer reads.

Groups:
- the tests of a module that use a module-scoped fixture are one group, so the fixture (a Ray head, a browser, a
  Docker backend whose tests list and remove what they own) is set up once, on one worker, and its tests never run
  beside each other;
- an ``xdist_group("name")`` mark puts tests of any module into one group, with the reason beside it.

A unit with a test marked ``exclusive("reason")`` goes to a worker only while no other worker has an exclusive unit
unfinished: the mark is for the few tests whose own work fills the machine (the reason says how), not for every long
test; a long test must hold its verdict beside any other (docs/testing.md, "Under load").

Light workers: ``RUNCTL_TEST_LIGHT_WORKERS`` (``scripts/test.sh`` sets it) names how many of the workers, the last
ones, take light units, shortest first from the queue's end: no test served by a vLLM replica (``vllm``,
``served_model``), none exclusive, the unit measured at ``LIGHT_MAX_S`` or less. Most such tests wait (on a bus, a
timeout, a reaper's round) more than they compute, and with one worker per core they were left for the end, where the
two workers kept the cores about half busy for seven minutes; beside the long tests they fill the cores' idle time.
Once no light unit is left, a light worker takes the shortest unit served by no replica and not exclusive, of any
length (a stack's, a Ray head's): in the CI run of 073d556 the light worker sat idle for the last four minutes while
the two others still ran seven minutes of such units.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

from tests.infra import shared

DURATIONS = Path(__file__).resolve().parents[1] / "durations.json"
GROUPS_FILE = "groups.json"
#: What a test not yet in DURATIONS is assumed to take, by its first marker found here.
UNMEASURED_S = {"vllm": 120.0, "docker": 10.0, "integration": 10.0}
UNMARKED_S = 0.5
#: The longest unit a light worker takes: longer ones start Ray heads, trainers or whole stacks.
LIGHT_MAX_S = 15.0
LIGHT_WORKERS = "RUNCTL_TEST_LIGHT_WORKERS"


def light_workers() -> int:
    return int(os.environ.get(LIGHT_WORKERS) or 0)


def unserved(unit: list[pytest.Item]) -> bool:
    """Whether nothing in ``unit`` is served by a vLLM replica or marked exclusive: a light worker may take it once
    no light unit is left."""
    for item in unit:
        if item.get_closest_marker("vllm") or item.get_closest_marker("exclusive"):
            return False
        if "served_model" in getattr(item, "fixturenames", ()):
            return False
    return True


def is_light(unit: list[pytest.Item], cost_s: float) -> bool:
    """Whether a light worker takes ``unit`` first: served by no replica, not exclusive, and short."""
    return unserved(unit) and cost_s <= LIGHT_MAX_S


def measured() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError):
        return {}


def guess_s(item: pytest.Item) -> float:
    for marker, seconds in UNMEASURED_S.items():
        if item.get_closest_marker(marker):
            return seconds
    return UNMARKED_S


def has_module_fixture(item: pytest.Item) -> bool:
    """Whether the test uses a module- or class-scoped fixture by name (one it asks for with
    ``request.getfixturevalue`` is not in its closure: such a module marks its group itself)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(d.scope in ("module", "class") for defs in info.name2fixturedefs.values() for d in defs)


def group_of(item: pytest.Item) -> str | None:
    marked = item.get_closest_marker("xdist_group")
    if marked is not None:
        return str(marked.args[0] if marked.args else marked.kwargs.get("name", "default"))
    return item.nodeid.split("::")[0] if has_module_fixture(item) else None


def order(items: list[pytest.Item]) -> None:
    """Sort ``items`` in place, longest unit first, and write each grouped test's group for the controller."""
    durations = measured()
    units: dict[str, list[pytest.Item]] = defaultdict(list)
    groups: dict[str, str] = {}
    for item in items:
        group = group_of(item)
        if group is not None:
            groups[item.nodeid] = group
        units[group or item.nodeid].append(item)
    cost = {key: sum(durations.get(i.nodeid, guess_s(i)) for i in unit) for key, unit in units.items()}
    ranked = sorted(units, key=lambda key: -cost[key])  # stable: equal costs keep collection order
    items[:] = [item for key in ranked for item in units[key]]
    exclusive = [key for key in ranked if any(i.get_closest_marker("exclusive") for i in units[key])]
    light = [key for key in ranked if is_light(units[key], cost[key])]
    free = [key for key in ranked if unserved(units[key])]
    # Every worker writes the same file; each replaces it whole, so the controller never reads half of one.
    path = shared.folder() / GROUPS_FILE
    partial = path.with_name(f"{GROUPS_FILE}.{os.getpid()}")
    partial.write_text(json.dumps({"groups": groups, "exclusive": exclusive, "light": light, "unserved": free}))
    partial.replace(path)


class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
    """xdist's scope scheduling with the workers' groups as scopes, their collection order kept, one exclusive
    unit at a time (an exclusive unit goes to a worker only while no other worker has one unfinished, while the
    other units fill the other workers), and the light workers taking light units from the queue's end."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False  # the workers sorted the collection already
        self._groups: dict[str, str] | None = None
        self._exclusive: set[str] = set()
        self._light: set[str] = set()
        self._unserved: set[str] = set()
        self._light_from = self.numnodes - min(light_workers(), self.numnodes - 1)

    def _load(self) -> dict[str, str]:
        if self._groups is None:  # first asked once every worker collected, so the file is there
            written = json.loads((shared.folder() / GROUPS_FILE).read_text())
            self._groups, self._exclusive = written["groups"], set(written["exclusive"])
            self._light, self._unserved = set(written["light"]), set(written["unserved"])
        return self._groups

    def _is_light_worker(self, node: Any) -> bool:
        return int(str(node.gateway.id).removeprefix("gw")) >= self._light_from

    def _split_scope(self, nodeid: str) -> str:
        return self._load().get(nodeid, nodeid)

    def _exclusive_elsewhere(self, node: Any) -> bool:
        return any(
            scope in self._exclusive and not all(done.values())
            for other, work in self.assigned_work.items()
            if other is not node
            for scope, done in work.items()
        )

    def _assign_work_unit(self, node: Any) -> None:
        self._load()
        if self._is_light_worker(node):
            shortest = next((scope for scope in reversed(self.workqueue) if scope in self._light), None)
            if shortest is None:
                shortest = next((scope for scope in reversed(self.workqueue) if scope in self._unserved), None)
            if shortest is None:
                return  # only units served by a replica or exclusive left: this worker waits, and ends with the others
            self.workqueue.move_to_end(shortest, last=False)
        elif self._exclusive_elsewhere(node):
            other_unit = next((scope for scope in self.workqueue if scope not in self._exclusive), None)
            if other_unit is None:
                return  # only exclusive units left: this worker waits for the other's to finish
            self.workqueue.move_to_end(other_unit, last=False)
        super()._assign_work_unit(node)

    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
        super().mark_test_complete(node, item_index, duration)
        for other in self.nodes:  # an exclusive unit may have just finished: a waiting worker may take the next
            # A worker that replaces one that died has not sent its collection yet: it is given work once it has.
            ready = other in self.registered_collections
            if other is not node and ready and self.workqueue and not other.shutting_down:
                if self._pending_of(self.assigned_work.get(other, {})) <= 2:
                    self._assign_work_unit(other)
