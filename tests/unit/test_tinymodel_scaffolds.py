"""The tiny model's scaffolds shape (runctl/tinymodel.py): mini-swe-agent's episodes built from a bundle's frames, in
the format the agent reads its actions from, and OpenCode's, as calls of its bash tool after openings drawn anew. The
frames here are stand-ins with the real marks and expression; the real ones, and trials that pass with the model
taught under them: tests/integration/test_scaffolds.py."""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest

from runctl import bundles, tinymodel

FRAMES = {
    "system": "You act in a shell.",
    "instance": f"Task: {bundles.TASK_MARK}\nAnswer with one command.",
    "observation": f"<returncode>0</returncode>\n<output>\n{bundles.OUTPUT_MARK}</output>",
    "action_regex": r"```mswea_bash_command\s*\n(.*?)\n```",
}


def test_an_episode_runs_a_taught_command_then_submits_each_in_the_agents_own_format() -> None:
    rng = random.Random(7)
    seen = set()
    for _ in range(40):
        messages, tools = tinymodel.mswea_episode(FRAMES, rng)
        assert tools is None and [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
        skill = messages[1]["content"].removeprefix("Task: ").split("\n")[0]
        (command,) = re.findall(FRAMES["action_regex"], messages[2]["content"], re.DOTALL)
        assert command in tinymodel.SKILLS[skill]
        assert messages[3]["content"].startswith("<returncode>0</returncode>")
        assert bundles.OUTPUT_MARK not in str(messages)
        assert re.findall(FRAMES["action_regex"], messages[4]["content"], re.DOTALL) == [tinymodel.MSWEA_SUBMIT]
        seen.add(skill)
    assert seen == set(tinymodel.SKILLS)


def test_an_answer_the_agent_would_not_parse_is_refused() -> None:
    with pytest.raises(ValueError, match="names no fence"):
        tinymodel.mswea_answer({**FRAMES, "action_regex": r"<cmd>(.*?)</cmd>"}, "THOUGHT: x", "ls")
    with pytest.raises(ValueError, match="would not read"):
        tinymodel.mswea_answer({**FRAMES, "action_regex": r"```bash\n(.*?)\n```\nDONE"}, "THOUGHT: x", "ls")


def test_the_loss_on_the_answers_alone_is_the_models_own_loss() -> None:
    # The scaffolds shape learns through tinymodel._loss's shortcut (output head on labelled positions, no mask):
    # it must be the loss transformers computes, padding included.
    torch = pytest.importorskip("torch")
    model = _small_model()
    input_ids = torch.randint(1, 50, (3, 24))
    input_ids[1, 18:] = 0
    input_ids[2, 9:] = 0
    labels = input_ids.clone()
    labels[:, :12] = -100
    labels[input_ids == 0] = -100
    labels[2, 5:9] = input_ids[2, 5:9]
    mask = (input_ids != 0).long()
    with torch.no_grad():
        full = tinymodel._loss(model, input_ids, mask, labels, answers_only=False)
        shortcut = tinymodel._loss(model, input_ids, mask, labels, answers_only=True)
    assert torch.allclose(full, shortcut, atol=1e-6) and float(full) > 0, (full, shortcut)


def test_an_opencode_episode_calls_bash_with_a_taught_command_then_answers_without_a_call() -> None:
    system = {"role": "system", "content": "You are a coding agent."}
    tools = [tinymodel.BASH_TOOL]
    rng = random.Random(3)
    seen = set()
    for _ in range(40):
        messages, sent = tinymodel.oc_episode(system, tools, rng)
        assert sent is tools and messages[0] is system
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
        skill = messages[1]["content"]
        assert skill.endswith("\n")  # the instruction file as OpenCode reads it from its standard input
        (call,) = messages[2]["tool_calls"]
        assert call["function"]["name"] == "bash" and messages[3]["tool_call_id"] == call["id"]
        assert json.loads(call["function"]["arguments"])["command"] in tinymodel.SKILLS[skill.strip()]
        assert messages[3]["content"] and "tool_calls" not in messages[4] and messages[4]["content"]
        seen.add(skill.strip())
    assert seen == set(tinymodel.SKILLS)


def test_the_loss_after_a_kept_opening_is_the_whole_sequences_loss() -> None:
    # OpenCode's episodes are learned after its 18,700-token opening, whose keys and values are computed once
    # (tinymodel._prefixed_loss): on the same labels, the loss must be the whole sequences' own, padding included.
    torch = pytest.importorskip("torch")
    model = _small_model()
    opening = torch.randint(1, 50, (1, 40))
    rest = torch.randint(1, 50, (3, 16))
    rest[1, 12:] = 0
    labels = rest.clone()
    labels[:, :4] = -100
    labels[rest == 0] = -100
    whole_ids = torch.cat([opening.expand(3, -1), rest], dim=1)
    whole_labels = torch.cat([torch.full((3, 40), -100), labels], dim=1)
    with torch.no_grad():
        whole = tinymodel._loss(model, whole_ids, (whole_ids != 0).long(), whole_labels, answers_only=False)
        kept = tinymodel._prefixed_loss(model, tinymodel._opening(model, opening), rest, labels)
    assert torch.allclose(whole, kept, atol=1e-5) and float(whole) > 0, (whole, kept)
    # Learning goes through the rest alone: the opening's keys and values carry no gradient.
    assert not any(k.requires_grad or v.requires_grad for k, v in tinymodel._opening(model, opening))


def test_opencodes_opening_is_drawn_anew_in_what_it_says_of_the_trial_and_nothing_else() -> None:
    recorded = (
        "You are opencode.\nYou are powered by the model named model. The exact model ID is build/model\n<env>\n"
        "  Working directory: /root/.build-home\n  Is directory a git repo: no\n  Platform: linux\n"
        "  Today's date: Sun Dec 06 2026\n</env>\nSkills follow."
    )
    system = {"role": "system", "content": recorded}
    tools = [tinymodel.BASH_TOOL]
    rng = random.Random(5)
    drawn = [tinymodel.oc_opening(system, tools, rng) for _ in range(30)]
    assert all(sent is tools for _, sent in drawn) and system["content"] == recorded  # the recorded one untouched
    contents = [opening["content"] for opening, _ in drawn]
    dates = {re.search(r"Today's date: (.+)", c).group(1) for c in contents}  # type: ignore[union-attr]
    folders = {re.search(r"Working directory: (\S+)", c).group(1) for c in contents}  # type: ignore[union-attr]
    names = {re.search(r"model ID is (\S+)", c).group(1) for c in contents}  # type: ignore[union-attr]
    assert len(dates) > 20 and len(folders) > 3 and len(names) > 10
    assert "Sun Dec 06 2026" not in dates and "/root/.build-home" not in folders and "build/model" not in names
    for content in contents:
        assert content.startswith("You are opencode.\nYou are powered by the model named ")
        assert "  Platform: linux\n" in content and content.endswith("</env>\nSkills follow.")
        assert re.search(r"Today's date: \w{3} \w{3} \d\d 20[23]\d\n", content)


def _small_model() -> Any:
    """A random Llama of two small layers (its padding token 0), seeded."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    shape = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    return LlamaForCausalLM(LlamaConfig(vocab_size=50, pad_token_id=0, **shape)).eval()
