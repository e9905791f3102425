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
