"""The house rules as code: the import contracts in pyproject.toml hold, each one breaks (naming itself) when an import
crosses it, and the imports between services, listed here from the source, are exactly the allowed arrows."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import ROOT

LINT_IMPORTS = str(Path(sys.executable).parent / "lint-imports")
SERVICES = ("launcher", "proxy", "sandbox", "tracker", "validator")
FACE = "library"
#: service → the services whose face it may import (docs/architecture.md); the CLI may import any face, lazily.
ARROWS = {"launcher": {"proxy", "sandbox", "validator"}, "validator": {"sandbox"}}


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [LINT_IMPORTS, "--no-cache"], cwd=root, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_import_contracts_hold() -> None:
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_the_contract_contract_covers_every_module_of_runctl_but_the_cli() -> None:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c["id"] == "contract-leans-on-nothing"]
    children = {
        f"runctl.{p.stem if p.is_file() else p.name}"
        for p in (ROOT / "runctl").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
    }
    assert set(contract["source_modules"]) == children - {"runctl.cli"}


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """(module imported, line, whether at module level) for every absolute import in a file."""
    tree = ast.parse(path.read_text())
    inside_functions = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for inner in ast.walk(node)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        found += [(name, node.lineno, id(node) not in inside_functions) for name in names]
    return found


def _cross_service_imports() -> list[tuple[str, str, int, bool]]:
    """(importing file, module imported, line, module level) for each import of a service's module from outside its
    folder, in runctl and services."""
    found = []
    for path in sorted([*(ROOT / "runctl").rglob("*.py"), *(ROOT / "services").rglob("*.py")]):
        rel = path.relative_to(ROOT)
        home = rel.parts[1] if rel.parts[0] == "services" else None
        for module, line, top in _imports(path):
            parts = module.split(".")
            if parts[0] == "services" and len(parts) > 1 and parts[1] != home:
                found.append((str(rel), module, line, top))
    return found


def test_services_are_reached_only_through_their_faces_along_the_allowed_arrows() -> None:
    crossings = _cross_service_imports()
    assert crossings, "no import between services found: the walk is broken"
    problems = []
    for where, module, line, top in crossings:
        service = module.split(".")[1]
        if module != f"services.{service}.{FACE}":
            problems.append(f"{where}:{line} imports {module}, not the face services.{service}.{FACE}")
        if where.startswith("runctl/cli/"):
            if top:
                problems.append(f"{where}:{line} imports {module} at module level: the CLI imports faces lazily")
        elif where.startswith("runctl/"):
            problems.append(f"{where}:{line}: the contract imports no service")
        elif service not in ARROWS.get(where.split("/")[1], set()):
            problems.append(f"{where}:{line}: no arrow from {where.split('/')[1]} to {service}")
    assert not problems, "\n".join(problems)
    # The faces in use: the CLI reaches all five; the launcher three; the validator the sandbox's.
    assert {m for _, m, _, _ in crossings} == {f"services.{s}.{FACE}" for s in SERVICES}


def test_each_face_exports_exactly_what_others_import_from_it() -> None:
    import importlib

    used: dict[str, set[str]] = {f"services.{s}.{FACE}": set() for s in SERVICES}
    for root in ("runctl", "services", "scripts", "bench"):
        for path in (ROOT / root).rglob("*.py"):
            rel = path.relative_to(ROOT).parts
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module in used:
                    if rel[0] == "services" and rel[1] == node.module.split(".")[1]:
                        continue  # the service's own modules may use more of it
                    used[node.module] |= {alias.name for alias in node.names}
    for face, names in used.items():
        exported = set(importlib.import_module(face).__all__)
        assert exported == names, (
            f"{face}: exports {sorted(exported - names)} no one uses; {sorted(names - exported)} used"
        )


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packages, the contracts and the contract type of our own, copied where a test may break them."""
    root = tmp_path_factory.mktemp("house")
    ignore = shutil.ignore_patterns("__pycache__")
    for package in ("runctl", "services"):
        shutil.copytree(ROOT / package, root / package, ignore=ignore)
    (root / "tests" / "infra").mkdir(parents=True)
    for name in ("tests/__init__.py", "tests/infra/__init__.py", "tests/infra/faces.py", "pyproject.toml"):
        shutil.copy(ROOT / name, root / name)
    return root


@pytest.mark.parametrize(
    ("path", "trespass", "contract", "named"),
    [
        pytest.param(
            "runctl/cli/task.py",
            "def _reach_in() -> None:\n    from services.sandbox.trial import TrialRunner  # noqa\n",
            "Each service is imported from outside its folder only through its face",
            "runctl.cli.task -> services.sandbox.trial",
            id="cli-past-a-face",
        ),
        pytest.param(
            "services/validator/rules.py",
            "from services.launcher.library import eval_run_id  # noqa\n",
            "Services reach each other only along the allowed arrows",
            "services.validator.rules -> services.launcher.library",
            id="validator-to-launcher",
        ),
        pytest.param(
            "runctl/tasks.py",
            "def _reach_out() -> None:\n    from services.sandbox.library import run_task  # noqa\n",
            "The contract (runctl, but its CLI) imports no service and not the CLI",
            "runctl.tasks -> services.sandbox.library",
            id="contract-to-a-service",
        ),
        pytest.param(
            "runctl/cli/render.py",
            "def _back() -> None:\n    from runctl.cli.main import main  # noqa\n",
            "No import circle between the modules of one package",
            "No cycles are allowed in runctl.cli",
            id="circle-in-the-cli",
        ),
    ],
)
def test_an_import_across_a_contract_breaks_it_by_name(
    tree_copy: Path, path: str, trespass: str, contract: str, named: str
) -> None:
    target = tree_copy / path
    original = target.read_text()
    target.write_text(original + "\n\n" + trespass)
    try:
        result = _lint_imports(tree_copy)
    finally:
        target.write_text(original)
    out = " ".join(result.stdout.split())
    assert result.returncode == 1, out
    assert f"{contract}" in out and "BROKEN" in out
    assert named in out
