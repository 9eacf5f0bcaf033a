/* The steady state of a timed loop's step boundary in C (included by _speedups.c; ``_block_base.swap_frame`` is
 * the same in Python, and what runs where this was not built).
 *
 * Each step, ``_loops.iterate`` closes the step's body and opens the wait for the next batch, then closes the
 * wait and opens the body: in Python, in a real step with stepwatch out of the caches, the loop's two halves
 * took about 11 us a step. Here each half is one call that does the same reads and writes in the same order,
 * or nothing (returning None) where any condition of the steady state does not hold, and the generator then
 * takes its general path, as before.
 */

/* A loop's frame just closed, ``(LOOP, node, start)``, refilled as ``(LOOP, next_node, now)`` (1), as a block
 * refills its own (_block_fast.c), or left as it is (0): where nothing but the caller holds it and its start's
 * int can be rewritten (``rewritten_in_place``). No tuple or int made or freed at a step's boundary, where two
 * of each were, on lines cold in a real step (benchmarks/footprint.py). */
static int
loop_frame_refilled(PyObject *frame, PyObject *next_node, long long now_ns)
{
    if (!REFILLS_FRAMES || PyTuple_GET_ITEM(frame, 0) != hot_state.loop_owner ||
        !rewritten_in_place(PyTuple_GET_ITEM(frame, 2), now_ns)) {
        return 0;
    }
    PyObject *former = PyTuple_GET_ITEM(frame, 1); /* the node just closed, which the caller holds */
    PyTuple_SET_ITEM(frame, 1, Py_NewRef(next_node));
    Py_DECREF(former);
    return 1;
}

/* swap_frame(stacks, local, stack, frame, node, next_node, phase, clock, ends_step, counted): if ``frame`` (a loop
 * frame of ``node``) is on top of this thread's ``stack``, unswitched (``stacks.local is local``; for the end of a
 * step, measuring too), reads ``clock`` (the default one without a call), closes the frame then into ``node``'s
 * buffer and the phase's loop time (and its steps, at the end of a step; its schedule's position too where
 * ``counted``), then opens and returns ``(LOOP, next_node, now)``; None, having changed nothing and read no clock,
 * otherwise. ``reuses``: the caller holds ``frame`` once and lets it go for the frame returned, which may then be
 * ``frame`` itself, refilled where nothing else holds it (``loop_frame_refilled``). */
static PyObject *
swap(PyObject *stacks, PyObject *local, PyObject *stack, PyObject *frame, PyObject *node, PyObject *next_node,
     PyObject *phase, PyObject *clock, int ends_step, int counted, int reuses)
{
    if (UNLIKELY(!PyList_CheckExact(stack) || PyList_GET_SIZE(stack) == 0 ||
                 PyList_GET_ITEM(stack, PyList_GET_SIZE(stack) - 1) != frame || !PyTuple_CheckExact(frame) ||
                 PyTuple_GET_SIZE(frame) != 3 || PyTuple_GET_ITEM(frame, 1) != node)) {
        Py_RETURN_NONE;
    }
    PyObject *current = slot_get(stacks, SLOT_LOCAL);
    if (UNLIKELY(current == NULL)) {
        return NULL;
    }
    Py_DECREF(current); /* only compared */
    if (UNLIKELY(current != local)) {
        Py_RETURN_NONE;
    }
    if (ends_step) {
        PyObject *measuring = slot_get(stacks, SLOT_MEASURING);
        int on = measuring != NULL ? PyObject_IsTrue(measuring) : -1;
        Py_XDECREF(measuring);
        if (UNLIKELY(on <= 0)) {
            if (on < 0) {
                return NULL;
            }
            Py_RETURN_NONE;
        }
    }
    Py_INCREF(frame); /* held across the clock's call, which can run anything */
    PyObject *now = NULL, *elapsed;
    long long now_ns;
    int raw = read_clock_raw(clock, &now_ns);
    if (LIKELY(raw)) {
        elapsed = elapsed_since(now_ns, PyTuple_GET_ITEM(frame, 2));
    }
    else {
        now = PyObject_CallNoArgs(clock);
        elapsed = now != NULL ? difference(now, PyTuple_GET_ITEM(frame, 2)) : NULL;
    }
    if (UNLIKELY(elapsed == NULL)) {
        Py_XDECREF(now);
        Py_DECREF(frame);
        return NULL;
    }
    PyObject *opened = NULL;
    Py_ssize_t size = PyList_GET_SIZE(stack);
    if (LIKELY(PyList_CheckExact(stack) && size > 0 && PyList_GET_ITEM(stack, size - 1) == frame)) {
        Py_SET_SIZE(stack, size - 1); /* ``del stack[-1]``: the frame is held */
        Py_DECREF(frame);
    }
    else if (PySequence_DelItem(stack, -1) < 0) { /* the clock changed the stack: as Python's ``del`` would */
        goto done;
    }
    if (LIKELY(record(stacks, node, elapsed) == 0)) {
        int failed = slot_add(phase, SLOT_LOOP_NS, elapsed) < 0;
        if (!failed && ends_step) {
            failed = slot_increment(phase, SLOT_STEPS) < 0;
        }
        if (!failed && counted) {
            failed = slot_increment(phase, SLOT_SCHEDULE_POS) < 0;
        }
        if (LIKELY(!failed && raw && reuses && Py_REFCNT(frame) == 2 &&
                   loop_frame_refilled(frame, next_node, now_ns))) {
            opened = Py_NewRef(frame);
        }
        else if (!failed && (now != NULL || (now = PyLong_FromLongLong(now_ns)) != NULL)) {
            opened = PyTuple_Pack(3, hot_state.loop_owner, next_node, now);
        }
        if (UNLIKELY(opened != NULL && PyList_Append(stack, opened) < 0)) {
            Py_CLEAR(opened);
        }
    }
done:
    Py_DECREF(frame);
    Py_DECREF(elapsed);
    Py_XDECREF(now);
    return opened;
}

static PyObject *
swap_frame(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10 || hot_state.loop_owner == NULL) {
        PyErr_SetString(PyExc_TypeError, "swap_frame() takes 10 arguments, after configure_slots()");
        return NULL;
    }
    return swap(args[0], args[1], args[2], args[3], args[4], args[5], args[6], args[7], args[8] == Py_True,
                args[9] == Py_True, 0);
}
