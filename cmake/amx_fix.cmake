# Force cmake/amx_tile_config_fix.h into ggml's AMX source, in every CPU
# backend target that compiles it (one per CPU variant).

function(elelem_apply_amx_tile_config_fix source)
    set(header ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/amx_tile_config_fix.h)
    set(cpu_targets "")
    foreach (backend ${GGML_AVAILABLE_BACKENDS})
        if (backend MATCHES "^ggml-cpu" AND TARGET ${backend})  # the list is cached across configures
            list(APPEND cpu_targets ${backend})
        endif()
    endforeach()
    if (NOT cpu_targets)
        message(FATAL_ERROR "elelem: no ggml CPU backend target to apply the AMX fix to")
    endif()
    set_source_files_properties(${source} TARGET_DIRECTORY ${cpu_targets}
        PROPERTIES COMPILE_OPTIONS "-include;${header}")
    message(STATUS "elelem: AMX tile-config fix applied to ${cpu_targets}")
endfunction()
