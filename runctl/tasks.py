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
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from runctl.errors import TaskError

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

NetworkMode = Literal["public", "no-network", "allowlist"]
TASK_FILE = "task.toml"
INSTRUCTION = "instruction.md"
VERIFIER = "tests/test.sh"
ORACLE = "solution/solve.sh"
ENVIRONMENT_FILES = ("environment/Dockerfile", "environment/docker-compose.yaml", "environment/docker-compose.yml")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_UNIT_MB = {"": 1 / 1024**2, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024**2}


def size_mb(value: object) -> object:
    """``"2G"``, ``"512M"``, ``"2GiB"`` (Harbor's older spellings) as megabytes; numbers pass through."""
    if not isinstance(value, str):
        return value
    match = _SIZE.match(value)
    if match is None:
        raise ValueError(f"{value!r} is not a size like 512M or 2G")
    number, unit = match.groups()
    return max(1, round(float(number) * _UNIT_MB[unit.lower()]))


class _Section(BaseModel):
    # Harbor adds fields over time; unknown ones are ignored, known ones are type-checked.
    model_config = ConfigDict(extra="ignore", frozen=True)


class TaskIdentity(_Section):
    name: str | None = None
    """``org/name``; the folder name when unset."""
    version: str | None = None


class AgentSettings(_Section):
    timeout_sec: float = Field(600.0, gt=0)
    user: str | None = None
    network_mode: NetworkMode | None = None


class VerifierSettings(_Section):
    timeout_sec: float = Field(600.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    user: str | None = None


class EnvironmentSettings(_Section):
    build_timeout_sec: float = Field(600.0, gt=0)
    docker_image: str | None = None
    """A prebuilt image: the Dockerfile is not built."""
    cpus: float = Field(1.0, gt=0)
    memory_mb: int = Field(2048, ge=16)
    storage_mb: int | None = Field(None, ge=1)
    gpus: int = Field(0, ge=0)
    network_mode: NetworkMode | None = None
    allowed_hosts: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    healthcheck: Any = None

    @model_validator(mode="before")
    @classmethod
    def _older_spellings(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            for old, new in (("memory", "memory_mb"), ("storage", "storage_mb")):
                if old in data and new not in data:
                    data[new] = data.pop(old)
        return data

    @field_validator("memory_mb", "storage_mb", mode="before")
    @classmethod
    def _sizes(cls, value: object) -> object:
        return size_mb(value)

    @field_validator("docker_image")
    @classmethod
    def _image_not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("docker_image is empty")
        return value


class TaskConfig(_Section):
    """The contents of ``task.toml``."""

    version: str = "1.0"
    task: TaskIdentity = Field(default_factory=TaskIdentity)
    metadata: dict[str, Any] = Field(default_factory=dict)
    agent: AgentSettings = Field(default_factory=AgentSettings)
    verifier: VerifierSettings = Field(default_factory=VerifierSettings)
    environment: EnvironmentSettings = Field(default_factory=EnvironmentSettings)


@dataclass(frozen=True)
class Task:
    """A loaded task folder."""

    path: Path
    config: TaskConfig
    id: str

    @property
    def instruction(self) -> str:
        return (self.path / INSTRUCTION).read_text()

    @property
    def environment_file(self) -> Path | None:
        """The Dockerfile or compose file, if the task has one."""
        return next((self.path / f for f in ENVIRONMENT_FILES if (self.path / f).is_file()), None)

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
        raw = tomllib.loads(toml_path.read_text())
    except FileNotFoundError:
        raise TaskError(str(folder), "has no task.toml: it is not a Harbor task.", "add task.toml.") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise TaskError(str(toml_path), f"is not valid TOML ({e}).", "fix the syntax.") from None
    try:
        config = TaskConfig.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise TaskError(
            str(toml_path),
            f"{first['msg']}{more}.",
            "fix the value; see Harbor's task.toml reference.",
            _field_of(first),
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
