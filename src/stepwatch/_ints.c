/* Ints that stepwatch alone holds, read and rewritten in place (included by _speedups.c, before the code that
 * keeps counts and clock readings in ints).
 *
 * A block's start, a loop's frames' starts and a phase's running totals are ints that only stepwatch holds: a new
 * int at each update, and the old one freed. Where nothing but its one owner holds an int (a reference count of
 * 1) and the new value has as many digits, the int is given the new value in place: no one else can see it
 * change. Measured (benchmarks/footprint.py, docs/overhead.md): about 2,700 fewer instructions in a step by hand;
 * the allocator's cache lines it no longer touches about equal the lines of code the checks added. Python 3.11
 * only, whose ints' digits are laid out as here (3.12 changed the layout); elsewhere every update makes a new int,
 * as before.
 */

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
#define REWRITES_INTS 1
#else
#define REWRITES_INTS 0
#endif

/* ``number`` given the value ``value`` in place where it is an int of one or two digits held by its one owner
 * alone and ``value`` has as many digits (1), or left as it is (0). Never a value of the small ints CPython
 * shares (-5 to 256): a clock's reading in nanoseconds has two digits from its first second to its 36th year, a
 * count past 256 one until 2**30. */
static inline int
rewritten_in_place(PyObject *number, long long value)
{
#if REWRITES_INTS
    if (Py_REFCNT(number) != 1 || !PyLong_CheckExact(number) || value <= 256) {
        return 0;
    }
    digit *digits = ((PyLongObject *)number)->ob_digit;
    if (value < ((long long)1 << PyLong_SHIFT)) {
        if (Py_SIZE(number) != 1) {
            return 0;
        }
        digits[0] = (digit)value;
        return 1;
    }
    if (Py_SIZE(number) != 2 || value >= ((long long)1 << (2 * PyLong_SHIFT))) {
        return 0;
    }
    digits[0] = (digit)(value & PyLong_MASK);
    digits[1] = (digit)(value >> PyLong_SHIFT);
    return 1;
#else
    (void)number;
    (void)value;
    return 0;
#endif
}

/* An int of any size (``int_value``). */
static COLD int
int_value_any_size(PyObject *number, long long *value)
{
    int overflow;
    *value = PyLong_AsLongLongAndOverflow(number, &overflow);
    if (overflow || (*value == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* ``number`` as a C integer where it is an int of at most two digits, not negative (1), or 0: what
 * ``rewritten_in_place`` writes, read in place. Always 0 where ints are not rewritten. */
static inline int
compact_int_value(PyObject *number, long long *value)
{
#if REWRITES_INTS
    if (PyLong_CheckExact(number)) {
        Py_ssize_t size = Py_SIZE(number);
        const digit *digits = ((PyLongObject *)number)->ob_digit;
        if (LIKELY(size == 2)) { /* a clock's reading in nanoseconds, more than a second after the machine's start */
            *value = (long long)digits[0] | ((long long)digits[1] << PyLong_SHIFT);
            return 1;
        }
        if (size == 1) {
            *value = (long long)digits[0];
            return 1;
        }
        if (size == 0) {
            *value = 0;
            return 1;
        }
    }
#else
    (void)number;
    (void)value;
#endif
    return 0;
}

/* ``number``, an int, as a C integer (1), or 0 (no error) where it is not an int of that range. */
static inline int
int_value(PyObject *number, long long *value)
{
    return compact_int_value(number, value) || (PyLong_CheckExact(number) && int_value_any_size(number, value));
}
