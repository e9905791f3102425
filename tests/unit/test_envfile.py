from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runctl.config.envfile import expand, parse_env
from runctl.errors import ConfigError


def resolve(text: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """Parse and expand in order, as the loader does for one layer."""
    values: dict[str, str] = {}
    lower = env or {}
    for entry in parse_env(text, "t.env"):
        values[entry.key] = expand(entry, lambda name: values.get(name, lower.get(name)))
    return values


def test_plain_values_comments_and_blank_lines() -> None:
    text = "# a comment\n\nA=1\n   B=two words  \nC=x # inline comment\nD=#only a comment\nE=\n"
    assert resolve(text) == {"A": "1", "B": "two words", "C": "x", "D": "", "E": ""}


def test_hash_inside_a_word_is_part_of_the_value() -> None:
    assert resolve("URL=http://host/#frag\n") == {"URL": "http://host/#frag"}


def test_export_prefix_is_accepted() -> None:
    assert resolve("export A=1\nexport  B=2\n") == {"A": "1", "B": "2"}


def test_key_named_export_without_prefix_is_a_plain_key() -> None:
    assert resolve("export=1\n") == {"export": "1"}


def test_double_quotes_keep_spaces_and_interpolate_with_escapes() -> None:
    text = 'A=1\nB="  x ${A} \\"q\\" \\$HOME \\n"\n'
    assert resolve(text) == {"A": "1", "B": '  x 1 "q" $HOME \n'}


def test_single_quotes_are_literal() -> None:
    assert resolve("A=1\nB='${A} \\n $x'\n") == {"A": "1", "B": "${A} \\n $x"}


def test_quoted_values_may_span_lines_and_line_numbers_follow() -> None:
    entries = parse_env('A="one\ntwo"\nB=3\n', "t.env")
    assert [(e.key, e.line) for e in entries] == [("A", 1), ("B", 3)]
    assert resolve('A="one\ntwo"\n') == {"A": "one\ntwo"}


def test_interpolation_sees_earlier_keys_then_the_lower_lookup() -> None:
    text = "A=${ROOT}/models\nB=${A}/qwen\n"
    assert resolve(text, {"ROOT": "/shared"}) == {"A": "/shared/models", "B": "/shared/models/qwen"}


def test_self_reference_reads_the_lower_layer() -> None:
    assert resolve("PATHS=${PATHS}:/extra\n", {"PATHS": "/base"}) == {"PATHS": "/base:/extra"}


def test_defaults_with_colon_apply_when_unset_or_empty() -> None:
    text = "E=\nA=${UNSET:-d1}\nB=${E:-d2}\nC=${E-d3}\nD=${UNSET-d4}\n"
    assert resolve(text) == {"E": "", "A": "d1", "B": "d2", "C": "", "D": "d4"}


def test_defaults_may_nest() -> None:
    assert resolve("A=x\nB=${NOPE:-${A}/y}\n") == {"A": "x", "B": "x/y"}


def test_a_dollar_not_starting_a_name_is_literal_and_single_quotes_keep_everything() -> None:
    assert resolve("A=cost$5\nB=$\nC='$HOME `x` $(y)'\nD=\\$HOME\nE=$ē\n") == {
        "A": "cost$5",
        "B": "$",
        "C": "$HOME `x` $(y)",
        "D": "$HOME",
        "E": "$ē",
    }


def test_a_byte_order_mark_is_ignored() -> None:
    assert resolve("\ufeffA=1\n") == {"A": "1"}


def test_entries_know_the_lines_they_span() -> None:
    entry = parse_env('A="one\ntwo\nthree"\n', "t.env")[0]
    assert (entry.line, entry.end_line) == (1, 3)


def test_undefined_variable_names_the_file_line_and_variable() -> None:
    with pytest.raises(ConfigError) as info:
        resolve("A=1\nB=${MISSING}/x\n")
    issue = info.value.issues[0]
    assert (issue.path, issue.line, issue.key, issue.code) == ("t.env", 2, "B", "schema.undefined_variable")
    assert "MISSING" in issue.message


@pytest.mark.parametrize(
    ("text", "line", "needle"),
    [
        ("A=1\nnot a line\n", 2, "expected KEY=VALUE"),
        ("A=1\nB\n", 2, "B has no '=' after it"),
        ('A="open\n\n', 1, "never closed"),
        ("A='open\n", 1, "never closed"),
        ('A="x" trailing\n', 1, "after the closing quote"),
        ("A=a'b\n", 1, "quote inside an unquoted value"),
        ("A=${\n", 1, "variable name"),
        ("A=${B\n", 1, "unsupported expansion"),
        ("A=${B:-x\n", 1, "never closed"),
        ("A=$(rm -rf /)\n", 1, "shell syntax"),
        ("A=1\nB=`rm -rf /`\n", 2, "backquote"),
        ('A="x $HOME"\n', 1, "$HOME is shell syntax"),
        ("A=$MODEL_ROOT/qwen\n", 1, "write ${NAME}"),
        ("A=" + "${X:-" * 40 + "\n", 1, "nested more than"),
        ("1A=x\n", 1, "expected KEY=VALUE"),
    ],
)
def test_syntax_errors_name_the_line(text: str, line: int, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve(text)
    assert info.value.line == line
    assert needle in str(info.value)
    assert info.value.issues[0].code == "schema.syntax"


def test_windows_line_endings_parse() -> None:
    assert resolve("A=1\r\nB='x'\r\n") == {"A": "1", "B": "x"}


_pieces = st.sampled_from(list("AB_=${}:-'\"#\\ \t\nx1.ē$`()") + ["export ", "${A}", "\r\n", "A=", "${A:-"])


@settings(max_examples=600, deadline=None)
@given(st.lists(_pieces, max_size=40).map("".join))
def test_any_input_parses_or_raises_config_error_with_a_line(text: str) -> None:
    try:
        resolve(text)
    except ConfigError as e:
        assert e.line is not None and e.line >= 1
        assert e.path == "t.env"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=120))
def test_arbitrary_unicode_parses_or_raises_config_error(text: str) -> None:
    try:
        resolve(text)
    except ConfigError as e:
        assert e.line is not None


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.from_regex(r"[A-Z_][A-Z0-9_]{0,10}", fullmatch=True),
        st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=30),
        max_size=8,
    )
)
def test_single_quoted_values_round_trip(values: dict[str, str]) -> None:
    text = "".join(f"{k}='{v}'\n" for k, v in values.items() if "'" not in v)
    expected = {k: v for k, v in values.items() if "'" not in v}
    assert resolve(text) == expected
