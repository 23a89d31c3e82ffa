# Stopping a running step: Ctrl-C and abort requests.  Included into core.pyx.

# Ctrl-C during a step.  Python's SIGINT handler only sets a flag that the
# interpreter checks between bytecodes, so a long prefill would ignore Ctrl-C
# until it finished.  While the main thread computes, a C handler chained in
# front of Python's also sets a flag that ggml's abort callback reads: the step
# stops at the next graph node, and Python still sees its KeyboardInterrupt.
cdef extern from *:
    """
    #include <signal.h>
    #include <string.h>
    static volatile sig_atomic_t elelem_sigint_seen = 0;
    static struct sigaction elelem_prev_sigint;

    static void elelem_on_sigint(int sig) {
        elelem_sigint_seen = 1;
        elelem_prev_sigint.sa_handler(sig);  /* Python's own handler */
    }

    /* Chain in front of the current SIGINT handler if it is a plain function
       (Python's); returns 1 if installed. */
    static int elelem_sigint_watch(void) {
        struct sigaction act;
        elelem_sigint_seen = 0;
        if (sigaction(SIGINT, NULL, &elelem_prev_sigint) != 0) return 0;
        if ((elelem_prev_sigint.sa_flags & SA_SIGINFO) ||
            elelem_prev_sigint.sa_handler == SIG_DFL || elelem_prev_sigint.sa_handler == SIG_IGN) return 0;
        memset(&act, 0, sizeof act);
        act.sa_handler = elelem_on_sigint;
        act.sa_flags = elelem_prev_sigint.sa_flags;
        sigemptyset(&act.sa_mask);
        return sigaction(SIGINT, &act, NULL) == 0;
    }

    static void elelem_sigint_unwatch(void) { sigaction(SIGINT, &elelem_prev_sigint, NULL); }
    """
    int elelem_sigint_seen
    int elelem_sigint_watch() nogil
    void elelem_sigint_unwatch() nogil

from cpython.exc cimport PyErr_CheckSignals
import threading as _threading


cdef cbool _abort_requested(void * data) noexcept nogil:
    return (<volatile int *> data)[0] != 0 or elelem_sigint_seen != 0
