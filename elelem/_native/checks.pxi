# Argument checks shared by the native objects.  Included into core.pyx.

import operator as _operator

# Positions are int32 in ggml; a cache this long fails to allocate long before.
DEF MAX_CELLS = 2147483647
# ggml's CPU threadpool holds GGML_MAX_N_THREADS (512) workers; more crashes it.
DEF MAX_N_THREADS = 512


cdef object _as_integer(str name, object value):
    """``value`` as a Python int (numpy integers too, bools not), or
    InvalidArgumentError: never Cython's own OverflowError or TypeError from
    an ``int`` argument."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise errors.InvalidArgumentError(f"{name} must be an integer, got {value!r}")
    return _operator.index(value)


cdef int _checked_count(str name, object value, long long upper) except -1:
    """``value`` as an int in [1, upper], or InvalidArgumentError."""
    number = _as_integer(name, value)
    if not 1 <= number <= upper:
        raise errors.InvalidArgumentError(f"{name} must be between 1 and {upper:,}, got {number:,}")
    return number
