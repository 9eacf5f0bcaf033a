/* A stage's buffer of durations folded in one pass in C (included by _speedups.c; optional, as the block is).
 *
 * ``fold_durations(durations)`` is what ``RunningStats.add_batch`` (stepwatch/_stats.py) computes with
 * ``sum``, ``sum(map(operator.mul, ...))``, ``min`` and ``max``: ``(total, sum of squares, min, max)`` of a list
 * of ints, exactly, in one loop over 128-bit integers instead of four passes that make a Python int of each
 * product and partial sum (about 900 instructions a buffered measurement, amortized over every block). None
 * where the exact result is not guaranteed (a value not an int, or of 2**53 or more in magnitude, a list of
 * 2**20 entries or more, a compiler without 128-bit integers): the caller then runs its Python loops.
 */

#define FOLD_MAX_VALUE (1LL << 53)
#define FOLD_MAX_ENTRIES ((Py_ssize_t)1 << 20)

#ifdef __SIZEOF_INT128__
/* A 128-bit integer as a Python int: ``high * 2**64 + low`` (magnitudes here stay under 2**127). */
static PyObject *
int128_as_long(__int128 value)
{
    if (value >= INT64_MIN && value <= INT64_MAX) {
        return PyLong_FromLongLong((long long)value);
    }
    int negative = value < 0;
    unsigned __int128 magnitude = negative ? -(unsigned __int128)value : (unsigned __int128)value;
    PyObject *high = PyLong_FromUnsignedLongLong((unsigned long long)(magnitude >> 64));
    PyObject *low = PyLong_FromUnsignedLongLong((unsigned long long)magnitude);
    PyObject *shift = PyLong_FromLong(64);
    PyObject *shifted = high && shift ? PyNumber_Lshift(high, shift) : NULL;
    PyObject *result = shifted && low ? PyNumber_Or(shifted, low) : NULL;
    Py_XDECREF(high);
    Py_XDECREF(low);
    Py_XDECREF(shift);
    Py_XDECREF(shifted);
    if (result != NULL && negative) {
        Py_SETREF(result, PyNumber_Negative(result));
    }
    return result;
}
#endif

static PyObject *
fold_durations(PyObject *Py_UNUSED(module), PyObject *durations)
{
#ifdef __SIZEOF_INT128__
    if (!PyList_CheckExact(durations) || PyList_GET_SIZE(durations) == 0 ||
        PyList_GET_SIZE(durations) >= FOLD_MAX_ENTRIES) {
        Py_RETURN_NONE;
    }
    Py_ssize_t n = PyList_GET_SIZE(durations);
    __int128 total = 0, squares = 0;
    long long low = 0, high = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(durations, i);
        if (!PyLong_CheckExact(item)) {
            Py_RETURN_NONE;
        }
        int overflow = 0;
        long long value = PyLong_AsLongLongAndOverflow(item, &overflow);
        if (overflow != 0 || value >= FOLD_MAX_VALUE || value <= -FOLD_MAX_VALUE) {
            Py_RETURN_NONE;
        }
        total += value;
        squares += (__int128)value * value;
        if (i == 0 || value < low) {
            low = value;
        }
        if (i == 0 || value > high) {
            high = value;
        }
    }
    PyObject *parts[2] = {int128_as_long(total), int128_as_long(squares)};
    if (parts[0] == NULL || parts[1] == NULL) {
        Py_XDECREF(parts[0]);
        Py_XDECREF(parts[1]);
        return NULL;
    }
    return Py_BuildValue("(NNLL)", parts[0], parts[1], low, high);
#else
    Py_RETURN_NONE;
#endif
}
