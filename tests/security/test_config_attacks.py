"""Attacks by a team's config on what reads it: files that never end, checks that never return, keys that would
hand a run the cluster's Python or sandbox host, interpolations that would read the launcher's environment, and
runs that could never start."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from runctl.config import TrainConfig, resolve_text
from runctl.config.loader import submitted_values
from runctl.errors import ConfigError
from runctl.events.checks import CheckResult
from runctl.safefiles import UnsafeFile, read_regular
from runctl.verl import verl_overrides
from services.launcher.admission import QueuedRun, Resources, TeamQuota, never_fits
from services.validator.checks.verl_schema import compose, verl_config_dir
from services.validator.facts import read_facts
from services.validator.registry import Context, Registry, Verdict, ok
from tests.conftest import ROOT

DATA = ROOT / "tests" / "data"
SECRET = "runctl-attack-secret-0f3a"


def train_text() -> str:
    return (DATA / "configs" / "good" / "train-dense.env").read_text()


def train_config(**updates: object) -> TrainConfig:
    model = resolve_text(train_text(), "train.env", environ={"RUNCTL_TEST_DATA": str(DATA)}).model
    assert isinstance(model, TrainConfig)
    return model.model_copy(update=updates)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "huge"])
def test_a_model_config_that_never_ends_is_refused_without_reading_it(tmp_path: Path, kind: str) -> None:
    model = tmp_path / "model"
    model.mkdir()
    config = model / "config.json"
    if kind == "fifo":
        os.mkfifo(config)  # an open for reading would wait for a writer for ever
    elif kind == "dev-zero":
        config.symlink_to("/dev/zero")  # a read would never end
    else:
        with config.open("wb") as out:
            out.truncate(64 * 1024 * 1024)  # sparse: 64 MiB of nothing
    started = time.monotonic()
    with pytest.raises(Exception) as info:
        read_facts(str(model))
    assert time.monotonic() - started < 5
    assert {"fifo": "a FIFO", "dev-zero": "a device", "huge": "more than"}[kind] in str(info.value)
    with pytest.raises(UnsafeFile):
        read_regular(config)


def test_a_check_that_never_returns_fails_alone_and_the_others_still_run() -> None:
    registry = Registry()
    never = threading.Event()
    ran: list[str] = []

    @registry.register("hangs", 2, "a check blocked on a FIFO the config named")
    def hangs(ctx: Context) -> Verdict:
        never.wait()  # never set while the validation runs
        return ok("unreachable")

    @registry.register("raises", 3, "a check that trips over hostile input")
    def raises(ctx: Context) -> Verdict:
        raise ValueError("not a number: 'NaN'")

    @registry.register("fine", 4, "an ordinary check")
    def fine(ctx: Context) -> Verdict:
        ran.append("fine")
        return ok("fine")

    started = time.monotonic()
    try:
        results: list[CheckResult] = registry.run(train_config(), timeout_s=0.5)
    finally:
        never.set()  # let the given-up worker thread end
    assert time.monotonic() - started < 5
    by_id = {r.id: r for r in results}
    assert by_id["hangs"].severity == "fatal" and "did not finish within 0.5s" in by_id["hangs"].message
    assert by_id["raises"].severity == "fatal" and "not a number" in by_id["raises"].message
    assert by_id["fine"].severity == "ok" and ran == ["fine"]


@pytest.mark.parametrize(
    "key", ["VENV_PATH", "RAY_ADDRESS", "DOCKER_HOST", "KUBECONFIG", "K8S_NAMESPACE", "K8S_BUNDLE_CLAIM", "LISTED"]
)
def test_a_run_cannot_change_a_key_site_env_locks(tmp_path: Path, key: str) -> None:
    site = {
        "VENV_PATH": "/opt/site-venv",
        "RAY_ADDRESS": "ray://cluster:10001",
        "DOCKER_HOST": "unix:///run/site/docker.sock",
        "KUBECONFIG": "/etc/site/kubeconfig",
        "K8S_NAMESPACE": "sandboxes",
        "K8S_BUNDLE_CLAIM": "site-bundles",
        "MAX_RETRIES": "2",
    }
    site_text = "".join(f"{k}={v}\n" for k, v in site.items()) + "LOCKED_KEYS=MAX_RETRIES\n"
    target = "MAX_RETRIES" if key == "LISTED" else key
    evil = {"MAX_RETRIES": "50", "K8S_BUNDLE_CLAIM": "other-team-bundles"}.get(target, "/tmp/evil")
    # The claim is read only for a bundled scaffold's pods: the run is one.
    pods = "BACKEND=k8s\nSCAFFOLD=mswea\nMAX_MODEL_LEN=4096\n" if target == "K8S_BUNDLE_CLAIM" else ""

    def resolve(value: str) -> object:
        text = train_text() + pods + f"{target}={value}\n"
        environ = {"RUNCTL_TEST_DATA": str(DATA)}
        return resolve_text(text, "train.env", site_text=site_text, site_path="site.env", environ=environ)

    with pytest.raises(ConfigError) as info:
        resolve(evil)
    locked = [i for i in info.value.issues if i.code == "schema.locked_key"]
    assert [i.key for i in locked] == [target] and "locked by the cluster's site.env" in locked[0].message
    resolve(site[target])  # the same value as the site's is no change, and is accepted
    # On the server, against its own site.env, whatever the submitter resolved.
    site_file = tmp_path / "site.env"
    site_file.write_text(site_text)
    rows = {target: {"value": evil, "layer": "run", "source": "train.env:9"}}
    with pytest.raises(ConfigError) as info:
        submitted_values("train", rows, {"RUNCTL_SITE_ENV": str(site_file)})
    assert [i.key for i in info.value.issues] == [target]


def test_only_site_env_may_lock_keys() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_text(train_text() + "LOCKED_KEYS=\n", "train.env", environ={"RUNCTL_TEST_DATA": str(DATA)})
    assert any(i.key == "LOCKED_KEYS" and i.code == "schema.locked_key" for i in info.value.issues)


def test_no_interpolation_resolves_inside_what_verl_is_handed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every string key of a train config set to an interpolation of the launcher's environment: composed by Hydra
    and resolved by OmegaConf as verl does, no value holds the secret, and each holds the text as written."""
    monkeypatch.setenv("RUNCTL_ATTACK_SECRET", SECRET)
    probe = "${oc.env:RUNCTL_ATTACK_SECRET}"
    base = train_config()
    # Every key that holds text, whatever its own checks would say: the escaping must hold for any text that gets
    # through them.
    updates = {name: f"x{probe}" for name in TrainConfig.model_fields if isinstance(getattr(base, name), str)}
    attacked = base.model_copy(update=updates)
    assert len(updates) >= 5, updates
    overrides = verl_overrides(attacked, "/runs/r1")
    config_dir = verl_config_dir()
    assert config_dir is not None
    resolved = OmegaConf.to_container(compose(config_dir, overrides), resolve=True)
    assert SECRET not in repr(resolved)
    assert f"x{probe}" in repr(resolved)


def test_a_run_larger_than_its_teams_whole_quota_or_the_cluster_is_refused_with_the_numbers() -> None:
    quota = TeamQuota(Resources(gpus=8, cpus=64, sandboxes=8))
    cluster = Resources(gpus=16, cpus=128, sandboxes=512)
    preview = QueuedRun("r1", "nlp", Resources(cpus=2, sandboxes=128))
    why = never_fits(preview, quota, cluster)
    assert why is not None
    assert "asks for 128 sandboxes and team nlp's whole quota is 8" in why and "runctl team set nlp" in why
    huge = QueuedRun("r2", "nlp", Resources(gpus=32))
    assert "the whole cluster has 16" in (never_fits(huge, TeamQuota(Resources(gpus=64)), cluster) or "")
    assert never_fits(QueuedRun("r3", "nlp", Resources(gpus=8)), quota, cluster) is None
