/* A timed block's ``__enter__`` and ``__exit__`` in their common case, compact (included by _speedups.c, after
 * the general ``block_enter_general`` and ``block_exit_general`` they hand everything else to).
 *
 * In a real step each block's code is fetched cold: the model's work between two stages evicts it. The general
 * functions, with every case inlined, are 672 and 1,290 bytes, which the block fetched whole at each call
 * (benchmarks/footprint.py). Here the common case (measuring, the default clock, the thread's stack the one
 * cached, the frame on top this block's, its stage's buffer a plain list with room) makes the same reads and
 * writes in the same order (but the children's dictionary, not read where its own frame's node is known to be
 * current: ``child_of``), with borrowed references and no calls but the clock, the int conversions, the
 * dictionary read and the tuple; the first condition that does not hold hands the call, before anything was
 * written, to the general function, which reads everything again (but the clock: an exit's end is the one read
 * here, so that a fold or an unwind does not lengthen the block it closes).
 */

/* This thread's stack where ``thread_stack`` has found it for ``stacks``' local (borrowed), or NULL (no error):
 * ``stacks`` is a ThreadStacks. */
static inline PyObject *
cached_thread_stack(PyObject *stacks)
{
    PyObject *local = SLOT_IN_PLACE(stacks, SLOT_LOCAL);
    return local == NULL ? NULL : found_stack(local);
}

/* ``list.append(item)`` where the list has room (checked by the caller): the reference to ``item`` is taken. */
static inline void
append_with_room(PyObject *list, PyObject *item)
{
    Py_ssize_t size = PyList_GET_SIZE(list);
    PyList_SET_ITEM(list, size, item);
    Py_SET_SIZE(list, size + 1);
}

static inline int
has_room(PyObject *list)
{
    return PyList_CheckExact(list) && PyList_GET_SIZE(list) < ((PyListObject *)list)->allocated;
}

#if PY_VERSION_HEX < 0x030C0000
#define CACHES_CHILDREN 1 /* a dict's version (PEP 509), which 3.12 deprecates */
#else
#define CACHES_CHILDREN 0
#endif

#if PY_VERSION_HEX < 0x030E0000
#define REFILLS_FRAMES 1
#else
#define REFILLS_FRAMES 0 /* a tuple caches its hash from 3.14: one refilled would keep its first */
#endif

/* The block's own frame, ``(block, node, start)``, held by the block and refilled at each entry while nothing else
 * holds it (a stack it is still on, in a nested use or another thread's; a program or ``gc.get_referents``: that
 * entry goes the general way, the frame left as it is), made here at the block's second entry: a borrowed
 * reference, or NULL with an exception. A new tuple at each entry, freed at the exit, fetched the
 * allocator's and the collector's lines cold, and a neighbour's, in a real step (benchmarks/footprint.py). */
static COLD PyObject *
new_own_frame(BlockObject *self)
{
    PyObject *frame = PyTuple_Pack(3, (PyObject *)self, Py_None, Py_None);
    if (frame != NULL) {
        self->children_version = 0;
        Py_XSETREF(self->frame, frame); /* (a finalizer run by the allocation may have made one) */
    }
    return frame;
}

/* ``children``' version (PEP 509): a number no other state of any dict has had (0: none read, or no versions). */
static inline unsigned long long
version_of(PyObject *children)
{
#if CACHES_CHILDREN
    return ((PyDictObject *)children)->ma_version_tag;
#else
    (void)children;
    return 0;
#endif
}

/* ``block``'s node in ``children`` (a dict), borrowed, or NULL (with an exception, or none there): the node its own
 * frame holds where that was found in ``children`` as they are now (the same version, which every change of a dict
 * renews), without reading the dictionary (about three lines of it, cold in a real step, benchmarks/footprint.py);
 * looked up otherwise. Whoever refills the frame with the node records ``version_of(children)`` with it. */
static inline PyObject *
child_of(BlockObject *block, PyObject *children)
{
    PyObject *frame = block->frame;
    if (CACHES_CHILDREN && frame != NULL && block->children_version != 0 &&
        block->children_version == version_of(children)) {
        return PyTuple_GET_ITEM(frame, 1);
    }
    return PyDict_GetItemWithError(children, block->name);
}

/* A new int for the start of the frame's next use, where its int could not be rewritten (``rewritten_in_place``,
 * _ints.c): the frame's former start, whose reference is the caller's to drop, or NULL with an exception. */
static COLD PyObject *
new_start(PyObject *frame, long long now_ns)
{
    PyObject *start = PyLong_FromLongLong(now_ns);
    if (start == NULL) {
        return NULL;
    }
    PyObject *former = PyTuple_GET_ITEM(frame, 2);
    PyTuple_SET_ITEM(frame, 2, start);
    return former;
}

static PyObject *
block_enter(BlockObject *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *stacks = self->stacks;
    if (stacks == NULL || Py_TYPE(stacks) != SLOT_TYPE(SLOT_MEASURING)) {
        return block_enter_general(self);
    }
    PyObject *measuring = SLOT_IN_PLACE(stacks, SLOT_MEASURING);
    if (measuring == Py_False) {
        Py_RETURN_NONE; /* switched off: nothing, as block_enter_general does */
    }
    PyObject *stack = measuring == Py_True ? cached_thread_stack(stacks) : NULL;
    if (stack == NULL || !has_room(stack) || PyList_GET_SIZE(stack) == 0) {
        return block_enter_general(self);
    }
    PyObject *top = PyList_GET_ITEM(stack, PyList_GET_SIZE(stack) - 1);
    if (!PyTuple_CheckExact(top) || PyTuple_GET_SIZE(top) < 2) {
        return block_enter_general(self);
    }
    PyObject *parent = PyTuple_GET_ITEM(top, 1);
    PyObject *children = Py_TYPE(parent) == SLOT_TYPE(SLOT_CHILDREN) ? SLOT_IN_PLACE(parent, SLOT_CHILDREN) : NULL;
    if (children == NULL || !PyDict_CheckExact(children)) {
        return block_enter_general(self);
    }
    PyObject *node = child_of(self, children); /* borrowed */
    unsigned long long children_version = version_of(children); /* (before anything can change them) */
    long long now_ns;
    if (node == NULL || !read_clock_raw(self->clock, &now_ns)) {
        return PyErr_Occurred() ? NULL : block_enter_general(self); /* a new child, or another clock */
    }
    PyObject *frame = self->frame;
    if (!REFILLS_FRAMES || frame == NULL || Py_REFCNT(frame) != 1) {
        /* its first entry (its frame made for the next), or its frame held elsewhere: this one the general way (an
         * allocation may run Python code, which may change the stack) */
        return REFILLS_FRAMES && frame == NULL && new_own_frame(self) == NULL ? NULL : block_enter_general(self);
    }
    PyObject *former_node = PyTuple_GET_ITEM(frame, 1), *former_start = NULL;
    if (UNLIKELY(!rewritten_in_place(PyTuple_GET_ITEM(frame, 2), now_ns)) &&
        (former_start = new_start(frame, now_ns)) == NULL) {
        return NULL;
    }
    Py_INCREF(node);
    PyTuple_SET_ITEM(frame, 1, node);
    self->children_version = children_version;
    Py_INCREF(frame);
    append_with_room(stack, frame); /* (room checked above, and nothing has run since) */
    Py_DECREF(former_node); /* last: freeing them may run Python code */
    Py_XDECREF(former_start);
    Py_RETURN_NONE;
}

static PyObject *
block_exit(BlockObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *stacks = self->stacks;
    if (UNLIKELY(nargs != 3) || stacks == NULL || Py_TYPE(stacks) != SLOT_TYPE(SLOT_HOT)) {
        return block_exit_general(self, args, nargs, NULL);
    }
    PyObject *hot = SLOT_IN_PLACE(stacks, SLOT_HOT);
    if (hot == Py_False) {
        Py_RETURN_NONE; /* not measuring: nothing to close, as block_exit_general does */
    }
    long long end_ns;
    if (hot != Py_True || !read_clock_raw(self->clock, &end_ns)) {
        return block_exit_general(self, args, nargs, NULL);
    }
    PyObject *stack = cached_thread_stack(stacks);
    Py_ssize_t depth = stack == NULL || !PyList_CheckExact(stack) ? 0 : PyList_GET_SIZE(stack);
    PyObject *frame = depth == 0 ? NULL : PyList_GET_ITEM(stack, depth - 1);
    if (frame == NULL || !PyTuple_CheckExact(frame) || PyTuple_GET_SIZE(frame) != 3 ||
        PyTuple_GET_ITEM(frame, 0) != (PyObject *)self) {
        return block_exit_general(self, args, nargs, &end_ns); /* (a block closed out of order, say) */
    }
    PyObject *node = PyTuple_GET_ITEM(frame, 1);
    PyObject *buf = Py_TYPE(node) == SLOT_TYPE(SLOT_BUF) ? SLOT_IN_PLACE(node, SLOT_BUF) : NULL;
    if (buf == NULL || (!has_room(buf) && !(PyList_CheckExact(buf) && make_room(buf))) ||
        PyList_GET_SIZE(buf) + 1 >= FOLD_AT) {
        return block_exit_general(self, args, nargs, &end_ns);
    }
    long long first;
    if (!int_value(PyTuple_GET_ITEM(frame, 2), &first) || (first >= 0) != (end_ns >= 0)) {
        return block_exit_general(self, args, nargs, &end_ns);
    }
    Py_SET_SIZE(stack, depth - 1); /* ``del stack[-1]``: the stack's reference to the frame is now this one */
    PyObject *elapsed = PyLong_FromLongLong(end_ns - first);
    if (elapsed != NULL) {
        append_with_room(buf, elapsed); /* the frame holds the node, and with it its buffer */
    }
    Py_DECREF(frame); /* last: freeing it may run Python code (the block's own frame is not freed: it holds it) */
    if (elapsed == NULL) {
        return NULL;
    }
    Py_RETURN_NONE;
}
