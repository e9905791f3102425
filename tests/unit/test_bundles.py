"""Agent bundles (runctl.bundles) without building one: the manifest's checks, the tree hash, and how a mswea trial's
ending maps to a termination reason (services/launcher/rollout/agents/mswea.py). A real build and trial:
tests/integration/test_scaffold_mswea.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runctl import bundles
from runctl.bundles import BundleError
from services.launcher.rollout.agents.mswea import outcome_of
from tests.infra.bundles import fake_bundle


def test_a_missing_bundle_is_refused_with_the_command_that_builds_it(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match=r"not built .* Fix: `runctl agents build mswea`"):
        bundles.load("mswea", root=tmp_path)
    with pytest.raises(BundleError, match="no agent 'oh' has a bundle"):
        bundles.load("oh", root=tmp_path)


def test_a_bundle_for_another_platform_or_changed_since_is_refused(tmp_path: Path) -> None:
    folder = fake_bundle(tmp_path)
    bundle = bundles.load("mswea", root=tmp_path, verify=True)
    assert bundle.python == "/runctl/bundle/runtime/bin/python3.11" and bundle.record()["version"] == "2.4.6"
    (folder / "runtime" / "bin" / "python3.11").write_text("#!/bin/sh\necho changed\n")
    assert bundles.load("mswea", root=tmp_path).sha256 == bundle.sha256  # not verified: not read
    with pytest.raises(BundleError, match="no longer matches its manifest"):
        bundles.load("mswea", root=tmp_path, verify=True)
    other = tmp_path / "other"
    fake_bundle(other, platform="darwin-arm64")
    with pytest.raises(BundleError, match="is for darwin-arm64"):
        bundles.load("mswea", root=other)
    older = tmp_path / "older"
    fake_bundle(older, format=bundles.FORMAT - 1)
    with pytest.raises(BundleError, match=r"another version of runctl .* Fix: `runctl agents build mswea --force`"):
        bundles.load("mswea", root=older)


def test_the_tree_hash_sees_content_names_and_the_executable_bit(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("x")
    first = bundles.tree_hash(tmp_path)
    (tmp_path / "a").chmod(0o755)
    second = bundles.tree_hash(tmp_path)
    (tmp_path / "a").rename(tmp_path / "b")
    assert len({first, second, bundles.tree_hash(tmp_path)}) == 3


@pytest.mark.parametrize(
    ("ended", "reason", "cause"),
    [
        ({"exit_status": "Submitted", "message": ""}, "agent_completed", None),
        ({"exit_status": "LimitsExceeded", "message": ""}, "max_turns", "agent_budget"),
        ({"exit_status": "TimeExceeded", "message": ""}, "timeout", "agent_budget"),
        ({"exit_status": "ContextWindowExceededError", "message": "too long"}, "overlong", "agent_budget"),
        ({"exit_status": "RepeatedFormatError", "message": ""}, "error", "agent"),
        ({"exit_status": "APIConnectionError", "message": "refused"}, "error", "agent"),
        (None, "error", "agent"),
    ],
)
def test_mini_swe_agents_ending_maps_to_a_termination_reason(
    ended: dict[str, object] | None, reason: str, cause: str | None
) -> None:
    outcome = outcome_of(ended)
    assert outcome.termination_reason == reason
    assert (outcome.failure[0] if outcome.failure else None) == cause
    if ended and ended["exit_status"] not in ("Submitted",):
        assert str(ended["exit_status"]) in outcome.failure[1]  # type: ignore[index]


def test_the_validator_counts_the_agents_prompt_against_the_served_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runctl.config import resolve_text
    from services.validator.library import check_config

    data = Path(__file__).parents[1] / "data"
    fake_bundle(tmp_path, prompt="Answer with one command. " * 40)  # ~330 tokens by the estimate
    monkeypatch.setenv("RUNCTL_AGENTS_DIR", str(tmp_path))
    base = (data / "configs" / "good" / "eval-tiny-cpu.env").read_text() + "SCAFFOLD=mswea\n"

    def verdict(max_model_len: int) -> tuple[str, str]:
        text = base.replace("MAX_MODEL_LEN=512", f"MAX_MODEL_LEN={max_model_len}")
        resolved = resolve_text(text, "run.env", environ={"RUNCTL_TEST_DATA": str(data)})
        (result,) = [r for r in check_config(resolved.model) if r.id == "fit.scaffold_prompt"]
        return result.severity, result.message

    severity, message = verdict(512)
    assert severity == "fatal" and "estimated" in message and "the model serves 512" in message
    assert verdict(2048)[0] == "ok"


@pytest.mark.parametrize(("sandbox_mb", "severity"), [(200, "fatal"), (230, "warn"), (264, "ok")])
def test_the_validator_holds_the_sandboxes_memory_against_the_agents_measured_peak(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sandbox_mb: int, severity: str
) -> None:
    from runctl.config import resolve_text
    from services.validator.library import check_config

    data = Path(__file__).parents[1] / "data"
    fake_bundle(tmp_path, peak_rss_mb=200)
    monkeypatch.setenv("RUNCTL_AGENTS_DIR", str(tmp_path))
    text = (data / "configs" / "good" / "eval-tiny-cpu.env").read_text()
    text += f"SCAFFOLD=mswea\nSANDBOX_MEMORY_MB={sandbox_mb}\n"
    resolved = resolve_text(text, "run.env", environ={"RUNCTL_TEST_DATA": str(data)})
    (result,) = [r for r in check_config(resolved.model) if r.id == "sandbox.agent_memory"]
    assert result.severity == severity, result.message
    if severity != "ok":
        assert "reached 200 MiB" in result.message and "SANDBOX_MEMORY_MB=264" in result.fix


@pytest.mark.parametrize(
    ("ended", "reason"),
    [
        ({"subtype": "success", "is_error": False, "result": "done"}, "agent_completed"),
        ({"subtype": "error_max_turns", "is_error": True}, "max_turns"),
        (
            {"subtype": "success", "is_error": True, "result": "API Error: 400 prompt is too long: 30000 tokens"},
            "overlong",
        ),
        ({"subtype": "success", "is_error": True, "result": "API Error: 503 no replica"}, "error"),
        ({"subtype": "error_during_execution", "is_error": True}, "error"),
        (None, "error"),
    ],
)
def test_claude_codes_result_maps_to_a_termination_reason(ended: dict[str, object] | None, reason: str) -> None:
    from services.launcher.rollout.agents.claude_code import cc_outcome

    outcome = cc_outcome(ended, 1)
    assert outcome.termination_reason == reason
    if reason == "error" and ended and ended.get("result"):
        assert str(ended["result"]) in outcome.failure[1]  # type: ignore[index]


def _oc_events(*kinds: str, reason: str = "stop", error: dict[str, object] | None = None) -> list[dict[str, object]]:
    """OpenCode's JSON events as ``opencode run --format json`` prints them (the fields the mapping reads)."""
    events: list[dict[str, object]] = []
    for kind in kinds:
        if kind == "step":
            events += [{"type": "step_start"}, {"type": "step_finish", "part": {"reason": reason}}]
        elif kind == "error":
            events.append({"type": "error", "error": error})
    return events


@pytest.mark.parametrize(
    ("events", "reason", "words"),
    [
        (_oc_events("step"), "agent_completed", None),
        (_oc_events("step", "step", "step", reason="tool-calls"), "max_turns", "3 steps"),
        (
            _oc_events("error", error={"name": "ContextOverflowError", "data": {"message": "maximum context length"}}),
            "overlong",
            "ContextOverflowError",
        ),
        (
            _oc_events("step", "error", error={"name": "APIError", "data": {"message": "no replica"}}),
            "error",
            "no replica",
        ),
        (_oc_events("step", reason="tool-calls"), "error", "last step ended: tool-calls"),
        ([], "error", "exited with code 1 without an event"),
    ],
)
def test_opencodes_events_map_to_a_termination_reason(
    events: list[dict[str, object]], reason: str, words: str | None
) -> None:
    from services.launcher.rollout.agents.opencode import oc_outcome

    outcome = oc_outcome(events, 1, max_turns=3)
    assert outcome.termination_reason == reason
    if words:
        assert words in outcome.failure[1]  # type: ignore[index]


def test_opencodes_configuration_points_its_one_provider_at_the_session_within_the_runs_limits() -> None:
    from services.launcher.rollout.agents.opencode import oc_config

    config = oc_config("http://127.0.0.1:8377/sess/t/v1", "tiny", 5, 1024, 64)
    provider = config["provider"]["runctl"]
    assert provider["options"]["baseURL"] == "http://127.0.0.1:8377/sess/t/v1"
    assert provider["models"]["tiny"]["limit"] == {"context": 1024, "output": 64}
    assert config["model"] == "runctl/tiny"
    # Its titles and summaries go to the proxy's side model (side turns, out of the loss), within the same limits.
    assert config["small_model"] == "runctl/runctl-side"
    assert provider["models"]["runctl-side"] == {"name": "runctl-side", "limit": {"context": 1024, "output": 64}}
    assert config["compaction"] == {"auto": False} and config["agent"]["build"]["steps"] == 5
    assert config["share"] == "disabled" and config["autoupdate"] is False
    assert "limit" not in oc_config("u", "tiny", 5, None, None)["provider"]["runctl"]["models"]["tiny"]


@pytest.mark.parametrize(
    ("ended", "reason", "words"),
    [
        ({"status": "finished", "code": "", "message": ""}, "agent_completed", None),
        (
            {
                "status": "error",
                "code": "MaxIterationsReached",
                "message": "Agent reached maximum iterations limit (3).",
            },
            "max_turns",
            "MaxIterationsReached",
        ),
        (
            {"status": "error", "code": "ConversationRunError", "message": "litellm.ContextWindowExceededError: …"},
            "overlong",
            "ContextWindowExceededError",
        ),
        ({"status": "stuck", "code": "", "message": ""}, "error", "stuck"),
        ({"status": "error", "code": "LLMBadRequestError", "message": "no replica"}, "error", "no replica"),
        (None, "error", "exited with code 1 before it began"),
    ],
)
def test_the_openhands_sdks_ending_maps_to_a_termination_reason(
    ended: dict[str, object] | None, reason: str, words: str | None
) -> None:
    from services.launcher.rollout.agents.ohsdk import ohsdk_outcome

    outcome = ohsdk_outcome(ended, 1)
    assert outcome.termination_reason == reason
    if words:
        assert words in outcome.failure[1]  # type: ignore[index]


def test_agents_build_refuses_one_version_for_several_agents_and_names_an_unknown_one(tmp_path: Path) -> None:
    import subprocess
    import sys

    runctl = [str(Path(sys.executable).with_name("runctl")), "agents", "build"]
    env = {"PATH": "/usr/bin:/bin", "RUNCTL_AGENTS_DIR": str(tmp_path)}
    both = subprocess.run([*runctl, "cc", "oc", "--version", "1.0"], capture_output=True, text=True, env=env)
    assert both.returncode == 1 and "--version 1.0 names one agent's version, but 2 agents" in both.stderr
    unknown = subprocess.run([*runctl, "oh"], capture_output=True, text=True, env=env)
    assert unknown.returncode == 1 and "no agent 'oh' has a bundle" in unknown.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_validator_and_the_runner_agree_on_which_agents_run_inside_the_sandbox() -> None:
    from runctl.config.models import BUNDLED_SCAFFOLDS
    from services.launcher.rollout.agents.installed import IN_SANDBOX
    from services.launcher.rollout.trials import BUNDLED
    from services.validator.rules import IN_SANDBOX_SCAFFOLDS

    assert set(IN_SANDBOX) == set(IN_SANDBOX_SCAFFOLDS) == {"installed", *BUNDLED}
    assert set(BUNDLED) == set(bundles.SPECS) == set(BUNDLED_SCAFFOLDS)


def test_the_module_builds_on_the_standard_library_alone_before_runctls_environment_exists(tmp_path: Path) -> None:
    # .ci/run builds the bundles with `python3 -m runctl.bundles` while setup.sh still installs .venv: `-S` leaves every
    # site-packages folder out, so an import of anything but the standard library would fail here.
    import subprocess
    import sys

    from tests.conftest import ROOT
    from tests.infra.bundles import fake_bundle

    folder = fake_bundle(tmp_path)
    env = {"PATH": "/usr/bin:/bin", "RUNCTL_AGENTS_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    module = [sys.executable, "-S", "-m", "runctl.bundles"]
    built = subprocess.run([*module, "mswea"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    assert built.stdout.startswith(f"mswea 2.4.6: {folder} (sha256 ")
    unknown = subprocess.run([*module, "oh"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert unknown.returncode == 1 and "no agent 'oh' has a bundle" in unknown.stderr
    usage = subprocess.run(module, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert usage.returncode == 2 and "usage: python -m runctl.bundles NAME" in usage.stderr


def test_a_captured_agents_first_request_is_read_back_and_a_text_prompt_is_refused_by_name(tmp_path: Path) -> None:
    system, messages, tools = "", [{"role": "system", "content": "You are OpenCode."}], [{"type": "function"}]
    lines = "\n".join(json.dumps(part) for part in (system, messages, tools))
    fake_bundle(tmp_path / "captured", prompt=lines)
    assert bundles.load("mswea", root=tmp_path / "captured").first_request() == (system, messages, tools)
    fake_bundle(tmp_path / "text", prompt="Answer with one command.\nThen submit.\n")
    with pytest.raises(BundleError, match=r"holds no captured first request .* rendered templates"):
        bundles.load("mswea", root=tmp_path / "text").first_request()
