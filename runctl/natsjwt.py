"""NATS's own keys and tokens, as far as runctl's auth callout needs them (:mod:`runctl.callout`).

An *nkey* is an Ed25519 key written as NATS writes it: a public key is a role letter (``A`` account, ``U`` user,
``N`` server) and the key, a seed (``SA…``) the private half of an account's; both base32 with a CRC-16 at the end,
so a mistyped key is refused rather than used. A NATS *JWT* is a JSON claim set signed by an nkey
(``alg: ed25519-nkey``); ``nats-server`` checks the signature against the issuer the claims name. The signing
itself is the ``cryptography`` library's Ed25519; this module only writes and reads NATS's encodings of it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from runctl.errors import BusError

#: Role bytes of NATS's key prefixes (the first base32 letter of a key names its role).
ACCOUNT = 0 << 3
SERVER = 13 << 3
USER = 20 << 3
_SEED = 18 << 3
ROLES = {"A": ACCOUNT, "N": SERVER, "U": USER}
JWT_HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}


def _b32(raw: bytes) -> str:
    return base64.b32encode(raw).decode().rstrip("=")


def _unb32(text: str) -> bytes:
    try:
        return base64.b32decode(text + "=" * (-len(text) % 8))
    except (binascii.Error, ValueError) as e:
        raise BusError(f"not a NATS key (base32): {e}") from None


def _with_crc(raw: bytes) -> bytes:
    return raw + binascii.crc_hqx(raw, 0).to_bytes(2, "little")


def _checked(text: str) -> bytes:
    raw = _unb32(text)
    if len(raw) < 3 or binascii.crc_hqx(raw[:-2], 0).to_bytes(2, "little") != raw[-2:]:
        raise BusError("not a NATS key: its checksum does not match (a character was changed or lost)")
    return raw[:-2]


def public_key(role: int, raw: bytes) -> str:
    return _b32(_with_crc(bytes([role]) + raw))


def public_role(key: str) -> int:
    """The role of a public key (one of :data:`ROLES`), after checking its checksum."""
    raw = _checked(key)
    if len(raw) != 33 or raw[0] not in ROLES.values():
        raise BusError(f"{key[:8]}… is not a public NATS key")
    return raw[0]


def public_bytes(key: str) -> bytes:
    public_role(key)
    return _checked(key)[1:]


@dataclass(frozen=True)
class NKey:
    """An account's signing key pair (the auth callout's issuer)."""

    seed: str

    @classmethod
    def create(cls) -> NKey:
        raw = os.urandom(32)
        return cls(_b32(_with_crc(bytes([_SEED | ACCOUNT >> 5, (ACCOUNT & 31) << 3]) + raw)))

    @classmethod
    def load(cls, path: Path, create: bool = False) -> NKey:
        """The seed kept in ``path``; with ``create``, one made (mode 0600) when the file does not exist."""
        from runctl.stackbus import write_private

        try:
            key = cls(path.read_text().strip())
        except FileNotFoundError:
            if not create:
                raise BusError(
                    f"{path} does not exist. Fix: make it with `runctl team nats-config --issuer-seed "
                    f"{path}`, which writes the key nats-server's configuration names."
                ) from None
            key = cls.create()
            path.parent.mkdir(parents=True, exist_ok=True)
            write_private(path, key.seed + "\n")
        key.private()
        return key

    def _raw(self) -> bytes:
        raw = _checked(self.seed)
        if len(raw) != 34 or raw[0] & 0xF8 != _SEED or ((raw[0] & 7) << 5 | raw[1] >> 3) != ACCOUNT:
            raise BusError("not an account seed (it should begin with SA)")
        return raw[2:]

    def private(self) -> Ed25519PrivateKey:
        return Ed25519PrivateKey.from_private_bytes(self._raw())

    @property
    def public(self) -> str:
        raw = self.private().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return public_key(ACCOUNT, raw)

    def sign(self, data: bytes) -> bytes:
        return self.private().sign(data)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as e:
        raise BusError(f"not a JWT: {e}") from None


def encode(claims: dict[str, Any], issuer: NKey) -> str:
    """A JWT of ``claims`` issued and signed by ``issuer`` (``iss``, ``iat`` and ``jti`` are filled in)."""
    body = {**claims, "iss": issuer.public, "iat": int(time.time())}
    body["jti"] = _b32(hashlib.sha256(json.dumps(body, sort_keys=True).encode()).digest())
    signed = f"{_b64(json.dumps(JWT_HEADER).encode())}.{_b64(json.dumps(body).encode())}"
    return f"{signed}.{_b64(issuer.sign(signed.encode()))}"


def decode(token: str) -> dict[str, Any]:
    """The claims of a JWT, once its signature is checked against the issuer it names.

    Raises:
        BusError: not a NATS JWT, or its signature is not its issuer's.
    """
    parts = token.strip().split(".")
    if len(parts) != 3:
        raise BusError("not a JWT (three dot-separated parts)")
    try:
        header, claims = json.loads(_unb64(parts[0])), json.loads(_unb64(parts[1]))
    except ValueError as e:
        raise BusError(f"not a JWT: {e}") from None
    if not isinstance(header, dict) or header.get("alg") != JWT_HEADER["alg"] or not isinstance(claims, dict):
        raise BusError(f"not a NATS JWT (header {header!r})")
    issuer = claims.get("iss")
    if not isinstance(issuer, str):
        raise BusError("the JWT names no issuer")
    try:
        key = Ed25519PublicKey.from_public_bytes(public_bytes(issuer))
        key.verify(_unb64(parts[2]), f"{parts[0]}.{parts[1]}".encode())
    except InvalidSignature:
        raise BusError(f"the JWT's signature is not its issuer's ({issuer[:8]}…)") from None
    return claims
