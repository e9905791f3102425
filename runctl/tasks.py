"""Harbor-format tasks and task indexes.

A task is a folder: ``task.toml``, ``instruction.md``, ``environment/Dockerfile`` (or a compose file, or a
prebuilt ``[environment] docker_image``), ``tests/test.sh`` (the verifier) and optionally
``solution/solve.sh`` (the oracle). A task index is either a folder of task folders (or one task folder), or a
parquet file with one row per task: a ``task_path`` column (absolute, or relative to the index file's folder)
and an optional ``task_id`` column; other columns are kept and carried along, so a filtered index written by an
infer run has the same row format.

Errors are :class:`~runctl.errors.TaskError` and name the file and the field.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from runctl.errors import TaskError
from runctl.safefiles import UnsafeFile, check_regular, read_regular_text

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

NetworkMode = Literal["public", "no-network", "allowlist"]
TASK_FILE = "task.toml"
INSTRUCTION = "instruction.md"
VERIFIER = "tests/test.sh"
ORACLE = "solution/solve.sh"
ENVIRONMENT_FILES = ("Dockerfile", "docker-compose.yaml", "docker-compose.yml")
"""What an environment folder may hold, in the order they are looked for."""
RESERVED_PATHS = ("/tests", "/logs", "/solution", "/runctl")
"""Where a trial puts what the agent must not shape: the verifier's tests, the logs, the oracle's solution, and the
installed agent's relay and proxy socket. A work folder may not overlap them (docs/security.md)."""
INDEX_BYTES = 1 << 30
"""The largest parquet task index read."""
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_UNIT_MB = {"": 1 / 1024**2, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024**2}


def workdir_problem(workdir: str) -> str | None:
    """Why ``workdir`` cannot be a sandbox's work folder (with the fix), or None when it can."""
    path = PurePosixPath(workdir)
    if not path.is_absolute() or ".." in path.parts:
        return f"workdir {workdir!r} must be an absolute path without '..'. Fix: give one such as /app."
    for reserved in map(PurePosixPath, RESERVED_PATHS):
        if path == reserved or reserved in path.parents or path in reserved.parents:
            return (
                f"workdir {workdir!r} overlaps {reserved}, where the trial puts files the agent must not shape "
                f"(the paths {', '.join(RESERVED_PATHS)} are reserved). Fix: use another folder, such as /app."
            )
    return None


def size_mb(value: object) -> object:
    """``"2G"``, ``"512M"``, ``"2GiB"`` (Harbor's older spellings) as megabytes; numbers pass through."""
    if not isinstance(value, str):
        return value
    match = _SIZE.match(value)
    if match is None:
        raise ValueError(f"{value!r} is not a size like 512M or 2G")
    number, unit = match.groups()
    return max(1, round(float(number) * _UNIT_MB[unit.lower()]))


SCHEMA_VERSIONS = ("1.0", "1.1", "1.2", "1.3", "1.4")
"""The versions of Harbor's task.toml this build reads; a field none of them has is refused, not ignored."""


class _Section(BaseModel):
    # Every field of Harbor's task.toml up to schema 1.4 is declared; an unknown one is refused (it may change what
    # a trial does), and a known one this build cannot carry out is refused by TaskConfig with the reason.
    model_config = ConfigDict(extra="forbid", frozen=True)


class Author(_Section):
    name: str
    email: str | None = None


class TaskIdentity(_Section):
    name: str | None = None
    """``org/name``; the folder name when unset."""
    version: str | None = None
    description: str = ""
    authors: list[Author] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)


def _user_text(value: object) -> object:
    """A user given as a number (``user = 1000``) as text, the way exec takes it."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


class AgentSettings(_Section):
    timeout_sec: float = Field(600.0, gt=0)
    user: str | None = None
    network_mode: NetworkMode | None = None
    """Harbor 1.3's override of the environment's network for the agent phase."""
    allowed_hosts: list[str] = Field(default_factory=list)

    _user = field_validator("user", mode="before")(_user_text)


class Healthcheck(_Section):
    """A command that must succeed before the agent starts (retried; the sandbox fails to set up otherwise)."""

    command: str
    interval_sec: float = Field(5.0, ge=0)
    timeout_sec: float = Field(30.0, gt=0)
    start_period_sec: float = Field(0.0, ge=0)
    start_interval_sec: float = Field(5.0, ge=0)
    retries: int = Field(3, ge=1)


class EnvironmentSettings(_Section):
    build_timeout_sec: float = Field(600.0, gt=0)
    docker_image: str | None = None
    """A prebuilt image: the Dockerfile is not built."""
    os: Literal["linux", "windows"] = "linux"
    cpus: float = Field(1.0, gt=0)
    memory_mb: int = Field(2048, ge=16)
    storage_mb: int | None = Field(None, ge=1)
    gpus: int = Field(0, ge=0)
    gpu_types: list[str] | None = None
    tpu: dict[str, Any] | None = None
    mcp_servers: list[dict[str, Any]] = Field(default_factory=list)
    network_mode: NetworkMode | None = None
    allowed_hosts: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    skills_dir: str | None = None
    """Where an agent's skills would be copied; this build copies none, so it changes nothing."""
    healthcheck: Healthcheck | None = None

    @model_validator(mode="before")
    @classmethod
    def _older_spellings(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            for old, new in (("memory", "memory_mb"), ("storage", "storage_mb")):
                if old in data and new not in data:
                    data[new] = data.pop(old)
            # Harbor before 1.3: allow_internet = true | false, read only when network_mode is not set.
            if "allow_internet" in data:
                allowed = data.pop("allow_internet")
                if "network_mode" not in data and not data.get("allowed_hosts"):
                    data["network_mode"] = "public" if allowed else "no-network"
            if isinstance(data.get("os"), str):
                data["os"] = data["os"].lower()
        return data

    @field_validator("memory_mb", "storage_mb", mode="before")
    @classmethod
    def _sizes(cls, value: object) -> object:
        return size_mb(value)

    @field_validator("workdir")
    @classmethod
    def _workdir_apart(cls, value: str | None) -> str | None:
        problem = None if value is None else workdir_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("docker_image")
    @classmethod
    def _image_not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("docker_image is empty")
        return value


class CollectHook(_Section):
    """``[[verifier.collect]]``: a command run in the agent's sandbox after the agent, before verifying."""

    command: str
    service: str = "main"
    timeout_sec: float = Field(60.0, gt=0)
    user: str | None = None

    _user = field_validator("user", mode="before")(_user_text)


class VerifierSettings(_Section):
    timeout_sec: float = Field(600.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    user: str | None = None
    _user = field_validator("user", mode="before")(_user_text)
    environment_mode: Literal["shared", "separate"] | None = None
    """shared: the verifier runs in the agent's sandbox; separate: in a sandbox of its own."""
    environment: EnvironmentSettings | None = None
    """The separate verifier's environment; unset, a copy of ``[environment]``."""
    collect: list[CollectHook] = Field(default_factory=list)
    network_mode: NetworkMode | None = None
    allowed_hosts: list[str] = Field(default_factory=list)

    @property
    def separate(self) -> bool:
        """Harbor's rule: an explicit mode wins; else a ``[verifier.environment]`` table means separate."""
        return self.environment_mode == "separate" or (self.environment_mode is None and self.environment is not None)

    @model_validator(mode="after")
    def _shared_has_no_environment(self) -> VerifierSettings:
        if self.environment_mode == "shared" and self.environment is not None:
            raise PydanticCustomError(
                "mode",
                'environment_mode = "shared" runs the verifier in the agent\'s sandbox: drop [verifier.environment]',
            )
        return self


class SolutionSettings(_Section):
    env: dict[str, str] = Field(default_factory=dict)
    """Variables the oracle's solve.sh runs with."""


class Artifact(_Section):
    source: str
    destination: str | None = None
    exclude: list[str] = Field(default_factory=list)
    service: str | None = None


class TaskConfig(_Section):
    """The contents of ``task.toml``."""

    schema_version: str = "1.0"
    task: TaskIdentity = Field(default_factory=TaskIdentity)
    metadata: dict[str, Any] = Field(default_factory=dict)
    source: str | None = None
    agent: AgentSettings = Field(default_factory=AgentSettings)
    verifier: VerifierSettings = Field(default_factory=VerifierSettings)
    environment: EnvironmentSettings = Field(default_factory=EnvironmentSettings)
    solution: SolutionSettings = Field(default_factory=SolutionSettings)
    artifacts: list[str | Artifact] = Field(default_factory=list)
    steps: list[dict[str, Any]] | None = None
    multi_step_reward_strategy: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _older_version_key(cls, data: Any) -> Any:
        # Harbor 1.0 called the schema version `version`; 1.1 renamed it `schema_version`.
        if isinstance(data, dict) and "version" in data:
            data = dict(data)
            data.setdefault("schema_version", str(data.pop("version")))
        return data

    @property
    def artifact_entries(self) -> list[Artifact]:
        return [Artifact(source=a) if isinstance(a, str) else a for a in self.artifacts]

    @model_validator(mode="after")
    def _only_what_is_built(self) -> TaskConfig:
        problem = unsupported(self)
        if problem is not None:
            field, message = problem
            raise PydanticCustomError("not_supported", "{field}: {message}", {"field": field, "message": message})
        return self


def _networks(config: TaskConfig) -> list[tuple[str, NetworkMode | None, list[str]]]:
    found: list[tuple[str, NetworkMode | None, list[str]]] = [
        ("environment", config.environment.network_mode, config.environment.allowed_hosts),
        ("agent", config.agent.network_mode, config.agent.allowed_hosts),
        ("verifier", config.verifier.network_mode, config.verifier.allowed_hosts),
    ]
    if config.verifier.environment is not None:
        venv = config.verifier.environment
        found.append(("verifier.environment", venv.network_mode, venv.allowed_hosts))
    return found


def unsupported(config: TaskConfig) -> tuple[str, str] | None:
    """The first thing a task asks for that this build does not carry out, as (field, why and what to do)."""
    if config.schema_version not in SCHEMA_VERSIONS:
        return "schema_version", (
            f"{config.schema_version!r} is not a task.toml version this build reads ({', '.join(SCHEMA_VERSIONS)})"
        )
    if config.steps is not None or config.multi_step_reward_strategy is not None:
        return "steps", "multi-step tasks ([[steps]]) are not built yet; give the task one agent phase and one verifier"
    return _environment_problem(config) or _network_problem(config) or _collection_problem(config)


def _environment_problem(config: TaskConfig) -> tuple[str, str] | None:
    for name, env in (("environment", config.environment), ("verifier.environment", config.verifier.environment)):
        if env is None:
            continue
        if env.os != "linux":
            return f"{name}.os", f"{env.os} sandboxes are not built; runctl runs Linux sandboxes only"
        if env.gpus or env.gpu_types or env.tpu:
            return f"{name}.gpus", "sandboxes with GPUs or TPUs are not built yet"
        if env.mcp_servers:
            return f"{name}.mcp_servers", "this build gives agents no MCP servers; drop mcp_servers"
        host_vars = sorted(k for k, v in env.env.items() if "${" in v)
        if host_vars:
            return f"{name}.env", (
                f"{', '.join(host_vars)} would be read from the host's environment, and runctl passes no host variable "
                "into a sandbox; give the values in task.toml"
            )
    return None


def _network_problem(config: TaskConfig) -> tuple[str, str] | None:
    for name, mode, hosts in _networks(config):
        if mode == "allowlist" or hosts:
            return f"{name}.network_mode", "no sandbox backend enforces an egress allowlist yet: no-network or public"
    shared = config.environment.network_mode or "no-network"
    for name, mode in (("agent", config.agent.network_mode), ("verifier", config.verifier.network_mode)):
        if mode is not None and mode != shared and (name == "agent" or not config.verifier.separate):
            return f"{name}.network_mode", (
                f"{mode} differs from the environment's {shared}, and a sandbox's network is set when it is made "
                "(the agent and a shared verifier use one sandbox); set [environment] network_mode, or give the "
                "verifier a separate environment"
            )
    return None


def _collection_problem(config: TaskConfig) -> tuple[str, str] | None:
    for hook in config.verifier.collect:
        if hook.service != "main":
            return "verifier.collect", f"service {hook.service!r}: sidecar services are not built; collect from main"
    for artifact in config.artifact_entries:
        if artifact.service not in (None, "main"):
            return "artifacts", f"{artifact.source}: sidecar services are not built; collect from main"
        if artifact.exclude:
            return "artifacts", f"{artifact.source}: exclude patterns are not built yet; collect a narrower path"
        if ".." in PurePosixPath(artifact.source).parts or not artifact.source.startswith("/"):
            return "artifacts", f"{artifact.source}: give an absolute path inside the sandbox, without '..'"
        dest = artifact.destination
        if dest is not None and (dest.startswith("/") or ".." in PurePosixPath(dest).parts or dest == "manifest.json"):
            return "artifacts", f"destination {dest}: give a relative path inside the trial's artifacts, without '..'"
    return None


@dataclass(frozen=True)
class Task:
    """A loaded task folder."""

    path: Path
    config: TaskConfig
    id: str
    environment_dir: str = "environment"
    """The folder its image is built from: ``environment``, or ``tests`` for a separate verifier's."""

    @property
    def instruction(self) -> str:
        return read_regular_text(self.path / INSTRUCTION, what=INSTRUCTION)

    @property
    def environment_file(self) -> Path | None:
        """The Dockerfile or compose file, if the task has one."""
        folder = self.path / self.environment_dir
        return next((folder / f for f in ENVIRONMENT_FILES if (folder / f).is_file()), None)

    def verifier_view(self) -> Task:
        """The task as its separate verifier's sandbox sees it: ``[verifier.environment]`` (else a copy of
        ``[environment]``) as its environment, its image built from ``tests/`` when that folder has a Dockerfile
        (else the agent's image, in a fresh sandbox), and an id of its own for prebuilt verifier images."""
        verifier = self.config.verifier
        environment = verifier.environment or self.config.environment
        if verifier.network_mode is not None:
            environment = environment.model_copy(update={"network_mode": verifier.network_mode})
        config = self.config.model_copy(update={"environment": environment})
        folder = "tests" if (self.path / "tests" / "Dockerfile").is_file() else self.environment_dir
        return Task(self.path, config, f"{self.id}-verifier", folder)

    @property
    def has_oracle(self) -> bool:
        return (self.path / ORACLE).is_file()

    def image_name(self, registry: str | None) -> str | None:
        """The prebuilt image a trial runs in: ``docker_image``, else ``<registry>/<id>:latest``, else None."""
        if self.config.environment.docker_image:
            return self.config.environment.docker_image
        if registry:
            return f"{registry.rstrip('/')}/{self.id.replace('/', '-').lower()}:latest"
        return None


def _field_of(error: ErrorDetails) -> str:
    return ".".join(str(part) for part in error["loc"])


def load_task(path: str | Path) -> Task:
    """Load and check one task folder.

    Raises:
        TaskError: the folder, ``task.toml``, ``instruction.md`` or ``tests/test.sh`` is missing or malformed.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise TaskError(str(folder), "is not a folder.", "point at a Harbor task folder (it holds task.toml).")
    toml_path = folder / TASK_FILE
    try:
        raw = tomllib.loads(read_regular_text(toml_path, what=TASK_FILE))
    except FileNotFoundError:
        raise TaskError(str(folder), "has no task.toml: it is not a Harbor task.", "add task.toml.") from None
    except UnsafeFile as e:
        raise TaskError(str(toml_path), f"cannot be read: {e}.", "make task.toml a regular file.") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise TaskError(str(toml_path), f"is not valid TOML ({e}).", "fix the syntax.") from None
    try:
        config = TaskConfig.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
        field = _field_of(first)
        if first["type"] == "extra_forbidden":
            raise TaskError(
                str(toml_path),
                f"{field} is not a task.toml field of Harbor's schema {SCHEMA_VERSIONS[0]}–{SCHEMA_VERSIONS[-1]}, "
                f"and a field runctl does not know may change what a trial does, so the task is refused{more}.",
                "remove the field, or check its spelling against Harbor's task.toml reference.",
                field,
            ) from None
        if first["type"] == "not_supported":
            context = first.get("ctx") or {}
            raise TaskError(
                str(toml_path),
                f"asks for what this build does not do, so it is refused rather than run another way: "
                f"{context.get('field')}: {context.get('message')}.",
                "change the task as the message says, or leave it out of the index.",
                str(context.get("field")),
            ) from None
        raise TaskError(
            str(toml_path),
            f"{first['msg']}{more}.",
            "fix the value; see Harbor's task.toml reference.",
            field,
        ) from None
    for required, what in ((INSTRUCTION, "what the agent is told"), (VERIFIER, "the verifier")):
        target = folder / required
        if not target.is_file() or target.stat().st_size == 0:
            raise TaskError(str(target), f"is missing or empty: a task needs {what}.", f"add {required}.")
    return Task(folder, config, config.task.name or folder.name)


@dataclass(frozen=True)
class IndexEntry:
    """One row of a task index: the task's id, its folder, and the row's other columns."""

    task_id: str
    task_path: Path
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskIndex:
    source: Path
    entries: list[IndexEntry]

    def load_tasks(self) -> tuple[list[Task], list[TaskError]]:
        """Every task the index names, and an error for each one that does not load."""
        tasks: list[Task] = []
        errors: list[TaskError] = []
        for entry in self.entries:
            try:
                tasks.append(load_task(entry.task_path))
            except TaskError as e:
                errors.append(e)
        return tasks, errors


def _folder_index(folder: Path) -> list[IndexEntry]:
    if (folder / TASK_FILE).is_file():
        return [IndexEntry(folder.name, folder)]
    subfolders = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    return [IndexEntry(p.name, p) for p in subfolders if (p / TASK_FILE).is_file()]


def _parquet_index(path: Path) -> list[IndexEntry]:
    import pyarrow.parquet as pq  # heavy: only parquet indexes need it

    try:
        check_regular(path, INDEX_BYTES, "task index")
        rows = pq.read_table(path).to_pylist()
    except Exception as e:  # pyarrow raises several types for a bad file
        raise TaskError(str(path), f"is not a readable parquet file ({e}).", "write the index with pyarrow.") from None
    if rows and "task_path" not in rows[0]:
        raise TaskError(
            str(path),
            f"has no task_path column (columns: {', '.join(rows[0])}).",
            "add a task_path column naming each task folder (absolute, or relative to the index file).",
            "task_path",
        )
    entries = []
    for number, row in enumerate(rows):
        task_path = row.pop("task_path")
        if not isinstance(task_path, str) or not task_path:
            raise TaskError(str(path), f"row {number} has no task_path.", "give every row a task folder.", "task_path")
        folder = Path(task_path) if Path(task_path).is_absolute() else path.parent / task_path
        task_id = row.pop("task_id", None) or folder.name
        entries.append(IndexEntry(str(task_id), folder, row))
    return entries


def load_index(path: str | Path) -> TaskIndex:
    """Read a task index: a parquet file, a folder of task folders, or one task folder.

    Raises:
        TaskError: the index does not exist, cannot be read, names no task, or names a task id twice.
    """
    source = Path(path)
    if source.is_dir():
        entries = _folder_index(source)
    elif source.is_file():
        entries = _parquet_index(source)
    else:
        raise TaskError(str(source), "does not exist.", "point at a parquet task index or a folder of tasks.")
    if not entries:
        raise TaskError(str(source), "names no task.", "add rows (parquet) or task folders, each holding a task.toml.")
    seen: set[str] = set()
    for entry in entries:
        if entry.task_id in seen:
            raise TaskError(str(source), f"names task {entry.task_id} twice.", "keep one row per task.", "task_id")
        seen.add(entry.task_id)
    return TaskIndex(source, entries)
