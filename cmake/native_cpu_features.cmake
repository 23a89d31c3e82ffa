# The ISA extensions of the build machine's CPU, as ggml's GGML_<FEATURE>
# options.  The compiler itself answers: the macros it predefines under
# -march=native are exactly what a -march=native build would use.
#
# The options name the features for ggml's run-time check (the module's
# ggml_backend_score); the CPU module is then compiled with -march=native as
# well (elelem_compile_cpu_module_native below), as llama.cpp's GGML_NATIVE
# build compiles it.  The -m flags alone leave out the rest of what
# -march=native means, and that changes ggml's numbers:
# - the tuning: under GCC's generic tuning the vectorizer prefers 512-bit
#   vectors where the native one (Intel's AVX-512 CPUs) prefers 256, and
#   ggml_ssm_conv's dot of 4 taps (d_conv 4: every Gated DeltaNet and Mamba
#   model) then falls to the scalar tail, which fuses the products into FMAs,
#   where llama.cpp's build takes a 4-wide vector loop of rounded products:
#   1 ulp on the convolution from the second token on, 7.7e-5 on a tiny F32
#   qwen35 file's logits, 7-12 on Qwen3.5-4B-shaped random weights;
# - features without a ggml option: AVX512-FP16 gives the F16 vector ops
#   (simd-mappings.h) half-precision arithmetic, which flash attention's V
#   accumulation uses for heads of 128 or more (the same 4B-shaped file, one
#   token a step, parted by 6-8 with -mtune=native alone); GFNI
#   (ggml-cpu/tiled) gives the same integers either way.

function(elelem_set_native_cpu_features)
    if (NOT CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
        # Other architectures: ggml's plain build (its own defaults).
        return()
    endif()
    execute_process(
        COMMAND ${CMAKE_C_COMPILER} -march=native -dM -E -x c /dev/null
        OUTPUT_VARIABLE macros
        RESULT_VARIABLE status
        ERROR_QUIET)
    if (NOT status EQUAL 0)
        message(WARNING "elelem: '${CMAKE_C_COMPILER} -march=native' failed; building the baseline x86-64 CPU module")
        return()
    endif()

    # ggml option -> the predefined macros that must all be present
    set(features
        "SSE42:__SSE4_2__"
        "AVX:__AVX__"
        "F16C:__F16C__"
        "FMA:__FMA__"
        "BMI2:__BMI2__"
        "AVX2:__AVX2__"
        "AVX_VNNI:__AVXVNNI__"
        "AVX512:__AVX512F__,__AVX512CD__,__AVX512VL__,__AVX512DQ__,__AVX512BW__"
        "AVX512_VBMI:__AVX512VBMI__"
        "AVX512_VNNI:__AVX512VNNI__"
        "AVX512_BF16:__AVX512BF16__"
        "AMX_TILE:__AMX_TILE__"
        "AMX_INT8:__AMX_INT8__"
        "AMX_BF16:__AMX_BF16__")
    set(ELELEM_NATIVE_ARCH_FLAGS "-march=native" PARENT_SCOPE)
    set(found "")
    foreach (entry ${features})
        string(REPLACE ":" ";" parts "${entry}")
        list(GET parts 0 option)
        list(GET parts 1 required)
        string(REPLACE "," ";" required "${required}")
        set(have ON)
        foreach (macro ${required})
            if (NOT macros MATCHES "#define ${macro} ")
                set(have OFF)
            endif()
        endforeach()
        set(GGML_${option} ${have} CACHE BOOL "" FORCE)
        if (have)
            list(APPEND found ${option})
        endif()
    endforeach()
    message(STATUS "elelem: native CPU module with: ${found}")
    # -march=native may use any extension the build machine has, also ones no
    # ggml option names (AVX512-FP16, GFNI, ...), which ggml's run-time check
    # does not test: every macro it predefines goes beside the module, and the
    # core checks the running CPU for those it knows (cpu_backend.pxi,
    # NATIVE_ISA_FILE), so that a native build moved to another CPU is an
    # ImportError, never a SIGILL.
    string(REGEX MATCHALL "#define __[A-Z0-9_]+__ 1\n" defined "${macros}")
    string(REGEX REPLACE "#define (__[A-Z0-9_]+__) 1\n" "\\1" defined "${defined}")
    string(REPLACE ";" "\n" defined "${defined}")
    file(WRITE "${CMAKE_LIBRARY_OUTPUT_DIRECTORY}/libggml-cpu.isa" "${defined}\n")
endfunction()


# After ggml's targets exist: the CPU module compiled for and tuned to this
# machine, as GGML_NATIVE would (the feature options above add nothing that
# -march=native leaves out).  Only the CPU module: llama.cpp compiles ggml-base
# without machine flags too.
function(elelem_compile_cpu_module_native)
    if (ELELEM_NATIVE_ARCH_FLAGS)
        target_compile_options(ggml-cpu PRIVATE ${ELELEM_NATIVE_ARCH_FLAGS})
    endif()
endfunction()
