"""runctl's agent loop for verl: each sample verl draws is one runctl trial.

verl's ``AgentLoopWorker`` builds this loop for each sample whose ``agent_name`` is ``runctl`` (runctl's dataset
rows say so, and runctl's overrides make it the default), from the registry file runctl writes
(``rollout.agent.agent_loop_config_path``). ``run`` takes the task named in the row's ``extra_info``, runs one trial
of it exactly as infer and eval runs do (a sandbox from the task, the terminal or installed agent talking to the
policy through a proxy session, the verifier's reward), and returns what the proxy captured: the prompt's and the
response's token ids as the servers produced them, the loss mask (1 for the model's tokens, 0 for what the
environment said between turns), the model's logprobs, and the verifier's reward as ``reward_score`` (so verl's
reward stage is not asked again). The trial is also handed to the runner, which publishes ``trial.finished``.

The proxy sits in front of verl's own vLLM servers (the ``vllm_server_*`` Ray actors), not of verl's token-level
``server_manager``: the agents speak the OpenAI (or Anthropic) API, which is what the servers serve too.

Trajectories the ``TRAJ_FILTER_*`` keys drop (timed out, sandbox set-up failed, overlong, ended on the agent's
error) keep their reward but get a zero loss mask: they train nothing.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput

from runctl.events import PluginFailed
from services.launcher.engines.verl.host import TrialHost, TrialOutcome
from services.launcher.engines.verl.outbox import post
from services.launcher.rollout.trials import trial_event
from services.launcher.trainer.loop import filters_of
from services.launcher.trainer.samples import sample_of

log = logging.getLogger(__name__)


class RunctlAgentLoop(AgentLoopBase):
    """See the module docstring. ``run_dir`` comes from runctl's registry file; ``upstreams`` (server URLs) replaces
    the discovery of verl's servers (tests)."""

    def __init__(self, *args: Any, run_dir: str, upstreams: list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.run_dir = Path(run_dir)
        self.upstreams = list(upstreams) if upstreams else None

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        info = dict(kwargs.get("extra_info") or {})
        task_path = info.get("task_path")
        if not task_path:
            raise ValueError(
                "this sample has no extra_info.task_path, so runctl's agent loop cannot tell which task to run. "
                "Fix: train on the dataset runctl writes (verl/train.parquet in the run folder)"
            )
        host = await TrialHost.get(self.run_dir, self.upstreams)
        first = await host.weight_version()
        outcome = await host.run_trial(str(task_path), sampling_params.get("temperature"))
        self._hand_on(outcome)
        output = output_of(outcome, host)
        if first is not None:
            # verl's fully async trainer counts the weight updates a trajectory spans (and drops stale ones).
            last = await host.weight_version()
            output.extra_fields.update(min_global_steps=first, max_global_steps=last if last is not None else first)
        return output

    def _hand_on(self, outcome: TrialOutcome) -> None:
        key = f"trial.{outcome.record['task']}.{outcome.number}"
        try:
            post(self.run_dir, key, trial_event(outcome.record))
        except Exception as e:  # the trial still trains; only its event is lost, and that is said
            log.exception("runctl could not hand on trial %s", key)
            failure = PluginFailed(plugin="agent_loop", error_type=type(e).__name__, message=f"{key}: {e}")
            post(self.run_dir, f"plugin.agent_loop.{key}", failure)


def output_of(outcome: TrialOutcome, host: TrialHost) -> AgentLoopOutput:
    """What verl trains on for one trial: the proxy's capture and the verifier's reward."""
    from services.launcher.engines.local import pad_id

    config = host.config
    sample = sample_of(outcome.record, outcome.trajectory, filters_of(config), pad_id(config))
    durations = outcome.record.get("durations_s") or {}
    metrics = AgentLoopMetrics(
        generate_sequences=float(durations.get("model", 0.0)),
        tool_calls=float(durations.get("sandbox", 0.0)),
        compute_score=float(durations.get("verifier", 0.0)),
    )
    turns = int(outcome.record.get("turns") or 0)
    return AgentLoopOutput(
        prompt_ids=sample.prompt_ids,
        response_ids=sample.completion_ids,
        response_mask=sample.mask,
        response_logprobs=sample.logprobs,
        reward_score=sample.score,
        num_turns=1 + 2 * turns,  # verl counts messages: the prompt, then each assistant turn and its answer
        metrics=metrics,
        extra_fields={
            "runctl_trial": f"{outcome.record['task']}/{outcome.number}",
            "termination_reason": outcome.record.get("termination_reason"),
            "traj_filtered": sample.filtered,
        },
    )
