/* A block's ``__enter__``, ``__exit__``, ``_dropped_enter`` and ``_dropped_exit`` bound once (included by
 * _speedups.c, after BlockBase).
 *
 * A ``with`` statement looks its context manager's ``__enter__`` and ``__exit__`` up on the class and binds each
 * (CPython's ``_PyObject_LookupSpecial``): for methods of a C type's method table, each binding allocates a
 * builtin method object, tracked by the garbage collector, and frees it again, two allocations and frees a block.
 * In a real step these run cold, on the allocator's and the collector's lines. Here each of the four methods is a
 * descriptor of this file's whose binding hands out the block's own bound method, made at the block's first
 * ``with`` and kept by the block (a block lives as long as its stopwatch): a ``with`` allocates nothing for it.
 * Called through the class (``Block.__exit__(block, *args)``), or as ``block.__enter__()`` (a method descriptor:
 * the interpreter then calls it with the block first, without binding), each does what it does bound.
 */

enum { BOUND_ENTER, BOUND_EXIT, BOUND_DROPPED_ENTER, BOUND_DROPPED_EXIT, BOUND_KINDS };

typedef PyObject *(*block_method)(BlockObject *, PyObject *const *, Py_ssize_t);

static COLD PyObject *
refuse_arguments(const char *name, Py_ssize_t nargs)
{
    PyErr_Format(PyExc_TypeError, "%s() takes no arguments (%zd given)", name, nargs);
    return NULL;
}

static PyObject *
call_enter(BlockObject *block, PyObject *const *Py_UNUSED(args), Py_ssize_t nargs)
{
    return UNLIKELY(nargs != 0) ? refuse_arguments("__enter__", nargs) : block_enter(block, NULL);
}

static PyObject *
call_dropped_enter(BlockObject *block, PyObject *const *Py_UNUSED(args), Py_ssize_t nargs)
{
    return UNLIKELY(nargs != 0) ? refuse_arguments("_dropped_enter", nargs) : dropped_enter(block, NULL);
}

static const struct {
    const char *name;
    const char *doc;
    block_method call;
} BOUND_SPECS[BOUND_KINDS] = {
    {"__enter__", "Opens the block's frame on this thread's stack.", call_enter},
    {"__exit__", "Closes it and records its time.", block_exit},
    {"_dropped_enter", "A dropped block's entry: this thread noted inside.", call_dropped_enter},
    {"_dropped_exit", "A dropped block's exit: this thread's note taken back, or the live class's exit where there is "
                      "none.", dropped_exit},
};

/* A method in BlockBase's dictionary: called with the block first, or bound to it (its kept bound method). */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int kind;
} BlockMethodObject;

/* A block's method bound to it, made once and kept by the block (``BlockObject.bound``). */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *block; /* the BlockBase; NULL only once the collector has broken the block's cycle with it */
    int kind;
} BoundMethodObject;

static PyTypeObject BoundMethodType;

static COLD PyObject *
refuse_keywords(int kind)
{
    PyErr_Format(PyExc_TypeError, "%s() takes no keyword arguments", BOUND_SPECS[kind].name);
    return NULL;
}

static COLD PyObject *
refuse_bound_call(BoundMethodObject *self)
{
    if (self->block == NULL) {
        PyErr_Format(PyExc_ReferenceError, "%s() of a block already collected", BOUND_SPECS[self->kind].name);
        return NULL;
    }
    return refuse_keywords(self->kind);
}

/* The calls of the four bound methods, each its own (a ``with`` runs two of them). The caller holds the bound
 * method through the call, and with it the block. */
#define BOUND_CALL(function, kind_call)                                                                      \
    static PyObject *function(BoundMethodObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) \
    {                                                                                                          \
        if (UNLIKELY((kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) || self->block == NULL)) {            \
            return refuse_bound_call(self);                                                                    \
        }                                                                                                      \
        return kind_call((BlockObject *)self->block, args, PyVectorcall_NARGS(nargsf));                       \
    }
BOUND_CALL(bound_enter, call_enter)
BOUND_CALL(bound_exit, block_exit)
BOUND_CALL(bound_dropped_enter, call_dropped_enter)
BOUND_CALL(bound_dropped_exit, dropped_exit)
#undef BOUND_CALL

static const vectorcallfunc BOUND_CALLS[BOUND_KINDS] = {
    (vectorcallfunc)bound_enter, (vectorcallfunc)bound_exit, (vectorcallfunc)bound_dropped_enter,
    (vectorcallfunc)bound_dropped_exit,
};

/* Whether ``type`` is BlockBase or a subclass, found by its MRO; remembered by its version tag where it has one. */
static COLD int
is_block_class(PyTypeObject *type)
{
    if (!PyType_IsSubtype(type, &BlockBaseType)) {
        return 0;
    }
    KnownClass known;
    if (remember_class(&known, type)) {
        hot_state.block_version = known.version;
    }
    return 1;
}

/* Whether ``instance`` is a block. A version tag is never given to two classes (a class changed since is given a
 * new one, its MRO with it), so the last block class's tag is compared alone: the interpreter has just read the
 * tag, to look the method up on the class, and the tag is on the hot state's first line, which the block reads. */
static inline int
is_block(PyObject *instance)
{
    PyTypeObject *type = Py_TYPE(instance);
    KnownClass known = {type, hot_state.block_version};
    return (known.version != 0 && is_known_class(&known, type)) || is_block_class(type);
}

static PyObject *
method_call(BlockMethodObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) {
        return refuse_keywords(self->kind);
    }
    if (nargs < 1 || !is_block(args[0])) {
        PyErr_Format(PyExc_TypeError, "descriptor '%s' needs a stepwatch block as its first argument",
                     BOUND_SPECS[self->kind].name);
        return NULL;
    }
    return BOUND_SPECS[self->kind].call((BlockObject *)args[0], args + 1, nargs - 1); /* the caller holds it */
}

static COLD PyObject *
bind_first(BlockMethodObject *self, BlockObject *block)
{
    BoundMethodObject *bound = PyObject_GC_New(BoundMethodObject, &BoundMethodType);
    if (bound == NULL) {
        return NULL;
    }
    bound->vectorcall = BOUND_CALLS[self->kind];
    bound->kind = self->kind;
    Py_INCREF(block);
    bound->block = (PyObject *)block;
    PyObject_GC_Track(bound);
    Py_XSETREF(block->bound[self->kind], (PyObject *)bound);
    Py_INCREF(bound);
    return (PyObject *)bound;
}

static PyObject *
method_get(BlockMethodObject *self, PyObject *instance, PyObject *Py_UNUSED(owner))
{
    if (instance == NULL) {
        Py_INCREF(self);
        return (PyObject *)self;
    }
    if (!is_block(instance)) {
        PyErr_Format(PyExc_TypeError, "descriptor '%s' for stepwatch blocks does not apply to a '%s' object",
                     BOUND_SPECS[self->kind].name, Py_TYPE(instance)->tp_name);
        return NULL;
    }
    PyObject *bound = ((BlockObject *)instance)->bound[self->kind];
    if (bound == NULL) {
        return bind_first(self, (BlockObject *)instance);
    }
    Py_INCREF(bound);
    return bound;
}

static PyObject *
method_name(BlockMethodObject *self, void *Py_UNUSED(closure))
{
    return PyUnicode_FromString(BOUND_SPECS[self->kind].name);
}

static PyObject *
method_doc(BlockMethodObject *self, void *Py_UNUSED(closure))
{
    return PyUnicode_FromString(BOUND_SPECS[self->kind].doc);
}

static PyObject *
method_owner(BlockMethodObject *Py_UNUSED(self), void *Py_UNUSED(closure))
{
    Py_INCREF(&BlockBaseType);
    return (PyObject *)&BlockBaseType;
}

static PyObject *
method_repr(BlockMethodObject *self)
{
    return PyUnicode_FromFormat("<method '%s' of stepwatch blocks>", BOUND_SPECS[self->kind].name);
}

static PyGetSetDef method_getset[] = {
    {"__name__", (getter)method_name, NULL, NULL, NULL},
    {"__qualname__", (getter)method_name, NULL, NULL, NULL},
    {"__doc__", (getter)method_doc, NULL, NULL, NULL},
    {"__objclass__", (getter)method_owner, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject BlockMethodType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stepwatch._speedups.BlockMethod",
    .tp_doc = "A stepwatch block's method; bound, the block's own bound method, made once (see _bound.c).",
    .tp_basicsize = sizeof(BlockMethodObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_vectorcall_offset = offsetof(BlockMethodObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = (descrgetfunc)method_get,
    .tp_getset = method_getset,
    .tp_repr = (reprfunc)method_repr,
};

static int
bound_traverse(BoundMethodObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->block);
    return 0;
}

static int
bound_clear(BoundMethodObject *self)
{
    Py_CLEAR(self->block);
    return 0;
}

static void
bound_dealloc(BoundMethodObject *self)
{
    PyObject_GC_UnTrack(self);
    bound_clear(self);
    PyObject_GC_Del(self);
}

static PyObject *
bound_name(BoundMethodObject *self, void *Py_UNUSED(closure))
{
    return PyUnicode_FromString(BOUND_SPECS[self->kind].name);
}

static PyObject *
bound_repr(BoundMethodObject *self)
{
    return PyUnicode_FromFormat("<bound method '%s' of %R>", BOUND_SPECS[self->kind].name,
                                self->block != NULL ? self->block : Py_None);
}

static PyGetSetDef bound_getset[] = {
    {"__name__", (getter)bound_name, NULL, NULL, NULL},
    {"__qualname__", (getter)bound_name, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef bound_members[] = {
    {"__self__", T_OBJECT, offsetof(BoundMethodObject, block), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject BoundMethodType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stepwatch._speedups.BoundBlockMethod",
    .tp_doc = "A stepwatch block's method bound to it, made once and kept by the block (see _bound.c).",
    .tp_basicsize = sizeof(BoundMethodObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(BoundMethodObject, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_traverse = (traverseproc)bound_traverse,
    .tp_clear = (inquiry)bound_clear,
    .tp_dealloc = (destructor)bound_dealloc,
    .tp_getset = bound_getset,
    .tp_members = bound_members,
    .tp_repr = (reprfunc)bound_repr,
};

/* BlockBase readied, with the four methods in its dictionary. 0, or -1 with an exception. */
static int
block_methods_ready(void)
{
    if (PyType_Ready(&BlockMethodType) < 0 || PyType_Ready(&BoundMethodType) < 0 ||
        PyType_Ready(&BlockBaseType) < 0) {
        return -1;
    }
    for (int kind = 0; kind < BOUND_KINDS; kind++) {
        BlockMethodObject *method = PyObject_New(BlockMethodObject, &BlockMethodType);
        if (method == NULL) {
            return -1;
        }
        method->vectorcall = (vectorcallfunc)method_call;
        method->kind = kind;
        int failed = PyDict_SetItemString(BlockBaseType.tp_dict, BOUND_SPECS[kind].name, (PyObject *)method);
        Py_DECREF(method);
        if (failed < 0) {
            return -1;
        }
    }
    PyType_Modified(&BlockBaseType);
    return 0;
}
