# The raw ggml / ggml-alloc / ggml-backend / ggml-cpu / gguf C API that
# elelem._core uses (included first by core.pyx), and nothing else: no elelem types live here.
# Structs declare only the fields the core reads or writes.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t
from libcpp cimport bool as cbool  # the extension is C++; ggml's callbacks return C bool


cdef extern from "ggml.h" nogil:
    enum: GGML_MAX_DIMS
    enum: GGML_MAX_NAME
    enum: GGML_DEFAULT_GRAPH_SIZE
    enum: GGML_ROPE_TYPE_NORMAL
    enum: GGML_ROPE_TYPE_NEOX
    enum: GGML_ROPE_TYPE_IMROPE
    enum: GGML_ROPE_TYPE_MROPE
    enum: GGML_ROPE_TYPE_VISION

    enum ggml_type:
        GGML_TYPE_F32
        GGML_TYPE_F16
        GGML_TYPE_BF16
        GGML_TYPE_Q4_0
        GGML_TYPE_Q5_0
        GGML_TYPE_Q8_0
        GGML_TYPE_Q2_K
        GGML_TYPE_Q3_K
        GGML_TYPE_Q4_K
        GGML_TYPE_Q5_K
        GGML_TYPE_Q6_K
        GGML_TYPE_IQ2_XXS
        GGML_TYPE_IQ2_XS
        GGML_TYPE_IQ2_S
        GGML_TYPE_IQ3_XXS
        GGML_TYPE_IQ3_S
        GGML_TYPE_IQ1_S
        GGML_TYPE_IQ1_M
        GGML_TYPE_IQ4_XS
        GGML_TYPE_Q8_K
        GGML_TYPE_IQ4_NL
        GGML_TYPE_I8
        GGML_TYPE_I32
        GGML_TYPE_I64
        GGML_TYPE_COUNT

    enum ggml_status:
        GGML_STATUS_ALLOC_FAILED
        GGML_STATUS_FAILED
        GGML_STATUS_SUCCESS
        GGML_STATUS_ABORTED

    enum ggml_log_level:
        GGML_LOG_LEVEL_NONE
        GGML_LOG_LEVEL_DEBUG
        GGML_LOG_LEVEL_INFO
        GGML_LOG_LEVEL_WARN
        GGML_LOG_LEVEL_ERROR
        GGML_LOG_LEVEL_CONT

    struct ggml_context:
        pass

    struct ggml_cgraph:
        pass

    struct ggml_backend_buffer  # opaque; declared here so ggml_tensor can point to it

    struct ggml_tensor:
        ggml_type type
        ggml_backend_buffer * buffer
        int64_t ne[4]
        size_t nb[4]
        void * data
        char name[64]
        void * extra

    struct ggml_init_params:
        size_t mem_size
        void * mem_buffer
        bint no_alloc

    ctypedef void (*ggml_log_callback)(ggml_log_level level, const char * text, void * user_data)
    ctypedef cbool (*ggml_abort_callback)(void * data)

    void ggml_log_set(ggml_log_callback log_callback, void * user_data)

    ggml_context * ggml_init(ggml_init_params params)
    void ggml_free(ggml_context * ctx)
    size_t ggml_tensor_overhead()
    size_t ggml_graph_overhead_custom(size_t size, bint grads)

    size_t ggml_type_size(ggml_type type)
    int64_t ggml_blck_size(ggml_type type)
    const char * ggml_type_name(ggml_type type)
    size_t ggml_row_size(ggml_type type, int64_t ne)
    size_t ggml_nbytes(const ggml_tensor * tensor)
    int64_t ggml_nelements(const ggml_tensor * tensor)
    int ggml_n_dims(const ggml_tensor * tensor)
    cbool ggml_is_contiguous(const ggml_tensor * tensor)
    size_t ggml_element_size(const ggml_tensor * tensor)

    ggml_tensor * ggml_get_tensor(ggml_context * ctx, const char * name)
    ggml_tensor * ggml_get_first_tensor(const ggml_context * ctx)
    ggml_tensor * ggml_get_next_tensor(const ggml_context * ctx, ggml_tensor * tensor)
    ggml_tensor * ggml_dup_tensor(ggml_context * ctx, const ggml_tensor * src)
    ggml_tensor * ggml_new_tensor_4d(ggml_context * ctx, ggml_type type, int64_t ne0, int64_t ne1, int64_t ne2,
                                     int64_t ne3)
    ggml_tensor * ggml_new_tensor(ggml_context * ctx, ggml_type type, int n_dims, const int64_t * ne)
    ggml_tensor * ggml_new_tensor_1d(ggml_context * ctx, ggml_type type, int64_t ne0)
    ggml_tensor * ggml_new_tensor_2d(ggml_context * ctx, ggml_type type, int64_t ne0, int64_t ne1)
    ggml_tensor * ggml_set_name(ggml_tensor * tensor, const char * name)
    void ggml_set_input(ggml_tensor * tensor)
    void ggml_set_output(ggml_tensor * tensor)

    # operations used by the graph builders
    ggml_tensor * ggml_add(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b)
    ggml_tensor * ggml_mul(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b)
    ggml_tensor * ggml_scale(ggml_context * ctx, ggml_tensor * a, float s)
    ggml_tensor * ggml_scale_bias(ggml_context * ctx, ggml_tensor * a, float s, float b)
    ggml_tensor * ggml_sub(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b)
    ggml_tensor * ggml_mul_mat(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b)
    ggml_tensor * ggml_rms_norm(ggml_context * ctx, ggml_tensor * a, float eps)
    ggml_tensor * ggml_norm(ggml_context * ctx, ggml_tensor * a, float eps)
    ggml_tensor * ggml_gelu(ggml_context * ctx, ggml_tensor * a)
    ggml_tensor * ggml_tanh(ggml_context * ctx, ggml_tensor * a)
    ggml_tensor * ggml_repeat_4d(ggml_context * ctx, ggml_tensor * a, int64_t ne0, int64_t ne1, int64_t ne2,
                                 int64_t ne3)
    ggml_tensor * ggml_get_rows(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b)
    ggml_tensor * ggml_cpy(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b)
    ctypedef void (*ggml_custom_op_t)(ggml_tensor * dst, int ith, int nth, void * userdata)
    enum: GGML_N_TASKS_MAX
    ggml_tensor * ggml_custom_4d(ggml_context * ctx, ggml_type type, int64_t ne0, int64_t ne1, int64_t ne2,
                                 int64_t ne3, ggml_tensor ** args, int n_args, ggml_custom_op_t fun,
                                 int n_tasks, void * userdata)
    ggml_tensor * ggml_set_rows(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b, ggml_tensor * c)
    ggml_tensor * ggml_cont(ggml_context * ctx, ggml_tensor * a)
    ggml_tensor * ggml_reshape_2d(ggml_context * ctx, ggml_tensor * a, int64_t ne0, int64_t ne1)
    ggml_tensor * ggml_pad(ggml_context * ctx, ggml_tensor * a, int p0, int p1, int p2, int p3)
    ggml_tensor * ggml_reshape_4d(ggml_context * ctx, ggml_tensor * a, int64_t ne0, int64_t ne1, int64_t ne2,
                                  int64_t ne3)
    ggml_tensor * ggml_reshape_3d(ggml_context * ctx, ggml_tensor * a, int64_t ne0, int64_t ne1, int64_t ne2)
    ggml_tensor * ggml_view_1d(ggml_context * ctx, ggml_tensor * a, int64_t ne0, size_t offset)
    ggml_tensor * ggml_concat(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b, int dim)
    ggml_tensor * ggml_im2col(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b, int s0, int s1, int p0,
                              int p1, int d0, int d1, bint is_2D, ggml_type dst_type)
    # position tables resized to the patch grid (qwen3vl: corners aligned; lfm2: antialiased,
    # clip_graph::resize_position_embeddings)
    enum: GGML_SCALE_MODE_BILINEAR
    enum: GGML_SCALE_FLAG_ALIGN_CORNERS
    enum: GGML_SCALE_FLAG_ANTIALIAS
    ggml_tensor * ggml_interpolate(ggml_context * ctx, ggml_tensor * a, int64_t ne0, int64_t ne1, int64_t ne2,
                                   int64_t ne3, uint32_t mode)
    ggml_tensor * ggml_view_2d(ggml_context * ctx, ggml_tensor * a, int64_t ne0, int64_t ne1,
                               size_t nb1, size_t offset)
    ggml_tensor * ggml_view_3d(ggml_context * ctx, ggml_tensor * a, int64_t ne0, int64_t ne1, int64_t ne2,
                               size_t nb1, size_t nb2, size_t offset)
    ggml_tensor * ggml_transpose(ggml_context * ctx, ggml_tensor * a)
    ggml_tensor * ggml_cont_2d(ggml_context * ctx, ggml_tensor * a, int64_t ne0, int64_t ne1)
    ggml_tensor * ggml_cont_3d(ggml_context * ctx, ggml_tensor * a, int64_t ne0, int64_t ne1, int64_t ne2)
    ggml_tensor * ggml_soft_max_ext(ggml_context * ctx, ggml_tensor * a, ggml_tensor * mask, float scale,
                                    float max_bias)
    ggml_tensor * ggml_permute(ggml_context * ctx, ggml_tensor * a, int axis0, int axis1, int axis2, int axis3)
    ggml_tensor * ggml_swiglu_split(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b)
    ggml_tensor * ggml_geglu_split(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b)
    ggml_tensor * ggml_geglu_quick_split(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b)
    ggml_tensor * ggml_rope_ext(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b, ggml_tensor * c,
                                int n_dims, int mode, int n_ctx_orig, float freq_base, float freq_scale,
                                float ext_factor, float attn_factor, float beta_fast, float beta_slow)
    ggml_tensor * ggml_rope_set_offset(ggml_tensor * a, int n_offs)
    ggml_tensor * ggml_flash_attn_ext(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                                      ggml_tensor * mask, float scale, float max_bias, float logit_softcap)
    void ggml_flash_attn_ext_add_sinks(ggml_tensor * a, ggml_tensor * sinks)
    void ggml_soft_max_add_sinks(ggml_tensor * a, ggml_tensor * sinks)
    # mixture of experts (llama.cpp's build_moe_ffn)
    ggml_tensor * ggml_new_tensor_3d(ggml_context * ctx, ggml_type type, int64_t ne0, int64_t ne1, int64_t ne2)
    ggml_tensor * ggml_mul_mat_id(ggml_context * ctx, ggml_tensor * as_, ggml_tensor * b, ggml_tensor * ids)
    ggml_tensor * ggml_add_id(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b, ggml_tensor * ids)
    ggml_tensor * ggml_argsort_top_k(ggml_context * ctx, ggml_tensor * a, int k)
    ggml_tensor * ggml_soft_max(ggml_context * ctx, ggml_tensor * a)
    ggml_tensor * ggml_sigmoid(ggml_context * ctx, ggml_tensor * a)
    ggml_tensor * ggml_sum_rows(ggml_context * ctx, ggml_tensor * a)
    ggml_tensor * ggml_clamp(ggml_context * ctx, ggml_tensor * a, float min, float max)
    ggml_tensor * ggml_div(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b)
    ggml_tensor * ggml_swiglu_oai(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b, float alpha, float limit)
    # Gated DeltaNet (Qwen3.5, Qwen3-Next)
    ggml_tensor * ggml_rope_multi(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b, ggml_tensor * c, int n_dims,
                                  int * sections, int mode, int n_ctx_orig, float freq_base, float freq_scale,
                                  float ext_factor, float attn_factor, float beta_fast, float beta_slow)
    ggml_tensor * ggml_ssm_conv(ggml_context * ctx, ggml_tensor * sx, ggml_tensor * c)
    ggml_tensor * ggml_gated_delta_net(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                                       ggml_tensor * g, ggml_tensor * beta, ggml_tensor * state, int64_t K)
    ggml_tensor * ggml_softplus(ggml_context * ctx, ggml_tensor * a)
    ggml_tensor * ggml_silu(ggml_context * ctx, ggml_tensor * a)
    ggml_tensor * ggml_view_4d(ggml_context * ctx, ggml_tensor * a, int64_t ne0, int64_t ne1, int64_t ne2,
                               int64_t ne3, size_t nb1, size_t nb2, size_t nb3, size_t offset)
    # Mamba-2 (Nemotron-H, Granite 4.0 H) and its squared-ReLU FFNs
    ggml_tensor * ggml_ssm_scan(ggml_context * ctx, ggml_tensor * s, ggml_tensor * x, ggml_tensor * dt,
                                ggml_tensor * A, ggml_tensor * B, ggml_tensor * C, ggml_tensor * ids, int64_t K)
    ggml_tensor * ggml_relu(ggml_context * ctx, ggml_tensor * a)
    ggml_tensor * ggml_sqr(ggml_context * ctx, ggml_tensor * a)

    # vision encoders (graph/vit.pxi): patches, pooling, F16 casts for attention
    enum ggml_op_pool:
        GGML_OP_POOL_MAX
        GGML_OP_POOL_AVG
    enum ggml_prec:
        GGML_PREC_DEFAULT
        GGML_PREC_F32
    ggml_tensor * ggml_conv_2d(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b, int s0, int s1, int p0, int p1,
                               int d0, int d1)
    ggml_tensor * ggml_pool_2d(ggml_context * ctx, ggml_tensor * a, ggml_op_pool op, int k0, int k1, int s0, int s1,
                               float p0, float p1)
    ggml_tensor * ggml_cast(ggml_context * ctx, ggml_tensor * a, ggml_type type)
    ggml_tensor * ggml_gelu_quick(ggml_context * ctx, ggml_tensor * a)
    cbool ggml_prec_set_acc(ggml_tensor * a, ggml_prec prec)
    ggml_tensor * ggml_cont_4d(ggml_context * ctx, ggml_tensor * a, int64_t ne0, int64_t ne1, int64_t ne2,
                               int64_t ne3)

    ggml_cgraph * ggml_new_graph_custom(ggml_context * ctx, size_t size, bint grads)
    void ggml_build_forward_expand(ggml_cgraph * cgraph, ggml_tensor * tensor)
    int ggml_graph_n_nodes(ggml_cgraph * cgraph)
    ggml_tensor * ggml_graph_get_tensor(const ggml_cgraph * cgraph, const char * name)
    ggml_tensor * ggml_graph_node(ggml_cgraph * cgraph, int i)
    const char * ggml_op_desc(const ggml_tensor * t)


cdef extern from "ggml-backend.h" nogil:
    ctypedef struct ggml_backend_buffer_type:
        pass
    ctypedef ggml_backend_buffer_type * ggml_backend_buffer_type_t
    ctypedef ggml_backend_buffer * ggml_backend_buffer_t
    ctypedef struct ggml_backend:
        pass
    ctypedef ggml_backend * ggml_backend_t

    enum ggml_backend_buffer_usage:
        GGML_BACKEND_BUFFER_USAGE_ANY
        GGML_BACKEND_BUFFER_USAGE_WEIGHTS
        GGML_BACKEND_BUFFER_USAGE_COMPUTE

    ctypedef struct ggml_backend_device:
        pass
    ctypedef ggml_backend_device * ggml_backend_dev_t
    ctypedef struct ggml_backend_reg:
        pass
    ctypedef ggml_backend_reg * ggml_backend_reg_t

    enum ggml_backend_dev_type:
        GGML_BACKEND_DEVICE_TYPE_CPU
        GGML_BACKEND_DEVICE_TYPE_GPU
        GGML_BACKEND_DEVICE_TYPE_IGPU
        GGML_BACKEND_DEVICE_TYPE_ACCEL

    ctypedef ggml_backend_buffer_type_t * (*ggml_backend_dev_get_extra_bufts_t)(ggml_backend_dev_t device)

    ggml_backend_dev_t ggml_backend_dev_by_type(ggml_backend_dev_type type)
    ggml_backend_reg_t ggml_backend_dev_backend_reg(ggml_backend_dev_t device)
    void * ggml_backend_reg_get_proc_address(ggml_backend_reg_t reg, const char * name)
    cbool ggml_backend_dev_supports_op(ggml_backend_dev_t device, const ggml_tensor * op)

    const char * ggml_backend_buft_name(ggml_backend_buffer_type_t buft)
    ggml_backend_buffer_t ggml_backend_buft_alloc_buffer(ggml_backend_buffer_type_t buft, size_t size)
    void ggml_backend_buffer_free(ggml_backend_buffer_t buffer)
    size_t ggml_backend_buffer_get_size(ggml_backend_buffer_t buffer)
    void * ggml_backend_buffer_get_base(ggml_backend_buffer_t buffer)
    ggml_backend_dev_t ggml_backend_buft_get_device(ggml_backend_buffer_type_t buft)
    void ggml_backend_buffer_clear(ggml_backend_buffer_t buffer, unsigned char value)
    void ggml_backend_buffer_set_usage(ggml_backend_buffer_t buffer, ggml_backend_buffer_usage usage)
    bint ggml_backend_buffer_is_host(ggml_backend_buffer_t buffer)
    ggml_backend_buffer_type_t ggml_backend_buffer_get_type(ggml_backend_buffer_t buffer)

    void ggml_backend_free(ggml_backend_t backend)
    ggml_backend_buffer_type_t ggml_backend_get_default_buffer_type(ggml_backend_t backend)
    void ggml_backend_tensor_set(ggml_tensor * tensor, const void * data, size_t offset, size_t size)
    void ggml_backend_tensor_get(const ggml_tensor * tensor, void * data, size_t offset, size_t size)
    void ggml_backend_tensor_memset(ggml_tensor * tensor, uint8_t value, size_t offset, size_t size)
    ggml_status ggml_backend_graph_compute(ggml_backend_t backend, ggml_cgraph * cgraph)

    ggml_status ggml_backend_tensor_alloc(ggml_backend_buffer_t buffer, ggml_tensor * tensor, void * addr)
    ggml_backend_buffer_t ggml_backend_cpu_buffer_from_ptr(void * ptr, size_t size)
    ggml_backend_buffer_type_t ggml_backend_cpu_buffer_type()


cdef extern from "ggml-backend.h" nogil:
    # The backend scheduler: splits each graph over a list of backends (the
    # last one the CPU), allocates the compute buffers and runs the splits.
    ctypedef struct ggml_backend_sched:
        pass
    ctypedef ggml_backend_sched * ggml_backend_sched_t
    ggml_backend_sched_t ggml_backend_sched_new(ggml_backend_t * backends, ggml_backend_buffer_type_t * bufts,
                                                int n_backends, size_t graph_size, cbool parallel, cbool op_offload)
    void ggml_backend_sched_free(ggml_backend_sched_t sched)
    cbool ggml_backend_sched_reserve(ggml_backend_sched_t sched, ggml_cgraph * measure_graph)
    void ggml_backend_sched_reset(ggml_backend_sched_t sched)
    cbool ggml_backend_sched_alloc_graph(ggml_backend_sched_t sched, ggml_cgraph * graph)
    ggml_status ggml_backend_sched_graph_compute(ggml_backend_sched_t sched, ggml_cgraph * graph)
    int ggml_backend_sched_get_n_splits(ggml_backend_sched_t sched)
    int ggml_backend_sched_get_n_backends(ggml_backend_sched_t sched)
    ggml_backend_t ggml_backend_sched_get_backend(ggml_backend_sched_t sched, int i)
    size_t ggml_backend_sched_get_buffer_size(ggml_backend_sched_t sched, ggml_backend_t backend)
    const char * ggml_backend_name(ggml_backend_t backend)


cdef extern from "ggml-alloc.h" nogil:
    ctypedef struct ggml_gallocr:
        pass
    ctypedef ggml_gallocr * ggml_gallocr_t
    ggml_gallocr_t ggml_gallocr_new(ggml_backend_buffer_type_t buft)
    void ggml_gallocr_free(ggml_gallocr_t galloc)
    cbool ggml_gallocr_alloc_graph(ggml_gallocr_t galloc, ggml_cgraph * graph)
    ggml_backend_buffer_t ggml_backend_alloc_ctx_tensors(ggml_context * ctx, ggml_backend_t backend)
    ggml_backend_buffer_t ggml_backend_alloc_ctx_tensors_from_buft(ggml_context * ctx,
                                                                   ggml_backend_buffer_type_t buft)


cdef extern from "ggml-backend.h" nogil:
    # Backends are modules loaded at run time (GGML_BACKEND_DL); the CPU
    # backend's own functions are reached through its registry entry.
    ggml_backend_reg_t ggml_backend_load(const char * path)
    const char * ggml_backend_reg_name(ggml_backend_reg_t reg)
    const char * ggml_backend_dev_name(ggml_backend_dev_t device)
    const char * ggml_backend_dev_description(ggml_backend_dev_t device)
    ggml_backend_t ggml_backend_dev_init(ggml_backend_dev_t device, const char * params)
    ctypedef void (*ggml_backend_set_n_threads_t)(ggml_backend_t backend, int n_threads)
    # The CPU backend's own worker threads (ggml-cpu.h; reached through its registry entry).
    struct ggml_threadpool_params:
        int n_threads
        uint32_t poll
    struct ggml_threadpool
    ggml_threadpool_params ggml_threadpool_params_default(int n_threads)
    ctypedef void (*ggml_backend_set_abort_callback_t)(ggml_backend_t backend, ggml_abort_callback abort_callback,
                                                        void * abort_callback_data)
    struct ggml_backend_feature:
        const char * name
        const char * value
    ctypedef ggml_backend_feature * (*ggml_backend_get_features_t)(ggml_backend_reg_t reg)


# Signatures of the CPU backend's threadpool functions (ggml-cpu.h), which its
# registry entry hands out; ggml's headers name no type for them.
ctypedef ggml_threadpool * (*ggml_threadpool_new_t)(ggml_threadpool_params * params) noexcept nogil
ctypedef void (*ggml_threadpool_free_t)(ggml_threadpool * threadpool) noexcept nogil
ctypedef void (*ggml_backend_cpu_set_threadpool_t)(ggml_backend_t backend, ggml_threadpool * threadpool) noexcept nogil


cdef extern from "<dlfcn.h>" nogil:
    # Used to read a CPU module's score before ggml loads it for good.
    void * dlopen(const char * filename, int flags)
    void * dlsym(void * handle, const char * symbol)
    int dlclose(void * handle)
    char * dlerror()
    int RTLD_NOW
    int RTLD_LOCAL


cdef extern from "gguf.h" nogil:
    struct gguf_context:
        pass

    struct gguf_init_params:
        bint no_alloc
        ggml_context ** ctx

    gguf_context * gguf_init_from_file(const char * fname, gguf_init_params params)
    void gguf_free(gguf_context * ctx)
    size_t gguf_get_data_offset(const gguf_context * ctx)
    int64_t gguf_get_n_tensors(const gguf_context * ctx)
    int64_t gguf_find_tensor(const gguf_context * ctx, const char * name)
    size_t gguf_get_tensor_offset(const gguf_context * ctx, int64_t tensor_id)
    const char * gguf_get_tensor_name(const gguf_context * ctx, int64_t tensor_id)
    # The split.* keys of a split model's files (model.pxi checks split.no).
    enum gguf_type:
        GGUF_TYPE_UINT16
    int64_t gguf_find_key(const gguf_context * ctx, const char * key)
    gguf_type gguf_get_kv_type(const gguf_context * ctx, int64_t key_id)
    uint16_t gguf_get_val_u16(const gguf_context * ctx, int64_t key_id)


cdef extern from "ggml-backend.h" nogil:
    # Devices (the CPU, an RPC server's devices, later a GPU) and the buffer
    # types their weights and KV cache live in: see devices.pxi.
    int ggml_backend_dev_kind "ggml_backend_dev_type"(ggml_backend_dev_t device)  # the enum's name is taken
    ctypedef struct ggml_backend_dev_caps:
        cbool async_ "async"
        cbool host_buffer
        cbool buffer_from_host_ptr
        cbool events
    ctypedef struct ggml_backend_dev_props:
        const char * name
        const char * description
        size_t memory_free
        size_t memory_total
        int type
        const char * device_id    # the PCI bus id ("0000:c1:00.0"), or NULL
        ggml_backend_dev_caps caps
    void ggml_backend_dev_get_props(ggml_backend_dev_t device, ggml_backend_dev_props * props)
    void ggml_backend_dev_memory(ggml_backend_dev_t device, size_t * free, size_t * total)
    ggml_backend_buffer_type_t ggml_backend_dev_buffer_type(ggml_backend_dev_t device)
    size_t ggml_backend_dev_count()
    ggml_backend_dev_t ggml_backend_dev_get(size_t index)
    ggml_backend_dev_t ggml_backend_dev_by_name(const char * name)
    size_t ggml_backend_reg_dev_count(ggml_backend_reg_t reg)
    ggml_backend_dev_t ggml_backend_reg_dev_get(ggml_backend_reg_t reg, size_t index)


cdef extern from "ggml.h" nogil:
    # Called by GGML_ABORT before abort(): rpc.pxi turns ggml-rpc's aborts on
    # a lost connection into an error the caller sees (it never returns).
    ctypedef void (*ggml_abort_callback_t)(const char * error_message)
    ggml_abort_callback_t ggml_set_abort_callback(ggml_abort_callback_t callback)


cdef extern from "kernels/small_batch.h" nogil:
    # elelem's own CPU kernels for steps of 1-8 generated tokens (graph/blocks.pxi)
    enum: ELELEM_SMALL_BATCH_MAX_COLUMNS
    enum: ELELEM_SMALL_BATCH_NONE
    enum: ELELEM_SMALL_BATCH_AVX2
    enum: ELELEM_SMALL_BATCH_AVX512
    int elelem_small_batch_cpu()
    int elelem_small_batch_one_token_pays()
    int elelem_small_batch_serves(ggml_type weight)
    ggml_type elelem_small_batch_activation_type(ggml_type weight)
    int64_t elelem_small_batch_prepared_bytes(int isa, ggml_type weight, int64_t n_in, int64_t n_columns)
    void elelem_small_batch_prepare(ggml_tensor * dst, int ith, int nth, void * isa)
    void elelem_small_batch_matmul(ggml_tensor * dst, int ith, int nth, void * isa)
    void elelem_small_batch_q4_k_matmul(ggml_tensor * dst, int ith, int nth, void * weight)
    void elelem_small_batch_q4_k_matmul_avx512(ggml_tensor * dst, int ith, int nth, void * weight)


cdef extern from "kernels/experts.h" nogil:
    # the chosen experts' products in a step of generated tokens (graph/experts.pxi)
    void elelem_experts_matmul(ggml_tensor * dst, int ith, int nth, void * weight)
    void elelem_experts_matmul_avx512(ggml_tensor * dst, int ith, int nth, void * weight)
