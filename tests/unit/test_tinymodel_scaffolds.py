"""The tiny model's scaffolds shape (runctl/tinymodel.py): mini-swe-agent's episodes built from a bundle's frames, in
the format the agent reads its actions from. The frames here are stand-ins with the real marks and expression; the
real ones, and a trial that passes with the model taught under them: tests/integration/test_scaffolds.py."""

from __future__ import annotations

import random
import re

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
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    shape = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, pad_token_id=0, **shape)).eval()
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
