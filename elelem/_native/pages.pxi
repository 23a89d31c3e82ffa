# Memory given back to the OS a few megabytes at a time, before a big mapping
# or buffer is unmapped or freed.
#
# munmap frees a mapping's pages while it holds the process's memory-map lock
# for writing: 20 ms for a 0.5B model's weights, and every other thread's
# mmap, brk (malloc growing its heap) and, without per-VMA locks, page fault
# waits for it.  In a server that is the other models' requests, mid-step,
# while one model unloads.  madvise(MADV_DONTNEED) frees the same pages under
# the lock held to read, one chunk at a time; the munmap or free after it
# finds nothing left to free.

from posix.mman cimport madvise, MADV_DONTNEED
from posix.unistd cimport sysconf, _SC_PAGESIZE

cdef size_t PAGE_DROP_CHUNK = 4 << 20   # bytes per madvise: a fraction of a millisecond of the kernel's work


cdef void _drop_pages(void * addr, size_t size) noexcept nogil:
    """The whole pages inside [addr, addr + size) freed (read back as zero, or
    from the file for a file mapping).  Only for memory about to be unmapped or
    freed, of which no byte is read again."""
    cdef uintptr_t page = <uintptr_t> sysconf(_SC_PAGESIZE)
    if addr == NULL or page == 0 or (page & (page - 1)) != 0:
        return
    cdef uintptr_t start = (<uintptr_t> addr + page - 1) & ~(page - 1)
    cdef uintptr_t end = (<uintptr_t> addr + size) & ~(page - 1)
    cdef size_t n
    while start < end:
        n = min(<size_t> (end - start), PAGE_DROP_CHUNK)
        madvise(<void *> start, n, MADV_DONTNEED)   # a refusal (EINVAL) only leaves the work to munmap
        start += n


cdef void _free_buffer(ggml_backend_buffer_t buf) noexcept nogil:
    """ggml_backend_buffer_free (NULL: nothing), its pages dropped first when the
    buffer is memory of the CPU backend's own kinds (the default, repack and AMX
    buffer types, all plain allocations in this process): never a device's,
    which a driver maps and madvise must not touch."""
    if buf == NULL:
        return
    if _cpu_owned(ggml_backend_buffer_get_type(buf)):
        _drop_pages(ggml_backend_buffer_get_base(buf), ggml_backend_buffer_get_size(buf))
    ggml_backend_buffer_free(buf)


cdef bint _cpu_owned(ggml_backend_buffer_type_t buft) noexcept nogil:
    # The default CPU buffer type names no device (ggml-backend.cpp); the CPU's extra ones do.
    if buft == ggml_backend_cpu_buffer_type():
        return True
    cdef ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)
    return cpu != NULL and ggml_backend_buft_get_device(buft) == cpu
