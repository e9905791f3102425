"""Benchmark of the launcher's admission policy (``services/launcher/admission.py``): the time of one decision over
a long queue, and how the cluster is shared among teams of different weights while all of them wait.

Run as ``python bench/admission.py`` from the repository root (with the project's virtualenv active). Nothing is
started: the policy is pure, so the benchmark replays a cluster in simulated time.

1,000 runs from 10 teams (100 each; weights 1, 1, 2, 2, 3, 3, 4, 5, 8, 10) are queued at once on a cluster of 256
GPUs, 256 CPUs and 2,048 sandboxes; each team's quota is the whole cluster, so only fair share divides it. A run asks
for 1, 2, 4 or 8 GPUs and 4 to 32 sandboxes and lasts 1 to 10 simulated hours (all drawn from a fixed seed). The
policy decides; the runs it admits start; when the next one ends its resources return and the policy decides again
on everything still queued, until the queue is empty. Each decision's wall time is measured.

The same replay runs with a first-in-first-out baseline (admit in submission order while the run fits), measured in
the same process: its decision time is the floor the fair-share policy's is compared with (ratio), and its shares
show what the teams would get without fair share.

Share: each team's time-integral of its dominant share of the cluster (the larger of its GPU and sandbox shares)
while every team still had runs queued, as a fraction of all teams' integral; against its weight's fraction of the
total weight; and the cluster's GPU use over the same time, the price of keeping freed GPUs for the team whose turn
it is. A team's share can only move in steps of its runs' sizes: on a cluster a few runs wide, the light teams'
smallest runs already exceed their fair share (try ``--gpus 64``). Exit status 0 unless the benchmark itself fails.
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence

from services.launcher.admission import (
    Decision,
    QueuedRun,
    Resources,
    TeamQuota,
    decide,
    dominant_share,
    total,
)

WEIGHTS = (1, 1, 2, 2, 3, 3, 4, 5, 8, 10)
P99_TARGET_S = 0.05  # one decision over the whole queue, well inside the launcher's reaction time
SHARE_TARGET = (0.75, 1.5)  # each team's share over its weight's, while every team waits
CLUSTER = Resources(gpus=256, cpus=256, sandboxes=2048)
GPU_TIME = "__gpus__"
Policy = Callable[[Sequence[QueuedRun], Mapping[str, Resources], Mapping[str, TeamQuota], Resources], Decision]


def fifo(
    queue: Sequence[QueuedRun], usage: Mapping[str, Resources], quotas: Mapping[str, TeamQuota], capacity: Resources
) -> Decision:
    """The baseline: submission order, each run admitted if it fits what is free (no fair share, no places)."""
    free = capacity - total(usage.values())
    decision = Decision()
    for run in sorted(queue, key=lambda r: r.seq):
        if run.demand.over(free) is None:
            decision.admitted.append(run)
            free = free - run.demand
    return decision


def workload(runs_per_team: int, seed: int) -> tuple[list[QueuedRun], dict[str, float]]:
    rng = random.Random(seed)
    queue: list[QueuedRun] = []
    hours: dict[str, float] = {}
    for i in range(runs_per_team * len(WEIGHTS)):
        team = f"team{i % len(WEIGHTS)}"
        demand = Resources(gpus=rng.choice((1, 2, 4, 8)), cpus=0, sandboxes=rng.randint(4, 32))
        run = QueuedRun(f"run{i:04d}", team, demand, rng.choice((0, 1, 1, 2)), i)
        queue.append(run)
        hours[run.run_id] = rng.uniform(1, 10)
    return queue, hours


def replay(policy: Policy, runs_per_team: int, seed: int, cluster: Resources) -> tuple[list[float], dict[str, float]]:
    """(each decision's seconds, each team's integral of dominant share while all teams waited)."""
    queue, hours = workload(runs_per_team, seed)
    quotas = {f"team{i}": TeamQuota(cluster, weight=w) for i, w in enumerate(WEIGHTS)}
    usage: dict[str, Resources] = {}
    running: list[tuple[float, str, QueuedRun]] = []
    waiting = {r.run_id: r for r in queue}
    share_time = dict.fromkeys(quotas, 0.0)
    timings: list[float] = []
    now = 0.0
    while waiting or running:
        started = time.perf_counter()
        decision = policy(list(waiting.values()), usage, quotas, cluster)
        timings.append(time.perf_counter() - started)
        for run in decision.admitted:
            del waiting[run.run_id]
            usage[run.team] = usage.get(run.team, Resources()) + run.demand
            heapq.heappush(running, (now + hours[run.run_id], run.run_id, run))
        if not running:
            raise RuntimeError(f"{len(waiting)} runs wait and none runs: the policy admits nothing")
        end, _, done = heapq.heappop(running)
        if {r.team for r in waiting.values()} == set(quotas):  # every team still waiting: contention
            for team in quotas:
                share_time[team] += dominant_share(usage.get(team, Resources()), cluster, 1.0) * (end - now)
            share_time[GPU_TIME] = share_time.get(GPU_TIME, 0.0) + total(usage.values()).gpus / cluster.gpus * (
                end - now
            )
            share_time["__span__"] = share_time.get("__span__", 0.0) + end - now
        now = end
        usage[done.team] = usage[done.team] - done.demand
    return timings, share_time


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs-per-team", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--gpus", type=int, default=int(CLUSTER.gpus))
    args = parser.parse_args()
    cluster = Resources(gpus=args.gpus, cpus=CLUSTER.cpus, sandboxes=args.gpus * 8)
    print(f"{args.runs_per_team * len(WEIGHTS)} queued runs, {len(WEIGHTS)} teams, weights {WEIGHTS}")
    print(f"cluster: {cluster.gpus:g} GPUs, {cluster.sandboxes:g} sandboxes")
    policies: tuple[tuple[str, Policy], ...] = (("fifo", fifo), ("drf", decide))
    results = {name: replay(policy, args.runs_per_team, args.seed, cluster) for name, policy in policies}
    for name, (timings, _) in results.items():
        print(
            f"{name:5s} {len(timings)} decisions: p50 {statistics.median(timings) * 1e3:.2f} ms, "
            f"p99 {percentile(timings, 0.99) * 1e3:.2f} ms, max {max(timings) * 1e3:.2f} ms"
        )
    drf_p50, fifo_p50 = statistics.median(results["drf"][0]), statistics.median(results["fifo"][0])
    print(f"decision time, fair share / FIFO baseline (p50): {drf_p50 / fifo_p50:.1f}×")
    weight_total = sum(WEIGHTS)
    drf_shares, fifo_shares = results["drf"][1], results["fifo"][1]
    for name, shares in (("fifo", fifo_shares), ("drf", drf_shares)):
        span, gpus = shares.pop("__span__"), shares.pop(GPU_TIME)
        print(f"{name:5s} GPU use while every team waited: {gpus / span:.1%} ({span:.0f} simulated hours)")
    print("team    weight  weight share  drf share  drf/weight  fifo share")
    drf_total, fifo_total = sum(drf_shares.values()), sum(fifo_shares.values())
    for i, weight in enumerate(WEIGHTS):
        team = f"team{i}"
        want = weight / weight_total
        got, fifo_got = drf_shares[team] / drf_total, fifo_shares[team] / fifo_total
        print(f"{team:7s} {weight:6d}  {want:11.1%}  {got:9.1%}  {got / want:10.2f}  {fifo_got:10.1%}")
    p99 = percentile(results["drf"][0], 0.99)
    ratios = [drf_shares[f"team{i}"] / drf_total / (w / weight_total) for i, w in enumerate(WEIGHTS)]
    low, high = SHARE_TARGET
    print("== summary")
    print(
        f"   decision p99 {p99 * 1e3:.1f} ms   target < {P99_TARGET_S * 1e3:.0f} ms   "
        f"{'met' if p99 < P99_TARGET_S else 'NOT met'}"
    )
    print(
        f"   share / weight {min(ratios):.2f}–{max(ratios):.2f}   target within {low}–{high}   "
        f"{'met' if low <= min(ratios) and max(ratios) <= high else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
