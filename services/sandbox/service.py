"""The sandbox service: sandboxes and whole trials for runs, reachable from any worker over the bus.

Requests are JSON over NATS request/reply (``runctl.subjects.sandbox_subject``):

- ``create`` and ``trial`` go to any instance (a queue group); ``exec`` and ``destroy`` go to the instance that
  holds the sandbox (its id comes back from ``create``);
- every sandbox is labelled with team, run, trial and the instance that made it, and recorded in the ledger
  (JetStream KV) before it exists and removed after it is gone;
- per-team caps: a ``create`` over the team's cap waits for a slot up to ``wait_s``, then fails with the cap named;
- the reaper runs at start and every ``REAP_EVERY_S``: a sandbox whose instance stopped heart-beating, or whose
  run ended, is destroyed, and the ledger follows the backends.

Backend calls block; they run in worker threads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path, PurePosixPath
from typing import Any

from nats.aio.msg import Msg

from runctl.bus.client import ConsumerSpec, Delivery
from runctl.errors import RunctlError, log_failure
from runctl.events import RunCancelled, RunFailed, RunSucceeded, SandboxCreated, SandboxDestroyed, new_event
from runctl.events.envelope import Event
from runctl.events.payloads import RUNS_STREAM
from runctl.home import home
from runctl.service import ServiceRuntime
from runctl.subjects import event_filter, sandbox_subject
from runctl.tasks import Task, load_task
from services.sandbox.agents import make_agent
from services.sandbox.backends.base import (
    CHUNK_BYTES,
    OWNER_LABEL,
    Backend,
    OwnedSandbox,
    Sandbox,
    SandboxError,
    SandboxSpec,
)
from services.sandbox.backends.files import extract_tar, tar_of
from services.sandbox.ledger import LedgerEntry, SandboxLedger, take_seat_within
from services.sandbox.owners import (
    HEARTBEAT_S,
    REAP_EVERY_S,
    RUN_LABEL,
    SCOPE_LABEL,
    STALE_S,
    TEAM_LABEL,
    TRIAL_LABEL,
    instance_name,
)
from services.sandbox.settings import SandboxSettings
from services.sandbox.trial import TrialRunner, sandbox_spec

log = logging.getLogger(__name__)


class LedgerBackend:
    """A backend whose sandboxes are recorded in the ledger before they exist and forgotten after they are gone.

    Called from worker threads; the ledger writes are sent to the service's event loop and awaited.
    """

    def __init__(self, service: SandboxService, inner: Backend, seat: str = "") -> None:
        self.service = service
        self.inner = inner
        self.name = inner.name
        self.seat = seat

    def _await(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.service.loop).result()

    def create(self, spec: SandboxSpec) -> Sandbox:
        return self._await(self.service.created(self.inner, spec, self.seat))  # type: ignore[no-any-return]

    def destroy(self, sandbox: Sandbox) -> None:
        self._await(self.service.destroyed(self.inner, sandbox, "released"))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class SandboxService:
    def __init__(
        self,
        runtime: ServiceRuntime,
        backends: dict[str, tuple[Backend, Callable[[Task], str | None]]],
        settings: SandboxSettings,
        max_threads: int = 512,
    ) -> None:
        self.runtime = runtime
        self.backends = backends
        self.settings = settings
        self.scope = settings.scope
        """Sandboxes this deployment owns carry it; the reaper never looks at others (another install's)."""
        self.instance = instance_name()
        self.live: dict[str, tuple[Backend, Sandbox, LedgerEntry]] = {}
        self.pending: set[str] = set()
        self.warm = settings.warm
        """Sandboxes kept ready per kind (backend and spec less id and labels), so a create does not wait."""
        self.pool: dict[str, list[Sandbox]] = {}
        self.refilling: set[str] = set()
        self.pooled: set[str] = set()
        self.fills: set[asyncio.Task[Any]] = set()
        """The warm pool's refills in flight: stopping waits for them before it empties the pool."""
        self.slot_freed = asyncio.Event()
        self.loop = asyncio.get_running_loop()
        # Backend calls block for as long as a command runs: the default pool (CPUs + 4 threads) would cap
        # concurrent trials at 6 on a 2-core machine.
        self.loop.set_default_executor(ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="sandbox"))
        self.ledger: SandboxLedger | None = None
        self.reaped = 0
        # Under $RUNCTL_HOME, not /tmp: an instance killed mid-transfer leaves it where the home's owner looks.
        self.transfers_dir = home() / "transfers" / self.instance
        self.transfers_dir.mkdir(parents=True, exist_ok=True)

    # --- life -------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        bus = self.runtime.bus
        assert bus is not None
        self.ledger = await SandboxLedger.open(bus)
        await self.ledger.heartbeat(self.instance)
        nc = bus.nc
        await nc.subscribe(sandbox_subject("create"), queue="sandbox", cb=self._handler(self._create))
        await nc.subscribe(sandbox_subject("trial"), queue="sandbox", cb=self._handler(self._trial))
        for op, handler in (("exec", self._exec), ("destroy", self._destroy), ("download", self._download)):
            await nc.subscribe(sandbox_subject(op, self.instance), cb=self._handler(handler))
        await nc.subscribe(sandbox_subject("download_chunk", self.instance), cb=self._handler(self._download_chunk))
        await nc.subscribe(sandbox_subject("upload", self.instance), cb=self._upload_chunk)
        ends = [event_filter(p.event_name) for p in (RunSucceeded, RunFailed, RunCancelled)]
        await self.runtime.consume(
            ConsumerSpec(durable="sandbox-run-ends", stream=RUNS_STREAM, filter_subjects=ends), self._runs_ended
        )
        await self.reap()
        self.runtime.spawn(self._every(HEARTBEAT_S, lambda: self.ledger.heartbeat(self.instance)))  # type: ignore[union-attr]
        self.runtime.spawn(self._every(REAP_EVERY_S, self.reap))
        self.runtime.health_info(self.health)
        self.runtime.on_stop(self.stop)

    def health(self) -> dict[str, Any]:
        return {
            "serving": True,
            "instance": self.instance,
            "backends": sorted(self.backends),
            "sandboxes": len(self.live),
            "warm": sum(len(ready) for ready in self.pool.values()),
            "reaped": self.reaped,
        }

    async def stop(self) -> None:
        """Destroy what this instance holds (a clean stop leaves nothing for the reaper) and stop heart-beating.

        The warm pool's refills stop first, and those in flight are waited for (a sandbox being made now joins
        the pool after this call would have emptied it, and would outlive the service), then the pool goes."""
        self.warm = 0
        if self.fills:
            await asyncio.gather(*self.fills, return_exceptions=True)
        for sandbox_id in list(self.live):
            backend, sandbox, _ = self.live[sandbox_id]
            await self.destroyed(backend, sandbox, "released")
        for key, ready in list(self.pool.items()):
            backend = self.backends[key.split(":", 1)[0]][0]
            for sandbox in ready:
                await asyncio.to_thread(backend.destroy, sandbox)
                await self.ledger.remove(sandbox.sandbox_id)  # type: ignore[union-attr]
        self.pool.clear()
        if self.ledger is not None:
            await self.ledger.forget_owner(self.instance)
        shutil.rmtree(self.transfers_dir, ignore_errors=True)
        for backend, _ in self.backends.values():
            tidy = getattr(backend, "remove_cgroup_parents", None)
            if tidy is not None:
                tidy()

    async def _every(self, seconds: float, action: Callable[[], Any]) -> None:
        while not self.runtime.stopping.is_set():
            try:
                await asyncio.wait_for(self.runtime.stopping.wait(), seconds)
            except TimeoutError:
                try:
                    await action()
                except Exception as e:  # a failed sweep is retried at the next one
                    log_failure(log, f"periodic {getattr(action, '__name__', 'action')} failed", e)

    # --- requests ---------------------------------------------------------------------------------------------

    def _handler(self, handler: Callable[[dict[str, Any]], Any]) -> Callable[[Msg], Any]:
        async def answer(msg: Msg) -> None:
            try:
                reply = {"ok": True, **(await handler(json.loads(msg.data)))}
            except SandboxError as e:
                reply = {"ok": False, "error": e.message, "cause": e.cause}
            except RunctlError as e:  # a task that does not load, say: the caller's to fix, said in one line
                log.warning("sandbox request refused: %s: %s", type(e).__name__, e.message)
                reply = {"ok": False, "error": e.message, "cause": "request"}
            except (ValueError, KeyError, TypeError) as e:
                reply = {"ok": False, "error": f"bad request: {e}", "cause": "request"}
            except Exception as e:  # answer, whatever happened: the caller must not wait for a timeout
                log_failure(log, "sandbox request failed", e)
                reply = {"ok": False, "error": f"{type(e).__name__}: {e}", "cause": "sandbox"}
            if msg.reply:
                await msg.respond(json.dumps(reply).encode())

        async def on_message(msg: Msg) -> None:
            self.runtime.spawn(answer(msg))  # requests run side by side: an exec must not wait for a trial

        return on_message

    def _backend(self, name: str) -> tuple[Backend, Callable[[Task], str | None]]:
        if name not in self.backends:
            raise SandboxError(f"backend {name} is not served by this instance (it serves {', '.join(self.backends)})")
        return self.backends[name]

    async def _create(self, request: dict[str, Any]) -> dict[str, Any]:
        backend, image_for = self._backend(request.get("backend", "local"))
        task = load_task(request["task_path"])
        labels = self._labels(request)
        team = labels[TEAM_LABEL]
        seat = await self._take_seat(team, float(request.get("wait_s", 0)))
        try:
            spec = sandbox_spec(task, await asyncio.to_thread(image_for, task), labels)
            sandbox = await self.created(backend, spec, seat)
        except BaseException:
            await self._give_back(team, seat)
            raise
        return {"sandbox_id": sandbox.sandbox_id, "instance": self.instance, "backend": backend.name}

    async def _exec(self, request: dict[str, Any]) -> dict[str, Any]:
        backend, sandbox = self._held(request["sandbox_id"])
        result = await asyncio.to_thread(
            backend.exec,
            sandbox,
            request["command"],
            float(request.get("timeout_s", 600)),
            user=request.get("user"),
            env=request.get("env"),
            workdir=request.get("workdir"),
        )
        return asdict(result)

    async def _destroy(self, request: dict[str, Any]) -> dict[str, Any]:
        backend, sandbox = self._held(request["sandbox_id"])
        await self.destroyed(backend, sandbox, "released")
        return {}

    async def _trial(self, request: dict[str, Any]) -> dict[str, Any]:
        backend, image_for = self._backend(request.get("backend", "local"))
        task = load_task(request["task_path"])
        labels = self._labels(request)
        team = labels[TEAM_LABEL]
        seat = await self._take_seat(team, float(request.get("wait_s", 0)))
        try:
            runner = TrialRunner(LedgerBackend(self, backend, seat), image_for)
            agent = make_agent(request.get("agent", "oracle"))
            result = await asyncio.to_thread(runner.run, task, agent, Path(request["out_dir"]), labels)
        finally:
            await self._give_back(team, seat)  # its sandbox gave it back when it went; this covers one never made
        return {"result": result.model_dump()}

    # --- files, in chunks: a NATS message carries at most ~1 MB ------------------------------------------------

    async def _upload_chunk(self, msg: Msg) -> None:
        """One chunk of a tar archive (headers: sandbox, target, transfer id, last); the last one unpacks it into
        the sandbox."""
        headers = msg.headers or {}
        reply: dict[str, Any] = {"ok": True}
        try:
            transfer = headers["Runctl-Transfer"]
            if not re.fullmatch(r"[0-9a-f]{32}", transfer):
                raise ValueError("Runctl-Transfer must be 32 hex digits")
            part = self.transfers_dir / f"{transfer}.up.tar"
            with part.open("ab") as out:
                out.write(msg.data)
            if headers.get("Runctl-Last") == "1":
                backend, sandbox = self._held(headers["Runctl-Sandbox"])
                try:
                    await asyncio.to_thread(_unpack_into, backend, sandbox, part, headers["Runctl-Target"])
                finally:
                    part.unlink(missing_ok=True)
        except SandboxError as e:
            reply = {"ok": False, "error": e.message, "cause": e.cause}
        except (KeyError, ValueError, OSError) as e:
            reply = {"ok": False, "error": f"bad upload chunk: {e}", "cause": "request"}
        if msg.reply:
            await msg.respond(json.dumps(reply).encode())

    async def _download(self, request: dict[str, Any]) -> dict[str, Any]:
        """Pack a path of the sandbox; the client then fetches the archive chunk by chunk."""
        backend, sandbox = self._held(request["sandbox_id"])
        transfer = secrets.token_hex(16)
        archive = self.transfers_dir / f"{transfer}.down.tar"
        found = await asyncio.to_thread(_pack_from, backend, sandbox, request["source"], archive)
        if not found:
            return {"found": False}
        size = archive.stat().st_size
        return {"found": True, "transfer": transfer, "size": size, "chunks": max(1, -(-size // CHUNK_BYTES))}

    async def _download_chunk(self, request: dict[str, Any]) -> dict[str, Any]:
        import base64

        transfer, index = str(request["transfer"]), int(request["index"])
        if not re.fullmatch(r"[0-9a-f]{32}", transfer):
            raise ValueError("transfer must be 32 hex digits")
        archive = self.transfers_dir / f"{transfer}.down.tar"
        with archive.open("rb") as source:
            source.seek(index * CHUNK_BYTES)
            data = source.read(CHUNK_BYTES)
        if request.get("last"):
            archive.unlink(missing_ok=True)
        return {"data": base64.b64encode(data).decode()}

    def _held(self, sandbox_id: str) -> tuple[Backend, Sandbox]:
        if sandbox_id not in self.live:
            raise SandboxError(f"sandbox {sandbox_id} is not held by instance {self.instance}")
        backend, sandbox, _ = self.live[sandbox_id]
        return backend, sandbox

    def _labels(self, request: dict[str, Any]) -> dict[str, str]:
        team = str(request["team"])
        return {
            OWNER_LABEL: self.instance,
            SCOPE_LABEL: self.scope,
            TEAM_LABEL: team,
            RUN_LABEL: str(request.get("run_id") or ""),
            TRIAL_LABEL: str(request.get("trial") or ""),
        }

    async def _take_seat(self, team: str, wait_s: float) -> str:
        """One of the team's seats (its cap's worth), waiting for one up to ``wait_s`` (see ledger.py: seats taken
        at the same moment on several instances are ordered, so the cap holds across all of them)."""
        assert self.ledger is not None
        cap = self.settings.cap_of(team)
        return await take_seat_within(self.ledger, team, self.instance, cap, wait_s, self.slot_freed)

    async def _give_back(self, team: str, seat: str) -> None:
        assert self.ledger is not None
        await self.ledger.release_seat(team, seat)
        self.slot_freed.set()

    # --- bookkeeping ------------------------------------------------------------------------------------------

    async def created(self, backend: Backend, spec: SandboxSpec, seat: str = "") -> Sandbox:
        """A sandbox for ``spec``: a warm one when the pool has it, else a new one. Recorded in the ledger (before
        it exists, when new) and announced to the run."""
        assert self.ledger is not None
        labels = spec.labels
        entry = LedgerEntry(
            sandbox_id=spec.sandbox_id,
            backend=backend.name,
            handle="",
            owner=self.instance,
            team=labels.get(TEAM_LABEL, ""),
            run_id=labels.get(RUN_LABEL, ""),
            trial=labels.get(TRIAL_LABEL, ""),
            created=time.time(),
            seat=seat,
        )
        started = time.monotonic()
        key = self._pool_key(backend, spec)
        ready = self.pool.get(key)
        if ready:
            warm = ready.pop()
            self.pooled.discard(warm.sandbox_id)
            sandbox = Sandbox(warm.sandbox_id, warm.backend, warm.handle, spec)
            entry = LedgerEntry(**{**asdict(entry), "sandbox_id": sandbox.sandbox_id})
        else:
            sandbox = await self._make(backend, spec, entry)
        entry = LedgerEntry(**{**asdict(entry), "handle": sandbox.handle})
        self.live[sandbox.sandbox_id] = (backend, sandbox, entry)
        await self.ledger.put(entry)
        self._refill(backend, spec)
        if entry.run_id:
            payload = SandboxCreated(
                sandbox_id=sandbox.sandbox_id,
                backend=backend.name,
                trial=entry.trial,
                image=spec.image or "",
                owner=self.instance,
                seconds=time.monotonic() - started,
            )
            await self._publish(payload, entry)
        return sandbox

    async def _make(self, backend: Backend, spec: SandboxSpec, entry: LedgerEntry) -> Sandbox:
        assert self.ledger is not None
        self.pending.add(spec.sandbox_id)
        await self.ledger.put(entry)  # first in the ledger, so a crash during create leaves a trace
        try:
            return await asyncio.to_thread(backend.create, spec)
        except BaseException:
            await self.ledger.remove(spec.sandbox_id)
            raise
        finally:
            self.pending.discard(spec.sandbox_id)

    @staticmethod
    def _pool_key(backend: Backend, spec: SandboxSpec) -> str:
        kind = {k: v for k, v in asdict(spec).items() if k not in ("sandbox_id", "labels")}
        return f"{backend.name}:{json.dumps(kind, sort_keys=True)}"

    def _refill(self, backend: Backend, spec: SandboxSpec) -> None:
        key = self._pool_key(backend, spec)
        if self.warm <= 0 or key in self.refilling or self.runtime.stopping.is_set():
            return
        self.refilling.add(key)

        async def fill() -> None:
            try:
                while len(self.pool.setdefault(key, [])) < self.warm and not self.runtime.stopping.is_set():
                    # self.warm drops to 0 when the service stops: no new warm sandbox is started after that.
                    sandbox_id = f"warm-{secrets.token_hex(5)}"
                    labels = {OWNER_LABEL: self.instance, SCOPE_LABEL: self.scope, "runctl.pool": "1"}
                    warm_spec = replace(spec, sandbox_id=sandbox_id, labels=labels)
                    entry = LedgerEntry(sandbox_id, backend.name, "", self.instance, created=time.time())
                    self.pending.add(sandbox_id)  # held by the pool: never an orphan
                    try:
                        sandbox = await self._make(backend, warm_spec, entry)
                        self.pooled.add(sandbox_id)
                        self.pool[key].append(sandbox)
                    finally:
                        self.pending.discard(sandbox_id)
            except SandboxError as e:
                log.warning("warm pool for %s: %s", backend.name, e.message)
            finally:
                self.refilling.discard(key)

        task = self.runtime.spawn(fill())
        self.fills.add(task)
        task.add_done_callback(self.fills.discard)

    async def destroyed(self, backend: Backend, sandbox: Sandbox, reason: str) -> None:
        assert self.ledger is not None
        await asyncio.to_thread(backend.destroy, sandbox)
        _, _, entry = self.live.pop(sandbox.sandbox_id, (None, None, None))
        await self.ledger.remove(sandbox.sandbox_id)
        self.slot_freed.set()
        if entry is not None and entry.run_id:
            await self._publish(self._destroyed_payload(sandbox.sandbox_id, backend.name, entry.trial, reason), entry)

    @staticmethod
    def _destroyed_payload(sandbox_id: str, backend: str, trial: str, reason: str) -> SandboxDestroyed:
        return SandboxDestroyed.model_validate(
            {"sandbox_id": sandbox_id, "backend": backend, "trial": trial, "reason": reason}
        )

    async def _publish(self, payload: SandboxCreated | SandboxDestroyed, entry: LedgerEntry) -> None:
        assert self.runtime.bus is not None
        event: Event = new_event(payload, team=entry.team, run_id=entry.run_id, source=self.runtime.source)
        try:
            await self.runtime.bus.publish(event)
        except Exception as e:  # an event lost is a gap in the timeline, not a reason to fail the sandbox
            log_failure(log, f"could not publish {payload.event_name} for {entry.sandbox_id}", e)

    async def _runs_ended(self, deliveries: list[Delivery]) -> None:
        assert self.ledger is not None
        for delivery in deliveries:
            event = delivery.event  # its team is its subject's (the bus checks the envelope against the subject)
            await self.ledger.mark_run_ended(event.team, event.runid)
        await self.reap()

    # --- the reaper -------------------------------------------------------------------------------------------

    async def reap(self) -> int:
        """Destroy every sandbox whose instance is gone or whose run ended; drop ledger entries for sandboxes
        that no longer exist. Returns how many sandboxes it destroyed."""
        assert self.ledger is not None
        alive = await self.ledger.live_owners(STALE_S) | {self.instance}
        ended = await self.ledger.ended_runs()
        entries = await self.ledger.entries()
        destroyed = 0
        existing: set[str] = set()
        for backend, _ in self.backends.values():
            for owned in await asyncio.to_thread(backend.list_owned, {SCOPE_LABEL: self.scope}):
                existing.add(owned.sandbox_id)
                if OWNER_LABEL not in owned.labels:
                    continue  # made outside the service (runctl task run): not the reaper's
                recorded = entries.get(owned.sandbox_id)
                run = owned.labels.get(RUN_LABEL) or (recorded.run_id if recorded else "")
                team = owned.labels.get(TEAM_LABEL) or (recorded.team if recorded else "")
                reason = self._orphaned(owned, alive, (team, run) in ended if run else False)
                if reason is not None:
                    await self._reap_one(backend, owned, reason)
                    destroyed += 1
        for sandbox_id, entry in entries.items():
            gone = sandbox_id not in existing and sandbox_id not in self.pending and sandbox_id not in self.live
            if gone and (entry.owner not in alive or entry.backend in self.backends):
                await self.ledger.remove(sandbox_id)
        for _, team, seat, owner in await self.ledger.seats():
            if owner not in alive:  # taken by an instance that died before its sandbox was recorded
                await self.ledger.release_seat(team, seat)
        for folder in self.transfers_dir.parent.iterdir():
            if folder.name not in alive:  # a dead instance's half-done transfers
                shutil.rmtree(folder, ignore_errors=True)
        self.reaped += destroyed
        if destroyed:
            log.info("reaped %d orphaned sandbox(es)", destroyed)
        return destroyed

    def _orphaned(self, owned: OwnedSandbox, alive: set[str], run_ended: bool) -> str | None:
        owner = owned.labels.get(OWNER_LABEL, "")
        held = owned.sandbox_id in self.live or owned.sandbox_id in self.pending or owned.sandbox_id in self.pooled
        if (owner == self.instance and held) or (owner != self.instance and owner in alive):
            return "reaped_run_ended" if run_ended else None
        return "reaped_owner_gone"

    async def _reap_one(self, backend: Backend, owned: OwnedSandbox, reason: str) -> None:
        assert self.ledger is not None
        held = self.live.pop(owned.sandbox_id, None)
        if held is not None:
            await asyncio.to_thread(backend.destroy, held[1])
        else:
            await asyncio.to_thread(backend.destroy_owned, owned)
        await self.ledger.remove(owned.sandbox_id)
        self.slot_freed.set()
        team, run = owned.labels.get(TEAM_LABEL, ""), owned.labels.get(RUN_LABEL, "")
        if team and run:
            entry = LedgerEntry(
                owned.sandbox_id, backend.name, owned.handle, owned.labels.get(OWNER_LABEL, ""), team, run
            )
            payload = self._destroyed_payload(owned.sandbox_id, backend.name, owned.labels.get(TRIAL_LABEL, ""), reason)
            await self._publish(payload, entry)


def _unpack_into(backend: Backend, sandbox: Sandbox, archive: Path, target: str) -> None:
    """Unpack an uploaded archive (one entry, named as the target) safely, then hand it to the backend."""
    name = PurePosixPath(target).name
    with tempfile.TemporaryDirectory(prefix="runctl-up-") as scratch, archive.open("rb") as data:
        unpacked, ready = Path(scratch) / "in", Path(scratch) / "out" / name
        unpacked.mkdir()
        extract_tar(data, unpacked, name, ready)
        backend.upload(sandbox, ready, target)


def _pack_from(backend: Backend, sandbox: Sandbox, source: str, archive: Path) -> bool:
    with tempfile.TemporaryDirectory(prefix="runctl-down-") as scratch:
        local = Path(scratch) / PurePosixPath(source).name
        if not backend.download(sandbox, source, local):
            return False
        archive.write_bytes(tar_of(local, local.name))
    return True
