"""NATS's key and token encodings (runctl.natsjwt), the callout's configuration (runctl.natsauth) and the launcher's
settings for it. The callout against a real nats-server: tests/security/test_run_logins.py and
tests/integration/test_team_permissions.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runctl import natsjwt
from runctl.callout import RUN_LOGINS, TEAMS, Grant, fingerprint, user_claims
from runctl.errors import BusError
from runctl.natsauth import AUTH_TIMEOUT_S, NatsUser, run_permissions, server_config
from runctl.natsjwt import ACCOUNT, NKey
from runctl.settings import SettingsError
from services.launcher.settings import LauncherSettings


def test_a_seed_and_its_public_key_are_written_as_nats_writes_them() -> None:
    key = NKey.create()
    assert key.seed.startswith("SA") and len(key.seed) == 58
    assert key.public.startswith("A") and len(key.public) == 56
    assert natsjwt.public_role(key.public) == ACCOUNT


def test_a_changed_character_is_caught_by_the_checksum() -> None:
    key = NKey.create()

    def changed(text: str) -> str:  # a letter in the middle: all five of its bits are the key's
        return text[:10] + ("B" if text[10] != "B" else "C") + text[11:]

    with pytest.raises(BusError, match="checksum"):
        natsjwt.public_role(changed(key.public))
    with pytest.raises(BusError, match="checksum"):
        NKey(changed(key.seed)).private()


def test_a_jwt_reads_back_and_a_tampered_one_does_not() -> None:
    key = NKey.create()
    token = natsjwt.encode({"sub": "x", "nats": {"type": "user"}}, key)
    claims = natsjwt.decode(token)
    assert claims["iss"] == key.public and claims["sub"] == "x" and claims["jti"]
    head, body, sig = token.split(".")
    forged = natsjwt._b64(json.dumps({**claims, "sub": "y"}).encode())
    with pytest.raises(BusError, match="signature"):
        natsjwt.decode(f"{head}.{forged}.{sig}")
    other = natsjwt.encode({"sub": "y"}, NKey.create()).split(".")[2]  # signed by another key, naming this one
    with pytest.raises(BusError, match="signature"):
        natsjwt.decode(f"{head}.{body}.{other}")
    with pytest.raises(BusError):
        natsjwt.decode("not.a-jwt")


def test_a_seed_file_is_made_private_once_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "callout.seed"
    with pytest.raises(BusError, match="does not exist"):
        NKey.load(path)
    made = NKey.load(path, create=True)
    assert path.stat().st_mode & 0o777 == 0o600
    assert NKey.load(path) == made == NKey.load(path, create=True)


def test_a_callout_configuration_names_only_fixed_users() -> None:
    """The callout's block cannot be reloaded: it lists the services', the admin and the system user only, whatever
    the teams, and the teams' accounts carry no user (their logins are asked of the callout)."""
    users = [NatsUser(n, "$2b$04$hash") for n in ("runctl", "admin", "system", "nlp", "vision")]
    texts = [
        server_config("127.0.0.1:4222", "/js", users[0], users[1], teams, callout_issuer="AKEY", system=users[2])
        for teams in ([], users[3:])
    ]
    blocks = [json.loads(t[t.index("{") :]) for t in texts]
    assert blocks[0]["authorization"] == blocks[1]["authorization"]
    assert blocks[1]["authorization"]["auth_callout"]["auth_users"] == ["runctl", "admin", "system"]
    assert blocks[1]["accounts"]["team-nlp"]["users"] == [] and blocks[1]["system_account"] == "SYS"
    plain = json.loads(server_config("h:1", "/js", users[0], users[1], users[3:]).split("\n", 1)[1])
    assert plain["authorization"] == {"timeout": AUTH_TIMEOUT_S} == {"timeout": blocks[0]["authorization"]["timeout"]}
    assert plain["accounts"]["team-nlp"]["users"][0]["user"] == "nlp"


def test_a_runs_user_jwt_carries_the_permissions_the_configuration_would() -> None:
    grant = Grant("RUNCTL", "run.nlp.r1", run_permissions("nlp", "r1"), RUN_LOGINS, "nlp.r1", "h")
    claims = user_claims(grant, "UKEY")
    assert claims["aud"] == "RUNCTL" and claims["sub"] == "UKEY" and claims["name"] == "run.nlp.r1"
    assert claims["nats"]["pub"] == run_permissions("nlp", "r1")["publish"]
    team = user_claims(Grant("team-nlp", "nlp", None, TEAMS, "nlp", "s"), "UKEY")
    assert team["aud"] == "team-nlp" and "pub" not in team["nats"] and "sub" not in team["nats"]


def test_what_a_login_hangs_on_is_read_from_each_bucket() -> None:
    assert fingerprint(RUN_LOGINS, b'{"bcrypt": "h1", "issued": 1}') == "h1"
    assert fingerprint(TEAMS, b'{"name": "nlp", "token_sha256": "s1"}') == "s1"
    assert fingerprint(TEAMS, b"") is None and fingerprint(RUN_LOGINS, b"not json") is None


def test_the_launcher_refuses_a_seed_file_without_run_logins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNCTL_RUN_LOGIN_SEED_FILE", "/etc/runctl/callout.seed")
    monkeypatch.delenv("RUNCTL_RUN_LOGINS", raising=False)
    with pytest.raises(SettingsError, match="RUNCTL_RUN_LOGINS=1"):
        LauncherSettings.from_env()
    monkeypatch.setenv("RUNCTL_RUN_LOGINS", "1")
    assert LauncherSettings.from_env().run_login_seed_file == Path("/etc/runctl/callout.seed")
