"""The suite's own timings plugin (tests/infra/timings.py): what it calls each process a test started."""

from __future__ import annotations

import pytest

from tests.infra.timings import kind_of

PY = "/repo/.venv/bin/python"


@pytest.mark.parametrize(
    ("cmdline", "kind"),
    [
        (f"{PY} -m vllm.entrypoints.openai.api_server --model /m --port 1", "vllm"),
        # A run's replica: the group watcher's two processes carry the server's command line; one server is counted.
        (
            f"{PY} -m services.launcher.rollout.groupwatch -- {PY} -m vllm.entrypoints.openai.api_server --model /m",
            None,
        ),
        ("/repo/.venv/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server --log_dir=/tmp/x", "ray-head"),
        ("/repo/.venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --node=1", "ray-node"),
        ("dockerd -H unix:///tmp/d.sock", "dockerd"),
        (f"{PY} -m services.launcher", "service"),
        ("bwrap --unshare-all -- sh", "sandbox"),
        (f"{PY} /repo/.venv/bin/runctl run cfg.env --run-id r", "trainer"),
        (f"{PY} -m pytest", None),
    ],
)
def test_each_started_process_is_named_by_its_kind(cmdline: str, kind: str | None) -> None:
    assert kind_of(cmdline) == kind


def test_the_cores_busy_share_comes_from_idle_ticks_against_all_ticks() -> None:
    from tests.infra.timings import cpu_busy, cpu_times

    assert cpu_busy((100, 400), (130, 800)) == pytest.approx(1 - 30 / 400)
    assert cpu_busy(None, (1, 2)) is None and cpu_busy((1, 2), (1, 2)) is None
    now = cpu_times()
    assert now is not None and 0 <= now[0] <= now[1]
