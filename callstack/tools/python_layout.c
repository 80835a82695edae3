/* Prints where a CPython version keeps what bpftime-callstack's frame walk reads: the
 * numbers in callstack/src/python/layout.rs. Build it against the headers of the version
 * (3.10 to 3.13) whose layout is wanted, for the default build:
 *
 *   cc -I PREFIX/include/python3.X callstack/tools/python_layout.c -o layout && ./layout
 */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#if PY_VERSION_HEX >= 0x030B0000
#include "internal/pycore_frame.h"
#else
#include <frameobject.h>
#endif
#if PY_VERSION_HEX >= 0x030D0000
#include "internal/pycore_runtime.h"
#endif

#define SHOW(name, expr) printf("%-32s %zu\n", name, (size_t)(expr))

static unsigned state_bits(void (*set)(PyASCIIObject *)) {
    PyASCIIObject a;
    unsigned bits;
    memset(&a, 0, sizeof a);
    set(&a);
    memcpy(&bits, &a.state, sizeof bits);
    return bits;
}
static void set_kind(PyASCIIObject *a) { a->state.kind = 7; }
static void set_compact(PyASCIIObject *a) { a->state.compact = 1; }
static void set_ascii(PyASCIIObject *a) { a->state.ascii = 1; }

int main(void) {
    printf("CPython %d.%d\n", PY_MAJOR_VERSION, PY_MINOR_VERSION);
    SHOW("ob_type", offsetof(PyObject, ob_type));
#if PY_VERSION_HEX < 0x030B0000
    SHOW("tstate.frame", offsetof(PyThreadState, frame));
    SHOW("frame.f_back", offsetof(PyFrameObject, f_back));
    SHOW("frame.f_code", offsetof(PyFrameObject, f_code));
    SHOW("frame.f_lasti", offsetof(PyFrameObject, f_lasti));
    SHOW("code.co_name", offsetof(PyCodeObject, co_name));
#else
#if PY_VERSION_HEX < 0x030D0000
    SHOW("tstate.cframe", offsetof(PyThreadState, cframe));
    SHOW("cframe.current_frame", offsetof(_PyCFrame, current_frame));
    SHOW("iframe.f_code", offsetof(_PyInterpreterFrame, f_code));
    SHOW("iframe.prev_instr", offsetof(_PyInterpreterFrame, prev_instr));
#else
    SHOW("tstate.current_frame", offsetof(PyThreadState, current_frame));
    SHOW("iframe.f_executable", offsetof(_PyInterpreterFrame, f_executable));
    SHOW("iframe.instr_ptr", offsetof(_PyInterpreterFrame, instr_ptr));
#endif
    SHOW("iframe.previous", offsetof(_PyInterpreterFrame, previous));
    SHOW("iframe.owner", offsetof(_PyInterpreterFrame, owner));
#if PY_VERSION_HEX < 0x030C0000
    SHOW("iframe.is_entry", offsetof(_PyInterpreterFrame, is_entry));
#endif
    SHOW("code.co_qualname", offsetof(PyCodeObject, co_qualname));
    SHOW("code.co_code_adaptive", offsetof(PyCodeObject, co_code_adaptive));
    SHOW("code._co_firsttraceable", offsetof(PyCodeObject, _co_firsttraceable));
#endif
    SHOW("code.co_filename", offsetof(PyCodeObject, co_filename));
    SHOW("code.co_linetable", offsetof(PyCodeObject, co_linetable));
    SHOW("code.co_firstlineno", offsetof(PyCodeObject, co_firstlineno));
    SHOW("bytes.ob_size", offsetof(PyVarObject, ob_size));
    SHOW("bytes.ob_sval", offsetof(PyBytesObject, ob_sval));
    SHOW("str.length", offsetof(PyASCIIObject, length));
    SHOW("str.state", offsetof(PyASCIIObject, state));
    SHOW("str ascii data", sizeof(PyASCIIObject));
    SHOW("str compact data", sizeof(PyCompactUnicodeObject));
    printf("%-32s %#x %#x %#x\n", "str state kind, compact, ascii", state_bits(set_kind),
           state_bits(set_compact), state_bits(set_ascii));
#if PY_VERSION_HEX >= 0x030D0000
    /* The debug offsets' fields, as 64-bit field indexes. */
#define FIELD(name, member) SHOW(name, offsetof(_Py_DebugOffsets, member) / 8)
    FIELD("debug thread_state.current_frame", thread_state.current_frame);
    FIELD("debug interpreter_frame.previous", interpreter_frame.previous);
    FIELD("debug interpreter_frame.executable", interpreter_frame.executable);
    FIELD("debug interpreter_frame.instr_ptr", interpreter_frame.instr_ptr);
    FIELD("debug interpreter_frame.owner", interpreter_frame.owner);
    FIELD("debug code_object.filename", code_object.filename);
    FIELD("debug code_object.qualname", code_object.qualname);
    FIELD("debug code_object.linetable", code_object.linetable);
    FIELD("debug code_object.firstlineno", code_object.firstlineno);
    FIELD("debug code_object.co_code_adaptive", code_object.co_code_adaptive);
    FIELD("debug pyobject.ob_type", pyobject.ob_type);
    FIELD("debug bytes_object.ob_size", bytes_object.ob_size);
    FIELD("debug bytes_object.ob_sval", bytes_object.ob_sval);
    FIELD("debug unicode_object.state", unicode_object.state);
    FIELD("debug unicode_object.length", unicode_object.length);
    FIELD("debug unicode_object.asciiobject_size", unicode_object.asciiobject_size);
#endif
    return 0;
}
