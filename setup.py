"""Build elelem: the vendored ggml with CMake, then one Cython extension.

ggml is configured and built as shared libraries in the setuptools build
folder (never inside the source tree) and shipped inside the package, in
``elelem/_lib``: ``libggml-base`` and ``libggml``, which ``elelem._core``
links against (found through an ``$ORIGIN`` rpath), and the CPU backend as
modules (``libggml-cpu*.so``) that the core loads at run time, choosing the
best one the running CPU supports, and ggml's RPC backend module
(``libggml-rpc.so``), loaded when a model is split over RPC servers.

Environment switches:
  ELELEM_PORTABLE=1   build every CPU variant of ggml's GGML_CPU_ALL_VARIANTS (x86-64's,
                      or Linux aarch64's): one build that runs, at native speed, on any
                      CPU of the architecture.
                      Without it, one CPU module for the build machine's CPU.
  ELELEM_SANITIZE=1   compile ggml and the extension with ASan and UBSan.
  ELELEM_DEBUG=1      a debug build of ggml and the extension.
  ELELEM_CUDA=1       also build ggml's CUDA backend module (libggml-cuda.so), as does
                      llama-cpp-python's CMAKE_ARGS="-DGGML_CUDA=ON"; needs a CUDA
                      toolkit (scripts/cuda_toolkit_from_pypi.sh makes one from PyPI).
  ELELEM_CUDA_ARCHS   its CUDA architectures (default 90: the H200; CMAKE_ARGS'
                      -DCMAKE_CUDA_ARCHITECTURES=... also counts).
  ELELEM_VULKAN=1     also build ggml's Vulkan backend module (libggml-vulkan.so), as does
                      CMAKE_ARGS="-DGGML_VULKAN=ON"; needs glslc, the Vulkan loader and the
                      SPIR-V headers (Debian: glslc libvulkan-dev spirv-headers); the Vulkan
                      headers themselves are vendored (third_party/vulkan-headers).
  ELELEM_METAL=0/1    ggml's Metal backend module (libggml-metal.so), its shaders embedded:
                      built by default on macOS (as llama.cpp and llama-cpp-python build it
                      there; CMAKE_ARGS="-DGGML_METAL=OFF" or ELELEM_METAL=0 leaves it out),
                      never elsewhere.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
GGML = ROOT / "third_party" / "ggml"
CMAKE_PROJECT = ROOT / "cmake"
LIB_DIR_NAME = "_lib"               # elelem/_lib: ggml's shared libraries and backend modules
LINKED_LIBS = ("libggml", "libggml-base")  # libggml.so.0 (ELF), libggml.0.dylib (Mach-O)
BACKEND_MODULE_GLOB = "libggml-cpu*.so"
RPC_MODULE = "libggml-rpc.so"      # ggml's RPC backend, a module loaded on first use
NATIVE_ISA_FILE = "libggml-cpu.isa"  # the macros -march=native predefined for the native module
CUDA_MODULE = "libggml-cuda.so"
VULKAN_MODULE = "libggml-vulkan.so"
METAL_MODULE = "libggml-metal.so"  # CMake names Mach-O modules .so too


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def cpu_variants() -> str:
    return "all" if env_flag("ELELEM_PORTABLE") else "native"


def cmake_args_value(name: str):
    """The value CMAKE_ARGS gives -D<name> (llama-cpp-python's build switches), else None."""
    for arg in shlex.split(os.environ.get("CMAKE_ARGS", "")):
        match = re.fullmatch(rf"-D{name}(:[A-Z]+)?=(.*)", arg)
        if match:
            return match.group(2)
    return None


def cuda_enabled() -> bool:
    return env_flag("ELELEM_CUDA") or (cmake_args_value("GGML_CUDA") or "").lower() in ("1", "on", "true", "yes")


def vulkan_enabled() -> bool:
    return env_flag("ELELEM_VULKAN") or (cmake_args_value("GGML_VULKAN") or "").lower() in ("1", "on", "true", "yes")


def macos() -> bool:
    return sys.platform == "darwin"


def metal_enabled() -> bool:
    """On macOS unless turned off (ELELEM_METAL=0, or CMAKE_ARGS' -DGGML_METAL=OFF); elsewhere never
    (ELELEM_METAL=1 there is CMake's error, which says why)."""
    for value in (os.environ.get("ELELEM_METAL"), cmake_args_value("GGML_METAL")):
        if value is not None and value.strip():
            return value.strip().lower() in ("1", "on", "true", "yes")
    return macos()


def gpu_suffix() -> str:
    """The build folder's suffix for the GPU modules built: a switch never reuses a stale cache."""
    return ("-cuda" if cuda_enabled() else "") + ("-vulkan" if vulkan_enabled() else "") + (
        "-metal" if metal_enabled() else "")


def osx_architectures() -> list[str]:
    """CMake's CMAKE_OSX_ARCHITECTURES from ARCHFLAGS (-arch arm64), which cibuildwheel and
    setuptools use to say what a macOS build targets."""
    archs = re.findall(r"-arch\s+(\S+)", os.environ.get("ARCHFLAGS", ""))
    return [f"-DCMAKE_OSX_ARCHITECTURES={';'.join(archs)}"] if macos() and archs else []


def rpath_to_lib_dir() -> str:
    return f"-Wl,-rpath,{'@loader_path' if macos() else '$ORIGIN'}/{LIB_DIR_NAME}"


def cuda_cmake_args() -> list[str]:
    if not cuda_enabled():
        return []
    archs = os.environ.get("ELELEM_CUDA_ARCHS", "").strip() or cmake_args_value("CMAKE_CUDA_ARCHITECTURES") or "90"
    return ["-DELELEM_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={archs}"]


def sanitizer_flags() -> list[str]:
    return ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"] if env_flag("ELELEM_SANITIZE") else []


class BuildGGMLThenExt(build_ext):
    def run(self):
        if not (GGML / "CMakeLists.txt").is_file():
            sys.exit("third_party/ggml is missing; restore it with: python scripts/vendor_ggml.py")
        # One folder per CPU variant set: switching between them never reuses a stale CMake cache.
        build_dir = Path(self.build_temp).resolve() / f"ggml-build-{cpu_variants()}{gpu_suffix()}"
        built = self.build_ggml(build_dir)
        lib_dir = Path(self.get_ext_fullpath("elelem._core")).resolve().parent / LIB_DIR_NAME
        linked = install_libraries(built, lib_dir)
        for ext in self.extensions:
            ext.depends = list(ext.depends) + [str(p) for p in linked]  # relink when ggml changes
            ext.extra_link_args = [str(p) for p in linked] + [
                rpath_to_lib_dir(), "-lm", "-lpthread"] + sanitizer_flags()
            ext.extra_compile_args = ["-O3" if not env_flag("ELELEM_DEBUG") else "-O0", "-g0"] + sanitizer_flags()
        super().run()

    def build_ggml(self, build_dir: Path) -> Path:
        """Configure and build ggml; returns the folder holding its libraries."""
        build_dir.mkdir(parents=True, exist_ok=True)
        cmake = cmake_executable()
        config = "Debug" if env_flag("ELELEM_DEBUG") else "Release"
        args = [
            cmake, "-S", str(CMAKE_PROJECT), "-B", str(build_dir),
            f"-DCMAKE_BUILD_TYPE={config}",
            f"-DELELEM_CPU_VARIANTS={cpu_variants()}",
            "-DCMAKE_POSITION_INDEPENDENT_CODE=ON",
            "-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={build_dir / 'lib'}",
            f"-DCMAKE_RUNTIME_OUTPUT_DIRECTORY={build_dir / 'lib'}",
            # llama.cpp turns on llamafile's tinyBLAS matmuls (ggml alone does not):
            # faster prefill, and the same summation order, so the same tokens.
            "-DGGML_LLAMAFILE=ON",
            # ggml's own worker threads, one pool per context, instead of OpenMP
            # teams, which slow steps run from more than one Python thread
            # (elelem/_native/cpu_backend.pxi, _new_cpu_threadpool).
            "-DGGML_OPENMP=OFF",
            "-DGGML_CCACHE=OFF",
        ] + cuda_cmake_args() + (["-DELELEM_VULKAN=ON"] if vulkan_enabled() else []) + (
            ["-DELELEM_METAL=ON"] if metal_enabled() else []) + osx_architectures()
        if env_flag("ELELEM_SANITIZE"):
            flags = " ".join(sanitizer_flags())
            args += [f"-DCMAKE_C_FLAGS={flags}", f"-DCMAKE_CXX_FLAGS={flags}"]
        ninja = ninja_executable()
        if ninja:
            args += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
        subprocess.run(args, check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 2)
        subprocess.run([cmake, "--build", str(build_dir), "--config", config, "-j", jobs], check=True)
        return build_dir / "lib"


def install_libraries(built: Path, lib_dir: Path) -> list[Path]:
    """Copy ggml's libraries into the package; returns the ones to link against.

    Shared libraries are copied under their SONAME (libggml.so.0; on macOS
    the install name's libggml.0.dylib), the name the dynamic linker looks
    for, as plain files: wheels cannot hold symlinks.
    The folder is emptied first so that modules of an earlier build (another
    CPU variant set) are never loaded."""
    if lib_dir.exists():
        shutil.rmtree(lib_dir)
    lib_dir.mkdir(parents=True)
    linked = []
    for name in LINKED_LIBS:
        pattern = name + (".*.dylib" if macos() else ".so.*")
        sonames = sorted(p for p in built.glob(pattern) if p.name.count(".") == 2)  # libggml.so.0, libggml.0.dylib
        if not sonames:
            sys.exit(f"ggml build produced no {pattern.replace('*', '<major>')} under {built}")
        target = lib_dir / sonames[0].name
        shutil.copyfile(sonames[0].resolve(), target)
        linked.append(target)
    modules = sorted(built.glob(BACKEND_MODULE_GLOB))
    if not modules:
        sys.exit(f"ggml build produced no CPU backend module ({BACKEND_MODULE_GLOB}) under {built}")
    if not (built / RPC_MODULE).is_file():
        sys.exit(f"ggml build produced no RPC backend module ({RPC_MODULE}) under {built}")
    modules.append(built / RPC_MODULE)
    if cuda_enabled():
        if not (built / CUDA_MODULE).is_file():
            sys.exit(f"ELELEM_CUDA=1 but the ggml build produced no {CUDA_MODULE} under {built}")
        modules.append(built / CUDA_MODULE)
    if vulkan_enabled():
        if not (built / VULKAN_MODULE).is_file():
            sys.exit(f"ELELEM_VULKAN=1 but the ggml build produced no {VULKAN_MODULE} under {built}")
        modules.append(built / VULKAN_MODULE)
    if metal_enabled():
        if not (built / METAL_MODULE).is_file():
            sys.exit(f"Metal is on but the ggml build produced no {METAL_MODULE} under {built}")
        modules.append(built / METAL_MODULE)
    for module in modules:
        shutil.copyfile(module, lib_dir / module.name)
    if (built / NATIVE_ISA_FILE).is_file():  # a native module's instruction sets (cmake/native_cpu_features.cmake)
        shutil.copyfile(built / NATIVE_ISA_FILE, lib_dir / NATIVE_ISA_FILE)
    shutil.copyfile(GGML / "LICENSE", lib_dir / "LICENSE-ggml")  # ggml's MIT licence travels with its binaries
    return linked


def cmake_executable() -> str:
    try:  # the PyPI cmake wheel, from the build requirements
        import cmake
        return os.path.join(cmake.CMAKE_BIN_DIR, "cmake")
    except ImportError:
        return "cmake"


def ninja_executable():
    try:
        import ninja
        return os.path.join(ninja.BIN_DIR, "ninja")
    except ImportError:
        return None


NATIVE = ROOT / "elelem" / "_native"


def write_builder_includes() -> None:
    """graph/all_builders.pxi includes every graph/arch_*.pxi, and
    graph/all_vision_builders.pxi every graph/vision_*.pxi (a projector's
    encoder): adding a builder file is all the native side needs.  Rewritten
    only when a list changes, so the core is not recompiled for nothing."""
    for pattern, generated in (("arch_*.pxi", "all_builders.pxi"), ("vision_*.pxi", "all_vision_builders.pxi")):
        names = sorted(p.name for p in (NATIVE / "graph").glob(pattern))
        text = f"# Generated by setup.py: one include per graph/{pattern}.  Do not edit.\n" + "".join(
            f'include "{name}"\n' for name in names)
        target = NATIVE / "graph" / generated
        if not target.is_file() or target.read_text() != text:
            target.write_text(text)


def target_machine() -> str:
    """The CPU the extension is built for: the last part of sysconfig's
    platform (linux-x86_64, linux-aarch64, macosx-11.0-arm64), which a cross
    build sets through _PYTHON_HOST_PLATFORM (cibuildwheel on macOS,
    scripts/arm64_check.sh's aarch64 wheel); natively, this machine's."""
    return sysconfig.get_platform().rsplit("-", 1)[-1].lower()


def kernel_sources() -> tuple[str, ...]:
    """elelem's own kernels (elelem/_native/kernels) are x86-64 intrinsics;
    on other CPUs their entry points are stubs that say none run, and the
    core runs ggml's kernels only."""
    if target_machine() in ("x86_64", "amd64"):
        return ("small_batch", "small_batch_avx2", "small_batch_avx512", "small_batch_avx512_q6_k",
                "small_batch_q4_k", "experts")
    return ("portable",)


def write_declarations() -> None:
    """_native/declarations.pxi: the HParams and LayerWeights structs and
    LAYER_ROLES, generated from the ROLES and HPARAMS the architecture
    modules (elelem/model/archs/) declare, so that a tensor role or a
    hyperparameter is declared there once.  Run in a child interpreter from
    the source tree (the modules need only NumPy), and rewritten only when
    the text changes."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    subprocess.run([sys.executable, "-m", "elelem.model.archs._codegen", str(NATIVE / "declarations.pxi")],
                   cwd=ROOT, env=env, check=True)


def extensions():
    import numpy
    from Cython.Build import cythonize

    write_builder_includes()
    write_declarations()
    core = Extension(
        "elelem._core",  # its sources are the native layer, elelem/_native/
        sources=["elelem/_native/core.pyx"] + [f"elelem/_native/kernels/{name}.c" for name in kernel_sources()],
        include_dirs=[str(GGML / "include"), numpy.get_include()],
        language="c++",
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
    return cythonize(
        [core],
        compiler_directives={"language_level": 3, "boundscheck": False, "wraparound": False,
                             "cdivision": True, "embedsignature": True},
    )


setup(ext_modules=extensions(), cmdclass={"build_ext": BuildGGMLThenExt})
