"""Property tests: whatever values a config holds, validation answers with results or a ConfigError, never a crash."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runctl.config import resolve_text
from runctl.config.models import keys_for
from runctl.errors import ConfigError
from services.validator.library import check_config
from tests.conftest import ROOT

DATA = ROOT / "tests" / "data"
BASE = (DATA / "configs" / "good" / "train-dense.env").read_text()
KEYS = [k for k in keys_for("train") if k not in ("RUN_TYPE",)]

values = st.one_of(
    st.integers(min_value=-3, max_value=300).map(str),
    st.sampled_from(["0", "1", "true", "false", "", "null", "sync", "async", "veomni", "fsdp", "cosine", "sequence"]),
    st.sampled_from(["8", "16", "48", "65536", "1e-6", "0.95", "1.5", "/nonexistent", str(DATA / "tasks")]),
    st.text(alphabet="abcxyz019_-./", max_size=12),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(KEYS), values, max_size=6))
def test_any_values_give_check_results_or_a_config_error(overrides: dict[str, str]) -> None:
    text = BASE + "".join(f"{key}='{value}'\n" for key, value in overrides.items())
    try:
        resolved = resolve_text(text, "prop.env", environ={"RUNCTL_TEST_DATA": str(DATA)})
    except ConfigError as e:
        assert e.issues
        return
    results = check_config(resolved.model)
    assert results
    for result in results:
        assert result.message
        if result.severity in ("warn", "fatal"):
            assert result.fix
