"""An installed agent for the tests: the official openai and anthropic SDKs, run inside the sandbox, configured only
by the environment the runner gives it. It asks the model, runs the bash commands it proposes in /app, then checks
what else it can reach: ``python sdk_agent.py HOST_PORT`` tries a port listening on the host's loopback."""

import json
import os
import socket
import subprocess
import sys

import anthropic
import openai

BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command and return its output.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}
model = os.environ["RUNCTL_MODEL"]
with open(os.environ["RUNCTL_INSTRUCTION_FILE"]) as f:
    # The system turn runctl's terminal agent sends (runctl.tinymodel.TERMINAL_SYSTEM_PROMPT), under which the tiny
    # model was taught the example tasks' commands.
    system = (
        "You are an agent working in a Linux terminal. Run shell commands with the bash tool, one at a time, and "
        "read their output. When the task is done, answer briefly without calling a tool."
    )
    messages = [{"role": "system", "content": system}, {"role": "user", "content": f.read().strip()}]
report = {"commands": []}
with openai.OpenAI(max_retries=0) as client:
    for _ in range(3):
        reply = client.chat.completions.create(model=model, messages=messages, tools=[BASH], temperature=0, seed=1)
        message = reply.choices[0].message
        if not message.tool_calls:
            break
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            command = json.loads(call.function.arguments)["command"]
            done = subprocess.run(command, shell=True, capture_output=True, text=True, cwd="/app")
            report["commands"].append(command)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": done.stdout + done.stderr})
with anthropic.Anthropic(max_retries=0) as claude:
    answer = claude.messages.create(model="claude-policy", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    report["anthropic_stop_reason"] = answer.stop_reason


def reach(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return "connected"
    except OSError as e:
        return type(e).__name__


report["host_loopback"] = reach("127.0.0.1", int(sys.argv[1]))
report["outside"] = reach("10.255.255.1", 80)
with open("/logs/agent/report.json", "w") as f:
    json.dump(report, f)
