#!/usr/bin/env bash
# The real-GPU check of gpusched, in one command (docs/benchmarks.md, "Real GPU"):
#
#   bash bench/gpu_check.sh [OUT_DIR]        # default bench/results/gpu_check
#
# On a machine with an NVIDIA GPU, PyTorch in python3 and no network: installs gpusched
# into a fresh venv from the wheels `make gpu-wheels` put in build/gpu-wheels (carried with
# the checkout), starts `gpusched up` on the GPU through NVML and checks what it shows
# against nvidia-smi (bench/gpu_check.py). Writes OUT_DIR/report.md, readings.json,
# run.log and stack.log. Ends within 6 minutes and stops everything it started.
#
# Exit status: 0 every check passed (or is known failing, or not available here),
# 1 a check failed, 2 no NVIDIA GPU here (nothing checked), 3 the install failed.
#
# GPU_CHECK_PYTHON: the Python with PyTorch (default python3). GPU_CHECK_WHEELS: the wheels
# (default build/gpu-wheels). For the tests, on a machine with no GPU:
# GPU_CHECK_REHEARSE=1 (simulated GPUs, CPU stand-ins; GPU_CHECK_TRAIN_S and
# GPU_CHECK_WORKER_S set its jobs' seconds) and GPU_CHECK_VENV=DIR (a venv that has
# gpusched already, instead of installing one).
set -uo pipefail
STARTED=$(date +%s.%N)
cd "$(dirname "$0")/.." || exit 3
OUT=$(realpath -m "${1:-bench/results/gpu_check}")
WHEELS=$(realpath -m "${GPU_CHECK_WHEELS:-build/gpu-wheels}")
# The interpreter itself (not a shim or a link): jobs run it by its path.
PY=$("${GPU_CHECK_PYTHON:-python3}" -c 'import sys; print(sys.executable)') ||
  { echo "gpu-check: no ${GPU_CHECK_PYTHON:-python3}" >&2; exit 3; }
mkdir -p "$OUT" || exit 3
rm -f "$OUT/report.md" "$OUT/readings.json" "$OUT/stack.log"
LOG="$OUT/run.log"
: >"$LOG"
WORK=$(mktemp -d /tmp/gpu-check.XXXXXX)

cleanup() {
  # The driver stops what it started and removes its list; a list left means it was killed
  # first. Each line is "pid start-time": a pid reused since by another process is spared.
  if [ -f "$WORK/pids" ]; then
    while read -r pid start; do
      stat=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
      # shellcheck disable=SC2086
      set -- ${stat##*) }
      [ "${20}" = "$start" ] && kill -9 "$pid" 2>/dev/null
    done <"$WORK/pids"
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

say() { echo "gpu-check: $*" | tee -a "$LOG"; }

REHEARSE=()
if [ -n "${GPU_CHECK_REHEARSE:-}" ]; then
  REHEARSE=(--rehearse --train-s "${GPU_CHECK_TRAIN_S:-8}" --worker-s "${GPU_CHECK_WORKER_S:-4}")
  say "rehearsal on simulated GPUs: no figure is a hardware reading"
else
  "$PY" bench/gpu_check.py preflight --out "$OUT" --started-at "$STARTED" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || exit "$rc"
fi

install() {
  # Only the carried wheels: no index, no pip settings of this machine.
  for var in $(compgen -e | grep '^PIP_'); do unset "$var"; done
  export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
  local venv="$WORK/venv" pip_args=(install --no-index --find-links "$WHEELS" --no-compile -e .)
  compgen -G "$WHEELS/*.whl" >/dev/null || { echo "no wheels in $WHEELS: run make gpu-wheels and carry the folder"; return 1; }
  # This Python's pip installs into a venv made without pip (a distribution's Python may
  # lack ensurepip); failing that (a pip older than 22.3), the venv's own pip.
  if "$PY" -m venv --without-pip "$venv" &&
    timeout 200 "$PY" -m pip --python "$venv/bin/python" "${pip_args[@]}"; then
    return 0
  fi
  echo "gpu-check: again with the venv's own pip"
  "$PY" -m venv --clear "$venv" && timeout 200 "$venv/bin/python" -m pip "${pip_args[@]}"
}

if [ -n "${GPU_CHECK_VENV:-}" ]; then
  VPY="$GPU_CHECK_VENV/bin/python"
else
  say "installing gpusched from $WHEELS"
  if ! install >>"$LOG" 2>&1; then
    say "the install failed: see $LOG"
    "$PY" bench/gpu_check.py abort --out "$OUT" --started-at "$STARTED" --mode setup-failed \
      --reason "install from $WHEELS failed: $(tail -n 3 "$LOG" | tr '\n' ' ')" >/dev/null
    exit 3
  fi
  VPY="$WORK/venv/bin/python"
fi
say "installed in $(awk -v s="$STARTED" -v e="$(date +%s.%N)" 'BEGIN{printf "%.0f", e-s}') s"

# The driver keeps to its own deadlines; this one ends it if it does not: SIGTERM 325 s
# after the start (it still stops the stack and writes its report), SIGKILL 30 s later.
LEFT=$(awk -v s="$STARTED" -v e="$(date +%s.%N)" 'BEGIN{t=325-(e-s); printf "%d", t<60?60:t}')
timeout -k 30 "$LEFT" "$VPY" bench/gpu_check.py run --out "$OUT" --work "$WORK" \
  --torch-python "$PY" --started-at "$STARTED" "${REHEARSE[@]}" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
if [ ! -s "$OUT/report.md" ]; then
  "$PY" bench/gpu_check.py abort --out "$OUT" --started-at "$STARTED" --mode aborted \
    --reason "the driver ended (exit $rc) before it wrote its report: see run.log" >/dev/null
  exit 1
fi
exit "$rc"
