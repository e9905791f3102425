"""The services' typed settings: the only place a service reads its environment, each setting documented, and a
value a setting cannot take refused at start-up with the variable named."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runctl.settings import ServiceSettings, SettingsError
from services.launcher.settings import LauncherSettings
from services.sandbox.settings import SandboxSettings
from services.tracker.settings import TrackerSettings
from tests.conftest import ROOT


def _reads_of_the_environment(tree: ast.AST) -> list[int]:
    """Lines that read a value out of ``os.environ`` (get, getenv, pop, a subscript, ``in``); passing the whole
    environment on (``{**os.environ}``, ``.items()``, ``.copy()``) and writing to it are not reads of a setting."""

    def is_environ(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ" and ast.unparse(node.value) == "os"

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if is_environ(node.func.value) and node.func.attr in {"get", "pop"}:
                lines.append(node.lineno)
            elif node.func.attr == "getenv" and ast.unparse(node.func.value) == "os":
                lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and is_environ(node.value) and isinstance(node.ctx, ast.Load):
            lines.append(node.lineno)
        elif isinstance(node, ast.Compare) and any(is_environ(c) for c in node.comparators):
            lines.append(node.lineno)
    return lines


def test_the_walk_finds_each_kind_of_read() -> None:
    source = "import os\na = os.environ.get('A')\nb = os.getenv('B')\nc = os.environ['C']\nd = 'D' in os.environ\n"
    source += "e = {**os.environ}\nos.environ['F'] = '1'\ng = dict(os.environ.items())\nh = os.environ.pop('H', '')\n"
    assert _reads_of_the_environment(ast.parse(source)) == [2, 3, 4, 5, 9]


def test_no_service_reads_a_setting_outside_its_settings_module() -> None:
    found = []
    # The drivers that run inside the sandbox on an agent bundle's Python: the agent's environment, not runctl's.
    in_sandbox = {"mswea_run.py", "ohsdk_run.py"}
    for path in sorted((ROOT / "services").rglob("*.py")):
        if path.name == "settings.py" or path.name in in_sandbox:
            continue
        found += [f"{path.relative_to(ROOT)}:{line}" for line in _reads_of_the_environment(ast.parse(path.read_text()))]
    assert not found, "read these through the service's settings model (services/<svc>/settings.py): " + ", ".join(
        found
    )


def _documented_models() -> list[tuple[str, str, str]]:
    """scripts/gen_docs.py's list of the settings models whose tables it writes into docs/services.md."""
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    gen_docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_docs)
    return list(gen_docs.SETTINGS)


def test_each_service_has_one_settings_model_with_every_field_documented() -> None:
    services = {p.parent.name for p in (ROOT / "services").glob("*/settings.py")}
    documented = _documented_models()
    assert services == {service for service, _, _ in documented}
    assert services == {"launcher", "proxy", "sandbox", "tracker", "validator"}
    for _, module, name in documented:
        model = getattr(importlib.import_module(module), name)
        assert issubclass(model, ServiceSettings)
        for variable, _, doc in model.documented():
            assert doc, f"{name}: {variable} has no docstring under its field"


def test_values_are_typed_and_an_empty_variable_is_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNCTL_SANDBOX_CAPS", "nlp=8, vision = 4")
    monkeypatch.setenv("RUNCTL_SANDBOX_BACKENDS", "local, kubernetes")
    monkeypatch.setenv("RUNCTL_TRACKER_PORT", "")
    monkeypatch.setenv("RUNCTL_CLUSTER_GPUS", "16")
    sandbox = SandboxSettings.from_env()
    assert sandbox.caps == {"nlp": 8, "vision": 4} and sandbox.cap_of("nlp") == 8 and sandbox.cap_of("other") == 64
    assert sandbox.backends == ["local", "kubernetes"]
    assert TrackerSettings.from_env().port == 8750
    launcher = LauncherSettings.from_env()
    assert launcher.cluster_gpus == 16 and launcher.cluster_cpus == float("inf")


@pytest.mark.parametrize(
    ("variable", "value", "model"),
    [
        ("RUNCTL_SANDBOX_WARM", "-1", SandboxSettings),
        ("RUNCTL_SANDBOX_CAPS", "nlp", SandboxSettings),
        ("RUNCTL_MAX_EVALS_IN_FLIGHT", "two", LauncherSettings),
        ("RUNCTL_TRACKER_PORT", "99999", TrackerSettings),
    ],
)
def test_a_value_a_setting_cannot_take_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, model: type[ServiceSettings]
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as refused:
        model.from_env()
    assert f"{variable}={value!r}" in refused.value.message and "Fix:" in refused.value.message


def test_a_service_with_a_bad_setting_stops_at_once_saying_which(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RUNCTL_HOME": str(tmp_path), "RUNCTL_SANDBOX_WARM": "lots"}
    env["RUNCTL_NATS_URL"] = "nats://127.0.0.1:9"  # nothing listens: it must not get as far as connecting
    result = subprocess.run(
        [sys.executable, "-m", "services.sandbox"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 1
    assert "sandbox cannot start: SettingsError:" in result.stderr and "RUNCTL_SANDBOX_WARM='lots'" in result.stderr
    assert "Traceback" not in result.stderr
