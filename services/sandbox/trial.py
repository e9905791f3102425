"""One trial, as Harbor defines it: set up the sandbox, let the agent work, then verify.

Verification is where a trial is made trustworthy:

1. everything the agent left running is killed (a background process cannot re-plant a reward);
2. ``/logs/verifier`` is emptied, so a ``reward.txt`` or ``reward.json`` the agent planted is gone;
3. ``tests/`` is uploaded only now (the agent never saw it) and ``tests/test.sh`` runs with its own timeout;
4. ``reward.json`` (a flat object of numbers) or else ``reward.txt`` (one number) is read; a missing, empty or
   non-numeric reward is a verifier error, never a zero.

An agent that times out is still verified: the reward counts. ``/logs`` is copied into the trial folder and
the sandbox is destroyed whatever happened.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from runctl.tasks import Task
from services.sandbox.agents import Agent, AgentOutcome
from services.sandbox.backends.base import Backend, Sandbox, SandboxError, SandboxSpec
from services.sandbox.backends.execio import run_script

FailureCause = Literal["sandbox", "model", "agent", "agent_budget", "verifier", "cancelled"]
TerminationReason = Literal["agent_completed", "timeout", "overlong", "max_turns", "env_setup_failed", "error"]
VERIFIER_OUTPUT = "/logs/verifier/test-stdout.txt"
#: How long stopping the agent may take. A fork bomb that holds every pid of a Docker sandbox lets a new exec in
#: only when one of its processes exits; on a loaded 2-core host (CI) 30 s was once not enough.
STOP_AGENT_PATIENCE_S = 60.0
#: Stops the agent for good before verifying: every process but PID 1 (the init), the sandbox's idle loop (the
#: child of PID 1 that started first: a fork bomb may have wrapped the pid numbers) and this shell is sent SIGSTOP,
#: sweep after sweep until a sweep finds none running (a fork bomb cannot outrun it: stopped processes do not fork),
#: then SIGKILL until none runs. Shell builtins only: it must work when no process can be forked. Then
#: /logs/verifier is emptied, so no planted reward survives. A killed process holds its pid until the init reaps it,
#: so the runner then waits, from outside and spending none of the sandbox's CPU, until a process can start again.
STOP_AGENT = r"""
idle=""; born=""
for f in /proc/[0-9]*/stat; do
  { read -r s < "$f"; } 2>/dev/null || continue
  rest=${s##*) }; set -- $rest; p=${f#/proc/}; p=${p%/stat}
  if [ "$2" = 1 ] && { [ -z "$born" ] || [ "${20}" -lt "$born" ]; }; then
    idle=$p; born=${20}
  fi
done
sweep() {
  action=$1; n=0
  for f in /proc/[0-9]*/stat; do
    { read -r s < "$f"; } 2>/dev/null || continue
    p=${f#/proc/}; p=${p%/stat}
    [ "$p" = 1 ] || [ "$p" = "$idle" ] || [ "$p" = "$$" ] || {
      rest=${s##*) }; set -- $rest
      if [ "$action" = KILL ]; then
        [ "$1" = Z ] || { kill -9 "$p" 2>/dev/null; n=$((n + 1)); }
      elif [ "$1" != T ] && [ "$1" != Z ]; then kill -STOP "$p" 2>/dev/null; n=$((n + 1)); fi
    }
  done
}
i=0
while [ $i -lt 100 ]; do sweep STOP; [ $n = 0 ] && break; i=$((i + 1)); done
i=0
while [ $i -lt 100 ]; do sweep KILL; [ $n = 0 ] && break; i=$((i + 1)); done
[ $n = 0 ] || { echo "$n processes still run after SIGKILL" >&2; exit 1; }
rm -rf /logs/verifier && mkdir -p /logs/verifier && chmod 777 /logs/verifier
"""


#: True once the killed processes are reaped: a handful of processes left (the init, the idle loop, this shell), so
#: the verifier will be able to fork. Builtins only (a glob, not ls): it must run while pids are scarce.
REAPED = 'set -- /proc/[0-9]*; [ "$#" -le 16 ]'


class Failure(BaseModel):
    cause: FailureCause
    message: str


class TrialResult(BaseModel):
    """What a trial produced; written to ``result.json`` in the trial folder."""

    task_id: str
    trial_id: str
    agent: str
    backend: str
    reward: float | None = None
    rewards: dict[str, float] = Field(default_factory=dict)
    reward_valid: bool = False
    termination_reason: TerminationReason = "error"
    failure: Failure | None = None
    timings_s: dict[str, float] = Field(default_factory=dict)
    verifier_exit_code: int | None = None


class RewardError(ValueError):
    """The verifier left no usable reward."""


def parse_reward(json_text: str | None, txt_text: str | None) -> tuple[float, dict[str, float]]:
    """(reward, all rewards) from ``reward.json`` or else ``reward.txt``.

    Raises:
        RewardError: neither file holds a finite number (missing, empty, NaN, not a number, not flat).
    """
    if json_text is not None:
        try:
            doc = json.loads(json_text)
        except ValueError as e:
            raise RewardError(f"reward.json is not JSON ({e})") from None
        if not isinstance(doc, dict) or not doc:
            raise RewardError("reward.json is not a non-empty flat object of numbers")
        rewards: dict[str, float] = {}
        for key, value in doc.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise RewardError(f"reward.json: {key} = {value!r} is not a finite number")
            rewards[str(key)] = float(value)
        if "reward" in rewards:
            return rewards["reward"], rewards
        if len(rewards) == 1:
            return next(iter(rewards.values())), rewards
        raise RewardError(f"reward.json has several values ({', '.join(rewards)}) and none is named reward")
    if txt_text is None:
        raise RewardError("the verifier wrote neither reward.json nor reward.txt")
    text = txt_text.strip()
    if not text:
        raise RewardError("reward.txt is empty")
    try:
        value = float(text)
    except ValueError:
        raise RewardError(f"reward.txt holds {text[:40]!r}, not a number") from None
    if not math.isfinite(value):
        raise RewardError(f"reward.txt holds {text}, not a finite number")
    return value, {"reward": value}


def sandbox_spec(
    task: Task,
    image: str | None,
    labels: dict[str, str],
    network: str | None = None,
    binds: tuple[tuple[str, str, bool], ...] = (),
) -> SandboxSpec:
    env = task.config.environment
    return SandboxSpec(
        sandbox_id=f"{task.id.replace('/', '-')[:40]}-{uuid.uuid4().hex[:8]}".lower(),
        image=image,
        cpus=env.cpus,
        memory_mb=env.memory_mb,
        storage_mb=env.storage_mb,
        network=network or env.network_mode or "no-network",  # type: ignore[arg-type]
        allowed_hosts=tuple(env.allowed_hosts),
        workdir=env.workdir or "/app",
        env=dict(env.env),
        labels=labels,
        binds=binds,
    )


class TrialRunner:
    """Runs trials of tasks on one backend; ``image_for`` turns a task into what ``create`` needs."""

    def __init__(self, backend: Backend, image_for: Callable[[Task], str | None]) -> None:
        self.backend = backend
        self.image_for = image_for

    def run(self, task: Task, agent: Agent, trial_dir: Path, labels: dict[str, str] | None = None) -> TrialResult:
        trial_dir.mkdir(parents=True, exist_ok=True)
        result = TrialResult(task_id=task.id, trial_id=trial_dir.name, agent=agent.name, backend=self.backend.name)
        started = time.monotonic()
        sandbox: Sandbox | None = None
        try:
            mark = time.monotonic()
            try:
                spec = sandbox_spec(task, self.image_for(task), labels or {}, binds=getattr(agent, "binds", ()))
                sandbox = self.backend.create(spec)
            except SandboxError as e:
                result.termination_reason = "env_setup_failed"
                result.failure = Failure(cause="sandbox", message=e.message)
                return result
            result.timings_s["environment_setup"] = time.monotonic() - mark
            outcome = self._agent_phase(task, agent, sandbox, result)
            result.termination_reason = outcome.termination_reason
            if outcome.failure is not None:
                result.failure = Failure(cause=outcome.failure[0], message=outcome.failure[1])
            self._verify(task, sandbox, trial_dir, result)
        except SandboxError as e:
            result.failure = result.failure or Failure(cause="sandbox", message=e.message)
        finally:
            if sandbox is not None:
                self._collect(sandbox, trial_dir)
                self.backend.destroy(sandbox)
            result.timings_s["total"] = time.monotonic() - started
            (trial_dir / "result.json").write_text(result.model_dump_json(indent=2))
        return result

    def _agent_phase(self, task: Task, agent: Agent, sandbox: Sandbox, result: TrialResult) -> AgentOutcome:
        mark = time.monotonic()
        agent.setup(self.backend, sandbox, task)
        result.timings_s["agent_setup"] = time.monotonic() - mark
        mark = time.monotonic()
        outcome = agent.run(self.backend, sandbox, task, task.config.agent.timeout_sec)
        result.timings_s["agent_execution"] = time.monotonic() - mark
        return outcome

    def _verify(self, task: Task, sandbox: Sandbox, trial_dir: Path, result: TrialResult) -> None:
        mark = time.monotonic()
        self._stop_agent(sandbox)
        self.backend.upload(sandbox, task.path / "tests", "/tests")
        verifier = task.config.verifier
        run = self.backend.exec(
            sandbox,
            f"{run_script('/tests/test.sh')} > {VERIFIER_OUTPUT} 2>&1",
            verifier.timeout_sec,
            user=verifier.user,
            env=dict(verifier.env) or None,
        )
        result.verifier_exit_code = run.exit_code
        result.timings_s["verifier"] = time.monotonic() - mark
        if run.timed_out:
            result.failure = Failure(cause="verifier", message=f"test.sh ran past {verifier.timeout_sec:.0f} s")
            return
        found = trial_dir / "reward"
        texts = {}
        for name in ("reward.json", "reward.txt"):
            texts[name] = (
                (found / name).read_text(errors="replace")
                if self.backend.download(sandbox, f"/logs/verifier/{name}", found / name)
                else None
            )
        try:
            result.reward, result.rewards = parse_reward(texts["reward.json"], texts["reward.txt"])
            result.reward_valid = True
        except RewardError as e:
            result.failure = Failure(cause="verifier", message=str(e))

    def _stop_agent(self, sandbox: Sandbox) -> None:
        """Stop the agent for good: the backend's ``halt_agent`` where it has one (Docker with a local daemon: freeze,
        kill, thaw), then STOP_AGENT until it succeeds (it finds nothing left after a halt; without one, while a
        fork bomb holds every pid of the sandbox, starting even one process in it fails now and then, until the
        sweep has stopped the bomb), then wait until the killed processes are reaped."""
        deadline = time.monotonic() + STOP_AGENT_PATIENCE_S
        halt = getattr(self.backend, "halt_agent", None)
        if halt is not None:
            halt(sandbox)  # a backend that can freeze the sandbox from outside kills the agent first, race-free
        stopped = False
        while True:
            try:
                if not stopped:
                    result = self.backend.exec(sandbox, STOP_AGENT, 30, user="0")
                    stopped = result.exit_code == 0
                    problem = result.stderr.strip() or f"exit code {result.exit_code}"
                if stopped:
                    if self.backend.exec(sandbox, REAPED, 10, user="0").exit_code == 0:
                        return
                    problem = "the killed processes still hold their pids (the init has not reaped them yet)"
            except SandboxError as e:
                problem = e.message
            if time.monotonic() > deadline:
                raise SandboxError(f"could not stop the agent's processes before verifying: {problem}")
            time.sleep(0.2)

    def _collect(self, sandbox: Sandbox, trial_dir: Path) -> None:
        try:
            self.backend.download(sandbox, "/logs", trial_dir / "logs")
        except SandboxError:
            pass  # the sandbox died: the result already says why
