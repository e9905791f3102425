"""scripts/system-packages.sh, driven with stand-ins for dpkg-query, id and apt-get on the PATH (it must never
install anything on the machine running the tests): what it installs as root, what it prints otherwise."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "system-packages.sh"
DEMO = ["bubblewrap", "busybox-static", "iproute2", "iptables"]
TEST = [*DEMO, "docker.io", "postgresql", "chromium"]


def stand_ins(folder: Path) -> Path:
    folder.mkdir()
    stubs = {
        # dpkg-query -W -f='${db:Status-Status}' PACKAGE: "installed" for the packages in $INSTALLED.
        "dpkg-query": 'case " $INSTALLED " in *" $3 "*) printf installed ;; *) exit 1 ;; esac\n',
        "id": 'echo "$FAKE_UID"\n',
        "apt-get": 'echo "apt-get $*" >> "$APT_LOG"\nexit "${APT_RC:-0}"\n',
    }
    for name, body in stubs.items():
        (folder / name).write_text("#!/bin/sh\n" + body)
        (folder / name).chmod(0o755)
    return folder


def run(tmp_path: Path, purpose: str, uid: int, installed: list[str], apt_rc: int = 0) -> tuple[int, str, list[str]]:
    bin_dir = stand_ins(tmp_path / "bin")
    log = tmp_path / "apt.log"
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "INSTALLED": " ".join(installed),
        "FAKE_UID": str(uid),
        "APT_LOG": str(log),
        "APT_RC": str(apt_rc),
    }
    done = subprocess.run(["bash", str(SCRIPT), purpose], env=env, capture_output=True, text=True, timeout=60)
    calls = log.read_text().splitlines() if log.exists() else []
    return done.returncode, done.stdout + done.stderr, calls


@pytest.mark.parametrize(("purpose", "packages"), [("demo", DEMO), ("test", TEST)])
def test_as_root_it_installs_exactly_what_is_missing_after_one_update(
    tmp_path: Path, purpose: str, packages: list[str]
) -> None:
    present = packages[:1]
    code, out, calls = run(tmp_path, purpose, 0, present)
    assert code == 0, out
    assert calls == ["apt-get update -qq", f"apt-get install -y -qq {' '.join(packages[1:])}"]


def test_with_everything_installed_it_does_nothing(tmp_path: Path) -> None:
    code, out, calls = run(tmp_path, "test", 0, TEST)
    assert (code, out, calls) == (0, "", [])


def test_without_root_it_prints_the_one_install_line_and_exits_2_before_anything_else(tmp_path: Path) -> None:
    code, out, calls = run(tmp_path, "demo", 1000, ["iproute2", "iptables"])
    assert code == 2 and calls == []
    assert "  sudo apt-get install -y bubblewrap busybox-static\n" in out
    assert out.count("apt-get install") == 1


def test_a_failed_install_exits_1_naming_it(tmp_path: Path) -> None:
    code, out, _ = run(tmp_path, "demo", 0, [], apt_rc=100)
    assert code == 1 and "apt-get install -y bubblewrap busybox-static iproute2 iptables failed" in out


def test_an_unknown_purpose_is_a_usage_error(tmp_path: Path) -> None:
    code, out, calls = run(tmp_path, "everything", 0, [])
    assert code == 2 and "usage:" in out and calls == []


def test_the_readme_scripts_and_ci_use_it() -> None:
    assert "./scripts/system-packages.sh demo" in (ROOT / "scripts" / "demo.sh").read_text()
    assert "./scripts/system-packages.sh test" in (ROOT / "scripts" / "test.sh").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./scripts/system-packages.sh test" in ci and "./scripts/test.sh" in ci
