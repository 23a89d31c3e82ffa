# The CPU backend: one of the ggml modules in elelem/_lib, chosen at import
# for the running CPU, then reached through its registry entry.
#
# A native build ships one module (libggml-cpu.so, built for the build
# machine); the portable build ships ggml's ladder of variants: x86-64's
# (libggml-cpu-x64.so ... libggml-cpu-sapphirerapids.so) or Linux aarch64's
# (libggml-cpu-armv8.0_1.so ... libggml-cpu-armv9.2_2.so).  Each module
# exports ggml_backend_score(): 0 when this CPU lacks an instruction set it
# was compiled for, otherwise higher for more capable variants.  ggml's own
# ggml_backend_load_best() does the same scan, but falls back to a module
# that scored 0 (a native build on another CPU would die of SIGILL); here a
# CPU that no module supports is an ImportError that says what to do.
#
# The ARM variants are scored here from /proc/cpuinfo's Features instead
# (score_cpu_variants, the same rule as their own check, which reads the same
# kernel hwcaps through getauxval): a pure function of the feature set that
# tests can run on any machine, and no module is opened to be asked.

import glob as _glob

ctypedef int (*_backend_score_fn)() noexcept nogil

LIB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_lib")
CPU_MODULE_PREFIX = "libggml-cpu"
# ELELEM_CPU_VARIANT=haswell (say) loads that module instead of the best one,
# for benchmarks that compare kernel paths on one machine.
CPU_VARIANT_ENV = "ELELEM_CPU_VARIANT"

cdef ggml_backend_reg_t _cpu_reg = NULL
cdef ggml_backend_set_n_threads_t _cpu_set_n_threads = NULL
cdef ggml_backend_set_abort_callback_t _cpu_set_abort_callback = NULL
cdef ggml_threadpool_new_t _cpu_threadpool_new = NULL
cdef ggml_threadpool_free_t _cpu_threadpool_free = NULL
cdef ggml_backend_cpu_set_threadpool_t _cpu_set_threadpool = NULL
cdef dict _cpu_choice = {}
# What the loaded module and this CPU offer graph/matmul.pxi's kernel choice
# (_cpu_kernels, CpuKernels) is set below when the module is loaded.
# "0" in SMALL_BATCH_ENV leaves steps of generated tokens to ggml's
# one-column kernels; "avx2" takes the AVX2 kernels even where the CPU has
# AVX-512 VNNI (for tests and benchmarks).
SMALL_BATCH_ENV = "ELELEM_SMALL_BATCH"
# "0"/"1" overrides whether one-token steps take elelem's AVX-512 kernels of
# every type (kernels/small_batch.c, elelem_small_batch_one_token_pays); "0"
# also keeps them off the one-column K-quant kernels.  For benchmarks.
ONE_TOKEN_ENV = "ELELEM_SMALL_BATCH_ONE_TOKEN"
SMALL_BATCH_ISAS = {"": ELELEM_SMALL_BATCH_NONE, "avx2": ELELEM_SMALL_BATCH_AVX2,
                    "avx512": ELELEM_SMALL_BATCH_AVX512}


def _env_int(str name, int default):
    """An environment variable read as ggml reads it (atoi: 0 for text)."""
    value = os.environ.get(name)
    if value is None:
        return default
    match = re.match(r"\s*[+-]?\d+", value)
    return int(match.group()) if match else 0


# A native module is compiled with -march=native: it may use any extension of
# the build machine, beyond the ones ggml_backend_score checks.  Beside it,
# the macros the compiler predefined (cmake/native_cpu_features.cmake); each
# one below names the /proc/cpuinfo flag of its instructions.  A CPU lacking
# one is refused at import (an ImportError, not a SIGILL mid-step).
NATIVE_ISA_FILE = "libggml-cpu.isa"
ISA_MACRO_CPU_FLAGS = {
    "__SSE3__": "pni", "__SSSE3__": "ssse3", "__SSE4_1__": "sse4_1", "__SSE4_2__": "sse4_2",
    "__POPCNT__": "popcnt", "__AVX__": "avx", "__AVX2__": "avx2", "__F16C__": "f16c", "__FMA__": "fma",
    "__BMI__": "bmi1", "__BMI2__": "bmi2", "__LZCNT__": "abm", "__MOVBE__": "movbe", "__ADX__": "adx",
    "__AES__": "aes", "__PCLMUL__": "pclmulqdq", "__SHA__": "sha_ni", "__GFNI__": "gfni", "__VAES__": "vaes",
    "__VPCLMULQDQ__": "vpclmulqdq", "__AVXVNNI__": "avx_vnni", "__AVX512F__": "avx512f",
    "__AVX512CD__": "avx512cd", "__AVX512VL__": "avx512vl", "__AVX512DQ__": "avx512dq",
    "__AVX512BW__": "avx512bw", "__AVX512IFMA__": "avx512ifma", "__AVX512VBMI__": "avx512vbmi",
    "__AVX512VBMI2__": "avx512_vbmi2", "__AVX512VNNI__": "avx512_vnni", "__AVX512BITALG__": "avx512_bitalg",
    "__AVX512VPOPCNTDQ__": "avx512_vpopcntdq", "__AVX512BF16__": "avx512_bf16",
    "__AVX512FP16__": "avx512_fp16", "__AVX512VP2INTERSECT__": "avx512_vp2intersect",
    "__AMX_TILE__": "amx_tile", "__AMX_INT8__": "amx_int8", "__AMX_BF16__": "amx_bf16",
}


# The same for a native aarch64 module (cmake/native_cpu_features_arm.cmake):
# the ACLE feature macros its flags predefine, by the Features names of
# /proc/cpuinfo.  Only extensions a CPU may lack; the Armv8.0 baseline
# (fp, asimd) is every aarch64 CPU's.
ISA_MACRO_CPU_FLAGS.update({
    "__ARM_FEATURE_DOTPROD": "asimddp", "__ARM_FEATURE_MATMUL_INT8": "i8mm",
    "__ARM_FEATURE_FP16_VECTOR_ARITHMETIC": "asimdhp", "__ARM_FEATURE_FP16_SCALAR_ARITHMETIC": "fphp",
    "__ARM_FEATURE_FP16_FML": "asimdfhm", "__ARM_FEATURE_BF16_VECTOR_ARITHMETIC": "bf16",
    "__ARM_FEATURE_BF16_SCALAR_ARITHMETIC": "bf16", "__ARM_FEATURE_SVE": "sve", "__ARM_FEATURE_SVE2": "sve2",
    "__ARM_FEATURE_SVE_MATMUL_INT8": "svei8mm", "__ARM_FEATURE_SVE_BF16": "svebf16", "__ARM_FEATURE_SME": "sme",
    "__ARM_FEATURE_SME2": "sme2", "__ARM_FEATURE_ATOMICS": "atomics", "__ARM_FEATURE_QRDMX": "asimdrdm",
    "__ARM_FEATURE_JCVT": "jscvt", "__ARM_FEATURE_COMPLEX": "fcma", "__ARM_FEATURE_FRINT": "frint",
    "__ARM_FEATURE_RCPC": "lrcpc", "__ARM_FEATURE_CRC32": "crc32", "__ARM_FEATURE_AES": "aes",
    "__ARM_FEATURE_SHA2": "sha2", "__ARM_FEATURE_SHA3": "sha3", "__ARM_FEATURE_SHA512": "sha512",
    "__ARM_FEATURE_SM3": "sm3", "__ARM_FEATURE_SM4": "sm4",
})


def missing_native_isa(macros, cpu_flags):
    """The cpuinfo flags of ``macros`` (a native module's) that ``cpu_flags``
    lacks, sorted; macros of no known instruction set are not checked."""
    wanted = {ISA_MACRO_CPU_FLAGS[m] for m in macros if m in ISA_MACRO_CPU_FLAGS}
    return sorted(wanted - set(cpu_flags))


def cpuinfo_features(str text):
    """The CPU's feature names in the text of /proc/cpuinfo: x86's "flags",
    aarch64's "Features"; those every processor listed has, as a set.  None
    where the text names none (another architecture, a sandbox's stub)."""
    found = None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            names = set(value.split())
            found = names if found is None else found & names
    return found


def _cpuinfo_flags():
    """This CPU's features from /proc/cpuinfo; None where there is no such file."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return cpuinfo_features(f.read())
    except OSError:
        return None


# ggml's Linux aarch64 variants (GGML_CPU_ALL_VARIANTS in ggml/src/CMakeLists.txt)
# and the features each is compiled for, by ggml's names; then each feature's
# /proc/cpuinfo names and its weight in the score that ggml's own check gives
# (ggml-cpu/arch/arm/cpu-feats.cpp: 1 plus the weights of its features, 0
# when the CPU lacks one).  FP16 is the scalar and the vector half-precision
# arithmetic together (HWCAP_FPHP and HWCAP_ASIMDHP).
ARM_VARIANT_FEATURES = {
    "armv8.0_1": (),
    "armv8.2_1": ("DOTPROD",),
    "armv8.2_2": ("DOTPROD", "FP16"),
    "armv8.2_3": ("DOTPROD", "FP16", "SVE"),
    "armv8.6_1": ("DOTPROD", "FP16", "SVE", "MATMUL_INT8"),
    "armv8.6_2": ("DOTPROD", "FP16", "SVE", "MATMUL_INT8", "SVE2"),
    "armv9.2_1": ("DOTPROD", "FP16", "SVE", "MATMUL_INT8", "SME"),
    "armv9.2_2": ("DOTPROD", "FP16", "SVE", "MATMUL_INT8", "SVE2", "SME"),
}
ARM_FEATURE_CPUINFO = {
    "DOTPROD": (("asimddp",), 1 << 1),
    "FP16": (("fphp", "asimdhp"), 1 << 2),
    "SVE": (("sve",), 1 << 3),
    "MATMUL_INT8": (("i8mm",), 1 << 4),
    "SVE2": (("sve2",), 1 << 5),
    "SME": (("sme",), 1 << 6),
}


def score_cpu_variants(features, variants):
    """Each of ``variants`` (CPU module names) scored for a CPU with the
    /proc/cpuinfo ``features`` as the module's own ggml_backend_score would
    score it: 0 where the CPU lacks one of its features, more for more
    capable ones.  None for a variant this cannot score (x86's, a native
    module: their own check, or the native one, decides) and for every
    variant where ``features`` is None (unknown) or not an aarch64 CPU's:
    every one has asimd, and without it they are another machine's (under
    qemu-user /proc/cpuinfo is the host's; the modules' own check reads the
    emulated CPU's hwcaps)."""
    features = None if features is None or "asimd" not in features else set(features)
    scores = {}
    for name in variants:
        wanted = ARM_VARIANT_FEATURES.get(name)
        if wanted is None or features is None:
            scores[name] = None
            continue
        score = 1
        for feature in wanted:
            names, weight = ARM_FEATURE_CPUINFO[feature]
            if not set(names) <= features:
                score = 0
                break
            score += weight
        scores[name] = score
    return scores


def best_cpu_variant(scores):
    """The variant with the highest score above 0 (the first by name among
    equals), or None when none runs here."""
    runs = [name for name in sorted(scores) if scores[name] > 0]
    return max(runs, key=lambda name: scores[name]) if runs else None


cdef void _check_native_isa() except *:
    path = os.path.join(LIB_DIR, NATIVE_ISA_FILE)
    flags = _cpuinfo_flags()
    if flags is None or not os.path.exists(path):
        return
    with open(path) as f:
        missing = missing_native_isa(f.read().split(), flags)
    if missing:
        raise ImportError(
            f"this elelem was built for another CPU: its native CPU backend uses instructions this one "
            f"lacks ({', '.join(missing)}). Rebuild it here (pip install --force-reinstall --no-binary "
            "elelem elelem), or install the portable build (ELELEM_PORTABLE=1 pip install .)")


def _variant_name(str path):
    stem = os.path.basename(path)[len(CPU_MODULE_PREFIX):-len(".so")]
    return stem.lstrip("-") or "native"


cdef int _module_score(str path) except -2:
    """The module's own verdict on this CPU; -1 when it cannot even be opened."""
    cdef bytes bpath = os.fsencode(path)
    cdef void * handle = dlopen(<const char *> bpath, RTLD_NOW | RTLD_LOCAL)
    if handle == NULL:
        _log.debug("cannot open %s: %s", path, (<bytes> dlerror()).decode("utf-8", "replace"))
        return -1
    cdef _backend_score_fn score_fn = <_backend_score_fn> dlsym(handle, "ggml_backend_score")
    # A module without its own check is a native aarch64 build (ggml's
    # GGML_NATIVE adds none): it may run, and _check_native_isa decides.
    cdef int score = score_fn() if score_fn != NULL else 1
    dlclose(handle)
    return score


cdef void _load_cpu_backend() except *:
    global _cpu_reg, _cpu_set_n_threads, _cpu_set_abort_callback
    global _cpu_threadpool_new, _cpu_threadpool_free, _cpu_set_threadpool
    modules = sorted(_glob.glob(os.path.join(LIB_DIR, CPU_MODULE_PREFIX + "*.so")))
    if not modules:
        raise ImportError(f"elelem's CPU backend modules are missing from {LIB_DIR}; reinstall elelem")
    paths = {_variant_name(p): p for p in modules}
    scores = score_cpu_variants(_cpuinfo_flags(), paths)
    for name, score in scores.items():
        if score is None:
            scores[name] = _module_score(paths[name])
    forced = os.environ.get(CPU_VARIANT_ENV, "").strip()
    if forced:
        if forced not in scores:
            raise ImportError(f"{CPU_VARIANT_ENV}={forced!r}: this elelem has the CPU variants {sorted(scores)}")
        if scores[forced] <= 0:
            raise ImportError(f"{CPU_VARIANT_ENV}={forced!r}: this CPU lacks instructions that variant needs")
        chosen = forced
    else:
        chosen = best_cpu_variant(scores)
        if chosen is None:
            raise ImportError(
                "this elelem was built for another CPU: none of its CPU backends "
                f"({', '.join(sorted(scores))}) runs on this one. Rebuild it here "
                "(pip install --force-reinstall --no-binary elelem elelem), or install the portable "
                "build (ELELEM_PORTABLE=1 pip install .)")
    if chosen == "native":
        _check_native_isa()
    cdef bytes bpath = os.fsencode(paths[chosen])
    cdef const char * cpath = bpath
    with nogil:
        _cpu_reg = ggml_backend_load(cpath)
    if _cpu_reg == NULL:
        raise ImportError(f"ggml could not load its CPU backend {paths[chosen]}")
    _cpu_set_n_threads = <ggml_backend_set_n_threads_t> ggml_backend_reg_get_proc_address(
        _cpu_reg, "ggml_backend_set_n_threads")
    _cpu_set_abort_callback = <ggml_backend_set_abort_callback_t> ggml_backend_reg_get_proc_address(
        _cpu_reg, "ggml_backend_set_abort_callback")
    _cpu_threadpool_new = <ggml_threadpool_new_t> ggml_backend_reg_get_proc_address(_cpu_reg, "ggml_threadpool_new")
    _cpu_threadpool_free = <ggml_threadpool_free_t> ggml_backend_reg_get_proc_address(_cpu_reg, "ggml_threadpool_free")
    _cpu_set_threadpool = <ggml_backend_cpu_set_threadpool_t> ggml_backend_reg_get_proc_address(
        _cpu_reg, "ggml_backend_cpu_set_threadpool")
    if _cpu_set_n_threads == NULL or _cpu_set_abort_callback == NULL or _cpu_threadpool_new == NULL or \
            _cpu_threadpool_free == NULL or _cpu_set_threadpool == NULL or \
            ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU) == NULL:
        raise ImportError(f"{paths[chosen]} is not a ggml CPU backend elelem can drive")
    _cpu_choice.update(variant=chosen, path=paths[chosen], scores=scores, forced=bool(forced))
    compiled = {name for name, value in _cpu_features() if value == "1"}
    _cpu_kernels.tinyblas_quantized = "LLAMAFILE" in compiled and "AVX" in compiled
    _cpu_kernels.tiled_min_columns = INT64_MAX if "AVX" not in compiled or _env_int("GGML_CPU_TILED_MM", 1) == 0 \
        else 1 if _env_int("GGML_CPU_TILED_MM_FORCE", 0) == 1 else 8
    # elelem's kernels give the numbers of the module's one-column kernels only
    # where those are ggml's AVX2 ones (kernels/small_batch_avx2.c).
    cdef int cpu_isa = elelem_small_batch_cpu()
    _cpu_choice.update(small_batch_cpu=_isa_name(cpu_isa))
    requested = os.environ.get(SMALL_BATCH_ENV, "").strip().lower()
    if requested not in ("", "1", "0", "avx2", "avx512"):
        _log.warning("%s=%r: expected 0, avx2 or avx512; using the best kernels for this CPU", SMALL_BATCH_ENV, requested)
    wanted = SMALL_BATCH_ISAS[requested] if requested in ("avx2", "avx512") else cpu_isa
    _cpu_kernels.small_batch_isa = ELELEM_SMALL_BATCH_NONE if requested == "0" or not {"AVX2", "FMA", "F16C"} <= compiled \
        else min(cpu_isa, wanted)
    _cpu_kernels.small_batch_one_token = _one_token_choice(_cpu_kernels.small_batch_isa)
    _cpu_kernels.one_column_k_quants = os.environ.get(ONE_TOKEN_ENV, "").strip() != "0"
    _log.debug("CPU backend: %s (scores %s)", chosen, scores)


cdef ggml_backend_t _new_cpu_backend(int n_threads, volatile int * abort_flag) except NULL:
    cdef ggml_backend_t backend = ggml_backend_dev_init(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU), NULL)
    if backend == NULL:
        raise MemoryError("ggml could not start a CPU backend")
    _cpu_set_n_threads(backend, n_threads)
    _cpu_set_abort_callback(backend, _abort_requested, <void *> abort_flag)
    return backend


cdef ggml_threadpool * _new_cpu_threadpool(ggml_backend_t backend, int n_threads) except NULL:
    """Worker threads of the context's own, kept for its life, and given to its CPU backend.

    Why not ggml's default: built with OpenMP, ggml starts every step in an
    OpenMP team of the calling thread, and every Python thread that steps
    (sessions in threads, the server's workers) gets a team of its own.  Once
    there are more OpenMP threads than cores, libgomp stops spinning at
    barriers and sleeps on a futex at each of a step's hundreds: measured on
    2 cores, a one-token step of Qwen2.5-Coder-0.5B took 30-40 ms from a
    second thread against 18-22 ms from the first.  Built without OpenMP (setup.py),
    ggml's own pool serves any calling thread alike, and keeping one per
    context saves starting threads at every step."""
    cdef ggml_threadpool_params params = ggml_threadpool_params_default(n_threads)
    # Workers sleep as soon as a step ends.  ggml's default (poll 50) has them
    # spin for new work for a long while first, and a pool spinning between its
    # steps takes the cores of every other: two contexts stepping in turn (a
    # draft model and its target, two models in one process) took 12 ms a step
    # on 2 cores against 6 alone (SmolLM2-135M).  With poll 0 they take 6.2,
    # and one context alone is as fast as before (benchmarks/calling_threads.py).
    params.poll = 0
    cdef ggml_threadpool * pool = _cpu_threadpool_new(&params)
    if pool == NULL:
        raise MemoryError("ggml could not start its CPU threads")
    _cpu_set_n_threads(backend, n_threads)
    _cpu_set_threadpool(backend, pool)
    return pool


cdef list _cpu_features():
    cdef ggml_backend_get_features_t get = <ggml_backend_get_features_t> ggml_backend_reg_get_proc_address(
        _cpu_reg, "ggml_backend_get_features")
    cdef ggml_backend_feature * f = get(_cpu_reg) if get != NULL else NULL
    out = []
    while f != NULL and f.name != NULL:
        out.append((f.name.decode(), f.value.decode()))
        f += 1
    return out


cdef list _cpu_extra_buffer_types():
    cdef ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)
    cdef ggml_backend_dev_get_extra_bufts_t get_extra = <ggml_backend_dev_get_extra_bufts_t> \
        ggml_backend_reg_get_proc_address(_cpu_reg, "ggml_backend_dev_get_extra_bufts")
    cdef ggml_backend_buffer_type_t * bufts = get_extra(dev) if get_extra != NULL else NULL
    out = []
    cdef int i = 0
    while bufts != NULL and bufts[i] != NULL:
        out.append(ggml_backend_buft_name(bufts[i]).decode())
        i += 1
    return out


def cpu_backend_info():
    """What was loaded for this CPU: the variant and its score among those
    shipped, the features it was compiled with, its repack buffer types."""
    return {
        "variant": _cpu_choice["variant"],
        "module": _cpu_choice["path"],
        "forced": _cpu_choice["forced"],
        "scores": dict(_cpu_choice["scores"]),
        "description": ggml_backend_dev_description(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)).decode(),
        "features": _cpu_features(),
        "extra_buffer_types": _cpu_extra_buffer_types(),
        "small_batch_cpu": _cpu_choice["small_batch_cpu"],
        "small_batch_isa": _isa_name(_cpu_kernels.small_batch_isa),
        "small_batch_kernels": _cpu_kernels.small_batch_isa != ELELEM_SMALL_BATCH_NONE,
        "small_batch_one_token": _cpu_kernels.small_batch_one_token,
        "one_column_k_quants": _cpu_kernels.one_column_k_quants and _cpu_kernels.small_batch_isa != ELELEM_SMALL_BATCH_NONE,
    }


cdef str _isa_name(int isa):
    return next(name for name, value in SMALL_BATCH_ISAS.items() if value == isa)


def _set_small_batch_isa(str name):
    """Use the small-batch kernels of this instruction set ("" = off) in
    graphs built from now on; returns the one in use before.  For tests that
    check the AVX2 kernels on a CPU that would choose AVX-512's."""
    if name not in SMALL_BATCH_ISAS:
        raise ValueError(f"unknown small-batch kernels {name!r}: expected one of {sorted(SMALL_BATCH_ISAS)}")
    cdef int isa = SMALL_BATCH_ISAS[name]
    if isa > elelem_small_batch_cpu():
        raise ValueError(f"this CPU cannot run the {name} small-batch kernels")
    before = _isa_name(_cpu_kernels.small_batch_isa)
    _cpu_kernels.small_batch_isa = isa
    _cpu_kernels.small_batch_one_token = _one_token_choice(isa)
    return before


cdef bint _one_token_choice(int isa):
    if isa != ELELEM_SMALL_BATCH_AVX512:
        return False
    requested = os.environ.get(ONE_TOKEN_ENV, "").strip()
    if requested in ("0", "1"):
        return requested == "1"
    return elelem_small_batch_one_token_pays() != 0
