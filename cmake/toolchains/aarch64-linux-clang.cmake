# Cross-compiling elelem's CMake project (cmake/) for Linux aarch64 from an
# x86-64 Debian machine: clang 19 as the compiler (Debian 12's GCC 12 cannot
# target ggml's Armv9.2 SME variants), Debian's gcc-aarch64-linux-gnu for the
# aarch64 libc, libstdc++ and binutils.  Used by scripts/arm64_check.sh, and by
# setup.py through CMake's own CMAKE_TOOLCHAIN_FILE environment variable.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER clang-19)
set(CMAKE_CXX_COMPILER clang++-19)
set(CMAKE_C_COMPILER_TARGET aarch64-linux-gnu)
set(CMAKE_CXX_COMPILER_TARGET aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
