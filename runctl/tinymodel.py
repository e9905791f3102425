"""Make the tiny chat model that the CPU paths, the tests and the benchmarks serve with vLLM.

Nothing comes from a model hub: a Llama-shaped network with random weights (hidden 128, 2 layers, 4 heads, under
a million parameters, its output head untied from the embedding) and a byte-level BPE tokenizer trained here on
generated text, saved with a ChatML chat template that renders tools, tool calls and tool results the way
Hermes-style tool parsers read them. Both are seeded, so the same version of this module makes the same files.

The ``scaffolds`` shape is that model taught further, with a longer context (32,768 positions), to act under
mini-swe-agent — its own system message, its task message and its observations, read from the mswea bundle's frames
(``runctl agents build mswea``), the example commands written as its one-command answers, then its submit command —
and under OpenCode, a scaffold that sends tools: its system prompt and its ten tools as the oc bundle recorded
them (``runctl agents build oc``), the example commands as calls of its ``bash`` tool, then an answer without a call.
Its tokenizer is the tiny model's, so the same tool parser and chat template serve it.

``python -m runctl.tinymodel DIR`` writes the model into DIR (``config.json``, ``model.safetensors``, the tokenizer
files); it is a no-op when DIR already holds a model made by this version. Teaching it takes minutes on two cores,
so a model made once is kept in the user's cache (``$RUNCTL_MODEL_CACHE``, else ``$XDG_CACHE_HOME/runctl/tinymodel``
or ``~/.cache/runctl/tinymodel``; ``RUNCTL_MODEL_CACHE=off`` keeps none), under a key of this module's source and
the torch, transformers and tokenizers versions, and the next checkout copies it from there: as pip's cache serves a
second install.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

VERSION = 6
STAMP = "runctl-tinymodel.json"
VOCAB_SIZE = 2048
SEED = 20261130
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]

# ChatML with Hermes-style tools: the tool list in the system turn, calls as <tool_call>{json}</tool_call> in the
# assistant turn, results as <tool_response> blocks in a user turn.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(system='') -%}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set ns.system = messages[0]['content'] if messages[0]['content'] is string else "
    "messages[0]['content'] | map(attribute='text') | join('') -%}"
    "{%- set messages = messages[1:] -%}"
    "{%- endif -%}"
    "{%- if tools -%}"
    "{{ '<|im_start|>system\\n' }}{% if ns.system %}{{ ns.system + '\\n\\n' }}{% endif %}"
    "{{ '# Tools\\n\\nFunction signatures are inside <tools></tools>:\\n<tools>' }}"
    "{%- for tool in tools %}{{ '\\n' + ((tool['function'] if tool['function'] is defined else tool) | tojson) }}"
    "{%- endfor %}"
    "{{ '\\n</tools>\\n\\nCall a function with <tool_call>' }}"
    '{{ \'{"name": ..., "arguments": ...}</tool_call>.<|im_end|>\\n\' }}'
    "{%- elif ns.system -%}"
    "{{ '<|im_start|>system\\n' + ns.system + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{ '<|im_start|>user' }}{% endif -%}"
    "{{ '\\n<tool_response>\\n' }}"
    "{{ message['content'] if message['content'] is string else "
    "message['content'] | map(attribute='text') | join('') }}"
    "{{ '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{ '<|im_end|>\\n' }}{% endif -%}"
    "{%- else -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{ message['content'] }}"
    "{%- elif message['content'] %}{{ message['content'] | selectattr('type', 'equalto', 'text') "
    "| map(attribute='text') | join('') }}{% endif -%}"
    "{%- for call in (message['tool_calls'] or []) if message['tool_calls'] is defined -%}"
    "{%- set fn = call['function'] if call['function'] is defined else call -%}"
    "{%- if not loop.first or message['content'] %}{{ '\\n' }}{% endif -%}"
    "{{ '<tool_call>\\n{\"name\": ' + (fn['name'] | tojson) + ', \"arguments\": ' }}"
    "{{ fn['arguments'] if fn['arguments'] is string else fn['arguments'] | tojson }}"
    "{{ '}\\n</tool_call>' }}"
    "{%- endfor -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif -%}"
)

_WORDS = (
    "the a an of to in and or is are was be run task file test pass fail agent model reward step train eval "
    "python bash ls cat grep echo make build code line error fix check value result output input list read write "
    "open close start stop time json key name type path folder docker image sandbox token call tool function "
    "hello world yes no ok done true false null one two three four five six seven eight nine ten"
).split()


def _corpus(lines: int, rng: random.Random) -> list[str]:
    """Generated text: sentences, shell lines, JSON objects and chat-shaped turns."""
    out: list[str] = []
    for i in range(lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 14))]
        kind = i % 4
        if kind == 0:
            out.append(" ".join(words).capitalize() + rng.choice([".", "?", "!"]))
        elif kind == 1:
            out.append("$ " + " ".join(words[:3]) + f" --{words[-1]}={rng.randint(0, 999)}")
        elif kind == 2:
            obj = {words[0]: words[1:3], "n": rng.randint(0, 99), "ok": rng.random() < 0.5}
            out.append(json.dumps({"name": words[-1], "arguments": obj}))
        else:
            out.append(f"<|im_start|>user\n{' '.join(words)}<|im_end|>\n<|im_start|>assistant\n")
    return out


BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command and return its output.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}
#: The system turn runctl's terminal agent sends (services/launcher/rollout/agents/terminal.py). The model is taught
#: the example tasks under it too, so that it meets them in the context it will see.
TERMINAL_SYSTEM_PROMPT = (
    "You are an agent working in a Linux terminal. Run shell commands with the bash tool, one at a time, and read "
    "their output. When the task is done, answer briefly without calling a tool."
)
COMMANDS = ("ls", "pwd", "cat instruction.md", "echo done", "ls -la /app", "cat /app/README.md")
#: Instructions the model is taught a first command for, and the commands it learns to pick among (uniformly at
#: temperature 1). The example tasks (``examples/tasks``) use these instructions, so their pass rates with this model
#: are known by construction: one always solved, one about half the time, one never.
SKILLS: dict[str, tuple[str, ...]] = {
    "Write done into answer.txt.": ("echo done > answer.txt",),
    "Write yes or no into answer.txt.": ("echo yes > answer.txt", "echo no > answer.txt"),
    "Count the files in /app and write the number into count.txt.": ("ls", "ls -la /app"),
}
TEACH_STEPS = 700


def _other_tool(rng: random.Random) -> dict[str, Any]:
    name = "_".join(rng.sample(_WORDS[10:60], 2))
    arg = rng.choice(_WORDS[10:60])
    return {
        "type": "function",
        "function": {"name": name, "parameters": {"type": "object", "properties": {arg: {"type": "string"}}}},
    }


def _conversation(rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """One synthetic conversation in OpenAI message format, and its tools (None for a plain chat)."""

    def words(low: int, high: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(low, high)))

    messages: list[dict[str, Any]] = []
    skill = rng.choice(list(SKILLS)) if rng.random() < 0.5 else None
    if skill and rng.random() < 0.5:
        messages.append({"role": "system", "content": TERMINAL_SYSTEM_PROMPT})
    elif rng.random() < 0.5:
        messages.append({"role": "system", "content": words(3, 10).capitalize() + "."})
    messages.append({"role": "user", "content": skill or words(2, 16)})
    if skill is None and rng.random() < 0.35:
        messages.append({"role": "assistant", "content": words(1, 6).capitalize() + "."})
        return messages, None
    tools: list[dict[str, Any]] = [BASH_TOOL] + [_other_tool(rng) for _ in range(rng.randint(0, 1))]
    rng.shuffle(tools)
    for turn in range(1 if skill else rng.randint(1, 3)):
        command = rng.choice(SKILLS[skill] if skill else COMMANDS)
        call = {
            "id": f"call_{turn}",
            "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": command})},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        output = "" if skill and rng.random() < 0.5 else words(1, 12)
        messages.append({"role": "tool", "tool_call_id": f"call_{turn}", "content": output})
    # After a taught command the model always closes with "Done.", so the command is the only choice it makes on
    # those tasks: the reward then speaks of that choice alone, and RL has one clear thing to learn.
    closing = "Done." if skill else rng.choice(["Done.", "The task is done.", words(1, 5).capitalize() + "."])
    messages.append({"role": "assistant", "content": closing})
    return messages, tools


Conversation = tuple[list[dict[str, Any]], list[dict[str, Any]] | None]


def _teach(
    model: Any,
    tokenizer: Any,
    rng: random.Random,
    conversations: Any = None,
    steps: int = TEACH_STEPS,
    batch_size: int = 8,
    lr: float = 4e-3,
    answers_only: bool = False,
) -> float:
    """A few hundred steps that make the random network keep to the chat format: short text answers ending in
    ``<|im_end|>``, a ``bash`` tool call when tools are offered, text after a tool result. ``conversations(rng)``
    makes each example (:func:`_conversation` when not given), and only the assistant's tokens are learned.
    ``answers_only``: the output head runs on the answers' positions alone (the same loss; on long prompts with short
    answers, a quarter less work a step). Returns the last loss."""

    make_conversation = conversations or _conversation

    def example() -> tuple[list[int], list[int]]:
        return _tokens(tokenizer, *make_conversation(rng))

    update = _updater(model, lr, steps)
    model.train()
    loss_value = 0.0
    for _ in range(steps):
        loss_value = update(_loss(model, *_padded(tokenizer, [example() for _ in range(batch_size)]), answers_only))
    model.eval()
    return loss_value


def _updater(model: Any, lr: float, steps: int) -> Any:
    """AdamW over ``steps`` steps, its rate decaying linearly to a tenth (the last steps sharpen what was learned: the
    taught commands come out whole): a function that takes a step's loss, updates, and returns the loss's value."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.1, steps)

    def update(loss: Any) -> float:
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        return float(loss.detach())

    return update


def _padded(tokenizer: Any, batch: list[tuple[list[int], list[int]]]) -> tuple[Any, Any, Any]:
    """Examples (:func:`_tokens`) as one batch padded on the right: token ids, attention mask, labels."""
    import torch

    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.tensor([ids + [tokenizer.pad_token_id] * (width - len(ids)) for ids, _ in batch])
    mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in batch])
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in batch])
    return input_ids, mask, labels


def _tokens(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, start: int = 0
) -> tuple[list[int], list[int]]:
    """A conversation's tokens from character ``start`` of its rendering on, and their labels: the assistant's
    answers learned, the rest not (-100)."""
    ids: list[int] = []
    labels: list[int] = []
    done = start
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = tokenizer.apply_chat_template(messages[:i], tools=tools, add_generation_prompt=True, tokenize=False)
        after = tokenizer.apply_chat_template(messages[: i + 1], tools=tools, tokenize=False)
        context = tokenizer(before[done:], add_special_tokens=False)["input_ids"]
        answer = tokenizer(after[len(before) :].removesuffix("\n"), add_special_tokens=False)["input_ids"]
        ids += context + answer
        labels += [-100] * len(context) + answer
        done = len(after) - 1
    return ids, labels


def _loss(model: Any, input_ids: Any, mask: Any, labels: Any, answers_only: bool) -> Any:
    """The causal LM loss on the labelled tokens (padding on the right); ``answers_only`` runs the output head on
    the labelled positions alone, and no attention mask (causal attention never looks right, so a real token never
    sees the padding), which lets attention take its fused path."""
    import torch

    if not answers_only:
        return model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
    hidden = model.model(input_ids=input_ids).last_hidden_state[:, :-1]
    targets = labels[:, 1:]
    learned = targets != -100
    return torch.nn.functional.cross_entropy(model.lm_head(hidden[learned]), targets[learned])


#: mini-swe-agent's protocol (its environment ends the run when a command's first output line is this), and the
#: thoughts the scaffolds shape writes before its commands: fixed, so that the command is the only choice it makes,
#: and short (each token of an answer is one more that a sampled answer can break on).
MSWEA_SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
MSWEA_THOUGHTS = ("THOUGHT: Run it.", "THOUGHT: Done.")
#: Positions of the scaffolds shape: OpenCode's first request alone is 18,700 of the tiny tokenizer's tokens.
SCAFFOLD_CONTEXT = 32768
SCAFFOLD_STEPS = 240
#: OpenCode's episodes: 120 steps of eight, after 40 openings (three steps each), each step with two of mini-swe-agent's
#: beside.
OC_STEPS = 120
OC_BATCH = 8
OC_PER_OPENING = 3


def mswea_answer(frames: dict[str, str], thought: str, command: str) -> str:
    """An answer in mini-swe-agent's text format: a thought, then the one command in the fence its actions are read
    from (checked against ``frames["action_regex"]``, the expression the agent parses answers with)."""
    import re

    fence = re.match(r"```(\w+)", frames["action_regex"])
    if fence is None:
        raise ValueError(f"mini-swe-agent's action expression {frames['action_regex']!r} names no fence")
    answer = f"{thought}\n\n```{fence.group(1)}\n{command}\n```"
    if re.findall(frames["action_regex"], answer, re.DOTALL) != [command]:
        raise ValueError(f"mini-swe-agent would not read {command!r} out of {answer!r}")
    return answer


def _taught_example(rng: random.Random) -> tuple[str, str, str]:
    """An example task's instruction, one of its taught commands, and an output for it (empty half the time)."""
    skill = rng.choice(list(SKILLS))
    command = rng.choice(SKILLS[skill])
    output = "" if rng.random() < 0.5 else " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 8)))
    return skill, command, output


def mswea_episode(frames: dict[str, str], rng: random.Random) -> Conversation:
    """One example task solved under mini-swe-agent's frames: the taught command, its observation, the submit."""
    from runctl.bundles import OUTPUT_MARK, TASK_MARK

    skill, command, output = _taught_example(rng)
    messages = [
        {"role": "system", "content": frames["system"]},
        {"role": "user", "content": frames["instance"].replace(TASK_MARK, skill + "\n")},
        {"role": "assistant", "content": mswea_answer(frames, MSWEA_THOUGHTS[0], command)},
        {"role": "user", "content": frames["observation"].replace(OUTPUT_MARK, output)},
        {"role": "assistant", "content": mswea_answer(frames, MSWEA_THOUGHTS[1], MSWEA_SUBMIT)},
    ]
    return messages, None


def mswea_frames() -> tuple[dict[str, str], str]:
    """The mswea bundle's frames and the bundle's hash.

    Raises:
        runctl.bundles.BundleError: the bundle is not built (its message names the command that builds it).
    """
    from runctl import bundles

    bundle = bundles.load("mswea")
    return json.loads((bundle.path / bundles.FRAMES).read_text()), bundle.sha256


def _teach_scaffolds(model: Any, tokenizer: Any, frames: dict[str, str], rng: random.Random) -> float:
    """The tiny model taught further: mini-swe-agent's episodes alone, two a step (each about 2,000 tokens, nearly
    all of them the agent's prompt; 75 s on two idle cores). Two a step rather than four for twice the steps: the
    same tokens, a sharper model (a quarter of its first answers sampled at temperature 1 break the format or miss
    the task; four a step for half the steps, with longer thoughts, seven in eight did)."""
    return _teach(
        model, tokenizer, rng, lambda r: mswea_episode(frames, r), steps=SCAFFOLD_STEPS, batch_size=2, lr=3e-3,
        answers_only=True,
    )  # fmt: skip


def oc_request() -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    """The system message and tools of the first request the oc bundle's OpenCode sent when it was built, and the
    bundle's hash.

    Raises:
        runctl.bundles.BundleError: the bundle is not built (its message names the command that builds it).
    """
    from runctl import bundles

    bundle = bundles.load("oc")
    _, messages, tools = bundle.first_request()
    return messages[0], tools, bundle.sha256


def oc_opening(
    system: dict[str, Any], tools: list[dict[str, Any]], rng: random.Random
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """OpenCode's recorded system message with what it says of its trial drawn anew — the model's name and id, the
    working directory, whether it is a git repository, today's date — and its tools: what a trial's first request
    opens with varies in these, so the model is taught under many."""
    import re

    content = str(system["content"])
    name = "-".join(rng.sample(_WORDS[10:60], rng.randint(1, 2)))
    provider = rng.choice(("runctl", "openai", "local", "vllm"))
    content = re.sub(
        r"(You are powered by the model named )(\S+?)(\. The exact model ID is )(\S+)",
        lambda m: f"{m.group(1)}{name}{m.group(3)}{provider}/{name}", content,
    )  # fmt: skip
    folder = rng.choice(("/app", "/work", "/testbed", "/workspace", "/tmp/task", "/home/user/repo"))
    content = re.sub(r"(Working directory: )(\S+)", lambda m: m.group(1) + folder, content)
    content = re.sub(r"(Is directory a git repo: )(\S+)", lambda m: m.group(1) + rng.choice(("yes", "no")), content)
    day = 1 + rng.randrange(3650)
    date = time.strftime("%a %b %d %Y", time.gmtime((day + 20454) * 86400))  # a day in 2026-2035
    content = re.sub(r"(Today's date: )(.+)", lambda m: m.group(1) + date, content)
    return {**system, "content": content}, tools


def oc_episode(system: dict[str, Any], tools: list[dict[str, Any]], rng: random.Random) -> Conversation:
    """One example task solved under OpenCode: its system message and tools, the task's words as it sends them (the
    instruction file, read from its standard input), a ``bash`` call of the taught command, the command's output as
    the tool's result, then a short answer without a call, which ends OpenCode's run."""
    skill, command, output = _taught_example(rng)
    output = output or "(no output)"  # what OpenCode's bash tool answers for a command that printed nothing
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": command})},
    }
    messages = [
        system,
        {"role": "user", "content": skill + "\n"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": output},
        {"role": "assistant", "content": "Done."},
    ]
    return messages, tools


def _teach_prefixed(
    model: Any, tokenizer: Any, rng: random.Random, openings: Any, conversations: Any, steps: int, batch_size: int,
    lr: float, per_opening: int = 1, rehearse: Any = None,
) -> float:  # fmt: skip
    """:func:`_teach` for conversations that open with one long system turn (OpenCode's: 18,700 tokens of prompt and
    tools, then a few dozen of task and answers). Every ``per_opening`` steps it draws an opening (``openings(rng)``: a
    system message and tools), whose keys and values are computed without gradients (2.4 s on two cores); each step
    learns on ``batch_size`` conversations after it (``conversations(system, tools, rng)``: 0.85 s for eight) alone,
    attending to them: the answers are learned in the context they are given in, at a fraction of the work of whole
    sequences. Openings are drawn anew because a model taught after one fixed opening answers it alone: changing the
    date in it broke every answer. ``rehearse(rng)``: a conversation of an earlier teaching, two of which are learned
    whole beside each step's (taught under OpenCode alone, the model answered mini-swe-agent's tasks with OpenCode's
    closing words; with one a step, it answered say-yes with yes alone, eight times in eight).
    Returns the last loss."""
    import torch

    update = _updater(model, lr, steps)
    loss_value = 0.0
    for step in range(steps):
        if step % per_opening == 0:
            system, tools = openings(rng)
            opening = tokenizer.apply_chat_template([system], tools=tools, tokenize=False)
            kept = _opening(model, torch.tensor([tokenizer(opening, add_special_tokens=False)["input_ids"]]))
        model.train()
        batch = []
        for _ in range(batch_size):
            messages, sent = conversations(system, tools, rng)
            if messages[0] != system or sent != tools:
                raise ValueError("a conversation given to _teach_prefixed does not open with the step's opening")
            batch.append(_tokens(tokenizer, messages, tools, start=len(opening)))
        input_ids, _, labels = _padded(tokenizer, batch)
        loss = _prefixed_loss(model, kept, input_ids, labels)
        if rehearse is not None:  # the earlier teaching's examples beside: without them the model forgets it
            again = [_tokens(tokenizer, *rehearse(rng)) for _ in range(2)]
            loss = loss + _loss(model, *_padded(tokenizer, again), answers_only=True)
        loss_value = update(loss)
    model.eval()
    return loss_value


def _opening(model: Any, prefix: Any) -> list[tuple[Any, Any]]:
    """Each layer's keys and values for the token ids ``prefix`` (one row), computed without gradients."""
    import torch

    model.eval()
    with torch.no_grad():
        layers = model.model(input_ids=prefix, use_cache=True).past_key_values.layers
    return [(layer.keys, layer.values) for layer in layers]


def _prefixed_loss(model: Any, opening: list[tuple[Any, Any]], input_ids: Any, labels: Any) -> Any:
    """The causal LM loss of rows that continue ``opening`` (:func:`_opening`), padded on the right: the loss of the
    whole sequences on these labels, with no gradient through the opening."""
    import torch
    from transformers import DynamicCache

    size = input_ids.shape[0]
    cache = DynamicCache(
        ddp_cache_data=[(k.expand(size, -1, -1, -1), v.expand(size, -1, -1, -1)) for k, v in opening],
        config=model.config,
    )
    hidden = model.model(input_ids=input_ids, past_key_values=cache).last_hidden_state
    # A label predicts its token from the position before it; the opening's last position predicts the rows' first
    # token, which is never learned (a turn's opening words), so the rows' own positions are enough.
    targets = labels[:, 1:]
    learned = targets != -100
    return torch.nn.functional.cross_entropy(model.lm_head(hidden[:, :-1][learned]), targets[learned])


#: Network shapes: the taught chat model, and an untaught larger one whose forward pass dominates generation time
#: as a real policy's does (for measuring what serving overheads cost per generated token).
SHAPES = {
    "tiny": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4},
    "bench": {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 8, "num_attention_heads": 8},
}
SCAFFOLD_SHAPE = "scaffolds"  # the tiny model, taught further under mini-swe-agent (see the module's docstring)


def is_made(folder: Path, shape: str = "tiny") -> bool:
    """True when ``folder`` holds a model of ``shape`` made by this version of this module."""
    try:
        stamp = json.loads((folder / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return bool(stamp.get("version") == VERSION and stamp.get("shape", "tiny") == shape)


CACHE_ENV = "RUNCTL_MODEL_CACHE"


def cached_copy(shape: str, extra: str = "") -> Path | None:
    """Where the user's cache keeps the model of ``shape`` this code makes (``extra``: what else it was made from);
    None when the cache is off."""
    from importlib.metadata import PackageNotFoundError, version

    root = os.environ.get(CACHE_ENV, "")
    if root == "off":
        return None
    if not root:
        root = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "runctl" / "tinymodel")
    key = hashlib.sha256(Path(__file__).read_bytes() + extra.encode())
    for package in ("torch", "transformers", "tokenizers"):
        try:
            key.update(f"{package}={version(package)}".encode())
        except PackageNotFoundError:
            key.update(package.encode())
    return Path(root) / f"{shape}-v{VERSION}-{key.hexdigest()[:16]}"


def _copy_model(source: Path, folder: Path) -> None:
    """Copy a made model; its stamp last, so a copy cut short is not taken for a model."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.name != STAMP:
            shutil.copy2(path, folder / path.name)
    shutil.copy2(source / STAMP, folder / STAMP)


def _keep(folder: Path, cached: Path) -> None:
    """Put a copy of the model just made in the cache (whole, or not at all); a cache that cannot be written is
    only a slower next checkout."""
    partial = cached.with_name(f"{cached.name}.{os.getpid()}.partial")
    try:
        _copy_model(folder, partial)
        partial.replace(cached)
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)


def make(folder: Path, shape: str = "tiny") -> Path:
    """Write the model and its tokenizer into ``folder`` (created), unless already there. Returns ``folder``.

    ``shape`` is ``tiny`` (taught the chat format) or ``bench`` (about 28M parameters, random weights). A copy in the
    user's cache (:func:`cached_copy`) is taken when there is one, and one is left there when there is not.
    """
    if shape == SCAFFOLD_SHAPE:
        return _make_scaffolds(folder)
    if is_made(folder, shape):
        return folder
    cached = cached_copy(shape)
    if cached is not None and is_made(cached, shape):
        _copy_model(cached, folder)
        return folder
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus(4000, rng), trainer=trainer)
    tokenizer: Any = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=bpe,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=SPECIAL_TOKENS[3:],
        model_max_length=2048,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)

    torch.manual_seed(SEED)
    dims = SHAPES[shape]
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=dims["hidden_size"],
        intermediate_size=dims["intermediate_size"],
        num_hidden_layers=dims["num_hidden_layers"],
        num_attention_heads=dims["num_attention_heads"],
        num_key_value_heads=dims["num_attention_heads"],
        max_position_embeddings=2048,
        # Untied: vLLM's in-place weight reload (a train run's sync) does not refresh a head tied to the embedding.
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        dtype="float32",
    )
    model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    loss = _teach(model, tokenizer, rng) if shape == "tiny" else None
    model.generation_config.eos_token_id = config.eos_token_id
    model.save_pretrained(folder, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    (folder / STAMP).write_text(
        json.dumps({"version": VERSION, "shape": shape, "parameters": params, "teach_loss": loss and round(loss, 4)})
        + "\n"
    )
    if cached is not None:
        _keep(folder, cached)
    return folder


def _make_scaffolds(folder: Path) -> Path:
    """The ``scaffolds`` shape: the tiny model (made or taken from the cache), its context widened, taught under the
    mswea bundle's frames, then under the oc bundle's first request. A model made from other bundles (another
    mini-swe-agent or OpenCode) is made again."""
    frames, frames_hash = mswea_frames()
    system, tools, request_hash = oc_request()
    made_from = {"frames_from": frames_hash, "request_from": request_hash}
    stamp = _stamp(folder)
    if is_made(folder, SCAFFOLD_SHAPE) and all(stamp.get(k) == v for k, v in made_from.items()):
        return folder
    cached = cached_copy(SCAFFOLD_SHAPE, frames_hash + request_hash)
    if cached is not None and is_made(cached, SCAFFOLD_SHAPE):
        _copy_model(cached, folder)
        return folder
    import tempfile

    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    with tempfile.TemporaryDirectory(prefix="runctl-tinymodel-") as scratch:
        base = make(Path(scratch) / "tiny")
        tokenizer: Any = AutoTokenizer.from_pretrained(base)
        model = LlamaForCausalLM.from_pretrained(base, dtype=torch.float32)
    model.config.max_position_embeddings = SCAFFOLD_CONTEXT
    tokenizer.model_max_length = SCAFFOLD_CONTEXT
    torch.manual_seed(SEED + 1)
    rng = random.Random(SEED + 1)
    loss = _teach_scaffolds(model, tokenizer, frames, rng)
    oc_loss = _teach_prefixed(
        model, tokenizer, rng, lambda r: oc_opening(system, tools, r), oc_episode, steps=OC_STEPS,
        batch_size=OC_BATCH, lr=3e-3, per_opening=OC_PER_OPENING, rehearse=lambda r: mswea_episode(frames, r),
    )  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)
    model.save_pretrained(folder, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    stamp = {"version": VERSION, "shape": SCAFFOLD_SHAPE, "parameters": params, "teach_loss": round(loss, 4)}
    stamp["teach_loss_oc"] = round(oc_loss, 4)
    (folder / STAMP).write_text(json.dumps(stamp | made_from) + "\n")
    if cached is not None:
        _keep(folder, cached)
    return folder


def _stamp(folder: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((folder / STAMP).read_text()))
    except (OSError, ValueError):
        return {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runctl.tinymodel", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="where to write the model")
    parser.add_argument(
        "--shape",
        choices=sorted([*SHAPES, SCAFFOLD_SHAPE]),
        default="tiny",
        help="tiny (taught chat model), scaffolds (it, taught under mini-swe-agent and OpenCode: needs their bundles) "
        "or bench",
    )
    args = parser.parse_args(argv)
    made = make(args.folder, args.shape)
    print(made)
    return 0


if __name__ == "__main__":
    sys.exit(main())
