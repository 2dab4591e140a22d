#!/bin/bash
# The README's service on a machine with an NVIDIA GPU (real NVML): a job on the GPU, then a
# foreign process the scheduler must avoid until it is gone. Logs go to $OUT (default /tmp).
set -u
OUT=${OUT:-/tmp}
# The lent GPU machine has no package index: wheels carried in .whl/ (pip download).
[ -d .whl ] && { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3; }
rm -rf /tmp/gs  # a fresh service: the jobs below are 1 and 2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 GPUSCHED_DATA_DIR=/tmp/gs
G="python3 -m app.cli"
setsid python3 -m app.cli up > $OUT/up.log 2>&1 &
for i in $(seq 1 120); do curl -sf localhost:8000/readyz >/dev/null && break; sleep 1; done
curl -s localhost:8000/readyz; echo
export GPUSCHED_TOKEN=$(cat /tmp/gs/admin.token)
sleep 8  # stability window of the fresh GPU
$G nodes
echo "== job 1 on the H100 =="
$G submit -J matmul --gpus 1 --wait -- python3 -c "import torch,os,time; t=time.time(); print('CUDA_VISIBLE_DEVICES', os.environ['CUDA_VISIBLE_DEVICES'], torch.cuda.get_device_name(0)); x=torch.randn(8192,8192,device='cuda'); [x@x for _ in range(300)]; torch.cuda.synchronize(); print('done in', round(time.time()-t,1), 's')"
echo "exit $?"
$G logs 1
echo "== a foreign process loads the GPU =="
python3 -c "import torch,time; x=torch.randn(8192,8192,device='cuda'); e=time.time()+45
while time.time()<e: y=x@x
torch.cuda.synchronize()" &
FOREIGN=$!
sleep 12
$G submit -J waits --gpus 1 -- python3 -c "print('ran')"
sleep 8
$G show 2 | head -30
$G nodes
curl -s -H "Authorization: Bearer $GPUSCHED_TOKEN" localhost:8000/api/v1/nodes | python3 -c "import json,sys; g=json.load(sys.stdin)[0]['gpus'][0]; print({k: g[k] for k in ('util_pct','memory_used_mb','foreign_util_pct','foreign_memory_mb','foreign_since','processes')})"
kill $FOREIGN; wait $FOREIGN 2>/dev/null
KILLED=$(date +%s.%N)
echo "foreign process stopped at $(date +%T.%N)"
for i in $(seq 1 60); do
  S=$(curl -s -H "Authorization: Bearer $GPUSCHED_TOKEN" localhost:8000/api/v1/jobs/2 | python3 -c "import json,sys; j=json.load(sys.stdin); print(j['status'])")
  [ "$S" = SUCCEEDED ] && break; sleep 1; done
echo "job 2 $S, $(python3 -c "import time; print(round(time.time()-$KILLED,1))") s after the foreign process stopped"
$G show 2 | tail -8
$G logs 2
kill -INT $(pgrep -f "app.cli up" | head -1); sleep 10
tail -5 $OUT/up.log
