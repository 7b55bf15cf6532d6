#!/usr/bin/env bash
# Run bench/gpu_check.py on a lent GPU machine whose Python (3.12, torch with CUDA,
# transformers, peft, accelerate, safetensors, tokenizers) lacks the rest of what
# `reef.learning.trainers` imports, and which reaches no package registry.
#
#   bash bench/gpu_check_device.sh prepare          # here: .gpucheck/ = src, bench, cp312 wheels
#   bash .gpucheck/bench/gpu_check_device.sh run OUTDIR [gpu_check.py args...]   # there
#
# `prepare` fills .gpucheck/ (add `/.gpucheck/` to .git/info/exclude and carry it; ~27 MB).
# The wheel list is what the device image lacked on 2026-12-04 (its transformers 5.17
# is older than Reef's floor, so transformers and peft travel too).
set -euo pipefail
WHEELS="alembic==1.20.1 annotated_types==0.8.0 gguf==0.19.0 greenlet==3.5.6 httptools==0.9.0
jsonschema==4.26.0 jsonschema_specifications==2025.9.1 mako==1.4.3 orjson==3.13.0 peft==0.21.2
pydantic==2.14.4 pydantic_core==2.50.5 pydantic_settings==2.16.3 python_dotenv==1.2.4
referencing==0.37.0 rpds_py==2026.9.1 sqlalchemy==2.1.9 starlette==1.10.0 transformers==5.24.0
typing_extensions==4.16.0 typing_inspection==0.4.5 uvicorn==0.55.0"
case "${1:-}" in
  prepare)
    root=$(cd "$(dirname "$0")/.." && pwd)
    rm -rf "$root/.gpucheck" && mkdir -p "$root/.gpucheck/.whl"
    cp -r "$root/src" "$root/bench" "$root/.gpucheck/"
    # shellcheck disable=SC2086
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d "$root/.gpucheck/.whl" $WHEELS
    du -sh "$root/.gpucheck"
    ;;
  run)
    here=$(cd "$(dirname "$0")/.." && pwd)
    out=$2; shift 2
    mkdir -p "$out"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "$here"/.whl/*.whl
    export PYTHONPATH=$here/src:/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
    (nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true) | tee "$out/nvidia-smi.txt"
    cd "$here"
    set -o pipefail
    python3 bench/gpu_check.py --out "$out/gpu-check.json" --markdown "$out/gpu-check.md" "$@" 2>&1 | tee "$out/log"
    ;;
  *)
    echo "usage: $0 prepare | run OUTDIR [gpu_check.py args...]" >&2
    exit 2
    ;;
esac
