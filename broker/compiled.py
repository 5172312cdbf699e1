"""The modules on the path of every message that mypyc compiles where it can (docs/benchmarks.md: about a fifth less
broker CPU per message), with the store's recovery (a failover waits for it: half the time for a million queued
messages), and the check that no compiled module is older than its source.

`python -m broker.compiled` builds them in place: an extension module beside each source, which Python imports
instead of the source, and the runtime library they all load inside the broker package (RUNTIME_GROUP), so they
import wherever the packages do (an editable install puts the packages on the path, not the repo root). `make`,
`make run` and `make test` run it whenever a source changed; a build that fails (no C compiler, no Python headers,
no mypy 1.17 or later, no setuptools) leaves every module pure Python, as does `python -m broker.compiled --clean`.
The wheel's build (setup.py: `pip install .`, `pip wheel .`, `python -m build`) builds the same extensions.

Each build records the hashes of the sources it compiled (MANIFEST): a compiled module whose source no longer has its
hash would run instead of the edit, and the broker refuses to start so (refusal()).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.machinery
import json
import os
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

REPO_ROOT = Path(__file__).resolve().parent.parent

# Typed for mypyc (tests/unit/test_types.py keeps them clean under mypy): mypyc trusts these annotations.
COMPILED = (
    "protocol/framing.py", "protocol/fastpath.py", "protocol/assembler.py", "protocol/properties.py",
    "broker/model/message.py", "broker/model/queue.py", "broker/model/stream.py", "broker/model/exchange.py",
    "broker/model/vhost.py", "broker/model/remote.py", "broker/model/routing/topic.py", "broker/session/channel.py",
    "broker/session/consumer.py", "broker/session/unacked.py", "broker/session/confirms.py",
    "broker/session/limits.py", "broker/session/settlement.py", "broker/connection/connection.py",
    "broker/crossing/frames.py", "broker/crossing/link.py", "broker/crossing/home.py", "broker/crossing/owner.py",
    "storage/records.py", "storage/index.py", "storage/store.py", "storage/recovery.py",
)
# Extension modules written in C, built with those (each source's module lies beside it, named as it is)
C_SOURCES = ("broker/model/untracked.c",)

# The runtime library's module: broker/_compiled_runtime__mypyc.<suffix> (mypyc adds "__mypyc" to the group name).
RUNTIME_GROUP = "broker._compiled_runtime"
MYPY_NEEDED = (1, 17)  # mypycify's group_name: the runtime library inside a package
MANIFEST = "broker/_compiled_sources.json"  # source -> the SHA-256 of the text it was compiled from
BUILD_DIR = "build/compiled"  # the objects of the last in-place build, which the next one reuses where it can
# The one check of -Wall (which Python's flags turn on) that costs a third of compiling mypyc's runtime library, C
# of 19 MB no one indents by hand: gcc's look at its indentation (74 s of CPU at -O3 with it, 49 without; 40 and
# 13 at -O0). The code built is the same byte for byte; clang takes the option too.
QUIET_CHECK = "-Wno-misleading-indentation"
MYPYC_DIR = "build"  # where mypyc writes the C it makes of the modules
# Where mypyc writes the runtime library's headers, which the C file of each module includes (multi_file: a C file a
# module, compiled at once by parallel_build(), where one C file of 19 MB took a core for a minute). mypyc 2.4 writes
# the modules' files to MYPYC_DIR and the headers to the group's package folder under it, which it leaves off the
# include path
GROUP_HEADERS = os.path.join(MYPYC_DIR, *RUNTIME_GROUP.split(".")[:-1])
# C files compiled at once at most, where there are cores for more: gcc's memory for the four largest at -O3 (0.6 GB)
# stays under what the one C file took (0.76 GB), for a build in a container of little memory on many cores
COMPILES_AT_ONCE = 4


def built_sources() -> tuple[str, ...]:
    """Every source with a module built beside it."""
    return COMPILED + C_SOURCES


def _extensions(source: Path) -> list[Path]:
    """The compiled modules built for source (one per Python version that built one)."""
    return [path for suffix in importlib.machinery.EXTENSION_SUFFIXES
            for path in [source.with_suffix(suffix)] if path.exists()]


def _shared_libraries() -> list[Path]:
    """The runtime library mypyc builds for the modules, and any an older build left at the repo root (named by a
    hash of the module list, importable only from there)."""
    package, _, name = RUNTIME_GROUP.rpartition(".")
    return sorted([*REPO_ROOT.glob("*__mypyc.*"), *(REPO_ROOT / package).glob(f"{name}__mypyc.*")])


def refusal() -> str | None:
    """Why the modules cannot run as they are (compiled ones whose sources were edited since, which would run instead
    of the edits), saying how to rebuild or remove them; None when they can."""
    outdated = stale()
    if not outdated:
        return None
    return (f"the compiled modules of {', '.join(outdated)} were built from other sources than those here: rebuild "
            "them (make, or python -m broker.compiled) or remove them (python -m broker.compiled --clean)")


def stale() -> list[str]:
    """Sources edited since their compiled module was built (their hash is not the one MANIFEST recorded): the
    compiled module would run instead of the edit."""
    try:
        built = json.loads((REPO_ROOT / MANIFEST).read_text())
    except (OSError, ValueError):
        built = {}
    return [name for name in built_sources() if _extensions(REPO_ROOT / name) and built.get(name) != _hash(name)]


def missing() -> list[str]:
    """The sources with no module built beside them here (those of COMPILED run as pure Python)."""
    return [name for name in built_sources() if not _extensions(REPO_ROOT / name)]


def _hash(name: str) -> str:
    return hashlib.sha256((REPO_ROOT / name).read_bytes()).hexdigest()


def clean() -> None:
    for name in built_sources():
        for extension in _extensions(REPO_ROOT / name):
            extension.unlink()
    for library in _shared_libraries():
        library.unlink()
    (REPO_ROOT / MANIFEST).unlink(missing_ok=True)


def extensions() -> list:
    """mypyc's extension modules of COMPILED and those of C_SOURCES for setuptools to build (from REPO_ROOT as the
    current directory), their sources' hashes recorded in MANIFEST; none where they cannot be built here (no C
    compiler or Python headers, no mypy 1.17 or later), saying why on stderr: Warren then runs as pure Python."""
    try:
        from mypy.version import __version__ as mypy_version
        from mypyc.build import mypycify

        if tuple(int(part) for part in mypy_version.split("+")[0].split(".")[:2]) < MYPY_NEEDED:
            raise RuntimeError(f"mypy {mypy_version} is older than {'.'.join(map(str, MYPY_NEEDED))}, the first "
                               "whose mypyc can build its runtime library inside a package")
        _check_compiler()
        from setuptools import Extension

        modules = mypycify(["--ignore-missing-imports", "--follow-imports=silent", "--disable-error-code",
                            "annotation-unchecked", *COMPILED], opt_level=_opt_level(), group_name=RUNTIME_GROUP,
                           multi_file=True, target_dir=MYPYC_DIR)
        for module in modules:  # (mypyc gives them all one list)
            module.extra_compile_args = [*module.extra_compile_args, QUIET_CHECK]
            module.include_dirs = [*module.include_dirs, GROUP_HEADERS]
        modules += [Extension(source.removesuffix(".c").replace("/", "."), [source]) for source in C_SOURCES]
    except (Exception, SystemExit) as error:  # mypyc reports its errors and then exits
        print(f"warren: modules not compiled, Warren runs as pure Python ({type(error).__name__}: {error})",
              file=sys.stderr)
        return []
    manifest = REPO_ROOT / MANIFEST
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({name: _hash(name) for name in built_sources()}, indent=1) + "\n")
    return modules


def _opt_level() -> str:
    """The C compiler's optimization level for mypyc's modules: WARREN_OPT_LEVEL, 3 unless it says otherwise (0
    builds in less than half the time modules that cost more CPU per message: a build that is only looked into)."""
    level = os.environ.get("WARREN_OPT_LEVEL", "3")
    if level not in ("0", "1", "2", "3"):
        raise ValueError(f"WARREN_OPT_LEVEL is {level!r}, where 0, 1, 2 or 3 is meant")
    return level


def _check_compiler() -> None:
    """Compile a file that includes Python.h, as each extension does: an error names what is missing (a C
    compiler, Python's headers)."""
    import setuptools  # noqa: F401  (puts its distutils in place, which Python 3.12 no longer has)
    from distutils.ccompiler import new_compiler
    from distutils.sysconfig import customize_compiler

    compiler = new_compiler()
    customize_compiler(compiler)
    with tempfile.TemporaryDirectory() as scratch:
        probe = Path(scratch) / "probe.c"
        probe.write_text("#include <Python.h>\nint probe(void) { return 0; }\n")
        compiler.compile([str(probe)], output_dir=scratch, include_dirs=[sysconfig.get_paths()["include"]])


def parallel_build() -> type:
    """setuptools' build_ext, compiling the C files of an extension at once (the runtime library's are 46: one a
    module, mypyc's own), where it compiles them one after another."""
    from setuptools.command.build_ext import build_ext

    class ParallelBuild(build_ext):
        def build_extensions(self) -> None:
            self.compiler.compile = compiling_at_once(self.compiler.compile)
            super().build_extensions()

    return ParallelBuild


def compiling_at_once(compile_sources: Callable[..., list[str]]) -> Callable[..., list[str]]:
    """compile_sources (a compiler's compile(): sources in, objects out) made to compile its sources at once, as many
    as this process has cores (COMPILES_AT_ONCE at most), the objects in the sources' order."""
    def compile_at_once(sources: list[str], *args: object, **kwargs: object) -> list[str]:
        with ThreadPoolExecutor(min(usable_cores(), COMPILES_AT_ONCE)) as pool:  # (a thread waits for its gcc)
            compiled = pool.map(lambda source: compile_sources([source], *args, **kwargs), sources)
            return [obj for objects in compiled for obj in objects]

    return compile_at_once


def usable_cores() -> int:
    """The cores this process may run on (where Linux says; elsewhere the machine's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def build() -> None:
    """Compile COMPILED in place; where that cannot be done here, say so and leave every module pure Python. What an
    earlier build made is kept in BUILD_DIR: an extension none of whose C files changed is not built again."""
    modules = extensions()
    if not modules:
        clean()
        return
    try:
        from setuptools import setup

        scratch = str(REPO_ROOT / BUILD_DIR)
        setup(name="warren-compiled", packages=[], script_name="setup.py",
              script_args=["--quiet", "build_ext", "--inplace", "--build-temp", scratch, "--build-lib", scratch],
              ext_modules=modules, cmdclass={"build_ext": parallel_build()})
    except (Exception, SystemExit) as error:
        clean()
        print(f"warren: modules not compiled, Warren runs as pure Python ({type(error).__name__}: {error})",
              file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m broker.compiled", description=__doc__.splitlines()[0])
    parser.add_argument("--clean", action="store_true", help="remove the compiled modules: pure Python")
    parser.add_argument("--check", action="store_true", help="exit 1, saying which, unless every module is "
                        "compiled from the sources here (what an install or an image is checked with)")
    args = parser.parse_args(argv)
    if args.check:
        problem = refusal() or (f"not compiled, running as pure Python: {', '.join(missing())}" if missing() else None)
        print(f"warren: {problem}" if problem else f"warren: the {len(built_sources())} modules are compiled",
              file=sys.stderr if problem else sys.stdout)
        return 1 if problem else 0
    os.chdir(REPO_ROOT)  # mypycify takes the sources' paths relative to the tree
    if args.clean:
        clean()
        return 0
    build()  # one that fails leaves a working pure-Python Warren
    return 0


if __name__ == "__main__":
    sys.exit(main())
