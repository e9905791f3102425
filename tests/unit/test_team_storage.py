"""A team's storage on the bus (runctl/teams.py): what bounds its streams and its account, and how a change reaches
nats-server's configuration."""

from __future__ import annotations

import json

from runctl.bus import StreamLimits
from runctl.natsauth import NatsUser, config_users, server_config
from runctl.teams import DEFAULT_CONSUMERS, DEFAULT_EVENTS_MB, DEFAULT_TRIALS_MB, MIB, Team


def account_limits(text: str, team: str) -> dict[str, int]:
    return dict(json.loads(text[text.index("{") :])["accounts"][team]["jetstream"])


def test_a_team_given_no_storage_gets_the_bounded_defaults() -> None:
    limits = Team("nlp").stream_limits()
    assert (limits.runs_max_bytes, limits.trials_max_bytes) == (DEFAULT_EVENTS_MB * MIB, DEFAULT_TRIALS_MB * MIB)
    assert limits == StreamLimits()  # the streams a services' first publish makes for a team are the same
    assert Team("nlp").nats_user().limits.storage_bytes == DEFAULT_EVENTS_MB * MIB


def test_a_teams_storage_bounds_its_streams_and_its_accounts_jetstream_and_a_change_is_seen() -> None:
    team = Team("nlp", events_mb=64, trials_mb=512, nats_bcrypt="$2b$04$x")
    limits = team.stream_limits()
    assert (limits.runs_max_bytes, limits.trials_max_bytes) == (64 * MIB, 512 * MIB)
    services = NatsUser("runctl-services", "$2b$04$y")
    text = server_config("127.0.0.1:4222", "/js", services, None, [team.nats_user()])
    assert account_limits(text, "team-nlp")["max_file"] == 64 * MIB
    # The embedded stack compares what it wrote with the registry: a new bound differs, so it writes and reloads.
    (written,) = config_users(text)
    assert written == team.nats_user()
    assert written != Team("nlp", events_mb=128, nats_bcrypt="$2b$04$x").nats_user()


def test_a_teams_consumers_bound_its_account_and_a_change_is_seen() -> None:
    assert Team("nlp").nats_user().limits.consumers == DEFAULT_CONSUMERS
    team = Team("nlp", consumers=5, nats_bcrypt="$2b$04$x")
    text = server_config("127.0.0.1:4222", "/js", NatsUser("runctl", "$2b$04$y"), None, [team.nats_user()])
    assert account_limits(text, "team-nlp")["max_consumers"] == 5
    (written,) = config_users(text)
    assert written == team.nats_user() != Team("nlp", consumers=6, nats_bcrypt="$2b$04$x").nats_user()
