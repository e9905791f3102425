"""Scores of infer and eval runs: pass@k, Wilson intervals, the filter, summary.csv, the filtered index."""

from __future__ import annotations

import csv
import itertools
import random
from pathlib import Path

import pytest

from runctl.tasks import load_index
from services.launcher.engines.local import write_index
from services.launcher.rollout import scores


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    """The share of k-subsets of the n samples that hold at least one pass."""
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(1 for s in subsets if any(samples[i] for i in s)) / len(subsets)


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(1, 9)
        c, k = rng.randint(0, n), rng.randint(1, n)
        assert scores.pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k))
    assert scores.pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert scores.pass_at_k(4, 1, 1) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="k <= n"):
        scores.pass_at_k(2, 1, 3)


def test_wilson_interval_matches_known_values() -> None:
    low, high = scores.wilson(7, 12)
    assert (round(low, 4), round(high, 4)) == (0.3195, 0.8067)
    assert scores.wilson(0, 10) == (0.0, pytest.approx(0.2775, abs=1e-4))
    assert scores.wilson(10, 10) == (pytest.approx(0.7225, abs=1e-4), pytest.approx(1.0))
    assert scores.wilson(0, 0) == (0.0, 1.0)
    # The interval always holds the estimate and narrows with more samples.
    for n in (5, 50, 500):
        low, high = scores.wilson(0.3 * n, n)
        assert low < 0.3 < high
    few, many = scores.wilson(3, 10), scores.wilson(300, 1000)
    assert few[1] - few[0] > many[1] - many[0]


def trials(outcomes: dict[str, list[float | None]]) -> list[dict[str, object]]:
    return [
        {"task": task, "trial": i, "reward": r, "termination_reason": "agent_completed" if r is not None else "error"}
        for task, rewards in outcomes.items()
        for i, r in enumerate(rewards)
    ]


def test_buckets_filter_and_figures() -> None:
    outcomes = {"easy": [1.0, 1.0, 1.0, 1.0], "mid": [1.0, 0.0, 1.0, 0.0], "hard": [0.0] * 4, "broken": [None, None]}
    per_task = scores.task_scores(trials(outcomes), list(outcomes))
    assert [s.bucket for s in per_task] == ["all-pass", "partial", "all-fail", "no-result"]
    assert [s.task_id for s in per_task if scores.keep(s, 0.0, 1.0)] == ["mid"]
    assert [s.task_id for s in per_task if scores.keep(s, 0.0, 0.4)] == []
    figures = scores.overall(per_task, 4)
    assert figures["trials"] == 14 and figures["completed"] == 12 and figures["errors"] == 2
    assert figures["passes"] == 6 and figures["pass@1"] == pytest.approx(0.5)
    assert figures["pass@1_ci95"] == [pytest.approx(v, abs=1e-6) for v in scores.wilson(6, 12)]
    # pass@k averages over tasks with all n samples: (1 + (1 - C(2,2)/C(4,2)) + 0) / 3.
    assert figures["pass@2"] == pytest.approx((1 + (1 - 1 / 6) + 0) / 3)
    assert figures["pass@4"] == pytest.approx(2 / 3)
    assert figures["distribution"] == {"all-pass": 1, "partial": 1, "all-fail": 1, "no-result": 1}


def test_a_partial_reward_counts_in_the_mean_not_as_a_pass() -> None:
    (score,) = scores.task_scores(trials({"t": [0.5, 1.0]}), ["t"])
    assert score.passes == 1 and score.mean_reward == 0.75 and score.pass_rate == 0.5


def test_summary_csv_rows(tmp_path: Path) -> None:
    per_task = scores.task_scores(trials({"a": [1.0, 0.0], "b": [0.0, 0.0]}), ["a", "b"])
    path = tmp_path / "summary.csv"
    scores.write_summary_csv(path, per_task, {"a"})
    rows = list(csv.DictReader(path.read_text().splitlines()))
    assert rows[0] == {
        "task_id": "a",
        "completed": "2",
        "passes": "1",
        "fails": "1",
        "errors": "0",
        "pass_rate": "0.5",
        "mean_reward": "0.5",
        "rewards": "1 0",
        "bucket": "partial",
        "kept": "1",
    }
    assert rows[1]["bucket"] == "all-fail" and rows[1]["kept"] == "0"


def test_the_filtered_index_keeps_the_row_format(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folders = []
    for name in ("one", "two"):
        folder = tmp_path / "tasks" / name
        (folder / "tests").mkdir(parents=True)
        (folder / "task.toml").write_text('version = "1.0"\n')
        (folder / "instruction.md").write_text("do it\n")
        (folder / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
        folders.append(folder)
    source = tmp_path / "index.parquet"
    pq.write_table(
        pa.Table.from_pylist([{"task_path": f"tasks/{f.name}", "task_id": f.name, "split": "x"} for f in folders]),
        source,
    )
    entries = load_index(source).entries
    out = tmp_path / "kept.parquet"
    write_index(out, [e for e in entries if e.task_id == "two"])
    again = load_index(out)
    assert [(e.task_id, e.task_path, e.extra) for e in again.entries] == [
        ("two", (tmp_path / "tasks" / "two").resolve(), {"split": "x"})
    ]
    assert set(pq.read_table(out).column_names) == {"task_id", "task_path", "split"}
    empty = tmp_path / "none.parquet"
    write_index(empty, [])
    assert pq.read_table(empty).num_rows == 0
