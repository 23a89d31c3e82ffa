"""Tripwires for the template fuzzer: what a sandbox escape would touch.

A render that raises is not proof the sandbox held: an escape that reached
``os.popen`` and then tripped over a bad argument raises too, and elelem turns
every render exception into a ``TemplateError``.  So the runner plants
tripwires, and a render that sets one off fails whatever it returned:

* a canary object, reachable only through Python internals: as a builtin
  (``f.__globals__['__builtins__']``), as an attribute of ``os`` and ``sys``,
  as a module in ``sys.modules``, and as a subclass of ``object``
  (``''.__class__.__mro__[1].__subclasses__()``).  Any use of it -- an
  attribute, a call, a conversion to text, iteration -- is recorded;
* an audit hook (PEP 578) that records, while a render runs, the events only
  code outside the sandbox causes: processes, files, imports, code objects,
  frames, the garbage collector's object lists, ctypes, sockets.

Rendering a template never needs any of them (the template is compiled
before the render starts), so one record is one escape.  Two exceptions,
both Jinja's own bookkeeping: its traceback rewriting (``jinja2/debug.py``
compiles and runs a stub to put template lines into a traceback), so events
under a frame of that file are not recorded, and ``jinja2.utils.internalcode``,
which reads ``__code__`` of the functions a template defines as it runs.
And one event is only half an escape: the sandbox's ``getattr`` reads an
attribute before it decides the attribute is unsafe, so a read of
``gi_frame`` or ``__code__`` raised from the sandbox itself is recorded as a
*peek* (a record that starts with :data:`PEEK`), which is harmless when the
render then ends in ``UnsafeTemplateError`` and an escape otherwise.
:func:`plant` raises one template error first and imports the modules that
filters import on first use (``html`` for ``striptags``, ``pprint``), so
those imports happen outside any render.
"""
from __future__ import annotations

import builtins
import os
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

NAME = "elelem_fuzz_canary"

# Audit events (https://docs.python.org/3/library/audit_events.html) that a
# render inside the sandbox never raises, by exact name or by prefix.
_EVENTS = frozenset({
    "open", "import", "exec", "compile", "code.__new__", "function.__new__", "object.__getattr__",
    "object.__setattr__",
    "object.__delattr__", "sys._getframe", "sys._current_frames", "sys.settrace", "sys.setprofile",
    "sys.addaudithook", "builtins.input", "builtins.breakpoint", "gc.get_objects", "gc.get_referrers",
    "gc.get_referents", "marshal.loads", "marshal.load", "pickle.find_class", "ctypes.dlopen",
    "ctypes.dlsym", "ctypes.addressof", "ctypes.string_at", "ctypes.cdata", "mmap.__new__",
    "sqlite3.connect", "urllib.Request", "webbrowser.open", "shutil.rmtree", "shutil.copyfile", "glob.glob",
    "tempfile.mkstemp", "tempfile.mkdtemp", "pty.spawn", "resource.setrlimit", "signal.pthread_kill",
})
_PREFIXES = ("os.", "subprocess.", "socket.", "ctypes.", "cpython.", "sys.", "_posixsubprocess.", "winreg.")
# os.* and sys.* events that the harness itself (or the interpreter) raises while a render runs.
_HARMLESS = frozenset({"os.listxattr", "sys.excepthook", "sys.unraisablehook"})

# The file whose audited work is part of any failing render, and the
# function that registers template-defined functions as Jinja internals.
_JINJA_DEBUG = os.path.join("jinja2", "debug.py")
_JINJA_UTILS = os.path.join("jinja2", "utils.py")
# The sandbox's code, whose attribute reads are its lookups: Jinja's, and elelem's environment, render
# budget and filters (:func:`plant` checks that Jinja's and elelem's sandbox modules are still there).
_SANDBOX_FILES = (os.path.join("jinja2", "sandbox.py"), os.path.join("elelem", "text", "template_sandbox.py"),
                  os.path.join("elelem", "text", "template_budget.py"),
                  os.path.join("elelem", "text", "template_filters.py"))
PEEK = "peek: "

_lock = threading.Lock()
_armed = False
_records: list[str] = []
_inside_hook = threading.local()


def _record(what: str) -> None:
    if not _armed:
        return
    with _lock:
        if len(_records) < 20:
            _records.append(what)


class ElelemFuzzCanary:
    """Records every use.  Never part of any render's input."""

    def __getattribute__(self, name: str):
        _record(f"canary.{name}")
        return object.__getattribute__(self, name)

    def __init__(self, *args, **kwargs) -> None:  # a new one, made through __subclasses__()
        if _armed:
            _record("canary class called")

    def __call__(self, *args, **kwargs):
        _record("canary called")
        return self

    def __getitem__(self, key):
        _record(f"canary[{key!r}]")
        return self

    def __iter__(self):
        _record("iter(canary)")
        return iter(())

    def __str__(self) -> str:
        _record("str(canary)")
        return NAME

    def __repr__(self) -> str:
        _record("repr(canary)")
        return NAME

    def __bool__(self) -> bool:
        _record("bool(canary)")
        return True

    def __eq__(self, other) -> bool:
        _record("canary ==")
        return other is self

    __hash__ = object.__hash__


def _audit(event: str, args: tuple) -> None:
    if not _armed or event in _HARMLESS or getattr(_inside_hook, "active", False):
        return
    if not (event in _EVENTS or event.startswith(_PREFIXES)):
        return
    _inside_hook.active = True  # sys._getframe below raises an audit event of its own
    try:
        frame = sys._getframe(1)
        code = frame.f_code
        if event == "object.__getattr__" and code.co_filename.endswith(_JINJA_UTILS) and \
                code.co_name == "internalcode":
            return
        peek = event == "object.__getattr__" and code.co_filename.endswith(_SANDBOX_FILES)
        while frame is not None:
            if frame.f_code.co_filename.endswith(_JINJA_DEBUG):
                return
            frame = frame.f_back
        detail = ", ".join(_short(a) for a in args[:2])
        _record(f"{PEEK if peek else ''}audit {event}({detail})")
    finally:
        _inside_hook.active = False


def _short(value) -> str:
    try:
        return object.__repr__(value) if isinstance(value, ElelemFuzzCanary) else repr(value)[:80]
    except Exception:  # noqa: BLE001 -- a description, never a reason to fail the hook
        return type(value).__name__


_planted = False


def plant() -> None:
    """Put the canary where only an escape reaches it and install the audit hook (once per process)."""
    global _planted
    if _planted:
        return
    _check_sandbox_files()
    canary = object.__new__(ElelemFuzzCanary)
    setattr(builtins, NAME, canary)
    setattr(os, NAME, canary)
    setattr(sys, NAME, canary)
    sys.modules[NAME] = canary  # type: ignore[assignment]
    _first_template_error()
    sys.addaudithook(_audit)
    _planted = True


def _check_sandbox_files() -> None:
    """Fail, rather than record every sandbox peek as an escape, if a sandbox module moved."""
    import jinja2.sandbox

    import elelem.text.template_sandbox
    for module in (jinja2.sandbox, elelem.text.template_sandbox):
        if not (module.__file__ or "").endswith(_SANDBOX_FILES):
            raise RuntimeError(f"{module.__name__} is {module.__file__}, not among canary._SANDBOX_FILES")


def _first_template_error() -> None:
    import html.entities  # noqa: F401 -- markupsafe's striptags imports it lazily
    import pprint  # noqa: F401 -- the pprint filter's
    import textwrap  # noqa: F401 -- wordwrap's
    import urllib.parse  # noqa: F401 -- urlencode's

    from elelem.text.chat_template import ChatTemplate
    from elelem.errors import TemplateError
    try:
        ChatTemplate("{{ 1 / 0 }}").render([{"role": "user", "content": "x"}])
    except TemplateError:
        pass


@contextmanager
def armed() -> Iterator[list[str]]:
    """Record touches while the body runs; yields the list of what was touched."""
    global _armed
    plant()
    with _lock:
        _records.clear()
    _armed = True
    touched: list[str] = []
    try:
        yield touched
    finally:
        _armed = False
        with _lock:
            touched.extend(_records)
            _records.clear()
