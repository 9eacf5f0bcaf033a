/* stepwatch._speedups: the timed block's entry and exit in C (optional; stepwatch/_block_base.py is the same in
 * Python, and what runs where this module was not built).
 *
 * A block's two methods are most of what stepwatch adds to a training step: in Python they execute about 6,400
 * instructions per block more than an empty Python context manager (counted with Valgrind), most of them the
 * interpreter's own work on the methods' bytecode. Here they do the same reads and writes, on the same Python
 * objects, in the same order, so the two implementations behave the same in every case, the rare ones included
 * (a switch between reads, a stack replaced, a dropped node's buffer that always reads as full): whatever is not
 * the common case calls the same Python methods (thread_stack, add_child, track, fold, unwind).
 *
 * The module's other parts, each in a file of its own included here: the slots read at their offsets
 * (_slots.c), the thread's stack, the clock, frames and buffers (_frames.c), the block's methods bound once
 * (_bound.c), auto()'s state and wrappers (_auto_state.c, _auto_calls.c), auto()'s loop (_auto_steps.c), count()
 * (_counts.c, _counter.c), a timed loop's steady step boundary (_boundary.c) and timed()'s lookup (_lookup.c), a
 * batch's reads and collate in the main process (_reads.c).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

#include "_linked.c"

/* A block's fields, those a ``with`` reads first: with the header they fill 64 bytes, and the object, padded to 112
 * bytes (128 with the collector's header, a size the allocator places on a 64-byte boundary), has them on one cache
 * line, fetched cold once a block in a real step (benchmarks/footprint.py). */
typedef struct {
    PyObject_HEAD
    PyObject *stacks; /* ``sw.stacks``, kept: the stopwatch's state lent or shared re-points it (Blocks.follow_state) */
    PyObject *clock;  /* the stopwatch's clock: called with no arguments, returns an int of nanoseconds */
    unsigned long long children_version; /* what its own frame's node was found in (``child_of``, _block_fast.c) */
    PyObject *frame;  /* its own frame, refilled at each entry while nothing else holds it (_block_fast.c) */
    PyObject *bound[4]; /* its __enter__, __exit__, _dropped_enter and _dropped_exit bound, once used (_bound.c) */
    PyObject *sw;     /* the Stopwatch */
    PyObject *inside; /* threads inside this block opened while switched off (read by the Python subclasses) */
    PyObject *name;   /* the stage name: read where its node is not the one its own frame holds */
    void *padding[1];
} BlockObject;

#if defined(__GNUC__)
/* A rare path (a miss, a fold, an error's own work) in a function of its own, marked cold: the compiler places
 * it apart, so that the common path's instructions share fewer cache lines (in a real step each line of them
 * is fetched cold, benchmarks/footprint.py). */
#define COLD __attribute__((cold, noinline))
#define APART __attribute__((noinline)) /* a path of its own kind of call: not interleaved with the others' */
/* A check shared by a general path and a compact one: a copy in each, so that the compact one stays contiguous. */
#define INLINED inline __attribute__((always_inline))
/* A condition of the common path, so marked: the compiler lays that path out in one run and the rest after it. A
 * function of the loop's step, its batch's fetch or a slot's read, checks unmarked, fetched most of its lines in a
 * cold step, where the common path needs fewer (-20 lines of code a step by hand, benchmarks/footprint.py). */
#define UNLIKELY(condition) __builtin_expect(!!(condition), 0)
#define LIKELY(condition) __builtin_expect(!!(condition), 1)
#else
#define COLD
#define APART
#define INLINED inline
#define UNLIKELY(condition) (condition)
#define LIKELY(condition) (condition)
#endif

/* A type's constructor given keyword arguments, which none of this module's types take: 1 with a TypeError set
 * (``Name() takes no keyword arguments``), or 0. */
static int
keywords_refused(const char *type_name, PyObject *kwargs)
{
    if (kwargs == NULL || PyDict_GET_SIZE(kwargs) == 0) {
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "%s() takes no keyword arguments", type_name);
    return 1;
}

static PyObject *s_stacks, *s_stack, *s_tree, *s_add_child,
    *s_thread_stack, *s_track, *s_fold, *s_unwind, *s_get, *s_append, *s_remove, *s_closed_live;

#include "_ints.c"
#include "_slots.c"
#include "_threads.c"

#include "_frames.c"

/* The block's stopwatch's stacks: a new reference (read from the stopwatch where the block holds none). In a real
 * step the stopwatch is out of the caches: reading its attribute costs about half a microsecond there. */
static PyObject *
block_stacks(BlockObject *self)
{
    if (self->stacks != NULL) {
        Py_INCREF(self->stacks);
        return self->stacks;
    }
    return PyObject_GetAttr(self->sw, s_stacks);
}

/* A block opened while not measuring: nothing, or (DROPPING) a dropped frame opened by ``stacks.track``. 0 or -1. */
static COLD int
enter_switched_off(BlockObject *self, PyObject *stacks)
{
    PyObject *measuring = slot_get(stacks, SLOT_MEASURING); /* read again: it may have changed since */
    if (measuring == NULL) {
        return -1;
    }
    int failed = 0;
    if (measuring != Py_False) { /* DROPPING: the block opens a dropped frame */
        PyObject *tracked = PyObject_CallMethodOneArg(stacks, s_track, (PyObject *)self);
        failed = tracked == NULL;
        Py_XDECREF(tracked);
    }
    Py_DECREF(measuring);
    return failed ? -1 : 0;
}

/* ``__enter__``, every case (block_enter, _block_fast.c, hands it what is not the common case). */
static COLD PyObject *
block_enter_general(BlockObject *self)
{
    PyObject *stacks = block_stacks(self);
    if (stacks == NULL) {
        return NULL;
    }
    PyObject *result = NULL, *measuring = NULL, *stack = NULL, *parent = NULL, *node = NULL, *start = NULL;
    measuring = slot_get(stacks, SLOT_MEASURING);
    if (measuring == NULL) {
        goto done;
    }
    int on = PyObject_IsTrue(measuring);
    if (on < 0) {
        goto done;
    }
    if (on) {
        stack = thread_stack(stacks);
        if (stack == NULL) {
            goto done;
        }
        PyObject *top = top_of(stack);
        if (top == NULL || (parent = frame_item(top, 1)) == NULL || (node = child_node(self, parent)) == NULL) {
            goto done;
        }
        start = read_clock(self->clock);
        if (start == NULL) {
            goto done;
        }
        PyObject *frame = PyTuple_Pack(3, (PyObject *)self, node, start);
        if (frame == NULL) {
            goto done;
        }
        int failed = PyList_Append(stack, frame);
        Py_DECREF(frame);
        if (failed) {
            goto done;
        }
    }
    else if (enter_switched_off(self, stacks) < 0) {
        goto done;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    Py_XDECREF(start);
    Py_XDECREF(node);
    Py_XDECREF(parent);
    Py_XDECREF(stack);
    Py_XDECREF(measuring);
    Py_DECREF(stacks);
    return result;
}

static COLD PyObject *
wrong_exit_arguments(Py_ssize_t nargs)
{
    PyErr_Format(PyExc_TypeError, "__exit__ expected 3 arguments, got %zd", nargs);
    return NULL;
}

/* A block closed out of order (its frame not on top): ``stacks.unwind(stack, block)``. 0, or -1. */
static COLD int
unwind_to(PyObject *stacks, PyObject *stack, BlockObject *self)
{
    PyObject *unwound = PyObject_CallMethodObjArgs(stacks, s_unwind, stack, (PyObject *)self, NULL);
    Py_XDECREF(unwound);
    return unwound == NULL ? -1 : 0;
}

/* ``__exit__``, every case (block_exit, _block_fast.c, hands it what is not the common case): ``end_read`` is the
 * default clock's reading where the caller has taken it (measuring), NULL where the clock is still to be read. */
static COLD PyObject *
block_exit_general(BlockObject *self, PyObject *const *args, Py_ssize_t nargs, const long long *end_read)
{
    (void)args; /* the exception, if any, is left to propagate: nothing here depends on it */
    if (UNLIKELY(nargs != 3)) {
        return wrong_exit_arguments(nargs);
    }
    PyObject *stacks = block_stacks(self);
    if (stacks == NULL) {
        return NULL;
    }
    PyObject *result = NULL, *hot = NULL, *end = NULL, *stack = NULL, *frame = NULL, *node = NULL, *start = NULL,
             *elapsed = NULL;
    long long end_ns = 0;
    int raw = 0;
    hot = slot_get(stacks, SLOT_HOT);
    if (hot == NULL) {
        goto done;
    }
    int is_hot = PyObject_IsTrue(hot);
    if (is_hot < 0) {
        goto done;
    }
    if (is_hot) {
        if (end_read != NULL) {
            raw = 1;
            end_ns = *end_read;
        }
        else {
            raw = read_clock_raw(self->clock, &end_ns); /* the default clock: no Python int for the end */
        }
        if ((!raw && (end = PyObject_CallNoArgs(self->clock)) == NULL) || (stack = thread_stack(stacks)) == NULL) {
            goto done;
        }
        PyObject *top = top_of(stack);
        if (top == NULL) {
            goto done;
        }
        frame = top;
        Py_INCREF(frame);
        PyObject *owner = frame_item(frame, 0);
        if (owner == NULL) {
            goto done;
        }
        Py_DECREF(owner); /* only compared: the frame holds it */
        if (owner == (PyObject *)self) {
            /* ``del stack[-1]``: the frame is held above, so this is never its last reference */
            Py_SET_SIZE(stack, PyList_GET_SIZE(stack) - 1);
            Py_DECREF(frame);
            if ((node = frame_item(frame, 1)) == NULL || (start = frame_item(frame, 2)) == NULL ||
                (elapsed = raw ? elapsed_since(end_ns, start) : difference(end, start)) == NULL ||
                record(stacks, node, elapsed) < 0) {
                goto done;
            }
        }
        else if (unwind_to(stacks, stack, self) < 0) {
            goto done;
        }
    }
    result = Py_None;
    Py_INCREF(result);
done:
    Py_XDECREF(elapsed);
    Py_XDECREF(start);
    Py_XDECREF(node);
    Py_XDECREF(frame);
    Py_XDECREF(stack);
    Py_XDECREF(end);
    Py_XDECREF(hot);
    Py_DECREF(stacks);
    return result;
}

#include "_block_fast.c"

static int
block_traverse(BlockObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->sw);
    Py_VISIT(self->name);
    Py_VISIT(self->clock);
    Py_VISIT(self->inside);
    Py_VISIT(self->stacks);
    Py_VISIT(self->frame);
    for (size_t i = 0; i < sizeof(self->bound) / sizeof(self->bound[0]); i++) {
        Py_VISIT(self->bound[i]);
    }
    return 0;
}

static int
block_clear(BlockObject *self)
{
    Py_CLEAR(self->sw);
    Py_CLEAR(self->name);
    Py_CLEAR(self->clock);
    Py_CLEAR(self->inside);
    Py_CLEAR(self->stacks);
    Py_CLEAR(self->frame);
    for (size_t i = 0; i < sizeof(self->bound) / sizeof(self->bound[0]); i++) {
        Py_CLEAR(self->bound[i]);
    }
    return 0;
}

static void
block_dealloc(BlockObject *self)
{
    PyObject_GC_UnTrack(self);
    block_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A call's result let go: 0, or -1 where the call failed (NULL, with its exception). */
static int
block_call_failed(PyObject *result)
{
    if (result == NULL) {
        return -1;
    }
    Py_DECREF(result);
    return 0;
}

/* ``self.inside``: a borrowed reference, or NULL with the AttributeError of a slot not set. */
static PyObject *
inside_of(BlockObject *self)
{
    if (self->inside == NULL) {
        PyErr_SetString(PyExc_AttributeError, "'inside' of a block not initialized");
    }
    return self->inside;
}

/* A dropped block's entry (``_blocks.DroppedBlock``, after the stopwatch was switched off): notes that this thread is
 * inside it, ``self.inside.append(get_ident())``. No clock, flag or stack is read. */
static PyObject *
dropped_enter(BlockObject *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *inside = inside_of(self);
    PyObject *ident = inside != NULL ? PyLong_FromUnsignedLong(current_ident()) : NULL;
    if (ident == NULL) {
        return NULL;
    }
    int failed = PyList_CheckExact(inside) ? PyList_Append(inside, ident)
                                           : block_call_failed(PyObject_CallMethodOneArg(inside, s_append, ident));
    Py_DECREF(ident);
    if (failed < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* Its exit: ``self.inside.remove(get_ident())``, or where this thread has no note there (opened while on, or its note
 * taken into the thread's stack), ``self._closed_live(exc_type, exc, tb)``: the exit of its live class. */
static PyObject *
dropped_exit(BlockObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "__exit__ takes 3 arguments");
        return NULL;
    }
    PyObject *inside = inside_of(self);
    PyObject *ident = inside != NULL ? PyLong_FromUnsignedLong(current_ident()) : NULL;
    if (ident == NULL) {
        return NULL;
    }
    int found = 0;
    if (PyList_CheckExact(inside)) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(inside) && !found; i++) {
            PyObject *item = PyList_GET_ITEM(inside, i);
            Py_INCREF(item);
            found = PyObject_RichCompareBool(item, ident, Py_EQ);
            Py_DECREF(item);
            if (found > 0 && PyList_SetSlice(inside, i, i + 1, NULL) < 0) {
                found = -1;
            }
        }
    }
    else {
        found = block_call_failed(PyObject_CallMethodOneArg(inside, s_remove, ident)) < 0 ? -1 : 1;
        if (found < 0 && PyErr_ExceptionMatches(PyExc_ValueError)) {
            PyErr_Clear();
            found = 0;
        }
    }
    Py_DECREF(ident);
    if (found < 0) {
        return NULL;
    }
    if (found > 0) {
        Py_RETURN_NONE;
    }
    PyObject *call[] = {NULL, (PyObject *)self, args[0], args[1], args[2]}; /* call[0]: the callee's to borrow */
    return PyObject_VectorcallMethod(s_closed_live, call + 1, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

static PyMemberDef block_members[] = {
    {"_sw", T_OBJECT_EX, offsetof(BlockObject, sw), 0, NULL},
    {"_name", T_OBJECT_EX, offsetof(BlockObject, name), 0, NULL},
    {"_clock", T_OBJECT_EX, offsetof(BlockObject, clock), 0, NULL},
    {"inside", T_OBJECT_EX, offsetof(BlockObject, inside), 0, NULL},
    {"_stacks", T_OBJECT_EX, offsetof(BlockObject, stacks), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject BlockBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stepwatch._speedups.BlockBase",
    .tp_doc = "A timed block's state and its __enter__/__exit__ (see stepwatch/_block_base.py).",
    .tp_basicsize = sizeof(BlockObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_traverse = (traverseproc)block_traverse,
    .tp_clear = (inquiry)block_clear,
    .tp_dealloc = (destructor)block_dealloc,
    .tp_members = block_members,
};

#include "_bound.c"
#include "_lookup.c"
#include "_counts.c"
#include "_counter.c"
#include "_auto_state.c"
#include "_auto_calls.c"
#include "_auto_fast.c"
#include "_auto_steps.c"
#include "_boundary.c"
#include "_steady.c"
#include "_direct_loop.c"
#include "_reads.c"
#include "_fetch.c"
#include "_fold.c"
#include "_class_attrs.c"

static PyObject *
configure(PyObject *Py_UNUSED(module), PyObject *fold)
{
    Py_ssize_t value = PyNumber_AsSsize_t(fold, PyExc_OverflowError);
    if (value == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (value < 1 || (value & (value - 1)) != 0) {
        PyErr_SetString(PyExc_ValueError, "the fold size must be a power of two");
        return NULL;
    }
    unsigned char shift = 0;
    while (((Py_ssize_t)1 << shift) != value) {
        shift++;
    }
    hot_state.fold_shift = shift;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"configure", configure, METH_O, "configure(fold): the buffer size at which a stage's measurements fold (a power of two)."},
    {"configure_counts", (PyCFunction)(void (*)(void))configure_counts, METH_FASTCALL,
     "configure_counts(dropped, default_phase, limit, fallback): what add_samples compares with, and hands on to."},
    {"add_samples", (PyCFunction)(void (*)(void))add_samples, METH_FASTCALL,
     "add_samples(sw, size): auto()'s count of a batch's samples (see stepwatch/_counts.c)."},
    {"count_batch", (PyCFunction)(void (*)(void))count_batch, METH_FASTCALL,
     "count_batch(stacks, phase, fallback, size): watch()'s count of a batch's samples (see stepwatch/_counts.c)."},
    {"share_session", share_session, METH_O,
     "share_session(session): stepwatch._patches.session, for AutoCall; the one before."},
    {"swap_frame", (PyCFunction)(void (*)(void))swap_frame, METH_FASTCALL,
     "swap_frame(...): a timed loop's steady step boundary, one half (see stepwatch/_boundary.c)."},
    {"read_samples", (PyCFunction)(void (*)(void))read_samples, METH_FASTCALL,
     "read_samples(fallback, block, dataset, read_all, indices): a batch's reads (see stepwatch/_reads.c)."},
    {"collate_samples", (PyCFunction)(void (*)(void))collate_samples, METH_FASTCALL,
     "collate_samples(collate, block, samples): a batch's collate in the main process (see stepwatch/_reads.c)."},
    {"fetch_batch", (PyCFunction)(void (*)(void))fetch_batch, METH_FASTCALL,
     "fetch_batch(spec, indices): a batch's reads and collate in one call (see stepwatch/_fetch.c)."},
    {"fold_durations", fold_durations, METH_O,
     "fold_durations(list): (total, sum of squares, min, max) of a stage's buffer, or None (see stepwatch/_fold.c)."},
    {"configure_slots", (PyCFunction)(void (*)(void))configure_slots, METH_FASTCALL,
     "configure_slots(ThreadStacks, Node, Phase, LOOP, PeriodicCalls): where the hot path's slots are (see "
     "stepwatch/_slots.c)."},
    {"swap_class_function", (PyCFunction)(void (*)(void))swap_class_function, METH_FASTCALL,
     "swap_class_function(cls, name, function): a Python function on a class swapped for another without setattr's "
     "slot updates; False where it does not apply (see stepwatch/_class_attrs.c)."},
    {"configure_collate", configure_collate, METH_O,
     "configure_collate(TimedCollate): where its flags are, read at each batch's collate (see stepwatch/_slots.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "stepwatch._speedups",
    .m_doc = "The timed block's hot path in C, and auto()'s wrappers' common case.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    linked_ready();
    struct {
        PyObject **slot;
        const char *text;
    } names[] = {
        {&s_stacks, "stacks"}, {&s_stack, "stack"}, {&s_tree, "tree"}, {&s_add_child, "add_child"},
        {&s_thread_stack, "thread_stack"}, {&s_track, "track"}, {&s_fold, "fold"},
        {&s_unwind, "unwind"}, {&s_get, "get"}, {&s_append, "append"}, {&s_remove, "remove"},
        {&s_closed_live, "_closed_live"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (*names[i].slot == NULL && (*names[i].slot = PyUnicode_InternFromString(names[i].text)) == NULL) {
            return NULL;
        }
    }
    if (threads_ready() < 0 || block_methods_ready() < 0 || counts_ready() < 0 || slots_ready() < 0 ||
        reads_ready() < 0 || auto_calls_ready() < 0 || auto_steps_ready() < 0) {
        return NULL;
    }
    ident_ready();
    PyObject *time_module = PyImport_ImportModule("time");
    if (time_module == NULL) {
        return NULL;
    }
    Py_XSETREF(hot_state.perf_counter_ns, PyObject_GetAttrString(time_module, "perf_counter_ns"));
    Py_DECREF(time_module);
    if (hot_state.perf_counter_ns == NULL) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&speedups_module);
    if (module == NULL) {
        return NULL;
    }
    PyTypeObject *types[] = {&BlockBaseType, &AutoCallType, &AutoStateType, &AutoStepsType,
                             &SteadyLoopType, &CounterType,   &LookupType,   &DirectLoopType};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        if (PyModule_AddType(module, types[i]) < 0) { /* readied, and added under its name after the last dot */
            Py_DECREF(module);
            return NULL;
        }
    }
    return module;
}
