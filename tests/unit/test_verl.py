"""The runner's verl overrides, composed against verl's real config tree (verl's YAML files, no torch)."""

from __future__ import annotations

import shlex

import pytest

from runctl.config import TrainConfig, resolve_text
from runctl.verl import ENTRYPOINT, hydra_value, launch_command, verl_overrides
from services.validator.checks.verl_schema import ComposeError, compose, verl_config_dir
from tests.conftest import ROOT

DATA = ROOT / "tests" / "data"


def good_train(extra: str = "") -> TrainConfig:
    text = (DATA / "configs" / "good" / "train-dense.env").read_text() + extra
    model = resolve_text(text, "train.env", environ={"RUNCTL_TEST_DATA": str(DATA)}).model
    assert isinstance(model, TrainConfig)
    return model


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, "true"),
        (None, "null"),
        (64, "64"),
        (1e-06, "1e-06"),
        ("grpo", "grpo"),
        ("/data/train.parquet", "/data/train.parquet"),
        ("a b,c", "'a b,c'"),
        ("it's", "'it\\'s'"),
        ("null", "'null'"),
        (["console", "wandb"], "[console,wandb]"),
    ],
)
def test_values_are_written_in_hydras_override_grammar(value: object, expected: str) -> None:
    assert hydra_value(value) == expected


def test_the_overrides_compose_against_verls_own_config_tree() -> None:
    config_dir = verl_config_dir()
    assert config_dir is not None, "verl's config files must be installed (scripts/setup.sh does it)"
    overrides = verl_overrides(good_train(), "/runs/r1")
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=4" in overrides
    assert "trainer.default_local_dir=/runs/r1/checkpoints" in overrides
    compose(config_dir, overrides)


def test_an_override_verl_does_not_know_is_refused_with_its_key_named() -> None:
    config_dir = verl_config_dir()
    assert config_dir is not None
    with pytest.raises(ComposeError) as info:
        compose(config_dir, ["actor_rollout_ref.rollout.tensor_parallel=4"])
    assert "actor_rollout_ref.rollout.tensor_parallel" in str(info.value)


def test_the_launch_command_is_the_entrypoint_with_every_override_shell_quoted() -> None:
    config = good_train("OUTPUT_DIR='/tmp/run dir'\n")
    command = launch_command(config, "/tmp/run dir")
    argv = shlex.split(command)
    assert argv[:3] == ["python3", "-m", ENTRYPOINT]
    assert "trainer.default_local_dir='/tmp/run dir/checkpoints'" in argv


def test_the_fast_check_agrees_with_a_full_composition(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    from services.validator.checks.verl_schema import check_overrides

    monkeypatch.setenv("RUNCTL_HOME", str(tmp_path))
    config_dir = verl_config_dir()
    assert config_dir is not None
    good = verl_overrides(good_train(), "/runs/r1")
    check_overrides(config_dir, good)  # builds the key cache
    check_overrides(config_dir, good)  # reads it
    for bad in (["actor_rollout_ref.rollout.tensor_parallel=4"], ["trainer.nnodes=[unclosed"]):
        with pytest.raises(ComposeError):
            compose(config_dir, bad)
        with pytest.raises(ComposeError):
            check_overrides(config_dir, bad)


ASYNC = (
    "TRAINING_MODE=async\nNNODES=2\nN_NODES_ROLLOUT=1\nGEN_DP=2\nSTALENESS=0.5\nREQUIRE_BATCHES=2\n"
    "TRIGGER_PARAMETER_SYNC_STEP=3\nTOTAL_ROLLOUT_STEPS=640\n"
)


def test_an_async_run_composes_against_verls_fully_async_trainer_with_each_key_where_verl_reads_it() -> None:
    from runctl.verl import ASYNC_ENTRYPOINT, config_source

    config = good_train(ASYNC)
    folder, name = config_source(config)
    config_dir = verl_config_dir(folder)
    assert config_dir is not None and name == "fully_async_ppo_trainer"
    verl = compose(config_dir, verl_overrides(config, "/runs/r1"), name)
    # What verl's rollouter and trainer assert and read (fully_async_rollouter.py, fully_async_trainer.py).
    assert verl.data.train_batch_size == 0 and verl.data.gen_batch_size == 1
    assert verl.actor_rollout_ref.hybrid_engine is False
    sync = verl.async_training
    assert (sync.staleness_threshold, sync.require_batches, sync.trigger_parameter_sync_step) == (0.5, 2, 3)
    assert sync.partial_rollout is False
    assert (verl.trainer.nnodes, verl.rollout.nnodes, verl.rollout.n_gpus_per_node) == (1, 1, 8)
    assert verl.rollout.total_rollout_steps == 640 and verl.rollout.n == config.n_resp
    assert verl.actor_rollout_ref.rollout.calculate_log_probs is True
    assert verl.trainer.checkpoint_callback_class is None  # verl calls none there
    argv = shlex.split(launch_command(config, "/runs/r1"))
    assert argv[:3] == ["python3", "-m", ASYNC_ENTRYPOINT]


def test_verls_servers_load_the_key_guard_and_no_secret_is_named_in_what_verl_is_handed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The overrides name the guard as vLLM middleware; the key (and W&B's) reach verl's actors through Ray's
    runtime environment (tests/verl/test_worker_env.py), never through the overrides."""
    import importlib

    from runctl.verl import REPLICA_GUARD

    monkeypatch.setenv("VLLM_API_KEY", "the-runs-replica-key")
    monkeypatch.setenv("WANDB_API_KEY", "the-wandb-key")
    overrides = verl_overrides(good_train("LOGGER=wandb\nWANDB_API_KEY=from-config\n"), "/runs/r1")
    assert not any(
        secret in o for o in overrides for secret in ("the-runs-replica-key", "the-wandb-key", "from-config")
    )
    assert not any("oc.env" in o for o in overrides)  # verl would hand ray.init the reference's text
    config_dir = verl_config_dir()
    assert config_dir is not None
    verl = compose(config_dir, overrides)
    assert verl.actor_rollout_ref.rollout.engine_kwargs.vllm.middleware == REPLICA_GUARD
    module, name = REPLICA_GUARD.rsplit(".", 1)
    assert callable(getattr(importlib.import_module(module), name))  # what vLLM's --middleware imports
