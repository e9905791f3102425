"""What one trial gives the update: the sequence the proxy captured (prompt, the model's tokens and what came
between them, their logprobs and loss mask) and the verifier's reward.

A trial's trajectory can hold more than one sequence (an agent that rewrote its context starts a new one); the
update takes the one with the most model tokens, and the others are counted (``traj/extra_sequences``), not
trained. Trajectories the ``TRAJ_FILTER_*`` keys drop (timed out, sandbox set-up failed, overlong, ended on the
agent's error) stay in the batch
with a zero loss mask, so GRPO's groups keep ``N_RESP`` members, and with their group's mean reward, so they move
no other member's advantage; they are counted (``traj_filter/<reason>``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import fmean
from typing import Any, Literal

FilterReason = Literal["timeout", "env_setup_failed", "overlong", "error"]
#: Every reason, in the order a trial is checked for them.
FILTER_REASONS: tuple[FilterReason, ...] = ("timeout", "env_setup_failed", "overlong", "error")


@dataclass(frozen=True)
class Filters:
    timeout: bool
    env_setup_failed: bool
    overlong: bool
    max_prompt: int
    max_resp: int
    error: bool = False


@dataclass
class Sample:
    task: str
    trial: int
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    mask: list[int]
    score: float
    """The verifier's reward (0 when it gave none): what ``critic/score/mean`` averages."""
    filtered: FilterReason | None = None
    extra_sequences: int = 0
    reward: float = field(init=False)
    """What the update sees: the score, or for a filtered sample its group's mean (``balance_filtered``)."""
    model_tokens: int = field(init=False)

    def __post_init__(self) -> None:
        self.reward = self.score
        self.model_tokens = sum(self.mask)


def _best_sequence(trajectory: dict[str, Any] | None) -> tuple[dict[str, Any] | None, int]:
    sequences = (trajectory or {}).get("sequences") or []
    if not sequences:
        return None, 0
    best = max(sequences, key=lambda s: sum(s.get("response_mask") or []))
    return best, len(sequences) - 1


def filter_reason(record: dict[str, Any], prompt_len: int, response_len: int, f: Filters) -> FilterReason | None:
    reason = record.get("termination_reason")
    if f.timeout and reason == "timeout":
        return "timeout"
    if f.env_setup_failed and reason == "env_setup_failed":
        return "env_setup_failed"
    if f.overlong and (reason == "overlong" or prompt_len > f.max_prompt or response_len > f.max_resp):
        return "overlong"
    if f.error and reason == "error":
        return "error"
    return None


def sample_of(record: dict[str, Any], trajectory: dict[str, Any] | None, f: Filters, pad_id: int) -> Sample:
    """One trial's sample. A trial that made no model call (its sandbox never started) gets a one-token
    placeholder with a zero mask: it is in the batch only to keep its group whole."""
    sequence, extra = _best_sequence(trajectory)
    reward = float(record["reward"]) if record.get("reward") is not None else 0.0
    if sequence is None:
        empty: FilterReason = filter_reason(record, 0, 0, f) or "env_setup_failed"
        return Sample(record["task"], int(record["trial"]), [pad_id], [pad_id], [0.0], [0], reward, empty, extra)
    prompt = list(sequence["prompt_token_ids"])
    response = list(sequence["response_token_ids"])
    mask = [int(m) for m in sequence["response_mask"]]
    logprobs = [float(x) for x in sequence["response_logprobs"]]
    why = filter_reason(record, len(prompt), len(response), f)
    # Bounded whatever the trajectory: what is cut is never trained (an overlong sample is masked out).
    prompt, response = prompt[-f.max_prompt :], response[: f.max_resp]
    mask, logprobs = mask[: len(response)], logprobs[: len(response)]
    if why is not None:
        mask = [0] * len(response)
    if not response:
        response, mask, logprobs = [pad_id], [0], [0.0]
    return Sample(record["task"], int(record["trial"]), prompt, response, logprobs, mask, reward, why, extra)


def balance_filtered(samples: list[Sample], group_size: int) -> None:
    """Give each filtered sample its group's mean reward over the kept ones (0 when none is kept), in place."""
    for start in range(0, len(samples), group_size):
        group = samples[start : start + group_size]
        kept = [s.reward for s in group if s.filtered is None]
        mean = fmean(kept) if kept else 0.0
        for s in group:
            if s.filtered is not None:
                s.reward = mean
