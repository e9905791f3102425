"""A train config as verl sees it: the Hydra overrides and the launch command the runner uses for ENGINE=verl.

Part of the contract because two services need the same answer: the validator composes these overrides against
verl's own config tree before a GPU is touched, and the launcher's verl engine launches with them.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
from typing import Any

from runctl.config.models import TrainConfig
from runctl.replica_guard.runctl_replica_guard import RequireKey

ENTRYPOINT = "verl.trainer.main_ppo"
CONFIG_NAME = "ppo_trainer"
ASYNC_ENTRYPOINT = "verl.experimental.fully_async_policy.fully_async_main"
ASYNC_CONFIG_NAME = "fully_async_ppo_trainer"
#: Where each entry point's config lives, under verl's package folder (the async one extends the sync tree).
CONFIG_FOLDER = "trainer/config"
ASYNC_CONFIG_FOLDER = "experimental/fully_async_policy/config"

# runctl's plugin points inside verl (service modules, named here as strings: runctl imports no service).
AGENT_LOOP_NAME = "runctl"
AGENT_LOOP_CLASS = "services.launcher.engines.verl.agent_loop.RunctlAgentLoop"
CALLBACK_CLASS = "services.launcher.engines.verl.callback.CheckpointAnnouncer"
#: The key guard verl's vLLM servers load (``--middleware``): each requires the run's replica key, which the runner
#: puts in ``REPLICA_KEY_ENV`` of verl's environment and hands every actor of verl's through Ray's runtime
#: environment (runctl/verl.py).
REPLICA_GUARD = f"{RequireKey.__module__}.{RequireKey.__name__}"
REPLICA_KEY_ENV = "VLLM_API_KEY"
#: The Ray option naming the namespace of verl's job, where its ``vllm_server_*`` actors are made.
RAY_NAMESPACE_KEY = "ray_kwargs.ray_init.namespace"
# Where, under the run folder, the runner leaves what verl reads and verl writes what the runner reads.
AGENT_LOOPS_FILE = "verl/agent_loops.yaml"
TRAIN_FILE = "verl/train.parquet"
VAL_FILE = "verl/val.parquet"
STEP_LOG = "verl/steps.jsonl"
#: What each checkpoint holds: verl's resume state, and a Hugging Face folder an eval run serves without a merge.
SAVE_CONTENTS = ["model", "optimizer", "extra", "hf_model"]
LOAD_CONTENTS = ["model", "optimizer", "extra"]
_PLAIN = re.compile(r"[A-Za-z0-9_./:@+-]*")


def hydra_value(value: Any) -> str:
    """A value in Hydra's override grammar: booleans and null as Hydra spells them, lists in brackets, and
    anything with a character the grammar reserves in single quotes — as literal text: an interpolation in it
    (``${oc.env:…}``, which would hand a config the launcher's environment) is escaped, so nothing resolves inside
    a value taken from a run config."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    text = str(value)
    if _PLAIN.fullmatch(text) and text not in ("true", "false", "null"):
        return text
    return quoted_literal(text)


def quoted_literal(text: str) -> str:
    """``text`` in single quotes, read back by Hydra and then OmegaConf as exactly ``text``: OmegaConf's ``${`` gets a
    backslash before it (and the backslashes already there are doubled), as does Hydra's quote; backslashes before a
    quote or the closing quote are doubled; every other backslash is kept as it is, as both read it."""
    out = re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", text)
    out = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", out)
    out = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, out)
    return "'" + out + "'"


def with_absolute_paths(config: TrainConfig) -> TrainConfig:
    """The config with its paths made absolute against this process's folder: verl's processes run elsewhere (Ray
    actors with working folders of their own, on other nodes), where a relative path would mean something else."""
    keys = ("model_path", "venv_path", "train_files", "val_files")
    return config.model_copy(update={k: os.path.abspath(v) for k in keys if (v := getattr(config, k))})


def config_source(config: TrainConfig) -> tuple[str, str]:
    """(folder under verl's package, config name) of the trainer a train config launches: ``ppo_trainer`` for
    TRAINING_MODE=sync, ``fully_async_ppo_trainer`` (which extends it) for async."""
    if config.training_mode == "async":
        return ASYNC_CONFIG_FOLDER, ASYNC_CONFIG_NAME
    return CONFIG_FOLDER, CONFIG_NAME


def ray_namespace(run_id: str) -> str:
    """The Ray namespace of a run's verl job: its servers are found there, never another run's on the cluster."""
    return f"runctl-verl-{run_id}"


def verl_overrides(config: TrainConfig, run_dir: str) -> list[str]:
    """The ``key=value`` overrides of verl's trainer config (``config_source``) for a train run, paths made
    absolute."""
    config = with_absolute_paths(config)
    utilisation = config.gpu_mem_util or (0.85 if config.training_mode == "async" else 0.6)
    loggers = [name.strip() for name in config.logger.split(",") if name.strip()]
    actor, rollout = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    values: dict[str, Any] = {
        "algorithm.adv_estimator": config.adv_estimator,
        "data.train_files": f"{run_dir}/{TRAIN_FILE}",
        "data.val_files": f"{run_dir}/{VAL_FILE}",
        "data.train_batch_size": config.train_bsz,
        "data.max_prompt_length": config.max_prompt,
        "data.max_response_length": config.max_resp,
        "actor_rollout_ref.model.path": config.model_path,
        "actor_rollout_ref.model.use_remove_padding": True,
        f"{actor}.ppo_mini_batch_size": config.train_mini_bsz,
        f"{actor}.ppo_micro_batch_size_per_gpu": config.train_micro_bsz_per_gpu,
        f"{actor}.use_dynamic_bsz": config.use_dynamic_bsz,
        f"{actor}.use_kl_loss": config.use_kl_loss,
        f"{actor}.kl_loss_coef": config.kl_loss_coef,
        f"{actor}.entropy_coeff": config.entropy_coeff,
        f"{actor}.clip_ratio_low": config.clip_ratio_low if config.clip_ratio_low is not None else 0.2,
        f"{actor}.clip_ratio_high": config.clip_ratio_high if config.clip_ratio_high is not None else 0.2,
        f"{actor}.policy_loss.loss_mode": config.policy_loss_mode,
        f"{actor}.ulysses_sequence_parallel_size": config.sp_size,
        f"{actor}.optim.lr": config.actor_lr,
        f"{actor}.optim.lr_scheduler_type": config.lr_scheduler,
        f"{actor}.optim.lr_warmup_steps": config.lr_warmup_steps,
        f"{rollout}.name": "vllm",
        f"{rollout}.tensor_model_parallel_size": config.gen_tp,
        f"{rollout}.n": config.n_resp,
        f"{rollout}.gpu_memory_utilization": utilisation,
        f"{rollout}.temperature": config.temperature,
        f"{rollout}.val_kwargs.temperature": config.val_temperature,
        f"{rollout}.max_model_len": config.max_model_len or config.max_prompt + config.max_resp,
        f"{rollout}.enable_rollout_routing_replay": config.enable_r3,
        "algorithm.rollout_correction.rollout_is": config.rollout_is,
        f"{rollout}.agent.num_workers": config.agent_num_workers,
        "trainer.nnodes": config.nnodes,
        "trainer.n_gpus_per_node": config.ngpus_per_node,
        "trainer.save_freq": config.save_freq,
        "trainer.test_freq": config.test_freq,
        "trainer.total_epochs": config.total_epochs,
        "trainer.total_training_steps": config.total_training_steps,
        "trainer.val_before_train": config.val_before_train,
        "trainer.logger": ["console", "file", *(name for name in loggers if name not in ("console", "file"))],
        "trainer.project_name": config.project_name,
        "trainer.experiment_name": config.exp_name,
        "trainer.default_local_dir": f"{run_dir}/checkpoints",
        # runctl's runner applies MAX_CKPT_TO_KEEP itself, sparing checkpoints an eval run still reads.
        "trainer.max_actor_ckpt_to_keep": None,
        "trainer.resume_mode": "auto",
        # runctl's plugins: the agent loop (each sample a trial), the checkpoint hook, the step log.
        f"{rollout}.agent.agent_loop_config_path": f"{run_dir}/{AGENT_LOOPS_FILE}",
        f"{rollout}.agent.default_agent_loop": AGENT_LOOP_NAME,
        f"{rollout}.calculate_log_probs": True,
        "trainer.checkpoint_callback_class": CALLBACK_CLASS,
        f"{actor}.checkpoint.save_contents": SAVE_CONTENTS,
        f"{actor}.checkpoint.load_contents": LOAD_CONTENTS,
    }
    if config.training_mode == "async":
        values.update(_async_values(config))
    # Keys verl's tree leaves open (empty maps): added with Hydra's ``+``. The servers speak the agent's tool-call
    # format under the served name it asks for; verl's TaskRunner and workers find the step log through Ray's
    # runtime environment (they run as Ray actors, not in the launched process).
    added: dict[str, Any] = {
        f"{rollout}.engine_kwargs.vllm.served_model_name": config.served_model_name,
        f"{rollout}.engine_kwargs.vllm.enable_auto_tool_choice": True,
        f"{rollout}.engine_kwargs.vllm.tool_call_parser": config.tool_call_parser,
        f"{rollout}.engine_kwargs.vllm.middleware": REPLICA_GUARD,
        "ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH": f"{run_dir}/{STEP_LOG}",
    }
    if "wandb" in loggers:
        # W&B's key reaches verl's TaskRunner as the runner's other variables do (Ray's runtime environment, filled
        # by runctl/verl.py): never on the command line.
        added["ray_kwargs.ray_init.runtime_env.env_vars.WANDB_MODE"] = config.wandb_mode
    return [f"{key}={hydra_value(value)}" for key, value in values.items()] + [
        f"+{key}={hydra_value(value)}" for key, value in added.items()
    ]


def _async_values(config: TrainConfig) -> dict[str, Any]:
    """The fully async trainer's own keys: a rollout pool of N_NODES_ROLLOUT nodes beside a trainer of
    N_NODES_TRAIN, fed one task at a time; a step trains on TRAIN_MINI_BSZ × REQUIRE_BATCHES tasks."""
    rollout_nodes = config.n_nodes_rollout or 0
    return {
        # verl's rollouter takes tasks one by one (it asserts both values).
        "data.train_batch_size": 0,
        "data.gen_batch_size": 1,
        "actor_rollout_ref.hybrid_engine": False,
        "trainer.nnodes": config.n_nodes_train or config.nnodes - rollout_nodes,
        "rollout.nnodes": rollout_nodes,
        "rollout.n_gpus_per_node": config.ngpus_per_node,
        "rollout.n": config.n_resp,
        "rollout.total_rollout_steps": config.total_rollout_steps,
        "async_training.staleness_threshold": config.staleness,
        "async_training.trigger_parameter_sync_step": config.trigger_parameter_sync_step,
        "async_training.require_batches": config.require_batches,
        # Only verl's own LLM client reads it; runctl's loop reaches the servers through its proxy, which sends a
        # turn cut by a weight sync again whole (see docs/decisions.md).
        "async_training.partial_rollout": False,
        # The async trainer calls no checkpoint callback: the runner reads verl's checkpoint tracker instead.
        "trainer.checkpoint_callback_class": None,
    }


def agent_loops_yaml(run_dir: str) -> str:
    """verl's agent-loop registry file (``agent_loop_config_path``): runctl's loop, told its run folder."""
    return f"- name: {AGENT_LOOP_NAME}\n  _target_: {AGENT_LOOP_CLASS}\n  run_dir: {json.dumps(run_dir)}\n"


def launch_argv(config: TrainConfig, run_dir: str, python: str) -> list[str]:
    """What the runner starts: VENV_PATH's Python (else ``python``, the runner's own), verl's sync or fully async
    entry point, and the overrides. The runner adds ``RAY_ADDRESS`` (the run's cluster) to its environment."""
    venv = with_absolute_paths(config).venv_path
    interpreter = f"{venv.rstrip('/')}/bin/python" if venv else python
    entry = ASYNC_ENTRYPOINT if config.training_mode == "async" else ENTRYPOINT
    return [interpreter, "-m", entry, *verl_overrides(config, run_dir)]


def launch_command(config: TrainConfig, run_dir: str, python: str = "python3") -> str:
    """The fully expanded command line the runner starts verl with, shell-quoted."""
    return " ".join(shlex.quote(arg) for arg in launch_argv(config, run_dir, python))


# What verl's Ray actors get of the runner's environment. verl's workers (its TaskRunner, rollout servers and
# agent-loop workers, where runctl's trial host runs) are Ray actors: they see the job's runtime environment, not the
# launched process's. A reference in verl's config (``${oc.env:NAME}`` under ``ray_kwargs.ray_init.runtime_env``)
# does not do: verl hands ``ray.init`` that part of its config unresolved, so the actors would get the reference's
# text. Instead the runner starts verl with ``RAY_RUNTIME_ENV_HOOK`` naming ``runtime_env_hook``, which Ray calls in
# verl's driver with the runtime environment of its ``ray.init``; the hook adds each variable ``NAMES_ENV`` lists,
# from the driver's own environment. A secret (the bus login, the replica key, W&B's key) is then never on a command
# line or in a config file. A hook the site had set already is called first (``NEXT_HOOK_ENV``).
RUNTIME_ENV_HOOK = f"{__name__}.runtime_env_hook"
NAMES_ENV = "RUNCTL_VERL_WORKER_ENV"
NEXT_HOOK_ENV = "RUNCTL_VERL_NEXT_RUNTIME_ENV_HOOK"
RAY_HOOK_ENV = "RAY_RUNTIME_ENV_HOOK"


def runtime_env_hook(runtime_env: dict[str, Any] | None) -> dict[str, Any]:
    """``runtime_env`` with the variables ``NAMES_ENV`` lists added to its ``env_vars`` (those set here)."""
    nxt = os.environ.get(NEXT_HOOK_ENV)
    if nxt:
        module, _, name = nxt.rpartition(".")
        runtime_env = getattr(importlib.import_module(module), name)(runtime_env)
    out = dict(runtime_env or {})
    env_vars = dict(out.get("env_vars") or {})
    for name in filter(None, os.environ.get(NAMES_ENV, "").split(",")):
        if name in os.environ:
            env_vars[name] = os.environ[name]
    out["env_vars"] = env_vars
    return out


def driver_env(env: dict[str, str], names: list[str]) -> dict[str, str]:
    """``env`` (verl's driver's environment) made to hand ``names`` (those it sets) to every actor of verl's."""
    out = dict(env)
    site_hook = out.get(RAY_HOOK_ENV)
    if site_hook and site_hook != RUNTIME_ENV_HOOK:
        out[NEXT_HOOK_ENV] = site_hook
    out[RAY_HOOK_ENV] = RUNTIME_ENV_HOOK
    out[NAMES_ENV] = ",".join(name for name in names if out.get(name))
    return out
