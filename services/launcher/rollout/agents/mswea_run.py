"""mini-swe-agent on one trial, inside the sandbox, on its bundle's Python (``runctl.bundles``).

``python mswea_run.py OUTCOME_JSON SETTINGS_JSON``: runs mini-swe-agent's ``DefaultAgent`` with its text-based
model (litellm, pointed at the trial's proxy session as an OpenAI-compatible server) and its local environment (the
sandbox's shell, in the task's working folder), on the task's instruction, with its own prompts from
``mini_textbased.yaml``. SETTINGS_JSON (one argument) gives the session's ``base_url``, the ``model``'s name,
``temperature`` and ``max_tokens``, the ``instruction`` file, and the trial's limits: ``max_turns`` model calls (its
``step_limit``) and ``timeout_s`` of wall time (its ``wall_time_limit_seconds``); no cost limit (the model is the
run's own). Writes what ended it to OUTCOME_JSON: ``{"exit_status": ..., "message": ..., "calls": ...}`` —
mini-swe-agent's own exit status (``Submitted``, ``LimitsExceeded``, ``TimeExceeded``, ``RepeatedFormatError``) or
the name of the exception that stopped it. Its trajectory goes to ``/logs/agent/mswea.traj.json``. Nothing here is
runctl's: it must import with the bundle alone.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    outcome, given = Path(argv[1]), json.loads(argv[2])
    # The loader read the bundle's library folder as this process started; the agent's commands keep the image's own.
    os.environ.pop("LD_LIBRARY_PATH", None)
    import minisweagent  # type: ignore[import-not-found]  # the bundle's, not runctl's environment's
    import yaml  # type: ignore[import-untyped]
    from minisweagent.agents.default import DefaultAgent  # type: ignore[import-not-found]
    from minisweagent.environments.local import LocalEnvironment  # type: ignore[import-not-found]
    from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel  # type: ignore[import-not-found]

    config = yaml.safe_load((Path(minisweagent.__file__).parent / "config" / "mini_textbased.yaml").read_text())
    kwargs: dict[str, object] = {"api_base": given["base_url"], "api_key": "runctl-session"}
    kwargs["temperature"] = float(given["temperature"])
    if given.get("max_tokens"):
        kwargs["max_tokens"] = int(given["max_tokens"])
    model_config = dict(config.get("model") or {})
    model_config["model_kwargs"] = {**(model_config.get("model_kwargs") or {}), **kwargs}
    model = LitellmTextbasedModel(model_name=f"openai/{given['model']}", cost_tracking="ignore_errors", **model_config)
    timeout_s = int(given["timeout_s"])
    environment = dict(config.get("environment") or {})
    env = LocalEnvironment(**{**environment, "cwd": os.getcwd(), "timeout": max(1, min(timeout_s, 600))})
    agent_config = dict(config.get("agent") or {})
    agent_config.update(
        step_limit=int(given["max_turns"]),
        cost_limit=0,
        wall_time_limit_seconds=timeout_s,
        output_path=Path("/logs/agent/mswea.traj.json"),
    )
    agent = DefaultAgent(model, env, **agent_config)
    instruction = Path(given["instruction"]).read_text()
    try:
        result = agent.run(instruction)
        ended = {"exit_status": str(result.get("exit_status", "")), "message": str(result.get("exception_str", ""))}
    except Exception as e:  # what stopped the agent: an API error (context too long, a refused call), a crash
        ended = {"exit_status": type(e).__name__, "message": str(e)[:2000]}
    ended["calls"] = agent.n_calls
    outcome.write_text(json.dumps(ended))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
