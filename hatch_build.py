"""The wheel's build hook, and ``python hatch_build.py``, which builds the C speedups in place.

- Puts ``stepwatch-auto.pth`` in site-packages, for regular and editable installs alike, so that
  ``STEPWATCH=auto python train.py`` instruments a program that never imports stepwatch. The file's one line
  imports stepwatch only when ``STEPWATCH=auto``; otherwise it costs a dictionary lookup at startup.
- Compiles ``src/stepwatch/_speedups.c`` (the timed block's hot path) with the compiler Python was built with.
  Where that fails (no compiler, no Python headers), it says so and the package stays pure Python:
  ``stepwatch/_block_base.py`` is the same code in Python. An editable install gets the module next to its
  source; a wheel gets it inside, and is then tagged for this Python and platform.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
SOURCE = ROOT / "src" / "stepwatch" / "_speedups.c"


COMPILE_FLAGS = [
    "-O2",
    "-DNDEBUG",
    "-fPIC",
    "-falign-functions=64",
    *(["-fno-plt"] if sys.platform.startswith("linux") else []),
]
"""As setuptools compiles an extension (``-DNDEBUG``: the Python headers' assertions out of the hot paths), each
function starting a cache line (in a cold step a path fetches the fewest lines of code where its function does not
start in the middle of one: 21 fewer a step by hand, benchmarks/footprint.py), and on Linux ``-fno-plt``: each call
into libpython not redirected by ``_linked.c`` goes through its address in the module's table at once, not through
a stub of code as well, one cache line fewer fetched per function called in a cold step (docs/overhead.md)."""


def module_name() -> str:
    return "_speedups" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so")


def toolchain() -> tuple[list[str], str] | None:
    """The command that compiles and links an extension, and Python's include directory; None where there is
    none. The command is Python's own ``LDSHARED`` (compiler and shared-library flags), or the environment's,
    as setuptools reads it: ``LDSHARED=false pip install .`` installs pure Python."""
    linker = os.environ.get("LDSHARED") or sysconfig.get_config_var("LDSHARED")
    include = sysconfig.get_paths()["include"]
    if sys.platform == "win32" or not linker or not Path(include, "Python.h").exists():
        return None
    return shlex.split(linker), include


def build_speedups(out_dir: Path) -> Path | None:
    """Compiles the C speedups into ``out_dir`` (see :func:`toolchain`); None, with the reason on stderr, where
    it cannot."""
    tools = toolchain()
    if tools is None:
        print("stepwatch: no C compiler or Python headers found; stepwatch stays pure Python", file=sys.stderr)
        return None
    linker, include = tools
    target = out_dir / module_name()
    command = [*linker, *COMPILE_FLAGS, "-I", include, str(SOURCE), "-o", str(target)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except OSError as error:
        print(f"stepwatch: could not run the C compiler ({error}); stepwatch stays pure Python", file=sys.stderr)
        return None
    if result.returncode != 0:
        print(
            f"stepwatch: the C speedups did not build; stepwatch stays pure Python\n{result.stderr[-2000:]}",
            file=sys.stderr,
        )
        return None
    return target


try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # run as a script, or imported by the tests: only build_speedups is wanted
    BuildHookInterface = None

if BuildHookInterface is not None:

    class StepwatchBuildHook(BuildHookInterface):  # type: ignore[misc]
        PLUGIN_NAME = "custom"

        def initialize(self, version: str, build_data: dict[str, Any]) -> None:
            key = "force_include_editable" if version == "editable" else "force_include"
            build_data.setdefault(key, {})["src/stepwatch-auto.pth"] = "stepwatch-auto.pth"
            if version == "editable":  # imported from the source tree: built in place
                build_speedups(SOURCE.parent)
                return
            self._scratch = tempfile.TemporaryDirectory()
            built = build_speedups(Path(self._scratch.name))
            if built is not None:
                build_data["force_include"][str(built)] = f"stepwatch/{built.name}"
                build_data["pure_python"] = False
                build_data["infer_tag"] = True

        def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
            scratch = getattr(self, "_scratch", None)
            if scratch is not None:
                scratch.cleanup()


if __name__ == "__main__":
    sys.exit(0 if build_speedups(SOURCE.parent) is not None else 1)
