"""Wheels for the real-GPU check (`bench/gpu_check.sh`) on a machine with no package index.

    make gpu-wheels            # = .venv/bin/python bench/gpu_wheels.py --dest build/gpu-wheels

Downloads, for CPython 3.12 on x86-64 manylinux, the project's runtime dependencies
(`[project].dependencies` of pyproject.toml, with their own dependencies) and what builds
the project (`[build-system].requires`), pinned to the versions installed here (the ones the
tests ran with). No dev or bench extras, and no PyTorch: the GPU machine has its own.

The project itself goes in as an editable install from the checkout that travels with the
command (`pip install --no-index --find-links DEST -e .`), not as a wheel: a wheel leaves
migrations/ and the dashboard behind (app/migrate.py), and `gpusched up` needs both.

Fails, naming the reason, when the folder ends up over `--max-mib` (what the GPU machine
takes in is 64 MiB with the checkout) or holds two versions of one package.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tomllib
from collections import defaultdict
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON_VERSION = "3.12"
# pip matches manylinux tags exactly: the ones x86-64 wheels of these packages carry.
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
)
DEFAULT_MAX_MIB = 60.0


def requirements(pyproject: Path) -> tuple[list[str], list[str]]:
    """(runtime dependencies, build requirements), as pyproject.toml writes them."""
    data = tomllib.loads(pyproject.read_text())
    runtime = list(data["project"]["dependencies"])
    build = list(data.get("build-system", {}).get("requires", []))
    return runtime, build


def requirement_name(requirement: str) -> str:
    """`uvicorn` of `uvicorn[standard]>=0.30`, normalised."""
    found = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if found is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return canonical(found.group(1))


def pins(exclude: set[str]) -> list[str]:
    """`name==version` of every distribution installed in this interpreter, except those
    named (ours, and the build tools: a venv's own setuptools is older than we build with)."""
    found = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and canonical(name) not in exclude:
            found[canonical(name)] = f"{name}=={dist.version}"
    return sorted(found.values())


def canonical(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def download_command(requirements_file: Path, constraints_file: Path, dest: Path) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--only-binary=:all:",
        "--python-version",
        PYTHON_VERSION,
        "--implementation",
        "cp",
        "--dest",
        str(dest),
        "--requirement",
        str(requirements_file),
        "--constraint",
        str(constraints_file),
    ]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    return command


def wheel_project(filename: str) -> str:
    """The project name a wheel file is for (`psycopg_binary-3.3.9-cp312-...whl`)."""
    return canonical(filename.split("-", 1)[0])


def duplicates(wheels: list[str]) -> dict[str, list[str]]:
    """Projects with more than one wheel: `pip install --no-index` would pick one silently."""
    by_project: dict[str, list[str]] = defaultdict(list)
    for name in wheels:
        by_project[wheel_project(name)].append(name)
    return {project: sorted(files) for project, files in by_project.items() if len(files) > 1}


def size_problem(total_bytes: int, max_mib: float) -> str | None:
    mib = total_bytes / 2**20
    if mib > max_mib:
        return (
            f"the wheels take {mib:.1f} MiB, over the {max_mib:g} MiB limit: the GPU machine "
            "takes 64 MiB with the checkout; leave out what is not a runtime dependency"
        )
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=ROOT / "build" / "gpu-wheels")
    parser.add_argument("--max-mib", type=float, default=DEFAULT_MAX_MIB)
    args = parser.parse_args(argv)

    dest: Path = args.dest
    shutil.rmtree(dest, ignore_errors=True)  # a stale wheel would be a second version
    dest.mkdir(parents=True)
    runtime, build = requirements(ROOT / "pyproject.toml")
    unpinned = {"gpusched", "pip", *(requirement_name(r) for r in build)}
    work = dest / ".lists"
    work.mkdir()
    (work / "requirements.txt").write_text("\n".join(runtime + build) + "\n")
    (work / "constraints.txt").write_text("\n".join(pins(unpinned)) + "\n")
    command = download_command(work / "requirements.txt", work / "constraints.txt", dest)
    result = subprocess.run(command)
    shutil.rmtree(work)
    if result.returncode:
        print(f"gpu-wheels: pip download failed (exit {result.returncode})", file=sys.stderr)
        return 1
    wheels = sorted(p.name for p in dest.glob("*.whl"))
    twice = duplicates(wheels)
    if twice:
        print(f"gpu-wheels: two versions of one package: {twice}", file=sys.stderr)
        return 1
    total = sum((dest / name).stat().st_size for name in wheels)
    print(f"gpu-wheels: {len(wheels)} wheels, {total / 2**20:.1f} MiB in {dest}")
    problem = size_problem(total, args.max_mib)
    if problem:
        print(f"gpu-wheels: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
