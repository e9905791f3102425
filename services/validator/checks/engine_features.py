"""Class 7: what the training engine supports, and the silent pitfalls of the algorithm settings."""

from __future__ import annotations

from runctl.config.models import RunConfig
from services.validator.checks.common import train_config
from services.validator.registry import Context, Verdict, check, fatal, ok, skip, warn
from services.validator.rules import DECAYING_SCHEDULES, ENGINES, NOT_BUILT

ENGINE = 7


@check("engine.veomni_flags", ENGINE, "a crash in the backward pass of the first step", ["train"])
def veomni_flags(ctx: Context) -> Verdict:
    c = train_config(ctx)
    on = [f for f in ENGINES[c.model_engine].forbidden_flags if getattr(c, f.lower())]
    if on:
        return fatal(
            f"{', '.join(on)} must stay off with MODEL_ENGINE={c.model_engine}: the backward pass crashes.",
            f"set {'=0, '.join(on)}=0.",
        )
    return ok(f"MODEL_ENGINE={c.model_engine} flags are safe")


@check(
    "engine.r3",
    ENGINE,
    "R3 on a dense model, or MoE training whose routing drifts from rollout",
    ["train"],
    needs_facts=True,
)
def routing_replay(ctx: Context) -> Verdict:
    c, facts = train_config(ctx), ctx.facts
    assert facts is not None
    features = ENGINES[c.model_engine]
    if c.enable_r3 and not facts.is_moe:
        return fatal(f"ENABLE_R3=1 on a dense {facts.family} model: there is no routing to replay.", "set ENABLE_R3=0.")
    if c.enable_r3 and not features.routing_replay:
        return fatal(f"MODEL_ENGINE={c.model_engine} cannot replay routing.", "set ENABLE_R3=0 or change engine.")
    if c.enable_r3 and c.sp_size > 1 and not features.sequence_parallel_with_r3:
        return fatal(
            f"MODEL_ENGINE={c.model_engine} with ENABLE_R3=1 needs SP_SIZE=1 (SP_SIZE={c.sp_size}).",
            "set SP_SIZE=1 or use MODEL_ENGINE=veomni.",
        )
    if facts.is_moe and not c.enable_r3:
        return warn(
            f"a MoE model ({facts.num_experts} experts) without R3: training routes differently from rollout, "
            "which hurts the logprob match.",
            "consider ENABLE_R3=1.",
        )
    return ok("R3 setting fits the model" + (" (MoE, R3 on)" if c.enable_r3 else " (dense)"))


@check("engine.lr_schedule", ENGINE, "a learning rate that silently decays to zero", ["train"])
def lr_schedule(ctx: Context) -> Verdict:
    c = train_config(ctx)
    if c.training_mode == "async" and c.lr_scheduler in DECAYING_SCHEDULES:
        return ok(f"LR_SCHEDULER={c.lr_scheduler} over the steps verl's async trainer counts from its rollouts")
    if c.lr_scheduler in DECAYING_SCHEDULES and c.total_training_steps is None:
        return fatal(
            f"LR_SCHEDULER={c.lr_scheduler} decays over a step count the run does not know: "
            "the learning rate collapses to 0.",
            "set TOTAL_TRAINING_STEPS, or LR_SCHEDULER=constant.",
        )
    return ok(f"LR_SCHEDULER={c.lr_scheduler}")


@check("engine.rollout_is", ENGINE, "importance weights that starve the gradient", ["train"])
def rollout_is(ctx: Context) -> Verdict:
    c = train_config(ctx)
    if c.rollout_is == "sequence":
        return warn(
            "ROLLOUT_IS=sequence multiplies token ratios over long agent trajectories: the weights collapse "
            "and starve the gradient.",
            "prefer ROLLOUT_IS=token.",
        )
    return ok(f"ROLLOUT_IS={c.rollout_is or 'off'}")


#: What ENGINE=fake reads (services/launcher/engines/fake.py): the rest of a config changes nothing in a synthetic
#: run.
FAKE_READS = frozenset(
    {"RUN_TYPE", "TEAM", "PRIORITY", "ENGINE", "PROJECT_NAME", "EXP_NAME", "OUTPUT_DIR", "PREFLIGHT_ONLY", "DRY_RUN"}
    | {"NNODES", "NGPUS_PER_NODE", "GEN_DP", "GEN_TP", "SERVED_MODEL_NAME", "N_RESP", "SAVE_FREQ", "MAX_RETRIES"}
)


@check(
    "engine.not_built", ENGINE, "a run that starts, then ignores or fails on a setting this build does not carry out"
)
def not_built(ctx: Context) -> Verdict:
    c = ctx.config
    asked = [row for row in NOT_BUILT if row.applies(c)]
    if asked:
        return fatal(
            "; ".join(f"{_shown(c, row.key)}: {row.missing}" for row in asked) + ".",
            "; ".join(f"{row.fix}" for row in asked) + ".",
        )
    if c.engine == "fake":
        fields = type(c).model_fields
        ignored = sorted(
            k
            for k in c.model_fields_set
            if k.upper() not in FAKE_READS and not k.startswith("fake_") and not fields[k].is_required()
        )
        if ignored:
            shown = ", ".join(k.upper() for k in ignored[:8]) + (" …" if len(ignored) > 8 else "")
            return warn(
                f"ENGINE=fake makes synthetic events only: {shown} change nothing in this run.",
                "use ENGINE=local (infer, eval) for a real run.",
            )
        return ok("ENGINE=fake: a synthetic preview of the run's lifecycle")
    return ok(f"everything this {c.run_type} run asks of ENGINE={c.engine} is built")


def _shown(config: RunConfig, key: str) -> str:
    """``KEY=value`` for a row's key; for a family (``FAKE_*``) or a list (``A, B``) of keys, the ones set."""
    if key.endswith("*") or ", " in key:
        names = [k.strip() for k in key.split(",")]
        chosen = [
            k
            for k in sorted(config.model_fields_set)
            if any(k.upper() == n or (n.endswith("*") and k.upper().startswith(n[:-1])) for n in names)
        ]
        return ", ".join(f"{k.upper()}={_value(config, k)}" for k in chosen) or key
    return f"{key}={_value(config, key)}"


def _value(config: RunConfig, key: str) -> str:
    value = getattr(config, key.lower(), None)
    return "1" if value is True else "0" if value is False else str(value)


#: What ENGINE=verl's runner and verl's workers import: the GPU set (``scripts/setup.sh --gpu``).
VERL_RUNTIME = ("verl", "vllm", "torch", "ray")
_PROBE = "import importlib.util as u, sys; print(','.join(m for m in sys.argv[1:] if u.find_spec(m) is None))"


def missing_modules(python: str | None, modules: tuple[str, ...] = VERL_RUNTIME) -> list[str]:
    """The modules ``python`` (None: this interpreter) cannot import. Another interpreter is asked in a child."""
    import importlib.util
    import subprocess

    if python is None:
        return [m for m in modules if importlib.util.find_spec(m) is None]
    try:
        found = subprocess.run([python, "-c", _PROBE, *modules], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):  # no such interpreter, or one that hangs
        return list(modules)
    if found.returncode != 0:
        return list(modules)
    return [m for m in found.stdout.strip().split(",") if m]


def local_gpus() -> int:
    """NVIDIA GPUs on this machine, as the driver lists them (no CUDA library is loaded)."""
    from pathlib import Path

    folder = Path("/proc/driver/nvidia/gpus")
    return sum(1 for _ in folder.iterdir()) if folder.is_dir() else 0


@check("engine.verl_runtime", ENGINE, "a verl launch that fails on a missing import or GPUs that are not there",
       ["train"], host=True)  # fmt: skip
def verl_runtime(ctx: Context) -> Verdict:
    """verl, vLLM, torch and Ray importable by the run's Python, and (without RAY_ADDRESS, a head on this machine)
    the GPUs the run asks for here; a cluster's GPUs are ``topology.ray_cluster``'s to check."""
    from pathlib import Path

    c = train_config(ctx)
    if c.engine != "verl":
        return skip(f"ENGINE={c.engine} does not launch verl")
    python = str(Path(c.venv_path) / "bin" / "python") if c.venv_path else None
    missing = missing_modules(python)
    where = f"VENV_PATH={c.venv_path}" if python else "this Python"
    if missing:
        return fatal(
            f"{', '.join(missing)} cannot be imported by {where}: verl's trainer would fail at its first import.",
            "install the GPU set (`./scripts/setup.sh --gpu` makes .venv-gpu) and set VENV_PATH to it.",
        )
    need = c.nnodes * c.ngpus_per_node
    if c.ray_address or ctx.settings.ray_address:
        return ok(f"verl's runtime imports in {where}; the cluster's GPUs are checked by topology.ray_cluster")
    have = local_gpus()
    if have < need:
        return fatal(
            f"this machine has {have} GPU(s) and RAY_ADDRESS is unset, so the run's Ray head starts here; the run "
            f"asks for {need} (NNODES={c.nnodes} × NGPUS_PER_NODE={c.ngpus_per_node}).",
            "set RAY_ADDRESS to a GPU cluster, run on a GPU node, or lower NGPUS_PER_NODE.",
        )
    return ok(f"verl's runtime imports in {where}; {have} GPU(s) here for the {need} the run asks for")
