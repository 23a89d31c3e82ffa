# ggml's Metal backend as one more run-time module, libggml-metal.so, beside the
# CPU ones (ELELEM_METAL=ON; setup.py turns it on by default on macOS, as
# llama.cpp's and llama-cpp-python's macOS builds do, and for ELELEM_METAL=1 or
# CMAKE_ARGS="-DGGML_METAL=ON"; ELELEM_METAL=0 leaves it out).
#
#   GGML_METAL_EMBED_LIBRARY  the shader sources go into the module itself (an
#                             assembled __DATA section, ggml-metal/CMakeLists.txt)
#                             and are compiled by the Metal driver when the device
#                             starts, as llama.cpp's release builds and
#                             llama-cpp-python's macOS build do: no
#                             default.metallib to ship beside it, and no Xcode
#                             `metal` compiler needed to build (Command Line Tools do).
#
# ggml turns GGML_METAL (and GGML_BLAS, through Accelerate) on by default on
# Apple platforms; elelem sets both whatever the default: Metal only when asked
# for, and never ggml's BLAS backend, which elelem does not vendor or load (the
# CPU module still uses Accelerate where ggml-cpu does, GGML_ACCELERATE).
option(ELELEM_METAL "build ggml's Metal backend module libggml-metal.so (macOS)" OFF)

macro(elelem_configure_metal)
    set(GGML_BLAS OFF CACHE BOOL "" FORCE)
    if (ELELEM_METAL)
        if (NOT APPLE)
            message(FATAL_ERROR "elelem: ELELEM_METAL=ON needs macOS (Metal is Apple's); "
                                "this build targets ${CMAKE_SYSTEM_NAME}")
        endif()
        set(GGML_METAL ON CACHE BOOL "" FORCE)
        set(GGML_METAL_EMBED_LIBRARY ON CACHE BOOL "" FORCE)
    else()
        set(GGML_METAL OFF CACHE BOOL "" FORCE)
    endif()
endmacro()

# Mach-O: every ggml library and module finds the others in its own folder
# (elelem/_lib) through @loader_path, never through the build folder's path,
# which CMake's build-tree rpath would name and delocate would then follow
# (copying a second libggml-base into the wheel).  ELF builds get the same from
# CMAKE_BUILD_RPATH_USE_ORIGIN (setup.py).
macro(elelem_configure_apple_rpath)
    if (APPLE)
        set(CMAKE_BUILD_WITH_INSTALL_RPATH ON)
        set(CMAKE_INSTALL_RPATH "@loader_path")
    endif()
endmacro()
