"""What a team token looks like: ``rct_<team>.`` and 256 random bits (43 URL-safe characters).

The shape alone names the team that presents it (:func:`team_of_token`); only the registry (``runctl.teams``) can
say whether it is that team's token. Kept apart from the registry so that the bus client can read a token's team
without importing the registry, which imports the bus.
"""

from __future__ import annotations

import hashlib
import re
import secrets

TOKEN_PREFIX = "rct_"
TEAM_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")
"""A team's name: lower case, a letter first, at most 32 characters."""


def new_token(team: str) -> str:
    return f"{TOKEN_PREFIX}{team}.{secrets.token_urlsafe(32)}"


def team_of_token(token: str) -> str | None:
    """The team a token names (not yet checked), or None when it is not a runctl token."""
    head, dot, rest = token.partition(".")
    if not head.startswith(TOKEN_PREFIX) or not dot or len(rest) < 43:
        return None
    team = head.removeprefix(TOKEN_PREFIX)
    return team if TEAM_NAME.fullmatch(team) else None


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
