/* ``sw.timed(stage)``'s common case in C (included by _speedups.c; ``Stopwatch.timed`` is the fallback, and what
 * runs where this was not built): a stage name used before is one dictionary read, without a Python frame. */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *by_name;  /* the stopwatch's blocks by name, kept: re-pointed when its state is lent, given back or
                           shared (Blocks.follow_state) */
    PyObject *fallback; /* Stopwatch.timed bound to the stopwatch: a new name, a bad one, anything else */
} LookupObject;

static PyObject *
lookup_call(LookupObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) == 1 && kwnames == NULL && PyUnicode_CheckExact(args[0]) &&
        PyDict_CheckExact(self->by_name)) {
        PyObject *block = PyDict_GetItemWithError(self->by_name, args[0]);
        if (block != NULL) {
            Py_INCREF(block);
            return block;
        }
        if (PyErr_Occurred()) {
            return NULL;
        }
    }
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

static PyObject *
lookup_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *by_name, *fallback;
    if (keywords_refused("Lookup", kwargs)) {
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OO:Lookup", &by_name, &fallback)) {
        return NULL;
    }
    LookupObject *self = (LookupObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->vectorcall = (vectorcallfunc)lookup_call;
    self->by_name = Py_NewRef(by_name);
    self->fallback = Py_NewRef(fallback);
    return (PyObject *)self;
}

static int
lookup_traverse(LookupObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->by_name);
    Py_VISIT(self->fallback);
    return 0;
}

static int
lookup_clear(LookupObject *self)
{
    Py_CLEAR(self->by_name);
    Py_CLEAR(self->fallback);
    return 0;
}

static void
lookup_dealloc(LookupObject *self)
{
    PyObject_GC_UnTrack(self);
    lookup_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
lookup_repr(LookupObject *self)
{
    return PyUnicode_FromFormat("<compiled %R>", self->fallback);
}

/* ``__doc__`` and ``__wrapped__``: the Python method's, so that ``help()`` and ``inspect`` describe what it does. */
static PyObject *
lookup_doc(LookupObject *self, void *Py_UNUSED(closure))
{
    return PyObject_GetAttrString(self->fallback, "__doc__");
}

static PyObject *
lookup_wrapped(LookupObject *self, void *Py_UNUSED(closure))
{
    return Py_NewRef(self->fallback);
}

static PyGetSetDef lookup_getset[] = {
    {"__doc__", (getter)lookup_doc, NULL, NULL, NULL},
    {"__wrapped__", (getter)lookup_wrapped, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef lookup_members[] = {
    {"_by_name", T_OBJECT_EX, offsetof(LookupObject, by_name), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject LookupType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stepwatch._speedups.Lookup",
    .tp_doc = "Lookup(blocks by name, Stopwatch.timed bound to the stopwatch): timed()'s common case in C.",
    .tp_basicsize = sizeof(LookupObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(LookupObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = lookup_new,
    .tp_traverse = (traverseproc)lookup_traverse,
    .tp_clear = (inquiry)lookup_clear,
    .tp_dealloc = (destructor)lookup_dealloc,
    .tp_repr = (reprfunc)lookup_repr,
    .tp_members = lookup_members,
    .tp_getset = lookup_getset,
};
