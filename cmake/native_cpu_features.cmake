# The ISA extensions of the build machine's CPU, as ggml's GGML_<FEATURE>
# options.  The compiler itself answers: the macros it predefines under
# -march=native are exactly what a -march=native build would use.

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
endfunction()
