"""The local backend: sandboxes made with bubblewrap, for machines without Docker (the embedded default).

A sandbox is a folder under ``$RUNCTL_HOME/sandboxes/<id>/`` holding its private writable folders (the work
folder, ``/logs``, ``/tmp``, and one per uploaded top-level path such as ``/tests``) and ``meta.json`` (labels,
limits, mounts). Each command is one ``bwrap`` process:

- the root is bubblewrap's own tmpfs, remounted read-only, on which the system folders of the host (``/usr``,
  ``/bin``, ``/lib*``, ``/sbin`` and a few files of ``/etc``; never ``/root``, ``/home`` or ``/etc/shadow``) or of
  an unpacked root folder are bound read-only, and the sandbox's own folders read-write;
- every namespace is new (no network but loopback; a "public" sandbox a network namespace of its own with a route
  out, never the runner's: ``netns.py``), the user is mapped to an unprivileged view with every capability
  dropped, and the process dies with its parent;
- limits: a cgroup per sandbox for memory (no swap), pids and CPU when this process may write the hierarchy (root):
  one folder on cgroup v2, one per controller on v1; else resource limits (address space, processes) on the bwrap
  process (the validator warns);
- disk: a task's ``storage_mb`` is the size of an ext4 file system, loop-mounted, that holds the sandbox's
  writable folders (``disk.py``; root only, else none and the validator warns);
- a timeout kills the command's whole PID namespace (and the cgroup's processes): nothing it started lives on.

With no image builder, a task's Dockerfile is read, not built: ``FROM`` picks the root (an unpacked folder under
``$RUNCTL_HOME/rootfs/<image>`` if there is one, else the host's), ``WORKDIR`` and ``ENV`` apply, ``COPY`` into the
work folder is done at create; any other build step (``RUN`` …) is refused with a message that names it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import resource
import selectors
import shutil
import signal
import subprocess
import time
from pathlib import Path, PurePosixPath
from typing import Any

from runctl.home import home, write_atomic
from runctl.tasks import Task
from services.sandbox.backends import netns
from services.sandbox.backends.base import (
    OUTPUT_LIMIT,
    SANDBOX_LABEL,
    ExecResult,
    OwnedSandbox,
    Sandbox,
    SandboxError,
    SandboxSpec,
)
from services.sandbox.backends.disk import disk_limit_problem, make_disk, remove_disk
from services.sandbox.backends.execio import Capture, exec_result
from services.sandbox.backends.files import seal_in

HOST_SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
HOST_ETC_FILES = (
    "passwd",
    "group",
    "hosts",
    "nsswitch.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "localtime",
    "ssl",
    "ca-certificates",
    "bash.bashrc",
    "profile",
)
ROOTFS_SKIP = {"proc", "dev", "sys", "tmp", "run", "logs"}
CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids", "cpu")
DISK, DISK_IMAGE = "disk", "disk.img"
"""Where a sandbox's own file system is mounted, and its image, under its folder (:mod:`.disk`)."""
ALLOWED_BUILD_STEPS = {"FROM", "WORKDIR", "ENV", "COPY", "LABEL", "CMD", "ENTRYPOINT", "EXPOSE", "ARG", "USER"}
log = logging.getLogger(__name__)
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


NO_BWRAP = (
    "bubblewrap (bwrap) is not installed here, and BACKEND=local runs every sandbox with it. Fix: install it "
    "(`sudo apt-get install bubblewrap`, or `scripts/system-packages.sh demo`), or set BACKEND=docker."
)


def bwrap_binary() -> str:
    """The ``bwrap`` on PATH.

    Raises:
        SandboxError: bubblewrap is not installed.
    """
    found = shutil.which("bwrap")
    if found is None:
        raise SandboxError(NO_BWRAP)
    return found


def bubblewrap_problem() -> str | None:
    """Why the local backend cannot make sandboxes on this machine (with the fix), or None when it can: bwrap is
    there and starts a process in new namespaces with the options every sandbox uses."""
    try:
        bwrap = bwrap_binary()
    except SandboxError as e:
        return e.message
    argv = [bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--uid", "0", "--gid", "0"]
    argv += ["--cap-drop", "ALL", *_root_binds(Path("/")), "--proc", "/proc", "--dev", "/dev", "--", "true"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bubblewrap ({bwrap}) could not start a sandbox ({e}). Fix: check the bwrap install, or BACKEND=docker."
    if done.returncode != 0:
        return (
            f"bubblewrap ({bwrap}) cannot start a sandbox here: {done.stderr.strip() or done.returncode}. Fix: allow "
            "unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1), or set BACKEND=docker."
        )
    return None


class LocalBackend:
    name = "local"

    def __init__(self, root: Path | None = None, rootfs_dir: Path | None = None, cgroup_parent: str = "runctl") -> None:
        self.root = root or home() / "sandboxes"
        self.rootfs_dir = rootfs_dir or home() / "rootfs"
        self._disk_warned = False
        self.cgroup_parent = cgroup_parent
        self.bwrap = bwrap_binary()

    def remove_cgroup_parents(self) -> None:
        """Remove this backend's (empty) parent cgroup folders; one still in use stays."""
        parents = [CGROUP_ROOT / self.cgroup_parent]
        if not unified_cgroups():
            parents = [CGROUP_ROOT / controller / self.cgroup_parent for controller in CONTROLLERS]
        for parent in parents:
            try:
                parent.rmdir()
            except OSError:
                pass

    # --- tasks ------------------------------------------------------------------------------------------------

    def task_root(self, task: Task) -> str:
        """What ``create`` needs for this task, as JSON: the root folder, work folder, environment and copies."""
        return json.dumps(task_plan(task, self.rootfs_dir))

    # --- lifecycle --------------------------------------------------------------------------------------------

    def create(self, spec: SandboxSpec) -> Sandbox:
        plan: dict[str, Any] = (
            json.loads(spec.image) if spec.image and spec.image.startswith("{") else {"root": spec.image or "/"}
        )
        if spec.network == "allowlist":
            raise SandboxError("the local backend cannot enforce an egress allowlist; use no-network or public")
        if spec.network == "public" and (problem := netns.public_net_problem()) is not None:
            raise SandboxError(problem)
        folder = self.root / spec.sandbox_id
        workdir = spec.workdir or plan.get("workdir") or "/app"
        # With a disk limit the writable folders live on the sandbox's own file system, mounted at ``disk``.
        limited = bool(spec.storage_mb) and self._disk_limits()
        data = f"{DISK}/" if limited else ""
        mounts = {workdir: f"{data}work", "/logs": f"{data}logs", "/tmp": f"{data}tmp"}
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SandboxError(
                f"cannot make the sandbox's folders under {self.root} ({e.strerror or e}). Fix: make that folder "
                "writable (it is $RUNCTL_HOME/sandboxes), or free space on its disk."
            ) from None
        meta: dict[str, Any] = {
            "sandbox_id": spec.sandbox_id,
            "labels": {SANDBOX_LABEL: spec.sandbox_id, **spec.labels},
            "root": plan.get("root", "/"),
            "workdir": workdir,
            "env": {**plan.get("env", {}), **spec.env},
            "mounts": mounts,
            "network": spec.network,
            "binds": [list(b) for b in spec.binds],
            "limits": {"memory_mb": spec.memory_mb, "pids": spec.pids, "cpus": spec.cpus},
            "disk": {"mb": spec.storage_mb} if limited else None,
            "cgroups": [str(group) for group in self._cgroups_of(spec)],
            "user": spec.user,
            "created": time.time(),
        }
        # The record first, then the cgroups and network it names: a runner killed in between leaves a record the
        # next destroy or the reaper finds, never a cgroup or a network nobody knows of. The record is only ever
        # replaced whole (an upload of a new top-level path rewrites it), so a kill never leaves it torn and unlisted.
        try:
            if spec.network == "public":
                with netns.allocation():
                    meta["net"] = netns.choose(spec.sandbox_id).record()
                    write_atomic(folder / "meta.json", json.dumps(meta, indent=2))
                    netns.make(netns.SandboxNet.from_record(meta["net"]))
            else:
                write_atomic(folder / "meta.json", json.dumps(meta, indent=2))
            if limited:
                assert spec.storage_mb is not None
                make_disk(folder / DISK_IMAGE, folder / DISK, spec.storage_mb)
            self._make_folders(folder, data)
            self._make_cgroups(spec)
            for copy in plan.get("copies", []):
                for source in copy["sources"]:
                    into = "/" if copy["target"].endswith("/") else ""
                    target = str(PurePosixPath(workdir) / copy["target"]) + into
                    self._place(folder, meta, Path(source), target, merge=True)
        except BaseException:
            self._remove(folder)  # the caller never gets a handle to destroy it with
            raise
        return Sandbox(spec.sandbox_id, self.name, str(folder), spec)

    def _disk_limits(self) -> bool:
        """Whether this host can give a sandbox a disk limit (:mod:`.disk`); said once when it cannot."""
        problem = disk_limit_problem()
        if problem is not None and not self._disk_warned:
            self._disk_warned = True
            log.warning("local sandboxes get no disk limit (storage_mb) on this host: %s", problem)
        return problem is None

    @staticmethod
    def _make_folders(folder: Path, data: str) -> None:
        try:
            for name in ("work", "logs/agent", "logs/verifier", "logs/artifacts", "tmp"):
                (folder / f"{data}{name}").mkdir(parents=True, exist_ok=True)
            os.chmod(folder / f"{data}tmp", 0o1777)
        except OSError as e:
            raise SandboxError(
                f"cannot make the sandbox's folders in {folder} ({e.strerror or e}). Fix: make that folder "
                "writable (it is under $RUNCTL_HOME/sandboxes), or free space on its disk."
            ) from None

    def _cgroups_of(self, spec: SandboxSpec) -> list[Path]:
        """The sandbox's cgroup folders: on cgroup v2 one (when this process may write the hierarchy and it offers
        every controller), on v1 one per controller this process may write."""
        if unified_cgroups():
            return [CGROUP_ROOT / self.cgroup_parent / spec.sandbox_id] if cgroup_v2_problem() is None else []
        controllers = [c for c in CONTROLLERS if os.access(CGROUP_ROOT / c, os.W_OK)]
        return [CGROUP_ROOT / c / self.cgroup_parent / spec.sandbox_id for c in controllers]

    def _make_cgroups(self, spec: SandboxSpec) -> None:
        if unified_cgroups():
            groups = self._cgroups_of(spec)
            if groups:
                _make_v2_group(groups[0], spec)
            return
        values = {
            "memory": {"memory.limit_in_bytes": str(spec.memory_mb * 1024 * 1024)},
            "pids": {"pids.max": str(spec.pids)},
            "cpu": {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": str(int(spec.cpus * 100000))},
        }
        for group in self._cgroups_of(spec):
            controller = group.parent.parent.name
            try:
                group.mkdir(parents=True, exist_ok=True)
                for name, value in values[controller].items():
                    (group / name).write_text(value)
                swap = group / "memory.memsw.limit_in_bytes"
                if controller == "memory" and swap.exists():
                    swap.write_text(values["memory"]["memory.limit_in_bytes"])
            except OSError as e:
                raise SandboxError(f"cannot set the sandbox's {controller} limit in {group}: {e}") from None

    def destroy(self, sandbox: Sandbox) -> None:
        self._remove(Path(sandbox.handle))

    def _remove(self, folder: Path) -> None:
        """Kill the sandbox's processes, remove its cgroups, then its folder. A cgroup the kernel still holds keeps
        the folder's ``meta.json``, so the sandbox stays listed and the next destroy (or the reaper) tries again:
        a cgroup is never left without a record of it."""
        meta = _read_meta(folder)
        stuck = [group for group in (meta.get("cgroups", []) if meta else []) if not remove_cgroup(Path(group))]
        if meta and meta.get("net"):
            netns.remove(netns.SandboxNet.from_record(meta["net"]))
        if not remove_disk(folder / DISK):  # never rmtree through a mount that would not let go
            stuck.append(f"the mount {folder / DISK}")
        if not stuck:
            shutil.rmtree(folder, ignore_errors=True)
            return
        for entry in folder.iterdir():
            if entry.is_dir() and not os.path.ismount(entry):
                shutil.rmtree(entry, ignore_errors=True)
            elif entry.name != "meta.json":
                entry.unlink(missing_ok=True)
        raise SandboxError(
            f"the kernel still holds the cgroups or mount {', '.join(stuck)} of sandbox {folder.name}; its record "
            f"stays in "
            f"{folder} so that the next destroy or the reaper removes them."
        )

    def _metas(self) -> list[dict[str, Any]]:
        """The records of every sandbox under this backend's folder."""
        found = []
        for meta_file in sorted(self.root.glob("*/meta.json")) if self.root.is_dir() else []:
            meta = _read_meta(meta_file.parent)
            if meta is not None:
                found.append({**meta, "handle": str(meta_file.parent)})
        return found

    def list_owned(self, labels: dict[str, str] | None = None) -> list[OwnedSandbox]:
        found = []
        for meta in self._metas():
            if all(meta["labels"].get(k) == v for k, v in (labels or {}).items()):
                found.append(OwnedSandbox(meta["sandbox_id"], meta["handle"], meta["labels"]))
        return found

    def destroy_owned(self, owned: OwnedSandbox) -> None:
        self._remove(Path(owned.handle))

    # --- exec -------------------------------------------------------------------------------------------------

    def exec(
        self,
        sandbox: Sandbox,
        command: str,
        timeout_s: float,
        *,
        user: str | None = None,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
    ) -> ExecResult:
        folder = Path(sandbox.handle)
        meta = _read_meta(folder)
        if meta is None:
            raise SandboxError(f"sandbox {sandbox.sandbox_id} is gone")
        argv = self._bwrap_argv(folder, meta, command, user or meta.get("user"), env or {}, workdir)
        if meta.get("net"):
            argv = netns.SandboxNet.from_record(meta["net"]).enter(argv)
        started = time.monotonic()
        proc = subprocess.Popen(
            _in_cgroups(meta["cgroups"], argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=None if meta["cgroups"] else _rlimits(meta["limits"]),
        )
        out, err = Capture(OUTPUT_LIMIT), Capture(OUTPUT_LIMIT)
        finished = _read_until(proc, started + timeout_s, out, err)
        if not finished:
            _kill_group(proc)
            for group in meta["cgroups"]:
                kill_cgroup(Path(group))
        code = proc.wait()
        return exec_result(code, out, err, bytes(err.data), not finished, started)

    def _bwrap_argv(
        self,
        folder: Path,
        meta: dict[str, Any],
        command: str,
        user: str | None,
        env: dict[str, str],
        workdir: str | None,
    ) -> list[str]:
        root = Path(meta["root"])
        argv = [self.bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session"]
        if meta.get("net"):
            argv.append("--share-net")  # the sandbox's own namespace, entered before bwrap starts (netns.py)
        uid = _uid(root, user)
        argv += ["--uid", str(uid), "--gid", str(uid), "--cap-drop", "ALL", "--clearenv"]
        argv += _root_binds(root)
        argv += ["--proc", "/proc", "--dev", "/dev"]
        for target, name in sorted(meta["mounts"].items(), key=lambda item: len(item[0])):
            argv += ["--bind", str(folder / name), target]
        for host, inside, read_only in meta.get("binds", []):
            argv += ["--ro-bind" if read_only else "--bind", host, inside]
        argv += ["--remount-ro", "/", "--chdir", workdir or meta["workdir"]]
        variables = {"PATH": PATH, "HOME": "/root" if uid == 0 else "/tmp", **meta["env"], **env}
        for key, value in variables.items():
            argv += ["--setenv", key, value]
        return [*argv, "--", "sh", "-c", command]

    # --- files ------------------------------------------------------------------------------------------------

    def upload(self, sandbox: Sandbox, source: Path, target: str) -> None:
        folder = Path(sandbox.handle)
        meta = _read_meta(folder)
        if meta is None:
            raise SandboxError(f"sandbox {sandbox.sandbox_id} is gone")
        self._place(folder, meta, source, target)

    def _place(self, folder: Path, meta: dict[str, Any], source: Path, target: str, merge: bool = False) -> None:
        """Put ``source`` at ``target`` through a fresh staging folder (files.seal_in): nothing the sandbox left at
        or on the way to the target is followed. ``merge`` is Docker's COPY: a file into a folder keeps its name, a
        folder's entries go into the folder there."""
        parts = self._parts(folder, meta, target, create=True)
        host = folder.joinpath(*parts)
        if merge and not source.is_dir() and (target.endswith("/") or (host.is_dir() and not host.is_symlink())):
            parts.append(source.name)
        skipped = seal_in(source, folder, parts, merge=merge)
        if skipped:
            log.warning("special files not copied into sandbox %s: %s", folder.name, ", ".join(skipped))

    def download(self, sandbox: Sandbox, source: str, target: Path) -> bool:
        folder = Path(sandbox.handle)
        meta = _read_meta(folder)
        if meta is None:
            raise SandboxError(f"sandbox {sandbox.sandbox_id} is gone")
        host = self._host_path(folder, meta, source)
        if not (host.exists() or host.is_symlink()):
            return False
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        # Never follow a link the sandbox made: it could point anywhere on this machine.
        if host.is_dir() and not host.is_symlink():
            shutil.copytree(host, target, symlinks=True)
        else:
            shutil.copy2(host, target, follow_symlinks=False)
        return True

    def _host_path(self, folder: Path, meta: dict[str, Any], path: str) -> Path:
        """Where a sandbox path lives on this machine (for reading it out); links the sandbox made may not lead
        out of its folder."""
        parts = self._parts(folder, meta, path, create=False)
        host = folder.joinpath(*parts)
        _inside_of(host, folder / parts[0])
        return host

    def _parts(self, folder: Path, meta: dict[str, Any], path: str, create: bool) -> list[str]:
        """A sandbox path as names under the sandbox's folder (its mount's folder first); with ``create``, a new
        top-level path becomes a mount of its own."""
        inside = PurePosixPath(os.path.normpath(path))
        if not inside.is_absolute() or inside == PurePosixPath("/"):
            raise SandboxError(f"{path} is not a path inside the sandbox")
        mounts: dict[str, str] = meta["mounts"]
        for mount in sorted(mounts, key=len, reverse=True):
            if inside == PurePosixPath(mount) or PurePosixPath(mount) in inside.parents:
                return [mounts[mount], *inside.relative_to(mount).parts]
        if not create:
            return ["absent", inside.name]
        top = "/" + inside.parts[1]
        name = ("disk/" if meta.get("disk") else "") + "mount-" + re.sub(r"[^A-Za-z0-9_.-]", "_", inside.parts[1])
        mounts[top] = name
        (folder / name).mkdir(exist_ok=True)
        write_atomic(folder / "meta.json", json.dumps(meta, indent=2))
        return [name, *inside.relative_to(top).parts]


def task_plan(task: Task, rootfs_dir: Path) -> dict[str, Any]:
    """How the local backend makes a sandbox for ``task``: its root folder, work folder, environment and copies.

    Raises:
        SandboxError: its Dockerfile has a step the local backend cannot honour (it builds no images).
    """
    env = task.config.environment
    plan: dict[str, Any] = {"root": "/", "workdir": env.workdir, "env": {}, "copies": []}
    if env.docker_image:
        plan["root"] = _rootfs_for(rootfs_dir, env.docker_image)
    dockerfile = task.environment_file
    if dockerfile is not None and dockerfile.name == "Dockerfile":
        _read_dockerfile(dockerfile, plan, rootfs_dir)
    return plan


def _rootfs_for(rootfs_dir: Path, image: str) -> str:
    folder = rootfs_dir / re.sub(r"[^A-Za-z0-9_.-]", "_", image)
    return str(folder) if folder.is_dir() else "/"


def _read_dockerfile(dockerfile: Path, plan: dict[str, Any], rootfs_dir: Path) -> None:
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        step, args = words[0].upper(), words[1:]
        if step not in ALLOWED_BUILD_STEPS:
            raise SandboxError(
                f"{dockerfile}:{number}: {step} is a build step the local backend cannot honour (it builds no "
                "images). Fix: use BACKEND=docker for this task, or drop the step.",
                "image",
            )
        if step == "FROM" and args:
            plan["root"] = _rootfs_for(rootfs_dir, args[0])
        elif step == "WORKDIR" and args:
            plan["workdir"] = plan["workdir"] or args[0]
        elif step == "ENV" and args:
            pairs = [a.split("=", 1) for a in args] if "=" in args[0] else [[args[0], " ".join(args[1:])]]
            plan["env"].update({k: v.strip("\"'") for k, v in (p for p in pairs if len(p) == 2)})
        elif step == "COPY" and len(args) >= 2:
            options = [a for a in args if a.startswith("--")]
            if options:
                raise SandboxError(
                    f"{dockerfile}:{number}: COPY {' '.join(options)}: the local backend copies files as they are and "
                    "builds no stages, so it cannot honour COPY options. Fix: use BACKEND=docker for this task.",
                    "image",
                )
            sources = [_in_context(dockerfile, number, a) for a in args[:-1]]
            plan["copies"].append({"sources": sources, "target": args[-1]})


def _in_context(dockerfile: Path, number: int, source: str) -> str:
    """A COPY source as a path inside the build context (the Dockerfile's folder), as Docker confines it: an
    absolute path, ``..`` or a link that leads out of the folder is refused, so no task copies host files in.

    Raises:
        SandboxError: the source leads outside the build context.
    """
    context = dockerfile.parent.resolve()
    target = (context / source.lstrip("/")).resolve()
    if target != context and context not in target.parents:
        raise SandboxError(
            f"{dockerfile}:{number}: COPY {source} leads outside the build context {context}: a task may copy only "
            "files of its own environment folder. Fix: put the file in that folder and COPY it from there.",
            "image",
        )
    return str(target)


def _inside_of(path: Path, base: Path) -> None:
    """Refuse a path that symlinks (made inside the sandbox) lead out of its folder."""
    resolved = path.resolve()
    if resolved != base.resolve() and base.resolve() not in resolved.parents:
        raise SandboxError(f"{path} leads outside the sandbox")


def _read_meta(folder: Path) -> dict[str, Any] | None:
    try:
        meta: dict[str, Any] = json.loads((folder / "meta.json").read_text())
        return meta
    except (OSError, ValueError):
        return None


def _root_binds(root: Path) -> list[str]:
    """Read-only binds that make the sandbox's root: the host's system folders, or a root folder's entries."""
    argv: list[str] = []
    if root == Path("/"):
        entries = [Path("/") / name for name in HOST_SYSTEM_DIRS]
        etc = [Path("/etc") / name for name in HOST_ETC_FILES]
    else:
        entries = [p for p in sorted(root.iterdir()) if p.name not in ROOTFS_SKIP]
        etc = []
    for entry in entries:
        inside = "/" + entry.name
        if entry.is_symlink():
            argv += ["--symlink", os.readlink(entry), inside]
        elif entry.exists():
            argv += ["--ro-bind", str(entry), inside]
    for entry in etc:
        if entry.exists() or entry.is_symlink():
            argv += ["--ro-bind", str(entry), str(entry)]
    return argv


def _uid(root: Path, user: str | None) -> int:
    if user is None or user in ("root", "0"):
        return 0
    if user.isdigit():
        return int(user)
    try:
        for line in (root / "etc" / "passwd").read_text().splitlines():
            fields = line.split(":")
            if fields[0] == user and len(fields) > 2:
                return int(fields[2])
    except OSError:
        pass
    raise SandboxError(f"user {user} does not exist in the sandbox's root")


def unified_cgroups() -> bool:
    """Whether this host mounts cgroup v2 alone at ``CGROUP_ROOT`` (Debian 12, Ubuntu 22.04 and later), not v1's
    folder per controller."""
    return (CGROUP_ROOT / "cgroup.controllers").is_file()


def cgroup_v2_problem() -> str | None:
    """Why sandboxes get no cgroup v2 limits here (None when they do)."""
    if not os.access(CGROUP_ROOT, os.W_OK):
        return f"{CGROUP_ROOT} is not writable by this process (uid {os.geteuid()})"
    try:
        offered = set((CGROUP_ROOT / "cgroup.controllers").read_text().split())
    except OSError as e:
        return f"cannot read {CGROUP_ROOT / 'cgroup.controllers'}: {e}"
    missing = [c for c in CONTROLLERS if c not in offered]
    return f"the cgroup v2 hierarchy offers no {', '.join(missing)} controller" if missing else None


def cgroup_limits_problem() -> str | None:
    """Why local sandboxes get only resource limits of their process here, not cgroup limits (None when they get
    cgroup limits: v2, or v1 with at least one controller writable)."""
    if unified_cgroups():
        return cgroup_v2_problem()
    if any(os.access(CGROUP_ROOT / c, os.W_OK) for c in CONTROLLERS):
        return None
    return f"no cgroup v1 controller under {CGROUP_ROOT} ({', '.join(CONTROLLERS)}) is writable by this process"


def _make_v2_group(group: Path, spec: SandboxSpec) -> None:
    """A sandbox's cgroup v2 folder with its memory (and no swap), pids and CPU limits. Each folder above it hands
    the controllers down (``cgroup.subtree_control``); the parents runctl makes hold no process, as v2 asks."""
    enable = " ".join(f"+{c}" for c in CONTROLLERS)
    try:
        level = CGROUP_ROOT
        for part in group.relative_to(CGROUP_ROOT).parts:
            control = level / "cgroup.subtree_control"
            if not set(CONTROLLERS) <= set(control.read_text().split() if control.exists() else []):
                control.write_text(enable)
            level = level / part
            level.mkdir(exist_ok=True)
        (group / "memory.max").write_text(str(spec.memory_mb * 1024 * 1024))
        if (group / "memory.swap.max").exists():
            (group / "memory.swap.max").write_text("0")
        (group / "pids.max").write_text(str(spec.pids))
        (group / "cpu.max").write_text(f"{int(spec.cpus * 100000)} 100000")
    except OSError as e:
        raise SandboxError(f"cannot set the sandbox's cgroup v2 limits in {group}: {e}") from None


def _in_cgroups(groups: list[str], argv: list[str]) -> list[str]:
    """argv that first moves itself into each cgroup, then becomes bwrap (children inherit the cgroups)."""
    if not groups:
        return argv
    script = 'for g in $RUNCTL_CGROUPS; do echo $$ > "$g/cgroup.procs"; done; exec "$@"'
    return ["env", f"RUNCTL_CGROUPS={' '.join(groups)}", "sh", "-c", script, "runctl-cgroup", *argv]


def _rlimits(limits: dict[str, Any]) -> Any:
    def apply() -> None:
        memory = int(limits["memory_mb"]) * 1024 * 1024 * 4  # address space: generous over resident memory
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_NPROC, (int(limits["pids"]), int(limits["pids"])))

    return apply


def _read_until(proc: subprocess.Popen[bytes], deadline: float, out: Capture, err: Capture) -> bool:
    """Read stdout and stderr until both close (True) or the deadline passes (False)."""
    assert proc.stdout is not None and proc.stderr is not None
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ, out)
    selector.register(proc.stderr, selectors.EVENT_READ, err)
    try:
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            for key, _ in selector.select(min(remaining, 1.0)):
                chunk = os.read(key.fd, 1 << 16)
                if chunk:
                    key.data.add(chunk)
                else:
                    selector.unregister(key.fileobj)
        return True
    finally:
        selector.close()
        proc.stdout.close()
        proc.stderr.close()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def remove_cgroup(group: Path, timeout_s: float = 5.0) -> bool:
    """Kill the cgroup's processes and remove it; True once it is gone. The kernel refuses the removal (EBUSY) for a
    moment after the last process died, so it is retried until ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        kill_cgroup(group)
        try:
            group.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)


def kill_cgroup(group: Path) -> None:
    """SIGKILL every process in a cgroup until it is empty (bounded). A v2 cgroup that has ``cgroup.kill`` (Linux
    5.14) is killed whole by the kernel first, forks in flight included."""
    with contextlib.suppress(OSError):
        if (group / "cgroup.kill").exists():
            (group / "cgroup.kill").write_text("1")
    for _ in range(50):
        try:
            pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
        except OSError:
            return
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
