"""The attack suite's tally: every test under ``tests/security/`` performs one attack against a real component and
passes only when the attack was refused and the victim left as it was. This plugin (registered by
tests/conftest.py in the process that receives every report) counts them and prints, at the end of the run,
``N of N attacks refused`` — or how many got through, and which.
"""

from __future__ import annotations

import pytest

SUITE = "tests/security/"


class Attacks:
    def __init__(self) -> None:
        self.refused: list[str] = []
        self.through: list[str] = []
        self.skipped: list[str] = []

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not report.nodeid.startswith(SUITE):
            return
        if report.when == "call" and report.passed:
            self.refused.append(report.nodeid)
        elif report.failed:
            self.through.append(report.nodeid)
        elif report.skipped:
            self.skipped.append(report.nodeid)

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        attacks = len(self.refused) + len(self.through)
        if not attacks and not self.skipped:
            return
        line = f"{len(self.refused)} of {attacks} attacks refused"
        if self.skipped:
            line += f" ({len(self.skipped)} not tried here: their component is missing)"
        terminalreporter.write_line(line, red=bool(self.through), green=not self.through, bold=True)
        for nodeid in self.through:
            terminalreporter.write_line(f"  got through: {nodeid}", red=True)


def register(config: pytest.Config) -> None:
    config.pluginmanager.register(Attacks(), "runctl-attacks")
