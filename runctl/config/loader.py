"""Resolve a run config from its layers into a validated model, remembering who set each key.

The layers, lowest first, are the code below (``LAYERS``): built-in defaults → ``site.env`` (once per cluster) →
the run config → the process environment for the documented overrides only (``ENV_OVERRIDES``). A key set in a
higher layer replaces the lower one; ``${VAR}`` in a file sees keys set earlier in the same file, then the lower
layers, then the process environment.

Locked keys: what a run's code runs as and reaches — ``LOCKED_BY_SITE`` (the Python, the Ray cluster, the Docker
host, the kubeconfig and the sandbox namespace) and any key ``site.env`` lists in ``LOCKED_KEYS`` — keep the value
``site.env`` gives them: a run's file or environment that sets another is refused with the key named (on the
submitter's machine and again on the server, against the server's ``site.env``).
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from runctl.config.envfile import Entry, expand, parse_env
from runctl.config.models import ENV_OVERRIDES, MODELS, RUN_TYPES, RunConfig, RunType, all_keys, is_secret
from runctl.errors import ConfigError, ConfigIssue
from runctl.safefiles import read_regular_text

Layer = Literal["default", "site", "run", "env"]
LAYERS: tuple[Layer, ...] = ("default", "site", "run", "env")
PLACEHOLDER = "CHANGEME"
#: Keys a run may not change once ``site.env`` sets them.
LOCKED_BY_SITE = ("VENV_PATH", "RAY_ADDRESS", "DOCKER_HOST", "KUBECONFIG", "K8S_NAMESPACE", "K8S_BUNDLE_CLAIM")
#: The ``site.env``-only key that lists more keys to lock (comma-separated).
LOCKED_KEYS = "LOCKED_KEYS"
REDACTED = "***"


@dataclass(frozen=True)
class Setting:
    """One resolved key: its value as text (None when unset), the layer that set it and where."""

    value: str | None
    layer: Layer
    source: str

    def as_dict(self) -> dict[str, str | None]:
        return {"value": self.value, "layer": self.layer, "source": self.source}


@dataclass(frozen=True)
class ResolvedConfig:
    """A config after layering, interpolation and validation."""

    path: str
    run_type: RunType
    model: RunConfig
    settings: dict[str, Setting]
    raw_text: str
    site_path: str | None = None
    secrets: frozenset[str] = field(default_factory=frozenset)
    secret_values: frozenset[str] = field(default_factory=frozenset)
    """The values of secrets this config holds or interpolates (``${WANDB_API_KEY}``, ``${HF_TOKEN}``): wherever
    they end up inside another key's value, records show ``***`` instead."""

    def redact(self, text: str) -> str:
        """``text`` with every secret value this config holds replaced by ``***``."""
        return redact(text, self.secret_values)

    def redacted_settings(self) -> dict[str, dict[str, str | None]]:
        """Every key with its value, layer and source; secret values (and secrets inside values) as ``***``."""
        out: dict[str, dict[str, str | None]] = {}
        for key, setting in self.settings.items():
            row = setting.as_dict()
            if key in self.secrets and setting.value:
                row["value"] = REDACTED
            elif setting.value:
                row["value"] = self.redact(setting.value)
            out[key] = row
        return out

    def keys_holding_secrets(self) -> list[str]:
        """Keys (not secret themselves) whose values hold a secret: a submitted run would see ``***`` there."""
        return [
            key
            for key, setting in self.settings.items()
            if key not in self.secrets and setting.value and self.redact(setting.value) != setting.value
        ]

    def redacted_text(self) -> str:
        """The raw config text with every assignment of a secret key blanked (all the lines it spans), safe to
        publish and store. Line numbers stay as they were."""
        lines = self.raw_text.splitlines(keepends=True)
        for entry in parse_env(self.raw_text, self.path):
            if entry.key not in self.secrets:
                continue
            first, last = entry.line - 1, max(entry.line, entry.end_line) - 1
            prefix = lines[first].split("=", 1)[0]
            lines[first] = f"{prefix}={REDACTED}\n"
            for index in range(first + 1, min(last, len(lines) - 1) + 1):
                lines[index] = "\n"
        return "".join(lines)

    def to_env(self) -> str:
        """The resolved config as an ``.env`` file (secrets redacted), each line saying which layer set it."""
        rows = [f"# resolved from {self.path}; every key, its value and the layer that set it"]
        for key, row in self.redacted_settings().items():
            value = "" if row["value"] is None else row["value"]
            rows.append(f"{key}={json.dumps(value)}  # {row['layer']}: {row['source']}")
        return "\n".join(rows) + "\n"


#: Names of variables whose values are secrets when a config interpolates them (``${HF_TOKEN}``), besides the keys
#: marked secret in the config models.
SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)(_|$)", re.IGNORECASE)
#: Shorter values are not redacted inside other values (a one-letter "secret" would blank half a command line).
MIN_SECRET_LENGTH = 4


def redact(text: str, secret_values: frozenset[str]) -> str:
    """``text`` with each of ``secret_values`` replaced by ``***``, longest first."""
    for value in sorted(secret_values, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return text


def default_home(environ: Mapping[str, str] | None = None) -> Path:
    """``$RUNCTL_HOME``, or ``~/.runctl``."""
    env = os.environ if environ is None else environ
    return Path(env.get("RUNCTL_HOME") or Path.home() / ".runctl")


def site_env_path(environ: Mapping[str, str] | None = None) -> Path | None:
    """The cluster's ``site.env``: ``$RUNCTL_SITE_ENV``, else ``$RUNCTL_HOME/site.env`` if it exists."""
    env = os.environ if environ is None else environ
    if env.get("RUNCTL_SITE_ENV"):
        return Path(env["RUNCTL_SITE_ENV"])
    candidate = default_home(env) / "site.env"
    return candidate if candidate.is_file() else None


def _read(path: Path, what: str) -> str:
    try:
        return read_regular_text(path, what=what)
    except FileNotFoundError as e:
        issue = ConfigIssue(str(path), None, None, f"{what} not found.", "check the path.", code="schema.file")
        raise ConfigError([issue]) from e
    except (OSError, UnicodeDecodeError) as e:
        issue = ConfigIssue(str(path), None, None, f"cannot read the {what}: {e}.", "", code="schema.file")
        raise ConfigError([issue]) from e


def _defaults(run_type: RunType) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name, info in MODELS[run_type].model_fields.items():
        if info.is_required():
            continue
        default = info.get_default(call_default_factory=True)
        out[name.upper()] = None if default is None else _as_text(default)
    return out


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _suggest(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key.upper(), known, n=3, cutoff=0.6)
    return f"did you mean {' or '.join(close)}?" if close else "see `runctl init` or the README's config table."


class _Resolver:
    def __init__(self, run_type: RunType, environ: Mapping[str, str], run_path: str) -> None:
        self.run_type = run_type
        self.run_path = run_path
        self.environ = environ
        self.known = all_keys()
        self.defaults = _defaults(run_type)
        self.settings: dict[str, Setting] = {
            key: Setting(value, "default", "default") for key, value in self.defaults.items()
        }
        self.issues: list[ConfigIssue] = []
        self.secret_keys = frozenset(key for key in self.known if any(is_secret(t, key) for t in RUN_TYPES))
        self.secret_values: set[str] = set()
        self.listed_locks: list[str] = []
        self.locked: dict[str, Setting] = {}
        """Keys ``site.env`` set and locked: the run's layers may not change them."""

    def lookup(self, current: dict[str, str]) -> Any:
        def find(name: str) -> str | None:
            if name in current:
                value: str | None = current[name]
            elif name in self.settings and self.settings[name].value is not None:
                value = self.settings[name].value
            else:
                value = self.environ.get(name)
            if value and len(value) >= MIN_SECRET_LENGTH and (name in self.secret_keys or SECRET_NAME.search(name)):
                self.secret_values.add(value)  # interpolated into another value: redacted wherever that goes
            return value

        return find

    def apply(self, entries: list[Entry], layer: Layer) -> None:
        current: dict[str, str] = {}
        for entry in entries:
            try:
                value = expand(entry, self.lookup(current))
            except ConfigError as e:
                self.issues.extend(e.issues)
                continue
            current[entry.key] = value
            if entry.key == LOCKED_KEYS:
                self._lock_keys(entry, value, layer)
                continue
            if not self.check_key(entry, layer) or not self.check_unlocked(entry.key, value, entry.path, entry.line):
                continue
            if PLACEHOLDER in value:
                self.issues.append(
                    ConfigIssue(
                        entry.path,
                        entry.line,
                        entry.key,
                        f"{entry.key} is still the placeholder {PLACEHOLDER}.",
                        f"set {entry.key} to a real value: {_help(self.run_type, entry.key)}",
                        code="schema.placeholder",
                    )
                )
            self.settings[entry.key] = Setting(value, layer, entry.where)

    def check_key(self, entry: Entry, layer: Layer) -> bool:
        """True if the key applies to this run type; records an issue for unknown keys."""
        key = entry.key
        if key == "RUN_TYPE" and layer == "site":
            return False
        if key == LOCKED_KEYS:
            self._lock_keys(entry, "", layer)
            return False
        applies_to = self.known.get(key)
        if applies_to is None:
            self.issues.append(
                ConfigIssue(
                    entry.path,
                    entry.line,
                    key,
                    f"unknown key {key}: runctl would ignore it and the run would not do what you meant.",
                    _suggest(key, list(self.known)),
                    code="schema.unknown_key",
                )
            )
            return False
        if self.run_type in applies_to:
            return True
        if layer == "site":
            return False  # site.env serves every run type; keys for other types are simply not used here
        self.issues.append(
            ConfigIssue(
                entry.path,
                entry.line,
                key,
                f"{key} applies to {', '.join(applies_to)} runs, not to this {self.run_type} run.",
                f"remove it, or set RUN_TYPE={applies_to[0]} if this config is meant for that.",
                code="schema.key_not_for_run_type",
            )
        )
        return False

    def _lock_keys(self, entry: Entry, value: str, layer: Layer) -> None:
        def refuse(message: str, fix: str, code: str) -> None:
            self.issues.append(ConfigIssue(entry.path, entry.line, LOCKED_KEYS, message, fix, code=code))

        if layer != "site":
            refuse(
                f"{LOCKED_KEYS} is the cluster's: only site.env may lock keys.",
                f"remove {LOCKED_KEYS} from the run config.",
                "schema.locked_key",
            )
            return
        for key in (k.strip().upper() for k in value.split(",") if k.strip()):
            if key in self.known:
                self.listed_locks.append(key)
            else:
                refuse(
                    f"{LOCKED_KEYS} names {key}, which is no run config key.",
                    _suggest(key, list(self.known)),
                    "schema.unknown_key",
                )

    def lock_site_keys(self) -> None:
        """After the site layer: the keys it set that are locked (``LOCKED_BY_SITE`` and those it listed)."""
        for key in dict.fromkeys([*LOCKED_BY_SITE, *self.listed_locks]):
            setting = self.settings.get(key)
            if setting is not None and setting.layer == "site":
                self.locked[key] = setting

    def check_unlocked(self, key: str, value: str | None, path: str, line: int | None) -> bool:
        """True unless ``key`` is locked by site.env to another value (then an issue is recorded)."""
        site = self.locked.get(key)
        if site is None or site.value == value:
            return True
        shown = REDACTED if key in self.secret_keys else site.value
        self.issues.append(
            ConfigIssue(
                path,
                line,
                key,
                f"{key} is locked by the cluster's site.env ({site.source}, which sets it to {shown}): a run may not "
                "change the Python, the cluster or the sandbox host its code runs on.",
                f"remove {key} from the run config (or ask the cluster's operator to change site.env).",
                code="schema.locked_key",
            )
        )
        return False

    def apply_environment(self) -> None:
        for key in ENV_OVERRIDES:
            if key in self.environ and self.check_unlocked(key, self.environ[key], f"environment ${key}", None):
                self.settings[key] = Setting(self.environ[key], "env", f"environment ${key}")

    def build(self) -> RunConfig | None:
        data = {key: s.value for key, s in self.settings.items() if s.layer != "default"}
        try:
            return MODELS[self.run_type].model_validate(data)
        except ValidationError as e:
            already = {issue.key for issue in self.issues}
            for err in e.errors(include_url=False):
                issue = self.issue_from(err)
                if issue.key not in already:
                    self.issues.append(issue)
            return None

    def issue_from(self, err: Any) -> ConfigIssue:
        ctx = err.get("ctx") or {}
        loc = [str(part) for part in err.get("loc", ())]
        key = loc[0].upper() if loc else (ctx.get("keys") or [None])[0]
        setting = self.settings.get(key) if key else None
        path, line = _split_source(setting.source if setting else "")
        if err["type"] == "missing":
            return ConfigIssue(
                path or self.run_path,
                None,
                key,
                f"{key} is required and not set.",
                f"add {key}=… to the run config: {_help(self.run_type, key or '')}",
                code="schema.required",
            )
        if err["type"] == "cross_field":
            return ConfigIssue(
                path or self.run_path,
                line,
                key,
                f"{err['msg']}.",
                "fix one of the keys named.",
                code="schema.cross_field",
            )
        shown = REDACTED if key and is_secret(self.run_type, key) else err.get("input")
        allowed = ""
        if err["type"] == "literal_error":
            allowed = f"allowed: {ctx.get('expected', '')}"
        return ConfigIssue(
            path or self.run_path,
            line,
            key,
            f"{key}={shown!r} is not valid: {err['msg']}.",
            allowed or f"{_help(self.run_type, key or '')}",
        )


def _split_source(source: str) -> tuple[str, int | None]:
    path, _, line = source.rpartition(":")
    if path and line.isdigit():
        return path, int(line)
    return "", None


def _help(run_type: RunType, key: str) -> str:
    from runctl.config.fielddocs import field_doc

    return field_doc(MODELS[run_type], key.lower())


def _run_type(entries: list[Entry], path: str, given: RunType | None, environ: Mapping[str, str]) -> RunType:
    if given is not None:
        return given
    earlier: dict[str, str] = {}
    found: tuple[Entry, str] | None = None
    for entry in entries:
        try:
            earlier[entry.key] = expand(entry, lambda name: earlier.get(name, environ.get(name)))
        except ConfigError:
            if entry.key == "RUN_TYPE":
                raise
            continue
        if entry.key == "RUN_TYPE":
            found = (entry, earlier[entry.key])
    if found is not None:
        entry, value = found
        if value in RUN_TYPES:
            return value
        raise ConfigError(
            [
                ConfigIssue(
                    path,
                    entry.line,
                    "RUN_TYPE",
                    f"RUN_TYPE={value!r} is not a run type.",
                    f"allowed: {', '.join(RUN_TYPES)}.",
                    code="schema.value",
                )
            ]
        )
    raise ConfigError(
        [
            ConfigIssue(
                path,
                None,
                "RUN_TYPE",
                "RUN_TYPE is not set, so runctl cannot tell which runner this config is for.",
                f"add RUN_TYPE=train|eval|infer (or start from `runctl init {'|'.join(RUN_TYPES)} NAME`).",
                code="schema.required",
            )
        ]
    )


def resolve_text(
    text: str,
    path: str = "<config>",
    *,
    site_text: str | None = None,
    site_path: str | None = None,
    environ: Mapping[str, str] | None = None,
    run_type: RunType | None = None,
) -> ResolvedConfig:
    """Resolve config text (and optional site text) into a validated config.

    Raises:
        ConfigError: every problem found, each with its file and line.
    """
    env = dict(os.environ if environ is None else environ)
    run_entries = parse_env(text, path)
    site_entries = parse_env(site_text, site_path or "site.env") if site_text is not None else []
    kind = _run_type(run_entries, path, run_type, env)
    resolver = _Resolver(kind, env, path)
    resolver.apply(site_entries, "site")
    resolver.lock_site_keys()
    resolver.apply(run_entries, "run")
    resolver.apply_environment()
    model = resolver.build()
    if resolver.issues or model is None:
        raise ConfigError(sorted(resolver.issues, key=lambda i: (i.path != path, i.line or 0)))
    secret_values = set(resolver.secret_values)
    for key in resolver.secret_keys:
        value = resolver.settings.get(key, Setting(None, "default", "")).value
        if value and len(value) >= MIN_SECRET_LENGTH:
            secret_values.add(value)
    return ResolvedConfig(
        path, kind, model, resolver.settings, text, site_path, resolver.secret_keys, frozenset(secret_values)
    )


def load_config(
    path: str | Path,
    *,
    site_path: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    run_type: RunType | None = None,
) -> ResolvedConfig:
    """Read and resolve a run config file with its site layer.

    Args:
        path: the run's ``.env`` file.
        site_path: the cluster's ``site.env``; None looks it up (``$RUNCTL_SITE_ENV``, ``$RUNCTL_HOME/site.env``).
        environ: the process environment (defaults to ``os.environ``).
        run_type: force the run type instead of reading ``RUN_TYPE``.

    Raises:
        ConfigError: the file is missing or has problems, each named with file and line.
    """
    env = os.environ if environ is None else environ
    run_path = Path(path)
    text = _read(run_path, "config file")
    site = Path(site_path) if site_path is not None else site_env_path(env)
    site_text = _read(site, "site.env") if site is not None else None
    return resolve_text(
        text,
        str(run_path),
        site_text=site_text,
        site_path=str(site) if site is not None else None,
        environ=env,
        run_type=run_type,
    )


def submitted_values(
    run_type: RunType, resolved: Mapping[str, Mapping[str, Any]], environ: Mapping[str, str] | None = None
) -> dict[str, str | None]:
    """The values a submitted run is checked and carried with, on the server: the submitter's own keys (its run
    file's and environment overrides', as it resolved them) over this cluster's ``site.env`` — the server's, never
    the site layer the submitter had.

    Args:
        run_type: the run's type.
        resolved: the submission's ``resolved`` rows (key → value and layer).
        environ: the server's environment (``RUNCTL_SITE_ENV``, ``RUNCTL_HOME``); defaults to ``os.environ``.

    Raises:
        ConfigError: the server's site.env cannot be read or has problems.
    """
    env = os.environ if environ is None else environ
    values: dict[str, str | None] = {}
    site = site_env_path(env)
    if site is not None:
        resolver = _Resolver(run_type, env, str(site))
        resolver.apply(parse_env(_read(site, "site.env"), str(site)), "site")
        if resolver.issues:
            raise ConfigError(resolver.issues)
        resolver.lock_site_keys()
        values = {key: s.value for key, s in resolver.settings.items() if s.layer == "site"}
    else:
        resolver = _Resolver(run_type, env, "site.env")
    for key, row in resolved.items():
        if row.get("layer") in ("run", "env"):
            if resolver.check_unlocked(key, row.get("value"), str(row.get("source") or "the submission"), None):
                values[key] = row.get("value")
    if resolver.issues:
        raise ConfigError(resolver.issues)
    return values


def validate_settings(run_type: RunType, values: Mapping[str, str | None], source: str) -> RunConfig:
    """Validate already-resolved values (as carried by ``config.submitted``) against the run type's schema.

    Args:
        run_type: the run type the values claim.
        values: key → value as text, for every key set above the default layer.
        source: what to name as the origin in messages (the run id, say).

    Raises:
        ConfigError: unknown keys, placeholders left in, bad values, missing keys.
    """
    resolver = _Resolver(run_type, {}, source)
    for number, (key, value) in enumerate(values.items(), start=1):
        entry = Entry(key=key, parts=(value or "",), path=source, line=number)
        if resolver.check_key(entry, "run"):
            if value is not None and PLACEHOLDER in value:
                resolver.issues.append(
                    ConfigIssue(
                        source,
                        None,
                        key,
                        f"{key} is still the placeholder {PLACEHOLDER}.",
                        f"set {key} to a real value.",
                        code="schema.placeholder",
                    )
                )
            resolver.settings[key] = Setting(value, "run", f"{source}:{key}")
    model = resolver.build()
    if resolver.issues or model is None:
        raise ConfigError(resolver.issues)
    return model
