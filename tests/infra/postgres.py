"""A real PostgreSQL server for the tests (Debian's ``postgresql`` package; ``.ci/run`` installs it).

One server per test session in a temporary folder, listening on 127.0.0.1 only; each test gets a database of its
own. PostgreSQL refuses to run as root, so as root the server runs as the package's ``postgres`` user.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

INSTALL_HINT = "install it: apt-get install -y postgresql (.ci/run does)"


def pg_bin() -> Path:
    """The newest installed server's bin folder."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if not found:
        raise RuntimeError(f"no PostgreSQL server found under /usr/lib/postgresql: {INSTALL_HINT}")
    return Path(found[-1]).parent


def _as_owner(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@contextmanager
def postgres_server(port: int) -> Iterator[str]:
    """Start a server on 127.0.0.1:``port``; yield its admin URL; stop it (by its PID) and remove its folder."""
    bin_dir = pg_bin()
    root = Path(tempfile.mkdtemp(prefix="runctl-pg-"))
    data = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        root.chmod(0o700)
    subprocess.run(
        _as_owner([str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "-E", "UTF8"]),
        check=True,
        capture_output=True,
    )
    log = root / "server.log"
    with log.open("ab") as log_file:
        proc = _start(bin_dir, data, root, port, log_file)
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    try:
        _wait_ready(url, proc, log)
        yield url
    finally:
        proc.terminate()  # runuser passes the signal on to the server: stopped by our child's PID
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(root, ignore_errors=True)


def _start(bin_dir: Path, data: Path, root: Path, port: int, log: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        _as_owner(
            [
                str(bin_dir / "postgres"),
                "-D",
                str(data),
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-k",
                str(root),
                "-c",
                "fsync=off",  # a test database: speed over durability
                "-c",
                "max_connections=50",
            ]
        ),
        stdout=subprocess.DEVNULL,
        stderr=log,
        start_new_session=True,
    )


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 30) -> None:
    import psycopg

    deadline = time.monotonic() + timeout_s
    conninfo = url.replace("postgresql+psycopg://", "postgresql://")
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"postgres exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            psycopg.connect(conninfo, connect_timeout=1).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"postgres did not accept connections in {timeout_s} s: {log.read_text()[-2000:]}"
                ) from None
            time.sleep(0.1)


def new_database(admin_url: str, name: str) -> str:
    """Create an empty database; return its URL."""
    import psycopg

    with psycopg.connect(admin_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return admin_url.rsplit("/", 1)[0] + "/" + name
