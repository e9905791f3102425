#!/usr/bin/env bash
# The GPU smoke check, on one machine with an NVIDIA GPU (and the package registries within reach): the Debian
# packages the sandboxes need, the GPU set (scripts/setup.sh --gpu: .venv-gpu with verl, its vLLM and CUDA torch, and
# runctl), the tiny model, the embedded stack from .venv-gpu, then two GRPO steps of configs/examples/train-gpu.env
# through verl (ENGINE=verl) with a checkpoint after each and the launcher's eval run on every checkpoint and on the
# base model (`runctl demo --gpu`). It prints every event of the train run, then the count of each kind, each step's
# time (verl's timing_s/step) and each eval run's pass@1, and how long each stage took; the run itself should take
# under 8 minutes on one large GPU. The stack is taken down at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
gpus=$(find /proc/driver/nvidia/gpus -mindepth 1 -maxdepth 1 2>/dev/null | wc -l || true)
if [ "$gpus" -lt 1 ]; then
  echo "gpu_smoke.sh needs an NVIDIA GPU with its driver loaded, and this machine has none" \
    "(/proc/driver/nvidia/gpus is empty). Fix: run it on a GPU node; on CPU, ./scripts/demo.sh trains for real." >&2
  exit 1
fi
t0=$(date +%s)
./scripts/system-packages.sh demo
./scripts/setup.sh --gpu
t1=$(date +%s)
.venv-gpu/bin/python -m runctl.tinymodel .cache/tinymodel >/dev/null
t2=$(date +%s)
.venv-gpu/bin/runctl up
trap '.venv-gpu/bin/runctl down >/dev/null 2>&1 || true' EXIT
.venv-gpu/bin/runctl demo --gpu
t3=$(date +%s)
echo "gpu_smoke.sh: packages and the GPU set $((t1 - t0)) s, the tiny model $((t2 - t1)) s," \
  "the stack and the verl run with its evals $((t3 - t2)) s"
