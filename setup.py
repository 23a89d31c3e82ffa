"""Build elelem: the vendored ggml with CMake, then one Cython extension.

ggml is configured and built as static, position-independent libraries in the
setuptools build folder (never inside the source tree) and linked into
``elelem._core`` through ``extra_objects``, the way uvloop links libuv.

Environment switches:
  ELELEM_PORTABLE=1   build for any CPU of the platform (no -march=native).
  ELELEM_SANITIZE=1   compile ggml and the extension with ASan and UBSan.
  ELELEM_DEBUG=1      a debug build of ggml and the extension.
"""
import os
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
GGML = ROOT / "third_party" / "ggml"
CMAKE_PROJECT = ROOT / "cmake"
GGML_LIBS = ("ggml", "ggml-cpu", "ggml-base")  # link order: dependents first


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def sanitizer_flags() -> list[str]:
    return ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"] if env_flag("ELELEM_SANITIZE") else []


class BuildGGMLThenExt(build_ext):
    def run(self):
        if not (GGML / "CMakeLists.txt").is_file():
            sys.exit("third_party/ggml is missing; restore it with: python scripts/vendor_ggml.py")
        build_dir = Path(self.build_temp).resolve() / "ggml-build"
        libs, openmp = self.build_ggml(build_dir)
        for ext in self.extensions:
            ext.extra_objects = [str(p) for p in libs]
            ext.depends = list(ext.depends) + [str(p) for p in libs]  # relink when ggml changes
            link = ["-lm", "-lpthread"] + sanitizer_flags()
            if openmp:
                link.append("-fopenmp")
            ext.extra_link_args = link
            ext.extra_compile_args = ["-O3" if not env_flag("ELELEM_DEBUG") else "-O0", "-g0"] + sanitizer_flags()
        super().run()

    def build_ggml(self, build_dir: Path):
        build_dir.mkdir(parents=True, exist_ok=True)
        cmake = cmake_executable()
        config = "Debug" if env_flag("ELELEM_DEBUG") else "Release"
        args = [
            cmake, "-S", str(CMAKE_PROJECT), "-B", str(build_dir),
            f"-DCMAKE_BUILD_TYPE={config}",
            "-DBUILD_SHARED_LIBS=OFF",
            "-DCMAKE_POSITION_INDEPENDENT_CODE=ON",
            f"-DGGML_NATIVE={'OFF' if env_flag('ELELEM_PORTABLE') else 'ON'}",
            "-DGGML_BACKEND_DL=OFF",
            # llama.cpp turns on llamafile's tinyBLAS matmuls (ggml alone does not):
            # faster prefill, and the same summation order, so the same tokens.
            "-DGGML_LLAMAFILE=ON",
            "-DGGML_CCACHE=OFF",
        ]
        if env_flag("ELELEM_SANITIZE"):
            flags = " ".join(sanitizer_flags())
            args += [f"-DCMAKE_C_FLAGS={flags}", f"-DCMAKE_CXX_FLAGS={flags}"]
        ninja = ninja_executable()
        if ninja:
            args += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
        subprocess.run(args, check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 2)
        subprocess.run([cmake, "--build", str(build_dir), "--config", config, "-j", jobs], check=True)

        libs = []
        for name in GGML_LIBS:
            found = sorted(build_dir.rglob(f"lib{name}.a"))
            if not found:
                sys.exit(f"ggml build produced no lib{name}.a under {build_dir}")
            libs.append(found[0])
        cache = (build_dir / "CMakeCache.txt").read_text()
        openmp = "GGML_OPENMP:BOOL=ON" in cache and "OpenMP_C_FLAGS:STRING=-fopenmp" in cache
        return libs, openmp


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


def extensions():
    import numpy
    from Cython.Build import cythonize

    core = Extension(
        "elelem._core",
        sources=["elelem/_core.pyx"],
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
