"""Fences around a job: every process an attempt starts is found, counted and stopped by
what the attempt is, never by what its processes say about themselves (their environment,
their process group, which any job can change).

One small interface, three implementations, chosen when the agent starts by what the host
offers (:func:`choose_fence`):

- **cgroup v2** (the unified hierarchy mounted at /sys/fs/cgroup): one cgroup per
  attempt; `cgroup.kill` stops all of it at once; CPU time from `cpu.stat`, peak memory
  from `memory.peak` (when the memory controller is enabled for it); GPU device files
  fenced by a BPF device program attached to the cgroup.
- **cgroup v1** (the freezer or pids hierarchy, with memory, cpuacct and devices when
  mounted): one cgroup per attempt in each; frozen, then killed, so nothing forks away
  meanwhile; CPU time from `cpuacct.usage`, peak memory from `memory.max_usage_in_bytes`;
  the other GPUs' device files denied in `devices.deny` (Slurm's ConstrainDevices).
- **subreaper only**: the attempt's supervisor (workers/agent/supervisor.py) is the child
  subreaper of everything the job starts, so the job is the supervisor's descendants; no
  device fence (CUDA_VISIBLE_DEVICES only) and CPU time and peak RSS from getrusage.

Every attempt's group is named by installation + node + job + attempt
(``gpusched.<installation>.<node>.<job>.<attempt>``), each under the agent's own cgroup:
two installations, or two agents of one, never see each other's groups, and an agent that
restarts finds exactly its own attempts' leftovers (:meth:`Fence.find`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import logging
import os
import platform
import re
import signal
import stat
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

logger = logging.getLogger(__name__)

Isolation = Literal["cgroup v2", "cgroup v1", "subreaper only"]
# What GPUSCHED_AGENT_ISOLATION may ask for; auto: the strongest the host has.
IsolationChoice = Literal["auto", "cgroup-v2", "cgroup-v1", "subreaper"]
PREFIX = "gpusched"
SUPERVISOR_MARKER = "gpusched-supervisor"  # argv[1] of workers/agent/supervisor.py
_INSTALLATION = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_NODE_SAFE = re.compile(r"[A-Za-z0-9_-]")
_KILL_POLL_S = 0.02
# PROC_PID_INIT_INO: the inode of the initial PID namespace (the host's).
_HOST_PID_NS_INODE = 0xEFFFFFFC


class FenceError(RuntimeError):
    """The fence cannot be set up for an attempt (the message says why)."""


@dataclass(frozen=True, slots=True)
class GroupKey:
    installation: str
    node: str
    job_id: int
    attempt: int

    def __post_init__(self) -> None:
        if not _INSTALLATION.match(self.installation):
            raise ValueError(f"installation id {self.installation!r}: 1-64 of A-Z a-z 0-9 _ -")

    @property
    def name(self) -> str:
        return f"{node_prefix(self.installation, self.node)}{self.job_id}.{self.attempt}"


def node_prefix(installation: str, node: str) -> str:
    """The start of the group names of one agent's attempts. The node name is escaped so
    that '.' only ever separates fields (a long one is hashed: a cgroup name is at most
    255 bytes)."""
    part = "".join(c if _NODE_SAFE.match(c) else f"%{ord(c):02x}" for c in node)
    if len(part) > 100:
        part = "h" + hashlib.sha256(node.encode()).hexdigest()[:32]
    return f"{PREFIX}.{installation}.{part}."


def _parse_name(name: str, prefix: str) -> tuple[int, int] | None:
    if not name.startswith(prefix):
        return None
    rest = name[len(prefix) :].split(".")
    if len(rest) != 2 or not all(p.isdigit() for p in rest):
        return None
    return int(rest[0]), int(rest[1])


@dataclass(frozen=True, slots=True)
class Usage:
    """What an attempt consumed on its host, as the fence measured it; None: unknown."""

    cpu_s: float | None = None
    memory_peak_mb: int | None = None


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """A GPU's device file on the host (/dev/nvidia<minor>)."""

    path: str
    major: int
    minor: int


GPU_DEVICE = re.compile(r"^nvidia(\d+)$")


def host_gpu_devices(dev: str | Path = "/dev") -> tuple[GpuDevice, ...]:
    """The GPUs' character devices on this host (not nvidiactl, nvidia-uvm, nvidia-caps:
    every CUDA process needs those, whichever GPU it uses)."""
    found = []
    with contextlib.suppress(OSError):
        for entry in sorted(os.listdir(dev)):
            if not GPU_DEVICE.match(entry):
                continue
            path = os.path.join(dev, entry)
            try:
                info = os.stat(path)
            except OSError:
                continue
            if stat.S_ISCHR(info.st_mode):
                found.append(GpuDevice(path, os.major(info.st_rdev), os.minor(info.st_rdev)))
    return tuple(found)


def denied_devices(
    devices: Iterable[GpuDevice], allowed_minors: Iterable[int]
) -> tuple[GpuDevice, ...]:
    """The GPU device files a job given `allowed_minors` must not open: all the others."""
    allowed = set(allowed_minors)
    return tuple(d for d in devices if d.minor not in allowed)


# -- the interface ----------------------------------------------------------------------


class JobGroup:
    """Every process of one attempt."""

    def __init__(self, key: GroupKey) -> None:
        self.key = key

    def join_files(self) -> tuple[str, ...]:
        """The procs files the attempt's first process writes itself into before it runs
        the job (cgroups); empty when the supervisor alone holds the job."""
        return ()

    def bind(self, supervisor_pid: int) -> None:
        """The attempt's supervisor, once started (the subreaper fence's group is its
        descendants)."""

    def pids(self) -> set[int]:
        """The attempt's live processes (zombies hold nothing and do not count)."""
        raise NotImplementedError

    def alive(self) -> bool:
        return bool(self.pids())

    def signal(self, sig: signal.Signals) -> None:
        # Oldest first, so that a job's main process (its parent) has the signal pending
        # before its children die of it: a shell waiting on a child that dies first ends
        # with status 0 before it ever runs its TERM trap.
        for pid in sorted(self.pids()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def kill(self, timeout_s: float = 5.0) -> bool:
        """SIGKILL every process until none is left; False if some survived `timeout_s`
        (uninterruptible sleep)."""
        deadline = time.monotonic() + timeout_s
        while self.alive():
            if time.monotonic() >= deadline:
                return False
            self.signal(signal.SIGKILL)
            time.sleep(_KILL_POLL_S)
        return True

    def usage(self) -> Usage:
        return Usage()

    def remove(self) -> None:
        """Forget the group once its processes are gone (a cgroup is removed)."""


class Fence(ABC):
    isolation: Isolation

    def __init__(self, installation: str, node: str) -> None:
        self.installation = installation
        self.node = node
        self.prefix = node_prefix(installation, node)

    def key(self, job_id: int, attempt: int) -> GroupKey:
        return GroupKey(self.installation, self.node, job_id, attempt)

    @abstractmethod
    def create(self, job_id: int, attempt: int, *, denied: tuple[GpuDevice, ...] = ()) -> JobGroup:
        """A new, empty group for an attempt; `denied`: GPU device files it may not open
        (where the fence can enforce it)."""

    @abstractmethod
    def open(self, job_id: int, attempt: int, supervisor_pid: int | None = None) -> JobGroup:
        """The group of an attempt started earlier (by this agent, or one before it)."""

    @abstractmethod
    def find(self) -> list[JobGroup]:
        """Every group of this installation's node that exists now: a restarted agent's
        leftovers, the watchdog's targets."""

    @property
    def fences_devices(self) -> bool:
        return False


# -- helpers ------------------------------------------------------------------------------


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _procs(path: Path) -> set[int]:
    text = _read(path / "cgroup.procs")
    return {int(p) for p in text.split()} if text else set()


def _rmdir(path: Path, timeout_s: float = 2.0) -> None:
    # A cgroup whose last process has just exited may still be busy for a moment.
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() >= deadline:
                logger.warning("cannot remove cgroup %s: %s", path, exc.strerror)
                return
            time.sleep(_KILL_POLL_S)


@dataclass(frozen=True, slots=True)
class _Mount:
    point: Path
    root: str  # the part of the hierarchy mounted there (a container sees its own)
    fstype: str
    options: frozenset[str]


def _mounts(mountinfo: str) -> list[_Mount]:
    found = []
    for line in mountinfo.splitlines():
        pre, sep, post = line.partition(" - ")
        fields, rest = pre.split(), post.split()
        if not sep or len(fields) < 5 or len(rest) < 3:
            continue
        if rest[0] in ("cgroup", "cgroup2"):
            point = fields[4].replace("\\040", " ")
            found.append(_Mount(Path(point), fields[3], rest[0], frozenset(rest[2].split(","))))
    return found


def _own_cgroups(text: str) -> dict[str, str]:
    """controller (or "" for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    own = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                own[controller] = parts[2]
    return own


def _under(mount: _Mount, path: str) -> Path | None:
    root = mount.root.rstrip("/")
    if root and not (path == root or path.startswith(root + "/")):
        return None  # our cgroup is outside what this mount shows
    return mount.point / path[len(root) :].lstrip("/")


@dataclass(frozen=True, slots=True)
class CgroupDirs:
    """This process's own cgroup directories."""

    unified: Path | None  # in the cgroup v2 hierarchy, wherever it is mounted
    # Whether that hierarchy is the host's (mounted at /sys/fs/cgroup, its controllers
    # there), not the empty one a hybrid host mounts beside its v1 hierarchies.
    unified_is_host: bool
    v1: dict[str, Path]  # controller -> directory, in each v1 hierarchy


def own_cgroup_dirs(mountinfo: str | None = None, self_cgroup: str | None = None) -> CgroupDirs:
    """Where this process's cgroups are (from /proc/self/mountinfo and /proc/self/cgroup,
    or the texts given)."""
    mountinfo = _read(Path("/proc/self/mountinfo")) or "" if mountinfo is None else mountinfo
    self_cgroup = _read(Path("/proc/self/cgroup")) or "" if self_cgroup is None else self_cgroup
    own = _own_cgroups(self_cgroup)
    unified: Path | None = None
    host = False
    v1: dict[str, Path] = {}
    for mount in _mounts(mountinfo):
        if mount.fstype == "cgroup2":
            if "" in own and (unified is None or mount.point == Path("/sys/fs/cgroup")):
                unified = _under(mount, own[""])
                host = mount.point == Path("/sys/fs/cgroup")
            continue
        for controller in ("freezer", "pids", "memory", "cpuacct", "devices"):
            if controller in mount.options and controller in own and controller not in v1:
                where = _under(mount, own[controller])
                if where is not None:
                    v1[controller] = where
    return CgroupDirs(unified, host, v1)


def _probe(parent: Path, name: str) -> bool:
    """Whether we may create (and remove) a cgroup under `parent`."""
    probe = parent / name
    try:
        probe.mkdir()
    except FileExistsError:
        pass
    except OSError:
        return False
    with contextlib.suppress(OSError):
        probe.rmdir()
    return True


# -- cgroup v1 ----------------------------------------------------------------------------


class _CgroupV1Group(JobGroup):
    def __init__(self, key: GroupKey, dirs: Mapping[str, Path]) -> None:
        super().__init__(key)
        self.dirs = dict(dirs)
        self.members = self.dirs.get("freezer") or self.dirs["pids"]

    def join_files(self) -> tuple[str, ...]:
        return tuple(str(d / "cgroup.procs") for d in self.dirs.values())

    def pids(self) -> set[int]:
        return _procs(self.members)

    def kill(self, timeout_s: float = 5.0) -> bool:
        # Frozen first, so that no process forks a child we would not see.
        freezer = self.dirs.get("freezer")
        deadline = time.monotonic() + timeout_s
        while self.alive():
            if time.monotonic() >= deadline:
                return False
            frozen = freezer is not None and self._set_frozen(freezer, True, deadline)
            self.signal(signal.SIGKILL)
            if freezer is not None:
                self._set_frozen(freezer, False, deadline)
            if not frozen:
                time.sleep(_KILL_POLL_S)
        return True

    @staticmethod
    def _set_frozen(freezer: Path, frozen: bool, deadline: float) -> bool:
        state = "FROZEN" if frozen else "THAWED"
        try:
            _write(freezer / "freezer.state", state)
        except OSError:
            return False
        # A process in uninterruptible sleep holds the cgroup FREEZING: not for long.
        limit = min(deadline, time.monotonic() + 1.0)
        while (_read(freezer / "freezer.state") or "").strip() != state:
            if time.monotonic() >= limit:
                return False
            time.sleep(0.005)
        return True

    def usage(self) -> Usage:
        cpu = _read(self.dirs["cpuacct"] / "cpuacct.usage") if "cpuacct" in self.dirs else None
        peak = (
            _read(self.dirs["memory"] / "memory.max_usage_in_bytes")
            if "memory" in self.dirs
            else None
        )
        return Usage(
            cpu_s=int(cpu) / 1e9 if cpu and cpu.strip().isdigit() else None,
            memory_peak_mb=int(peak) // (1024 * 1024) if peak and peak.strip().isdigit() else None,
        )

    def remove(self) -> None:
        for path in self.dirs.values():
            _rmdir(path)


class CgroupV1Fence(Fence):
    """The attempt's cgroup in each v1 hierarchy the host mounts (freezer or pids for the
    processes; memory, cpuacct, devices when there)."""

    isolation: Isolation = "cgroup v1"

    def __init__(self, installation: str, node: str, roots: Mapping[str, Path]) -> None:
        super().__init__(installation, node)
        if "freezer" not in roots and "pids" not in roots:
            raise FenceError("cgroup v1 needs the freezer or the pids hierarchy")
        self.roots = dict(roots)

    @property
    def fences_devices(self) -> bool:
        return "devices" in self.roots

    def _dirs(self, name: str) -> dict[str, Path]:
        return {controller: root / name for controller, root in self.roots.items()}

    def create(self, job_id: int, attempt: int, *, denied: tuple[GpuDevice, ...] = ()) -> JobGroup:
        key = self.key(job_id, attempt)
        dirs = self._dirs(key.name)
        made = []
        try:
            for path in dirs.values():
                path.mkdir(exist_ok=True)
                made.append(path)
            if "devices" in dirs:
                # Everything else stays as the node allows it (/dev/null, ttys ...): only
                # the other GPUs are taken away, as Slurm's ConstrainDevices does.
                for device in denied:
                    _write(dirs["devices"] / "devices.deny", f"c {device.major}:{device.minor} rwm")
        except OSError as exc:
            for path in made:
                _rmdir(path)
            raise FenceError(f"cannot create cgroup {key.name}: {exc.strerror}") from exc
        return _CgroupV1Group(key, dirs)

    def open(self, job_id: int, attempt: int, supervisor_pid: int | None = None) -> JobGroup:
        key = self.key(job_id, attempt)
        return _CgroupV1Group(key, self._dirs(key.name))

    def find(self) -> list[JobGroup]:
        found: dict[tuple[int, int], None] = {}
        for root in self.roots.values():
            with contextlib.suppress(OSError):
                for entry in os.listdir(root):
                    parsed = _parse_name(entry, self.prefix)
                    if parsed is not None:
                        found[parsed] = None
        return [self.open(job, attempt) for job, attempt in sorted(found)]


# -- cgroup v2 ----------------------------------------------------------------------------


class _CgroupV2Group(JobGroup):
    def __init__(self, key: GroupKey, path: Path) -> None:
        super().__init__(key)
        self.path = path

    def join_files(self) -> tuple[str, ...]:
        return (str(self.path / "cgroup.procs"),)

    def pids(self) -> set[int]:
        return _procs(self.path)

    def kill(self, timeout_s: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.alive():
            if time.monotonic() >= deadline:
                return False
            try:
                _write(self.path / "cgroup.kill", "1")  # every process, forks included
            except OSError:  # before Linux 5.14
                self.signal(signal.SIGKILL)
            time.sleep(_KILL_POLL_S)
        return True

    def usage(self) -> Usage:
        cpu = None
        for line in (_read(self.path / "cpu.stat") or "").splitlines():
            name, _, value = line.partition(" ")
            if name == "usage_usec" and value.strip().isdigit():
                cpu = int(value) / 1e6
        peak = _read(self.path / "memory.peak")
        return Usage(
            cpu_s=cpu,
            memory_peak_mb=int(peak) // (1024 * 1024) if peak and peak.strip().isdigit() else None,
        )

    def remove(self) -> None:
        _rmdir(self.path)


class CgroupV2Fence(Fence):
    """The attempt's cgroup under the agent's own in the unified hierarchy."""

    isolation: Isolation = "cgroup v2"

    def __init__(self, installation: str, node: str, root: Path) -> None:
        super().__init__(installation, node)
        self.root = root
        # Memory and pids accounting for the attempts' cgroups, where the agent's own cgroup
        # may hand them down (not while it holds processes itself, cgroup v2's rule):
        # without them CPU time is still counted, peak memory is not.
        available = set((_read(root / "cgroup.controllers") or "").split())
        wanted = [c for c in ("memory", "pids", "cpu") if c in available]
        if wanted:
            with contextlib.suppress(OSError):
                _write(root / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))
        self._devices = _bpf_available()

    @property
    def fences_devices(self) -> bool:
        return self._devices

    def create(self, job_id: int, attempt: int, *, denied: tuple[GpuDevice, ...] = ()) -> JobGroup:
        key = self.key(job_id, attempt)
        path = self.root / key.name
        try:
            path.mkdir(exist_ok=True)
        except OSError as exc:
            raise FenceError(f"cannot create cgroup {path}: {exc.strerror}") from exc
        if denied and self._devices:
            try:
                attach_device_filter(path, [(d.major, d.minor) for d in denied])
            except OSError as exc:
                _rmdir(path)
                raise FenceError(f"cannot fence the GPU devices of {path}: {exc}") from exc
        return _CgroupV2Group(key, path)

    def open(self, job_id: int, attempt: int, supervisor_pid: int | None = None) -> JobGroup:
        key = self.key(job_id, attempt)
        return _CgroupV2Group(key, self.root / key.name)

    def find(self) -> list[JobGroup]:
        found = []
        with contextlib.suppress(OSError):
            for entry in sorted(os.listdir(self.root)):
                parsed = _parse_name(entry, self.prefix)
                if parsed is not None:
                    found.append(self.open(*parsed))
        return found


# A BPF_PROG_TYPE_CGROUP_DEVICE program: cgroup v2 has no devices controller; runc and
# systemd fence devices the same way.
_BPF_PROG_LOAD, _BPF_PROG_ATTACH = 5, 8
_BPF_PROG_TYPE_CGROUP_DEVICE = 15
_BPF_CGROUP_DEVICE = 6
_BPF_F_ALLOW_MULTI = 2
_BPF_DEVCG_DEV_CHAR = 2
_SYS_BPF = {"x86_64": 321, "aarch64": 280}


def device_filter_program(denied: Iterable[tuple[int, int]]) -> bytes:
    """Instructions that refuse the character devices `denied` (major, minor) and allow
    every other device: 0 denies, 1 allows."""

    def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
        return (
            bytes([code, (src << 4) | dst])
            + off.to_bytes(2, "little", signed=True)
            + (imm.to_bytes(4, "little", signed=True))
        )

    pairs = list(denied)
    n = len(pairs)
    ldx_w, and_k, jne_k, jeq_k, mov_k, exit_ = 0x61, 0x57, 0x55, 0x15, 0xB7, 0x95
    if not pairs:  # the verifier refuses unreachable code: allow everything, plainly
        return insn(mov_k, dst=0, imm=1) + insn(exit_)
    prog = [
        insn(ldx_w, dst=2, src=1, off=0),  # r2 = ctx->access_type
        insn(and_k, dst=2, imm=0xFFFF),  # its low half: the device type
        insn(ldx_w, dst=3, src=1, off=4),  # r3 = ctx->major
        insn(ldx_w, dst=4, src=1, off=8),  # r4 = ctx->minor
        insn(jne_k, dst=2, off=2 * n, imm=_BPF_DEVCG_DEV_CHAR),  # not a char device: allow
    ]
    for k, (major, minor) in enumerate(pairs):
        prog.append(insn(jne_k, dst=3, off=1, imm=major))
        prog.append(insn(jeq_k, dst=4, off=2 * n - 2 * k, imm=minor))  # to "deny"
    prog += [insn(mov_k, dst=0, imm=1), insn(exit_), insn(mov_k, dst=0, imm=0), insn(exit_)]
    return b"".join(prog)


class _ProgLoad(ctypes.Structure):
    _fields_ = [
        ("prog_type", ctypes.c_uint32),
        ("insn_cnt", ctypes.c_uint32),
        ("insns", ctypes.c_uint64),
        ("license", ctypes.c_uint64),
        ("log_level", ctypes.c_uint32),
        ("log_size", ctypes.c_uint32),
        ("log_buf", ctypes.c_uint64),
        ("kern_version", ctypes.c_uint32),
        ("prog_flags", ctypes.c_uint32),
        ("pad", ctypes.c_byte * 80),
    ]


class _ProgAttach(ctypes.Structure):
    _fields_ = [
        ("target_fd", ctypes.c_uint32),
        ("attach_bpf_fd", ctypes.c_uint32),
        ("attach_type", ctypes.c_uint32),
        ("attach_flags", ctypes.c_uint32),
        ("pad", ctypes.c_byte * 112),
    ]


def _bpf(command: int, attr: ctypes.Structure) -> int:
    number = _SYS_BPF.get(platform.machine())
    if number is None:
        raise OSError(errno.ENOSYS, f"bpf() on {platform.machine()} is not known here")
    libc = ctypes.CDLL(None, use_errno=True)
    result: int = libc.syscall(number, command, ctypes.byref(attr), ctypes.sizeof(attr))
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return result


def _load_device_program(denied: Iterable[tuple[int, int]]) -> int:
    code = device_filter_program(denied)
    insns = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"GPL")
    load = _ProgLoad(
        prog_type=_BPF_PROG_TYPE_CGROUP_DEVICE,
        insn_cnt=len(code) // 8,
        insns=ctypes.addressof(insns),
        license=ctypes.addressof(license_),
    )
    return _bpf(_BPF_PROG_LOAD, load)


def attach_device_filter(cgroup: Path, denied: Iterable[tuple[int, int]]) -> None:
    """Attach a device program denying `denied` to a v2 cgroup; it goes with the cgroup."""
    prog_fd = _load_device_program(denied)
    try:
        cgroup_fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
        try:
            attach = _ProgAttach(
                target_fd=cgroup_fd,
                attach_bpf_fd=prog_fd,
                attach_type=_BPF_CGROUP_DEVICE,
                attach_flags=_BPF_F_ALLOW_MULTI,
            )
            _bpf(_BPF_PROG_ATTACH, attach)
        finally:
            os.close(cgroup_fd)
    finally:
        os.close(prog_fd)


def _bpf_available() -> bool:
    try:
        os.close(_load_device_program([]))
    except OSError as exc:
        logger.info("no BPF device programs here (%s): GPU device files are not fenced", exc)
        return False
    return True


# -- subreaper only ---------------------------------------------------------------------


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()
    if len(fields) < 2:
        return None
    return fields[0].decode(), int(fields[1])


def _all_pids() -> list[int]:
    try:
        return [int(e) for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []


def descendants(root: int) -> set[int]:
    """Live descendants of `root` (not `root` itself), from one pass over /proc."""
    children: dict[int, list[int]] = {}
    for pid in _all_pids():
        info = _stat(pid)
        if info is not None and info[0] not in ("Z", "X"):
            children.setdefault(info[1], []).append(pid)
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return [p.decode(errors="replace") for p in handle.read().split(b"\0")]
    except OSError:
        return []


def supervisor_identity(pid: int) -> tuple[str, str, int, int] | None:
    """(installation, node, job, attempt) of a supervisor process running as our own user;
    None for anything else (a process of a job's that copies the command line is not
    believed: it is not ours)."""
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.geteuid():
            return None
    except OSError:
        return None
    argv = _cmdline(pid)
    if SUPERVISOR_MARKER not in argv:
        return None
    at = argv.index(SUPERVISOR_MARKER)
    fields = argv[at + 1 : at + 5]
    if len(fields) != 4 or not fields[2].isdigit() or not fields[3].isdigit():
        return None
    return fields[0], fields[1], int(fields[2]), int(fields[3])


class _SubreaperGroup(JobGroup):
    def __init__(self, key: GroupKey, supervisor_pid: int | None = None) -> None:
        super().__init__(key)
        self.supervisor_pid = supervisor_pid

    def bind(self, supervisor_pid: int) -> None:
        self.supervisor_pid = supervisor_pid

    def pids(self) -> set[int]:
        if self.supervisor_pid is None:
            return set()
        # A pid reused by another process after the supervisor left has other descendants.
        who = supervisor_identity(self.supervisor_pid)
        if who != (self.key.installation, self.key.node, self.key.job_id, self.key.attempt):
            return set()
        return descendants(self.supervisor_pid)


class SubreaperFence(Fence):
    """The attempt's supervisor is its processes' child subreaper; nothing else."""

    isolation: Isolation = "subreaper only"

    def create(self, job_id: int, attempt: int, *, denied: tuple[GpuDevice, ...] = ()) -> JobGroup:
        return _SubreaperGroup(self.key(job_id, attempt))

    def open(self, job_id: int, attempt: int, supervisor_pid: int | None = None) -> JobGroup:
        return _SubreaperGroup(self.key(job_id, attempt), supervisor_pid)

    def find(self) -> list[JobGroup]:
        found = []
        for pid in sorted(_all_pids()):
            who = supervisor_identity(pid)
            if who is not None and who[:2] == (self.installation, self.node):
                found.append(self.open(who[2], who[3], pid))
        return found


# -- choosing ---------------------------------------------------------------------------


def choose_fence(installation: str, node: str, choice: IsolationChoice = "auto") -> Fence:
    """The strongest fence this host gives this process (cgroup v2 where the host's
    controllers are in it, then v1, then the subreaper), or the one asked for (FenceError
    if the host does not have it; cgroup-v2 also takes the empty v2 hierarchy a hybrid
    host mounts beside v1: processes, kill, CPU time and devices, no memory figures)."""
    GroupKey(installation, node, 0, 0)  # validates the id early
    dirs = own_cgroup_dirs()
    probe = f"{PREFIX}.probe.{os.getpid()}"
    unified = dirs.unified
    wants_v2 = choice == "cgroup-v2" or (choice == "auto" and dirs.unified_is_host)
    if wants_v2 and unified is not None and _probe(unified, probe):
        return CgroupV2Fence(installation, node, unified)
    if choice == "cgroup-v2":
        raise FenceError("no writable cgroup v2 hierarchy for this agent")
    usable = {c: p for c, p in dirs.v1.items() if _probe(p, probe)}
    if choice in ("auto", "cgroup-v1") and ("freezer" in usable or "pids" in usable):
        return CgroupV1Fence(installation, node, usable)
    if choice == "cgroup-v1":
        raise FenceError("no writable cgroup v1 freezer or pids hierarchy for this agent")
    return SubreaperFence(installation, node)


def open_fence(installation: str, node: str, isolation: Isolation) -> Fence:
    """The fence an agent chose, rebuilt by another process of it (the watchdog)."""
    choice: IsolationChoice = {
        "cgroup v2": "cgroup-v2",
        "cgroup v1": "cgroup-v1",
        "subreaper only": "subreaper",
    }[isolation]  # type: ignore[assignment]
    return choose_fence(installation, node, choice)


def in_host_pid_namespace() -> bool:
    try:
        return os.stat("/proc/self/ns/pid").st_ino == _HOST_PID_NS_INODE
    except OSError:
        return True  # no namespaces to tell (not Linux)


def host_pid_namespace_problem(
    backend: str,
    *,
    local_pids: Callable[[], bool | None] | None = None,
    in_host: bool | None = None,
) -> str | None:
    """Why an agent cannot tell its jobs' GPU processes from foreign ones here, or None.

    NVML names each GPU process by a PID. In the host's PID namespace that is the agent's
    view; in a PID namespace of its own (a container without --pid=host) older drivers
    still report host PIDs (NVIDIA/nvidia-docker#1483), which would be matched against the
    wrong processes, while recent ones translate them. So there the agent asks the driver
    (`local_pids`: does NVML list its own CUDA context under its own PID?) and refuses to
    start unless it does. Simulated GPUs report the agent's own PIDs."""
    if backend != "nvml" or (in_host_pid_namespace() if in_host is None else in_host):
        return None
    answer = local_pids() if local_pids is not None else None
    if answer:
        return None
    why = (
        "NVML reports GPU processes by their host PIDs here"
        if answer is False
        else "it cannot tell whether NVML reports this namespace's PIDs (no CUDA context "
        "could be opened to ask)"
    )
    return (
        f"this agent runs in a PID namespace of its own (a container without the host's "
        f"PID namespace), and {why}: its jobs' GPU processes could not be told from "
        "foreign ones. Run the agent with the host's PID namespace (docker run --pid=host; "
        "in docker-compose, pid: host)"
    )
