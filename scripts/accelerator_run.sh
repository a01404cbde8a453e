#!/usr/bin/env bash
# The quick main job and the Pallas kernels' timings on an accelerator, packed into one file.
#
# Run from anywhere on a machine with JAX (CUDA or TPU) installed; needs no network and no
# install: the repository runs in place (PYTHONPATH). Writes $OUT/accelerator-<machine>.tar.gz
# (python -m microbench pack); `python -m microbench unpack FILE` on the CPU machine puts it in
# figures/data/<machine>/ and draws it. Budget: under 5 minutes (the timeouts below).
#
#   OUT       folder of the .tar.gz (default: ./accelerator-out)
#   PLATFORM  auto (default), gpu, tpu; gpu or tpu on a CPU-only machine forces that path at
#             tiny sizes, labelled as forced (a check of the logic, not a measurement)
#   PYTHON    the interpreter (default: python)
#   DRY_RUN   1: print the versions and the commands, measure nothing, pack the versions
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python}
OUT=${OUT:-$PWD/accelerator-out}
PLATFORM=${PLATFORM:-auto}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
status=0

"$PY" - > "$WORK/versions.txt" <<'PYEOF' || exit 2
import platform
import jax
import jaxlib
print("python", platform.python_version())
print("jax", jax.__version__)
print("jaxlib", jaxlib.__version__)
print("backend", jax.default_backend())
for d in jax.devices():
    print("device", d.device_kind, getattr(d, "compute_capability", "") or "")
PYEOF
if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >> "$WORK/versions.txt"
fi
cat "$WORK/versions.txt"

step() {  # log the command; run it unless DRY_RUN; a failure is logged, the rest still runs
    echo "+ $*" | tee -a "$WORK/log.txt"
    [ -n "${DRY_RUN:-}" ] && return 0
    "$@" 2>&1 | tee -a "$WORK/log.txt"
    local rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then
        echo "FAILED (exit $rc): $*" | tee -a "$WORK/log.txt"
        status=1
    fi
}

step timeout 220 "$PY" -m microbench run --quick --platform "$PLATFORM" --no-progress \
    --out "$WORK/microbench"
step timeout 60 "$PY" -m microbench pallas --quick --platform "$PLATFORM" --out "$WORK/pallas"
"$PY" -m microbench pack "$WORK" --out "$OUT" || exit 2
exit "$status"
