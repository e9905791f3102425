"""Admission policy: which queued runs start now, and where each of the others stands and why.

Pure functions over the queue, the usage and the quotas, so the policy is tested in bulk without processes; the
launcher derives the queue and the usage from the event log and the ledger, and applies the decision.

- **Quotas**: a team may hold at most its quota of each resource (GPUs, CPUs for CPU runs, sandboxes) at once.
- **Fair share across teams**: weighted dominant-resource fairness. A team's dominant share is the largest of its
  shares of the cluster's GPUs, CPUs and sandboxes, divided by its weight; the team with the smallest goes next.
  So with equal demands a team of weight 2 holds twice what a team of weight 1 holds while both wait.
- **Within a team**: ``PRIORITY`` (high, normal, low), then submission order. A team's runs start in that order: a run
  that does not fit holds back the team's later runs, so a large run is never starved by its team's small ones.
- **Across teams**: when the team whose turn it is cannot start its next run for lack of free capacity, no team
  further ahead of its share starts one either: what frees up goes to it (no starvation of a large run by others'
  small ones, at the price of capacity left idle until enough has freed). A team held back by its own quota, or whose
  run no cluster could hold, holds back no one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from runctl.config.models import RunConfig, TrainConfig
from services.launcher.settings import LauncherSettings

RESOURCES = ("gpus", "cpus", "sandboxes")
PRIORITIES = {"high": 2, "normal": 1, "low": 0}
_NAMES = {"gpus": "GPUs", "cpus": "CPUs", "sandboxes": "sandboxes"}


@dataclass(frozen=True)
class Resources:
    gpus: float = 0.0
    cpus: float = 0.0
    sandboxes: float = 0.0

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.gpus + other.gpus, self.cpus + other.cpus, self.sandboxes + other.sandboxes)

    def __sub__(self, other: Resources) -> Resources:
        return Resources(self.gpus - other.gpus, self.cpus - other.cpus, self.sandboxes - other.sandboxes)

    def as_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in RESOURCES}

    def over(self, limit: Resources) -> str | None:
        """The first resource of which this is more than ``limit``, or None when it fits."""
        for name in RESOURCES:
            if getattr(self, name) > getattr(limit, name) + 1e-9:
                return name
        return None


def total(amounts: Iterable[Resources]) -> Resources:
    out = Resources()
    for amount in amounts:
        out = out + amount
    return out


@dataclass(frozen=True)
class TeamQuota:
    limit: Resources
    """The most the team may hold at once."""
    weight: float = 1.0
    """Its share of the cluster against other teams' when all want more than there is."""


@dataclass(frozen=True)
class QueuedRun:
    run_id: str
    team: str
    demand: Resources
    priority: int = PRIORITIES["normal"]
    seq: float = 0
    """Submission order (the position of its config.validated in the event log)."""


@dataclass(frozen=True)
class Waiting:
    position: int
    """0: the next run to start when capacity allows; counted across all teams in fair-share order."""
    reason: str


@dataclass
class Decision:
    admitted: list[QueuedRun] = field(default_factory=list)
    """Runs to start now, in the order they were chosen."""
    waiting: dict[str, Waiting] = field(default_factory=dict)
    """By run id: every queued run not admitted."""


def dominant_share(used: Resources, capacity: Resources, weight: float) -> float:
    """The largest of a team's shares of the cluster's resources, over its weight."""
    shares = [getattr(used, r) / getattr(capacity, r) for r in RESOURCES if getattr(capacity, r) > 0]
    return max(shares, default=0.0) / max(weight, 1e-9)


def team_order(queue: Iterable[QueuedRun]) -> dict[str, list[QueuedRun]]:
    """Each team's queued runs in the order they may start: priority, then submission."""
    by_team: dict[str, list[QueuedRun]] = {}
    for run in sorted(queue, key=lambda r: (-r.priority, r.seq)):
        by_team.setdefault(run.team, []).append(run)
    return by_team


def never_fits(run: QueuedRun, quota: TeamQuota | None, capacity: Resources) -> str | None:
    """Why ``run`` can never start, with the fix (what it asks for against the team's whole quota or the whole
    cluster), or None when it could once enough is free. Such a run is refused, not queued for ever."""
    limits = [("the whole cluster has", capacity)]
    if quota is not None:
        limits.insert(0, (f"team {run.team}'s whole quota is", quota.limit))
    for what, limit in limits:
        beyond = run.demand.over(limit)
        if beyond:
            need, have = getattr(run.demand, beyond), getattr(limit, beyond)
            fix = (
                f"ask for fewer {_NAMES[beyond]}"
                if what.startswith("the whole cluster")
                else f"ask for fewer {_NAMES[beyond]}, or an admin raises the quota (`runctl team set {run.team} "
                f"--{beyond} {need:g}`)"
            )
            return f"it asks for {need:g} {_NAMES[beyond]} and {what} {have:g}: it could never start. Fix: {fix}"
    return None


def blocker(
    run: QueuedRun, used: Resources, quota: TeamQuota | None, free: Resources, capacity: Resources
) -> tuple[str, str] | None:
    """Why ``run`` cannot start now, or None: (``team``, ``never``, ``quota`` or ``cluster``, the reason with what is
    in use)."""
    if quota is None:
        return "team", f"team {run.team} has no quota on this cluster. Fix: an admin runs `runctl team add {run.team}`"
    beyond_cluster = run.demand.over(capacity)
    if beyond_cluster:
        need, have = getattr(run.demand, beyond_cluster), getattr(capacity, beyond_cluster)
        return "never", (
            f"it needs {need:g} {_NAMES[beyond_cluster]} and the whole cluster has {have:g}: it can never start. "
            "Fix: cancel it and ask for less"
        )
    beyond_quota = (used + run.demand).over(quota.limit)
    if beyond_quota:
        in_use, limit = getattr(used, beyond_quota), getattr(quota.limit, beyond_quota)
        need = getattr(run.demand, beyond_quota)
        return "quota", (
            f"team {run.team}'s {_NAMES[beyond_quota]} quota: {in_use:g} of {limit:g} in use, this run needs {need:g}"
        )
    beyond_free = run.demand.over(free)
    if beyond_free:
        in_use = getattr(capacity, beyond_free) - getattr(free, beyond_free)
        return "cluster", (
            f"the cluster's {_NAMES[beyond_free]}: {in_use:g} of {getattr(capacity, beyond_free):g} in use, this "
            f"run needs {getattr(run.demand, beyond_free):g}"
        )
    return None


class _Turns:
    """Whose turn it is: each team's runs in order, what it holds, and its weighted dominant share (kept up to date,
    as a decision over a long queue asks the question once per run)."""

    def __init__(
        self,
        queue: Sequence[QueuedRun],
        usage: Mapping[str, Resources],
        quotas: Mapping[str, TeamQuota],
        capacity: Resources,
    ) -> None:
        self.lines = team_order(queue)
        self.heads = dict.fromkeys(self.lines, 0)
        self.used = {t: usage.get(t, Resources()) for t in set(self.lines) | set(usage)}
        self.weights = {t: (quotas[t].weight if t in quotas else 1.0) for t in self.used}
        self.capacity = capacity
        self.shares = {t: dominant_share(self.used[t], capacity, self.weights[t]) for t in self.lines}

    def next(self, skip: set[str]) -> str | None:
        """The team with runs left (less ``skip``) of the smallest share, then of the earliest next run."""
        best: str | None = None
        best_key = (0.0, 0.0)
        for team, line in self.lines.items():
            head = self.heads[team]
            if head >= len(line) or team in skip:
                continue
            key = (self.shares[team], line[head].seq)
            if best is None or key < best_key:
                best, best_key = team, key
        return best

    def head(self, team: str) -> QueuedRun:
        return self.lines[team][self.heads[team]]

    def take(self, team: str) -> QueuedRun:
        run = self.head(team)
        self.heads[team] += 1
        self.used[team] = self.used[team] + run.demand
        self.shares[team] = dominant_share(self.used[team], self.capacity, self.weights[team])
        return run


def decide(
    queue: Sequence[QueuedRun],
    usage: Mapping[str, Resources],
    quotas: Mapping[str, TeamQuota],
    capacity: Resources,
) -> Decision:
    """Which of ``queue`` start now, given what each team holds (``usage``) and the cluster's ``capacity``; and for
    the others, their place in line and the reason they wait."""
    turns = _Turns(queue, usage, quotas, capacity)
    free = capacity - total(usage.values())
    held: set[str] = set()  # teams whose next run cannot start (their quota, or no cluster could hold it)
    decision = Decision()
    while (team := turns.next(held)) is not None:
        why = blocker(turns.head(team), turns.used[team], quotas.get(team), free, capacity)
        if why is None:
            run = turns.take(team)
            decision.admitted.append(run)
            free = free - run.demand
        elif why[0] == "cluster":
            break  # its turn: what frees up goes to it, not to a team further ahead of its share
        else:
            held.add(team)
    # Why each team's next run waits, as things stand once the others have started.
    reasons = {}
    for team in turns.lines:
        if turns.heads[team] < len(turns.lines[team]):
            why = blocker(turns.head(team), turns.used[team], quotas.get(team), free, capacity)
            reasons[team] = why[1] if why else "behind teams whose turn comes first (fair share)"
    # The runs left, placed in the order fair share would start them if capacity freed one run at a time.
    first = dict(turns.heads)
    position = 0
    while (team := turns.next(set())) is not None:
        at_head = turns.heads[team] == first[team]
        run = turns.take(team)
        reason = reasons[team] if at_head else f"behind team {team}'s earlier or higher-priority runs"
        decision.waiting[run.run_id] = Waiting(position, reason)
        position += 1
    return decision


UNLIMITED = Resources(math.inf, math.inf, math.inf)


def demand_of(config: RunConfig) -> Resources:
    """What a run holds while it runs: its GPUs (NNODES × NGPUS_PER_NODE), for a CPU run the CPUs of its sandboxes
    and its runner, and its sandboxes (the trials it keeps in flight: N_CONCURRENT, or AGENT_NUM_WORKERS for train)."""
    gpus = float(config.nnodes * config.ngpus_per_node)
    concurrency = config.agent_num_workers if isinstance(config, TrainConfig) else getattr(config, "n_concurrent", 1)
    cpus = 0.0 if gpus else 1.0 + concurrency * (config.sandbox_cpus or 1.0)
    return Resources(gpus, cpus, float(concurrency))


def granted(config: RunConfig) -> dict[str, float]:
    """What ``run.admitted`` says a run holds: its demand, its nodes, and a fully async train run's rollout GPUs."""
    out = {"nodes": float(config.nnodes), **demand_of(config).as_dict()}
    if isinstance(config, TrainConfig) and config.training_mode == "async":
        out["rollout_gpus"] = float((config.n_nodes_rollout or 0) * config.ngpus_per_node)
    return out


def cluster_capacity(settings: LauncherSettings) -> Resources:
    """The cluster's size, as its site says (``RUNCTL_CLUSTER_GPUS``, ``_CPUS``, ``_SANDBOXES``); a resource not
    given is not limited (the embedded stack's single user is never queued for it)."""
    return Resources(settings.cluster_gpus, settings.cluster_cpus, settings.cluster_sandboxes)
