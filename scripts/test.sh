#!/usr/bin/env bash
# The test suite: set up, then pytest (arguments pass through). Integration tests start their own nats-server,
# dockerd (unless DOCKER_HOST answers) and Ray heads.
#
# Ray binds the machine's routable address whatever it is told, so as root the suite runs inside a new network
# namespace whose only interface is loopback: nothing a test starts can be reached from, or reach, the network.
# Elsewhere the tests that need Ray are skipped with that reason.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
if [ -z "${RUNCTL_LOOPBACK_NETNS:-}" ] && [ "$(id -u)" = 0 ] && command -v unshare >/dev/null \
  && command -v ip >/dev/null && unshare --net true 2>/dev/null; then
  export RUNCTL_LOOPBACK_NETNS=1
  exec unshare --net sh -c 'ip link set lo up && exec .venv/bin/python -m pytest "$@"' pytest "$@"
fi
exec .venv/bin/python -m pytest "$@"
