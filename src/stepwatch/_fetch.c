/* A single-process DataLoader iterator's whole fetch of a batch in a ``watch()`` loop (included by _speedups.c,
 * after _reads.c, whose functions it shares and hands everything but the common case to).
 *
 * ``fetch_batch(spec, indices)`` is set as the fetcher's ``fetch`` (``single_process.install_fetch``), with
 * ``spec = (reads, dataset_block, dataset, read_all, collate, collate_block)``: the samples read and recorded as
 * ``read_samples`` reads and records them, then collated as ``collate_samples`` collates them. Measured in a real
 * step (a bracketed ``next()``), the reads and the collate each cost about two microseconds through torch's
 * ``fetch`` (its frame, the ``__getitems__`` lookups, two ``functools.partial`` calls) and ``read_samples``'
 * general path; here they are one C call, the reads' common case compact as a block's is (_block_fast.c): the
 * stopwatch measuring, this thread's stack the one cached, the ``dataset`` node already a child of the frame on
 * top, and no timeline kept. Anything else goes, before anything is written, to ``reads(indices)``
 * (``read_samples``); a frame closed in another state to ``close_reads``, a failed read to ``reads_failed``. */

/* The dataset block's own frame refilled as ``(block, node, start_ns)`` for a batch's reads, as a block's entry
 * refills it (_block_fast.c), its start's int rewritten in place: a new reference. NULL without an exception
 * where something else holds it, or the block has none (made now, for the next batch); NULL with one where
 * making something failed. No tuple or int made or freed for a batch's reads, where one of each were.
 * ``children_version``: the version of the children ``node`` was found in, kept with it (``child_of``). */
static PyObject *
own_frame_refilled(BlockObject *block, PyObject *node, unsigned long long children_version, long long start_ns)
{
    PyObject *frame = block->frame;
    if (!REFILLS_FRAMES || frame == NULL || Py_REFCNT(frame) != 1) {
        if (REFILLS_FRAMES && frame == NULL) {
            new_own_frame(block); /* (NULL with an exception where it failed) */
        }
        return NULL;
    }
    PyObject *former_start = NULL;
    if (!rewritten_in_place(PyTuple_GET_ITEM(frame, 2), start_ns) &&
        (former_start = new_start(frame, start_ns)) == NULL) {
        return NULL;
    }
    PyObject *former_node = PyTuple_GET_ITEM(frame, 1);
    PyTuple_SET_ITEM(frame, 1, Py_NewRef(node));
    block->children_version = children_version;
    Py_INCREF(frame);
    Py_DECREF(former_node); /* (the reads may run Python code too: what is used is held) */
    Py_XDECREF(former_start);
    return frame;
}

/* The batch's reads in their common case (see above): the samples, or NULL with an exception, or NULL without one
 * where the case is not the common one and nothing was done. */
static PyObject *
reads_compact(BlockObject *block, PyObject *dataset, PyObject *read_all, PyObject *indices)
{
    PyObject *stacks = block->stacks;
    if (UNLIKELY(stacks == NULL || Py_TYPE(stacks) != SLOT_TYPE(SLOT_MEASURING) ||
                 SLOT_IN_PLACE(stacks, SLOT_MEASURING) != Py_True || SLOT_IN_PLACE(stacks, SLOT_TIMELINE) != Py_None)) {
        return NULL;
    }
    PyObject *stack = cached_thread_stack(stacks);
    if (UNLIKELY(stack == NULL || PyList_GET_SIZE(stack) == 0)) {
        return NULL;
    }
    PyObject *top = PyList_GET_ITEM(stack, PyList_GET_SIZE(stack) - 1);
    if (UNLIKELY(!PyTuple_CheckExact(top) || PyTuple_GET_SIZE(top) < 2)) {
        return NULL;
    }
    PyObject *parent = PyTuple_GET_ITEM(top, 1);
    PyObject *children = Py_TYPE(parent) == SLOT_TYPE(SLOT_CHILDREN) ? SLOT_IN_PLACE(parent, SLOT_CHILDREN) : NULL;
    if (UNLIKELY(children == NULL || !PyDict_CheckExact(children))) {
        return NULL;
    }
    PyObject *node = child_of(block, children); /* borrowed */
    unsigned long long children_version = version_of(children);
    long long start_ns;
    if (UNLIKELY(node == NULL || node == parent || Py_TYPE(node) != SLOT_TYPE(SLOT_BATCHES) ||
                 !read_clock_raw(block->clock, &start_ns))) {
        return NULL; /* (an error from the dictionary stays set) */
    }
    /* From here on Python code may run (an allocation's collection, the reads): what is used is held. */
    PyObject *local = Py_NewRef(SLOT_IN_PLACE(stacks, SLOT_LOCAL));
    Py_INCREF(stacks);
    Py_INCREF(stack);
    Py_INCREF(parent);
    Py_INCREF(node);
    PyObject *samples = NULL, *remaining = NULL, *start = NULL;
    PyObject *frame = own_frame_refilled(block, node, children_version, start_ns);
    if (LIKELY(frame != NULL)) {
        start = Py_NewRef(PyTuple_GET_ITEM(frame, 2));
    }
    else if (PyErr_Occurred() || (start = PyLong_FromLongLong(start_ns)) == NULL || (frame = PyTuple_New(3)) == NULL) {
        goto done;
    }
    else {
        PyTuple_SET_ITEM(frame, 0, Py_NewRef((PyObject *)block));
        PyTuple_SET_ITEM(frame, 1, Py_NewRef(node));
        PyTuple_SET_ITEM(frame, 2, Py_NewRef(start));
    }
    if (UNLIKELY((remaining = PyObject_GetIter(indices)) == NULL || PyList_Append(stack, frame) < 0)) {
        goto done;
    }
    samples = call_read_all(read_all, dataset, remaining);
    if (UNLIKELY(samples == NULL)) {
        reads_failed(block, stacks, local, stack, frame, parent, node, indices, remaining, start);
        goto done;
    }
    Py_ssize_t size = PyList_GET_SIZE(stack);
    PyObject *batches = SLOT_IN_PLACE(node, SLOT_BATCHES);
    long long end_ns;
    int common = size > 0 && PyList_GET_ITEM(stack, size - 1) == frame &&
                 SLOT_IN_PLACE(stacks, SLOT_LOCAL) == local && SLOT_IN_PLACE(stacks, SLOT_TIMELINE) == Py_None &&
                 batches != NULL && read_clock_raw(block->clock, &end_ns);
    if (UNLIKELY(!common)) {
        if (close_reads(block, stacks, local, stack, frame, parent, node, PyList_GET_SIZE(samples), start) < 0) {
            Py_CLEAR(samples);
        }
        goto done;
    }
    Py_SET_SIZE(stack, size - 1); /* ``del stack[-1]``: the frame is held here, so this is never its last reference */
    Py_DECREF(frame);
    Py_INCREF(batches); /* the entry's allocation may run Python code */
    PyObject *entry = PyTuple_New(2), *count = NULL, *elapsed = NULL;
    if (UNLIKELY(entry == NULL || (count = PyLong_FromSsize_t(PyList_GET_SIZE(samples))) == NULL ||
                 (elapsed = PyLong_FromLongLong(end_ns - start_ns)) == NULL)) {
        Py_XDECREF(count);
        Py_XDECREF(entry);
        Py_CLEAR(samples);
    }
    else {
        PyTuple_SET_ITEM(entry, 0, count);
        PyTuple_SET_ITEM(entry, 1, elapsed);
        if (UNLIKELY(append_and_fold(stacks, node, batches, entry) < 0)) {
            Py_CLEAR(samples);
        }
        Py_DECREF(entry);
    }
    Py_DECREF(batches);
done:
    Py_XDECREF(remaining);
    Py_XDECREF(frame);
    Py_XDECREF(start);
    Py_DECREF(node);
    Py_DECREF(parent);
    Py_DECREF(stack);
    Py_DECREF(stacks);
    Py_DECREF(local);
    return samples;
}

static PyObject *
fetch_batch(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (UNLIKELY(nargs != 2 || !PyTuple_CheckExact(args[0]) || PyTuple_GET_SIZE(args[0]) != 6 ||
                 !PyObject_TypeCheck(PyTuple_GET_ITEM(args[0], 1), &BlockBaseType))) {
        PyErr_SetString(PyExc_TypeError,
                        "fetch_batch((reads, dataset_block, dataset, read_all, collate, collate_block), indices)");
        return NULL;
    }
    PyObject *spec = args[0], *indices = args[1];
    PyObject *samples = reads_compact((BlockObject *)PyTuple_GET_ITEM(spec, 1), PyTuple_GET_ITEM(spec, 2),
                                      PyTuple_GET_ITEM(spec, 3), indices);
    if (UNLIKELY(samples == NULL)) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        if ((samples = PyObject_CallOneArg(PyTuple_GET_ITEM(spec, 0), indices)) == NULL) {
            return NULL;
        }
    }
    PyObject *collate_args[3] = {PyTuple_GET_ITEM(spec, 4), PyTuple_GET_ITEM(spec, 5), samples};
    PyObject *batch = collate_samples(NULL, collate_args, 3);
    Py_DECREF(samples);
    return batch;
}
