"""Prometheus text exposition for every service: counters, values read at scrape time, and latency histograms.

Plain dictionaries keyed by label values: an increment on the request path is one dictionary update.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from typing import TypeVar

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


def _labels(names: tuple[str, ...], values: tuple[str, ...], extra: str = "") -> str:
    pairs = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        pairs.append(extra)
    return "{" + ",".join(pairs) + "}" if pairs else ""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Counter:
    def __init__(self, name: str, help_: str, labels: tuple[str, ...] = ()) -> None:
        self.name, self.help, self.labels = name, help_, labels
        self.values: dict[tuple[str, ...], float] = {}

    def inc(self, *values: str, by: float = 1.0) -> None:
        self.values[values] = self.values.get(values, 0.0) + by

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}\n# TYPE {self.name} counter\n"
        for values, v in self.values.items():
            yield f"{self.name}{_labels(self.labels, values)} {v:g}\n"


class Gauge:
    """Read when scraped: ``read`` returns {label values: value}. ``kind="counter"`` for a count kept elsewhere."""

    def __init__(
        self,
        name: str,
        help_: str,
        labels: tuple[str, ...],
        read: Callable[[], dict[tuple[str, ...], float]],
        kind: str = "gauge",
    ) -> None:
        self.name, self.help, self.labels, self.read, self.kind = name, help_, labels, read, kind

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}\n# TYPE {self.name} {self.kind}\n"
        for values, v in self.read().items():
            yield f"{self.name}{_labels(self.labels, values)} {v:g}\n"


class Histogram:
    def __init__(
        self, name: str, help_: str, labels: tuple[str, ...] = (), buckets: tuple[float, ...] = LATENCY_BUCKETS
    ) -> None:
        self.name, self.help, self.labels, self.buckets = name, help_, labels, buckets
        self.series: dict[tuple[str, ...], list[float]] = {}  # bucket counts..., +Inf count, sum

    def observe(self, value: float, *values: str) -> None:
        series = self.series.get(values)
        if series is None:
            series = self.series[values] = [0.0] * (len(self.buckets) + 2)
        series[bisect.bisect_left(self.buckets, value)] += 1
        series[-1] += value

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}\n# TYPE {self.name} histogram\n"
        for values, series in self.series.items():
            running = 0.0
            for bound, count in zip(self.buckets, series, strict=False):
                running += count
                le = f'le="{bound:g}"'
                yield f"{self.name}_bucket{_labels(self.labels, values, le)} {running:g}\n"
            running += series[len(self.buckets)]
            inf = 'le="+Inf"'
            yield f"{self.name}_bucket{_labels(self.labels, values, inf)} {running:g}\n"
            yield f"{self.name}_sum{_labels(self.labels, values)} {series[-1]:.6f}\n"
            yield f"{self.name}_count{_labels(self.labels, values)} {running:g}\n"


M = TypeVar("M", Counter, Gauge, Histogram)


class Registry:
    def __init__(self) -> None:
        self.metrics: list[Counter | Gauge | Histogram] = []

    def add(self, metric: M) -> M:
        self.metrics.append(metric)
        return metric

    def render(self) -> bytes:
        return "".join(line for m in self.metrics for line in m.render()).encode()
