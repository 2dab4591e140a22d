"""The real-GPU check's driver (run by `bench/gpu_check.sh`; docs/benchmarks.md).

    python bench/gpu_check.py preflight --out DIR       # exit 2 (and a report) without a GPU
    python bench/gpu_check.py run --out DIR --work DIR --torch-python PATH
    python bench/gpu_check.py evaluate DIR/readings.json [--out DIR]   # judge a run again
    python bench/gpu_check.py summarize DIR/report.md                  # what did not pass

`run` starts `gpusched up --gpus nvml` on the GPU (a private data dir, port and Redis),
samples `nvidia-smi` and the API alongside, runs the phases below one after another, each
against a deadline, stops everything it started (also on SIGTERM), then writes
readings.json (every raw reading) and report.md (bench/gpu_check_report.py judges them):

1. the node as registered, against `nvidia-smi` (model, memory, UUID, NVLink peers);
2. a PyTorch training job (`gpusched submit --gpus 1`, ~60 s): telemetry, the job page's
   data and `seff` against `nvidia-smi`; the job's pids against NVML's process list;
3. `gpusched estimate` for the model it trained, against PyTorch's peak memory;
4. a foreign PyTorch loop started outside the scheduler; a job submitted meanwhile;
5. a 2-worker torchrun job on one GPU: are its workers attributed to it?
6. device isolation, where the node reports it (a job given no GPU opens none).

`--rehearse` runs the same driver on simulated GPUs with CPU stand-ins for the GPU
programs (`gpu_check_workloads.py --fake`), injecting the foreign process through the
simulated backend: the tests check the plumbing with it; none of its figures is a reading.

Standard library only at import: `preflight` runs under any Python.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import gpu_check_report as judge  # noqa: E402
from bench.gpu_check_workloads import RESULT_PREFIX  # noqa: E402

WORKLOADS = ROOT / "bench" / "gpu_check_workloads.py"
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"})
T = TypeVar("T")

# The scheduler's settings for the check: short enough that a run fits in 6 minutes.
STABILITY_WINDOW_S = 8.0
SAMPLE_INTERVAL_S = 1.0
FOREIGN_UTIL_THRESHOLD_PCT = 10.0
# Seconds from the script's start: the phases stop by PHASES_END_S, whatever is left; the
# stack's stop and the report take the rest (gpu_check.sh sends SIGTERM at 325 s, then
# SIGKILL 30 s later).
PHASES_END_S = 280.0
STOP_GRACE_S = 30.0
SIM_SPEC = "sim:1x1:H100-80GB"
STACK_LOG_CAP = 8 * 2**20  # what comes back from the GPU machine: 16 MiB a file

SMI_FIELDS = "timestamp,index,utilization.gpu,memory.total,memory.free,memory.used,power.draw"
SMI_STATIC = "index,name,memory.total,uuid,driver_version,pci.bus_id"
SMI_STATIC_EXTRA = ",mig.mode.current,memory.reserved"


class Stop(Exception):
    """The run cannot go on (the stack did not start, the deadline passed, a signal)."""


class PhaseError(Exception):
    """One phase cannot go on; the next ones may."""


# -- small helpers -----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def smi_value(text: str) -> float | None:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        return None  # [N/A], [Not Supported]


def smi_time(text: str) -> float | None:
    """nvidia-smi's `timestamp` field (local time, to the millisecond) as Unix seconds."""
    try:
        return datetime.strptime(text.strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
    except ValueError:
        return None


def run_text(argv: list[str], timeout: float = 30) -> tuple[int, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        return 127, f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, f"{argv[0]}: no answer in {timeout:g} s"
    return done.returncode, done.stdout if done.returncode == 0 else done.stdout + done.stderr


def smi_gpus() -> tuple[list[dict[str, Any]], str | None]:
    """nvidia-smi's GPUs: (rows, error)."""
    fields = SMI_STATIC + SMI_STATIC_EXTRA
    code, text = run_text(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"])
    if code not in (0, 127, 124):  # an older driver without one of the extra fields
        fields = SMI_STATIC
        code, text = run_text(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"]
        )
    if code:
        return [], text.strip() or f"nvidia-smi exit {code}"
    names = fields.split(",")
    rows = []
    for line in text.strip().splitlines():
        raw = dict(zip(names, (c.strip() for c in line.split(",")), strict=False))
        if not raw["index"].isdigit() or len(raw) < len(names):
            continue  # a message, not a GPU ("No devices were found")
        rows.append({
            "index": int(raw["index"]), "name": raw["name"], "uuid": raw["uuid"],
            "memory_total_mb": int(float(raw["memory.total"])),
            "driver_version": raw["driver_version"], "pci_bus_id": raw["pci.bus_id"],
            "mig_mode": raw.get("mig.mode.current"),
            "memory_reserved_mb": smi_value(raw.get("memory.reserved", "")),
        })  # fmt: skip
    return rows, None if rows else f"nvidia-smi lists no GPU: {text.strip()[:200]}"


def nvml_snapshot(label: str) -> dict[str, Any]:
    """Raw NVML readings, taken directly (not through gpusched's backend)."""
    found: dict[str, Any] = {"t": time.time(), "label": label}
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:
        found["error"] = f"{type(exc).__name__}: {exc}"
        return found

    def memory(handle: Any) -> dict[str, int]:
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return {k: getattr(info, k) // 2**20 for k in ("total", "free", "used")}

    def utilization(handle: Any) -> dict[str, int]:
        rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
        return {"gpu": rates.gpu, "memory": rates.memory}

    def processes(handle: Any) -> list[dict[str, int]]:
        return [
            {"pid": p.pid, "used_memory_mb": (p.usedGpuMemory or 0) // 2**20}
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        ]

    readers: dict[str, Callable[[Any], Any]] = {
        "name": lambda h: str(pynvml.nvmlDeviceGetName(h)),
        "uuid": lambda h: str(pynvml.nvmlDeviceGetUUID(h)),
        "memory_mb": memory,
        "utilization_pct": utilization,
        "power_w": lambda h: pynvml.nvmlDeviceGetPowerUsage(h) / 1000,
        "mig_mode": lambda h: list(pynvml.nvmlDeviceGetMigMode(h)),
        "compute_processes": processes,
    }
    try:
        found["driver_version"] = str(pynvml.nvmlSystemGetDriverVersion())
        found["gpus"] = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            gpu: dict[str, Any] = {"index": index}
            for key, read in readers.items():
                try:
                    gpu[key] = read(handle)
                except Exception as exc:  # one unsupported query must not lose the rest
                    gpu[key] = f"error: {type(exc).__name__}: {exc}"
            found["gpus"].append(gpu)
    except Exception as exc:
        found["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return found


def proc_start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat: with the pid, names one process (pids are reused)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return None if fields[0] == "Z" else fields[19]


def process_tree(roots: set[int]) -> set[int]:
    """The roots and every living descendant of theirs."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(text[text.rindex(")") + 2 :].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [r for r in roots if Path(f"/proc/{r}").exists()]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(parents.get(pid, []))
    return found


def job_of(pid: int) -> int | None:
    """The gpusched job a process belongs to (GPUSCHED_JOB_ID in its environment)."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"GPUSCHED_JOB_ID="):
            with contextlib.suppress(ValueError):
                return int(item.split(b"=", 1)[1])
    return None


def cap_file(path: Path, cap: int) -> None:
    """Keep the last `cap` bytes of a log."""
    with contextlib.suppress(OSError):
        if path.stat().st_size > cap:
            with path.open("rb") as f:
                f.seek(-cap, os.SEEK_END)
                tail = f.read()
            path.write_bytes(b"[... cut to its last bytes]\n" + tail)


def result_line(log: str) -> dict[str, Any] | None:
    for line in reversed(log.splitlines()):
        if line.startswith(RESULT_PREFIX):
            with contextlib.suppress(ValueError):
                return dict(json.loads(line[len(RESULT_PREFIX) :]))
    return None


# -- the run -----------------------------------------------------------------------------


class GpuCheckRun:
    """One run of the check: what it started, what it read, until when it may go on."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.out: Path = args.out
        self.work: Path = args.work
        self.rehearse: bool = args.rehearse
        self.torch_python: str = args.torch_python
        self.train_s: float = args.train_s
        self.worker_s: float = args.worker_s
        self.started_at: float = args.started_at or time.time()
        self.phases_end = self.started_at + PHASES_END_S
        self.data_dir = self.work / "data"
        self.sim_state = self.work / "sim-state.json"
        self.port = free_port()
        self.env = self._stack_env()
        # The venv's `gpusched` (gpu_check.sh installs it and runs this driver with its Python).
        exe = Path(sys.executable).with_name("gpusched")
        self.cli = [str(exe)] if exe.exists() else [sys.executable, "-m", "app.cli"]
        self.readings: dict[str, Any] = {
            "schema": 1,
            "mode": "rehearsal" if self.rehearse else "gpu",
            "host": socket.gethostname(),
            "started_at": self.started_at,
            "settings": {
                "stability_window_s": STABILITY_WINDOW_S,
                "sample_interval_s": SAMPLE_INTERVAL_S,
                "foreign_util_threshold_pct": FOREIGN_UTIL_THRESHOLD_PCT,
                "train_s": self.train_s,
                "worker_s": self.worker_s,
                "torch_python": self.torch_python,
            },
            "smi_samples": [],
            "smi_apps": [],
            "polls": [],
            "nvml_snapshots": [],
            "phases": {},
            "error": None,
        }
        self.up: subprocess.Popen[bytes] | None = None
        self.foreign: subprocess.Popen[bytes] | None = None
        self.smi_loop: subprocess.Popen[str] | None = None
        self.tracked: dict[int, str] = {}  # pid -> start time, of everything we started
        self.token = ""
        self.node_name = ""
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []

    def _stack_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSCHED_")}
        env.update(
            GPUSCHED_DATA_DIR=str(self.data_dir),
            GPUSCHED_HOST="127.0.0.1",
            GPUSCHED_PORT=str(self.port),
            GPUSCHED_SCHEDULER_STABILITY_WINDOW_S=f"{STABILITY_WINDOW_S:g}",
            GPUSCHED_SCHEDULER_FOREIGN_UTIL_THRESHOLD_PCT=f"{FOREIGN_UTIL_THRESHOLD_PCT:g}",
            GPUSCHED_SCHEDULER_INTERVAL_S="1",
            GPUSCHED_AGENT_SAMPLE_INTERVAL_S=f"{SAMPLE_INTERVAL_S:g}",
            GPUSCHED_AGENT_GRACE_S="5",
            GPUSCHED_SCHEDULER_METRICS_PORT="0",
            GPUSCHED_SCHEDULER_REPORTS_METRICS_PORT="0",
            PYTHONUNBUFFERED="1",
            # The CLI's saved URL and token (`up` writes them, the CLI reads them first):
            # this stack's own, not the user's ~/.config, nor those of a check beside it.
            XDG_CONFIG_HOME=str(self.data_dir.resolve() / "cli-config"),
        )
        if self.rehearse:
            env["GPUSCHED_AGENT_SIM_STATE_FILE"] = str(self.sim_state)
        if os.geteuid() == 0:
            # The check runs as root on a lent GPU machine, and `up` maps its admin, who
            # submits every job here, to the account that started it: root. A root job
            # is allowed only by name (docs/isolation.md).
            env["GPUSCHED_AGENT_UID0_ACCOUNTS"] = "root"
        return env

    def say(self, text: str) -> None:
        print(f"[gpu-check {time.time() - self.started_at:5.1f}s] {text}", flush=True)

    # -- waiting ---------------------------------------------------------------------

    def until(
        self, what: str, check: Callable[[], T | None], timeout: float, every: float = 0.5
    ) -> T:
        """Poll `check` until it returns something, for `timeout` s at most and never past
        the phases' deadline."""
        deadline = min(time.time() + timeout, self.phases_end)
        while True:
            if self.stopping.is_set():
                raise Stop("stopped by a signal")
            found = check()
            if found is not None and found is not False:
                return found
            if time.time() >= deadline:
                late = " (the run's deadline)" if deadline == self.phases_end else ""
                raise PhaseError(f"timed out after {timeout:g} s waiting for {what}{late}")
            time.sleep(every)

    # -- the API and the CLI ---------------------------------------------------------

    def api(self, path: str, method: str = "GET", body: Any = None, raw: bool = False) -> Any:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=15) as answer:
                data = answer.read().decode()
        except urllib.error.HTTPError as exc:
            raise PhaseError(f"{method} {path}: HTTP {exc.code} {exc.read()[:300]!r}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise PhaseError(f"{method} {path}: {exc}") from None
        return data if raw else json.loads(data)

    def gpusched(self, *args: str, timeout: float = 60) -> str:
        try:
            done = subprocess.run(
                [*self.cli, *args], env=self.env, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            raise PhaseError(f"gpusched {args[0]}: no answer in {timeout:g} s") from None
        if done.returncode:
            raise PhaseError(
                f"gpusched {' '.join(args[:3])}: exit {done.returncode}: {done.stderr[-500:]}"
            )
        return done.stdout

    def submit(self, name: str, command: list[str], gpus: int = 1) -> int:
        # A job's environment is clean (PATH, HOME, LANG): where the machine finds the CUDA
        # driver's library through LD_LIBRARY_PATH, the job gets it too.
        libraries = os.environ.get("LD_LIBRARY_PATH")
        env = ["--env", f"LD_LIBRARY_PATH={libraries}"] if libraries else []
        out = self.gpusched(
            "submit", "--parsable", "-J", name, "--gpus", str(gpus), "--max-runtime", "300",
            *env, "--", *command,
        )  # fmt: skip
        return int(out.strip().splitlines()[-1])

    def job(self, job_id: int) -> dict[str, Any]:
        return dict(self.api(f"/api/v1/jobs/{job_id}"))

    def wait_job(
        self, job_id: int, timeout: float, during: Callable[[dict[str, Any]], None] | None = None
    ) -> dict[str, Any]:
        def ended() -> dict[str, Any] | None:
            job = self.job(job_id)
            if during is not None:
                during(job)
            return job if job["status"] in TERMINAL else None

        return self.until(f"job {job_id} to end", ended, timeout)

    def log_tail(self, job_id: int) -> str:
        return str(self.api(f"/api/v1/jobs/{job_id}/logs?tail=60", raw=True))

    def workload(self, name: str, *args: str) -> list[str]:
        fake = ["--fake"] if self.rehearse and name != "open-gpus" else []
        return [self.torch_python, str(WORKLOADS), name, *args, *fake]

    # -- background readers ----------------------------------------------------------

    def start_thread(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)

    def track(self, pids: set[int]) -> None:
        for pid in pids:
            start = proc_start_time(pid)
            if start is not None:
                self.tracked.setdefault(pid, start)
        with contextlib.suppress(OSError):  # for gpu_check.sh, should this driver be killed
            lines = "".join(f"{pid} {start}\n" for pid, start in self.tracked.items())
            (self.work / "pids").write_text(lines)

    def roots(self) -> set[int]:
        return {p.pid for p in (self.up, self.foreign) if p is not None}

    def poller(self) -> None:
        """Every second: the API's node readings, and which of our processes run which job."""
        while not self.stopping.wait(SAMPLE_INTERVAL_S):
            try:
                self.poll()
            except Exception as exc:  # one bad answer must not end the readings
                self.readings["polls"].append({"t": time.time(), "error": repr(exc)})

    def poll(self) -> None:
        """One reading of the API's node and of our process tree."""
        tree = process_tree(self.roots())
        self.track(tree)
        job_pids: dict[str, list[int]] = {}
        for pid in sorted(tree):
            job = job_of(pid)
            if job is not None:
                job_pids.setdefault(str(job), []).append(pid)
        nodes = self.api("/api/v1/nodes")
        node = next((n for n in nodes if n["name"] == self.node_name), None)
        if node is None:
            return
        keep = ("index", "sampled_at", "util_pct", "memory_used_mb", "power_w", "processes",
                "foreign_util_pct", "foreign_memory_mb", "foreign_since", "allocated", "healthy")  # fmt: skip
        self.readings["polls"].append({
            "t": time.time(), "node_state": node["state"], "job_pids": job_pids,
            "gpus": [{k: g.get(k) for k in keep} for g in node["gpus"]],
        })  # fmt: skip

    def smi_reader(self) -> None:
        assert self.smi_loop is not None and self.smi_loop.stdout is not None
        for line in self.smi_loop.stdout:
            cells = [c.strip() for c in line.split(",")]
            if len(cells) != len(SMI_FIELDS.split(",")) or not cells[1].isdigit():
                continue
            stamp, index, util, total, free, used, power = cells
            self.readings["smi_samples"].append({
                "t": smi_time(stamp) or time.time(), "index": int(index), "util_pct": smi_value(util),
                "memory_total_mb": smi_value(total), "memory_free_mb": smi_value(free),
                "memory_used_mb": smi_value(used), "power_w": smi_value(power),
            })  # fmt: skip

    def smi_apps(self) -> None:
        by_uuid = {g["uuid"]: g["index"] for g in self.readings["smi"]["gpus"]}
        query = [
            "nvidia-smi",
            "--query-compute-apps=pid,used_memory,gpu_uuid",
            "--format=csv,noheader,nounits",
        ]
        while not self.stopping.wait(1.0):
            t = time.time()
            code, text = run_text(query, timeout=10)
            if code:
                continue
            for line in text.strip().splitlines():
                cells = [c.strip() for c in line.split(",")]
                if len(cells) == 3 and cells[0].isdigit():
                    self.readings["smi_apps"].append({
                        "t": t, "pid": int(cells[0]), "used_memory_mb": smi_value(cells[1]),
                        "index": by_uuid.get(cells[2]),
                    })  # fmt: skip

    # -- steps -------------------------------------------------------------------------

    def identify(self) -> None:
        gpus, error = smi_gpus()
        smi: dict[str, Any] = {"gpus": gpus, "error": error, "topology": None}
        if gpus:
            code, text = run_text(["nvidia-smi", "topo", "-m"])
            smi["topology" if code == 0 else "topology_error"] = text
        self.readings["smi"] = smi
        snapshot = nvml_snapshot("start")
        self.readings["nvml"] = snapshot
        self.readings["nvml_snapshots"].append(snapshot)
        self.say(f"nvidia-smi: {[g['name'] for g in gpus] or error}")
        if gpus:
            loop = ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits",
                    "-lms", "500"]  # fmt: skip
            # Line by line into the pipe, so that a reading stopped at the end is not lost
            # in a buffer (each line carries its own time either way).
            if shutil.which("stdbuf"):
                loop = ["stdbuf", "-oL", *loop]
            self.smi_loop = subprocess.Popen(loop, stdout=subprocess.PIPE, text=True)
            self.track({self.smi_loop.pid})
            self.start_thread(self.smi_reader, "smi-reader")
            self.start_thread(self.smi_apps, "smi-apps")

    def start_stack(self) -> None:
        from app.processes import dies_with_this_process

        self.data_dir.mkdir(parents=True, exist_ok=True)
        # A rehearsal's simulated node has a name of its own: an agent that starts ends the
        # job processes of its node's name, whichever stack on the machine they belong to.
        args = ["--gpus", "nvml"]
        if self.rehearse:
            args = ["--gpus", SIM_SPEC, "--node-name", f"gpucheck-{os.getpid()}"]
        log = (self.out / "stack.log").open("wb")
        self.say(f"starting gpusched up {' '.join(args)} on port {self.port}")
        self.up = subprocess.Popen(
            [*self.cli, "up", *args], env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=dies_with_this_process(),
        )  # fmt: skip
        self.track({self.up.pid})

        def ready() -> bool:
            if self.up is not None and self.up.poll() is not None:
                tail = (self.out / "stack.log").read_text(errors="replace")[-800:]
                raise Stop(f"gpusched up exited with code {self.up.returncode}: {tail}")
            token_file = self.data_dir / "admin.token"
            if not token_file.exists():
                return False
            self.token = token_file.read_text().strip()
            try:
                self.api("/readyz")
            except PhaseError:
                return False
            return True

        try:
            self.until("the API to answer /readyz", ready, timeout=120, every=1)

            def registered() -> dict[str, Any] | None:
                nodes = self.api("/api/v1/nodes")
                ok = [n for n in nodes if n["gpus"] and all(g.get("sampled_at") for g in n["gpus"])]
                return ok[0] if ok else None

            node = self.until("the node to register and report readings", registered, timeout=60)
        except PhaseError as exc:
            raise Stop(str(exc)) from None
        self.node_name = node["name"]
        self.readings["node"] = node
        self.say(
            f"node {node['name']} ({node['gpu_backend']}): {[g['model'] for g in node['gpus']]}"
        )
        self.start_thread(self.poller, "poller")

    def phase(self, name: str, body: Callable[[dict[str, Any]], None]) -> None:
        record: dict[str, Any] = {}
        self.readings["phases"][name] = record
        if time.time() >= self.phases_end:
            record["error"] = "the run's deadline passed before this phase"
            return
        self.say(f"phase {name}")
        try:
            body(record)
        except PhaseError as exc:
            record["error"] = str(exc)
            self.say(f"phase {name}: {exc}")
        except Stop as exc:
            record["error"] = str(exc)
            raise
        except Exception as exc:  # a bug here must not cost the phases after it
            record["error"] = f"{type(exc).__name__}: {exc}"
            record["traceback"] = traceback.format_exc()
            self.say(f"phase {name} broke: {record['traceback']}")

    def run_job(
        self, record: dict[str, Any], name: str, command: list[str], seconds: float, gpus: int = 1
    ) -> dict[str, Any]:
        """Submit a job and wait for its end (NVML read directly once it is `seconds`/2 in);
        its record gets the id, the job as it ended and its log's tail."""
        job_id = self.submit(name, command, gpus)
        record["job_id"] = job_id
        snapped = False

        def midway(job: dict[str, Any]) -> None:
            nonlocal snapped
            began = judge.timestamp(job.get("started_at"))
            if not snapped and began and time.time() - began > seconds / 2:
                snapped = True
                self.readings["nvml_snapshots"].append(nvml_snapshot(name))

        # Start-up of the program (PyTorch's import, CUDA's context) and of the job.
        record["job"] = self.wait_job(job_id, timeout=seconds + 100, during=midway)
        record["log_tail"] = self.log_tail(job_id)
        record["result"] = result_line(record["log_tail"])
        self.say(f"{name} (job {job_id}): {record['job']['status']}")
        return dict(record["job"])

    def train(self, record: dict[str, Any]) -> None:
        command = self.workload("train", "--seconds", f"{self.train_s:g}")
        job_id = self.run_job(record, "gpu-check-train", command, self.train_s)["id"]
        record["telemetry"] = self.api(f"/api/v1/jobs/{job_id}/telemetry")["points"]
        record["efficiency"] = self.api(f"/api/v1/jobs/{job_id}/efficiency")
        record["seff_text"] = self.gpusched("seff", str(job_id))

    def estimate(self, record: dict[str, Any]) -> None:
        result = (self.readings["phases"].get("train") or {}).get("result")
        if not result:
            raise PhaseError("no result from the training job to estimate")
        shape = result["shape"]
        record["argv"] = [
            "estimate", "--architecture", "gpt", "--transformer",
            ",".join(str(shape[k]) for k in ("layers", "hidden", "heads", "vocab", "seq_len")),
            "--precision", "bf16", "--optimizer", "adam", "--micro-batch", str(result["micro_batch"]),
            "--json",
        ]  # fmt: skip
        record["response"] = json.loads(self.gpusched(*record["argv"]))

    def set_sim_foreign(self, pid: int | None) -> None:
        """Rehearsal: the simulated GPU shows the foreign process while it runs."""
        procs = [{"pid": pid, "util_pct": 95.0, "memory_mb": 2048}] if pid else []
        partial = self.sim_state.with_suffix(".tmp")
        partial.write_text(json.dumps({"foreign": {"0": procs} if procs else {}, "failed": {}}))
        partial.replace(self.sim_state)

    def stop_foreign(self) -> None:
        if self.foreign is None or self.foreign.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.foreign.pid, signal.SIGTERM)
        try:
            self.foreign.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.foreign.pid, signal.SIGKILL)
            self.foreign.wait(10)

    def foreign_load(self, record: dict[str, Any]) -> None:
        log = (self.work / "foreign.log").open("wb")
        self.foreign = subprocess.Popen(
            self.workload("foreign", "--seconds", "150"), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, cwd=self.work,
        )  # fmt: skip
        pid = self.foreign.pid
        record.update(pid=pid, started_at=time.time())
        self.track({pid})
        if self.rehearse:
            self.set_sim_foreign(pid)
        try:
            self.until(
                "the foreign process in the node's readings", lambda: self._foreign_seen(pid), 90
            )
            record["seen_at"] = time.time()
            self.readings["nvml_snapshots"].append(nvml_snapshot("foreign"))
            job_id = self.submit("gpu-check-waits", self.workload("probe", "--seconds", "5"))
            record["job_id"] = job_id
            polls: list[dict[str, Any]] = []
            record["job_polls"] = polls
            submitted = time.time()

            def note(job: dict[str, Any]) -> None:
                keep = ("status", "pending_reason", "pending_message")
                polls.append({k: job.get(k) for k in keep} | {"t": time.time()})

            def held_back() -> bool:
                job = self.job(job_id)
                note(job)
                if job["status"] != "PENDING":
                    return True  # started while foreign load runs: the check fails on it
                seen = any(p["pending_reason"] == judge.FOREIGN_REASON for p in polls)
                return seen and time.time() - submitted >= 4

            with contextlib.suppress(PhaseError):  # judged from the polls, whatever happens
                self.until("the job to wait for the foreign process", held_back, 30)
        finally:
            self.stop_foreign()
            record["stopped_at"] = time.time()
            if self.rehearse:
                self.set_sim_foreign(None)
            log.close()
            record["log_tail"] = (self.work / "foreign.log").read_text(errors="replace")[-2000:]
        self.say(f"foreign process {pid} stopped")
        record["job"] = self.wait_job(job_id, timeout=STABILITY_WINDOW_S + 60, during=note)
        self.say(f"job {job_id} after the foreign process: {record['job']['status']}")

    def _foreign_seen(self, pid: int) -> bool:
        polls = self.readings["polls"]
        if not polls or "gpus" not in polls[-1]:
            return False
        return any(
            any(p.get("pid") == pid and p.get("job_id") is None for p in g.get("processes", []))
            and (g.get("foreign_util_pct") or 0) >= FOREIGN_UTIL_THRESHOLD_PCT
            for g in polls[-1]["gpus"]
        )

    def torchrun(self, record: dict[str, Any]) -> None:
        worker = [str(WORKLOADS), "worker", "--seconds", f"{self.worker_s:g}"]
        if self.rehearse:
            command = [self.torch_python, str(WORKLOADS), "fake-torchrun", "--nproc", "2",
                       *worker, "--fake"]  # fmt: skip
        else:
            command = [self.torch_python, "-m", "torch.distributed.run", "--standalone",
                       "--nproc_per_node", "2", *worker]  # fmt: skip
        self.run_job(record, "gpu-check-torchrun", command, self.worker_s)

    def isolation(self, record: dict[str, Any]) -> None:
        node = next(n for n in self.api("/api/v1/nodes") if n["name"] == self.node_name)
        record["reported"] = judge.reported_isolation(node)
        if judge.fences_devices(record["reported"]):
            self.run_job(record, "gpu-check-isolation", self.workload("open-gpus"), 0, gpus=0)

    # -- the end -------------------------------------------------------------------------

    def cleanup(self) -> None:
        """Stop all we started: the foreign loop, the stack (as Ctrl-C: jobs get their grace),
        the samplers; then kill whatever of ours is still there."""
        self.say("stopping")
        self.stop_foreign()
        if self.up is not None:
            self.track(process_tree({self.up.pid}))
            if self.up.poll() is None:
                self.up.send_signal(signal.SIGINT)
                try:
                    self.up.wait(STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    self.say("gpusched up did not stop in time: killing it")
        self.stopping.set()
        if self.smi_loop is not None:
            self.smi_loop.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.smi_loop.wait(5)
        for thread in self.threads:
            thread.join(timeout=15)
        left = self.alive()
        self.readings["stop_leftovers"] = left
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for proc in (self.up, self.foreign):
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
        time.sleep(0.5)
        self.readings["leftover_pids"] = self.alive()
        if not self.readings["leftover_pids"]:
            (self.work / "pids").unlink(missing_ok=True)
        cap_file(self.out / "stack.log", STACK_LOG_CAP)

    def alive(self) -> list[int]:
        return sorted(pid for pid, start in self.tracked.items() if proc_start_time(pid) == start)

    def run(self) -> int:
        def on_signal(signum: int, _frame: Any) -> None:
            self.stopping.set()
            raise Stop(f"stopped by {signal.Signals(signum).name}")

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.out.mkdir(parents=True, exist_ok=True)
        self.say(f"driver pid {os.getpid()}, work in {self.work}")
        try:
            self.identify()
            if not self.rehearse and not self.readings["smi"]["gpus"]:
                raise Stop(f"no NVIDIA GPU: {self.readings['smi']['error']}")
            self.start_stack()
            self.phase("train", self.train)
            self.phase("estimate", self.estimate)
            self.phase("foreign", self.foreign_load)
            self.phase("torchrun", self.torchrun)
            self.phase("isolation", self.isolation)
        except Stop as exc:
            self.readings["error"] = str(exc)
            self.say(f"stopped: {exc}")
        except Exception as exc:
            self.readings["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
            self.say(f"broke: {self.readings['error']}")
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                self.cleanup()
            finally:
                self.readings["finished_at"] = time.time()
                code = write_outputs(self.out, self.readings, show=True)
        return code


def write_outputs(out: Path, readings: dict[str, Any], *, show: bool = False) -> int:
    out.mkdir(parents=True, exist_ok=True)
    checks = judge.evaluate(readings)
    (out / "readings.json").write_text(json.dumps(readings, indent=1, sort_keys=True, default=str))
    report = judge.render_report(readings, checks)
    (out / "report.md").write_text(report)
    if show:
        print(report, flush=True)
    return judge.exit_code(readings, checks)


# -- commands ------------------------------------------------------------------------------


def preflight(args: argparse.Namespace) -> int:
    if shutil.which("nvidia-smi") is None:
        reason = "nvidia-smi is not installed (no NVIDIA driver on this machine)"
    else:
        gpus, error = smi_gpus()
        if gpus:
            print(f"gpu-check: {len(gpus)} NVIDIA GPU(s): {', '.join(g['name'] for g in gpus)}")
            return judge.EXIT_OK
        reason = error or "nvidia-smi lists no GPU"
    print(f"gpu-check: no NVIDIA GPU here: {reason}; nothing checked", file=sys.stderr)
    readings = {"mode": "no-gpu", "reason": reason, "host": socket.gethostname(),
                "started_at": args.started_at or time.time(), "finished_at": time.time()}  # fmt: skip
    write_outputs(args.out, readings)
    return judge.EXIT_NO_GPU


def abort(args: argparse.Namespace) -> int:
    readings = {"mode": args.mode, "reason": args.reason, "host": socket.gethostname(),
                "started_at": args.started_at or time.time(), "finished_at": time.time()}  # fmt: skip
    return write_outputs(args.out, readings)


def evaluate(args: argparse.Namespace) -> int:
    readings = json.loads(args.readings.read_text())
    if args.out is not None:
        return write_outputs(args.out, readings, show=True)
    checks = judge.evaluate(readings)
    print(judge.render_report(readings, checks))
    return judge.exit_code(readings, checks)


def summarize(args: argparse.Namespace) -> int:
    checks = judge.parse_report(args.report.read_text())
    tally = judge.counts(checks)
    print(", ".join(f"{n} {result}" for result, n in tally.items()))
    for check in checks:
        if check.result != judge.PASS:
            print(f"{check.result}: {check.name}: {check.seen}")
    return judge.EXIT_FAILED if tally[judge.FAIL] else judge.EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("preflight", "abort", "run"):
        one = sub.add_parser(name)
        one.add_argument("--out", type=Path, required=True)
        one.add_argument("--started-at", type=float, help="when the script started (Unix s)")
    sub.choices["abort"].add_argument("--reason", required=True)
    sub.choices["abort"].add_argument("--mode", choices=("setup-failed", "aborted"), required=True)
    run = sub.choices["run"]
    run.add_argument("--work", type=Path, required=True, help="scratch folder (data dir, logs)")
    run.add_argument("--torch-python", default=sys.executable, help="the Python with PyTorch")
    run.add_argument("--rehearse", action="store_true", help="simulated GPUs, CPU stand-ins")
    run.add_argument("--train-s", type=float, default=60.0)
    run.add_argument("--worker-s", type=float, default=20.0)
    again = sub.add_parser("evaluate")
    again.add_argument("readings", type=Path)
    again.add_argument("--out", type=Path)
    summary = sub.add_parser("summarize")
    summary.add_argument("report", type=Path)
    args = parser.parse_args(argv)
    if args.command == "run":
        return GpuCheckRun(args).run()
    return {"preflight": preflight, "abort": abort, "evaluate": evaluate, "summarize": summarize}[
        args.command
    ](args)


if __name__ == "__main__":
    sys.exit(main())
