"""The broken-config corpus: each file in tests/data/configs/broken names the check it must trip.

A file is a config, or (with ``# base: NAME``) the changes to apply on top of ``good/NAME.env``. ``# expect: ID``
means a fatal result with that id; ``# expect-warn: ID`` a warning.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runctl.config import resolve_text
from runctl.errors import ConfigError
from runctl.events import CheckResult
from services.validator.library import check_config, issue_results, registered
from tests.conftest import ROOT
from tests.infra.bundles import fake_bundle

DATA = ROOT / "tests" / "data"
GOOD = sorted((DATA / "configs" / "good").glob("*.env"))
BROKEN = sorted((DATA / "configs" / "broken").glob("*.env"))
ENVIRON = {"RUNCTL_TEST_DATA": str(DATA)}


def results_for(text: str, name: str) -> list[CheckResult]:
    try:
        resolved = resolve_text(text, name, environ=ENVIRON)
    except ConfigError as e:
        return issue_results(e)
    return check_config(resolved.model)


def corpus_text(path: Path) -> tuple[str, str, str]:
    text = path.read_text()
    expectation = re.search(r"^# expect(-warn)?: (\S+)$", text, re.M)
    assert expectation, f"{path.name} names no check it must trip"
    base = re.search(r"^# base: (\S+)$", text, re.M)
    if base:
        text = (DATA / "configs" / "good" / f"{base.group(1)}.env").read_text() + text
    severity = "warn" if expectation.group(1) else "fatal"
    return text, expectation.group(2), severity


@pytest.fixture(autouse=True)
def _no_ambient_logger_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    from services.validator.rules import LOGGER_NEEDS

    monkeypatch.setenv("RUNCTL_TEAM_PATHS", "/srv/teams/{team}")  # as a shared cluster's services are set
    # The machine's agent bundles: mswea's default version only, with a prompt of about 1,300 tokens and 200 MiB of
    # memory as it starts.
    agents = tmp_path_factory.mktemp("agents")
    fake_bundle(agents, prompt="Your response must contain exactly ONE bash code block. " * 130, peak_rss_mb=200)
    monkeypatch.setenv("RUNCTL_AGENTS_DIR", str(agents))

    for needs in LOGGER_NEEDS.values():
        for name in (*needs.any_of, *(needs.free_modes or ())[:1]):
            monkeypatch.delenv(name, raising=False)


def test_logger_credentials_from_the_environment_or_a_free_mode_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    base = (DATA / "configs" / "good" / "train-dense.env").read_text()

    def verdict(loggers: str) -> str:
        results = results_for(base + f"LOGGER={loggers}\n", "run.env")
        return next(r.severity for r in results if r.id == "credentials.logger")

    assert verdict("console,swanlab,clearml") == "fatal"
    monkeypatch.setenv("SWANLAB_MODE", "local")
    monkeypatch.setenv("CLEARML_CONFIG_FILE", "/etc/clearml.conf")
    assert verdict("console,swanlab,clearml") == "ok"
    assert verdict("mlflow") == "warn"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert verdict("mlflow") == "ok"


def test_the_corpus_is_large_and_covers_every_registered_check() -> None:
    assert len(BROKEN) >= 40
    expected = {corpus_text(p)[1] for p in BROKEN}
    # verl.compose trips only when runctl and verl disagree about verl's tree, which no config can cause;
    # tests/unit/test_verl.py feeds it a bad override instead.
    # Live probes need the world (bus, tracker, ports): tests/integration/test_live_probes.py covers them.
    # Probes of the machine the run runs on (bubblewrap, the Docker daemon): tests/integration/test_sandbox_probes.py.
    static = {c.id for c in registered() if not c.live and not c.host}
    assert static - {"verl.compose"} <= expected


def _fatal(results: list[CheckResult]) -> list[CheckResult]:
    """Fatal results, less ENGINE=verl's refusal of VeOmni (not wired yet): the VeOmni GPU configs are sound for
    verl, and every other check still judges them as verl would."""
    return [
        r
        for r in results
        if r.severity == "fatal" and not (r.id == "engine.not_built" and r.message.startswith("MODEL_ENGINE=veomni"))
    ]


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.name)
def test_good_configs_have_no_fatal_result(path: Path) -> None:
    results = results_for(path.read_text(), path.name)
    assert _fatal(results) == []
    assert sum(1 for r in results if r.severity == "ok") >= 5  # the checks ran, not just skipped
    if "MODEL_ENGINE=veomni" in path.read_text():
        (refused,) = [r for r in results if r.severity == "fatal"]
        assert refused.id == "engine.not_built" and "VeOmni" in refused.message


@pytest.mark.parametrize("path", BROKEN, ids=lambda p: p.stem)
def test_each_broken_config_trips_the_check_it_names(path: Path) -> None:
    text, check_id, severity = corpus_text(path)
    results = results_for(text, path.name)
    tripped = [r for r in results if r.id == check_id and r.severity == severity]
    found = [(r.id, r.severity) for r in results if r.severity != "ok"]
    assert tripped, f"{path.name}: expected {severity} {check_id}, got {found}"
    for result in tripped:
        assert result.message and result.fix, f"{check_id} must say what happens and how to fix it"
    if severity == "warn":
        assert not _fatal(results)


@pytest.mark.parametrize(("scaffold", "severity"), [("terminal", "fatal"), ("cc", "fatal"), ("mswea", "skip")])
def test_a_parser_for_another_family_matters_only_to_scaffolds_that_read_parsed_tool_calls(
    scaffold: str, severity: str
) -> None:
    text, _, _ = corpus_text(DATA / "configs" / "broken" / "parser-for-another-family.env")
    (result,) = [r for r in results_for(text + f"SCAFFOLD={scaffold}\n", "run.env") if r.id == "model.tool_parser"]
    assert result.severity == severity, result.message
    assert f"SCAFFOLD={scaffold}" in result.message
