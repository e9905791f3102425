#!/usr/bin/env bash
# The main job on the embedded default: the Debian packages it needs (scripts/system-packages.sh: as root it
# installs what is missing; otherwise it prints the one apt-get line and stops), the Python environment, the tiny
# model, the embedded stack (`runctl up`: the bus, the services, the tracker and its dashboard), then, through the
# stack, an infer run (rollouts and the difficulty filter), a train run on the tasks it kept (GRPO on CPU, with an
# eval run on every checkpoint) and two eval runs on the held-out tasks (`runctl demo --cpu`). It ends with every
# checkpoint's pass@1 beside the base model's, and the dashboard's URL; the stack keeps running until `runctl down`.
#
# Ray binds the machine's routable address whatever it is told, so as root the stack runs its launcher (and with it
# every Ray head, vLLM replica and runner) in a network namespace whose only interface is loopback, with the bus
# relayed in over a Unix socket; the bus, the tracker and the dashboard stay on the host's loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/system-packages.sh demo
./scripts/setup.sh
.venv/bin/python -m runctl.tinymodel .cache/tinymodel >/dev/null
.venv/bin/runctl up
.venv/bin/runctl demo --cpu
