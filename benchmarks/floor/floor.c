/* The least a loop timed as stepwatch's by-hand loop is can cost (benchmarks/footprint.py --floor; not stepwatch).
 *
 * ``timed(name)`` reads a dictionary and returns a C object whose ``__enter__`` and ``__exit__`` read the clock into
 * C integers; ``watch(iterable)`` returns an iterator that times each ``next()``. No durations kept (a total and a
 * count), no frame, no stack, no nesting, no reads or collate timed, no samples counted, no phases: what the ``with``
 * statement, the call and the clock cost, for comparison with what stepwatch adds to the same loop.
 */
#include <Python.h>
#include <time.h>

static inline long long
now_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
}

typedef struct {
    PyObject_HEAD
    long long start, total, calls;
} Timer;

static PyObject *
timer_enter(Timer *self, PyObject *Py_UNUSED(ignored))
{
    self->start = now_ns();
    Py_RETURN_NONE;
}

static PyObject *
timer_exit(Timer *self, PyObject *const *Py_UNUSED(args), Py_ssize_t Py_UNUSED(nargs))
{
    self->total += now_ns() - self->start;
    self->calls++;
    Py_RETURN_NONE;
}

static PyMethodDef timer_methods[] = {
    {"__enter__", (PyCFunction)timer_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))timer_exit, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject TimerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "floor.Timer",
    .tp_basicsize = sizeof(Timer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_methods = timer_methods,
};

typedef struct {
    PyObject_HEAD
    PyObject *inner;
    long long total, calls;
} Watched;

static PyObject *
watched_next(Watched *self)
{
    long long start = now_ns();
    PyObject *item = PyIter_Next(self->inner);
    self->total += now_ns() - start;
    self->calls++;
    return item;
}

static void
watched_dealloc(Watched *self)
{
    Py_XDECREF(self->inner);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject WatchedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "floor.Watched",
    .tp_basicsize = sizeof(Watched),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)watched_next,
    .tp_dealloc = (destructor)watched_dealloc,
};

static PyObject *timers; /* by name */

static PyObject *
timed(PyObject *Py_UNUSED(module), PyObject *name)
{
    PyObject *timer = PyDict_GetItemWithError(timers, name);
    if (timer != NULL) {
        return Py_NewRef(timer);
    }
    if (PyErr_Occurred()) {
        return NULL;
    }
    timer = PyType_GenericNew(&TimerType, NULL, NULL);
    if (timer == NULL || PyDict_SetItem(timers, name, timer) < 0) {
        Py_XDECREF(timer);
        return NULL;
    }
    return timer;
}

static PyObject *
watch(PyObject *Py_UNUSED(module), PyObject *iterable)
{
    PyObject *inner = PyObject_GetIter(iterable);
    if (inner == NULL) {
        return NULL;
    }
    Watched *watched = PyObject_New(Watched, &WatchedType);
    if (watched == NULL) {
        Py_DECREF(inner);
        return NULL;
    }
    watched->inner = inner;
    watched->total = watched->calls = 0;
    return (PyObject *)watched;
}

/* ``calls(name)``: how many times the timer of that name closed (a check that the loop was timed). */
static PyObject *
calls(PyObject *Py_UNUSED(module), PyObject *name)
{
    PyObject *timer = PyDict_GetItemWithError(timers, name);
    if (timer == NULL) {
        return PyErr_Occurred() ? NULL : PyLong_FromLong(0);
    }
    return PyLong_FromLongLong(((Timer *)timer)->calls);
}

static PyMethodDef floor_methods[] = {
    {"timed", timed, METH_O, NULL},
    {"watch", watch, METH_O, NULL},
    {"calls", calls, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef floor_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "floor",
    .m_size = -1,
    .m_methods = floor_methods,
};

PyMODINIT_FUNC
PyInit_floor(void)
{
    if (PyType_Ready(&TimerType) < 0 || PyType_Ready(&WatchedType) < 0) {
        return NULL;
    }
    timers = PyDict_New();
    return timers == NULL ? NULL : PyModule_Create(&floor_module);
}
