"""Compile the scheduling core with mypyc: `python -m app.compile_core` (`make native`).

See `app/compiled_core.py` for how and when the build is used.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from app.compiled_core import BUILD_ROOT, GROUP, MANIFEST, module_name, source_digest, sources


def build() -> Path:
    """Compile the package for the current source (no-op if already built); drops
    builds of earlier sources. Needs mypy (mypyc) and a C compiler."""
    digest = source_digest()
    target = BUILD_ROOT / digest
    if (target / MANIFEST).is_file():
        return target
    from mypyc.build import mypycify
    from setuptools import Distribution

    BUILD_ROOT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=BUILD_ROOT, prefix="tmp-") as tmp:
        paths = sources()
        extensions = mypycify(
            [str(p) for p in paths], opt_level="3", group_name=GROUP, target_dir=f"{tmp}/c"
        )
        dist = Distribution({"name": "gpusched-native", "ext_modules": extensions})
        cmd = dist.get_command_obj("build_ext")
        cmd.build_lib = f"{tmp}/out"
        cmd.build_temp = f"{tmp}/obj"
        cmd.ensure_finalized()
        cmd.run()
        # Written last and moved in whole: a half-done build is never used.
        Path(f"{tmp}/out/{MANIFEST}").write_text("\n".join(module_name(p) for p in paths) + "\n")
        try:
            os.replace(f"{tmp}/out", target)
        except OSError:
            if not (target / MANIFEST).is_file():
                raise
            # Another build of the same source finished first: use that one.
    for old in BUILD_ROOT.iterdir():
        if old != target and not old.name.startswith("tmp-"):
            shutil.rmtree(old, ignore_errors=True)
    return target


def main() -> int:
    try:
        target = build()
    except (Exception, SystemExit) as exc:  # no compiler or mypy: the source runs as it is
        print(f"app.compile_core: not compiled, the scheduler runs as plain Python ({exc!r})")
        return 0
    print(f"app.compile_core: compiled scheduling core in {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
