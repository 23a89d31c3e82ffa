# Which kernel computes a product x @ w, and the graph pieces that build it.
# Included into core.pyx after blocks.pxi (whose linear() and attention call
# matmul()) and before experts.pxi (which asks experts_kernel_takes()).
#
# One decision, matmul_path(), from the facts of one product (MatmulCase)
# and of the CPU module (CpuKernels): tests/test_kernel_choice.py table-tests
# it.  The rule behind every choice is one goal and one speed-up:
# - a row gets the numbers it gets in its own step (a generated token: its
#   one-token step's; a prompt: its own prompt step's), because ggml's CPU
#   kernels round differently with a product's width and batching must never
#   change an answer;
# - within that, the kernel that reads and decodes the weight least.
# The measurements behind each choice are in docs/internals.md, "Kernel
# choice".

ctypedef struct CpuKernels:
    # What the loaded CPU module and this CPU offer (cpu_backend.pxi sets _cpu_kernels).
    bint tinyblas_quantized     # ggml runs quantized matmuls of 2+ columns through llamafile's tinyBLAS
                                # (x86 with AVX: Q8_0, Q4_0, Q5_0, IQ4_NL weights)
    int64_t tiled_min_columns   # ...K-quant and IQ ones from this many columns through its tiled kernel
                                # (ggml-cpu/tiled; 8, 1 when forced, INT64_MAX when off)
    int small_batch_isa         # elelem's small-batch kernels (kernels/small_batch.h), NONE when off
    bint small_batch_one_token  # one-token steps take them too (where that is faster: AMD's AVX-512)
    bint one_column_k_quants    # one-token steps take the one-column K-quant kernels (repacked Q4_K, Q6_K)


cdef CpuKernels _cpu_kernels
_cpu_kernels.tiled_min_columns = INT64_MAX


cdef enum MatmulPath:
    MATMUL_GGML                 # ggml_mul_mat (a Q5_0 weight's Q8_0 copy for 2+ columns, widen.pxi)
    MATMUL_PER_RUN              # ggml_mul_mat per sequence's run of columns
    MATMUL_RUNS_AS_ALONE        # matmul() per sequence's run of columns, as in its own step
    MATMUL_OUTPUT_RUNS_AS_ALONE # matmul() per sequence's run of output rows, as in its own step
    MATMUL_SMALL_BATCH          # elelem's small-batch kernels
    MATMUL_SMALL_BATCH_Q4_K     # elelem's kernel for repacked Q4_K
    MATMUL_ONE_COLUMN_EACH      # ggml's one-column kernel on each column, the weight read once

MATMUL_PATH_NAMES = ("ggml", "per_run", "runs_as_alone", "output_runs_as_alone", "small_batch",
                     "small_batch_q4_k", "one_column_each")


ctypedef struct MatmulCase:
    # The weight
    ggml_type type
    bint plain              # in no extra buffer: neither repacked nor in AMX tiles (w.extra == NULL)
    bint host               # in host memory (a CPU buffer)
    bint repacked           # in ggml's CPU_REPACK buffer (its gemv for one column, gemm from 4)
    bint rows_of_8          # its rows a multiple of 8 (repacked Q4_K: block_q4_Kx8)
    bint adapter            # a LoRA factor (graph/lora.pxi): small, F32/F16/BF16/Q8_0
    # The columns
    int64_t n
    bint x_f32
    bint x_simple           # 2-D and contiguous
    # The step
    bint decode_kernels     # every row a generated token's (Step.decode_kernels)
    bint step_runs          # the columns are a prompt step's tokens, of 2+ sequences' runs
    bint output_runs        # the columns are a step's output rows, of 2+ sequences' runs
    bint output_rows        # the step runs on its output rows now (the last layer's FFN, the head)


cdef inline bint _float_type(ggml_type t) noexcept:
    return t == GGML_TYPE_F32 or t == GGML_TYPE_F16 or t == GGML_TYPE_BF16


cdef inline bint _plain_quantized_case(const MatmulCase * c) noexcept:
    return c.plain and c.host and not _float_type(c.type)


cdef inline bint _repacked_q4_k_case(const MatmulCase * c) noexcept:
    """Repacked Q4_K: on x86 with AVX2 its layout is block_q4_Kx8 (kernels/small_batch_q4_k.c)."""
    return c.type == GGML_TYPE_Q4_K and c.rows_of_8 and c.repacked


cdef inline bint _tinyblas_type(ggml_type t) noexcept:
    return t == GGML_TYPE_Q8_0 or t == GGML_TYPE_Q4_0 or t == GGML_TYPE_Q5_0 or t == GGML_TYPE_IQ4_NL


cdef inline bint _tiled_type(ggml_type t) noexcept:
    """The weight types ggml's tiled CPU matmul takes (tiled.cpp: ggml_tiled_supported)."""
    return (t == GGML_TYPE_Q6_K or t == GGML_TYPE_Q5_K or t == GGML_TYPE_Q4_K or t == GGML_TYPE_Q3_K
            or t == GGML_TYPE_Q2_K or t == GGML_TYPE_IQ4_XS or t == GGML_TYPE_IQ2_XXS or t == GGML_TYPE_IQ2_XS
            or t == GGML_TYPE_IQ2_S or t == GGML_TYPE_IQ3_XXS or t == GGML_TYPE_IQ3_S or t == GGML_TYPE_IQ1_S
            or t == GGML_TYPE_IQ1_M)


cdef inline bint _tiled_on(const CpuKernels * k) noexcept:
    return k.tiled_min_columns > 1 and k.tiled_min_columns != INT64_MAX


cdef inline bint _tiled_weight(const MatmulCase * c, const CpuKernels * k) noexcept:
    """A weight whose products ggml's tiled kernel takes from k.tiled_min_columns
    columns (vec_dot below), which round otherwise."""
    return _tiled_on(k) and c.plain and c.host and _tiled_type(c.type)


cdef inline bint _width_dependent(const MatmulCase * c, const CpuKernels * k) noexcept:
    """A weight whose CPU kernel, and so a column's numbers, changes with the
    number of columns in a prompt step: F32/F16 (vec_dot for one column,
    tinyBLAS from two), repacked (gemv, gemm from 4), or a K-quant or IQ type
    of ggml's tiled kernel."""
    if not c.host:
        return False
    if c.repacked:
        return True
    if not c.plain:
        return False
    if c.type == GGML_TYPE_F32 or c.type == GGML_TYPE_F16:
        return True
    return _tiled_weight(c, k)


cdef inline bint _small_batch_takes(const MatmulCase * c, const CpuKernels * k) noexcept:
    """Whether elelem's small-batch kernels compute the product: where they give
    the numbers ggml's one-column kernels would, and those are the numbers
    wanted.
    - A step of generated tokens: its one-token steps' numbers (in groups of 8
      columns past 8).  One token only where the CPU gains from it
      (small_batch_one_token), except one Q6_K column with AVX-512 (two rows a
      zmm, reading ahead), which takes it on every CPU, prompt or not.
    - Any other product of 2+ columns that ggml would run as its one-column
      kernel on every column: a weight neither tinyBLAS nor the tiled kernel
      takes (Q4_1 always, Q6_K below the tiled kernel's width)."""
    if (k.small_batch_isa == ELELEM_SMALL_BATCH_NONE or not c.x_f32 or not c.x_simple
            or not _plain_quantized_case(c) or not elelem_small_batch_serves(c.type)):
        return False
    if (c.n == 1 and c.type == GGML_TYPE_Q6_K and k.one_column_k_quants
            and k.small_batch_isa == ELELEM_SMALL_BATCH_AVX512):
        return True
    if c.decode_kernels:
        return c.n >= 2 or k.small_batch_one_token
    if k.tinyblas_quantized and _tinyblas_type(c.type):
        return False
    return 2 <= c.n < (k.tiled_min_columns if c.type == GGML_TYPE_Q6_K else INT64_MAX)


cdef int matmul_path(const MatmulCase * c, const CpuKernels * k) noexcept:
    """The kernel for one product (MatmulPath), in order of precedence."""
    # A prompt step of several sequences: each run's columns as in its own step,
    # where the kernel changes with the width -- repacked weights (ggml's gemm
    # takes 4 columns at a time, the rest one by one), K-quants of the tiled
    # kernel, and the output rows' width-dependent weights (a router's F32, a
    # Q6_K head).  Only there: splitting reads the weight once a run.
    if c.step_runs and c.repacked and c.x_simple:
        return MATMUL_PER_RUN
    if (c.step_runs and not c.output_rows and c.n >= k.tiled_min_columns and _tiled_weight(c, k)
            and _plain_quantized_case(c) and c.x_simple):
        return MATMUL_RUNS_AS_ALONE
    if c.output_runs and c.x_simple and _width_dependent(c, k):
        return MATMUL_OUTPUT_RUNS_AS_ALONE
    if _small_batch_takes(c, k):
        return MATMUL_SMALL_BATCH
    # A float weight (a MoE router's F32, a LoRA factor, an F16 or BF16 model)
    # in a step of generated tokens: each column as its one-token step (sgemm
    # rounds otherwise, and a router may then choose another expert).  F16
    # and BF16 model weights where the CPU computes them.
    if (c.decode_kernels and c.n >= 2 and _float_type(c.type) and c.plain and c.x_simple
            and (c.type == GGML_TYPE_F32 or c.adapter or c.host)):
        return MATMUL_ONE_COLUMN_EACH
    if (c.n == 1 and k.one_column_k_quants and k.small_batch_isa != ELELEM_SMALL_BATCH_NONE and c.x_f32
            and c.x_simple and _repacked_q4_k_case(c)):
        return MATMUL_SMALL_BATCH_Q4_K
    if not c.decode_kernels or not c.x_simple or not (_plain_quantized_case(c) or c.repacked):
        return MATMUL_GGML
    # A step of generated tokens, of any width: one-token numbers, away from
    # tinyBLAS's tiles, ggml's tiled kernel and the repacked gemm (each rounds
    # otherwise than the one-column kernel a one-token step takes).
    if c.n >= 2 and k.small_batch_isa != ELELEM_SMALL_BATCH_NONE and c.x_f32 and _repacked_q4_k_case(c):
        return MATMUL_SMALL_BATCH_Q4_K
    if c.n < 2:
        return MATMUL_GGML
    return MATMUL_ONE_COLUMN_EACH


cdef bint experts_kernel_takes(const MatmulCase * c, const CpuKernels * k) noexcept:
    """Whether elelem's experts kernel (kernels/experts.h) computes the chosen
    experts of a weight stack for a step of c.n rows.  It gives each row the
    numbers of ggml's one-column kernel of that type, reading each chosen
    expert once for all the rows that chose it (ggml: once a row).
    - Repacked Q4_K: ggml's CPU_REPACK mul_mat_id runs its one-column gemv
      for every row of every step, so these are its numbers, prompt or not.
    - Q6_K (with AVX-512): ggml's vec_dot is its one-column kernel, which a
      row of a one-token step takes; in a step of generated tokens each row
      is such a step's.  A prompt's rows keep ggml's tiled kernel, which
      llama.cpp's prompt takes from 8 rows an expert.
    One-token steps only where the one-column K-quant kernels are on."""
    if k.small_batch_isa == ELELEM_SMALL_BATCH_NONE or (c.n == 1 and not k.one_column_k_quants) or not c.x_f32:
        return False
    if _repacked_q4_k_case(c):
        return True
    return (c.type == GGML_TYPE_Q6_K and k.small_batch_isa == ELELEM_SMALL_BATCH_AVX512 and _plain_quantized_case(c)
            and (c.decode_kernels or c.n == 1))


cdef inline bint _is_repacked(const ggml_tensor * w) noexcept:
    return (w.extra != NULL and w.buffer != NULL
            and strcmp(ggml_backend_buft_name(ggml_backend_buffer_get_type(w.buffer)), b"CPU_REPACK") == 0)


cdef inline bint _is_lora_factor(const ggml_tensor * w) noexcept:
    """A LoRA adapter's A or B (adapter.pxi keeps the file's names: <weight>.lora_a / .lora_b)."""
    cdef size_t n = strlen(w.name)
    return n > 7 and (strcmp(w.name + n - 7, b".lora_a") == 0 or strcmp(w.name + n - 7, b".lora_b") == 0)


cdef MatmulCase matmul_case(Step * st, const ggml_tensor * w, const ggml_tensor * x, int64_t n) noexcept:
    """The facts of the product of w by n columns x in step st (x NULL: F32
    columns as the graph makes them, for a choice made before they exist)."""
    cdef MatmulCase c
    c.type = w.type
    c.plain = w.extra == NULL
    c.host = w.buffer != NULL and ggml_backend_buffer_is_host(w.buffer)
    c.repacked = _is_repacked(w)
    c.rows_of_8 = w.ne[1] % 8 == 0
    c.adapter = _is_lora_factor(w)
    c.n = n
    c.x_f32 = x == NULL or x.type == GGML_TYPE_F32
    c.x_simple = x == NULL or (x.ne[2] == 1 and x.ne[3] == 1 and ggml_is_contiguous(x))
    c.decode_kernels = st.decode_kernels
    c.step_runs = st.n_runs > 1 and n == st.n_tokens
    c.output_runs = st.output_rows and st.n_out_runs > 1 and n == st.n_outputs
    c.output_rows = st.output_rows
    return c


def _matmul_path(**facts):
    """The kernel matmul_path() chooses for the given facts (MatmulCase's and
    CpuKernels' fields; small_batch_isa by name), by name: for tests."""
    cdef MatmulCase c
    cdef CpuKernels k
    name = facts.pop("type").encode()
    cdef int t = next((i for i in range(GGML_TYPE_COUNT) if ggml_type_name(<ggml_type> i) == name), -1)
    if t < 0:
        raise ValueError(f"unknown ggml type {name!r}")
    c.type = <ggml_type> t
    c.plain = facts.pop("plain", True)
    c.host = facts.pop("host", True)
    c.repacked = facts.pop("repacked", False)
    c.rows_of_8 = facts.pop("rows_of_8", True)
    c.adapter = facts.pop("adapter", False)
    c.n = facts.pop("n")
    c.x_f32 = facts.pop("x_f32", True)
    c.x_simple = facts.pop("x_simple", True)
    c.decode_kernels = facts.pop("decode_kernels", False)
    c.step_runs = facts.pop("step_runs", False)
    c.output_runs = facts.pop("output_runs", False)
    c.output_rows = facts.pop("output_rows", False)
    k.tinyblas_quantized = facts.pop("tinyblas_quantized", True)
    k.tiled_min_columns = facts.pop("tiled_min_columns", 8)
    k.small_batch_isa = SMALL_BATCH_ISAS[facts.pop("small_batch_isa", "avx512")]
    k.small_batch_one_token = facts.pop("small_batch_one_token", False)
    k.one_column_k_quants = facts.pop("one_column_k_quants", True)
    experts = facts.pop("experts", False)
    if facts:
        raise TypeError(f"unknown facts: {sorted(facts)}")
    if experts:
        return "experts" if experts_kernel_takes(&c, &k) else "ggml"
    return MATMUL_PATH_NAMES[matmul_path(&c, &k)]


# -- the paths' graph pieces -------------------------------------------------------------

cdef inline ggml_tensor * _one_column_each(Step * st, ggml_tensor * w, ggml_tensor * x) noexcept:
    """x @ w as n matrices of one column, w broadcast over them: ggml runs each
    with the kernel of a one-token step (tinyBLAS declines one column), each
    weight row read once for all n (ggml's 16 x 16 blocks)."""
    cdef ggml_tensor * y = ggml_mul_mat(st.ctx, w, ggml_reshape_3d(st.ctx, x, x.ne[0], 1, x.ne[1]))
    return ggml_reshape_2d(st.ctx, y, y.ne[0], x.ne[1])


cdef inline ggml_tensor * _small_batch(Step * st, ggml_tensor * w, ggml_tensor * x) noexcept:
    """x @ w by elelem's kernels (kernels/small_batch.h): the columns quantized
    by the CPU backend (as its mul_mat does), paired, then every weight block
    decoded once for all of them.  The numbers are those of _one_column_each."""
    cdef ggml_tensor * args[2]
    cdef ggml_type columns_type = elelem_small_batch_activation_type(w.type)
    cdef void * isa = <void *> <uintptr_t> _cpu_kernels.small_batch_isa
    if st.paired_of != x or st.paired_type != columns_type:
        args[0] = ggml_cpy(st.ctx, x, ggml_new_tensor_2d(st.ctx, columns_type, x.ne[0], x.ne[1]))
        st.paired = ggml_custom_4d(st.ctx, GGML_TYPE_I8,
                                   elelem_small_batch_prepared_bytes(_cpu_kernels.small_batch_isa, w.type,
                                                                     x.ne[0], x.ne[1]),
                                   1, 1, 1, args, 1, elelem_small_batch_prepare, GGML_N_TASKS_MAX, isa)
        st.paired_of = x
        st.paired_type = columns_type
    args[0] = w
    args[1] = st.paired
    return ggml_custom_4d(st.ctx, GGML_TYPE_F32, w.ne[1], x.ne[1], 1, 1, args, 2,
                          elelem_small_batch_matmul, GGML_N_TASKS_MAX, isa)


cdef inline ggml_tensor * _small_batch_q4_k(Step * st, ggml_tensor * w, ggml_tensor * x) noexcept:
    """x @ w for a repacked Q4_K weight by elelem's kernel: the columns
    quantized to Q8_K by the CPU backend (as its mul_mat does), then every
    interleaved block unpacked once for all of them, with the numbers of the
    one-column gemv of _one_column_each.  The weight travels as the op's
    userdata: the CPU backend would refuse an op with a repacked source."""
    cdef ggml_tensor * args[1]
    args[0] = ggml_cpy(st.ctx, x, ggml_new_tensor_2d(st.ctx, GGML_TYPE_Q8_K, x.ne[0], x.ne[1]))
    return ggml_custom_4d(st.ctx, GGML_TYPE_F32, w.ne[1], x.ne[1], 1, 1, args, 1,
                          elelem_small_batch_q4_k_matmul_avx512
                          if _cpu_kernels.small_batch_isa == ELELEM_SMALL_BATCH_AVX512
                          else elelem_small_batch_q4_k_matmul, GGML_N_TASKS_MAX, <void *> w)


cdef ggml_tensor * _by_runs(Step * st, ggml_tensor * w, ggml_tensor * x, const int * run_length, int n_runs,
                            bint as_alone) noexcept:
    """x @ w one run of columns at a time, concatenated: each run through
    matmul() as in its own step (as_alone), or through ggml_mul_mat."""
    cdef ggml_tensor * out = NULL
    cdef ggml_tensor * part
    cdef ggml_tensor * columns
    cdef int r, start = 0
    for r in range(n_runs):
        columns = ggml_view_2d(st.ctx, x, x.ne[0], run_length[r], x.nb[1], <size_t> start * x.nb[1])
        if as_alone:
            part = matmul(st, w, columns)
        else:
            part = ggml_mul_mat(st.ctx, widened_weight(st.widened, w, columns), columns)
        out = part if out == NULL else ggml_concat(st.ctx, out, part, 1)
        start += run_length[r]
    return out


cdef ggml_tensor * matmul(Step * st, ggml_tensor * w, ggml_tensor * x) noexcept:
    """x @ w: (n_in, n) -> (n_out, n), by the kernel matmul_path() chooses."""
    cdef MatmulCase c = matmul_case(st, w, x, x.ne[1])
    cdef int path = matmul_path(&c, &_cpu_kernels)
    if path == MATMUL_PER_RUN:
        return _by_runs(st, w, x, st.run_length, st.n_runs, False)
    if path == MATMUL_RUNS_AS_ALONE:
        return _by_runs(st, w, x, st.run_length, st.n_runs, True)
    if path == MATMUL_OUTPUT_RUNS_AS_ALONE:
        return _by_runs(st, w, x, st.out_run_length, st.n_out_runs, True)
    if path == MATMUL_SMALL_BATCH:
        return _small_batch(st, w, x)
    if path == MATMUL_SMALL_BATCH_Q4_K:
        return _small_batch_q4_k(st, w, x)
    w = widened_weight(st.widened, w, x)   # one column keeps the smaller Q5_0 weight
    if path == MATMUL_ONE_COLUMN_EACH:
        return _one_column_each(st, w, x)
    return ggml_mul_mat(st.ctx, w, x)
