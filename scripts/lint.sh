#!/usr/bin/env bash
# The lint step: ruff (lint and format), the import contracts (import-linter, pyproject.toml's [tool.importlinter])
# and mypy. Run it before each commit; tests/unit/test_architecture.py runs the contracts in CI too.
#   ./scripts/lint.sh          every step
#   ./scripts/lint.sh --fast   without mypy (a few seconds)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
[ -x "$bin/ruff" ] || { echo "no $bin/ruff. Fix: ./scripts/setup.sh" >&2; exit 1; }
"$bin/ruff" check .
"$bin/ruff" format --check .
"$bin/lint-imports" --no-cache
if [ "${1:-}" != "--fast" ]; then
  "$bin/mypy"
fi
