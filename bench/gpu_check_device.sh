#!/usr/bin/env bash
# Run bench/gpu_check.py on a GPU machine in one command.
#
#   bash bench/gpu_check_device.sh prepare          # here: .gpucheck/ = src, bench, tests/fakes, cp312 wheels
#   bash .gpucheck/bench/gpu_check_device.sh run OUTDIR [gpu_check.py args...]   # there
#
# `prepare` fills .gpucheck/ (add `/.gpucheck/` to .git/info/exclude and carry it; ~35 MB):
# what `reef.learning.trainers` and the gateway (`reef serve`) import beyond torch with
# CUDA, transformers, peft, accelerate, safetensors and tokenizers. The wheel list is
# what the device image lacked on 2026-12-04 (its transformers 5.17 is older than
# Reef's floor, so transformers and peft travel too), plus the gateway's own
# dependencies.
#
# `run` installs the carried wheels, then, when vllm or ray is missing, tries the
# package registries for them (a bare CUDA box: `pip install vllm ray`, at most
# REEF_GPU_CHECK_INSTALL_S seconds, default 240; vllm brings the torch it is built
# for). A machine that reaches no registry goes on without them, and the check reports
# the vLLM and Ray runs `skipped` with the reason. The check itself runs under
# `timeout` (REEF_GPU_CHECK_S, default 540 s) with its own budget for the training runs
# (--budget-seconds, default 480 s); its JSON is rewritten after every run, so a run
# cut short still leaves its figures.
set -euo pipefail
WHEELS="alembic==1.20.1 annotated_types==0.8.0 gguf==0.19.0 greenlet==3.5.6 httptools==0.9.0
jsonschema==4.26.0 jsonschema_specifications==2025.9.1 mako==1.4.3 orjson==3.13.0 peft==0.21.2
pydantic==2.14.4 pydantic_core==2.50.5 pydantic_settings==2.16.3 python_dotenv==1.2.4
referencing==0.37.0 rpds_py==2026.9.1 sqlalchemy==2.1.9 starlette==1.10.0 transformers==5.24.0
typing_extensions==4.16.0 typing_inspection==0.4.5 uvicorn==0.55.0
prometheus_client==0.26.0 typer==0.29.2 rich==15.0.0 click==8.5.1 shellingham==1.5.4
markdown_it_py==4.3.0 mdurl==0.1.2 pygments==2.21.0 fsspec==2026.9.0 pyyaml==6.0.4
aiohttp==3.14.5 aiohappyeyeballs==2.7.1 aiosignal==1.4.0 frozenlist==1.8.0 multidict==7.2.1
yarl==1.25.1 propcache==0.5.4 attrs==26.1.0 idna==3.20"
case "${1:-}" in
  prepare)
    root=$(cd "$(dirname "$0")/.." && pwd)
    rm -rf "$root/.gpucheck" && mkdir -p "$root/.gpucheck/.whl"
    cp -r "$root/src" "$root/bench" "$root/.gpucheck/"
    mkdir -p "$root/.gpucheck/tests" && cp -r "$root/tests/fakes" "$root/.gpucheck/tests/"
    touch "$root/.gpucheck/tests/__init__.py"
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
    for module in vllm ray; do
      if ! python3 -c "import $module" 2>/dev/null; then
        echo "installing $module from the registries (REEF_GPU_CHECK_INSTALL_S=${REEF_GPU_CHECK_INSTALL_S:-240})"
        timeout "${REEF_GPU_CHECK_INSTALL_S:-240}" python3 -m pip install -q --no-cache-dir \
          --retries 1 --timeout 15 --target /tmp/site-$module "$module" \
          || echo "$module could not be installed: its runs are reported skipped"
      fi
    done
    export PYTHONPATH=$here/src:$here:/tmp/site:/tmp/site-vllm:/tmp/site-ray
    export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
    (nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true) | tee "$out/nvidia-smi.txt"
    cd "$here"
    set -o pipefail
    timeout "${REEF_GPU_CHECK_S:-540}" python3 bench/gpu_check.py --out "$out/gpu-check.json" \
      --markdown "$out/gpu-check.md" "$@" 2>&1 | tee "$out/log"
    ;;
  *)
    echo "usage: $0 prepare | run OUTDIR [gpu_check.py args...]" >&2
    exit 2
    ;;
esac
