#!/usr/bin/env bash
# The test suite: the Debian packages the tests need (scripts/system-packages.sh: as root it installs what is
# missing; otherwise it prints the one apt-get line and stops), the Python environment, then pytest (arguments pass
# through). Integration tests start their own nats-server, dockerd (unless DOCKER_HOST answers), PostgreSQL and Ray.
#
# Ray binds the machine's routable address whatever it is told, so as root the suite runs inside a new network
# namespace whose only interface is loopback: nothing a test starts can be reached from, or reach, the network.
# Elsewhere the tests that need Ray are skipped with that reason.
#
# The suite runs on as many pytest-xdist workers as the machine has cores (RUNCTL_TEST_WORKERS overrides; 0 runs it
# in one process), plus one light worker (RUNCTL_TEST_LIGHT_WORKERS overrides) that takes only short tests served by
# no vLLM replica, shortest first: most of them wait more than they compute. Tests are handed out longest first, and
# the tests of a group (a module with module-scoped fixtures, or an xdist_group mark) stay on one worker
# (tests/infra/schedule.py).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/system-packages.sh test
./scripts/setup.sh
# The agent bundles the scaffold tests run (built once per machine, from the package index: before the suite's
# network namespace, which has none).
.venv/bin/runctl agents build mswea cc oc ohsdk
count=${RUNCTL_TEST_WORKERS:-$(nproc)}
light=${RUNCTL_TEST_LIGHT_WORKERS:-1}
[ "$count" != 0 ] || light=0
export RUNCTL_TEST_LIGHT_WORKERS=$light
count=$((count + light))
workers=(-n "$count")
[ "$count" != 0 ] || workers=()
if [ -z "${RUNCTL_LOOPBACK_NETNS:-}" ] && [ "$(id -u)" = 0 ] && command -v unshare >/dev/null \
  && command -v ip >/dev/null && unshare --net true 2>/dev/null; then
  export RUNCTL_LOOPBACK_NETNS=1
  # As root each worker gets a loopback-only namespace of its own too (tests/infra/worker-python).
  [ "$count" = 0 ] || workers=(--tx "$count*popen//python=tests/infra/worker-python" --dist load)
  exec unshare --net sh -c 'ip link set lo up && exec .venv/bin/python -m pytest "$@"' pytest "${workers[@]}" "$@"
fi
exec .venv/bin/python -m pytest "${workers[@]}" "$@"
