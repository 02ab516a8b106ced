/* What autopipe's C extensions share (autopipe/simulate/_simcore.c,
 * autopipe/schedules/v_shapes/_vbuild.c, autopipe/partition/_probe.c; loaded and switched by
 * autopipe/native.py): Python.h included the one way, and the buffer checks. Each extension
 * defines NATIVE_NAME, the name its error messages start with, before including this file
 * (setup.py puts autopipe/ on the include path).
 *
 * Buffers come through the buffer protocol (C-contiguous numpy arrays); the Python twins check
 * their dtypes, the extensions their sizes, so no loop reads or writes past a buffer. */

#ifndef AUTOPIPE_NATIVE_H
#define AUTOPIPE_NATIVE_H

#ifndef NATIVE_NAME
#error "define NATIVE_NAME (the extension's name, e.g. \"_simcore\") before including _native.h"
#endif

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* 0 when buffer b holds count items of item bytes; else -1 with a ValueError naming it. */
static int
sized(const Py_buffer *b, Py_ssize_t count, Py_ssize_t item, const char *name)
{
    if (b->len != count * item) {
        PyErr_Format(PyExc_ValueError, NATIVE_NAME ": %s has %zd bytes, expected %zd", name,
                     b->len, count * item);
        return -1;
    }
    return 0;
}

#endif /* AUTOPIPE_NATIVE_H */
