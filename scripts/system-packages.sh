#!/usr/bin/env bash
# The Debian packages runctl needs on this machine, by purpose; installs the missing ones when run as root.
#
#   scripts/system-packages.sh demo   bubblewrap (the local sandbox backend), busybox-static (a static shell for
#                                     sandboxes with an empty root), iproute2 (`ip`, to bring up loopback in the
#                                     network namespace Ray runs in, and a public sandbox's network) and iptables
#                                     (that network's rules)
#   scripts/system-packages.sh test   the demo's, and docker.io (the docker backend's tests start their own dockerd),
#                                     postgresql (the tracker's tests start their own server), chromium (the
#                                     dashboard's browser tests; Playwright drives /usr/bin/chromium)
#
# As root it runs `apt-get update` once, and only when something is missing, then `apt-get install` of exactly what
# is missing. Without root it prints the one `apt-get install …` line that is needed and exits 2 before doing
# anything else. Exit 0: everything is there (or was installed); 1: the install failed; 2: usage, or not root.
set -euo pipefail

demo="bubblewrap busybox-static iproute2 iptables"
test_only="docker.io postgresql chromium"

case "${1:-}" in
  demo) wanted="$demo" ;;
  test) wanted="$demo $test_only" ;;
  *)
    echo "usage: $0 demo|test  (demo: $demo; test: also $test_only)" >&2
    exit 2
    ;;
esac

installed() {
  [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = installed ]
}

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "runctl's setup installs Debian packages, and this machine has no dpkg. Install the equivalents of: $wanted" >&2
  echo "(bwrap, busybox, ip, iptables; for the tests also dockerd, PostgreSQL's server and Chromium), then run again." >&2
  exit 2
fi

missing=""
for package in $wanted; do
  installed "$package" || missing="$missing $package"
done
missing="${missing# }"
[ -n "$missing" ] || exit 0

if [ "$(id -u)" != 0 ]; then
  echo "runctl needs these Debian packages for the $1 and they are missing: $missing. Install them with:" >&2
  echo "  sudo apt-get install -y $missing" >&2
  exit 2
fi

echo "installing the Debian packages runctl needs for the $1: $missing ..."
export DEBIAN_FRONTEND=noninteractive
# shellcheck disable=SC2086  # the package list is meant to split into words
apt-get update -qq >/dev/null || echo "apt-get update failed; trying the install with the package lists there are" >&2
# shellcheck disable=SC2086
if ! apt-get install -y -qq $missing >/dev/null; then
  echo "apt-get install -y $missing failed: see its output above. Fix the package source, then run again." >&2
  exit 1
fi
