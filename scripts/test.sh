#!/usr/bin/env bash
# The test suite: set up, then pytest (arguments pass through). Integration tests start their own nats-server.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
