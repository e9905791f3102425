"""The config models for the three run types.

Every key a run config may set is a field here, with its docstring as the help text: ``runctl init`` templates,
the README's config table and validation messages are generated from these docstrings. Field names are the
lower-case form of the ``.env`` key (``exp_name`` is ``EXP_NAME``). Sections group fields for templates and docs;
the order of ``SECTIONS`` is the order users read them in.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError, PydanticUseDefault

RunType = Literal["train", "eval", "infer"]
RUN_TYPES: tuple[RunType, ...] = ("train", "eval", "infer")

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
_TEAM = r"^[a-z][a-z0-9-]{0,31}$"
#: A Kubernetes object name (DNS-1123 subdomain).
_K8S_NAME = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
#: The scaffolds whose agent runs from a bundle (``runctl.bundles.SPECS``).
BUNDLED_SCAFFOLDS = ("mswea", "cc", "oc", "ohsdk")


class Section(BaseModel):
    """Base of every config section: keys are the upper-case field names; unknown keys are refused."""

    model_config = ConfigDict(
        alias_generator=str.upper,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        validate_default=False,
        # Schemas are built on first validation: a command that validates one run type pays only for that one.
        defer_build=True,
    )
    title: ClassVar[str] = ""

    @field_validator("*", mode="before")
    @classmethod
    def _empty_means_default(cls, value: Any, info: Any) -> Any:
        # An .env file can only say "" for "not set": an optional key takes its default, a required one is an
        # error. "null" / "None" also mean unset where the default is None (Lego-RL configs write ROLLOUT_IS=null).
        if not isinstance(value, str):
            return value
        field = cls.model_fields[info.field_name]
        text = value.strip()
        if text == "":
            if field.is_required():
                raise PydanticCustomError("empty", "it must not be empty")
            raise PydanticUseDefault()
        if text in ("null", "None") and not field.is_required() and field.default is None:
            return None
        return value


class RunSection(Section):
    title: ClassVar[str] = "Run"
    run_type: RunType
    """Which runner executes this config: train (RL loop), eval (held-out score) or infer (rollout generation
    with the difficulty filter)."""
    team: str = Field("default", pattern=_TEAM)
    """Team that owns the run: sets its quota, its NATS subjects and who may see it (lower-case, digits, '-')."""
    priority: Literal["low", "normal", "high"] = "normal"
    """Order among the team's own queued runs; fair share between teams decides the rest."""
    engine: Literal["verl", "local", "fake"] = "local"
    """What executes the run: verl on a GPU cluster, local on one machine (vLLM on CPU or one GPU), or fake —
    no model at all, synthetic events only, for tests and the preview example."""


class IdentitySection(Section):
    title: ClassVar[str] = "Identity"
    project_name: str = Field(pattern=_NAME)
    """Project the experiment belongs to; names the checkpoint and trial folders (checkpoints/<project>/<exp>)."""
    exp_name: str = Field(pattern=_NAME)
    """Experiment name, unique within the project; the run id is <exp>-<date>-<16 hex> (64 random bits)."""


class RuntimeSection(Section):
    title: ClassVar[str] = "Runtime and outputs"
    output_dir: str | None = None
    """Folder for this run's artifacts; unset means $RUNCTL_HOME/runs/<team>/<run_id>."""
    venv_path: str | None = None
    """Python environment (with runctl installed) the run's processes use on every node: a submitted run's runner and
    its vLLM servers; `runctl run` is the runner itself, so there only the servers. Unset: the one runctl runs in."""
    logger: str = "console"
    """Comma-separated metric loggers besides runctl's own events: console, wandb, mlflow, swanlab, tensorboard,
    clearml, trackio, file. Those that log in need their credentials where the run starts (credentials.logger)."""
    wandb_api_key: str | None = Field(None, json_schema_extra={"secret": True})
    """Weights & Biases key, needed when LOGGER includes wandb and WANDB_MODE is online. Never echoed back."""
    wandb_mode: Literal["online", "offline", "disabled"] = "online"
    """Weights & Biases mode when LOGGER includes wandb; offline needs no key."""
    max_retries: int = Field(2, ge=0)
    """Submitted runs: times a runner that dies (its process or its node lost) is started again; it resumes where the
    last one stopped, without redoing finished trials. The run fails after MAX_RETRIES + 1 runners. (`runctl run`
    is its own runner: resume it with --run-id.)"""


class ClusterSection(Section):
    title: ClassVar[str] = "Cluster and topology"
    ray_address: str | None = None
    """Ray cluster to attach to (ray://host:10001 or host:6379); unset starts a local Ray head."""
    model_root: str | None = None
    """Folder holding the cluster's models (usually set once in site.env); use it as ${MODEL_ROOT}/name."""
    nnodes: int = Field(1, ge=1)
    """Nodes the run needs in total; the runner waits until this many Ray nodes are alive."""
    ngpus_per_node: int = Field(8, ge=0)
    """GPUs on each node (0 on a CPU-only machine)."""
    gpu_memory_gb: float = Field(80.0, gt=0)
    """Memory of one GPU in GiB, for the memory-fit estimate."""
    gen_tp: int = Field(4, ge=1)
    """Tensor parallel size of each vLLM replica; must divide the model's attention and KV heads."""
    gen_dp: int = Field(1, ge=1)
    """Number of vLLM replicas (data parallel) serving rollouts."""


class ModelSection(Section):
    title: ClassVar[str] = "Model"
    model_path: str
    """Folder of the model (Hugging Face format: config.json, weights, tokenizer) or of an HF checkpoint."""
    served_model_name: str = "vllm_model"
    """Name the model is served under; agents may use it or an alias."""
    tool_call_parser: str = "hermes"
    """vLLM tool-call parser matching the model family (hermes, qwen3_coder, llama3_json, mistral, …);
    a wrong one means zero parsed tool calls and a dead run at step 0."""
    max_model_len: int | None = Field(None, ge=1)
    """vLLM max model length; unset means prompt + response length (train) or the model's own limit."""


class AgentSection(Section):
    title: ClassVar[str] = "Agent and sandbox"
    scaffold: Literal["terminal", "installed", "mswea", "ohsdk", "oh", "cc", "oc"] = "terminal"
    """Agent scaffold: terminal (runctl's built-in, on the host), installed (AGENT_COMMAND, inside the sandbox),
    mswea (mini-swe-agent), cc (Claude Code), oc (OpenCode) and ohsdk (OpenHands SDK), each inside the sandbox from
    its bundle (`runctl agents build SCAFFOLD`), oh (OpenHands: refused)."""
    agent_name: str | None = None
    """Agent loop name inside the scaffold; unset picks the scaffold's default."""
    agent_version: str | None = None
    """A bundled scaffold's agent version (SCAFFOLD=mswea, cc, oc or ohsdk): the bundle `runctl agents build SCAFFOLD
    --version V` made on the runner's machine; unset picks the scaffold's default version."""
    agent_command: str | None = None
    """SCAFFOLD=installed: the shell command that starts the agent inside the sandbox. It finds its model at
    OPENAI_BASE_URL / ANTHROPIC_BASE_URL (its proxy session; the only address it can reach), the model's name in
    RUNCTL_MODEL and the task in RUNCTL_INSTRUCTION_FILE."""
    backend: Literal["local", "docker", "k8s"] = "local"
    """Where sandboxes run: local (bubblewrap on this machine), docker (Docker Engine) or k8s (one pod each)."""
    agent_max_iterations: int = Field(200, ge=1)
    """Most agent turns per trial; a trial that reaches it ends as max_turns."""
    agent_timeout_sec: int = Field(2400, ge=1)
    """Wall-clock limit of the agent phase of one trial, in seconds; the verifier still runs after it."""
    sandbox_retries: int = Field(2, ge=0)
    """Retries of a trial whose sandbox failed to start (not of a trial the agent failed)."""
    sandbox_cpus: float | None = Field(None, gt=0)
    """CPU cores of every sandbox, over each task's [environment] cpus; unset means each task's own."""
    sandbox_memory_mb: int | None = Field(None, ge=64)
    """Memory limit of every sandbox in MiB, over each task's [environment] memory_mb; unset means each task's own."""
    agent_network: Literal["no-network", "allowlist", "public"] | None = None
    """Egress of the agent's sandbox for every task, over each task's network_mode (unset: the task's own; its
    default is no-network). allowlist would admit only AGENT_ALLOWED_HOSTS: no backend enforces one yet."""
    agent_allowed_hosts: str = ""
    """Comma-separated hosts the agent may reach when AGENT_NETWORK=allowlist (not built yet)."""
    verifier_network: Literal["no-network", "public"] | None = None
    """Egress of a separate verifier's sandbox (tasks with [verifier] environment_mode = "separate"), over the
    task's own; a verifier that shares the agent's sandbox has the agent's network, so it must match then."""
    image_registry: str | None = None
    """Registry holding prebuilt task images (prebuilt source); set this or IMAGE_BUILD, not both."""
    image_build: bool | None = None
    """Build task images from their Dockerfiles (inline source); set this or IMAGE_REGISTRY, not both."""
    docker_host: str | None = None
    """Docker Engine address for BACKEND=docker (unix:///path/docker.sock or tcp://host:2376)."""
    kubeconfig: str | None = None
    """Kubeconfig file for BACKEND=k8s; unset means in-cluster credentials."""
    k8s_namespace: str = "runctl"
    """Namespace for sandbox pods when BACKEND=k8s."""
    pod_startup_timeout_sec: int = Field(1200, ge=1)
    """How long a sandbox pod may take to become ready, in seconds."""
    pod_active_deadline_sec: int = Field(6000, ge=1)
    """Hard lifetime of a sandbox pod, in seconds, after which Kubernetes kills it."""
    k8s_bundle_claim: str | None = Field(None, pattern=_K8S_NAME)
    """BACKEND=k8s with a bundled scaffold (mswea, cc, oc, ohsdk): the PersistentVolumeClaim in K8S_NAMESPACE that
    holds the runner's agent bundles folder (RUNCTL_AGENTS_DIR, filled by `runctl agents build`); each sandbox pod
    mounts its bundle from it read-only. Like K8S_NAMESPACE, a fact of the cluster that site.env may set for every
    run: other runs do not read it."""

    @model_validator(mode="after")
    def _installed_agent_has_a_command(self) -> AgentSection:
        if self.scaffold == "installed" and not self.agent_command:
            raise PydanticCustomError(
                "cross_field",
                "SCAFFOLD=installed needs AGENT_COMMAND: the command that starts the agent inside the sandbox",
                {"keys": ["SCAFFOLD", "AGENT_COMMAND"]},
            )
        return self

    @model_validator(mode="after")
    def _pods_find_their_bundle(self) -> AgentSection:
        bundled = self.scaffold in BUNDLED_SCAFFOLDS
        if self.backend == "k8s" and bundled and not self.k8s_bundle_claim:
            raise PydanticCustomError(
                "cross_field",
                "SCAFFOLD={scaffold} on BACKEND=k8s needs K8S_BUNDLE_CLAIM: the PersistentVolumeClaim holding the "
                "agent bundles (the runner's RUNCTL_AGENTS_DIR), which each sandbox pod mounts its bundle from",
                {"keys": ["SCAFFOLD", "BACKEND", "K8S_BUNDLE_CLAIM"], "scaffold": self.scaffold},
            )
        return self


class FlagsSection(Section):
    title: ClassVar[str] = "Launch flags (environment only)"
    preflight_only: bool = False
    """Run every check and stop: nothing is launched or published. Set as PREFLIGHT_ONLY=1 in the environment."""
    dry_run: bool = False
    """Run the checks and print the resolved config (every key, its value and the layer that set it) and what would
    be launched, without launching or publishing. Environment only."""


class FakeEngineSection(Section):
    title: ClassVar[str] = "Fake engine (ENGINE=fake only)"
    fake_step_delay_sec: float = Field(0.05, ge=0, le=60)
    """ENGINE=fake only: pause between synthetic events, in seconds."""
    fake_num_steps: int = Field(4, ge=1, le=100_000)
    """ENGINE=fake only: synthetic training steps (train) or trials per task (infer, eval)."""
    fake_fail_at: Literal["", "cluster", "replicas", "loop", "outputs"] = ""
    """ENGINE=fake only: make the run fail in this phase, to exercise failure handling."""


class TrainDataSection(Section):
    title: ClassVar[str] = "Training data and schedule"
    training_mode: Literal["sync", "async"] = "sync"
    """sync: rollout and training take turns on the same GPUs; async: separate rollout and trainer pools."""
    model_engine: Literal["fsdp", "veomni"] = "fsdp"
    """Training backend inside verl."""
    train_files: str
    """Parquet task index to train on (one row per task)."""
    val_files: str | None = None
    """Parquet task index for validation during training; unset skips validation."""
    n_nodes_train: int | None = Field(None, ge=1)
    """Nodes for the trainer; unset means all NNODES (sync) — NNODES must equal train + rollout nodes."""
    n_nodes_rollout: int | None = Field(None, ge=0)
    """Nodes for rollout (async mode); unset means 0 (sync shares the training nodes)."""
    sp_size: int = Field(1, ge=1)
    """Ulysses sequence parallel size; must divide the training world size."""
    ep_size: int = Field(1, ge=1)
    """Expert parallel size (MoE models)."""
    train_bsz: int = Field(64, ge=1)
    """Tasks per training step; each gets N_RESP trials (64 × 8 = 512 trials a step)."""
    train_mini_bsz: int = Field(64, ge=1)
    """PPO mini-batch size in tasks; TRAIN_BSZ must be a multiple of it."""
    train_micro_bsz_per_gpu: int = Field(1, ge=1)
    """Micro-batch per GPU for the forward/backward pass (verl ignores it with USE_DYNAMIC_BSZ); ENGINE=local takes a
    step's whole batch in one pass unless it is set."""
    n_resp: int = Field(8, ge=1)
    """Trials (responses) per task in a step; GRPO needs at least 2."""
    use_dynamic_bsz: bool = False
    """Pack micro-batches by token count instead of a fixed size."""
    max_prompt: int = Field(30000, ge=1)
    """Longest prompt in tokens."""
    max_resp: int = Field(32768, ge=1)
    """Longest response (all agent turns) in tokens."""
    total_epochs: int = Field(1, ge=1)
    """Passes over TRAIN_FILES."""
    total_training_steps: int | None = Field(None, ge=1)
    """Stop after this many steps; needed by decaying LR schedules (else the step count is unknown)."""
    save_freq: int = Field(10, ge=-1)
    """Save a checkpoint every this many steps (-1: only at the end)."""
    test_freq: int = Field(10, ge=-1)
    """Validate every this many steps (-1: never)."""
    val_before_train: bool = True
    """Validate once before the first step."""
    max_ckpt_to_keep: int | None = Field(None, ge=1)
    """Keep only the newest this many checkpoints; unset keeps all."""


class AlgorithmSection(Section):
    title: ClassVar[str] = "Algorithm"
    adv_estimator: Literal["grpo", "gae", "rloo", "reinforce_plus_plus", "remax", "opo", "gpg"] = "grpo"
    """Advantage estimator."""
    policy_loss_mode: Literal["vanilla", "gspo", "clip_cov", "kl_cov", "gpg", "geo_mean"] = "gspo"
    """Policy loss."""
    use_kl_loss: bool = True
    """Add a KL term against the reference policy to the loss."""
    kl_loss_coef: float = Field(0.001, ge=0)
    """Weight of the KL loss."""
    entropy_coeff: float = Field(0.0, ge=0)
    """Weight of the entropy bonus."""
    actor_lr: float = Field(1e-6, gt=0, lt=1)
    """Actor learning rate."""
    lr_scheduler: Literal["constant", "cosine", "linear"] = "constant"
    """Learning-rate schedule; cosine and linear decay over TOTAL_TRAINING_STEPS."""
    lr_warmup_steps: int = Field(0, ge=0)
    """Linear warm-up steps."""
    clip_ratio_low: float | None = Field(None, gt=0, lt=1)
    """Lower clip of the policy ratio (1 − this); unset: 0.2 for POLICY_LOSS_MODE=vanilla, 3e-4 for gspo."""
    clip_ratio_high: float | None = Field(None, gt=0)
    """Upper clip of the policy ratio (1 + this); unset: 0.28 for POLICY_LOSS_MODE=vanilla, 4e-4 for gspo."""
    rollout_is: Literal["token", "sequence"] | None = None
    """Rollout importance-sampling correction level; unset disables it."""
    enable_r3: bool = False
    """R3, rollout routing replay (MoE only): replay the experts vLLM chose at rollout during training."""
    veomni_fused_kernels: bool = False
    """VeOmni fused kernels (must stay off: backward crashes otherwise)."""
    veomni_activation_offload: bool = False
    """VeOmni activation offload (must stay off: backward crashes otherwise)."""


class RolloutSection(Section):
    title: ClassVar[str] = "Rollout"
    gpu_mem_util: float | None = Field(None, gt=0, le=1)
    """Share of GPU memory vLLM may take; unset means 0.6 (sync) or 0.85 (async)."""
    temperature: float = Field(1.0, ge=0)
    """Sampling temperature for training rollouts."""
    val_temperature: float = Field(0.7, ge=0)
    """Sampling temperature for validation."""
    agent_num_workers: int = Field(128, ge=1)
    """Agent-loop workers running trials in parallel."""
    val_agent_timeout_sec: int = Field(4800, ge=1)
    """Agent timeout for validation trials, in seconds."""
    traj_filter_timeout: bool = True
    """Drop trials that ended by timeout from the loss."""
    traj_filter_env_setup_failed: bool = True
    """Drop trials whose sandbox failed to set up from the loss."""
    traj_filter_overlong: bool = True
    """Drop trials that ran past the context length from the loss."""
    traj_filter_error: bool = False
    """Drop trials whose agent ended on an error (its own message: a broken format, a crash) from the loss, whatever
    the verifier gave them."""
    vllm_ready_timeout: int = Field(900, ge=1)
    """Seconds to wait for the vLLM server to become ready."""


class AsyncSection(Section):
    title: ClassVar[str] = "Fully async (TRAINING_MODE=async)"
    partial_rollout: bool = False
    """Resume in-flight requests after a weight sync instead of discarding them."""
    staleness: float = Field(0.0, ge=0)
    """Staleness threshold: how far behind the trainer rollouts may be."""
    require_batches: int = Field(1, ge=1)
    """Batches the trainer waits for before a step."""
    trigger_parameter_sync_step: int = Field(1, ge=1)
    """Trainer steps between weight syncs to the rollout pool."""
    total_rollout_steps: int | None = Field(None, ge=1)
    """Rollout steps in total (async); unset derives it from the data."""


class EvalOnCheckpointSection(Section):
    title: ClassVar[str] = "Evaluation on every checkpoint"
    eval_on_checkpoint: bool = False
    """Submit an eval run for each saved checkpoint, within the team's quota."""
    eval_dataset: str | None = None
    """Held-out task index (parquet) or task folder those eval runs score on."""
    eval_n_trials: int = Field(4, ge=1)
    """Trials per task in each of those eval runs (pass@1 is their mean; more trials, a narrower interval)."""
    eval_temperature: float = Field(0.7, ge=0)
    """Sampling temperature of those eval runs."""

    @model_validator(mode="after")
    def _eval_dataset_needed(self) -> EvalOnCheckpointSection:
        if self.eval_on_checkpoint and not self.eval_dataset:
            raise PydanticCustomError(
                "cross_field",
                "EVAL_ON_CHECKPOINT=1 needs EVAL_DATASET: without it there is nothing to evaluate checkpoints on",
                {"keys": ["EVAL_ON_CHECKPOINT", "EVAL_DATASET"]},
            )
        return self


class EvalDataSection(Section):
    title: ClassVar[str] = "Evaluation"
    dataset_path: str | None = Field(None, json_schema_extra={"in_template": "CHANGEME"})
    """Held-out task index (parquet) or task folder; set this or DATASET_NAME, exactly one."""
    dataset_name: str | None = None
    """Name of a registered dataset; set this or DATASET_PATH, exactly one."""
    n_tasks: int | None = Field(None, ge=1)
    """Score only the first this many tasks; unset scores all."""
    n_trials: int = Field(1, ge=1)
    """Trials per task; more than 1 also reports pass@k."""
    eval_temperature: float = Field(0.7, ge=0)
    """Sampling temperature."""
    max_input_tokens: int | None = Field(None, ge=1)
    """Context budget of the agent in tokens; a trial past it ends as overlong."""
    max_output_tokens: int | None = Field(None, ge=1)
    """Most tokens per model call."""
    n_concurrent: int = Field(16, ge=1)
    """Trials in flight at once."""
    gpu_mem_util: float | None = Field(None, gt=0, le=1)
    """Share of GPU memory vLLM may take; unset means vLLM's default (0.9). A checkpoint's eval run gets its train
    run's, as it shares the GPUs with the training."""
    vllm_ready_timeout: int = Field(900, ge=1)
    """Seconds to wait for the vLLM server to become ready."""
    parent_run: str | None = None
    """Set by runctl on eval runs it submits for a checkpoint: the train run the checkpoint belongs to."""
    checkpoint_step: int | None = Field(None, ge=0)
    """Set by runctl on eval runs it submits for a checkpoint: the step of that checkpoint."""

    @model_validator(mode="after")
    def _exactly_one_dataset(self) -> EvalDataSection:
        if (self.dataset_path is None) == (self.dataset_name is None):
            raise PydanticCustomError(
                "cross_field",
                "set exactly one of DATASET_PATH and DATASET_NAME: the eval runner reads its tasks from one source",
                {"keys": ["DATASET_PATH", "DATASET_NAME"]},
            )
        return self


class InferDataSection(Section):
    title: ClassVar[str] = "Rollout generation and difficulty filter"
    index_file: str
    """Parquet task index (or task folder) to attempt."""
    results_dir: str | None = None
    """Folder for per-trial results; unset means <run folder>/results."""
    output_index: str | None = None
    """Where the filtered index is written (same row format); unset means <run folder>/filtered.parquet."""
    instances_file: str | None = None
    """Optional file listing the task ids to attempt, one per line."""
    n_trials: int = Field(4, ge=1)
    """Attempts per task."""
    n_concurrent: int = Field(16, ge=1)
    """Trials in flight at once."""
    temperature: float = Field(1.0, ge=0)
    """Sampling temperature (the training temperature, so pass rates predict training)."""
    trial_hard_timeout_sec: int = Field(3600, ge=1)
    """Hard limit on one whole trial (setup, agent, verifier), in seconds."""
    vllm_ready_timeout: int = Field(900, ge=1)
    """Seconds to wait for the vLLM server to become ready."""
    filter_min_pass_rate: float = Field(0.0, ge=0, le=1)
    """Keep tasks whose pass rate is strictly above this."""
    filter_max_pass_rate: float = Field(1.0, ge=0, le=1)
    """Keep tasks whose pass rate is strictly below this."""

    @model_validator(mode="after")
    def _band_not_empty(self) -> InferDataSection:
        if self.filter_min_pass_rate >= self.filter_max_pass_rate:
            raise PydanticCustomError(
                "cross_field",
                "FILTER_MIN_PASS_RATE must be below FILTER_MAX_PASS_RATE: the band keeps no task otherwise",
                {"keys": ["FILTER_MIN_PASS_RATE", "FILTER_MAX_PASS_RATE"]},
            )
        return self


_COMMON: tuple[type[Section], ...] = (
    RunSection,
    IdentitySection,
    ModelSection,
    ClusterSection,
    AgentSection,
    RuntimeSection,
)
_TAIL: tuple[type[Section], ...] = (FakeEngineSection, FlagsSection)


class TrainConfig(
    FlagsSection,
    FakeEngineSection,
    EvalOnCheckpointSection,
    AsyncSection,
    RolloutSection,
    AlgorithmSection,
    TrainDataSection,
    RuntimeSection,
    AgentSection,
    ClusterSection,
    ModelSection,
    IdentitySection,
    RunSection,
):
    """A train run: the RL loop, checkpoints every SAVE_FREQ steps."""

    run_type: Literal["train"]
    """Which runner executes this config; this model is the train runner's."""


class EvalConfig(
    FlagsSection,
    FakeEngineSection,
    EvalDataSection,
    RuntimeSection,
    AgentSection,
    ClusterSection,
    ModelSection,
    IdentitySection,
    RunSection,
):
    """An eval run: trials on held-out tasks, pass@1 / pass@k with intervals."""

    run_type: Literal["eval"]
    """Which runner executes this config; this model is the eval runner's."""


class InferConfig(
    FlagsSection,
    FakeEngineSection,
    InferDataSection,
    RuntimeSection,
    AgentSection,
    ClusterSection,
    ModelSection,
    IdentitySection,
    RunSection,
):
    """An infer run: N_TRIALS attempts per task, pass rates, and the difficulty-filtered index."""

    run_type: Literal["infer"]
    """Which runner executes this config; this model is the infer runner's."""


RunConfig = TrainConfig | EvalConfig | InferConfig

MODELS: dict[RunType, type[TrainConfig] | type[EvalConfig] | type[InferConfig]] = {
    "train": TrainConfig,
    "eval": EvalConfig,
    "infer": InferConfig,
}

SECTIONS: dict[RunType, tuple[type[Section], ...]] = {
    "train": (
        *_COMMON[:3],
        TrainDataSection,
        AlgorithmSection,
        RolloutSection,
        AsyncSection,
        EvalOnCheckpointSection,
        *_COMMON[3:],
        *_TAIL,
    ),
    "eval": (*_COMMON[:3], EvalDataSection, *_COMMON[3:], *_TAIL),
    "infer": (*_COMMON[:3], InferDataSection, *_COMMON[3:], *_TAIL),
}

#: Keys the process environment may override (the last layer). Every other key comes from files.
ENV_OVERRIDES: tuple[str, ...] = ("PREFLIGHT_ONLY", "DRY_RUN")


def section_keys(section: type[Section]) -> list[str]:
    """The ``.env`` keys a section declares itself (not inherited), in declaration order."""
    own = section.__dict__.get("__annotations__", {})
    return [name.upper() for name in own if not name.startswith("_") and name in section.model_fields]


def keys_for(run_type: RunType) -> list[str]:
    """Every key a config of this run type may set."""
    return [field.alias or name.upper() for name, field in MODELS[run_type].model_fields.items()]


def all_keys() -> dict[str, list[RunType]]:
    """Every known key, with the run types it applies to."""
    found: dict[str, list[RunType]] = {}
    for run_type in RUN_TYPES:
        for key in keys_for(run_type):
            found.setdefault(key, []).append(run_type)
    return found


def is_secret(run_type: RunType, key: str) -> bool:
    """True for keys whose values must never be echoed (tokens, API keys)."""
    field = MODELS[run_type].model_fields.get(key.lower())
    extra = field.json_schema_extra if field else None
    return isinstance(extra, dict) and bool(extra.get("secret"))
