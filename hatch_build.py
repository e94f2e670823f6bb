"""Hatchling build hook: compile ``hurray_interop/_kernel.c`` when a C compiler works.

The compiled kernel is optional (``hurray_interop/kernels.py`` falls back to
numpy), so the install never fails because of it: without a working compiler
the hook prints why on stderr and the wheel stays pure Python.

* wheel (``pip install .``, ``python -m build``): the library is compiled into a
  temporary directory and added as ``hurray_interop/_kernel.so``; the wheel is
  then tagged ``py3-none-<platform>`` (it holds no Python extension, only a
  library loaded with ctypes).
* editable (``pip install -e .``): the library is compiled next to the source,
  ``hurray_interop/_kernel.so`` (git-ignored), where the editable path finds it.

Compiler: ``$CC`` if set (``CC=false`` builds without the kernel), else Python's
own ``sysconfig`` CC, else ``cc``; flags ``-std=c99 -O2 -shared`` plus
``sysconfig`` CCSHARED (``-fPIC``) and ``$CFLAGS``/``$LDFLAGS``.
``HURRAY_INTEROP_BUILD_KERNEL=0`` skips the kernel.  ``python hatch_build.py``
compiles it in place for development (exit 1 when it cannot, the previous library then
removed, as the editable build does: a stale kernel is never loaded beside newer source).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

SOURCE = "hurray_interop/_kernel.c"
LIBRARY = "hurray_interop/_kernel.dll" if os.name == "nt" else "hurray_interop/_kernel.so"


def _compilers() -> list[list[str]]:
    env = os.environ.get("CC")
    if env is not None:
        return [shlex.split(env)] if env.strip() else []
    found: list[list[str]] = []
    for cc in (sysconfig.get_config_var("CC"), "cc"):
        if cc and shlex.split(cc) not in found:
            found.append(shlex.split(cc))
    return found


def compile_kernel(root: str | Path, out: str | Path) -> str | None:
    """Compile the kernel of the project at ``root`` into ``out``.  Returns None on
    success, else why it could not (every compiler tried)."""
    if os.environ.get("HURRAY_INTEROP_BUILD_KERNEL", "1").strip() == "0":
        return "HURRAY_INTEROP_BUILD_KERNEL=0"
    src = Path(root) / SOURCE
    pic = shlex.split(sysconfig.get_config_var("CCSHARED") or "-fPIC")
    extra = shlex.split(os.environ.get("CFLAGS", "")) + shlex.split(os.environ.get("LDFLAGS", ""))
    why: list[str] = []
    for cc in _compilers():
        if not cc or shutil.which(cc[0]) is None:
            why.append(f"{' '.join(cc) or '(empty CC)'}: not found")
            continue
        cmd = [*cc, "-std=c99", "-O2", *pic, "-shared", *extra, "-o", str(out), str(src)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.SubprocessError) as exc:
            why.append(f"{' '.join(cmd)}: {exc}")
            continue
        if proc.returncode == 0 and Path(out).is_file():
            return None
        why.append(f"{' '.join(cmd)}: exit {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return "; ".join(why) or "no C compiler configured"


def _skip(reason: str) -> None:
    print(f"hurray-interop: compiled kernel not built, the numpy path will run ({reason})", file=sys.stderr)


def _platform_tag() -> str:
    return sysconfig.get_platform().replace("-", "_").replace(".", "_")


try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface
except ImportError:  # `python hatch_build.py` without hatchling
    BuildHookInterface = object  # type: ignore[assignment,misc]


class KernelBuildHook(BuildHookInterface):  # type: ignore[misc,valid-type]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        if version == "editable":
            out = Path(self.root) / LIBRARY
            why = compile_kernel(self.root, out)
            if why:
                out.unlink(missing_ok=True)  # never leave a stale kernel beside newer source
                _skip(why)
            return
        self._tmp = tempfile.mkdtemp(prefix="hurray-kernel-")
        out = Path(self._tmp) / Path(LIBRARY).name
        why = compile_kernel(self.root, out)
        if why:
            _skip(why)
            return
        build_data["force_include"][str(out)] = LIBRARY
        build_data["pure_python"] = False
        build_data["tag"] = f"py3-none-{_platform_tag()}"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        tmp = getattr(self, "_tmp", None)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    reason = compile_kernel(here, here / LIBRARY)
    if reason:
        # a failed compile leaves the previous library in place: never load it beside newer source
        (here / LIBRARY).unlink(missing_ok=True)
        _skip(reason)
        sys.exit(1)
    print(f"built {here / LIBRARY}")
