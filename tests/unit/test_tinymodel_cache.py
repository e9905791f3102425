"""The tiny model's copy in the user's cache (runctl/tinymodel.py): taken when it is whole, kept whole or not at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runctl import tinymodel


def fake_model(folder: Path, shape: str = "tiny") -> Path:
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / tinymodel.STAMP).write_text(json.dumps({"version": tinymodel.VERSION, "shape": shape}))
    return folder


def test_a_model_in_the_cache_is_copied_not_made_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(tinymodel.CACHE_ENV, str(tmp_path / "cache"))
    cached = tinymodel.cached_copy("tiny")
    assert cached is not None and cached.parent == tmp_path / "cache"
    fake_model(cached)
    made = tinymodel.make(tmp_path / "checkout" / "tinymodel")
    assert (made / "model.safetensors").read_bytes() == b"weights" and tinymodel.is_made(made)


def test_a_copy_cut_short_in_the_cache_is_not_a_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(tinymodel.CACHE_ENV, str(tmp_path / "cache"))
    cached = tinymodel.cached_copy("tiny")
    assert cached is not None
    cached.mkdir(parents=True)
    (cached / "model.safetensors").write_bytes(b"half")  # no stamp: a copy that was cut short
    assert not tinymodel.is_made(cached)


def test_keeping_puts_the_whole_model_in_the_cache_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(tinymodel.CACHE_ENV, str(tmp_path / "cache"))
    made = fake_model(tmp_path / "made")
    cached = tinymodel.cached_copy("tiny")
    assert cached is not None
    tinymodel._keep(made, cached)
    assert tinymodel.is_made(cached) and sorted(p.name for p in cached.iterdir()) == sorted(
        p.name for p in made.iterdir()
    )
    tinymodel._keep(fake_model(tmp_path / "other"), cached)  # already there: left as it was, no partial left behind
    assert [p.name for p in cached.parent.iterdir()] == [cached.name]


def test_the_key_changes_with_the_shape_and_the_cache_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(tinymodel.CACHE_ENV, "/somewhere")
    assert tinymodel.cached_copy("tiny") != tinymodel.cached_copy("bench")
    monkeypatch.setenv(tinymodel.CACHE_ENV, "off")
    assert tinymodel.cached_copy("tiny") is None
