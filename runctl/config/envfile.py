"""A parser for ``.env`` files that never executes them.

Grammar, per logical line::

    # a comment
    [export] KEY=VALUE   # optional inline comment after whitespace

VALUE is unquoted (up to an inline comment, trailing blanks trimmed), double-quoted (escapes ``\\" \\\\ \\$ \\n \\t``,
may span lines) or single-quoted (literal, may span lines). Unquoted and double-quoted values interpolate
``${VAR}``, ``${VAR:-default}`` (default when unset or empty) and ``${VAR-default}`` (default when unset); a
default may itself interpolate. Nothing else of the shell exists: no command substitution, no ``$VAR`` without
braces, no word splitting: ``$NAME``, ``$(…)`` and backquotes are errors rather than literal text.

Parsing yields :class:`Entry` objects whose values are still templates; :func:`expand` fills them in with a
lookup supplied by the layering code, so that interpolation can see earlier keys and lower layers.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from runctl.errors import ConfigError, ConfigIssue

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAX_NESTING = 16
_UNQUOTED_ESCAPES = {"$": "$"}
_DOUBLE_ESCAPES = {'"': '"', "\\": "\\", "$": "$", "n": "\n", "t": "\t", "`": "`"}


@dataclass(frozen=True)
class Ref:
    """A ``${NAME}`` reference; ``default`` is set for ``${NAME:-…}`` / ``${NAME-…}``."""

    name: str
    default: tuple[Part, ...] | None = None
    use_default_if_empty: bool = False


Part = str | Ref


@dataclass(frozen=True)
class Entry:
    """One ``KEY=VALUE`` assignment: where it is and its value as a template."""

    key: str
    parts: tuple[Part, ...]
    path: str
    line: int
    end_line: int = 0
    """Last line the assignment spans (a quoted value may span several); 0 means ``line``."""

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


class _Scanner:
    def __init__(self, text: str, path: str) -> None:
        self.text = text
        self.path = path
        self.pos = 0
        self.line = 1
        self.depth = 0

    def fail(self, message: str, fix: str = "", key: str | None = None) -> ConfigError:
        return ConfigError([ConfigIssue(self.path, self.line, key, message, fix, code="schema.syntax")])

    def peek(self, offset: int = 0) -> str:
        i = self.pos + offset
        return self.text[i] if i < len(self.text) else ""

    def advance(self) -> str:
        ch = self.text[self.pos]
        self.pos += 1
        if ch == "\n":
            self.line += 1
        return ch

    def skip_blanks(self) -> None:
        while self.peek() in (" ", "\t", "\r") and self.peek() != "":
            self.pos += 1

    def skip_comment(self) -> None:
        while self.peek() not in ("\n", ""):
            self.pos += 1

    def end_of_line(self, key: str) -> None:
        """After a value: only blanks and a comment may follow on the line."""
        self.skip_blanks()
        if self.peek() == "#":
            self.skip_comment()
        if self.peek() not in ("\n", ""):
            raise self.fail(
                f"{key}: unexpected text after the closing quote.",
                "put the whole value inside one pair of quotes, or start a comment with ' #'.",
                key,
            )

    def parse(self) -> list[Entry]:
        entries: list[Entry] = []
        while self.pos < len(self.text):
            self.skip_blanks()
            ch = self.peek()
            if ch == "":
                break
            if ch == "\n":
                self.advance()
                continue
            if ch == "#":
                self.skip_comment()
                continue
            entries.append(self.assignment())
        return entries

    def assignment(self) -> Entry:
        line = self.line
        match = _KEY.match(self.text, self.pos)
        if match and match.group() == "export" and self.peek(len("export")) in (" ", "\t"):
            self.pos = match.end()
            self.skip_blanks()
            match = _KEY.match(self.text, self.pos)
        if not match:
            end = self.text.find("\n", self.pos)
            bad = self.text[self.pos : end if end >= 0 else None]
            raise self.fail(
                f"expected KEY=VALUE, found {bad.strip()[:60]!r}.",
                "keys are letters, digits and underscores, not starting with a digit; "
                "comments start with '#'. A config file is data, not a shell script.",
            )
        key = match.group()
        self.pos = match.end()
        self.skip_blanks()
        if self.peek() != "=":
            end = self.text.find("\n", self.pos)
            line_text = self.text[self.text.rfind("\n", 0, self.pos) + 1 : end if end >= 0 else None].strip()
            raise self.fail(
                f"expected KEY=VALUE, found {line_text[:60]!r}: {key} has no '=' after it.",
                f"write {key}=VALUE ({key}= for empty); a config file is data, not a shell script.",
                key,
            )
        self.pos += 1
        self.skip_blanks()
        parts = self.value(key)
        return Entry(key=key, parts=tuple(_merge(parts)), path=self.path, line=line, end_line=self.line)

    def value(self, key: str) -> list[Part]:
        ch = self.peek()
        if ch == "'":
            self.advance()
            start_line = self.line
            end = self.text.find("'", self.pos)
            if end < 0:
                self.line = start_line
                raise self.fail(f"{key}: single quote opened here is never closed.", "close it with '.", key)
            literal = self.text[self.pos : end]
            while self.pos <= end:
                self.advance()
            self.end_of_line(key)
            return [literal]
        if ch == '"':
            self.advance()
            parts = self.segment(key, terminators='"', escapes=_DOUBLE_ESCAPES, opened='"')
            self.end_of_line(key)
            return parts
        return self.unquoted(key)

    def unquoted(self, key: str) -> list[Part]:
        parts: list[Part] = []
        buf: list[str] = []
        while True:
            ch = self.peek()
            if ch in ("\n", ""):
                break
            starts_value = not buf and not parts
            if ch == "#" and (starts_value or (buf and buf[-1] in (" ", "\t"))):
                break  # an inline comment (or KEY=#comment: an empty value)
            if ch in ('"', "'"):
                raise self.fail(
                    f"{key}: a quote inside an unquoted value is ambiguous.",
                    "wrap the whole value in single quotes (literal) or double quotes (interpolated).",
                    key,
                )
            self.interpolated_char(key, buf, parts, _UNQUOTED_ESCAPES)
        parts.append("".join(buf))
        # Trim trailing blanks of the last literal part (and the blanks before an inline comment).
        while parts and isinstance(parts[-1], str):
            stripped = parts[-1].rstrip(" \t\r")
            parts[-1] = stripped
            if stripped or len(parts) == 1:
                break
            parts.pop()
        return parts

    def segment(self, key: str, terminators: str, escapes: dict[str, str], opened: str) -> list[Part]:
        """Read up to one of ``terminators`` (consumed), interpolating ``${…}`` and applying ``escapes``."""
        start_line = self.line
        parts: list[Part] = []
        buf: list[str] = []
        while True:
            ch = self.peek()
            if ch == "":
                self.line = start_line
                what = "double quote" if opened == '"' else "'${'"
                raise self.fail(f"{key}: {what} opened here is never closed.", f"close it with {opened}.", key)
            if ch in terminators:
                self.advance()
                break
            self.interpolated_char(key, buf, parts, escapes)
        parts.append("".join(buf))
        return parts

    def interpolated_char(self, key: str, buf: list[str], parts: list[Part], escapes: dict[str, str]) -> None:
        """Consume one piece of an interpolated value: an escape, a ``${…}`` reference, or a plain character."""
        ch = self.peek()
        if ch == "\\" and self.peek(1) in escapes:
            buf.append(escapes[self.peek(1)])
            self.pos += 2
        elif ch == "$" and self.peek(1) == "{":
            parts.append("".join(buf))
            buf.clear()
            parts.append(self.reference(key))
        else:
            self.refuse_shell_expansion(key)
            buf.append(self.advance())

    def refuse_shell_expansion(self, key: str) -> None:
        """``$NAME`` and ``$(…)`` would expand in the shell this file once was; here they would stay literal text
        and silently mean something else, so they are errors."""
        if self.peek() == "`":
            raise self.fail(
                f"{key}: a backquote is shell command substitution; nothing here is executed.",
                "wrap the value in single quotes to keep the backquote as text.",
                key,
            )
        if self.peek() != "$":
            return
        name = _KEY.match(self.text, self.pos + 1)
        if self.peek(1) == "(" or name is not None:
            shown = f"${name.group()}" if name is not None else "$(...)"
            raise self.fail(
                f"{key}: {shown} is shell syntax; nothing here is executed or expanded that way.",
                "write ${NAME} to use a value, or \\$ (or single quotes) for a literal '$'.",
                key,
            )

    def reference(self, key: str) -> Ref:
        self.depth += 1
        if self.depth > _MAX_NESTING:
            raise self.fail(f"{key}: defaults nested more than {_MAX_NESTING} deep.", "simplify the value.", key)
        try:
            return self._reference(key)
        finally:
            self.depth -= 1

    def _reference(self, key: str) -> Ref:
        self.pos += 2  # ${
        match = _KEY.match(self.text, self.pos)
        if not match:
            raise self.fail(
                f"{key}: '${{' must be followed by a variable name.",
                "write ${NAME}, ${NAME:-default} or ${NAME-default}; for a literal '$' write \\$.",
                key,
            )
        name = match.group()
        self.pos = match.end()
        if self.peek() == "}":
            self.pos += 1
            return Ref(name)
        if self.peek() == ":" and self.peek(1) == "-":
            self.pos += 2
            default = self.segment(key, "}", {"}": "}", "\\": "\\", "$": "$"}, opened="}")
            return Ref(name, tuple(_merge(default)), use_default_if_empty=True)
        if self.peek() == "-":
            self.pos += 1
            default = self.segment(key, "}", {"}": "}", "\\": "\\", "$": "$"}, opened="}")
            return Ref(name, tuple(_merge(default)), use_default_if_empty=False)
        raise self.fail(
            f"{key}: unsupported expansion after ${{{name}.",
            "only ${NAME}, ${NAME:-default} and ${NAME-default} are supported; nothing is executed.",
            key,
        )


def _merge(parts: list[Part]) -> list[Part]:
    """Join adjacent literal parts and drop empty ones (keeping one empty literal for an empty value)."""
    merged: list[Part] = []
    for part in parts:
        if isinstance(part, str):
            if not part:
                continue
            if merged and isinstance(merged[-1], str):
                merged[-1] = merged[-1] + part
                continue
        merged.append(part)
    return merged or [""]


def parse_env(text: str, path: str = "<string>") -> list[Entry]:
    """Parse ``.env`` text into entries, in file order.

    Raises:
        ConfigError: on any syntax problem, naming the file and line.
    """
    return _Scanner(text.removeprefix("\ufeff"), path).parse()


Lookup = Callable[[str], str | None]


def expand(entry: Entry, lookup: Lookup) -> str:
    """Fill in an entry's ``${…}`` references.

    Args:
        entry: the parsed assignment.
        lookup: returns the value of a name, or None where it is not defined.

    Raises:
        ConfigError: a referenced name is undefined and has no default.
    """
    return _expand_parts(entry.parts, lookup, entry)


def _expand_parts(parts: tuple[Part, ...], lookup: Lookup, entry: Entry) -> str:
    out: list[str] = []
    for part in parts:
        if isinstance(part, str):
            out.append(part)
            continue
        value = lookup(part.name)
        if part.default is not None and (value is None or (part.use_default_if_empty and value == "")):
            value = _expand_parts(part.default, lookup, entry)
        if value is None:
            raise ConfigError(
                [
                    ConfigIssue(
                        entry.path,
                        entry.line,
                        entry.key,
                        f"{entry.key} uses ${{{part.name}}}, which is not set earlier in this file, in a lower "
                        "layer (site.env, defaults) or in the environment.",
                        f"set {part.name} above this line, or give a default: ${{{part.name}:-value}}.",
                        code="schema.undefined_variable",
                    )
                ]
            )
        out.append(value)
    return "".join(out)


def quote(value: str) -> str:
    """``value`` as a double-quoted ``.env`` value that parses back to exactly ``value`` (nothing interpolated)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")
    return '"' + escaped.replace("\n", "\\n").replace("\t", "\\t") + '"'
