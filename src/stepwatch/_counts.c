/* auto()'s sample count of each batch in C: the common case of stepwatch._counters.add_samples (included by
 * _speedups.c; the Python function is the fallback, and what runs where this was not built).
 *
 * auto() counts each batch's samples, and in Python that count executed about 4,900 instructions a step
 * (Valgrind): finding the phase being measured (a thread-local's dictionary, the stack's top frame, the phase by
 * name), the counters' lock, three attribute updates. Here the same reads and writes, on the same objects, in the
 * same order; anything else (not measuring, a dropped step, a phase not made yet, a counter past its limit) goes
 * to the Python function, which does what it always did.
 */

static PyObject *s_phases, *s_phase, *s_count_lock, *s_samples,
    *s_acquire, *s_release, *s_dict;
static PyObject *counts_dropped, *counts_default_phase, *counts_limit, *counts_lowest, *counts_fallback;
static double counts_limit_value;

/* configure_counts(dropped, default_phase, limit, fallback): the Python side's constants and function. */
static PyObject *
configure_counts(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "configure_counts() takes 4 arguments");
        return NULL;
    }
    PyObject **slots[] = {&counts_dropped, &counts_default_phase, &counts_limit, &counts_fallback};
    PyObject *lowest = PyNumber_Negative(args[2]);
    if (lowest == NULL) {
        return NULL;
    }
    double limit = PyFloat_AsDouble(args[2]);
    if (limit == -1.0 && PyErr_Occurred()) {
        Py_DECREF(lowest);
        return NULL;
    }
    counts_limit_value = limit;
    Py_XSETREF(counts_lowest, lowest);
    for (Py_ssize_t i = 0; i < 4; i++) {
        Py_INCREF(args[i]);
        Py_XSETREF(*slots[i], args[i]);
    }
    Py_RETURN_NONE;
}

/* ``local.__dict__``, the thread-local's values for this thread: a new reference, read once per stack cached. */
static PyObject *
thread_values(PyObject *local)
{
    PyObject *values = found_values(local);
    if (values != NULL) {
        Py_INCREF(values);
        return values;
    }
    values = PyObject_GetAttr(local, s_dict);
    if (values != NULL) {
        keep_values(local, values);
    }
    return values;
}

/* The phase being measured on this thread (a new reference), or NULL with no exception for every
 * case the Python function handles itself (not measuring, a dropped step, a phase not made yet). */
static PyObject *
measured_phase(PyObject *stacks, PyObject *tree)
{
    PyObject *measuring = slot_get(stacks, SLOT_MEASURING);
    PyObject *stack = measuring == Py_True ? thread_stack(stacks) : NULL;
    Py_XDECREF(measuring);
    PyObject *local = stack != NULL ? slot_get(stacks, SLOT_LOCAL) : NULL;
    if (UNLIKELY(local == NULL)) {
        Py_XDECREF(stack);
        return NULL;
    }
    PyObject *top = top_of(stack); /* an empty stack: IndexError, as ``stack[-1]`` raises in Python */
    PyObject *node = top != NULL ? frame_item(top, 1) : NULL;
    int dropped = node == NULL || node == counts_dropped;
    Py_XDECREF(node);
    Py_DECREF(stack);
    PyObject *values = dropped ? NULL : thread_values(local);
    Py_DECREF(local);
    if (UNLIKELY(values == NULL || !PyDict_CheckExact(values))) {
        Py_XDECREF(values);
        return NULL;
    }
    PyObject *name = PyDict_GetItemWithError(values, s_phase);
    if (name == NULL && !PyErr_Occurred()) {
        name = counts_default_phase;
    }
    Py_XINCREF(name);
    Py_DECREF(values);
    PyObject *phases = name != NULL ? PyObject_GetAttr(tree, s_phases) : NULL;
    PyObject *phase = phases != NULL && PyDict_CheckExact(phases) ? PyDict_GetItemWithError(phases, name) : NULL;
    Py_XINCREF(phase); /* held: the lock's acquire may let another thread replace the tree's phases */
    Py_XDECREF(phases);
    Py_XDECREF(name);
    return phase;
}

/* Whether a counter's new total is within the limits (``-COUNTER_LIMIT <= total <= COUNTER_LIMIT``): 1, 0, or -1
 * with an exception. */
static int
within_limits(PyObject *total)
{
    if (PyFloat_CheckExact(total)) {
        double value = PyFloat_AS_DOUBLE(total);
        return value <= counts_limit_value && value >= -counts_limit_value;
    }
    if (PyLong_CheckExact(total)) {
        int overflow;
        long long value = PyLong_AsLongLongAndOverflow(total, &overflow);
        if (value == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (!overflow) { /* (a float's limit is far beyond any 64-bit int) */
            return 1;
        }
    }
    int below = PyObject_RichCompareBool(total, counts_limit, Py_LE);
    int above = below == 1 ? PyObject_RichCompareBool(total, counts_lowest, Py_GE) : 1;
    return below < 0 || above < 0 ? -1 : below && above;
}

#define MAX_UNITS 8 /* units counted in C at once; a count() of more goes to the Python function */

/* Whose count it is: the program's own ``count()`` (its samples replace those counted from the batches, see
 * ``Phase.batch_samples``), auto()'s of a batch's samples (a count() call for stepwatch's own cost), or watch()'s
 * (part of its loop's step boundary). */
typedef enum { BY_PROGRAM, BY_AUTO, BY_WATCH } CountedBy;

/* Whether ``unit`` is "samples": 1, 0, or -1 with an exception. */
static int
is_samples(PyObject *unit)
{
    if (unit == s_samples) {
        return 1;
    }
    if (!PyUnicode_Check(unit)) {
        return 0;
    }
    int different = PyUnicode_Compare(unit, s_samples);
    return different == -1 && PyErr_Occurred() ? -1 : !different;
}

/* ``phase.count_calls += 1`` and ``counters[unit] += value`` for each of the ``n`` units of the program's own
 * count, if every total stays within the limits; 1: done, 0: the Python function is to do it (nothing was changed:
 * a counter past its limit, or the program's first count of samples, which stops the batches' count), -1: an
 * exception. Called with the counters' lock held; no Python code runs between the reads and the writes. */
static int
add_to_phase(PyObject *phase, PyObject *const *units, PyObject *const *values, Py_ssize_t n)
{
    PyObject *batches = slot_get(phase, SLOT_BATCH_SAMPLES);
    if (batches == NULL) {
        return -1;
    }
    int counted_by_batches = batches != Py_None;
    Py_DECREF(batches);
    for (Py_ssize_t i = 0; counted_by_batches && i < n; i++) {
        int samples = is_samples(units[i]);
        if (samples != 0) {
            return samples < 0 ? -1 : 0; /* samples: the Python function stops the batches' count */
        }
    }
    PyObject *counters = slot_get(phase, SLOT_COUNTERS);
    if (counters == NULL || !PyDict_CheckExact(counters)) {
        Py_XDECREF(counters);
        return counters == NULL ? -1 : 0;
    }
    PyObject *totals[MAX_UNITS];
    Py_ssize_t made = 0;
    int result = 1;
    while (result == 1 && made < n) {
        PyObject *before = PyDict_GetItemWithError(counters, units[made]); /* borrowed */
        if (before == NULL && PyErr_Occurred()) {
            result = -1;
            break;
        }
        PyObject *total = before != NULL ? add_ints(before, values[made]) : Py_NewRef(values[made]);
        if (total == NULL) { /* (an int past a float's range): as the Python function handles it */
            PyErr_Clear();
            result = 0;
            break;
        }
        totals[made++] = total;
        result = within_limits(total);
    }
    if (result == 1) {
        result = slot_increment(phase, SLOT_COUNT_CALLS) == 0 ? 1 : -1;
        for (Py_ssize_t i = 0; result == 1 && i < n; i++) {
            result = PyDict_SetItem(counters, units[i], totals[i]) < 0 ? -1 : 1;
        }
    }
    for (Py_ssize_t i = 0; i < made; i++) {
        Py_DECREF(totals[i]);
    }
    Py_DECREF(counters);
    return result;
}

/* A batch's ``size`` samples counted by auto() (``phase.count_calls += 1`` too: a count() call for stepwatch's own
 * cost) or watch(): ``phase.batch_samples += size``, apart from the program's counters (``Phase.counted`` merges
 * them), or nothing where the program counts its samples itself (None). 1: done, -1: an exception. */
static int
add_batch_samples(PyObject *phase, PyObject *size, CountedBy by)
{
    PyObject *counted = slot_get(phase, SLOT_BATCH_SAMPLES);
    if (UNLIKELY(counted == NULL || counted == Py_None)) {
        Py_XDECREF(counted);
        return counted == NULL ? -1 : 1;
    }
    Py_DECREF(counted); /* (the phase holds it: added to in place where nothing else does, slot_add) */
    int failed = (by == BY_AUTO && slot_increment(phase, SLOT_COUNT_CALLS) < 0) ||
                 slot_add(phase, SLOT_BATCH_SAMPLES, size) < 0;
    return failed ? -1 : 1;
}

/* The count of ``by`` into ``phase``: add_to_phase's or add_batch_samples' result. */
static int
add_counted(PyObject *phase, PyObject *const *units, PyObject *const *values, Py_ssize_t n, CountedBy by)
{
    return by == BY_PROGRAM ? add_to_phase(phase, units, values, n) : add_batch_samples(phase, values[0], by);
}

/* Adds ``values`` to the counters named ``units`` of the phase measured on this thread: 1, done; 0, the Python
 * function is to do it (nothing was changed); -1, an exception. The counters' lock (in situ, a 3 us acquire) is
 * taken only while a Python writer holds it (``phase.counting``). */
static int
count_units(PyObject *stacks, PyObject *tree, PyObject *const *units, PyObject *const *values, Py_ssize_t n,
            CountedBy by)
{
    PyObject *phase = measured_phase(stacks, tree);
    PyObject *first = phase != NULL ? slot_get(phase, SLOT_IN_FIRST_STEP) : NULL;
    PyObject *writers = first == Py_False ? slot_get(phase, SLOT_COUNTING) : NULL;
    if (LIKELY(writers != NULL && PyLong_CheckExact(writers) && PyLong_AsLong(writers) == 0)) {
        /* no Python writer is between its read and its write (they count themselves in under the lock): this
         * update, with no Python code and so no other thread running in it, needs no lock of its own */
        int done = add_counted(phase, units, values, n, by);
        Py_DECREF(writers);
        Py_DECREF(first);
        Py_DECREF(phase);
        return done;
    }
    Py_XDECREF(writers);
    PyObject *lock = first == Py_False ? PyObject_GetAttr(tree, s_count_lock) : NULL;
    PyObject *held = lock != NULL ? PyObject_CallMethodNoArgs(lock, s_acquire) : NULL;
    int done = 0;
    if (held != NULL) {
        done = add_counted(phase, units, values, n, by);
        PyObject *type = NULL, *value = NULL, *traceback = NULL;
        if (done < 0) {
            PyErr_Fetch(&type, &value, &traceback); /* the count's own error is the one raised */
        }
        PyObject *released = PyObject_CallMethodNoArgs(lock, s_release);
        if (done < 0) {
            Py_XDECREF(released);
            PyErr_Restore(type, value, traceback);
        }
        else if (released == NULL) {
            done = -1;
        }
        else {
            Py_DECREF(released);
        }
    }
    Py_XDECREF(held);
    Py_XDECREF(lock);
    Py_XDECREF(first);
    Py_XDECREF(phase);
    return done == 0 && PyErr_Occurred() ? -1 : done;
}

/* ``count(samples=size)`` on ``sw``, whose stacks and tree are given (NULL: an error already raised); None. */
static PyObject *
samples_counted(PyObject *sw, PyObject *stacks, PyObject *tree, PyObject *size)
{
    int done = stacks != NULL && tree != NULL ? count_units(stacks, tree, &s_samples, &size, 1, BY_AUTO) : -1;
    if (LIKELY(done == 1)) {
        Py_RETURN_NONE;
    }
    if (done < 0) {
        return NULL;
    }
    PyObject *args[2] = {sw, size};
    return PyObject_Vectorcall(counts_fallback, args, 2, NULL); /* every other case, as it always was */
}

/* watch()'s count of a batch's ``size`` samples into its loop's ``phase``, the batch's step just opened: what
 * ``_counters.count_batch_samples`` does, without finding the phase (the loop knows it). 1: done (or nothing to
 * count: not measuring, the one-off first step, the program counting its samples), 0: the Python function is to
 * do it (a Python writer of the counters under way), -1: an exception. */
static int
batch_counted(PyObject *stacks, PyObject *phase, PyObject *size)
{
    PyObject *measuring = slot_get(stacks, SLOT_MEASURING);
    PyObject *first = measuring == Py_True ? slot_get(phase, SLOT_IN_FIRST_STEP) : NULL;
    PyObject *writers = first == Py_False ? slot_get(phase, SLOT_COUNTING) : NULL;
    int done;
    if (UNLIKELY(measuring == NULL || (measuring == Py_True && first == NULL) ||
                 (first == Py_False && writers == NULL))) {
        done = -1;
    }
    else if (UNLIKELY(measuring != Py_True || first != Py_False)) {
        done = PyObject_IsTrue(measuring) < 0 ? -1 : 1; /* not measuring, or the first step: not counted */
    }
    else if (LIKELY(PyLong_CheckExact(writers) && PyLong_AsLong(writers) == 0)) {
        done = add_batch_samples(phase, size, BY_WATCH); /* (no lock needed: see count_units) */
    }
    else {
        done = 0;
    }
    Py_XDECREF(writers);
    Py_XDECREF(first);
    Py_XDECREF(measuring);
    return done;
}

/* count_batch(stacks, phase, fallback, size): watch()'s count of a batch's samples (``batch_counted``), or
 * ``fallback(size)`` for every case it hands on; None. */
static PyObject *
count_batch(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "count_batch(stacks, phase, fallback, size)");
        return NULL;
    }
    int done = batch_counted(args[0], args[1], args[3]);
    if (done < 0) {
        return NULL;
    }
    if (done == 0) {
        return PyObject_Vectorcall(args[2], &args[3], 1, NULL);
    }
    Py_RETURN_NONE;
}

static int
counts_configured(void)
{
    if (counts_fallback == NULL) {
        PyErr_SetString(PyExc_TypeError, "add_samples(sw, size), after configure_counts()");
        return 0;
    }
    return 1;
}

/* add_samples(sw, size): ``count(samples=size)`` for auto()'s loop, ``size`` a positive int. */
static PyObject *
add_samples(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "add_samples(sw, size), after configure_counts()");
        return NULL;
    }
    if (!counts_configured()) {
        return NULL;
    }
    PyObject *tree = PyObject_GetAttr(args[0], s_tree);
    PyObject *stacks = tree != NULL ? PyObject_GetAttr(args[0], s_stacks) : NULL;
    PyObject *result = samples_counted(args[0], stacks, tree, args[1]);
    Py_XDECREF(stacks);
    Py_XDECREF(tree);
    return result;
}

/* Interns the attribute names above; 0, or -1 with an exception. */
static int
counts_ready(void)
{
    struct {
        PyObject **slot;
        const char *text;
    } names[] = {
        {&s_phases, "phases"}, {&s_phase, "phase"}, {&s_count_lock, "count_lock"},
        {&s_samples, "samples"}, {&s_acquire, "acquire"}, {&s_release, "release"}, {&s_dict, "__dict__"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (*names[i].slot == NULL && (*names[i].slot = PyUnicode_InternFromString(names[i].text)) == NULL) {
            return -1;
        }
    }
    return 0;
}
