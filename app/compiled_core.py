"""The scheduling core compiled with mypyc, used only while it matches the source.

`app/scheduling` is pure, fully typed Python: the live scheduler, the trace
simulator and the tests all run it. mypyc (part of mypy) compiles such code to a
C extension that runs the same logic about twice as fast, which is what a
10,000-job cycle needs to stay within its budget (`bench/cycle.py`).

`python -m app.compile_core` (run by `make native`) compiles the package's modules
into `build/native/<digest>/`, where the digest covers every source file of the
package and the interpreter. At import, `app/__init__.py` calls `use_compiled()`:
when a build for the current digest exists, a finder loads `app.scheduling`'s
modules from it; otherwise nothing changes and the source runs. So an edited
source never runs stale compiled code (it runs as plain Python until the next
build), a machine without a C compiler simply runs the source, and so does one whose
build is damaged (with a warning).
`GPUSCHED_NATIVE=0` turns the compiled modules off.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

PACKAGE = "app.scheduling"
SOURCE_DIR = Path(__file__).resolve().parent / "scheduling"
BUILD_ROOT = Path(__file__).resolve().parents[1] / "build" / "native"
# The mypyc runtime and all compiled code live in one shared library of this name.
GROUP = "gpusched_scheduling"
_LIBRARY = f"{GROUP}__mypyc"
MANIFEST = "modules.txt"
_SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def sources() -> list[Path]:
    """The package's modules that are compiled: all but its `__init__` (which only
    re-exports, and runs as source so that the package itself is always importable)."""
    return sorted(p for p in SOURCE_DIR.rglob("*.py") if p != SOURCE_DIR / "__init__.py")


def source_digest() -> str:
    h = hashlib.sha256(sys.implementation.cache_tag.encode())
    for path in sorted(SOURCE_DIR.rglob("*.py")):
        h.update(path.relative_to(SOURCE_DIR).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:24]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SOURCE_DIR).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


class _CompiledFinder(importlib.abc.MetaPathFinder):
    """Finds the compiled build's modules (and its shared library), nothing else."""

    def __init__(self, root: Path, modules: frozenset[str]) -> None:
        self.root = root
        self.modules = modules
        self.loaded = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname == _LIBRARY:
            return importlib.util.spec_from_file_location(
                fullname, self.root / (_LIBRARY + _SUFFIX)
            )
        if fullname not in self.modules:
            return None
        if not self.loaded and not self._load_library():
            return None  # the source, from now on
        where = self.root.joinpath(*fullname.split("."))
        if where.is_dir():  # a subpackage: its __init__, and its modules found here too
            return importlib.util.spec_from_file_location(
                fullname, where / ("__init__" + _SUFFIX), submodule_search_locations=[str(where)]
            )
        return importlib.util.spec_from_file_location(
            fullname, where.with_name(where.name + _SUFFIX)
        )

    def _load_library(self) -> bool:
        """Load the shared library that holds all compiled code, before the first module
        needs it; if it cannot be loaded (a damaged build), step aside for the source."""
        self.loaded = True
        try:
            importlib.import_module(_LIBRARY)
        except (ImportError, OSError) as exc:
            sys.meta_path.remove(self)
            warnings.warn(
                f"compiled scheduling core in {self.root} unusable ({exc}); running the source",
                RuntimeWarning,
                stacklevel=2,
            )
            return False
        return True


def compiled_build() -> Path | None:
    """The build for the current source, if there is one (and it is not turned off)."""
    if os.environ.get("GPUSCHED_NATIVE", "1") == "0":
        return None
    root = BUILD_ROOT / source_digest()
    return root if (root / MANIFEST).is_file() else None


def in_use() -> bool:
    """Whether `app.scheduling` is loaded from a compiled build in this process."""
    return any(isinstance(f, _CompiledFinder) for f in sys.meta_path)


def use_compiled() -> None:
    """Load `app.scheduling`'s modules from the matching build, if any (before any of
    them is imported; see `in_use`)."""
    if in_use() or any(name.startswith(PACKAGE + ".") for name in sys.modules):
        return
    root = compiled_build()
    if root is None:
        return
    modules = frozenset((root / MANIFEST).read_text().split())
    sys.meta_path.insert(0, _CompiledFinder(root, modules))
