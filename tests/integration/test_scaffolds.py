"""SCAFFOLD=mswea for real: `runctl agents build mswea` (mini-swe-agent 2.4.6 with its own CPython, offline after),
then a trial on the local backend (bubblewrap, network off) with mini-swe-agent driving the tiny model through the
proxy's session. The tiny model's context (1024 tokens) is smaller than mini-swe-agent's own prompt, so vLLM refuses
the first call and the trial must end as ``overlong`` with litellm's own message, the sandbox gone, never a hang."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from runctl import bundles, tinymodel
from tests.conftest import ROOT
from tests.infra import vllm_server as vllm_infra
from tests.infra.kube_api import FakeKubeApi
from tests.integration.test_runner import config

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.integration,
    pytest.mark.skipif(
        bool(vllm_infra.why_unavailable() or shutil.which("bwrap") is None),
        reason=str(vllm_infra.why_unavailable() or "bubblewrap is not installed"),
    ),
]


@pytest.fixture(scope="session")
def mswea_bundle() -> bundles.Bundle:
    """The bundle, built once per machine (kept in the user's cache like the tiny model)."""
    return bundles.build("mswea")


def test_the_bundle_is_whole_read_only_and_runs_the_agent_without_the_host_python(
    mswea_bundle: bundles.Bundle, tmp_path: Path
) -> None:
    import subprocess

    assert mswea_bundle.manifest["version"] == "2.4.6" and mswea_bundle.manifest["platform"] == bundles.platform_tag()
    assert dict(mswea_bundle.manifest["packages"])["mini-swe-agent"] == "2.4.6"  # type: ignore[call-overload]
    assert bundles.load("mswea", verify=True).sha256 == mswea_bundle.sha256
    assert not (mswea_bundle.path / "runtime" / "lib").stat().st_mode & 0o222
    python = mswea_bundle.path / "runtime" / "bin" / "python3"
    env = {**bundles.runtime_env(mswea_bundle.path / "runtime"), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    env["MSWEA_SILENT_STARTUP"] = "1"
    done = subprocess.run(
        [str(python), "-I", "-c", "import sys, minisweagent; print(sys.prefix, minisweagent.__version__)"],
        env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(mswea_bundle.path / "runtime"), "2.4.6"]


async def one_trial(
    tmp_path: Path, served_model: vllm_infra.VLLMServer, image: str | None = None, **values: Any
) -> tuple[Path, list[str]]:
    """One trial of examples' write-done task on the local backend (or ``BACKEND``'s, with the task's image built
    ``FROM image``, or on kubernetes that image as the task's prebuilt one) with the runner's loop and proxy; its
    folder and the termination reasons published."""
    from runctl.config import load_config
    from services.launcher.engines.local import loop_settings, open_proxy, select_tasks
    from services.launcher.rollout.trials import TrialLoop
    from services.sandbox.library import CONFIG_BACKENDS, BackendSettings, open_backend

    task = tmp_path / "tasks" / "write-done"
    shutil.copytree(ROOT / "examples" / "tasks" / "write-done", task)
    if image is not None and values.get("BACKEND") == "k8s":
        toml = (task / "task.toml").read_text()
        (task / "task.toml").write_text(toml.replace("[environment]", f'[environment]\ndocker_image = "{image}"'))
    elif image is not None:
        (task / "environment" / "Dockerfile").write_text(f"FROM {image}\n")
    cfg = config(tmp_path, "infer-cpu.env", INDEX_FILE=tmp_path / "tasks", N_TRIALS=1, **values)
    run_config = load_config(cfg, environ={}).model
    records: list[dict[str, Any]] = []

    async def publish(record: dict[str, Any]) -> None:
        records.append(record)

    async with AsyncExitStack() as stack:
        proxy, settings = await open_proxy(stack, [served_model.url], loop_settings(run_config), served_model.key)
        assert settings.bundle is not None and settings.bundle.name == values["SCAFFOLD"]
        with open_backend(CONFIG_BACKENDS[run_config.backend], BackendSettings.of(run_config)) as (backend, image_for):
            _, _, tasks = select_tasks(run_config)
            labels = {"runctl.run": str(values["SCAFFOLD"])}
            loop = TrialLoop(tasks, tmp_path / "trials", settings, backend, image_for, proxy, labels, publish)
            await asyncio.wait_for(loop.run(await loop.recover(), asyncio.Event()), 600)
            assert backend.list_owned(labels) == []
    return tmp_path / "trials" / "write-done" / "trial-0", [r["termination_reason"] for r in records]


async def test_a_mswea_trial_drives_the_model_through_the_proxy_and_ends_cleanly(
    tmp_path: Path, served_model: vllm_infra.VLLMServer, mswea_bundle: bundles.Bundle
) -> None:
    folder, published = await one_trial(tmp_path, served_model, SCAFFOLD="mswea", AGENT_MAX_ITERATIONS=3)
    record = json.loads((folder / "trial.json").read_text())
    ended = json.loads((folder / "logs" / "agent" / "mswea.json").read_text())
    assert record["agent"] == "mswea" and record["bundle"] == mswea_bundle.record()
    assert ended["exit_status"] == "ContextWindowExceededError" and ended["calls"] == 1
    assert record["termination_reason"] == "overlong" and record["failure"]["cause"] == "agent_budget"
    assert "maximum context length is 1024 tokens" in record["failure"]["message"]
    assert published == ["overlong"]


@pytest.fixture(scope="module")
def scaffold_model(mswea_bundle: bundles.Bundle, oc_bundle: bundles.Bundle) -> Iterator[vllm_infra.VLLMServer]:
    """The tiny model's scaffolds shape (taught under mini-swe-agent's frames and OpenCode's first request, 32,768
    positions), served at that context."""
    model = vllm_infra.tiny_model("scaffolds")
    with vllm_infra.vllm_server(model, max_model_len=tinymodel.SCAFFOLD_CONTEXT) as server:
        yield server


async def taught_trial(
    tmp_path: Path, server: vllm_infra.VLLMServer, **values: Any
) -> tuple[Path, list[str]]:  # fmt: skip
    """:func:`one_trial` on the scaffolds shape, greedy, with four turns."""
    model = vllm_infra.tiny_model("scaffolds")
    greedy = {"MODEL_PATH": model, "MAX_MODEL_LEN": tinymodel.SCAFFOLD_CONTEXT, "TEMPERATURE": 0.0}
    return await one_trial(tmp_path, server, AGENT_MAX_ITERATIONS=4, **greedy, **values)


# The suite makes the scaffolds shape before its first test (tests/conftest.py) when the bundles are built; where they
# are not, the first test to ask builds them and teaches it (five minutes on two idle cores): the limit covers that.
@pytest.mark.timeout(900)
async def test_a_mswea_trial_with_the_model_taught_under_it_passes_and_the_capture_is_vllms_tokens(
    tmp_path: Path, scaffold_model: vllm_infra.VLLMServer, mswea_bundle: bundles.Bundle
) -> None:
    # write-done's one taught command is `echo done > answer.txt`: the model runs it as mini-swe-agent's one action,
    # reads the observation and submits; the verifier finds the file. Two model calls, both the policy's.
    model = vllm_infra.tiny_model("scaffolds")
    folder, published = await taught_trial(tmp_path, scaffold_model, SCAFFOLD="mswea")
    record = json.loads((folder / "trial.json").read_text())
    ended = json.loads((folder / "logs" / "agent" / "mswea.json").read_text())
    assert ended["exit_status"] == "Submitted" and ended["calls"] == 2, ended
    assert (
        record["termination_reason"] == "agent_completed"
        and record["reward"] == 1.0
        and published == ["agent_completed"]
    )
    trajectory = json.loads((folder / "trajectory.json").read_text())
    turns = trajectory["turns"]
    assert len(turns) == 2 and not any(t["side"] for t in turns)
    # The record counts what the capture holds (the agent, inside its sandbox, counts nothing itself): usage and
    # the tracker's token sums read these.
    generated = sum(len(c["completion_token_ids"]) for t in turns for c in t["choices"])
    assert record["turns"] == 2 and record["tokens"]["completion"] == generated > 0
    assert record["tokens"]["prompt"] == sum(t["usage"]["prompt_tokens"] for t in turns) > 2 * 1500
    assert 0 < record["durations_s"]["model"] <= record["durations_s"]["wall"]
    # The capture is what vLLM returned: the turn's completion decodes to the text mini-swe-agent acted on.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    first = tokenizer.decode(turns[0]["choices"][0]["completion_token_ids"], skip_special_tokens=True)
    assert "echo done > answer.txt" in first and first == turns[0]["choices"][0]["output"]["content"]


@pytest.mark.timeout(900)
async def test_an_opencode_trial_with_the_model_taught_under_it_passes_through_a_parsed_tool_call(
    tmp_path: Path, scaffold_model: vllm_infra.VLLMServer, oc_bundle: bundles.Bundle
) -> None:
    # OpenCode sends its 18,700-token prompt with ten tools; the model answers write-done with a call of its bash
    # tool, which vLLM's Hermes parser (TOOL_CALL_PARSER) turns into the surface's tool call, OpenCode runs it in the
    # sandbox and sends its result, and the model answers without a call: OpenCode's run ends, the verifier passes.
    model = vllm_infra.tiny_model("scaffolds")
    folder, published = await taught_trial(tmp_path, scaffold_model, SCAFFOLD="oc", SANDBOX_MEMORY_MB=1024)
    record = json.loads((folder / "trial.json").read_text())
    assert record["termination_reason"] == "agent_completed" and record["reward"] == 1.0, record
    assert published == ["agent_completed"]
    events = [json.loads(line) for line in (folder / "logs" / "agent" / "oc.jsonl").read_text().splitlines()]
    (used,) = [e["part"] for e in events if e["type"] == "tool_use"]
    assert used["tool"] == "bash" and used["state"]["input"]["command"] == "echo done > answer.txt"
    trajectory = json.loads((folder / "trajectory.json").read_text())
    turns = [t for t in trajectory["turns"] if not t["side"]]
    assert len(turns) == 2 and record["turns"] == 2
    first = turns[0]["choices"][0]
    (call,) = first["output"]["tool_calls"]
    assert call["function"]["name"] == "bash"
    assert json.loads(call["function"]["arguments"]) == {"command": "echo done > answer.txt"}
    # The capture is vLLM's tokens: they decode to the call as the model wrote it, which the parser read.
    from transformers import AutoTokenizer

    written = AutoTokenizer.from_pretrained(model).decode(first["completion_token_ids"])
    assert written.startswith("<tool_call>") and '"echo done > answer.txt"' in written
    assert turns[0]["usage"]["prompt_tokens"] > 18_000  # OpenCode's whole prompt went to the model
    # The task's words as the instruction file has them (OpenCode reads them from its standard input, unquoted).
    instruction = (ROOT / "examples" / "tasks" / "write-done" / "instruction.md").read_text()
    assert [m["content"] for m in turns[0]["messages"] if m["role"] == "user"] == [instruction]
    assert turns[1]["choices"][0]["output"]["content"] and not turns[1]["choices"][0]["output"].get("tool_calls")


@pytest.fixture(scope="session")
def cc_bundle() -> bundles.Bundle:
    return bundles.build("cc")


async def test_a_claude_code_trial_calls_the_proxys_anthropic_surface_and_ends_cleanly(
    tmp_path: Path, served_model: vllm_infra.VLLMServer, cc_bundle: bundles.Bundle
) -> None:
    """Claude Code's native executable runs in the sandbox, reaches the proxy's Anthropic surface through the relay
    (its request, with a message of role "system", is translated), and vLLM refuses the output length Claude Code
    asks of a 1024-token model: a clean ``error`` with that message, not a hang."""
    folder, published = await one_trial(tmp_path, served_model, SCAFFOLD="cc", AGENT_MAX_ITERATIONS=3)
    record = json.loads((folder / "trial.json").read_text())
    ended = json.loads((folder / "logs" / "agent" / "cc.json").read_text())
    assert record["agent"] == "cc" and record["bundle"] == cc_bundle.record()
    assert ended["is_error"] and ended["api_error_status"] == 400
    assert record["termination_reason"] == "error" and record["failure"]["cause"] == "agent"
    assert "max_tokens=32000 cannot be greater than max_model_len=1024" in record["failure"]["message"]
    assert published == ["error"]


@pytest.fixture(scope="session")
def oc_bundle() -> bundles.Bundle:
    return bundles.build("oc")


async def test_an_opencode_trial_calls_the_proxys_openai_surface_and_ends_cleanly(
    tmp_path: Path, served_model: vllm_infra.VLLMServer, oc_bundle: bundles.Bundle
) -> None:
    """OpenCode's native executable runs in the sandbox with its provider configured at the proxy's OpenAI surface
    through the relay; its first request (system prompt and tools) outgrows the 1024-token model, vLLM says so, and
    OpenCode — its compaction off — reports a context overflow: a clean ``overlong`` after one call, not a loop."""
    folder, published = await one_trial(
        tmp_path, served_model, SCAFFOLD="oc", AGENT_MAX_ITERATIONS=3, SANDBOX_MEMORY_MB=1024
    )
    record = json.loads((folder / "trial.json").read_text())
    events = [json.loads(line) for line in (folder / "logs" / "agent" / "oc.jsonl").read_text().splitlines()]
    assert record["agent"] == "oc" and record["bundle"] == oc_bundle.record()
    assert (oc_bundle.peak_rss_mb or 0) > 100  # measured as its build ran it: the sandbox here is given 1024 MiB
    assert [e["error"]["name"] for e in events if e["type"] == "error"] == ["ContextOverflowError"]
    assert record["termination_reason"] == "overlong" and record["failure"]["cause"] == "agent_budget"
    assert "maximum context length is 1024 tokens" in record["failure"]["message"]
    assert published == ["overlong"]
    trajectory = json.loads((folder / "trajectory.json").read_text())
    assert trajectory["errors"] == 1 and trajectory["turns"] == []  # its one call, refused: nothing to train on


@pytest.fixture(scope="session")
def ohsdk_bundle() -> bundles.Bundle:
    return bundles.build("ohsdk")


async def test_an_openhands_sdk_trial_runs_on_its_own_python_and_ends_cleanly(
    tmp_path: Path, served_model: vllm_infra.VLLMServer, ohsdk_bundle: bundles.Bundle
) -> None:
    """The SDK's agent runs on the bundle's CPython 3.12 (the host's Python is 3.11) with its shell tools, calls the
    proxy's OpenAI surface through the relay, and its first request (system prompt and five tools) outgrows the
    1024-token model: a clean ``overlong`` with litellm's own words, after one refused call."""
    folder, published = await one_trial(
        tmp_path, served_model, SCAFFOLD="ohsdk", AGENT_MAX_ITERATIONS=3, SANDBOX_MEMORY_MB=1024
    )
    record = json.loads((folder / "trial.json").read_text())
    ended = json.loads((folder / "logs" / "agent" / "ohsdk.json").read_text())
    assert record["agent"] == "ohsdk" and record["bundle"] == ohsdk_bundle.record()
    assert ohsdk_bundle.manifest["runtime"] == "python 3.12" and (ohsdk_bundle.peak_rss_mb or 0) > 100
    assert ended["status"] == "error" and "ContextWindowExceeded" in ended["message"], ended
    assert record["termination_reason"] == "overlong" and record["failure"]["cause"] == "agent_budget"
    assert "maximum context length is 1024 tokens" in record["failure"]["message"]
    assert published == ["overlong"]
    trajectory = json.loads((folder / "trajectory.json").read_text())
    assert trajectory["errors"] == 1 and trajectory["turns"] == []


#: How each scaffold's trial ends against the worker's 1024-token model (the local backend's tests above say why).
ENDINGS_ON_1024 = {
    "mswea": ("overlong", "maximum context length is 1024 tokens"),
    "oc": ("overlong", "maximum context length is 1024 tokens"),
    "ohsdk": ("overlong", "maximum context length is 1024 tokens"),
    "cc": ("error", "max_tokens=32000 cannot be greater than max_model_len=1024"),
}


def ended_as_on_1024(folder: Path, published: list[str], scaffold: str, bundle: bundles.Bundle) -> None:
    """The trial in ``folder`` ran ``bundle`` and ended as the scaffold does on the 1024-token model."""
    record = json.loads((folder / "trial.json").read_text())
    reason, words = ENDINGS_ON_1024[scaffold]
    assert record["bundle"] == bundle.record(), record
    assert record["termination_reason"] == reason, record["failure"]
    assert words in record["failure"]["message"]
    assert published == [reason]


@pytest.mark.parametrize("scaffold", sorted(ENDINGS_ON_1024))
async def test_a_bundle_runs_in_a_docker_container_whose_image_has_glibc_and_nothing_else(
    tmp_path: Path, served_model: vllm_infra.VLLMServer, docker_host: str, scaffold: str, request: pytest.FixtureRequest
) -> None:
    """The same bundles in a Docker container of an image that is busybox and glibc alone: the Python agents (their
    own CPython, 3.11 or 3.12, with the libraries they carry: libssl, libffi, zlib…) and the native ones (Claude
    Code's and OpenCode's executables), each reaching the proxy through the relay with the container's network off,
    each ending as on the local backend."""
    from tests.infra import docker_daemon

    bundle: bundles.Bundle = request.getfixturevalue(f"{scaffold}_bundle")
    assert "libssl.so.3" in bundle.manifest["carried_libraries"]  # type: ignore[operator]
    image = docker_daemon.ensure_base_image(docker_host, docker_daemon.GLIBC_IMAGE)
    folder, published = await one_trial(
        tmp_path, served_model, image, SCAFFOLD=scaffold, BACKEND="docker", DOCKER_HOST=docker_host,
        AGENT_MAX_ITERATIONS=3, SANDBOX_MEMORY_MB=1024,
    )  # fmt: skip
    ended_as_on_1024(folder, published, scaffold, bundle)


@pytest.fixture
def kube_api(docker_host: str) -> Iterator[FakeKubeApi]:
    """The fake Kubernetes API server (pods are Docker containers) with a claim bound to the bundles folder."""
    from tests.infra.kube_api import FakeCluster, fake_kube_api

    cluster = FakeCluster(docker_host=docker_host, claims={("runctl", "agent-bundles"): bundles.bundles_root()})
    with fake_kube_api(cluster) as api:
        yield api


@pytest.mark.parametrize("scaffold", ["mswea", "cc"])
async def test_a_bundle_runs_in_a_pod_reaching_its_session_over_the_exec_stream(
    tmp_path: Path,
    served_model: vllm_infra.VLLMServer,
    kube_api: FakeKubeApi,
    scaffold: str,
    request: pytest.FixtureRequest,
) -> None:
    """BACKEND=k8s (the fake API server, whose pods are Docker containers): the bundle is mounted read-only from the
    claim that holds the bundles folder, the pod has no network (the deny-all policy selects it), and the agent's
    calls (Claude Code's first holds about 77,000 characters of prompt and tools) reach the proxy through the relay
    carried over an exec stream: each scaffold ends as on the other backends, with vLLM's own words."""
    from tests.infra import docker_daemon

    bundle: bundles.Bundle = request.getfixturevalue(f"{scaffold}_bundle")
    image = docker_daemon.ensure_base_image(str(kube_api.cluster.docker_host), docker_daemon.GLIBC_IMAGE)
    folder, published = await one_trial(
        tmp_path, served_model, image, SCAFFOLD=scaffold, BACKEND="k8s", KUBECONFIG=kube_api.kubeconfig(tmp_path),
        K8S_BUNDLE_CLAIM="agent-bundles", AGENT_MAX_ITERATIONS=3, SANDBOX_MEMORY_MB=1024,
    )  # fmt: skip
    (pod,) = kube_api.cluster.made
    ended_as_on_1024(folder, published, scaffold, bundle)
    assert pod["metadata"]["labels"]["runctl.network"] == "no-network"
    assert [v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"]] == ["agent-bundles"]
    assert pod["spec"]["containers"][0]["volumeMounts"][0]["subPath"] == bundle.path.name


async def test_a_bundle_in_an_image_without_glibc_ends_the_trial_at_set_up_saying_so(
    tmp_path: Path, served_model: vllm_infra.VLLMServer, docker_host: str, oc_bundle: bundles.Bundle
) -> None:
    """busybox alone has no loader for the bundle's programs: the relay cannot start, and the trial ends
    ``env_setup_failed`` at once rather than timing out."""
    from tests.infra import docker_daemon

    image = docker_daemon.ensure_base_image(docker_host)
    folder, published = await one_trial(
        tmp_path, served_model, image, SCAFFOLD="oc", BACKEND="docker", DOCKER_HOST=docker_host, SANDBOX_MEMORY_MB=1024
    )
    record = json.loads((folder / "trial.json").read_text())
    assert record["termination_reason"] == "env_setup_failed", record
    assert "relay to the proxy did not start" in record["failure"]["message"]
    assert published == ["env_setup_failed"]


@pytest.mark.parametrize("scaffold", ["mswea", "cc", "oc", "ohsdk"])
def test_the_validator_refuses_each_scaffold_on_the_tiny_model_counting_its_tokens(
    tmp_path: Path, scaffold: str, request: pytest.FixtureRequest
) -> None:
    """What the trials above run into, caught before launch: each agent's own prompt (mini-swe-agent's rendered
    templates; Claude Code's, OpenCode's and the OpenHands SDK's first requests as the bundle's build recorded them)
    counted with the model's tokenizer."""
    from runctl.config import load_config

    request.getfixturevalue(f"{scaffold}_bundle")
    from services.validator.library import check_config

    cfg = config(tmp_path, "infer-cpu.env", SCAFFOLD=scaffold)
    (result,) = [r for r in check_config(load_config(cfg, environ={}).model) if r.id == "fit.scaffold_prompt"]
    assert result.severity == "fatal" and "estimated" not in result.message and "tokens" in result.message
    prompt_tokens = int(result.message.split("own prompt is ")[1].split()[0])
    served = int(result.message.split("the model serves ")[1].rstrip("."))
    assert prompt_tokens > served == 1024  # as vLLM refused mswea's trial ("at least 1025 input tokens")
