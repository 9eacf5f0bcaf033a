/* This thread's stack of open frames, found once for a ``stacks.local`` and then read from C's thread-local storage
 * (included by _speedups.c, after the slots it uses).
 *
 * A thread-local's attribute costs about 450 instructions to read. Each thread keeps what it last found in
 * ``thread_found``, a C thread-local variable: the ``stacks.local`` object, this thread's stack in it, and (once
 * count() reads them) the local's values for this thread, all borrowed from a ``ThreadHold`` kept in the thread
 * state's dictionary, which holds them, so that none can be freed and another object take its address while found.
 * A hold dies only with its thread's state (a thread that ends; a thread state made and cleared again on the same
 * thread, as C code calling into Python from threads of its own does), and its death renews
 * ``hot_state.threads_generation``: what every thread found before is then read again, where its generation is
 * not the current one. A switch replaces ``stacks.local`` (a new object, so a miss). What a thread found last stays
 * held until it finds another or its state ends, as the one cache before kept the last thread's. The check is two
 * comparisons and no call: where the thread state's dictionary was compared instead (``PyThreadState_GetDict``),
 * that call fetched 20 lines of libpython's code a step by hand, cold in a real step (benchmarks/footprint.py).
 */

#if defined(__GNUC__) && defined(__linux__)
/* initial-exec: read at a fixed offset from the thread's pointer, where the default model for a shared library
 * calls ``__tls_get_addr`` at each read (a module's few bytes fit the room the C library keeps for such loads) */
#define THREAD_LOCAL(declaration) __thread declaration __attribute__((tls_model("initial-exec")))
#elif defined(__GNUC__)
#define THREAD_LOCAL(declaration) __thread declaration
#elif defined(_MSC_VER)
#define THREAD_LOCAL(declaration) __declspec(thread) declaration
#else
#define THREAD_LOCAL(declaration) _Thread_local declaration
#endif

typedef struct {
    PyObject *local;  /* the ``stacks.local`` it was found for */
    PyObject *stack;  /* ``local.stack`` for this thread */
    PyObject *values; /* ``local.__dict__`` for this thread, once read (thread_values), or NULL */
    PyObject *hold;   /* the ThreadHold that holds the three */
    unsigned long long generation; /* ``hot_state.threads_generation`` when found; 0: nothing found */
} ThreadFound;

static THREAD_LOCAL(ThreadFound thread_found);

typedef struct {
    PyObject_HEAD
    PyObject *local, *stack, *values;
} ThreadHoldObject;

static void
thread_hold_dealloc(ThreadHoldObject *self)
{
    hot_state.threads_generation++; /* its thread's state is going: no thread's find is trusted any longer */
    Py_CLEAR(self->local);
    Py_CLEAR(self->stack);
    Py_CLEAR(self->values);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject ThreadHoldType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stepwatch._speedups.ThreadHold",
    .tp_basicsize = sizeof(ThreadHoldObject),
    .tp_dealloc = (destructor)thread_hold_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "What this thread found of stepwatch's stacks, held for the thread's state (internal).",
};

/* The stack found on this thread for ``local`` (borrowed), or NULL (no error) where it must be read. */
static inline PyObject *
found_stack(PyObject *local)
{
    return local == thread_found.local && thread_found.generation == hot_state.threads_generation
               ? thread_found.stack
               : NULL;
}

/* ``local``'s values found on this thread (borrowed), or NULL (no error) where they must be read. */
static inline PyObject *
found_values(PyObject *local)
{
    return found_stack(local) != NULL ? thread_found.values : NULL;
}

/* Keeps ``values`` (``local.__dict__`` for this thread) with what was found for ``local``, where that still
 * stands. */
static void
keep_values(PyObject *local, PyObject *values)
{
    if (found_stack(local) == NULL) {
        return;
    }
    ThreadHoldObject *hold = (ThreadHoldObject *)thread_found.hold;
    PyObject *former = hold->values;
    Py_INCREF(values);
    hold->values = values;
    thread_found.values = values;
    Py_XDECREF(former); /* last: freeing it may run Python code */
}

/* This thread's hold in its state's dictionary ``thread`` (borrowed), made there where it has none: NULL with an
 * exception where it could not be. */
static PyObject *
thread_hold(PyObject *thread)
{
    PyObject *key = (PyObject *)&ThreadHoldType;
    PyObject *hold = PyDict_GetItemWithError(thread, key);
    if (hold != NULL || PyErr_Occurred()) {
        return hold;
    }
    hold = ThreadHoldType.tp_alloc(&ThreadHoldType, 0);
    if (hold == NULL) {
        return NULL;
    }
    int stored = PyDict_SetItem(thread, key, hold);
    Py_DECREF(hold);
    return stored < 0 ? NULL : PyDict_GetItemWithError(thread, key); /* (what is there now) */
}

/* Records ``stack`` as this thread's for ``local``: 0, or -1 with an exception. */
static int
keep_found(PyObject *local, PyObject *stack)
{
    PyObject *thread = PyThreadState_GetDict(); /* borrowed; NULL: no state's dictionary, nothing kept */
    PyObject *hold = thread == NULL ? NULL : thread_hold(thread);
    if (hold == NULL || !Py_IS_TYPE(hold, &ThreadHoldType)) {
        return hold == NULL && PyErr_Occurred() ? -1 : 0;
    }
    ThreadHoldObject *held = (ThreadHoldObject *)hold;
    PyObject *former_local = held->local, *former_stack = held->stack, *former_values = held->values;
    Py_INCREF(local);
    held->local = local;
    Py_INCREF(stack);
    held->stack = stack;
    held->values = NULL; /* the local's values for this thread: read again on next use */
    thread_found = (ThreadFound){local, stack, NULL, hold, hot_state.threads_generation};
    Py_XDECREF(former_local); /* last: freeing them may run Python code */
    Py_XDECREF(former_stack);
    Py_XDECREF(former_values);
    return 0;
}

static PyObject *thread_stack_found(PyObject *stacks, PyObject *local);

/* This thread's stack of open frames: ``stacks.local.stack``, made by ``stacks.thread_stack()`` on first use. */
static PyObject *
thread_stack(PyObject *stacks)
{
    PyObject *local = slot_get(stacks, SLOT_LOCAL);
    if (UNLIKELY(local == NULL)) {
        return NULL;
    }
    PyObject *stack = found_stack(local);
    if (stack != NULL) {
        Py_DECREF(local);
        Py_INCREF(stack);
        return stack;
    }
    return thread_stack_found(stacks, local);
}

/* ``thread_stack``'s miss: the stack read from the thread-local (or made), and kept. ``local`` is handed over. */
static COLD PyObject *
thread_stack_found(PyObject *stacks, PyObject *local)
{
    PyObject *stack = PyObject_GetAttr(local, s_stack);
    if (stack == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
            Py_DECREF(local);
            return NULL;
        }
        PyErr_Clear();
        stack = PyObject_CallMethodNoArgs(stacks, s_thread_stack);
    }
    if (stack != NULL && !PyList_Check(stack)) {
        PyErr_SetString(PyExc_TypeError, "stepwatch: a thread's stack must be a list");
        Py_CLEAR(stack);
    }
    if (stack != NULL && keep_found(local, stack) < 0) {
        Py_CLEAR(stack);
    }
    Py_DECREF(local);
    return stack;
}

static int
threads_ready(void)
{
    return PyType_Ready(&ThreadHoldType);
}
