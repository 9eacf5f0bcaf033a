/* A timed loop's steady state as an iterator in C (included by _speedups.c after _boundary.c, whose ``swap`` it
 * calls; where this was not built, ``_loops.iterate`` keeps its own loop, each half of a step's boundary one
 * ``swap_frame`` call).
 *
 * ``SteadyLoop(stacks, local, stack, body_frame, body_node, wait_node, phase, clock, iterator, ticker, index,
 * counting=None, boundaries=-1)`` takes over a loop's steps once they are steady: the generator delegates to it
 * (``yield from``) with its step open, and each next() then does what the generator's loop does in that case:
 * the step closed and the wait opened (``swap``), the training step counted on ``ticker`` (``ticker.ticks +=
 * 1``; None: not counted), the next item fetched, the wait closed and the step opened and counted (``swap``
 * again), the item returned. In the
 * generator that was two calls and about 60 bytecode instructions a step (a ``timed_iter`` item in a tight loop
 * ~2x an enabled block).
 *
 * It stops (ends the delegation) where the steady state does not hold, having changed nothing the generator does
 * not see: before the step's end (a boundary that is not steady, or the ``boundaries``-th from now, at which a
 * periodic call is due, such as ``log_every``'s: nothing done, the step still open), after a
 * fetch whose step could not be opened (the item and the open wait handed back), or at the end of the data (the
 * wait still open, for the generator to close as no wait). An exception from the fetch propagates with the wait
 * open. ``state()`` gives the generator what it holds: ``(wait_frame, body_frame, index, outcome, item)``.
 */

enum { STEADY_RUNNING = 0, STEADY_STEP_END = 1, STEADY_FETCHED = 2, STEADY_EXHAUSTED = 3 };

typedef struct {
    PyObject_HEAD
    PyObject *stacks, *local, *stack, *body_node, *wait_node, *phase, *clock, *iterator, *ticker;
    PyObject *wait_frame, *body_frame, *item; /* NULL: none */
    PyObject *uniform, *size_of, *count_fallback; /* watch()'s count of each batch's samples; size_of NULL: none */
    Py_ssize_t index, full;
    Py_ssize_t boundaries; /* the step boundaries it may run before one at which a periodic call is due; -1: any */
    int outcome;
    int busy; /* in a step's boundary: a next() from the code it runs (the fetch, the count) is refused */
} SteadyLoopObject;

/* watch()'s count of the samples of the batch just fetched, its step open (``_batch_size.CountSamples``): the loader's
 * batch size from the second batch to the ``full``-th, found in the batch otherwise; 0, or -1 with an exception. */
static int
steady_count(SteadyLoopObject *self, PyObject *item)
{
    PyObject *size = self->uniform != NULL && self->index > 1 && self->index <= self->full
                         ? Py_NewRef(self->uniform)
                         : PyObject_CallOneArg(self->size_of, item);
    if (size == NULL) {
        return -1;
    }
    int done = 1, overflow = 0;
    long long value = PyLong_CheckExact(size) ? PyLong_AsLongLongAndOverflow(size, &overflow) : 0;
    if (value > 0 || overflow > 0) { /* a positive int (None, 0: nothing to count) */
        done = batch_counted(self->stacks, self->phase, size);
        if (done == 0) {
            PyObject *counted = PyObject_CallOneArg(self->count_fallback, size);
            done = counted == NULL ? -1 : 1;
            Py_XDECREF(counted);
        }
    }
    Py_DECREF(size);
    return done < 0 ? -1 : 0;
}

static PyObject *
steady_step(SteadyLoopObject *self)
{
    if (self->boundaries >= 0) {
        if (self->boundaries == 0) { /* a periodic call is due at this step's end: the generator's tick calls it */
            self->outcome = STEADY_STEP_END;
            return NULL;
        }
        self->boundaries--;
    }
    PyObject *opened = swap(self->stacks, self->local, self->stack, self->body_frame, self->body_node,
                            self->wait_node, self->phase, self->clock, 1, 0, 1);
    if (UNLIKELY(opened == NULL)) {
        return NULL;
    }
    if (UNLIKELY(opened == Py_None)) {
        Py_DECREF(opened);
        self->outcome = STEADY_STEP_END;
        return NULL;
    }
    Py_CLEAR(self->body_frame);
    self->wait_frame = opened;
    if (self->ticker != Py_None && slot_increment(self->ticker, SLOT_TICKS) < 0) {
        return NULL;
    }
    PyObject *item = (*Py_TYPE(self->iterator)->tp_iternext)(self->iterator);
    if (UNLIKELY(item == NULL)) {
        if (PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_StopIteration)) {
                return NULL; /* the wait stays open: the generator closes it, as for its own fetch */
            }
            PyErr_Clear();
        }
        self->outcome = STEADY_EXHAUSTED;
        return NULL;
    }
    opened = swap(self->stacks, self->local, self->stack, self->wait_frame, self->wait_node, self->body_node,
                  self->phase, self->clock, 0, 1, 1);
    if (UNLIKELY(opened == NULL || opened == Py_None)) {
        if (opened == NULL) {
            Py_DECREF(item);
            return NULL;
        }
        Py_DECREF(opened);
        self->item = item;
        self->outcome = STEADY_FETCHED;
        return NULL;
    }
    Py_CLEAR(self->wait_frame);
    self->body_frame = opened;
    self->index++;
    if (self->size_of != NULL && steady_count(self, item) < 0) {
        Py_DECREF(item); /* (the step stays open, as after any exception in a step: the generator closes it) */
        return NULL;
    }
    return item;
}

/* A next() (or send, throw, close) from inside a step's boundary, refused as Python refuses a running generator's:
 * NULL with the ValueError. The SteadyLoop and the DirectLoop in front of it both refuse this way, whichever
 * drives the step (_direct_loop.c checks first: the error thrown into the generator would end it). */
static COLD PyObject *
refuse_running(void)
{
    PyErr_SetString(PyExc_ValueError, "generator already executing");
    return NULL;
}

/* The next item (NULL without an exception: stopped). A next() from the code a step's boundary runs (a batch whose
 * size computation or whose fetch iterates the same loop) is refused as a running generator's, whichever of the
 * generator and the DirectLoop in front of it drives this step. */
static PyObject *
steady_next(SteadyLoopObject *self)
{
    if (UNLIKELY(self->busy)) {
        return refuse_running();
    }
    if (self->outcome != STEADY_RUNNING || self->body_frame == NULL) {
        return NULL;
    }
    self->busy = 1;
    PyObject *item = steady_step(self);
    self->busy = 0;
    return item;
}

/* state(): ``(wait_frame, body_frame, index, outcome, item)``, the item (one fetched and not yet given) let go. */
static PyObject *
steady_state(SteadyLoopObject *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *state = Py_BuildValue("(OOniO)", self->wait_frame ? self->wait_frame : Py_None,
                                    self->body_frame ? self->body_frame : Py_None, self->index, self->outcome,
                                    self->item ? self->item : Py_None);
    if (state != NULL) {
        Py_CLEAR(self->item);
    }
    return state;
}

static PyObject *
steady_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *stacks, *local, *stack, *body_frame, *body_node, *wait_node, *phase, *clock, *iterator, *ticker;
    PyObject *counting = Py_None, *uniform = Py_None, *size_of = NULL, *count_fallback = NULL;
    Py_ssize_t index, full = 0, boundaries = -1;
    if (keywords_refused("SteadyLoop", kwargs)) {
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OOO!OOOOOOOn|On:SteadyLoop", &stacks, &local, &PyList_Type, &stack, &body_frame,
                          &body_node, &wait_node, &phase, &clock, &iterator, &ticker, &index, &counting,
                          &boundaries)) {
        return NULL;
    }
    if (counting != Py_None && !PyArg_ParseTuple(counting, "OnOO:SteadyLoop counting (uniform, full, size_of, "
                                                           "fallback)", &uniform, &full, &size_of, &count_fallback)) {
        return NULL;
    }
    if (uniform != Py_None && !PyLong_CheckExact(uniform)) {
        PyErr_SetString(PyExc_TypeError, "SteadyLoop(): the uniform batch size is an int or None");
        return NULL;
    }
    if (!PyIter_Check(iterator)) {
        PyErr_SetString(PyExc_TypeError, "SteadyLoop(): not an iterator");
        return NULL;
    }
    if (hot_state.loop_owner == NULL) {
        PyErr_SetString(PyExc_TypeError, "SteadyLoop(): configure_slots() first");
        return NULL;
    }
    SteadyLoopObject *self = (SteadyLoopObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    PyObject **fields[] = {&self->stacks, &self->local,  &self->stack,    &self->body_frame, &self->body_node,
                           &self->wait_node, &self->phase, &self->clock, &self->iterator,  &self->ticker};
    PyObject *values[] = {stacks, local, stack, body_frame, body_node, wait_node, phase, clock, iterator, ticker};
    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
        *fields[i] = Py_NewRef(values[i]);
    }
    self->index = index;
    self->full = full;
    self->boundaries = boundaries < 0 ? -1 : boundaries;
    self->uniform = uniform != Py_None ? Py_NewRef(uniform) : NULL;
    self->size_of = Py_XNewRef(size_of);
    self->count_fallback = Py_XNewRef(count_fallback);
    return (PyObject *)self;
}

static int
steady_traverse(SteadyLoopObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->stacks);
    Py_VISIT(self->local);
    Py_VISIT(self->stack);
    Py_VISIT(self->body_node);
    Py_VISIT(self->wait_node);
    Py_VISIT(self->phase);
    Py_VISIT(self->clock);
    Py_VISIT(self->iterator);
    Py_VISIT(self->ticker);
    Py_VISIT(self->wait_frame);
    Py_VISIT(self->body_frame);
    Py_VISIT(self->item);
    Py_VISIT(self->uniform);
    Py_VISIT(self->size_of);
    Py_VISIT(self->count_fallback);
    return 0;
}

static int
steady_clear(SteadyLoopObject *self)
{
    Py_CLEAR(self->stacks);
    Py_CLEAR(self->local);
    Py_CLEAR(self->stack);
    Py_CLEAR(self->body_node);
    Py_CLEAR(self->wait_node);
    Py_CLEAR(self->phase);
    Py_CLEAR(self->clock);
    Py_CLEAR(self->iterator);
    Py_CLEAR(self->ticker);
    Py_CLEAR(self->wait_frame);
    Py_CLEAR(self->body_frame);
    Py_CLEAR(self->item);
    Py_CLEAR(self->uniform);
    Py_CLEAR(self->size_of);
    Py_CLEAR(self->count_fallback);
    return 0;
}

static void
steady_dealloc(SteadyLoopObject *self)
{
    PyObject_GC_UnTrack(self);
    steady_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef steady_methods[] = {
    {"state", (PyCFunction)steady_state, METH_NOARGS,
     "state(): (wait_frame, body_frame, index, outcome, item) for the generator to go on from."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SteadyLoopType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stepwatch._speedups.SteadyLoop",
    .tp_doc = "A timed loop's steady steps (see stepwatch/_steady.c).",
    .tp_basicsize = sizeof(SteadyLoopObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = steady_new,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)steady_next,
    .tp_methods = steady_methods,
    .tp_traverse = (traverseproc)steady_traverse,
    .tp_clear = (inquiry)steady_clear,
    .tp_dealloc = (destructor)steady_dealloc,
};
