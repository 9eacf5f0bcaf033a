/* auto()'s wrappers of torch's calls, their common case in C (included by _speedups.c; optional, as the block is).
 *
 * ``AutoCall(kind, original, fallback, grad_enabled, inference_enabled)`` stands where auto() puts a Python
 * wrapper (stepwatch/_patches.py: ``wrap_module_call``, ``wrap_backward``, ``wrap_zero_grad``) and is that
 * wrapper's ``fallback``. It reads ``stepwatch._patches.session`` as ``share_session()`` hands it over at each
 * assignment (from one cache line; the module's dictionary cost about six cold lines a call). A call does one of
 * three things:
 *
 * - the session is None, or (module calls, zero_grad) an auto block is open or another thread
 *   runs the loop: the original, called at once (what the Python wrapper does first, with no side effect);
 * - the common case of a training step, every condition of the Python wrapper's fast path read first: the
 *   same writes to the session in the same order, the block named by the stage entered around the original
 *   and exited with the exception (if any) passed on, ``busy`` raised and lowered around it;
 * - anything else: the Python wrapper (``fallback``), which reads everything again and does the rest.
 *
 * Its Python frame (arguments packed into a tuple and a dict, about 2,000 instructions) and the bytecode of the
 * checks are what this saves, per patched call of a step.
 */

typedef struct {
    PyObject_HEAD
    int kind;
    vectorcallfunc vectorcall;
    PyObject *original;         /* the wrapped callable */
    NoArgsCall grad_enabled;      /* torch.is_grad_enabled */
    NoArgsCall inference_enabled; /* torch.is_inference_mode_enabled */
    PyObject *fallback;         /* the Python wrapper: every case but the common one */
    PyObject *dict;             /* __wrapped__, __name__, __doc__... (functools.update_wrapper) */
} AutoCallObject;

/* The stage this call is timed under when it may be the common case of a training step (borrowed; NULL with no
 * exception: not the common case, the Python wrapper decides); whether the stopwatch is measuring is read after,
 * from the stage's block. The session is free on this thread. */
static INLINED PyObject *
common_stage(AutoCallObject *self, AutoStateObject *session, PyObject *const *args, Py_ssize_t nargs)
{
    if (UNLIKELY(session->evaluation != Py_None || session->sw == NULL)) {
        return NULL;
    }
    if (self->kind == AUTO_BACKWARD) {
        return s_backward;
    }
    if (self->kind == AUTO_ZERO_GRAD) {
        return s_zero_grad;
    }
    PyObject *outer = session->outer_classes;
    if (UNLIKELY(nargs < 1 || outer == NULL || !PyDict_CheckExact(outer))) {
        return NULL;
    }
    PyObject *module = args[0];
    if (UNLIKELY(PyDict_Contains(outer, (PyObject *)Py_TYPE(module)) != 1)) {
        return NULL;
    }
    PyObject *stage = known_stage(session, module);
    if (UNLIKELY(stage == NULL || call_is_true(&self->grad_enabled) != 1 ||
                 call_is_true(&self->inference_enabled) != 0)) {
        return NULL;
    }
    return stage;
}

/* The original called inside ``block``, with ``busy`` raised around it. */
static PyObject *
call_in_block(AutoCallObject *self, AutoStateObject *session, PyObject *block, PyObject *const *args,
              size_t nargsf, PyObject *kwnames)
{
    session->busy++;
    PyObject *result = with_block(block, self->original, args, nargsf, kwnames);
    session->busy--;
    return result;
}

/* The session's counts and findings of the common case, as the Python wrapper writes them: 0, or -1. */
static int
count_call(AutoCallObject *self, AutoStateObject *session)
{
    if (self->kind == AUTO_MODULE_CALL) {
        session->training_blocks++;
        return 0;
    }
    if (self->kind == AUTO_BACKWARD) {
        session->backward_calls++;
        session->training_blocks++;
    }
    else {
        session->zero_grads++;
    }
    int bit = self->kind == AUTO_BACKWARD ? FOUND_BACKWARD : FOUND_ZERO_GRAD;
    if (session->found != NULL && session->found == session->found_known && (session->found_flags & bit)) {
        return 0; /* set already: the flags never turn back to False */
    }
    PyObject *flag = self->kind == AUTO_BACKWARD ? s_backward : s_zero_grad; /* found.backward = True */
    PyObject *value = session->found == NULL ? NULL : PyObject_GetAttr(session->found, flag);
    if (value == NULL) {
        return -1;
    }
    Py_DECREF(value);
    if (value != Py_True && PyObject_SetAttr(session->found, flag, Py_True) < 0) {
        return -1;
    }
    know_found(session);
    session->found_flags |= bit;
    return 0;
}

/* Torch's global hook before an optimizer step, its common case (``optimizer_pre_hook``'s): the optimizer's
 * class already found, the ``optimizer`` block opened and left open for the hook after the step. 1: done; 0:
 * not the common case; -1: an exception. */
static APART int
pre_step(AutoStateObject *session, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || !free_on_this_thread(session) || session->evaluation != Py_None || session->sw == NULL ||
        session->open_blocks == NULL || !PyList_CheckExact(session->open_blocks)) {
        return PyErr_Occurred() ? -1 : 0;
    }
    PyObject *cls = (PyObject *)Py_TYPE(args[0]);
    int known = session->found != NULL && session->found == session->found_known && session->optimizer_type == cls;
    if (!known) { /* its class's name among the optimizers found, and the class remembered */
        PyObject *optimizers = session->found == NULL ? NULL : PyObject_GetAttr(session->found, s_optimizers);
        PyObject *name = optimizers == NULL ? NULL : PyObject_GetAttr(cls, s_name);
        known = name == NULL || !PyDict_CheckExact(optimizers) ? -1 : PyDict_Contains(optimizers, name);
        Py_XDECREF(name);
        Py_XDECREF(optimizers);
        if (known == 1) {
            know_found(session);
            Py_XSETREF(session->optimizer_type, Py_NewRef(cls));
        }
    }
    PyObject *block = known != 1 ? NULL : existing_block(session, s_optimizer);
    int on = block == NULL ? 0 : block_measuring(block, session->sw);
    if (on != 1) {
        Py_XDECREF(block);
        return PyErr_Occurred() ? -1 : 0;
    }
    PyObject *entered = enter_block(block);
    PyObject *open_blocks = session->open_blocks;
    int failed = entered == NULL;
    if (!failed && has_room(open_blocks)) {
        append_with_room(open_blocks, Py_NewRef(block)); /* (PyList_Append's code, cold in a real step, not run) */
    }
    else if (!failed) {
        failed = PyList_Append(open_blocks, block) < 0;
    }
    Py_XDECREF(entered);
    Py_DECREF(block);
    if (failed) {
        return -1;
    }
    session->busy++;
    return 1;
}

/* Torch's global hook after an optimizer step, its common case in a DataLoader loop's step
 * (``optimizer_post_hook``'s): the block the pre-step hook opened, closed. 1: done; 0: not the common case; -1:
 * an exception. */
static APART int
post_step(AutoStateObject *session)
{
    if (!on_loop_thread(session) || session->evaluation != Py_None || session->driven != Py_None ||
        session->open_blocks == NULL || !PyList_CheckExact(session->open_blocks) ||
        PyList_GET_SIZE(session->open_blocks) == 0) {
        return 0;
    }
    Py_ssize_t last = PyList_GET_SIZE(session->open_blocks) - 1;
    PyObject *block = PyList_GET_ITEM(session->open_blocks, last); /* ``open_blocks.pop()``: its reference taken */
    Py_SET_SIZE(session->open_blocks, last);
    session->busy--;
    PyObject *exited = exit_block(block, Py_None, Py_None, Py_None);
    Py_DECREF(block);
    Py_XDECREF(exited);
    return exited == NULL ? -1 : 1;
}

/* The Python wrapper (or, with no session, the original): every case but the common one. */
static COLD PyObject *
call_in_python(AutoCallObject *self, PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    return PyObject_Vectorcall(callable == NULL ? self->fallback : callable, args, nargsf, kwnames);
}

/* Torch's global hook before or after an optimizer step, the session known: ``pre_step`` or ``post_step``; what
 * they leave, the Python hook. The compiled wrapper's entry (_auto_fast.c) calls it at once, without the general
 * function's code (fetched cold at each hook of a real step). */
static APART PyObject *
optimizer_hook(AutoCallObject *self, AutoStateObject *session, PyObject *const *args, size_t nargsf,
               PyObject *kwnames)
{
    Py_INCREF(session);
    int done = self->kind == AUTO_PRE_STEP ? pre_step(session, args, PyVectorcall_NARGS(nargsf)) : post_step(session);
    Py_DECREF(session);
    if (done != 0) {
        return done < 0 ? NULL : Py_NewRef(Py_None);
    }
    return call_in_python(self, NULL, args, nargsf, kwnames);
}

/* Every case of a wrapped call (``auto_call_vectorcall``, _auto_fast.c, is the common one of a module call,
 * ``backward`` and ``zero_grad``, and hands it the rest); the optimizer step's hooks. */
static PyObject *
auto_call_general(AutoCallObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *current = hot_state.auto_session; /* borrowed */
    if (UNLIKELY(current == NULL || current == Py_None)) {
        return call_in_python(self, self->original == Py_None ? NULL : self->original, args, nargsf, kwnames);
    }
    if (UNLIKELY(!PyObject_TypeCheck(current, &AutoStateType))) {
        return call_in_python(self, NULL, args, nargsf, kwnames);
    }
    AutoStateObject *session = (AutoStateObject *)current;
    if (self->kind == AUTO_PRE_STEP || self->kind == AUTO_POST_STEP) {
        return optimizer_hook(self, session, args, nargsf, kwnames);
    }
    Py_INCREF(session);
    PyObject *result = NULL, *block = NULL, *stage = NULL;
    int free_here = free_on_this_thread(session);
    if (!free_here && self->kind != AUTO_BACKWARD) { /* backward counts every call: its wrapper's */
        result = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
        goto done;
    }
    if (free_here) {
        stage = common_stage(self, session, args, PyVectorcall_NARGS(nargsf));
        block = stage == NULL ? NULL : existing_block(session, stage);
        int on = block == NULL ? 0 : block_measuring(block, session->sw);
        if (on != 1) {
            Py_CLEAR(block); /* not measuring: the Python wrapper's case */
        }
    }
    if (PyErr_Occurred()) {
        goto done;
    }
    if (UNLIKELY(block == NULL)) { /* not the common case, or a stage without its block yet: the Python wrapper */
        result = call_in_python(self, NULL, args, nargsf, kwnames);
        goto done;
    }
    if (count_call(self, session) == 0) {
        result = call_in_block(self, session, block, args, nargsf, kwnames);
    }
done:
    Py_XDECREF(block);
    Py_DECREF(session);
    return result;
}

static PyObject *auto_call_vectorcall(AutoCallObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames);

static PyObject *
auto_call_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    int kind;
    PyObject *original, *fallback, *grad_enabled, *inference_enabled;
    if (keywords_refused("AutoCall", kwargs)) {
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "iOOOO:AutoCall", &kind, &original, &fallback, &grad_enabled, &inference_enabled)) {
        return NULL;
    }
    if (kind < AUTO_MODULE_CALL || kind > AUTO_POST_STEP) {
        PyErr_SetString(PyExc_ValueError, "AutoCall: unknown kind");
        return NULL;
    }
    AutoCallObject *self = (AutoCallObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->kind = kind;
    self->original = Py_NewRef(original);
    self->fallback = Py_NewRef(fallback);
    no_args_call(&self->grad_enabled, grad_enabled);
    no_args_call(&self->inference_enabled, inference_enabled);
    self->vectorcall = (vectorcallfunc)auto_call_vectorcall;
    return (PyObject *)self;
}

/* A method of the class it is set on, as a function would be: ``module(x)`` calls it with the module first. */
static PyObject *
auto_call_get(PyObject *self, PyObject *instance, PyObject *Py_UNUSED(owner))
{
    if (instance == NULL || instance == Py_None) {
        return Py_NewRef(self);
    }
    return PyMethod_New(self, instance);
}

static int
auto_call_traverse(AutoCallObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->original);
    Py_VISIT(self->fallback);
    Py_VISIT(self->grad_enabled.function);
    Py_VISIT(self->inference_enabled.function);
    Py_VISIT(self->dict);
    return 0;
}

static int
auto_call_clear(AutoCallObject *self)
{
    Py_CLEAR(self->original);
    Py_CLEAR(self->fallback);
    clear_no_args_call(&self->grad_enabled);
    clear_no_args_call(&self->inference_enabled);
    Py_CLEAR(self->dict);
    return 0;
}

static void
auto_call_dealloc(AutoCallObject *self)
{
    PyObject_GC_UnTrack(self);
    auto_call_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyGetSetDef auto_call_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject AutoCallType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stepwatch._speedups.AutoCall",
    .tp_doc = "auto()'s wrapper of a torch call, its common case in C (see stepwatch/_auto_calls.c).",
    .tp_basicsize = sizeof(AutoCallObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_new = auto_call_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(AutoCallObject, vectorcall),
    .tp_descr_get = auto_call_get,
    .tp_dictoffset = offsetof(AutoCallObject, dict),
    .tp_getset = auto_call_getset,
    .tp_traverse = (traverseproc)auto_call_traverse,
    .tp_clear = (inquiry)auto_call_clear,
    .tp_dealloc = (destructor)auto_call_dealloc,
};

/* share_session(session): ``stepwatch._patches.session``, handed over at each assignment (its module's class
 * calls this), held here for the wrappers to read. Returns the one held before (None for none). */
static PyObject *
share_session(PyObject *Py_UNUSED(module), PyObject *session)
{
    PyObject *before = hot_state.auto_session;
    hot_state.auto_session = Py_NewRef(session);
    return before != NULL ? before : Py_NewRef(Py_None); /* the reference held, handed on */
}

/* Interns the attribute names above; 0, or -1 with an exception. */
static int
auto_calls_ready(void)
{
    struct {
        PyObject **slot;
        const char *text;
    } names[] = {
        {&s_training, "training"}, {&s_getattribute, "__getattribute__"}, {&s_by_name, "_by_name"},
        {&s_backward, "backward"}, {&s_zero_grad, "zero_grad"}, {&s_enter, "__enter__"}, {&s_exit, "__exit__"},
        {&s_forward_stage, "forward"}, {&s_loss_stage, "loss"}, {&s_optimizers, "optimizers"},
        {&s_name, "__name__"}, {&s_optimizer, "optimizer"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (*names[i].slot == NULL && (*names[i].slot = PyUnicode_InternFromString(names[i].text)) == NULL) {
            return -1;
        }
    }
    return 0;
}
