"""The admission policy in bulk: quotas, weighted dominant-resource fairness, priority, places in line."""

from __future__ import annotations

import random

import pytest

from services.launcher.admission import (
    PRIORITIES,
    QueuedRun,
    Resources,
    TeamQuota,
    Waiting,
    decide,
    dominant_share,
    total,
)

CLUSTER = Resources(gpus=12, cpus=64, sandboxes=100)


def runs(team: str, n: int, demand: Resources, start: int = 0, priority: str = "normal") -> list[QueuedRun]:
    return [QueuedRun(f"{team}-{start + i}", team, demand, PRIORITIES[priority], start + i) for i in range(n)]


def test_with_equal_demands_teams_get_the_cluster_in_proportion_to_their_weights() -> None:
    quotas = {t: TeamQuota(CLUSTER, weight=w) for t, w in (("a", 1), ("b", 2), ("c", 3))}
    one_gpu = Resources(gpus=1, sandboxes=1)
    queue = runs("a", 20, one_gpu) + runs("b", 20, one_gpu, 100) + runs("c", 20, one_gpu, 200)
    decision = decide(queue, {}, quotas, CLUSTER)
    held = {t: sum(1 for r in decision.admitted if r.team == t) for t in "abc"}
    assert held == {"a": 2, "b": 4, "c": 6}
    # Whoever is furthest below its share goes first: the next GPU freed goes to a team with the lowest weighted share.
    next_runs = sorted(decision.waiting.items(), key=lambda kv: kv[1].position)
    assert len(decision.waiting) == 60 - 12 and [w.position for _, w in next_runs] == list(range(48))


def test_dominant_resource_fairness_counts_each_teams_scarcest_resource() -> None:
    # Team a asks for GPUs, team b for sandboxes: each gets about half of what it is bound by.
    quotas = {"a": TeamQuota(CLUSTER), "b": TeamQuota(CLUSTER)}
    queue = runs("a", 30, Resources(gpus=1)) + runs("b", 300, Resources(sandboxes=10), 100)
    decision = decide(queue, {}, quotas, CLUSTER)
    used_a = total(r.demand for r in decision.admitted if r.team == "a")
    used_b = total(r.demand for r in decision.admitted if r.team == "b")
    assert used_a.gpus == 12 and used_b.sandboxes == 100  # both saturate what they need; neither blocks the other
    assert dominant_share(used_a, CLUSTER, 1) == dominant_share(used_b, CLUSTER, 1) == 1.0


def test_a_quota_is_never_exceeded_and_the_wait_names_it_with_what_is_in_use() -> None:
    quotas = {"a": TeamQuota(Resources(gpus=4, cpus=64, sandboxes=100)), "b": TeamQuota(CLUSTER)}
    queue = runs("a", 5, Resources(gpus=2))
    decision = decide(queue, {"a": Resources(gpus=1)}, quotas, CLUSTER)
    assert [r.run_id for r in decision.admitted] == ["a-0"]  # 1 + 2 = 3 ≤ 4; one more would make 5
    first = decision.waiting["a-1"]
    assert first.position == 0
    assert first.reason == "team a's GPUs quota: 3 of 4 in use, this run needs 2"
    assert decision.waiting["a-2"].reason == "behind team a's earlier or higher-priority runs"


def test_priority_orders_a_teams_runs_then_submission() -> None:
    quotas = {"a": TeamQuota(Resources(gpus=2, cpus=64, sandboxes=100))}
    queue = (
        runs("a", 2, Resources(gpus=1))
        + runs("a", 2, Resources(gpus=1), 10, "high")
        + runs("a", 1, Resources(gpus=1), 20, "low")
    )
    decision = decide(queue, {}, quotas, CLUSTER)
    assert [r.run_id for r in decision.admitted] == ["a-10", "a-11"]
    assert [decision.waiting[r].position for r in ("a-0", "a-1", "a-20")] == [0, 1, 2]


def test_freed_capacity_is_kept_for_the_team_whose_turn_it_is_so_its_large_run_is_not_starved() -> None:
    quotas = {"a": TeamQuota(CLUSTER), "b": TeamQuota(CLUSTER)}
    big, small = Resources(gpus=8), Resources(gpus=1)
    queue = [QueuedRun("a-big", "a", big, seq=1), QueuedRun("a-small", "a", small, seq=2)]
    queue += runs("b", 3, small, 10)
    decision = decide(queue, {"b": Resources(gpus=6)}, quotas, CLUSTER)
    # a holds nothing, so it is a's turn; its big run needs 8 of the 6 free GPUs. b, further ahead, does not take them.
    assert decision.admitted == []
    assert decision.waiting["a-big"] == Waiting(0, "the cluster's GPUs: 6 of 12 in use, this run needs 8")
    assert decision.waiting["a-small"].reason == "behind team a's earlier or higher-priority runs"
    assert decision.waiting["b-10"].reason == "behind teams whose turn comes first (fair share)"
    # Once 8 are free, the big run starts first.
    assert [r.run_id for r in decide(queue, {"b": Resources(gpus=4)}, quotas, CLUSTER).admitted][:1] == ["a-big"]


def test_a_team_held_by_its_own_quota_holds_back_no_other_team() -> None:
    quotas = {"a": TeamQuota(Resources(gpus=2, cpus=64, sandboxes=100)), "b": TeamQuota(CLUSTER)}
    queue = [QueuedRun("a-0", "a", Resources(gpus=4))] + runs("b", 3, Resources(gpus=1), 10)
    decision = decide(queue, {}, quotas, CLUSTER)
    assert [r.run_id for r in decision.admitted] == ["b-10", "b-11", "b-12"]
    assert decision.waiting["a-0"].reason == "team a's GPUs quota: 0 of 2 in use, this run needs 4"


def test_a_run_no_cluster_could_hold_or_of_a_team_without_quota_says_so_with_the_fix() -> None:
    decision = decide([QueuedRun("x", "a", Resources(gpus=99)), QueuedRun("y", "ghost", Resources(gpus=1), seq=1)],
                      {}, {"a": TeamQuota(CLUSTER)}, CLUSTER)  # fmt: skip
    assert decision.admitted == []
    assert "the whole cluster has 12: it can never start" in decision.waiting["x"].reason
    assert "runctl team add ghost" in decision.waiting["y"].reason


@pytest.mark.parametrize("seed", range(40))
def test_random_queues_never_exceed_a_quota_or_the_cluster_and_place_every_run_once(seed: int) -> None:
    rng = random.Random(seed)
    teams = [f"t{i}" for i in range(rng.randint(1, 6))]
    quotas = {
        t: TeamQuota(Resources(rng.randint(0, 12), rng.randint(0, 64), rng.randint(0, 100)), rng.choice((1, 2, 5)))
        for t in teams
    }
    queue = [
        QueuedRun(f"r{i}", rng.choice(teams), Resources(rng.randint(0, 4), rng.randint(0, 8), rng.randint(0, 16)),
                  rng.randint(0, 2), i)
        for i in range(rng.randint(0, 80))
    ]  # fmt: skip
    usage = {t: Resources(rng.randint(0, 2), 0, rng.randint(0, 10)) for t in teams}
    decision = decide(queue, usage, quotas, CLUSTER)
    held = {t: usage[t] + total(r.demand for r in decision.admitted if r.team == t) for t in teams}
    for team, amount in held.items():
        admitted_here = any(r.team == team for r in decision.admitted)
        assert not admitted_here or amount.over(quotas[team].limit) is None
    assert total(held.values()).over(CLUSTER) is None or not decision.admitted
    assert {r.run_id for r in decision.admitted} | set(decision.waiting) == {r.run_id for r in queue}
    assert not {r.run_id for r in decision.admitted} & set(decision.waiting)
    assert sorted(w.position for w in decision.waiting.values()) == list(range(len(decision.waiting)))
    for team in teams:  # within a team, runs start in priority then submission order
        order = [r for r in sorted(queue, key=lambda r: (-r.priority, r.seq)) if r.team == team]
        started = [r for r in order if r in decision.admitted]
        assert started == order[: len(started)]
