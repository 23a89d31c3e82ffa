/* Forced (-include) into ggml-cpu/amx/mmq.cpp by cmake/amx_fix.cmake.
 *
 * GCC 12's amxtileintrin.h writes _tile_loadconfig as
 *     __asm__ volatile ("ldtilecfg\t%X0" :: "m" (*((const void **)__config)));
 * which tells the compiler the instruction reads 8 bytes.  ldtilecfg reads a
 * 64-byte tile configuration, and at -O2 GCC deletes the stores into the rest
 * of it (ggml_tile_config_init's rows and colsb), so ldtilecfg loads a config
 * with no tiles and the first tile load faults (SIGSEGV, si_code SI_KERNEL).
 * Reported for ggml as ggml-org/llama.cpp#20824; GCC 13 reads the operand as
 * the whole structure.  Here the operand is given its real 64-byte size.
 */
#ifndef ELELEM_AMX_TILE_CONFIG_FIX_H
#define ELELEM_AMX_TILE_CONFIG_FIX_H

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13 && defined(__x86_64__)
#include <immintrin.h> /* first, so the header's own declaration is not renamed below */

struct elelem_tile_config_bytes {
    unsigned char bytes[64];
};

static inline void elelem_tile_loadconfig(const void * config) {
    __asm__ volatile("ldtilecfg\t%X0" ::"m"(*(const struct elelem_tile_config_bytes *) config));
}

#define _tile_loadconfig(config) elelem_tile_loadconfig(config)
#endif

#endif
