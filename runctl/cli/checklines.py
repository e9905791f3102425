"""Check results as lines of text: ``✓ id (class N) message``, a ``fix:`` line under warnings and fatals, and a
summary. Plain ANSI colours, only on a terminal and only without ``NO_COLOR``: `runctl validate` prints this on
its fast path, where importing a rich console would cost more than all the checks together.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import IO, Protocol

_CODES = {"green": "32", "yellow": "33", "red": "31", "dim": "2", "bold": "1"}
MARKS = {"ok": ("✓", "green"), "warn": ("⚠", "yellow"), "fatal": ("✗", "red"), "skip": ("⊘", "dim")}


class CheckLine(Protocol):
    id: str
    check_class: int
    severity: str
    message: str
    fix: str


def colours_on(stream: IO[str]) -> bool:
    return stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def render(results: Sequence[CheckLine], colour: bool) -> tuple[str, int]:
    """The text for these results, and how many are fatal."""

    def paint(text: str, style: str) -> str:
        return f"\x1b[{_CODES[style]}m{text}\x1b[0m" if colour else text

    lines = []
    for r in results:
        mark, style = MARKS[r.severity]
        lines.append(
            f"{paint(mark, style)} {paint(r.id, 'bold')} {paint(f'(class {r.check_class})', 'dim')} {r.message}"
        )
        if r.fix and r.severity in ("warn", "fatal"):
            lines.append(f"    {paint('fix:', 'dim')} {r.fix}")
    tally = {s: sum(1 for r in results if r.severity == s) for s in MARKS}
    summary = paint(_plural(tally["fatal"], "fatal problem"), "red" if tally["fatal"] else "green")
    lines.append(f"{summary} ({tally['ok']} ok, {_plural(tally['warn'], 'warning')}, {tally['skip']} skipped)")
    return "\n".join(lines) + "\n", tally["fatal"]
