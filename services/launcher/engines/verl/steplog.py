"""verl's step metrics as runctl's ``step.done``: its file logger's JSON lines, read while they are written.

With ``trainer.logger`` naming ``file`` and ``VERL_FILE_LOGGER_PATH`` set, verl's driver writes one line per step,
``{"step": N, "data": {metric: value}}``, unbuffered. The reader takes whole lines only (a line still being written
waits for the next poll), keeps the numbers (verl also logs lists and strings on some steps), and yields each step
once: a step at or below the highest one already published is skipped. verl opens the file with ``"wb"``, so a
resumed trainer truncates it and starts again from the step after its checkpoint: the reader sees the file shrink, or
its first line change, and reads it again from the start; the steps it had published are skipped, the new ones taken.
A step redone after a resume keeps the figures first published for it (an event, once on the bus, is not changed).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

_HEAD = 256


class StepLog:
    """Tails one verl file-logger file. ``last_step``: the highest step already published (saved by the runner)."""

    def __init__(self, path: Path, last_step: int = 0) -> None:
        self.path = path
        self.last_step = last_step
        self._offset = 0
        self._head = b""
        self._partial = b""

    def poll(self) -> Iterator[tuple[int, dict[str, float]]]:
        """The steps written since the last poll, each as (step, metrics), in the order verl wrote them."""
        try:
            with self.path.open("rb") as f:
                head = f.read(_HEAD)
                size = f.seek(0, 2)
                same_file = head[: len(self._head)] == self._head
                if size < self._offset or not same_file:
                    self._offset, self._partial = 0, b""  # truncated and rewritten: a resumed trainer
                self._head = head
                f.seek(self._offset)
                chunk = f.read(size - self._offset)
        except FileNotFoundError:
            return
        self._offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            parsed = _parse(line)
            if parsed is None or parsed[0] <= self.last_step:
                continue
            self.last_step = parsed[0]
            yield parsed


def _parse(line: bytes) -> tuple[int, dict[str, float]] | None:
    try:
        record: Any = orjson.loads(line)
        step = int(record["step"])
        data = record["data"]
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    return step, numbers(data)


def numbers(data: dict[str, Any]) -> dict[str, float]:
    """The scalar figures of one step (booleans and NaN kept as floats; lists, strings and nulls left out)."""
    kept: dict[str, float] = {}
    for key, value in data.items():
        if isinstance(value, bool | int | float):
            kept[str(key)] = float(value)
        elif isinstance(value, list) and len(value) == 1 and isinstance(value[0], int | float):
            kept[str(key)] = float(value[0])  # a numpy scalar array, as orjson writes one
    return kept
