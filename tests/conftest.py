"""Shared fixtures: a real nats-server per test on a free port, a connected bus, and runctl services started as
real processes (stopped by PID)."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from runctl import tinymodel
from runctl.bus import Bus
from runctl.ports import free_port
from runctl.stack import nats_server_binary

if TYPE_CHECKING:
    from tests.infra.vllm_server import VLLMServer

ROOT = Path(__file__).resolve().parent.parent


_OPENED_RUN = False


def pytest_configure(config: pytest.Config) -> None:
    """In the process that starts the run (pytest's, or xdist's controller before its workers): the folder the
    workers share (tests/infra/shared.py), and the plugin that times each test and names what it started."""
    global _OPENED_RUN
    from tests.infra import attacks, shared, timings

    # Local sandboxes of this process's tests (and of the services, runners and stacks they start, which inherit it)
    # go under a cgroup parent of this worker's own, so the leftover check below sees only its own tests' cgroups.
    worker = getattr(config, "workerinput", {}).get("workerid", "main")
    os.environ[SANDBOX_CGROUP] = f"runctl-tests-{worker}"
    # The light workers' tests start no vLLM replica (and are short): the pools are shared among the others.
    from tests.infra.schedule import light_workers

    share_the_cores(int(getattr(config, "workerinput", {}).get("workercount", 1)) - light_workers())
    keep_vllms_cache()
    timings.register_worker(config)
    if not hasattr(config, "workerinput"):
        _OPENED_RUN = shared.open_run()
        if _OPENED_RUN:  # not a pytest run started by a test (the README's test command is one)
            timings.register(config)
            attacks.register(config)


#: The thread pools of what a worker's tests start (vLLM's engine, a trainer's torch, tokenizers), sized to the
#: worker's share of the cores.
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def share_the_cores(workers: int) -> None:
    """With several workers, size the thread pools of everything a worker starts to its share of the cores, and stop
    vLLM pinning its threads. Left alone, each vLLM engine binds one OpenMP thread per core it may use, pinned, and
    each torch process sizes its pool to every core: two workers' vLLM servers and trainers then spin on the same
    cores (a CI run on 2 cores saw a load average of 11 to 13, and its first 60 tests took 35 minutes). A setting
    the run was given (the environment) is kept."""
    if workers <= 1:
        return
    share = str(max(1, (os.cpu_count() or 1) // workers))
    for name in THREAD_ENV:
        os.environ.setdefault(name, share)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def keep_vllms_cache() -> None:
    """Pin vLLM's cache root where it is for the user (``$XDG_CACHE_HOME/vllm``, else ``~/.cache/vllm``) for
    everything the tests start, also under the ``HOME`` of its own that a test gives its runs. vLLM keeps there what it
    learnt of a model class; without it, each replica of such a run learns it again in a process of its own that
    imports vLLM and torch (a tiny model's replica then took 41 s of CPU to answer instead of 30, and 14 s longer)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vllm"
    os.environ.setdefault("VLLM_CACHE_ROOT", str(cache))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The run fails if it left a local sandbox's cgroup anywhere (under any ``runctl*`` parent, whichever worker or
    code path made it): the per-test check below sees only its own worker's parents."""
    if not _OPENED_RUN or hasattr(session.config, "workerinput"):
        return
    left = sandbox_cgroups("runctl")
    if left:
        session.config.get_terminal_writer().line(
            f"the test run left sandbox cgroups behind: {sorted(str(g) for g in left)}", red=True
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    """The run is over, every worker with it: stop what the workers shared, remove the folder."""
    if _OPENED_RUN:
        from tests.infra import docker_daemon, shared

        docker_daemon.stop_shared(shared.folder())
        shared.close_run()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist (in each worker, where the collection is made), the longest work first, and the groups that must
    stay on one worker written down for the controller's scheduler (tests/infra/schedule.py)."""
    if hasattr(config, "workerinput"):
        from tests.infra import schedule

        schedule.order(items)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's controller hands out units of work (a test, or a group's tests) longest first."""
    from tests.infra import schedule

    return schedule.GroupScheduling(config, log)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Make the tiny model before the first test that needs it, outside every test's timeout: on a fresh clone,
    or a loaded machine, teaching it takes minutes that no test should be charged with. Under xdist every worker
    gets here; the first makes the model under a lock while the others wait for it, so no test starts before it."""
    if not any(item.get_closest_marker(m) for item in session.items for m in ("vllm", "integration")):
        return
    from tests.infra import vllm_server

    if vllm_server.why_unavailable() is None and not tinymodel.is_made(vllm_server.MODEL_DIR):
        print(f"\nmaking the tiny model in {vllm_server.MODEL_DIR} (once per checkout; a few minutes) ...", flush=True)
        vllm_server.tiny_model()
    # Its scaffolds shape too, when a selected test serves it and the bundles it is taught from are built (the test
    # command builds them; elsewhere the first such test builds them and makes it): taught on idle cores it takes
    # about five minutes; in a worker beside the suite's others, its mini-swe-agent part alone (75 s idle) took eleven.
    serves_it = any("scaffold_model" in getattr(item, "fixturenames", ()) for item in session.items)
    if vllm_server.why_unavailable() is None and serves_it:
        from runctl import bundles

        try:
            bundles.load("mswea"), bundles.load("oc")
        except bundles.BundleError:
            return
        if not tinymodel.is_made(vllm_server.MODEL_DIR.with_name("tinymodel-scaffolds"), tinymodel.SCAFFOLD_SHAPE):
            print("making its scaffolds shape (taught under mini-swe-agent and OpenCode; minutes) ...", flush=True)
        vllm_server.tiny_model(tinymodel.SCAFFOLD_SHAPE)


# The tracker API's admin token of the trackers the tests start (they inherit it), and of the SDK in-process.
ADMIN_TOKEN = "rca_tests-" + secrets.token_urlsafe(16)


def admin_headers(token: str = ADMIN_TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(autouse=True, scope="session")
def _isolated_runctl_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No test reads or writes the developer's ~/.runctl: in-process code gets a home of its own (and the tests'
    admin token for the tracker API)."""
    previous = {k: os.environ.get(k) for k in ("RUNCTL_HOME", "RUNCTL_ADMIN_TOKEN")}
    os.environ["RUNCTL_HOME"] = str(tmp_path_factory.mktemp("runctl-home"))
    os.environ["RUNCTL_ADMIN_TOKEN"] = ADMIN_TOKEN
    yield
    for key, value in previous.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


#: The cgroup parent of local sandboxes; each test process names its own (pytest_configure).
SANDBOX_CGROUP = "RUNCTL_SANDBOX_CGROUP"


def own_cgroup_parent() -> str:
    """This worker's cgroup parent of local sandboxes; a test that makes a backend of its own names a parent that
    starts with it and a dash."""
    return os.environ[SANDBOX_CGROUP]


def sandbox_cgroups(prefix: str | None = None) -> set[Path]:
    """The cgroup folders of local sandboxes that exist now under the parents that start with ``prefix`` (default:
    this worker's own parent, and the ones its tests named after it), none where this process may not make cgroups."""
    prefix = prefix or own_cgroup_parent()
    parents = [
        p
        for c in ("cpu", "memory", "pids")
        for p in Path("/sys/fs/cgroup", c).glob(f"{prefix}*")
        if p.is_dir() and (prefix == "runctl" or p.name == prefix or p.name.startswith(prefix + "-"))
    ]
    return {group for parent in parents for group in parent.iterdir() if group.is_dir()}


def sweep_local_sandboxes(home: Path) -> list[str]:
    """Destroy the local sandboxes runs left under ``home`` (a runner stopped with no sandbox service to reap after
    it), cgroups included; their ids."""
    root = home / "sandboxes"
    if not root.is_dir():
        return []
    from services.sandbox.backends.local_backend import LocalBackend

    backend = LocalBackend(root=root)
    left = backend.list_owned()
    for owned in left:
        backend.destroy_owned(owned)
    return [owned.sandbox_id for owned in left]


@pytest.fixture(autouse=True)
def _leaves_no_sandbox_cgroups() -> Iterator[None]:
    """A test that leaves a local sandbox's cgroup behind fails (and the cgroup is removed): every test cleans up
    what its runs made, or its runs clean up after themselves."""
    before = sandbox_cgroups()
    yield
    deadline = time.monotonic() + 10
    while (left := sandbox_cgroups() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left:
        from services.sandbox.backends.local_backend import remove_cgroup

        for group in left:
            remove_cgroup(group)
        pytest.fail(f"the test left sandbox cgroups behind: {sorted(g.name for g in left)}")


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.05) -> None:
    """Poll a condition until it holds; fail the test with ``what`` if it does not within the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (every thread's children, as ``/proc`` lists them)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


async def login_refused(url: str, **login: str) -> str:
    """Why nats-server refused this login ("" when it let it in); the socket is closed either way."""
    import nats

    from runctl.bus.client import close_refused

    nc = nats.NATS()
    try:
        await nc.connect(url, **login, allow_reconnect=False, max_reconnect_attempts=0)  # type: ignore[arg-type]
    except Exception as e:
        await close_refused(nc)
        return str(e) or type(e).__name__
    await nc.close()
    return ""


async def async_wait_until(predicate: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


@dataclass
class NatsServer:
    url: str
    port: int
    store: Path
    proc: subprocess.Popen[bytes]


def _start_nats(port: int, store: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def listening() -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    wait_until(listening, 10, f"nats-server on port {port}")
    return proc


def _stop(*procs: subprocess.Popen[bytes], grace_s: float = 10) -> None:
    """SIGTERM to every one still running, all at once, then wait for each (SIGKILL after ``grace_s``)."""
    running = [proc for proc in procs if proc.poll() is None]
    for proc in running:
        proc.send_signal(signal.SIGTERM)
    for proc in running:
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A real nats-server with JetStream on a free loopback port, its store in the test's temp folder."""
    port = free_port()
    store = tmp_path / "jetstream"
    server = NatsServer(f"nats://127.0.0.1:{port}", port, store, _start_nats(port, store))
    yield server
    _stop(server.proc)  # the one running now: a test may have restarted it


@pytest.fixture
async def bus(nats_server: NatsServer) -> AsyncIterator[Bus]:
    connected = await Bus.connect(nats_server.url, name="test")
    await connected.ensure_streams()
    yield connected
    await connected.close()


@dataclass
class Services:
    """runctl services as real subprocesses of the test, each started and stopped by PID."""

    nats_url: str
    home: Path
    tracker_port: int
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def tracker_url(self) -> str:
        return f"http://127.0.0.1:{self.tracker_port}"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "RUNCTL_NATS_URL": self.nats_url,
            "RUNCTL_HOME": str(self.home),
            "RUNCTL_TRACKER_PORT": str(self.tracker_port),
            "RUNCTL_TRACKER_URL": self.tracker_url,
            "PYTHONUNBUFFERED": "1",
            **self.extra_env,
        }

    def start(self, name: str) -> subprocess.Popen[bytes]:
        with (self.home / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", f"services.{name}"], env=self.env(), stdout=log, stderr=log)
        self.procs[name] = proc
        self.wait_healthy(name)
        return proc

    def wait_healthy(self, name: str, timeout_s: float = 30) -> None:
        from runctl.subjects import health_subject

        async def ask() -> bool:
            try:
                probe = await Bus.connect(self.nats_url, name="test-probe")
            except Exception:
                return False
            try:
                reply = await probe.nc.request(health_subject(name), b"", timeout=0.5)
                info = json.loads(reply.data)
                return bool(info["pid"] == self.procs[name].pid and info["ready"])
            except Exception:
                return False
            finally:
                await probe.close()

        def healthy() -> bool:
            if self.procs[name].poll() is not None:
                raise AssertionError(f"{name} exited with {self.procs[name].returncode}: {self.log(name)[-2000:]}")
            return asyncio.run(ask())

        wait_until(healthy, timeout_s, f"{name} to answer health probes", interval_s=0.1)

    def kill(self, name: str) -> None:
        """SIGKILL: no graceful anything, as in a crash."""
        proc = self.procs.pop(name)
        proc.kill()
        proc.wait(10)

    def stop(self, name: str) -> int:
        proc = self.procs.pop(name)
        _stop(proc)
        return int(proc.returncode)

    def log(self, name: str) -> str:
        path = self.home / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop_all(self) -> None:
        # All at once: each takes up to a second to stop (its consumers' fetch in hand times out first), so one after
        # another a test's teardown waited 2-3 s.
        _stop(*(self.procs.pop(name) for name in list(self.procs)))
        sweep_local_sandboxes(self.home)  # no sandbox service ran here to reap after a runner it stopped


@pytest.fixture
def services(nats_server: NatsServer, tmp_path: Path) -> Iterator[Services]:
    home = tmp_path / "home"
    home.mkdir()
    running = Services(nats_server.url, home, free_port())
    yield running
    running.stop_all()


@pytest.fixture
def examples() -> Path:
    return ROOT / "configs" / "examples"


@pytest.fixture(scope="session")
def docker_host() -> str:
    """DOCKER_HOST of a real Docker Engine holding the ``runctl-base`` image: the one at $DOCKER_HOST, or one dockerd
    this run starts for all its workers (tests/infra/docker_daemon.py: shared_daemon)."""
    from tests.infra import docker_daemon, shared

    reason = docker_daemon.why_unavailable()
    if reason:
        pytest.skip(reason)
    return docker_daemon.shared_daemon(shared.folder())


@pytest.fixture(scope="session")
def postgres() -> Iterator[str]:
    """A real PostgreSQL server for the session (its admin URL); each test makes its own database in it."""
    from tests.infra.postgres import postgres_server

    with postgres_server(free_port()) as admin:
        yield admin


@pytest.fixture(scope="session")
def served_model() -> Iterator[VLLMServer]:
    """One real vLLM replica of the tiny model per worker, in dev mode (``/pause``, ``/resume``, ``/collective_rpc``),
    for every test that needs a served model but not a replica of its own. A test that changes it (pauses it, loads
    other weights) puts it back as it found it before it ends, and checks that it did; a test that kills, restarts
    or keeps other weights in a replica starts its own (tests/infra/vllm_server.py: vllm_server)."""
    from tests.infra import vllm_server

    reason = vllm_server.why_unavailable()
    if reason:
        pytest.skip(reason)
    with vllm_server.vllm_server(vllm_server.tiny_model(), extra_env={"VLLM_SERVER_DEV_MODE": "1"}) as server:
        yield server
