# A Python program whose call path is known, for tests/python.rs: it calls the capture
# (through a C library, by ctypes) from known places and prints, as one JSON object, the
# folded stacks it got back and the Python frames CPython itself reports at each call.
#
#   python3 known_path.py LIBFOLD_HERE.so LIBSTACK_TEST.so
#
# Lines marked `# at: NAME` are where the test expects the frame NAME to be.
import contextlib
import ctypes
import json
import os
import sys
import threading

fold_lib = ctypes.CDLL(sys.argv[1])
c_lib = ctypes.CDLL(sys.argv[2])
fold = ctypes.cast(fold_lib.bpftime_callstack_fold, ctypes.c_void_p)
for entry in (c_lib.c_entry, c_lib.c_thread_entry):
    entry.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_ulong]
    entry.restype = ctypes.c_long
fold_lib.bpftime_callstack_fold_from.argtypes = [ctypes.c_size_t, ctypes.c_char_p, ctypes.c_ulong]
fold_lib.bpftime_callstack_fold_from.restype = ctypes.c_long
fold_lib.bpftime_callstack_capture_ns.argtypes = [ctypes.c_uint32, ctypes.c_void_p]
fold_lib.bpftime_callstack_capture_ns.restype = ctypes.c_int
out = {"python": fold_lib.bpftime_callstack_python()}


def folded(entry):
    buf = ctypes.create_string_buffer(1 << 17)
    n = entry(fold, buf, len(buf))  # at: folded
    assert n >= 0, n
    return buf.value.decode()


def here():
    """The caller's Python frames as CPython reports them, outermost first."""
    frames = []
    f = sys._getframe(1)
    while f is not None:
        code = f.f_code
        frames.append([getattr(code, "co_qualname", code.co_name), code.co_filename, f.f_lineno])
        f = f.f_back
    return frames[::-1]


# The known path: main -> outer -> middle -> inner -> C -> the capture.
def inner():
    out["main_thread"] = folded(c_lib.c_entry)  # at: inner
    out["c_thread"] = folded(c_lib.c_thread_entry)


def middle():
    inner()  # at: middle


def outer():
    middle()  # at: outer


# Paths through what changes how frames are linked: generators, a class's __init__, a
# decorator, a lambda, a C builtin calling back into Python, a context manager of the
# standard library, code made by exec at a far line, a deep recursion, another thread.
def checked(name):
    out[name] = {"expected": here(), "folded": folded(c_lib.c_entry)}


def traced(f):
    def wrapper(*args):
        return f(*args)

    return wrapper


class Model:
    def __init__(self):
        self.forward()

    @traced
    def forward(self):
        gen = self.steps()
        next(gen)

    def steps(self):
        sorted([2, 1], key=lambda x: checked("varied") or x)
        yield


@contextlib.contextmanager
def managed():
    checked("context")
    yield


generated = "\n" * 300 + "def far():\n    checked('generated')\n"
scope = {"checked": checked}
exec(compile(generated, "<generated>", "exec"), scope)


def deep(n):
    if n == 0:
        checked("deep")
    else:
        deep(n - 1)


def bench(n):
    if n == 0:
        ns = (ctypes.c_double * 3)()
        rounds = int(os.environ.get("BPFTIME_CAPTURE_ROUNDS", "2000"))
        assert fold_lib.bpftime_callstack_capture_ns(rounds, ns) == 0
        out["capture_ns_python"], out["capture_ns_native"], out["capture_ns_walk"] = ns
        out["bench_depth"] = len(here())
    else:
        bench(n - 1)


def garbage():
    """The walk from thread states that are not: it must come back, with no Python frame."""
    fn = fold_lib.bpftime_callstack_fold_from
    buf = ctypes.create_string_buffer(1 << 17)
    noise = ctypes.create_string_buffer(bytes(range(256)) * 64)
    # A structure whose every word points at itself: each pointer the walk follows leads
    # back to it, a cycle of one in `previous`.
    loop = (ctypes.c_size_t * 512)()
    for i in range(512):
        loop[i] = ctypes.addressof(loop)
    results = []
    for bogus in (0, 8, 0xDEADBEEF000, 2**64 - 8, id(Model), id(out), ctypes.addressof(noise),
                  ctypes.addressof(loop)):
        n = fn(bogus, buf, len(buf))
        results.append([n, buf.value.decode() if n >= 0 else ""])
    ctypes.pythonapi.PyGILState_GetThisThreadState.restype = ctypes.c_size_t
    real = ctypes.pythonapi.PyGILState_GetThisThreadState()
    expected, n = here(), fn(real, buf, len(buf))
    out["garbage"] = results
    out["real_thread_state"] = {"expected": expected, "folded": buf.value.decode() if n >= 0 else ""}


def line_tables():
    """Every code unit of every code object of a few standard modules: the line our
    decoder finds in the code object's line table against the one co_lines() gives."""
    import argparse
    import inspect
    import json.decoder
    import types

    fn = fold_lib.bpftime_callstack_line_of
    fn.argtypes = [ctypes.c_uint8, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int64

    def codes(code):
        yield code
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                yield from codes(c)

    units, bad = 0, []
    for mod in (argparse, inspect, json.decoder, threading):
        with open(mod.__file__) as f:
            root = compile(f.read(), mod.__file__, "exec")
        for code in codes(root):
            table = code.co_linetable
            for start, end, line in code.co_lines():
                for off in range(start, end, 2):
                    got = fn(sys.version_info[1], table, len(table), code.co_firstlineno, off // 2)
                    want = -1 if line is None else line
                    units += 1
                    if got != want and len(bad) < 5:
                        bad.append([code.co_name, off, want, got])
                    elif got != want:
                        bad.append(None)
    out["line_tables"] = {"units": units, "wrong": len(bad), "examples": [b for b in bad if b]}


def main():
    outer()  # at: main
    Model()
    with managed():
        pass
    scope["far"]()
    # Deep enough that 3.10, whose Python calls are native calls too, has more native
    # frames than a stack keeps.
    deep(120)
    worker = threading.Thread(target=checked, args=("thread",), name="worker")
    worker.start()
    worker.join()
    bench(30)
    garbage()
    line_tables()


main()  # at: <module>
print(json.dumps(out))
