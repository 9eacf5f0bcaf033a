/* ``count()`` in C: the Counter type, what ``Stopwatch.count`` and ``stepwatch.count`` are where compiled
 * (included by _speedups.c after _counts.c, whose count_units it calls).
 */

/* ``sw.count(**units)`` (stepwatch._counters.counter): add_counts' common case in C, where every value is an int
 * or a finite float and the phase measured on this thread is under way; every other case calls add_counts. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *stacks;   /* the stopwatch's stacks and tree, kept: re-pointed when its state is lent, given back */
    PyObject *tree;     /* or shared (Blocks.follow_state) */
    PyObject *fallback; /* add_counts bound to the stopwatch */
} CounterObject;

static PyObject *
counter_call(CounterObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t n = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    int plain = PyVectorcall_NARGS(nargsf) == 0 && n > 0 && n <= MAX_UNITS && counts_limit != NULL;
    for (Py_ssize_t i = 0; plain && i < n; i++) {
        PyObject *value = args[i];
        plain = PyUnicode_CheckExact(PyTuple_GET_ITEM(kwnames, i)) &&
                (PyLong_CheckExact(value) || (PyFloat_CheckExact(value) && isfinite(PyFloat_AS_DOUBLE(value))));
    }
    if (plain) {
        PyObject *stacks = Py_NewRef(self->stacks), *tree = Py_NewRef(self->tree); /* (held: a count may re-point) */
        PyObject *measuring = slot_get(stacks, SLOT_MEASURING);
        int on = measuring != NULL ? PyObject_IsTrue(measuring) : -1;
        Py_XDECREF(measuring);
        int done = on <= 0 ? on : count_units(stacks, tree, &PyTuple_GET_ITEM(kwnames, 0), args, n, BY_PROGRAM);
        Py_DECREF(tree);
        Py_DECREF(stacks);
        if (done < 0) {
            return NULL;
        }
        if (done == 1 || on == 0) {
            Py_RETURN_NONE; /* counted, or not measuring: counted nowhere, as in add_counts */
        }
    }
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

static PyTypeObject CounterType;

/* auto()'s count of a batch's samples on ``sw``: with the stacks and tree that ``count``, the stopwatch's compiled
 * count(), keeps (re-pointed with its state), where it is one; as ``add_samples(sw, size)`` otherwise. */
static PyObject *
count_samples(PyObject *sw, PyObject *count, PyObject *size)
{
    if (count == NULL || !Py_IS_TYPE(count, &CounterType)) {
        PyObject *args[2] = {sw, size};
        return add_samples(NULL, args, 2);
    }
    if (!counts_configured()) {
        return NULL;
    }
    CounterObject *counter = (CounterObject *)count;
    PyObject *stacks = Py_NewRef(counter->stacks), *tree = Py_NewRef(counter->tree); /* (held: a count may re-point) */
    PyObject *result = samples_counted(sw, stacks, tree, size);
    Py_DECREF(tree);
    Py_DECREF(stacks);
    return result;
}

static PyObject *
counter_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *sw, *fallback;
    if (keywords_refused("Counter", kwargs)) {
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OO:Counter", &sw, &fallback)) {
        return NULL;
    }
    CounterObject *self = (CounterObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->vectorcall = (vectorcallfunc)counter_call;
    self->fallback = Py_NewRef(fallback);
    self->stacks = PyObject_GetAttr(sw, s_stacks);
    self->tree = self->stacks != NULL ? PyObject_GetAttr(sw, s_tree) : NULL;
    if (self->tree == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int
counter_traverse(CounterObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->stacks);
    Py_VISIT(self->tree);
    Py_VISIT(self->fallback);
    return 0;
}

static int
counter_clear(CounterObject *self)
{
    Py_CLEAR(self->stacks);
    Py_CLEAR(self->tree);
    Py_CLEAR(self->fallback);
    return 0;
}

static void
counter_dealloc(CounterObject *self)
{
    PyObject_GC_UnTrack(self);
    counter_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
counter_repr(CounterObject *self)
{
    return PyUnicode_FromFormat("<compiled %R>", self->fallback);
}

/* ``__doc__`` and ``__wrapped__``: the Python method's, so that ``help()`` and ``inspect`` describe what it does. */
static PyObject *
counter_doc(CounterObject *self, void *Py_UNUSED(closure))
{
    return PyObject_GetAttrString(self->fallback, "__doc__");
}

static PyObject *
counter_wrapped(CounterObject *self, void *Py_UNUSED(closure))
{
    return Py_NewRef(self->fallback);
}

static PyGetSetDef counter_getset[] = {
    {"__doc__", (getter)counter_doc, NULL, NULL, NULL},
    {"__wrapped__", (getter)counter_wrapped, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef counter_members[] = {
    {"_stacks", T_OBJECT_EX, offsetof(CounterObject, stacks), 0, NULL},
    {"_tree", T_OBJECT_EX, offsetof(CounterObject, tree), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject CounterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stepwatch._speedups.Counter",
    .tp_doc = "Counter(stopwatch, add_counts bound to it): count()'s common case in C.",
    .tp_basicsize = sizeof(CounterObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(CounterObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = counter_new,
    .tp_traverse = (traverseproc)counter_traverse,
    .tp_clear = (inquiry)counter_clear,
    .tp_dealloc = (destructor)counter_dealloc,
    .tp_repr = (reprfunc)counter_repr,
    .tp_members = counter_members,
    .tp_getset = counter_getset,
};
