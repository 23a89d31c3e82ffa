# ggml's CUDA backend as one more run-time module, libggml-cuda.so, beside the
# CPU ones (ELELEM_CUDA=ON; setup.py turns it on for ELELEM_CUDA=1 or
# CMAKE_ARGS="-DGGML_CUDA=ON" and passes CMAKE_CUDA_ARCHITECTURES, 90 by default).
#
#   GGML_CUDA_NO_VMM   the module never links libcuda.so (the driver): the PyPI
#                      wheels have none to link against, and without it the
#                      module still opens on a machine with no driver, where
#                      cudart reports "no device" / "driver too old" instead of
#                      dlopen failing.  The cost: ggml's memory pool grows by
#                      cudaMalloc'd blocks instead of mapping virtual memory.
#   GGML_CUDA_GRAPHS   CUDA graphs for repeated decode steps, as llama.cpp builds it.
#   GGML_CUDA_NCCL     off: one GPU, and no system NCCL may leak into the build.
option(ELELEM_CUDA "build ggml's CUDA backend module libggml-cuda.so" OFF)

macro(elelem_configure_cuda)
    if (ELELEM_CUDA)
        set(GGML_CUDA ON CACHE BOOL "" FORCE)
        set(GGML_CUDA_NO_VMM ON CACHE BOOL "" FORCE)
        set(GGML_CUDA_GRAPHS ON CACHE BOOL "" FORCE)
        set(GGML_CUDA_NCCL OFF CACHE BOOL "" FORCE)
    endif()
endmacro()

# cudart and cuBLAS at run time: the nvidia-cuda-runtime and nvidia-cublas
# wheels (elelem[cuda]) put them in site-packages/nvidia/cu13/lib, two folders
# up from elelem/_lib.  The rpath says only that, never the build machine's
# toolkit path; anywhere else they must already be loaded (by soname) or on
# LD_LIBRARY_PATH.
function(elelem_set_cuda_rpath)
    if (ELELEM_CUDA)
        set_target_properties(ggml-cuda PROPERTIES
            BUILD_WITH_INSTALL_RPATH ON
            INSTALL_RPATH "$ORIGIN;$ORIGIN/../../nvidia/cu13/lib")
    endif()
endfunction()
