"""One frozen payload model per lifecycle event.

Each model names its event (``event_name``, the subject suffix), its version, and the JetStream stream that
holds it. The CloudEvents ``type`` is ``runctl.<event_name>.v<version>``. Payloads that an engine may fabricate
(the ``fake`` engine) carry ``synthetic: true`` so no one mistakes them for measurements.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from runctl.events.checks import CheckResult

RUNS_STREAM = "RUNS"
TRIALS_STREAM = "TRIALS"

Phase = Literal["resolve", "validate", "environment", "ray", "replicas", "proxy", "loop", "outputs"]
PHASES: tuple[Phase, ...] = ("resolve", "validate", "environment", "ray", "replicas", "proxy", "loop", "outputs")
TerminationReason = Literal["agent_completed", "timeout", "overlong", "max_turns", "env_setup_failed", "error"]


class Payload(BaseModel):
    """Base of every event payload."""

    # NaN and infinities (a diverged loss) travel as the strings "NaN" / "Infinity": valid JSON that parses back.
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")
    event_name: ClassVar[str]
    publisher: ClassVar[str]
    version: ClassVar[int] = 1
    stream: ClassVar[str] = RUNS_STREAM

    @classmethod
    def type_string(cls) -> str:
        """The versioned CloudEvents type, e.g. ``runctl.checkpoint.saved.v1``."""
        return f"runctl.{cls.event_name}.v{cls.version}"


class ConfigSubmitted(Payload):
    event_name: ClassVar[str] = "config.submitted"
    publisher: ClassVar[str] = "runctl CLI / SDK"
    run_type: Literal["train", "eval", "infer"]
    project_name: str
    exp_name: str
    engine: str
    priority: str = "normal"
    config_path: str
    raw_config: str
    """The config text as written (secret values redacted)."""
    resolved: dict[str, dict[str, str | None]]
    """Every key: its value, the layer that set it, and where."""
    submitter: str
    via: Literal["cli", "sdk", "launcher", "foreground"] = "cli"
    """How it came: ``foreground`` is a run that ``runctl run`` carries itself (it publishes its own verdict; the
    launcher does not admit it)."""


class ConfigValidated(Payload):
    event_name: ClassVar[str] = "config.validated"
    publisher: ClassVar[str] = "validator"
    checks: list[CheckResult]


class ConfigRejected(Payload):
    event_name: ClassVar[str] = "config.rejected"
    publisher: ClassVar[str] = "validator"
    checks: list[CheckResult]
    num_fatal: int = Field(ge=1)


class RunQueued(Payload):
    event_name: ClassVar[str] = "run.queued"
    publisher: ClassVar[str] = "launcher"
    position: int = Field(ge=0)
    reason: str


class RunAdmitted(Payload):
    event_name: ClassVar[str] = "run.admitted"
    publisher: ClassVar[str] = "launcher"
    resources: dict[str, float]
    quota_decision: str


class PhaseStarted(Payload):
    event_name: ClassVar[str] = "phase.started"
    publisher: ClassVar[str] = "runner (launcher)"
    phase: Phase
    total: int | None = Field(None, ge=0)
    """The units the phase will do, where known: trials for the loop of an infer or eval run, steps for a train run's
    loop (so a dashboard can show progress)."""


class ClusterReady(Payload):
    event_name: ClassVar[str] = "cluster.ready"
    publisher: ClassVar[str] = "runner (launcher)"
    ray_address: str
    num_nodes: int = Field(ge=0)
    num_nodes_expected: int = Field(ge=1)
    num_gpus: float = Field(ge=0)
    num_cpus: float = Field(ge=0)
    synthetic: bool = False


class ReplicasReady(Payload):
    event_name: ClassVar[str] = "replicas.ready"
    publisher: ClassVar[str] = "runner (launcher)"
    addresses: list[str]
    dp: int = Field(ge=1)
    tp: int = Field(ge=1)
    model: str
    health: str
    synthetic: bool = False


class TrialFinished(Payload):
    event_name: ClassVar[str] = "trial.finished"
    publisher: ClassVar[str] = "runner (launcher)"
    stream: ClassVar[str] = TRIALS_STREAM
    task: str
    trial: int = Field(ge=0)
    reward: float | None
    termination_reason: TerminationReason
    durations_s: dict[str, float] = Field(default_factory=dict)
    tokens: dict[str, int] = Field(default_factory=dict)
    synthetic: bool = False


class StepDone(Payload):
    event_name: ClassVar[str] = "step.done"
    publisher: ClassVar[str] = "engine"
    step: int = Field(ge=0)
    metrics: dict[str, float]
    synthetic: bool = False


class CheckpointSaved(Payload):
    event_name: ClassVar[str] = "checkpoint.saved"
    publisher: ClassVar[str] = "engine"
    step: int = Field(ge=0)
    path: str
    format: Literal["fsdp", "hf"]
    num_bytes: int = Field(ge=0)
    synthetic: bool = False


class PluginFailed(Payload):
    event_name: ClassVar[str] = "plugin.failed"
    publisher: ClassVar[str] = "engine (runctl's plugin inside verl)"
    plugin: Literal["checkpoint_callback", "agent_loop", "step_log"]
    """Which of runctl's hooks inside verl failed; training went on (a hook never aborts it)."""
    step: int | None = Field(None, ge=0)
    error_type: str
    message: str
    """What failed and what it costs: a checkpoint not announced (so no eval run of it), a trial not recorded."""


class EvalRequested(Payload):
    event_name: ClassVar[str] = "eval.requested"
    publisher: ClassVar[str] = "launcher"
    parent_run: str
    checkpoint_step: int = Field(ge=0)
    eval_run_id: str


class RunSucceeded(Payload):
    event_name: ClassVar[str] = "run.succeeded"
    publisher: ClassVar[str] = "launcher"
    summary: dict[str, Any] = Field(default_factory=dict)
    score: float | None = None
    synthetic: bool = False
    num_trials: int = Field(0, ge=0)
    """How many trial.finished events the run published, so a reader knows when it has them all."""


class RunFailed(Payload):
    event_name: ClassVar[str] = "run.failed"
    publisher: ClassVar[str] = "launcher"
    phase: Phase | Literal["admission"]
    error_type: str
    message: str
    num_trials: int = Field(0, ge=0)
    """How many trial.finished events the run published, so a reader knows when it has them all."""
    fix: str = ""
    """What to do about it, where the error names a fix (also the end of ``message``)."""
    attempts: int = Field(1, ge=1)
    """How many times a runner was started for this run (a runner that dies is started again, MAX_RETRIES times)."""


class RunCancelled(Payload):
    event_name: ClassVar[str] = "run.cancelled"
    publisher: ClassVar[str] = "launcher"
    requested_by: str
    phase: Phase | Literal["admission", "queue"]
    num_trials: int = Field(0, ge=0)
    """How many trial.finished events the run published, so a reader knows when it has them all."""


class SandboxCreated(Payload):
    event_name: ClassVar[str] = "sandbox.created"
    publisher: ClassVar[str] = "sandbox"
    stream: ClassVar[str] = TRIALS_STREAM
    sandbox_id: str
    backend: str
    trial: str = ""
    image: str = ""
    owner: str
    """The sandbox service instance that made it (the reaper's unit of liveness)."""
    seconds: float = Field(0.0, ge=0)


class SandboxDestroyed(Payload):
    event_name: ClassVar[str] = "sandbox.destroyed"
    publisher: ClassVar[str] = "sandbox"
    stream: ClassVar[str] = TRIALS_STREAM
    sandbox_id: str
    backend: str
    trial: str = ""
    reason: Literal["released", "reaped_owner_gone", "reaped_run_ended", "error"]
    """released: its user was done; reaped_*: the reaper removed an orphan, and why."""


class CancelRequested(Payload):
    event_name: ClassVar[str] = "cancel.requested"
    publisher: ClassVar[str] = "runctl CLI / SDK"
    requested_by: str
    reason: str = ""


PAYLOADS: tuple[type[Payload], ...] = (
    ConfigSubmitted,
    ConfigValidated,
    ConfigRejected,
    RunQueued,
    RunAdmitted,
    PhaseStarted,
    ClusterReady,
    ReplicasReady,
    TrialFinished,
    StepDone,
    CheckpointSaved,
    PluginFailed,
    EvalRequested,
    RunSucceeded,
    RunFailed,
    RunCancelled,
    CancelRequested,
    SandboxCreated,
    SandboxDestroyed,
)
BY_TYPE: dict[str, type[Payload]] = {p.type_string(): p for p in PAYLOADS}
BY_NAME: dict[str, type[Payload]] = {p.event_name: p for p in PAYLOADS}
