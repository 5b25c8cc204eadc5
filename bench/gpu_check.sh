#!/usr/bin/env bash
# The checks that need a real NVIDIA GPU, as one script: NVML discovery, the driver's GPU listing that
# device isolation reads, the calibration kernels on the GPU, and the tests that CI (no GPU) skips: the
# torch examples on CUDA, and a master with an `nvml` agent running, preempting and resuming jobs on the
# GPU (tests/integration/test_real_node.py). Then the agent's and node side's other tests on that machine.
#
#     bench/gpu_check.sh [OUTDIR]        # OUTDIR (default $OUT, else ./gpu-check): logs and JSON
#
# Runs from the repository root (it goes there) with the packages of `pip install -e . -e './agent[gpu]'`
# importable. On a bare machine whose Python already has torch, nvidia-ml-py and aiohttp, the other
# packages can come as wheels in a folder (WHEELS=.whl): they are installed into a temporary folder,
# not into the system. Each step runs whatever the last left; the exit status is the number of steps
# that failed (a machine without CUDA fails the machine step, and the GPU tests' step if they skip).
set -u
out="${1:-${OUT:-gpu-check}}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$(dirname "$0")/.." || exit 1
py="${PYTHON:-python3}"
failed=0
step() {  # step NAME COMMAND...: run it, its output to the screen and to $out/NAME.log
    local name="$1" start=$SECONDS rc
    shift
    echo "=== $name: $*"
    "$@" 2>&1 | tee "$out/$name.log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 0 ]; then
        echo "=== $name: ok ($((SECONDS - start)) s)"
    else
        echo "=== $name: FAILED, status $rc ($((SECONDS - start)) s)"
        failed=$((failed + 1))
    fi
}

pythonpath="$PWD:$PWD/agent"
if [ -n "${WHEELS:-}" ]; then
    site="$(mktemp -d)"
    step wheels "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
        "$WHEELS"/*.whl
    pythonpath="$pythonpath:$site"
fi
export PYTHONPATH="$pythonpath${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

machine() {
    nvidia-smi || return
    "$py" -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda,
        torch.cuda.device_count(), 'GPUs'); assert torch.cuda.is_available(), 'torch sees no CUDA GPU'"
}
step machine machine
step discovery "$py" -c "
import json
from hopsmgr_agent.devices import discover
inv = discover()
print('gpu_type', inv.gpu_type)
print(json.dumps(inv.to_json(), indent=1))
"
step listing "$py" -c "
from hopsmgr.node.gpu_devices import node_gpus, rules_for
print('driver listing:', node_gpus())
for grant in ('0', '0,1', ''):
    print(f'grant {grant!r}:', rules_for({'CUDA_VISIBLE_DEVICES': grant}))
"
step calibration "$py" -m hopsmgr_agent.calibrate --device gpu --budget 60 --json "$out/calibration.json"
# the GPU tests alone first (nothing beside them on the GPU), then the rest of the agent's and node
# side's tests; -W default: this machine's package versions may warn where CI's do not
gpu_tests() {
    "$py" -m pytest -q -rA -p no:cacheprovider -W default --junitxml "$out/gpu-tests.xml" \
        -k "cuda or nvml" tests/node/test_torch_examples.py tests/integration/test_real_node.py || return
    "$py" - "$out/gpu-tests.xml" <<'EOF'
import sys
import xml.etree.ElementTree as ET

suite = ET.parse(sys.argv[1]).getroot().find("testsuite")
tests, skipped = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
sys.exit(f"GPU tests: {skipped} of {tests} skipped (no GPU test ran here)" if skipped or not tests else 0)
EOF
}
step gpu-tests gpu_tests
step node-tests "$py" -m pytest -q -p no:cacheprovider -W default tests/agent tests/node \
    --ignore tests/node/test_torch_examples.py
echo "=== steps failed: $failed"
exit "$failed"
