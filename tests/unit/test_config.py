from __future__ import annotations

from pathlib import Path

import pytest

from runctl.config import EvalConfig, InferConfig, TrainConfig, load_config, resolve_text
from runctl.config.fielddocs import field_doc
from runctl.config.loader import LAYERS, validate_settings
from runctl.config.models import MODELS, RUN_TYPES, all_keys, keys_for
from runctl.errors import ConfigError

TRAIN = "RUN_TYPE=train\nPROJECT_NAME=p\nEXP_NAME=e1\nMODEL_PATH=/m\nTRAIN_FILES=/d/train.parquet\n"
EVAL = "RUN_TYPE=eval\nPROJECT_NAME=p\nEXP_NAME=e1\nMODEL_PATH=/m\nDATASET_PATH=/d/held.parquet\n"
INFER = "RUN_TYPE=infer\nPROJECT_NAME=p\nEXP_NAME=e1\nMODEL_PATH=/m\nINDEX_FILE=/d/index.parquet\n"


def issues(text: str, **kwargs: object) -> list[tuple[int | None, str | None, str]]:
    with pytest.raises(ConfigError) as info:
        resolve_text(text, "run.env", environ={}, **kwargs)  # type: ignore[arg-type]
    return [(i.line, i.key, i.code) for i in info.value.issues]


def test_each_run_type_resolves_to_its_model_with_defaults() -> None:
    train = resolve_text(TRAIN, "run.env", environ={})
    assert isinstance(train.model, TrainConfig)
    assert (train.model.train_bsz, train.model.n_resp, train.model.kl_loss_coef) == (64, 8, 0.001)
    assert isinstance(resolve_text(EVAL, "run.env", environ={}).model, EvalConfig)
    infer = resolve_text(INFER, "run.env", environ={})
    assert isinstance(infer.model, InferConfig)
    assert infer.model.n_trials == 4


def test_layers_apply_in_order_and_record_who_set_each_key() -> None:
    assert LAYERS == ("default", "site", "run", "env")
    site = "MODEL_ROOT=/shared/models\nGEN_TP=2\nNGPUS_PER_NODE=4\n"
    run = TRAIN.replace("MODEL_PATH=/m", "MODEL_PATH=${MODEL_ROOT}/qwen") + "GEN_TP=8\n"
    resolved = resolve_text(run, "run.env", site_text=site, site_path="site.env", environ={"DRY_RUN": "1"})
    s = resolved.settings
    assert (s["GEN_TP"].value, s["GEN_TP"].layer, s["GEN_TP"].source) == ("8", "run", "run.env:6")
    assert (s["NGPUS_PER_NODE"].value, s["NGPUS_PER_NODE"].layer, s["NGPUS_PER_NODE"].source) == (
        "4",
        "site",
        "site.env:3",
    )
    assert (s["TRAIN_BSZ"].layer, s["TRAIN_BSZ"].value) == ("default", "64")
    assert (s["DRY_RUN"].layer, resolved.model.dry_run) == ("env", True)
    assert resolved.model.model_path == "/shared/models/qwen"
    assert resolved.model.gen_tp == 8


def test_only_documented_keys_come_from_the_environment() -> None:
    resolved = resolve_text(TRAIN, "run.env", environ={"GEN_TP": "2", "PREFLIGHT_ONLY": "1"})
    assert resolved.model.gen_tp == 4
    assert resolved.model.preflight_only is True


def test_interpolation_can_use_defaults_and_the_process_environment() -> None:
    text = TRAIN + "OUTPUT_DIR=${HOME}/runs/${SERVED_MODEL_NAME}\n"
    resolved = resolve_text(text, "run.env", environ={"HOME": "/home/u"})
    assert resolved.model.output_dir == "/home/u/runs/vllm_model"


def test_unknown_key_suggests_the_nearest_known_one() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_text(TRAIN + "TRAIN_BZS=32\n", "run.env", environ={})
    issue = info.value.issues[0]
    assert (issue.line, issue.key, issue.code) == (6, "TRAIN_BZS", "schema.unknown_key")
    assert "did you mean TRAIN_BSZ" in issue.fix


def test_key_of_another_run_type_is_an_error_in_the_run_config_but_ignored_in_site() -> None:
    assert issues(EVAL + "TRAIN_BSZ=32\n") == [(6, "TRAIN_BSZ", "schema.key_not_for_run_type")]
    resolved = resolve_text(EVAL, "run.env", site_text="TRAIN_BSZ=32\n", environ={})
    assert "TRAIN_BSZ" not in resolved.settings


def test_placeholder_left_in_is_an_error_naming_the_line() -> None:
    assert issues(TRAIN.replace("MODEL_PATH=/m", "MODEL_PATH=CHANGEME")) == [(4, "MODEL_PATH", "schema.placeholder")]


def test_placeholder_in_site_env_is_an_error_too() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_text(TRAIN, "run.env", site_text="\nMODEL_ROOT=CHANGEME\n", site_path="site.env", environ={})
    issue = info.value.issues[0]
    assert (issue.path, issue.line, issue.code) == ("site.env", 2, "schema.placeholder")


def test_bad_value_says_what_is_allowed() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_text(TRAIN + "BACKEND=dockr\n", "run.env", environ={})
    issue = info.value.issues[0]
    assert (issue.line, issue.key) == (6, "BACKEND")
    assert "'local', 'docker' or 'k8s'" in issue.fix


def test_bad_number_names_the_key_and_line() -> None:
    assert issues(TRAIN + "NNODES=two\n") == [(6, "NNODES", "schema.value")]
    assert issues(TRAIN + "NNODES=0\n") == [(6, "NNODES", "schema.value")]


def test_missing_required_keys_are_all_reported() -> None:
    found = issues("RUN_TYPE=train\nEXP_NAME=e\n")
    assert {(key, code) for _, key, code in found} == {
        ("PROJECT_NAME", "schema.required"),
        ("MODEL_PATH", "schema.required"),
        ("TRAIN_FILES", "schema.required"),
    }


def test_every_problem_is_reported_at_once() -> None:
    found = issues(TRAIN + "GEN_TPP=2\nSCAFFOLD=x\nLR_SCHEDULER=cosin\n")
    assert [key for _, key, _ in found] == ["GEN_TPP", "SCAFFOLD", "LR_SCHEDULER"]


def test_run_type_missing_or_wrong_is_a_clear_error() -> None:
    assert issues("EXP_NAME=e\n") == [(None, "RUN_TYPE", "schema.required")]
    assert issues("RUN_TYPE=training\n") == [(1, "RUN_TYPE", "schema.value")]


def test_eval_needs_exactly_one_dataset_source() -> None:
    found = issues(EVAL + "DATASET_NAME=swe-bench\n")
    assert found[0][2] == "schema.cross_field"
    found = issues(EVAL.replace("DATASET_PATH=/d/held.parquet\n", ""))
    assert found[0][2] == "schema.cross_field"


def test_eval_on_checkpoint_needs_an_eval_dataset() -> None:
    assert issues(TRAIN + "EVAL_ON_CHECKPOINT=1\n")[0][2] == "schema.cross_field"
    resolved = resolve_text(TRAIN + "EVAL_ON_CHECKPOINT=1\nEVAL_DATASET=/d/held\n", "run.env", environ={})
    assert isinstance(resolved.model, TrainConfig) and resolved.model.eval_on_checkpoint


def test_pass_rate_band_must_not_be_empty() -> None:
    found = issues(INFER + "FILTER_MIN_PASS_RATE=0.8\nFILTER_MAX_PASS_RATE=0.2\n")
    assert found[0][2] == "schema.cross_field"


def test_booleans_accept_the_usual_spellings_and_null_means_unset() -> None:
    text = TRAIN + "VAL_BEFORE_TRAIN=False\nUSE_DYNAMIC_BSZ=True\nROLLOUT_IS=null\nVAL_FILES=\n"
    model = resolve_text(text, "run.env", environ={}).model
    assert isinstance(model, TrainConfig)
    assert (model.val_before_train, model.use_dynamic_bsz, model.rollout_is, model.val_files) == (
        False,
        True,
        None,
        None,
    )


def test_secrets_are_redacted_in_everything_that_leaves_the_process() -> None:
    resolved = resolve_text(TRAIN + "LOGGER=wandb\nWANDB_API_KEY=sk-secret-123\n", "run.env", environ={})
    assert "sk-secret-123" not in resolved.redacted_text()
    assert "sk-secret-123" not in str(resolved.redacted_settings())
    assert "sk-secret-123" not in resolved.to_env()
    assert resolved.model.wandb_api_key == "sk-secret-123"


def test_load_config_reads_files_and_the_site_env_from_runctl_home(tmp_path: Path) -> None:
    (tmp_path / "site.env").write_text("NGPUS_PER_NODE=2\n")
    config = tmp_path / "run.env"
    config.write_text(TRAIN)
    resolved = load_config(config, environ={"RUNCTL_HOME": str(tmp_path)})
    assert resolved.settings["NGPUS_PER_NODE"].layer == "site"
    assert resolved.site_path == str(tmp_path / "site.env")


def test_missing_config_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.env", environ={})
    assert info.value.issues[0].code == "schema.file"


def test_validate_settings_checks_resolved_values_as_the_validator_service_does() -> None:
    model = validate_settings(
        "train",
        {
            "RUN_TYPE": "train",
            "PROJECT_NAME": "p",
            "EXP_NAME": "e",
            "MODEL_PATH": "/m",
            "TRAIN_FILES": "/t",
            "GEN_TP": "2",
        },
        source="r1",
    )
    assert isinstance(model, TrainConfig) and model.gen_tp == 2
    with pytest.raises(ConfigError) as info:
        validate_settings("train", {"RUN_TYPE": "train", "EXP_NAME": "CHANGEME", "BOGUS": "1"}, source="r1")
    codes = {i.code for i in info.value.issues}
    assert {"schema.placeholder", "schema.unknown_key", "schema.required"} <= codes


def test_every_field_has_a_docstring() -> None:
    for run_type in RUN_TYPES:
        for key in keys_for(run_type):
            assert field_doc(MODELS[run_type], key.lower()), f"{key} has no docstring"


def test_key_names_from_the_source_system_are_known() -> None:
    known = all_keys()
    for key in (
        "TRAINING_MODE",
        "MODEL_ENGINE",
        "SCAFFOLD",
        "BACKEND",
        "TOOL_CALL_PARSER",
        "SERVED_MODEL_NAME",
        "NNODES",
        "N_NODES_TRAIN",
        "N_NODES_ROLLOUT",
        "NGPUS_PER_NODE",
        "GEN_TP",
        "SP_SIZE",
        "EP_SIZE",
        "TRAIN_BSZ",
        "TRAIN_MINI_BSZ",
        "N_RESP",
        "USE_DYNAMIC_BSZ",
        "MAX_PROMPT",
        "MAX_RESP",
        "ADV_ESTIMATOR",
        "POLICY_LOSS_MODE",
        "KL_LOSS_COEF",
        "ACTOR_LR",
        "LR_SCHEDULER",
        "ROLLOUT_IS",
        "ENTROPY_COEFF",
        "GPU_MEM_UTIL",
        "TEMPERATURE",
        "VAL_TEMPERATURE",
        "AGENT_NUM_WORKERS",
        "SAVE_FREQ",
        "TEST_FREQ",
        "VAL_BEFORE_TRAIN",
        "TOTAL_EPOCHS",
        "PARTIAL_ROLLOUT",
        "STALENESS",
        "REQUIRE_BATCHES",
        "TRIGGER_PARAMETER_SYNC_STEP",
        "TOTAL_ROLLOUT_STEPS",
        "DATASET_PATH",
        "DATASET_NAME",
        "N_TASKS",
        "EVAL_TEMPERATURE",
        "MAX_INPUT_TOKENS",
        "MAX_OUTPUT_TOKENS",
        "N_CONCURRENT",
        "MAX_RETRIES",
        "INDEX_FILE",
        "RESULTS_DIR",
        "OUTPUT_INDEX",
        "INSTANCES_FILE",
        "N_TRIALS",
        "TRIAL_HARD_TIMEOUT_SEC",
        "VLLM_READY_TIMEOUT",
        "GEN_DP",
        "VENV_PATH",
        "WANDB_API_KEY",
        "WANDB_MODE",
        "TEAM",
        "PRIORITY",
        "ENGINE",
        "EVAL_ON_CHECKPOINT",
        "EVAL_DATASET",
        "PROJECT_NAME",
        "EXP_NAME",
        "MODEL_PATH",
        "TRAIN_FILES",
        "VAL_FILES",
        "PREFLIGHT_ONLY",
        "DRY_RUN",
    ):
        assert key in known, key


def test_engine_fake_is_never_the_default() -> None:
    for text in (TRAIN, EVAL, INFER):
        assert resolve_text(text, "run.env", environ={}).model.engine == "local"


def test_an_empty_value_means_the_default_and_an_empty_required_key_is_an_error() -> None:
    model = resolve_text(TRAIN + "TOOL_CALL_PARSER=\nLOGGER=\nGEN_TP=\n", "run.env", environ={}).model
    assert (model.tool_call_parser, model.logger, model.gen_tp) == ("hermes", "console", 4)
    found = issues(TRAIN.replace("MODEL_PATH=/m", "MODEL_PATH="))
    assert found == [(4, "MODEL_PATH", "schema.value")]


def test_run_type_may_interpolate_and_an_extra_key_is_named_as_unknown_not_as_undefined() -> None:
    from_env = resolve_text(EVAL.replace("RUN_TYPE=eval", "RUN_TYPE=${KIND}"), "r.env", environ={"KIND": "eval"})
    assert from_env.run_type == "eval"
    found = issues("KIND=eval\n" + EVAL.replace("RUN_TYPE=eval", "RUN_TYPE=${KIND}"))
    assert found == [(1, "KIND", "schema.unknown_key")]


def test_every_assignment_of_a_secret_is_redacted_across_all_its_lines() -> None:
    text = TRAIN + 'WANDB_API_KEY=first-secret\nLOGGER=wandb\nWANDB_API_KEY="multi\nline-secret"\nGEN_TP=2\n'
    resolved = resolve_text(text, "run.env", environ={})
    redacted = resolved.redacted_text()
    assert "first-secret" not in redacted and "line-secret" not in redacted
    assert redacted.count("WANDB_API_KEY=***") == 2
    assert len(redacted.splitlines()) == len(text.splitlines())
    assert redacted.splitlines()[-1] == "GEN_TP=2"


def test_a_file_with_a_byte_order_mark_loads(tmp_path: Path) -> None:
    config = tmp_path / "bom.env"
    config.write_text("\ufeff" + TRAIN, encoding="utf-8")
    assert load_config(config, environ={}).run_type == "train"
