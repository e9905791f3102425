"""Which sandbox ids name one key of the sandbox ledger (services/sandbox/ledger.py: check_sandbox_id): the desk
reads and purges ``sb.<id>`` directly, so an id that is a wildcard would name other runs' entries."""

from __future__ import annotations

import pytest

from services.sandbox.ledger import check_sandbox_id


@pytest.mark.parametrize("good", ["sb-nlp-1", "examples-tasks-say-yes-0a1b2c3d", "warm-abcde", "pod.ns", "a=b/c_d"])
def test_an_id_of_one_key_is_taken(good: str) -> None:
    assert check_sandbox_id(good) == good


@pytest.mark.parametrize("bad", ["*", ">", "a.*", "a.>", "", ".a", "a.", "a..b", "a b", "a\nb", "ü"])
def test_a_wildcard_an_empty_part_or_another_character_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="not one ledger key"):
        check_sandbox_id(bad)
