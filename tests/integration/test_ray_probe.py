"""topology.ray_cluster against a real Ray head, started inside the suite's loopback-only network namespace."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runctl.config import load_config
from runctl.events import CheckResult
from services.validator.checks.live_probes import RAY_DASHBOARD_PORT
from services.validator.library import check_config
from tests.conftest import ROOT, free_port
from tests.infra import ray_head
from tests.integration.test_lifecycle import fake_config

pytestmark = pytest.mark.integration
DATA = ROOT / "tests" / "data"


@pytest.fixture(scope="module")
def head() -> Iterator[ray_head.RayHead]:
    reason = ray_head.why_unavailable()
    if reason:
        pytest.skip(reason)
    # The default dashboard port, so that a RAY_ADDRESS of the GCS form (host:6379) finds it too.
    with ray_head.ray_head(dashboard_port=RAY_DASHBOARD_PORT) as started:
        yield started


def ray_probe(tmp_path: Path, **overrides: str) -> CheckResult:
    values = {"ENGINE": "local", "MODEL_PATH": str(DATA / "models" / "llama-tiny"), "TRAIN_FILES": str(DATA / "tasks")}
    model = load_config(fake_config(tmp_path, **{**values, **overrides}), environ={}).model
    return next(r for r in check_config(model, live=True) if r.id == "topology.ray_cluster")


def test_a_cluster_with_the_nodes_needed_passes(head: ray_head.RayHead, tmp_path: Path) -> None:
    for address in (head.dashboard_url, head.gcs_address, f"ray://{head.gcs_address.split(':')[0]}:10001"):
        result = ray_probe(tmp_path, RAY_ADDRESS=address)
        assert result.severity == "ok", (address, result)
        assert "1 alive node(s)" in result.message and "127.0.0.1 (0 GPU)" in result.message


def test_too_few_nodes_or_gpus_is_fatal_and_names_the_nodes_seen(head: ray_head.RayHead, tmp_path: Path) -> None:
    nodes = ray_probe(tmp_path, RAY_ADDRESS=head.dashboard_url, NNODES="2", N_NODES_TRAIN="2")
    assert nodes.severity == "fatal", nodes
    assert "1 alive node(s) but NNODES=2" in nodes.message and "127.0.0.1 (0 GPU)" in nodes.message
    assert "lower NNODES" in nodes.fix
    gpus = ray_probe(tmp_path, RAY_ADDRESS=head.dashboard_url, NGPUS_PER_NODE="8", GEN_TP="1", GEN_DP="8")
    assert gpus.severity == "fatal", gpus
    assert "NGPUS_PER_NODE=8" in gpus.message


def test_no_ray_address_or_no_answer_is_skipped(tmp_path: Path) -> None:
    assert "local Ray head" in ray_probe(tmp_path).message
    result = ray_probe(tmp_path, RAY_ADDRESS=f"http://127.0.0.1:{free_port()}")
    assert result.severity == "skip" and "does not answer" in result.message
