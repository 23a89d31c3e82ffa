# aarch64: what elelem adds to ggml's build there (the native module, and the
# portable one's compiler check below).
#
# The native CPU module on aarch64: ggml's own native build, as llama.cpp's
# GGML_NATIVE build on ARM is.  ggml asks the compiler which CPU -mcpu=native
# means, then compiles and runs a probe for each extension it uses (dotprod,
# i8mm, SVE, SME) and adds +ext or +noext, since -mcpu=native alone does not
# enable all of them with every compiler; elelem's numbers are llama.cpp's
# only when both are compiled alike.
#
# Unlike x86 (native_cpu_features.cmake), ggml refuses nothing here:
# GGML_NATIVE with GGML_BACKEND_DL is rejected on x86 only.  But the module
# then has no ggml_backend_score of its own, so what it was compiled for is
# written beside it (libggml-cpu.isa: the ACLE feature macros its flags
# predefine), and the core checks the running CPU's /proc/cpuinfo Features
# for them (cpu_backend.pxi): a native build moved to a lesser CPU is an
# ImportError, never a SIGILL.

function(elelem_set_native_cpu_features_arm)
    set(GGML_NATIVE ON CACHE BOOL "" FORCE)
    message(STATUS "elelem: native aarch64 CPU module (ggml's GGML_NATIVE detection)")
endfunction()


# After ggml's targets exist: the macros of the flags ggml compiles the CPU
# module with.
function(elelem_write_native_isa_arm)
    get_target_property(options ggml-cpu COMPILE_OPTIONS)
    set(flags "")
    foreach (option ${options})
        # the machine flags (-mcpu=...+ext) and the -U__ARM_FEATURE_... that
        # ggml adds where a probe failed; nothing else changes the macros
        if (option MATCHES "^-m" OR option MATCHES "^-U__ARM_FEATURE_")
            list(APPEND flags ${option})
        endif()
    endforeach()
    execute_process(
        COMMAND ${CMAKE_C_COMPILER} ${flags} -dM -E -x c /dev/null
        OUTPUT_VARIABLE macros
        RESULT_VARIABLE status
        ERROR_QUIET)
    if (NOT status EQUAL 0)
        message(FATAL_ERROR "elelem: '${CMAKE_C_COMPILER} ${flags} -dM -E' failed: cannot say what the native CPU module needs")
    endif()
    string(REGEX MATCHALL "#define __ARM_FEATURE_[A-Z0-9_]+ 1\n" defined "${macros}")
    string(REGEX REPLACE "#define (__ARM_FEATURE_[A-Z0-9_]+) 1\n" "\\1" defined "${defined}")
    string(REPLACE ";" "\n" defined "${defined}")
    file(WRITE "${CMAKE_LIBRARY_OUTPUT_DIRECTORY}/libggml-cpu.isa" "${defined}\n")
    message(STATUS "elelem: native CPU module flags ${flags}")
endfunction()


# The portable aarch64 build: ggml's Linux ladder ends with Armv9.2 variants
# that use SME, and a compiler that cannot target them fails deep in the
# build; say so before it starts.
function(elelem_check_arm_variants_compiler)
    include(CheckCCompilerFlag)
    check_c_compiler_flag("-march=armv9.2-a+dotprod+fp16+sve+i8mm+sve2+sme" ELELEM_CC_HAS_ARMV9_2_SME)
    if (NOT ELELEM_CC_HAS_ARMV9_2_SME)
        message(FATAL_ERROR "elelem: ELELEM_PORTABLE=1 on aarch64 builds ggml's ARM variants up to "
            "armv9.2 with SME, which ${CMAKE_C_COMPILER} (${CMAKE_C_COMPILER_ID} ${CMAKE_C_COMPILER_VERSION}) "
            "cannot target (-march=armv9.2-a+sme). Use a newer compiler (clang 19 does; GCC 12 does not), "
            "e.g. CC=clang-19 CXX=clang++-19, or build the native module (without ELELEM_PORTABLE).")
    endif()
endfunction()
