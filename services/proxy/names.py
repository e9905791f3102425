"""Which model names a session's client may ask for, all meaning the one model the replicas serve.

One name more, :data:`SIDE_MODEL`, means that model too, for a request that is not the policy's turn: the scaffolds
point the model their agent uses for titles, summaries and other side tasks at it (Claude Code's
``ANTHROPIC_SMALL_FAST_MODEL``, OpenCode's ``small_model``), and the session records such a call as a side turn, kept
out of the training sequences (services/proxy/trajectory.py)."""

from __future__ import annotations

import fnmatch
from typing import Any

from services.proxy.errors import ProxyError

PROVIDER_PREFIXES = ("openai/", "hosted_vllm/", "vllm/", "anthropic/", "litellm_proxy/")
DEFAULT_ALIASES = ("claude-*",)  # Claude Code asks for Claude model names; they mean the policy here
SIDE_MODEL = "runctl-side"


class ModelNames:
    """The served name, it with a provider prefix (``openai/NAME``, ``hosted_vllm/NAME`` ...), and aliases (exact
    names or ``fnmatch`` patterns; ``claude-*`` by default)."""

    def __init__(self, served: str | None, aliases: tuple[str, ...] = DEFAULT_ALIASES) -> None:
        self.served = served
        self.aliases = aliases

    def resolve(self, asked: Any, learned: str | None) -> str:
        """The served name for a request that asked for ``asked``; ``learned`` is what the replicas said they serve.

        Raises:
            ProxyError: 503 while no name is known yet, 404 for a name that is not this model's.
        """
        served = self.served or learned
        if served is None:
            raise ProxyError(
                503, "the served model name is not known yet: no replica has answered /v1/models", "service_unavailable"
            )
        if asked is None or asked == served:
            return served
        name = str(asked)
        for prefix in PROVIDER_PREFIXES:
            if name.startswith(prefix) and name[len(prefix) :] == served:
                return served
        if self.is_side(name):
            return served
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in self.aliases):
            return served
        accepted = ", ".join([served, *self.aliases, SIDE_MODEL])
        raise ProxyError(
            404,
            f"model {name!r} is not served here. Fix: ask for {served!r} (accepted: {accepted}).",
            "model_not_found",
        )

    @staticmethod
    def is_side(asked: Any) -> bool:
        """Whether a request asked for :data:`SIDE_MODEL` (bare or with a provider prefix): not the policy's turn."""
        name = str(asked or "")
        return name == SIDE_MODEL or any(name == prefix + SIDE_MODEL for prefix in PROVIDER_PREFIXES)

    def listed(self, learned: str | None, created: int) -> list[dict[str, Any]]:
        """``/v1/models``'s entries: the served name and the aliases that are names, not patterns."""
        served = self.served or learned or ""
        names = [served] + [a for a in self.aliases if not any(c in a for c in "*?[")]
        return [{"id": n, "object": "model", "created": created, "owned_by": "runctl"} for n in names if n]
