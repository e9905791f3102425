"""Scores of infer and eval runs: pass rates per task, unbiased pass@k, Wilson intervals, the difficulty filter.

A trial *passes* when its reward is at least ``PASS_THRESHOLD`` (rewards are 0/1 for most verifiers; a partial
reward counts towards the mean reward, not as a pass). A trial without a valid reward (the verifier failed, the
sandbox never started) is neither a pass nor a fail: it is reported as an error and left out of the rates, so an
infrastructure fault never makes a task look hard.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from runctl.layout import PASS_THRESHOLD

Z_95 = 1.959963984540054
Bucket = Literal["all-pass", "partial", "all-fail", "no-result"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k from ``n`` samples with ``c`` passes: 1 - C(n-c, k) / C(n, k).

    Raises:
        ValueError: k is not between 1 and n, or c is not between 0 and n.
    """
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n (n={n})")
    if not 0 <= c <= n:
        raise ValueError(f"{c} passes out of {n} samples is impossible")
    if n - c < k:
        return 1.0
    # The product form: no huge binomials.
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def wilson(successes: float, n: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95 % by default); (0, 1) when there is no sample."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class TaskScore:
    """One task's trials."""

    task_id: str
    rewards: list[float] = field(default_factory=list)
    errors: int = 0
    reasons: dict[str, int] = field(default_factory=dict)

    @property
    def completed(self) -> int:
        return len(self.rewards)

    @property
    def passes(self) -> int:
        return sum(1 for r in self.rewards if r >= PASS_THRESHOLD)

    @property
    def pass_rate(self) -> float | None:
        return self.passes / self.completed if self.completed else None

    @property
    def mean_reward(self) -> float | None:
        return sum(self.rewards) / self.completed if self.completed else None

    @property
    def bucket(self) -> Bucket:
        rate = self.pass_rate
        if rate is None:
            return "no-result"
        return "all-pass" if rate == 1.0 else "all-fail" if rate == 0.0 else "partial"


def task_scores(trials: Iterable[dict[str, Any]], task_ids: Sequence[str]) -> list[TaskScore]:
    """Per-task scores, in ``task_ids`` order, from trial records (``task``, ``reward``, ``termination_reason``)."""
    scores = {task_id: TaskScore(task_id) for task_id in task_ids}
    for trial in trials:
        score = scores.setdefault(trial["task"], TaskScore(trial["task"]))
        reason = str(trial.get("termination_reason", "error"))
        score.reasons[reason] = score.reasons.get(reason, 0) + 1
        if trial.get("reward") is None:
            score.errors += 1
        else:
            score.rewards.append(float(trial["reward"]))
    return list(scores.values())


def keep(score: TaskScore, low: float, high: float) -> bool:
    """The difficulty filter: a pass rate strictly inside (low, high)."""
    rate = score.pass_rate
    return rate is not None and low < rate < high


def distribution(scores: Sequence[TaskScore]) -> dict[str, int]:
    found = {"all-pass": 0, "partial": 0, "all-fail": 0, "no-result": 0}
    for score in scores:
        found[score.bucket] += 1
    return found


def pass_at_ks(scores: Sequence[TaskScore], n: int) -> dict[str, float]:
    """pass@k for k = 1, 2, 4, … up to ``n``, averaged over tasks that completed ``n`` trials."""
    full = [s for s in scores if s.completed >= n]
    if not full:
        return {}
    ks = sorted({1, n, *(2**i for i in range(1, n.bit_length()) if 2**i <= n)})
    return {f"pass@{k}": round(sum(pass_at_k(s.completed, s.passes, k) for s in full) / len(full), 6) for k in ks}


def overall(scores: Sequence[TaskScore], n_trials: int) -> dict[str, Any]:
    """The run's figures: trials, passes, pass@1 with its 95 % Wilson interval, pass@k, the distribution."""
    completed = sum(s.completed for s in scores)
    passes = sum(s.passes for s in scores)
    rewards = [r for s in scores for r in s.rewards]
    low, high = wilson(passes, completed)
    figures: dict[str, Any] = {
        "tasks": len(scores),
        "trials": completed + sum(s.errors for s in scores),
        "completed": completed,
        "errors": sum(s.errors for s in scores),
        "passes": passes,
        "pass@1": round(passes / completed, 6) if completed else None,
        "pass@1_ci95": [round(low, 6), round(high, 6)],
        "mean_reward": round(sum(rewards) / len(rewards), 6) if rewards else None,
        "distribution": distribution(scores),
    }
    figures.update(pass_at_ks(scores, n_trials))
    return figures


SUMMARY_COLUMNS = (
    "task_id",
    "completed",
    "passes",
    "fails",
    "errors",
    "pass_rate",
    "mean_reward",
    "rewards",
    "bucket",
    "kept",
)


def write_summary_csv(path: Path, scores: Sequence[TaskScore], kept: set[str]) -> None:
    """``summary.csv``: one row per task."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_suffix(".tmp")
    with temp.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(SUMMARY_COLUMNS)
        for s in scores:
            rate, mean = s.pass_rate, s.mean_reward
            writer.writerow(
                [
                    s.task_id,
                    s.completed,
                    s.passes,
                    s.completed - s.passes,
                    s.errors,
                    "" if rate is None else f"{rate:.6g}",
                    "" if mean is None else f"{mean:.6g}",
                    " ".join(f"{r:g}" for r in s.rewards),
                    s.bucket,
                    int(s.task_id in kept),
                ]
            )
    temp.replace(path)
