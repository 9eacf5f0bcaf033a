/* auto()'s loop over a DataLoader's watched batches in C (included by _speedups.c after _counter.c, whose
 * count_samples it calls; stepwatch/_auto_steps.py has the same in Python, ``python_steps``, what runs where this
 * was not built).
 *
 * ``AutoSteps(session, begin, end, counted, batch_size)`` is an iterator: its first next() calls ``begin()``
 * (which returns the watched batches, whether the loop is the session's, the uniform batch size and how many
 * batches have it); every next() then does what the Python generator does around its ``yield``: after the step,
 * an evaluation ended and the module calls checked when due; before it, an optimizer block left open by a step
 * that raised forgotten and the batch's samples counted on ``counted`` (None: not counted). ``end(tracked,
 * batches)`` is called once, when the loop ends however it ends: its batches run out, it raises, it is closed,
 * or it is dropped unfinished. A second Python generator's frame and bytecode cost every step about 135 cache
 * lines more (benchmarks/footprint.py).
 */

typedef struct {
    PyObject_HEAD
    AutoStateObject *session;
    PyObject *begin;      /* called at the first next() */
    PyObject *end;        /* called once, when the loop ends */
    PyObject *counted;    /* the stopwatch the samples are counted on, or None */
    PyObject *batch_size; /* stepwatch._batch_size.batch_size */
    PyObject *steps;      /* the watched batches (from begin()) */
    PyObject *uniform;    /* the size of batches 2 to ``full`` (an int), or None */
    Py_ssize_t full;
    Py_ssize_t batches;
    int tracked;
    int state; /* STEPS_NEW, STEPS_RUNNING, STEPS_ENDED */
} AutoStepsObject;

enum { STEPS_NEW = 0, STEPS_RUNNING = 1, STEPS_ENDED = 2 };

static PyObject *s_end_evaluation, *s_check_module_calls;

/* ``end(tracked, batches)``, once: 0, or -1 with its exception. An exception already set is kept unless it
 * raises one of its own (as a generator's ``finally`` would). */
static int
end_steps(AutoStepsObject *self)
{
    if (self->state != STEPS_RUNNING) {
        return 0;
    }
    self->state = STEPS_ENDED;
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject *batches = PyLong_FromSsize_t(self->batches);
    PyObject *ended = batches == NULL ? NULL
                                      : PyObject_CallFunctionObjArgs(self->end, self->tracked ? Py_True : Py_False,
                                                                     batches, NULL);
    Py_XDECREF(batches);
    if (ended == NULL) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
        return -1;
    }
    Py_DECREF(ended);
    PyErr_Restore(type, value, traceback);
    return type == NULL ? 0 : -1;
}

/* The loop's start: ``begin()``'s four values kept. 0, or -1 with an exception. */
static int
begin_steps(AutoStepsObject *self)
{
    PyObject *begun = PyObject_CallNoArgs(self->begin);
    if (begun == NULL) {
        self->state = STEPS_ENDED; /* as a generator that raised before its ``try`` */
        return -1;
    }
    if (!PyTuple_CheckExact(begun) || PyTuple_GET_SIZE(begun) != 4) {
        Py_DECREF(begun);
        self->state = STEPS_ENDED;
        PyErr_SetString(PyExc_TypeError, "AutoSteps: begin() returns (steps, tracked, uniform, full)");
        return -1;
    }
    self->state = STEPS_RUNNING;
    Py_XSETREF(self->steps, Py_NewRef(PyTuple_GET_ITEM(begun, 0)));
    self->tracked = PyObject_IsTrue(PyTuple_GET_ITEM(begun, 1));
    Py_XSETREF(self->uniform, Py_NewRef(PyTuple_GET_ITEM(begun, 2)));
    self->full = PyNumber_AsSsize_t(PyTuple_GET_ITEM(begun, 3), PyExc_OverflowError);
    Py_DECREF(begun);
    if (self->tracked < 0 || (self->full == -1 && PyErr_Occurred())) {
        end_steps(self);
        return -1;
    }
    return 0;
}

/* After a step: an evaluation at its end ended, the module calls checked when due. 0, or -1. */
static int
after_step(AutoStepsObject *self)
{
    AutoStateObject *session = self->session;
    if (session->evaluation != NULL && session->evaluation != Py_None) {
        PyObject *ended = PyObject_CallMethodNoArgs((PyObject *)session, s_end_evaluation);
        if (ended == NULL) {
            return -1;
        }
        Py_DECREF(ended);
    }
    if (self->tracked && session->loop_depth == 1 && --session->steps_to_next_check <= 0) {
        PyObject *checked = PyObject_CallMethodNoArgs((PyObject *)session, s_check_module_calls);
        if (checked == NULL) {
            return -1;
        }
        Py_DECREF(checked);
    }
    return 0;
}

/* Before a step: an optimizer block left open by a step that raised forgotten, the batch's samples counted. */
static int
before_step(AutoStepsObject *self, PyObject *batch)
{
    AutoStateObject *session = self->session;
    self->batches++;
    if (self->tracked && session->busy && session->loop_depth == 1) {
        session->busy = 0;
        PyObject *open = session->open_blocks;
        if (open != NULL && PyList_CheckExact(open) && PyList_SetSlice(open, 0, PyList_GET_SIZE(open), NULL) < 0) {
            return -1;
        }
    }
    if (self->counted == Py_None) {
        return 0;
    }
    PyObject *size = 1 < self->batches && self->batches <= self->full ? Py_NewRef(self->uniform)
                                                                     : PyObject_CallOneArg(self->batch_size, batch);
    if (size == NULL) {
        return -1;
    }
    int counts = -1;
    if (self->batches == 1) {
        int differs = PyObject_RichCompareBool(size, self->uniform, Py_NE);
        if (differs < 0) {
            goto done;
        }
        if (differs) {
            self->full = 0; /* not what its batch size says: every batch is looked into */
        }
    }
    counts = PyObject_IsTrue(size);
    if (counts > 0) {
        PyObject *counter = self->counted == session->sw ? session->kept_counter : NULL;
        PyObject *added = count_samples(self->counted, counter, size);
        counts = added == NULL ? -1 : 0;
        Py_XDECREF(added);
    }
done:
    Py_DECREF(size);
    return counts < 0 ? -1 : 0;
}

static PyObject *
auto_steps_next(AutoStepsObject *self)
{
    if (self->state == STEPS_ENDED) {
        return NULL;
    }
    if (self->state == STEPS_NEW) {
        if (begin_steps(self) < 0) {
            return NULL;
        }
    }
    else if (self->batches > 0 && after_step(self) < 0) {
        end_steps(self);
        return NULL;
    }
    PyObject *batch = PyIter_Next(self->steps);
    if (batch == NULL) { /* run out (no exception), or raised */
        end_steps(self);
        return NULL;
    }
    if (before_step(self, batch) < 0) {
        Py_DECREF(batch);
        end_steps(self);
        return NULL;
    }
    return batch;
}

/* close(): ends the loop as a generator's close() would (``end`` called if it had started). */
static PyObject *
auto_steps_close(AutoStepsObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->state == STEPS_NEW) {
        self->state = STEPS_ENDED;
    }
    if (end_steps(self) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* A loop dropped unfinished (a ``break``, an exception out of the loop, ``next(iter(loader))``) ends when it
 * is collected, as a generator's ``finally`` would run then. */
static void
auto_steps_finalize(AutoStepsObject *self)
{
    if (self->state != STEPS_RUNNING) {
        return;
    }
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    if (end_steps(self) < 0) {
        PyErr_WriteUnraisable((PyObject *)self);
    }
    PyErr_Restore(type, value, traceback);
}

static PyObject *
auto_steps_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *session, *begin, *end, *counted, *batch_size;
    if (keywords_refused("AutoSteps", kwargs)) {
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!OOOO:AutoSteps", &AutoStateType, &session, &begin, &end, &counted, &batch_size)) {
        return NULL;
    }
    AutoStepsObject *self = (AutoStepsObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->session = (AutoStateObject *)Py_NewRef(session);
    self->begin = Py_NewRef(begin);
    self->end = Py_NewRef(end);
    self->counted = Py_NewRef(counted);
    self->batch_size = Py_NewRef(batch_size);
    return (PyObject *)self;
}

static int
auto_steps_traverse(AutoStepsObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->session);
    Py_VISIT(self->begin);
    Py_VISIT(self->end);
    Py_VISIT(self->counted);
    Py_VISIT(self->batch_size);
    Py_VISIT(self->steps);
    Py_VISIT(self->uniform);
    return 0;
}

static int
auto_steps_clear(AutoStepsObject *self)
{
    Py_CLEAR(self->session);
    Py_CLEAR(self->begin);
    Py_CLEAR(self->end);
    Py_CLEAR(self->counted);
    Py_CLEAR(self->batch_size);
    Py_CLEAR(self->steps);
    Py_CLEAR(self->uniform);
    return 0;
}

static void
auto_steps_dealloc(AutoStepsObject *self)
{
    if (PyObject_CallFinalizerFromDealloc((PyObject *)self) < 0) {
        return; /* resurrected by its ``end`` */
    }
    PyObject_GC_UnTrack(self);
    auto_steps_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef auto_steps_methods[] = {
    {"close", (PyCFunction)auto_steps_close, METH_NOARGS, "Ends the loop, as a generator's close() would."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject AutoStepsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stepwatch._speedups.AutoSteps",
    .tp_doc = "auto()'s loop over a DataLoader's watched batches (see stepwatch/_auto_steps.c).",
    .tp_basicsize = sizeof(AutoStepsObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_FINALIZE,
    .tp_new = auto_steps_new,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)auto_steps_next,
    .tp_methods = auto_steps_methods,
    .tp_finalize = (destructor)auto_steps_finalize,
    .tp_traverse = (traverseproc)auto_steps_traverse,
    .tp_clear = (inquiry)auto_steps_clear,
    .tp_dealloc = (destructor)auto_steps_dealloc,
};

/* Interns the method names above; 0, or -1 with an exception. */
static int
auto_steps_ready(void)
{
    if ((s_end_evaluation == NULL && (s_end_evaluation = PyUnicode_InternFromString("end_evaluation")) == NULL) ||
        (s_check_module_calls == NULL &&
         (s_check_module_calls = PyUnicode_InternFromString("check_module_calls")) == NULL)) {
        return -1;
    }
    return 0;
}
