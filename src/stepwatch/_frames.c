/* The clock, a frame's items, a stage's buffer and a block's node: what every
 * C hot path of stepwatch reads and writes (included by _speedups.c, after the names and the slots it uses).
 */

/* The default clock, ``time.perf_counter_ns``, is CLOCK_MONOTONIC on Linux, read here directly as a C integer
 * (1); 0 where the clock is another, which is called (``read_clock``). In a real step, where stepwatch is out of
 * the caches, the call through Python's machinery took about 1.8 us. */
static int
read_clock_raw(PyObject *clock, long long *now_ns)
{
#if defined(__linux__) && defined(CLOCK_MONOTONIC)
    struct timespec now;
    if (clock == hot_state.perf_counter_ns && clock_gettime(CLOCK_MONOTONIC, &now) == 0) {
        *now_ns = (long long)now.tv_sec * 1000000000LL + (long long)now.tv_nsec;
        return 1;
    }
#endif
    return 0;
}

/* ``clock()``, a Python int. */
static PyObject *
read_clock(PyObject *clock)
{
    long long now_ns;
    return read_clock_raw(clock, &now_ns) ? PyLong_FromLongLong(now_ns) : PyObject_CallNoArgs(clock);
}

static COLD PyObject *
sequence_item(PyObject *frame, Py_ssize_t index)
{
    return PySequence_GetItem(frame, index);
}

/* ``frame[index]`` of a frame (a tuple, or a list for a device frame): a new reference. */
static PyObject *
frame_item(PyObject *frame, Py_ssize_t index)
{
    if (PyTuple_CheckExact(frame) && PyTuple_GET_SIZE(frame) > index) {
        PyObject *item = PyTuple_GET_ITEM(frame, index);
        Py_INCREF(item);
        return item;
    }
    return sequence_item(frame, index);
}

static COLD PyObject *
empty_stack(void)
{
    PyErr_SetString(PyExc_IndexError, "list index out of range");
    return NULL;
}

/* ``stack[-1]``, borrowed. */
static PyObject *
top_of(PyObject *stack)
{
    Py_ssize_t size = PyList_GET_SIZE(stack);
    if (UNLIKELY(size == 0)) {
        return empty_stack();
    }
    return PyList_GET_ITEM(stack, size - 1);
}

/* ``end - start`` where the end is a C integer of nanoseconds (the default clock's reading, ``read_clock_raw``):
 * the difference is the one Python int made; a start that is not an int of the same sign goes through Python's
 * subtraction. */
static COLD PyObject *
elapsed_in_python(long long end_ns, PyObject *start)
{
    if (PyErr_Occurred()) {
        return NULL;
    }
    PyObject *end = PyLong_FromLongLong(end_ns);
    PyObject *elapsed = end == NULL ? NULL : PyNumber_Subtract(end, start);
    Py_XDECREF(end);
    return elapsed;
}

static PyObject *
elapsed_since(long long end_ns, PyObject *start)
{
    long long first;
    if (int_value(start, &first) && (first >= 0) == (end_ns >= 0)) {
        return PyLong_FromLongLong(end_ns - first); /* (same signs: no overflow) */
    }
    return elapsed_in_python(end_ns, start);
}

/* ``end - start``, two ints of nanoseconds (any other numbers through Python's subtraction). */
static PyObject *
difference(PyObject *end, PyObject *start)
{
    long long last;
    if (int_value(end, &last)) {
        return elapsed_since(last, start);
    }
    return PyNumber_Subtract(end, start);
}

/* Room for one more item in a stage's buffer (a plain list, full), made by doubling its allocation up to the fold
 * size: 1, or 0 where it could not be made (no exception: ``list.append`` then grows it its own way). A list grows
 * by an eighth, so a buffer filled to the fold size from empty was reallocated 28 times, each a copy of it and a
 * call on the slow path with cold code (benchmarks/footprint.py); doubled, 7 times. The items' array is allocated
 * with ``PyMem_Realloc``, as the list's own code does in every build with the GIL. */
static COLD int
make_room(PyObject *list)
{
#ifdef Py_GIL_DISABLED
    (void)list;
    return 0;
#else
    PyListObject *items_of = (PyListObject *)list;
    Py_ssize_t size = PyList_GET_SIZE(list), wanted = items_of->allocated < 8 ? 16 : items_of->allocated * 2;
    if (wanted > FOLD_AT) {
        wanted = FOLD_AT;
    }
    if (wanted <= size || (size_t)wanted > PY_SSIZE_T_MAX / sizeof(PyObject *)) {
        return 0;
    }
    PyObject **items = PyMem_Realloc(items_of->ob_item, (size_t)wanted * sizeof(PyObject *));
    if (items == NULL) {
        return 0;
    }
    items_of->ob_item = items;
    items_of->allocated = wanted;
    return 1;
#endif
}

/* ``list.append(item)``, then ``stacks.fold(node)`` once ``len(list)`` reaches the fold size (``list``: a node's
 * buffer, or its batches): 0, or -1 with an exception. */
static COLD int
append_and_fold_slowly(PyObject *stacks, PyObject *node, PyObject *list, PyObject *item);

static int
append_and_fold(PyObject *stacks, PyObject *node, PyObject *list, PyObject *item)
{
    if (PyList_CheckExact(list) && PyList_GET_SIZE(list) + 1 < FOLD_AT) {
        if (PyList_GET_SIZE(list) >= ((PyListObject *)list)->allocated) {
            make_room(list);
        }
        return PyList_Append(list, item); /* the common case: the buffer not full after it */
    }
    return append_and_fold_slowly(stacks, node, list, item);
}

/* ``append_and_fold``'s other cases: a buffer that is not a plain list, or full once appended to. */
static COLD int
append_and_fold_slowly(PyObject *stacks, PyObject *node, PyObject *list, PyObject *item)
{
    int failed;
    if (PyList_Check(list)) {
        failed = PyList_Append(list, item);
    }
    else {
        PyObject *appended = PyObject_CallMethod(list, "append", "O", item);
        failed = appended == NULL;
        Py_XDECREF(appended);
    }
    /* (a dropped node's buffer, a list subclass, always reads as full) */
    Py_ssize_t size = failed ? -1 : PyList_CheckExact(list) ? PyList_GET_SIZE(list) : PyObject_Size(list);
    if (size < 0) {
        return -1;
    }
    if (size >= FOLD_AT) {
        PyObject *folded = PyObject_CallMethodOneArg(stacks, s_fold, node);
        if (folded == NULL) {
            return -1;
        }
        Py_DECREF(folded);
    }
    return 0;
}

/* ``buf.append(elapsed)``, then ``stacks.fold(node)`` once ``len(buf)`` reaches the fold size. */
static int
record(PyObject *stacks, PyObject *node, PyObject *elapsed)
{
    PyObject *buf = slot_get(node, SLOT_BUF);
    if (buf == NULL) {
        return -1;
    }
    int failed = append_and_fold(stacks, node, buf, elapsed);
    Py_DECREF(buf);
    return failed;
}

/* ``sw.tree.add_child(parent, name)``: a block's node made the first time it opens under ``parent``. */
static COLD PyObject *
new_child_node(BlockObject *self, PyObject *parent)
{
    PyObject *tree = PyObject_GetAttr(self->sw, s_tree);
    if (tree == NULL) {
        return NULL;
    }
    PyObject *node = PyObject_CallMethodObjArgs(tree, s_add_child, parent, self->name, NULL);
    Py_DECREF(tree);
    return node;
}

/* A dropped node's children (not a dict): every name is that node again. A new reference, or NULL. */
static COLD PyObject *
dropped_child(PyObject *children, PyObject *name)
{
    PyObject *node = PyObject_CallMethodOneArg(children, s_get, name);
    if (node == Py_None) {
        Py_CLEAR(node);
    }
    return node;
}

/* The child node named ``name`` of ``parent``, made by ``sw.tree.add_child`` if it is new: a new reference. */
static PyObject *
child_node(BlockObject *self, PyObject *parent)
{
    PyObject *children = slot_get(parent, SLOT_CHILDREN);
    if (UNLIKELY(children == NULL)) {
        return NULL;
    }
    PyObject *node;
    if (PyDict_CheckExact(children)) {
        node = PyDict_GetItemWithError(children, self->name);
        Py_XINCREF(node);
    }
    else {
        node = dropped_child(children, self->name);
    }
    Py_DECREF(children);
    if (node != NULL || PyErr_Occurred()) {
        return node;
    }
    return new_child_node(self, parent);
}
