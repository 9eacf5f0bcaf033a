/* auto()'s sample count of each batch in C: the common case of stepwatch._counters.add_samples (included by
 * _speedups.c; the Python function is the fallback, and what runs where this was not built).
 *
 * auto() counts each batch's samples, and in Python that count executed about 4,900 instructions a step
 * (Valgrind): finding the phase being measured (a thread-local's dictionary, the stack's top frame, the phase by
 * name), the counters' lock, three attribute updates. Here the same reads and writes, on the same objects, in the
 * same order; anything else (not measuring, a dropped step, a phase not made yet, a counter past its limit) goes
 * to the Python function, which does what it always did.
 */

static PyObject *s_phases, *s_phase, *s_in_first_step, *s_count_lock, *s_count_calls, *s_counters, *s_samples,
    *s_acquire, *s_release, *s_dict;
static PyObject *counts_dropped, *counts_default_phase, *counts_limit, *counts_fallback, *one;

/* configure_counts(dropped, default_phase, limit, fallback): the Python side's constants and function. */
static PyObject *
configure_counts(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "configure_counts() takes 4 arguments");
        return NULL;
    }
    PyObject **slots[] = {&counts_dropped, &counts_default_phase, &counts_limit, &counts_fallback};
    for (Py_ssize_t i = 0; i < 4; i++) {
        Py_INCREF(args[i]);
        Py_XSETREF(*slots[i], args[i]);
    }
    Py_RETURN_NONE;
}

/* The phase being measured on this thread (a new reference), or NULL with no exception for every
 * case the Python function handles itself (not measuring, a dropped step, a phase not made yet). */
static PyObject *
measured_phase(PyObject *sw, PyObject *tree)
{
    PyObject *stacks = PyObject_GetAttr(sw, s_stacks);
    if (stacks == NULL) {
        return NULL;
    }
    PyObject *measuring = PyObject_GetAttr(stacks, s_measuring);
    PyObject *stack = measuring == Py_True ? thread_stack(stacks) : NULL;
    Py_XDECREF(measuring);
    PyObject *local = stack != NULL ? PyObject_GetAttr(stacks, s_local) : NULL;
    Py_DECREF(stacks);
    if (local == NULL) {
        Py_XDECREF(stack);
        return NULL;
    }
    PyObject *top = top_of(stack); /* an empty stack: IndexError, as ``stack[-1]`` raises in Python */
    PyObject *node = top != NULL ? frame_item(top, 1) : NULL;
    int dropped = node == NULL || node == counts_dropped;
    Py_XDECREF(node);
    Py_DECREF(stack);
    PyObject *values = dropped ? NULL : PyObject_GetAttr(local, s_dict);
    Py_DECREF(local);
    if (values == NULL || !PyDict_CheckExact(values)) {
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

/* ``phase.count_calls += 1`` and ``counters["samples"] += size`` below the limit; 1: done, 0: the Python
 * function is to do it, -1: an exception. Called with the counters' lock held. */
static int
add_to_phase(PyObject *phase, PyObject *size)
{
    PyObject *counters = PyObject_GetAttr(phase, s_counters);
    if (counters == NULL || !PyDict_CheckExact(counters)) {
        Py_XDECREF(counters);
        return counters == NULL ? -1 : 0;
    }
    PyObject *before = PyDict_GetItemWithError(counters, s_samples); /* borrowed */
    PyObject *total = before != NULL ? PyNumber_Add(before, size) : PyErr_Occurred() ? NULL : Py_NewRef(size);
    int below = total != NULL ? PyObject_RichCompareBool(total, counts_limit, Py_LE) : -1;
    if (below != 1) {
        Py_XDECREF(total);
        Py_DECREF(counters);
        return below;
    }
    PyObject *calls = PyObject_GetAttr(phase, s_count_calls);
    PyObject *more = calls != NULL ? PyNumber_Add(calls, one) : NULL;
    Py_XDECREF(calls);
    int failed = more == NULL || PyObject_SetAttr(phase, s_count_calls, more) < 0 ||
                 PyDict_SetItem(counters, s_samples, total) < 0;
    Py_XDECREF(more);
    Py_DECREF(total);
    Py_DECREF(counters);
    return failed ? -1 : 1;
}

/* add_samples(sw, size): ``count(samples=size)`` for auto()'s loop, ``size`` a positive int. */
static PyObject *
add_samples(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || counts_fallback == NULL) {
        PyErr_SetString(PyExc_TypeError, "add_samples(sw, size), after configure_counts()");
        return NULL;
    }
    PyObject *tree = PyObject_GetAttr(args[0], s_tree);
    PyObject *phase = tree != NULL ? measured_phase(args[0], tree) : NULL;
    PyObject *first = phase != NULL ? PyObject_GetAttr(phase, s_in_first_step) : NULL;
    PyObject *lock = first == Py_False ? PyObject_GetAttr(tree, s_count_lock) : NULL;
    PyObject *held = lock != NULL ? PyObject_CallMethodNoArgs(lock, s_acquire) : NULL;
    int done = 0;
    if (held != NULL) {
        done = add_to_phase(phase, args[1]);
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
    Py_XDECREF(tree);
    if (done == 1) {
        Py_RETURN_NONE;
    }
    if (PyErr_Occurred()) {
        return NULL;
    }
    return PyObject_Vectorcall(counts_fallback, args, 2, NULL); /* every other case, as it always was */
}

/* Interns the attribute names above; 0, or -1 with an exception. */
static int
counts_ready(void)
{
    struct {
        PyObject **slot;
        const char *text;
    } names[] = {
        {&s_phases, "phases"}, {&s_phase, "phase"}, {&s_in_first_step, "in_first_step"},
        {&s_count_lock, "count_lock"}, {&s_count_calls, "count_calls"}, {&s_counters, "counters"},
        {&s_samples, "samples"}, {&s_acquire, "acquire"}, {&s_release, "release"}, {&s_dict, "__dict__"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (*names[i].slot == NULL && (*names[i].slot = PyUnicode_InternFromString(names[i].text)) == NULL) {
            return -1;
        }
    }
    if (one == NULL && (one = PyLong_FromLong(1)) == NULL) {
        return -1;
    }
    return 0;
}
