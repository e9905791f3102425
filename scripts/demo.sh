#!/usr/bin/env bash
# The main job on the embedded default: set up, bring the stack up, run the preview example and watch it live.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/runctl demo "${@:-configs/examples/preview.env}"
