# ggml's RPC backend: layers on other machines.  Included into core.pyx after
# devices.pxi.
#
# libggml-rpc.so is a backend module like the CPU ones, loaded the first time
# it is needed; its two entry points beyond the backend API are reached
# through its registry entry (ggml_backend_reg_get_proc_address):
#   ggml_backend_rpc_add_server(endpoint)  connects, returns a registry of the
#                                          server's devices;
#   ggml_backend_rpc_start_server(...)     serves devices of this process,
#                                          forever (elelem rpc-server).
#
# A lost server.  ggml-rpc has no error path: when a socket fails it calls
# GGML_ABORT, from the thread that talks to that server ("dispatcher"),
# which would end the whole process; and when a server hangs it waits on the
# socket forever.  So, here:
#   - ggml's abort callback, for an abort raised in ggml-rpc's own source,
#     records the message and parks that thread for good instead of returning
#     (returning would abort()); any other abort keeps ggml's behaviour;
#   - every call that talks to a server runs on a thread of its own
#     (elelem_guarded), while the caller waits for it, for the loss flag, or
#     for the timeout, whichever comes first.  A lost or timed-out call leaves
#     its thread blocked inside ggml; the objects it uses are then never
#     freed (see _rpc_lost), since freeing them would talk to the dead server.

cdef extern from *:
    """
    #include <atomic>
    #include <chrono>
    #include <condition_variable>
    #include <cstdio>
    #include <cstring>
    #include <memory>
    #include <mutex>
    #include <thread>
    #include <vector>

    static std::atomic<int> elelem_rpc_lost_flag{0};
    static char elelem_rpc_lost_text[1024];
    static std::mutex elelem_rpc_lost_mu;

    static void elelem_on_ggml_abort(const char * message) {
        /* GGML_ABORT's message starts with its source file: ggml-rpc's own
           aborts are all about a server it lost (or that answered garbage). */
        if (message != NULL && strstr(message, "ggml-rpc") != NULL) {
            {
                std::lock_guard<std::mutex> lock(elelem_rpc_lost_mu);
                snprintf(elelem_rpc_lost_text, sizeof elelem_rpc_lost_text, "%s", message);
            }
            elelem_rpc_lost_flag.store(1);
            for (;;) std::this_thread::sleep_for(std::chrono::hours(1));  /* never return: abort() follows */
        }
        fprintf(stderr, "%s\\n", message);  /* ggml's default, then abort() */
    }

    static void elelem_rpc_lost_message(char * out, size_t size) {
        std::lock_guard<std::mutex> lock(elelem_rpc_lost_mu);
        snprintf(out, size, "%s", elelem_rpc_lost_text);
    }

    enum { ELELEM_GUARD_LOST = -1000, ELELEM_GUARD_TIMEOUT = -1001 };

    struct elelem_guard_job {
        std::mutex mu;
        std::condition_variable cv;
        bool done = false;
        int result = 0;
        std::vector<char> arg;   /* the job's own copy of the caller's arguments */
    };

    /* Run fn on a copy of the arg_size bytes at arg, on a new thread; wait
       for it at most timeout_s seconds (<= 0: no limit), returning early if
       a server is lost meanwhile.  When it finishes in time its copy is
       written back to arg.  The copy keeps a call that is given up on from
       writing into the caller's stack frame, should it ever finish. */
    static int elelem_guarded(int (*fn)(void *), void * arg, size_t arg_size, double timeout_s) {
        if (elelem_rpc_lost_flag.load()) return ELELEM_GUARD_LOST;
        auto job = std::make_shared<elelem_guard_job>();
        job->arg.assign((char *) arg, (char *) arg + arg_size);
        std::thread([job, fn] {
            int r = fn(job->arg.data());
            std::lock_guard<std::mutex> lock(job->mu);
            job->result = r;
            job->done = true;
            job->cv.notify_all();
        }).detach();
        auto start = std::chrono::steady_clock::now();
        std::unique_lock<std::mutex> lock(job->mu);
        while (!job->done) {
            /* wake every 20 ms to look at the loss flag, set from another thread */
            job->cv.wait_for(lock, std::chrono::milliseconds(20));
            if (job->done) break;
            if (elelem_rpc_lost_flag.load()) return ELELEM_GUARD_LOST;
            if (timeout_s > 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
                    > timeout_s) return ELELEM_GUARD_TIMEOUT;
        }
        memcpy(arg, job->arg.data(), arg_size);
        return job->result;
    }
    """
    int ELELEM_GUARD_LOST
    int ELELEM_GUARD_TIMEOUT
    void elelem_on_ggml_abort(const char * message) noexcept nogil
    void elelem_rpc_lost_message(char * out, size_t size) noexcept nogil
    int elelem_rpc_lost_flag_get "elelem_rpc_lost_flag.load"() noexcept nogil
    int elelem_guarded(int (*fn)(void *) noexcept nogil, void * arg, size_t arg_size, double timeout_s) noexcept nogil


from libc.string cimport memcpy
import socket as _socket

RPC_MODULE = "libggml-rpc.so"
# How long one call to a server may take before it counts as hung: a step
# that a slow server needs longer for can be given more (LLM(rpc_timeout=...)).
DEFAULT_RPC_TIMEOUT = 120.0

ctypedef ggml_backend_reg_t (*_rpc_add_server_t)(const char * endpoint) noexcept nogil
ctypedef void (*_rpc_start_server_t)(const char * endpoint, const char * cache_dir, size_t n_threads,
                                     size_t n_devices, ggml_backend_dev_t * devices) noexcept nogil

cdef ggml_backend_reg_t _rpc_reg = NULL
cdef _rpc_add_server_t _rpc_add_server = NULL
cdef _rpc_start_server_t _rpc_start_server = NULL


cdef void _load_rpc() except *:
    global _rpc_reg, _rpc_add_server, _rpc_start_server
    if _rpc_reg != NULL:
        return
    path = os.path.join(LIB_DIR, RPC_MODULE)
    if not os.path.isfile(path):
        raise errors.RPCError(f"this elelem was built without ggml's RPC backend ({path} is missing)")
    cdef bytes bpath = os.fsencode(path)
    cdef const char * cpath = bpath
    cdef ggml_backend_reg_t reg
    with nogil:
        reg = ggml_backend_load(cpath)
    if reg == NULL:
        raise errors.RPCError(f"ggml could not load its RPC backend {path}")
    _rpc_add_server = <_rpc_add_server_t> ggml_backend_reg_get_proc_address(reg, "ggml_backend_rpc_add_server")
    _rpc_start_server = <_rpc_start_server_t> ggml_backend_reg_get_proc_address(
        reg, "ggml_backend_rpc_start_server")
    if _rpc_add_server == NULL or _rpc_start_server == NULL:
        raise errors.RPCError(f"{path} lacks ggml_backend_rpc_add_server/ggml_backend_rpc_start_server")
    ggml_set_abort_callback(elelem_on_ggml_abort)
    _rpc_reg = reg


def rpc_lost():
    """The message of the abort ggml-rpc raised when it lost a server, or None."""
    cdef char text[1024]
    if not elelem_rpc_lost_flag_get():
        return None
    elelem_rpc_lost_message(text, sizeof(text))
    return text.decode("utf-8", "replace")


cdef set _lost_endpoints = set()   # endpoints whose connection failed in this process


cdef void _raise_guard_failure(int result, str what, endpoints, double timeout) except *:
    """A guarded call that did not finish: the error the caller sees."""
    names = ", ".join(sorted(endpoints))
    if result == ELELEM_GUARD_TIMEOUT:
        _lost_endpoints.update(endpoints)
        raise errors.RPCError(
            f"{what}: no answer from the RPC server{'s' if len(endpoints) > 1 else ''} {names} within "
            f"{timeout:g} s (rpc_timeout); the model cannot be used any more", endpoints=sorted(endpoints))
    _lost_endpoints.update(endpoints)
    raise errors.RPCError(
        f"{what}: lost the connection to the RPC server{'s' if len(endpoints) > 1 else ''} {names} "
        f"(ggml-rpc: {rpc_lost()}); the model cannot be used any more", endpoints=sorted(endpoints))


cdef struct _AddServerCall:
    const char * endpoint
    ggml_backend_reg_t reg


cdef int _add_server_job(void * arg) noexcept nogil:
    cdef _AddServerCall * call = <_AddServerCall *> arg
    call.reg = _rpc_add_server(call.endpoint)
    return 0


def rpc_connect(str endpoint, double timeout=DEFAULT_RPC_TIMEOUT):
    """Connect to the ggml RPC server at ``endpoint`` ("host:port", already
    checked to answer: elelem/api/devices.py) and return its devices."""
    _load_rpc()
    if endpoint in _lost_endpoints or rpc_lost() is not None:
        raise errors.RPCError(
            f"{endpoint}: a connection to an RPC server was lost earlier in this process, and ggml-rpc "
            "keeps the broken one; start a new process to connect again", endpoints=[endpoint])
    cdef bytes bendpoint = endpoint.encode()
    cdef _AddServerCall call
    call.endpoint = bendpoint
    call.reg = NULL
    cdef int result
    with nogil:
        result = elelem_guarded(_add_server_job, &call, sizeof(call), timeout)
    if result != 0:
        _raise_guard_failure(result, f"connecting to {endpoint}", [endpoint], timeout)
    if call.reg == NULL:
        raise errors.RPCError(f"the RPC server at {endpoint} offers no devices", endpoints=[endpoint])
    _connected_endpoints.add(endpoint)
    cdef size_t i
    return [_wrap_device(ggml_backend_reg_dev_get(call.reg, i), endpoint)
            for i in range(ggml_backend_reg_dev_count(call.reg))]


def rpc_serve(str endpoint, list devices, object n_threads, cache_dir=None):
    """Serve ``devices`` (Device objects of this process) to RPC clients on
    ``endpoint`` ("ip:port"), one client at a time.  Returns only if the
    server cannot start (the port is taken, the address is not local): then
    it raises RPCError."""
    _load_rpc()
    cdef int threads = _checked_count("n_threads", n_threads, MAX_N_THREADS)
    if not devices:
        raise errors.InvalidArgumentError("an RPC server needs at least one device to serve")
    cdef bytes bendpoint = endpoint.encode()
    cdef const char * cendpoint = bendpoint
    cdef bytes bcache = os.fsencode(cache_dir) if cache_dir is not None else b""
    cdef const char * ccache = <const char *> bcache if cache_dir is not None else NULL
    cdef ggml_backend_dev_t * devs = <ggml_backend_dev_t *> malloc(len(devices) * sizeof(ggml_backend_dev_t))
    if devs == NULL:
        raise MemoryError()
    cdef size_t n = len(devices)
    cdef size_t i
    for i in range(n):
        devs[i] = (<Device?> devices[i]).dev
    try:
        with nogil:
            _rpc_start_server(cendpoint, ccache, threads, n, devs)
    finally:
        free(devs)
    raise errors.RPCError(f"the RPC server could not listen on {endpoint} (is the port in use, or the "
                          "address not one of this machine's?)", endpoints=[endpoint])


# --------------------------------------------------------------------------
# The calls that may talk to a server, each a job for elelem_guarded.  With a
# timeout of 0 (no server involved: a CPU-only context) they run directly on
# the calling thread, exactly as before.

cdef set _connected_endpoints = set()


def rpc_connected_endpoints():
    """The servers this process has connected to (ggml-rpc keeps one
    connection per server for the whole process, shared by every model)."""
    return set(_connected_endpoints)


cdef bint _rpc_unsafe(endpoints) noexcept:
    """Freeing objects on these servers would wait forever on a lost one."""
    if not endpoints:
        return False
    return elelem_rpc_lost_flag_get() != 0 or any(e in _lost_endpoints for e in endpoints)


cdef int _run_guarded(int (*fn)(void *) noexcept nogil, void * arg, size_t arg_size, double timeout, str what,
                      endpoints=None) except? -1:
    """fn(arg), guarded unless ``timeout`` is 0.  What the job's struct points
    to must outlive a call given up on: callers leak it then (_rpc_unsafe)."""
    cdef int result
    if timeout <= 0:
        with nogil:
            result = fn(arg)
        return result
    with nogil:
        result = elelem_guarded(fn, arg, arg_size, timeout)
    if result == ELELEM_GUARD_LOST or result == ELELEM_GUARD_TIMEOUT:
        _raise_guard_failure(result, what, _suspects(result, endpoints), timeout)
    return result


cdef list _suspects(int result, endpoints):
    """The servers to blame: of those in use, the ones that now refuse a
    connection (a server that died); all of them when none does (a hang)."""
    candidates = sorted(endpoints if endpoints else _connected_endpoints)
    if result == ELELEM_GUARD_TIMEOUT:
        return candidates
    refused = []
    for endpoint in candidates:
        host, _, port = endpoint.rpartition(":")
        try:
            _socket.create_connection((host, int(port)), timeout=1.0).close()
        except OSError:
            refused.append(endpoint)
    return refused or candidates


cdef struct _AllocJob:
    ggml_context * ctx
    ggml_backend_buffer_type_t buft
    ggml_backend_buffer_usage usage
    bint clear
    ggml_backend_buffer_t buf


cdef int _alloc_job(void * arg) noexcept nogil:
    cdef _AllocJob * job = <_AllocJob *> arg
    job.buf = ggml_backend_alloc_ctx_tensors_from_buft(job.ctx, job.buft)
    if job.buf != NULL:
        ggml_backend_buffer_set_usage(job.buf, job.usage)
        if job.clear:
            ggml_backend_buffer_clear(job.buf, 0)
    return 0


cdef ggml_backend_buffer_t _alloc_tensors(ggml_context * ctx, ggml_backend_buffer_type_t buft,
                                          ggml_backend_buffer_usage usage, bint clear, double timeout,
                                          endpoints=None) except? NULL:
    """Every tensor of ``ctx`` in one new buffer of ``buft`` (NULL if it cannot be had)."""
    cdef _AllocJob job
    job.ctx = ctx
    job.buft = buft
    job.usage = usage
    job.clear = clear
    job.buf = NULL
    _run_guarded(_alloc_job, &job, sizeof(job), timeout, f"allocating {ggml_backend_buft_name(buft).decode()}", endpoints)
    return job.buf


cdef struct _UploadJob:
    int n
    ggml_tensor ** dst
    ggml_tensor ** src


cdef int _upload_job(void * arg) noexcept nogil:
    cdef _UploadJob * job = <_UploadJob *> arg
    cdef int i
    for i in range(job.n):
        ggml_backend_tensor_set(job.dst[i], job.src[i].data, 0, ggml_nbytes(job.src[i]))
    return 0


cdef struct _SchedJob:
    ggml_backend_sched_t sched
    ggml_cgraph * gf
    int what             # 0 compute, 1 alloc_graph, 2 reserve


cdef int _sched_job(void * arg) noexcept nogil:
    cdef _SchedJob * job = <_SchedJob *> arg
    if job.what == 0:
        return <int> ggml_backend_sched_graph_compute(job.sched, job.gf)
    if job.what == 1:
        ggml_backend_sched_reset(job.sched)
        return 1 if ggml_backend_sched_alloc_graph(job.sched, job.gf) else 0
    return 1 if ggml_backend_sched_reserve(job.sched, job.gf) else 0


cdef struct _DeviceInitJob:
    ggml_backend_dev_t dev
    ggml_backend_t backend
    ggml_backend_buffer_type_t buft


cdef int _device_init_job(void * arg) noexcept nogil:
    cdef _DeviceInitJob * job = <_DeviceInitJob *> arg
    job.backend = ggml_backend_dev_init(job.dev, NULL)
    job.buft = ggml_backend_dev_buffer_type(job.dev)
    return 0


cdef struct _FreeJob:
    ggml_backend_sched_t sched
    int n_backends
    ggml_backend_t * backends
    int n_buffers
    ggml_backend_buffer_t * buffers


cdef int _free_job(void * arg) noexcept nogil:
    cdef _FreeJob * job = <_FreeJob *> arg
    cdef int i
    if job.sched != NULL:
        ggml_backend_sched_free(job.sched)
    for i in range(job.n_buffers):
        _free_buffer(job.buffers[i])
    for i in range(job.n_backends):
        ggml_backend_free(job.backends[i])
    return 0


# How long freeing a model's or context's objects on servers may take.
RPC_RELEASE_TIMEOUT = 10.0


cdef void _free_guarded(_FreeJob * job, double timeout, endpoints) noexcept:
    """Free what a job names, unless a server it lives on was lost (then it is
    left allocated: freeing it would wait on the dead server forever)."""
    if timeout <= 0:
        _free_job(job)
        return
    if _rpc_unsafe(endpoints):
        _log.warning("not freeing buffers on the lost RPC servers %s", ", ".join(sorted(endpoints)))
        return
    # The job gets arrays of its own: the caller's go away with it, even if the job never ends.
    cdef _FreeJob own = job[0]
    own.backends = <ggml_backend_t *> malloc((job.n_backends + 1) * sizeof(ggml_backend_t))
    own.buffers = <ggml_backend_buffer_t *> malloc((job.n_buffers + 1) * sizeof(ggml_backend_buffer_t))
    if own.backends == NULL or own.buffers == NULL:
        free(own.backends)
        free(own.buffers)
        return
    memcpy(own.backends, job.backends, job.n_backends * sizeof(ggml_backend_t))
    memcpy(own.buffers, job.buffers, job.n_buffers * sizeof(ggml_backend_buffer_t))
    try:
        _run_guarded(_free_job, &own, sizeof(own), min(timeout, RPC_RELEASE_TIMEOUT),
                     "freeing buffers on RPC servers", endpoints)
    except BaseException as error:  # called from __dealloc__: log, never raise (the arrays stay with the job)
        _log.warning("%s", error)
        return
    free(own.backends)
    free(own.buffers)
