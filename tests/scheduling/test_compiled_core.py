"""The mypyc-compiled scheduling core (app/compiled_core.py) runs exactly when it was
built from the source as it is now; otherwise the plain-Python source runs."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app import compiled_core
from app.compile_core import build

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built() -> Path:
    """The build for the current source, compiled now if `make native` has not."""
    if shutil.which("cc") is None or importlib.util.find_spec("mypyc") is None:
        pytest.skip("no C compiler or no mypyc here: the core runs as plain Python")
    return build()


def _loaded_from(root: Path, **env: str) -> Path:
    """Where a fresh interpreter, importing `app` from `root`, loads the planner module."""
    done = subprocess.run(
        [sys.executable, "-c", "import app.scheduling.planner as c; print(c.__file__)"],
        cwd=root,
        env={**os.environ, "GPUSCHED_NATIVE": "1", "PYTHONPATH": str(root), **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(done.stdout.strip())


def test_the_build_of_the_current_source_is_used(built: Path) -> None:
    assert built == compiled_core.BUILD_ROOT / compiled_core.source_digest()
    assert _loaded_from(REPO).is_relative_to(built)
    assert _loaded_from(REPO, GPUSCHED_NATIVE="0") == REPO / "app" / "scheduling" / "planner.py"


def _copy(built: Path, root: Path) -> Path:
    """A copy of the package and of its build, laid out as in the repository."""
    (root / "app").mkdir()
    for name in ("__init__.py", "compiled_core.py"):
        shutil.copy(REPO / "app" / name, root / "app" / name)
    shutil.copytree(REPO / "app" / "scheduling", root / "app" / "scheduling")
    return Path(shutil.copytree(built, root / "build" / "native" / built.name))


def test_an_edited_source_runs_as_plain_python(built: Path, tmp_path: Path) -> None:
    copy = _copy(built, tmp_path)
    assert _loaded_from(tmp_path).is_relative_to(copy)

    with (tmp_path / "app" / "scheduling" / "queue.py").open("a") as f:
        f.write("\n# edited after the build\n")
    assert _loaded_from(tmp_path) == tmp_path / "app" / "scheduling" / "planner.py"


def test_a_damaged_build_gives_way_to_the_source(built: Path, tmp_path: Path) -> None:
    copy = _copy(built, tmp_path)
    library = next(copy.glob(f"{compiled_core.GROUP}__mypyc.*"))
    library.write_bytes(b"not a shared library")
    assert _loaded_from(tmp_path) == tmp_path / "app" / "scheduling" / "planner.py"
