"""Answers the queries bench/gpu_check.py asks nvidia-smi, as one idle H100 would, so the
rehearsal exercises the driver's nvidia-smi readers (its loop, its apps query) too."""

from __future__ import annotations

import sys
import time
from datetime import datetime

VALUES = {
    "index": "0", "name": "NVIDIA H100 80GB HBM3", "memory.total": "81559",
    "uuid": "GPU-3f0a6a55-1c0e-8c8e-5e0b-3b1f2c7d9a10", "driver_version": "580.159.04",
    "pci.bus_id": "00000000:01:00.0", "mig.mode.current": "Disabled", "memory.reserved": "512",
    "utilization.gpu": "0", "memory.free": "80939", "memory.used": "108", "power.draw": "71.25",
}  # fmt: skip
TOPOLOGY = "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \t0-15\t0\t\tN/A\n"


def row(fields: list[str]) -> str:
    stamp = datetime.now().strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
    return ", ".join(stamp if f == "timestamp" else VALUES[f] for f in fields)


def main(argv: list[str]) -> int:
    if argv[:2] == ["topo", "-m"]:
        print(TOPOLOGY, end="")
        return 0
    options = dict(a.split("=", 1) for a in argv if "=" in a)
    if "--query-compute-apps" in options:
        return 0  # nothing runs on this GPU
    fields = options["--query-gpu"].split(",")
    if not all(f in VALUES or f == "timestamp" for f in fields):
        print(f'Field "{fields}" is not a valid field to query.', file=sys.stderr)
        return 2
    if "-lms" not in argv:
        print(row(fields))
        return 0
    period = int(argv[argv.index("-lms") + 1]) / 1000
    while True:
        print(row(fields), flush=True)
        time.sleep(period)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
