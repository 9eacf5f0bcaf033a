/* A batch's dataset reads and collate in the main process (``num_workers=0``), their common case in C (included
 * by _speedups.c, after the block and with_block it uses).
 *
 * ``read_samples(fallback, block, dataset, read_all, indices)`` is what a single-process DataLoader's fetcher calls
 * for a batch (``TimedReads.__getitems__``, with the first four bound): the samples, ``read_all(dataset,
 * iter(indices))``, read between one pair of clock reads under a ``dataset`` frame, and recorded as
 * ``TimedGetItems.read`` (stepwatch/_dataloader/in_workers.py) records them: the batch's reads as one entry of
 * the node's ``batches``, the calls counted exactly, blocks opened inside ``__getitem__`` nested under
 * ``dataset``. ``block`` is the stopwatch's ``dataset`` block (the frame's owner); while the stopwatch does not
 * measure, ``fallback(sw, indices)`` (that Python method) does everything. It saves the method's frame and
 * bytecode. The samples are read by ``read_all``, a Python list comprehension, not by a loop here: the
 * interpreter calls a dataset's ``__getitem__`` without re-entering itself, where ``PyObject_GetItem`` from C
 * cost about 100 ns a sample more (a batch of 512: +51.5 us against +4.8 for the Python read).
 *
 * ``collate_samples(collate, block, samples)`` is the same iterator's collate: ``TimedCollate.__call__``'s main
 * process case, its wrapped function called inside the stopwatch's ``collate`` block, without its frame.
 */

static PyObject *s_events, *s_len;

/* The reads that count when the batch failed: as ``TimedGetItems.read`` counts them (the samples read and the
 * one that failed, where the indices have a length and their iterator a length hint; 1 otherwise). The
 * exception is kept. -1 with an exception raised by this count itself. */
static Py_ssize_t
reads_before_failure(PyObject *indices, PyObject *remaining)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    Py_ssize_t read = 1;
    Py_ssize_t left = PyObject_LengthHint(remaining, -1);
    int sized = left < 0 ? 0 : PyObject_HasAttr(indices, s_len);
    Py_ssize_t size = sized ? PyObject_Size(indices) : -1;
    if (PyErr_Occurred()) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
        return -1;
    }
    if (size >= 0) {
        read = size - left;
    }
    PyErr_Restore(type, value, traceback);
    return read;
}

/* The batch's entry ``(read, end - start)`` in ``node.batches`` (folded as a block's buffer is), and its event
 * on the timeline where one is kept (``stacks.timeline``, read at its offset: by name on the stopwatch, a few
 * cache lines more at each batch): 0, or -1 with an exception. */
static int
record_batch(PyObject *stacks, PyObject *stack, PyObject *node, Py_ssize_t read, PyObject *start, PyObject *end)
{
    PyObject *batches = slot_get(node, SLOT_BATCHES);
    PyObject *elapsed = batches == NULL ? NULL : difference(end, start);
    PyObject *entry = elapsed == NULL ? NULL : PyTuple_New(2);
    PyObject *count = entry == NULL ? NULL : PyLong_FromSsize_t(read);
    if (count == NULL) {
        Py_CLEAR(entry);
    }
    else {
        PyTuple_SET_ITEM(entry, 0, count);
        PyTuple_SET_ITEM(entry, 1, Py_NewRef(elapsed));
    }
    Py_XDECREF(elapsed);
    int failed = entry == NULL || append_and_fold(stacks, node, batches, entry) < 0;
    Py_XDECREF(entry);
    Py_XDECREF(batches);
    if (failed) {
        return -1;
    }
    PyObject *timeline = slot_get(stacks, SLOT_TIMELINE); /* the stopwatch's (see Stopwatch._set_timeline) */
    if (timeline == NULL || timeline == Py_None) {
        Py_XDECREF(timeline);
        return timeline == NULL ? -1 : 0;
    }
    PyObject *events = PyObject_GetAttr(timeline, s_events);
    PyObject *event = events == NULL ? NULL : PyTuple_Pack(4, node, start, end, stack);
    PyObject *added = event == NULL ? NULL : PyNumber_InPlaceAdd(events, event); /* timeline.events += (...) */
    failed = added == NULL || PyObject_SetAttr(timeline, s_events, added) < 0;
    Py_XDECREF(added);
    Py_XDECREF(event);
    Py_XDECREF(events);
    Py_DECREF(timeline);
    return failed ? -1 : 0;
}

/* ``del stack[-1]``, whose item the caller holds a reference of its own to (so that nothing is freed here): 0, or
 * -1 with an exception. A plain list is shrunk in place, without the slice assignment's general machinery. */
static int
pop_held(PyObject *stack)
{
    Py_ssize_t size = PyList_GET_SIZE(stack);
    if (!PyList_CheckExact(stack)) {
        return PyList_SetSlice(stack, size - 1, size, NULL);
    }
    PyObject *item = PyList_GET_ITEM(stack, size - 1);
    Py_SET_SIZE(stack, size - 1);
    Py_DECREF(item);
    return 0;
}

/* The read's frame taken off the stack, and the batch recorded (see TimedGetItems.read's ``finally``): 0, or -1
 * with an exception. */
static int
close_reads(BlockObject *block, PyObject *stacks, PyObject *local, PyObject *stack, PyObject *frame,
            PyObject *parent, PyObject *node, Py_ssize_t read, PyObject *start)
{
    PyObject *end = read_clock(block->clock);
    if (end == NULL) {
        return -1;
    }
    int failed = 0;
    PyObject *now_local = slot_get(stacks, SLOT_LOCAL);
    if (now_local == NULL) {
        failed = 1;
    }
    else if (PyList_GET_SIZE(stack) > 0 && PyList_GET_ITEM(stack, PyList_GET_SIZE(stack) - 1) == frame) {
        failed = pop_held(stack) < 0; /* (the frame is held by read_samples) */
        if (!failed && now_local == local && node != parent) { /* not switched; (DROPPED is its own child) */
            failed = record_batch(stacks, stack, node, read, start, end) < 0;
        }
    }
    else if (now_local == local) {
        PyObject *hot = slot_get(stacks, SLOT_HOT);
        int is_hot = hot == NULL ? -1 : PyObject_IsTrue(hot);
        Py_XDECREF(hot);
        PyObject *unwound = is_hot > 0 ? PyObject_CallMethodObjArgs(stacks, s_unwind, stack, (PyObject *)block, NULL)
                                       : NULL;
        failed = is_hot < 0 || (is_hot > 0 && unwound == NULL); /* blocks left open inside the read: as Block does */
        Py_XDECREF(unwound);
    }
    Py_XDECREF(now_local);
    Py_DECREF(end);
    return failed ? -1 : 0;
}

/* ``read_all(dataset, remaining)``: the batch's samples (a list), or NULL with an exception. */
static PyObject *
call_read_all(PyObject *read_all, PyObject *dataset, PyObject *remaining)
{
    PyObject *read_arguments[2] = {dataset, remaining};
    PyObject *samples = PyObject_Vectorcall(read_all, read_arguments, 2, NULL);
    if (samples != NULL && !PyList_Check(samples)) {
        PyErr_SetString(PyExc_TypeError, "stepwatch: read_all must return a list");
        Py_CLEAR(samples);
    }
    return samples;
}

/* A failed read (``read_all`` raised), its frame on the stack: the frame closed and the batch recorded all the
 * same, as ``TimedGetItems.read``'s ``finally`` does; the read's exception goes on (replaced by one raised while
 * closing, as in a ``finally``). Always NULL. */
static COLD PyObject *
reads_failed(BlockObject *block, PyObject *stacks, PyObject *local, PyObject *stack, PyObject *frame,
             PyObject *parent, PyObject *node, PyObject *indices, PyObject *remaining, PyObject *start)
{
    Py_ssize_t read = reads_before_failure(indices, remaining);
    if (read < 0) {
        return NULL;
    }
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    if (close_reads(block, stacks, local, stack, frame, parent, node, read, start) < 0) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
    }
    else {
        PyErr_Restore(type, value, traceback);
    }
    return NULL;
}

static PyObject *
read_samples(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyObject_TypeCheck(args[1], &BlockBaseType)) {
        PyErr_SetString(PyExc_TypeError, "read_samples(fallback, block, dataset, read_all, indices)");
        return NULL;
    }
    PyObject *fallback = args[0], *dataset = args[2], *read_all = args[3], *indices = args[4];
    BlockObject *block = (BlockObject *)args[1];
    PyObject *stacks = block_stacks(block);
    if (stacks == NULL) {
        return NULL;
    }
    PyObject *result = NULL, *measuring = NULL, *local = NULL, *stack = NULL, *parent = NULL, *node = NULL,
             *start = NULL, *frame = NULL, *samples = NULL, *remaining = NULL;
    measuring = slot_get(stacks, SLOT_MEASURING);
    if (measuring == NULL) {
        goto done;
    }
    if (measuring != Py_True) { /* off, or dropping: each sample as a block would be, in Python */
        result = PyObject_CallFunctionObjArgs(fallback, block->sw, indices, NULL);
        goto done;
    }
    if ((local = slot_get(stacks, SLOT_LOCAL)) == NULL || (stack = thread_stack(stacks)) == NULL) {
        goto done;
    }
    if ((remaining = PyObject_GetIter(indices)) == NULL) {
        goto done;
    }
    PyObject *top = top_of(stack);
    if (top == NULL || (parent = frame_item(top, 1)) == NULL || (node = child_node(block, parent)) == NULL ||
        (start = read_clock(block->clock)) == NULL ||
        (frame = PyTuple_Pack(3, (PyObject *)block, node, start)) == NULL || PyList_Append(stack, frame) < 0) {
        goto done;
    }
    samples = call_read_all(read_all, dataset, remaining);
    if (samples == NULL) {
        reads_failed(block, stacks, local, stack, frame, parent, node, indices, remaining, start);
        goto done;
    }
    if (close_reads(block, stacks, local, stack, frame, parent, node, PyList_GET_SIZE(samples), start) == 0) {
        result = Py_NewRef(samples);
    }
done:
    Py_XDECREF(remaining);
    Py_XDECREF(samples);
    Py_XDECREF(frame);
    Py_XDECREF(start);
    Py_XDECREF(node);
    Py_XDECREF(parent);
    Py_XDECREF(stack);
    Py_XDECREF(local);
    Py_XDECREF(measuring);
    Py_DECREF(stacks);
    return result;
}

/* ``collate.<slot>`` is True (a TimedCollate's slot read in place, configure_collate): 1, 0, or -1 with an
 * exception. */
static int
flag_is_true(PyObject *collate, Slot slot)
{
    PyObject *value = slot_get(collate, slot);
    if (value == NULL) {
        return -1;
    }
    Py_DECREF(value);
    return value == Py_True;
}

/* ``collate_samples(collate, block, samples)``: what the fetcher of a single-process iterator of the default
 * stopwatch calls for a batch's collate (``single_process.install_collate``, with the first two bound): where
 * ``collate`` (a ``TimedCollate``) is enabled and watching, its ``collate_fn`` called inside ``block`` (the
 * default stopwatch's ``collate``), as ``TimedCollate.__call__`` does in the main process; ``collate(samples)``
 * otherwise. Its three attributes are slots read in place: by name, each was a lookup in the class and one in
 * the instance's keys, about fifteen lines fetched cold at each batch. */
static PyObject *
collate_samples(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (UNLIKELY(nargs != 3)) {
        PyErr_SetString(PyExc_TypeError, "collate_samples(collate, block, samples)");
        return NULL;
    }
    PyObject *collate = args[0], *block = args[1];
    int enabled = flag_is_true(collate, SLOT_ENABLED);
    int watching = enabled == 1 ? flag_is_true(collate, SLOT_WATCHING) : 0;
    if (UNLIKELY(enabled < 0 || watching < 0)) {
        return NULL;
    }
    if (UNLIKELY(!watching)) {
        return PyObject_CallOneArg(collate, args[2]);
    }
    PyObject *inner = slot_get(collate, SLOT_COLLATE_FN);
    if (UNLIKELY(inner == NULL)) {
        return NULL;
    }
    PyObject *result = with_block(block, inner, args + 2, 1, NULL);
    Py_DECREF(inner);
    return result;
}

/* Interns the names above; 0, or -1 with an exception. */
static int
reads_ready(void)
{
    struct {
        PyObject **slot;
        const char *text;
    } names[] = {
        {&s_events, "events"},
        {&s_len, "__len__"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (*names[i].slot == NULL && (*names[i].slot = PyUnicode_InternFromString(names[i].text)) == NULL) {
            return -1;
        }
    }
    return 0;
}
