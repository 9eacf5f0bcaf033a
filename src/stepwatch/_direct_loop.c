/* A timed loop's iterator, in front of its generator (included by _speedups.c after _steady.c; where this was not
 * built, ``_loops.timed_loop`` hands out the generator itself).
 *
 * ``DirectLoop(generator, delegate)``: each ``next()`` of a ``for`` statement went through the generator
 * (``_loops.iterate``) to the ``SteadyLoop`` it delegates its steady steps to (``yield from``): the generator resumed,
 * its frame entered and left again, about as much as one of the steady step's own halves in a real step, where each
 * line of it is fetched cold (benchmarks/footprint.py). The generator puts the ``SteadyLoop`` in ``delegate`` (a list
 * of one item; None: none) while it delegates, and this calls it directly then. Wherever the ``SteadyLoop`` stops,
 * the generator is resumed, and its ``yield from`` finds it stopped, as it would have; an exception from it is
 * thrown into the generator at its ``yield from``, where it would have been raised. Everything else is the
 * generator's: its first and last steps, the steps that are not steady, ``send()``, ``throw()`` and ``close()``.
 */

typedef struct {
    PyObject_HEAD
    PyObject *generator;
    PyObject *delegate; /* a list of one item, the SteadyLoop or None */
    int running;        /* in a SteadyLoop's step: the generator is as good as running */
} DirectLoopObject;

/* An exception from the steady steps, raised in the generator at its ``yield from`` (``generator.throw``): the
 * generator's next item, or NULL at its end (no exception) or with the exception it raised. */
static COLD PyObject *
direct_thrown(DirectLoopObject *self)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *value = PyErr_GetRaisedException();
#else
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback != NULL && value != NULL) {
        PyException_SetTraceback(value, traceback);
    }
    Py_XDECREF(type);
    Py_XDECREF(traceback);
#endif
    PyObject *item = value == NULL ? NULL : PyObject_CallMethod(self->generator, "throw", "O", value);
    Py_XDECREF(value);
    if (item == NULL && PyErr_ExceptionMatches(PyExc_StopIteration)) {
        PyErr_Clear(); /* the generator returned: the loop is over */
    }
    return item;
}

static PyObject *
direct_next(DirectLoopObject *self)
{
    if (UNLIKELY(self->running)) {
        return refuse_running();
    }
    PyObject *delegate = self->delegate;
    PyObject *steps = PyList_GET_SIZE(delegate) == 1 ? PyList_GET_ITEM(delegate, 0) : NULL;
    if (steps != NULL && Py_TYPE(steps) == &SteadyLoopType) { /* (one stopped returns NULL at once, no exception) */
        if (UNLIKELY(((SteadyLoopObject *)steps)->busy)) { /* a step the generator drives, from its own count */
            return refuse_running(); /* here, not thrown into the generator from steady_next: that would end it */
        }
        Py_INCREF(steps); /* (the fetch can run anything, the generator's delegate replaced with it) */
        self->running = 1;
        PyObject *item = steady_next((SteadyLoopObject *)steps);
        self->running = 0;
        Py_DECREF(steps);
        if (item != NULL) {
            return item;
        }
        if (PyErr_Occurred()) {
            return direct_thrown(self);
        }
        /* stopped: the generator's ``yield from`` finds it so, and goes on */
    }
    PyObject *generator = self->generator;
    return Py_TYPE(generator)->tp_iternext(generator);
}

/* ``send()``, ``throw()`` and ``close()``: the generator's own. */
static PyObject *
direct_forward(DirectLoopObject *self, const char *name, PyObject *args)
{
    if (self->running) {
        return refuse_running();
    }
    PyObject *method = PyObject_GetAttrString(self->generator, name);
    if (method == NULL) {
        return NULL;
    }
    PyObject *result = PyObject_Call(method, args, NULL);
    Py_DECREF(method);
    return result;
}

static PyObject *
direct_send(DirectLoopObject *self, PyObject *args)
{
    return direct_forward(self, "send", args);
}

static PyObject *
direct_throw(DirectLoopObject *self, PyObject *args)
{
    return direct_forward(self, "throw", args);
}

static PyObject *
direct_close(DirectLoopObject *self, PyObject *args)
{
    return direct_forward(self, "close", args);
}

static PyObject *
direct_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *generator, *delegate;
    if (keywords_refused("DirectLoop", kwargs)) {
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!O!:DirectLoop", &PyGen_Type, &generator, &PyList_Type, &delegate)) {
        return NULL;
    }
    if (!PyList_CheckExact(delegate) || PyList_GET_SIZE(delegate) != 1) {
        PyErr_SetString(PyExc_TypeError, "DirectLoop(): the delegate is a list of one item");
        return NULL;
    }
    DirectLoopObject *self = (DirectLoopObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->generator = Py_NewRef(generator);
    self->delegate = Py_NewRef(delegate);
    return (PyObject *)self;
}

static int
direct_traverse(DirectLoopObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->generator);
    Py_VISIT(self->delegate);
    return 0;
}

static int
direct_clear(DirectLoopObject *self)
{
    Py_CLEAR(self->generator);
    Py_CLEAR(self->delegate);
    return 0;
}

static void
direct_dealloc(DirectLoopObject *self)
{
    PyObject_GC_UnTrack(self);
    direct_clear(self); /* the generator, last held here, closes: the loop's frames closed as a ``for`` leaves them */
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
direct_generator(DirectLoopObject *self, void *Py_UNUSED(closure))
{
    return Py_NewRef(self->generator);
}

static PyMethodDef direct_methods[] = {
    {"send", (PyCFunction)direct_send, METH_VARARGS, "The generator's send()."},
    {"throw", (PyCFunction)direct_throw, METH_VARARGS, "The generator's throw()."},
    {"close", (PyCFunction)direct_close, METH_VARARGS, "The generator's close(): the loop ends as after a break."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef direct_getset[] = {
    {"generator", (getter)direct_generator, NULL, "The loop's generator (_loops.iterate).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject DirectLoopType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stepwatch._speedups.DirectLoop",
    .tp_doc = "A timed loop's iterator, its steady steps called without resuming its generator (see "
              "stepwatch/_direct_loop.c).",
    .tp_basicsize = sizeof(DirectLoopObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = direct_new,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)direct_next,
    .tp_methods = direct_methods,
    .tp_getset = direct_getset,
    .tp_traverse = (traverseproc)direct_traverse,
    .tp_clear = (inquiry)direct_clear,
    .tp_dealloc = (destructor)direct_dealloc,
};
