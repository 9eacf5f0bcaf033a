/* auto()'s session state in C (included by _speedups.c before _auto_calls.c): the fields every wrapped call reads
 * or writes, and the reads of them the wrappers share. See _auto_calls.c.
 */

enum { AUTO_MODULE_CALL = 0, AUTO_BACKWARD = 1, AUTO_ZERO_GRAD = 2, AUTO_PRE_STEP = 3, AUTO_POST_STEP = 4 };
enum { FOUND_BACKWARD = 1, FOUND_ZERO_GRAD = 2 };

/* The session's state that every wrapped call reads or writes, as C fields (the base class of
 * stepwatch._auto.AutoSession): a read or a count here is a load or an add, where an attribute of a Python
 * object is a lookup in its type and its dictionary (hundreds of instructions). Python reads and writes them as
 * attributes, as before. */
typedef struct {
    PyObject_HEAD
    PyObject *sw;             /* the Stopwatch */
    PyObject *loop_thread;    /* the thread whose loop's steps are broken down (an int), or None */
    PyObject *evaluation;     /* the val loop of an evaluation in a step, or None */
    PyObject *steady_forward; /* a weak reference to the model last called for training, or None */
    PyObject *steady_loss;    /* the same for the loss module */
    PyObject *module_calls;   /* the session's ModuleCalls */
    PyObject *found;          /* what auto found (WhatAutoFound) */
    PyObject *open_blocks;    /* the optimizer blocks opened by the pre-step hook (a list) */
    PyObject *driven;         /* the loop of optimizer steps without a DataLoader, or None */
    PyObject *outer_classes;  /* ``module_calls.outer`` (a dict, never rebound): the classes of outermost calls */
    PyObject *kept_lookup;    /* ``sw._blocks.lookup``: its compiled timed(), keeping the blocks by name, or None */
    PyObject *kept_counter;   /* ``sw._blocks.count``: its compiled count(), keeping the stacks and tree, or None */
    PyObject *ident_source;   /* the ``loop_thread`` int last converted to ``loop_ident`` (not exposed) */
    unsigned long loop_ident; /* its value: the loop's thread, compared without reading the int each call */
    PyObject *found_known;    /* the ``found`` whose flags below were seen set (not exposed to Python) */
    PyObject *optimizer_type; /* an optimizer class ``found_known`` has among its optimizers (not exposed) */
    int found_flags;          /* FOUND_BACKWARD, FOUND_ZERO_GRAD: seen True on ``found_known`` (they never turn back) */
    Py_ssize_t busy;          /* auto blocks open: nested patched calls are plain */
    Py_ssize_t loop_depth;    /* DataLoader loops of the session's thread under way (nested ones count) */
    Py_ssize_t steps_to_next_check; /* steps until the module calls are checked (``check_module_calls``) */
    Py_ssize_t backward_calls;
    Py_ssize_t training_blocks;
    Py_ssize_t zero_grads;
} AutoStateObject;

static PyMemberDef auto_state_members[] = {
    {"sw", T_OBJECT, offsetof(AutoStateObject, sw), 0, NULL},
    {"loop_thread", T_OBJECT, offsetof(AutoStateObject, loop_thread), 0, NULL},
    {"evaluation", T_OBJECT, offsetof(AutoStateObject, evaluation), 0, NULL},
    {"steady_forward", T_OBJECT, offsetof(AutoStateObject, steady_forward), 0, NULL},
    {"steady_loss", T_OBJECT, offsetof(AutoStateObject, steady_loss), 0, NULL},
    {"module_calls", T_OBJECT, offsetof(AutoStateObject, module_calls), 0, NULL},
    {"found", T_OBJECT, offsetof(AutoStateObject, found), 0, NULL},
    {"open_blocks", T_OBJECT, offsetof(AutoStateObject, open_blocks), 0, NULL},
    {"driven", T_OBJECT, offsetof(AutoStateObject, driven), 0, NULL},
    {"outer_classes", T_OBJECT, offsetof(AutoStateObject, outer_classes), 0, NULL},
    {"kept_lookup", T_OBJECT, offsetof(AutoStateObject, kept_lookup), 0, NULL},
    {"kept_counter", T_OBJECT, offsetof(AutoStateObject, kept_counter), 0, NULL},
    {"busy", T_PYSSIZET, offsetof(AutoStateObject, busy), 0, NULL},
    {"loop_depth", T_PYSSIZET, offsetof(AutoStateObject, loop_depth), 0, NULL},
    {"steps_to_next_check", T_PYSSIZET, offsetof(AutoStateObject, steps_to_next_check), 0, NULL},
    {"backward_calls", T_PYSSIZET, offsetof(AutoStateObject, backward_calls), 0, NULL},
    {"training_blocks", T_PYSSIZET, offsetof(AutoStateObject, training_blocks), 0, NULL},
    {"zero_grads", T_PYSSIZET, offsetof(AutoStateObject, zero_grads), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static int
auto_state_traverse(AutoStateObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->sw);
    Py_VISIT(self->loop_thread);
    Py_VISIT(self->evaluation);
    Py_VISIT(self->steady_forward);
    Py_VISIT(self->steady_loss);
    Py_VISIT(self->module_calls);
    Py_VISIT(self->found);
    Py_VISIT(self->open_blocks);
    Py_VISIT(self->driven);
    Py_VISIT(self->outer_classes);
    Py_VISIT(self->kept_lookup);
    Py_VISIT(self->kept_counter);
    Py_VISIT(self->ident_source);
    Py_VISIT(self->found_known);
    Py_VISIT(self->optimizer_type);
    return 0;
}

static int
auto_state_clear(AutoStateObject *self)
{
    Py_CLEAR(self->sw);
    Py_CLEAR(self->loop_thread);
    Py_CLEAR(self->evaluation);
    Py_CLEAR(self->steady_forward);
    Py_CLEAR(self->steady_loss);
    Py_CLEAR(self->module_calls);
    Py_CLEAR(self->found);
    Py_CLEAR(self->open_blocks);
    Py_CLEAR(self->driven);
    Py_CLEAR(self->outer_classes);
    Py_CLEAR(self->kept_lookup);
    Py_CLEAR(self->kept_counter);
    Py_CLEAR(self->ident_source);
    Py_CLEAR(self->found_known);
    Py_CLEAR(self->optimizer_type);
    return 0;
}

static void
auto_state_dealloc(AutoStateObject *self)
{
    PyObject_GC_UnTrack(self);
    auto_state_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject AutoStateType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stepwatch._speedups.AutoState",
    .tp_doc = "The auto session's state read by every wrapped call (see stepwatch/_auto_calls.c).",
    .tp_basicsize = sizeof(AutoStateObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_members = auto_state_members,
    .tp_traverse = (traverseproc)auto_state_traverse,
    .tp_clear = (inquiry)auto_state_clear,
    .tp_dealloc = (destructor)auto_state_dealloc,
};

static PyObject *s_optimizers, *s_name, *s_optimizer, *s_training, *s_getattribute, *s_by_name, *s_backward,
    *s_zero_grad, *s_enter, *s_exit, *s_forward_stage, *s_loss_stage;

/* ``loop_thread`` (not the int last converted) converted to ``loop_ident``: 1, or 0 where it is no thread's. */
static COLD int
convert_loop_thread(AutoStateObject *session)
{
    PyObject *thread = session->loop_thread;
    if (thread == NULL || !PyLong_CheckExact(thread)) {
        return 0;
    }
    unsigned long ident = PyLong_AsUnsignedLong(thread);
    if (ident == (unsigned long)-1 && PyErr_Occurred()) {
        PyErr_Clear(); /* an identity that is no unsigned long is no thread's */
        return 0;
    }
    session->loop_ident = ident;
    Py_XSETREF(session->ident_source, Py_NewRef(thread)); /* held: no other int can take its address */
    return 1;
}

/* 1: the session's loop runs on this thread (``loop_thread == get_ident()``); 0: not. */
static int
on_loop_thread(AutoStateObject *session)
{
    if (UNLIKELY(session->loop_thread != session->ident_source) && !convert_loop_thread(session)) {
        return 0;
    }
    return session->loop_ident == current_ident();
}

/* 1: the session's loop runs on this thread and no auto block is open (``not busy and loop_thread ==
 * get_ident()``); 0: not. */
static int
free_on_this_thread(AutoStateObject *session)
{
    return !session->busy && on_loop_thread(session);
}

/* A function of no arguments called at each module call (torch's ``is_grad_enabled`` and
 * ``is_inference_mode_enabled``, builtins taking no arguments): for a builtin, its C function and ``self``, read
 * once when the wrapper is made, so that a call reads neither the builtin nor its method table, nor goes through
 * ``PyObject_CallNoArgs`` and the builtin's dispatch (lines of code and data fetched cold twice a module call in
 * a real step). A builtin's function and ``self`` never change. */
typedef struct {
    PyCFunction c_function; /* NULL: not such a builtin, ``function`` is called */
    PyObject *c_self;       /* borrowed: ``function`` holds it */
    PyObject *function;
} NoArgsCall;

static void
no_args_call(NoArgsCall *call, PyObject *function)
{
    int builtin = PyCFunction_CheckExact(function) && PyCFunction_GET_FLAGS(function) == METH_NOARGS;
    call->c_function = builtin ? PyCFunction_GET_FUNCTION(function) : NULL;
    call->c_self = builtin ? PyCFunction_GET_SELF(function) : NULL;
    call->function = Py_NewRef(function);
}

static void
clear_no_args_call(NoArgsCall *call)
{
    call->c_function = NULL;
    call->c_self = NULL;
    Py_CLEAR(call->function);
}

/* Whether the call returns true: 1, 0, or -1 (a bool read as one). */
static int
call_is_true(const NoArgsCall *call)
{
    PyObject *value = call->c_function != NULL ? call->c_function(call->c_self, NULL)
                      : call->function != NULL ? PyObject_CallNoArgs(call->function)
                                               : NULL;
    if (value == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_RuntimeError, "AutoCall: cleared");
        }
        return -1;
    }
    int truth = value == Py_True ? 1 : value == Py_False ? 0 : PyObject_IsTrue(value);
    Py_DECREF(value);
    return truth;
}

/* The object a weak reference (or None) refers to: a new reference, or NULL (dead, None, or an exception). A
 * ``weakref.ref`` is read in place; a reference of another kind is called. */
static INLINED PyObject *
referent(PyObject *reference)
{
    if (reference == NULL || reference == Py_None) {
        return NULL;
    }
    if (PyWeakref_CheckRefExact(reference)) {
#if PY_VERSION_HEX < 0x030D0000
        PyObject *target = PyWeakref_GET_OBJECT(reference); /* borrowed; None once dead */
        return target == Py_None ? NULL : Py_NewRef(target);
#else
        PyObject *target = NULL;
        return PyWeakref_GetRef(reference, &target) < 0 ? NULL : target;
#endif
    }
    PyObject *object = PyObject_CallNoArgs(reference);
    if (object == Py_None) {
        Py_CLEAR(object);
    }
    return object;
}

/* ``module_training``'s miss: whether instances of ``type`` keep ``training`` in their dictionary (no attribute of
 * that name on the class, ``object``'s own ``__getattribute__``), the class then remembered. 1 or 0. */
static COLD int
finds_dict_attrs(PyTypeObject *type)
{
    PyObject *getattribute = _PyType_Lookup(type, s_getattribute); /* borrowed; assigns a version tag */
    if (_PyType_Lookup(type, s_training) != NULL || getattribute == NULL ||
        getattribute != _PyType_Lookup(&PyBaseObject_Type, s_getattribute)) {
        return 0;
    }
    return remember_class(&hot_state.dict_attrs, type);
}

/* ``module.training`` (an nn.Module's mode): 1, 0, or -1. Read from the instance's dictionary where its class
 * keeps it there, as ``object.__getattribute__`` finds it, without nn.Module's ``__getattr__`` hook and the
 * class's lookup of ``training`` (about 10 lines a step fewer in a real step, docs/overhead.md); anything else (no
 * such entry, not a bool) through ``PyObject_GetAttr``. */
static INLINED int
module_training(PyObject *module)
{
    PyTypeObject *type = Py_TYPE(module);
    if (is_known_class(&hot_state.dict_attrs, type) || finds_dict_attrs(type)) {
        PyObject **dict = _PyObject_GetDictPtr(module);
        PyObject *value = dict != NULL && *dict != NULL ? PyDict_GetItemWithError(*dict, s_training) : NULL;
        if (value == Py_True || value == Py_False) {
            return value == Py_True;
        }
        if (PyErr_Occurred()) {
            return -1;
        }
    }
    PyObject *training = PyObject_GetAttr(module, s_training);
    int truth = training == NULL ? -1 : PyObject_IsTrue(training);
    Py_XDECREF(training);
    return truth;
}

/* The stage of a module call known without module_stage: "forward" for the session's steady model called
 * in training mode, "loss" for its steady loss module (borrowed; NULL with no exception: not known). */
static INLINED PyObject *
known_stage(AutoStateObject *session, PyObject *module)
{
    PyObject *stage = NULL;
    PyObject *model = referent(session->steady_forward);
    if (model == module) {
        stage = module_training(module) > 0 ? s_forward_stage : NULL;
    }
    else if (!PyErr_Occurred()) {
        PyObject *loss = referent(session->steady_loss);
        stage = loss == module && loss != NULL ? s_loss_stage : NULL;
        Py_XDECREF(loss);
    }
    Py_XDECREF(model);
    return stage;
}

/* Whether a stopwatch's stacks are measuring (``stacks.measuring is True``): 1, 0, or -1. */
static INLINED int
stacks_measuring(PyObject *stacks)
{
    PyObject *value = slot_get(stacks, SLOT_MEASURING);
    if (UNLIKELY(value == NULL)) {
        return -1;
    }
    Py_DECREF(value);
    return value == Py_True;
}

/* Whether the session's stopwatch is measuring (``sw.stacks.measuring is True``): 1, 0, or -1. */
static COLD int
measuring(PyObject *sw)
{
    PyObject *stacks = PyObject_GetAttr(sw, s_stacks);
    if (stacks == NULL) {
        return -1;
    }
    int on = stacks_measuring(stacks);
    Py_DECREF(stacks);
    return on;
}

/* The stopwatch's block for ``stage`` (``sw._by_name[stage]``): a new reference; NULL where none was made yet
 * (``timed()`` makes it, in the Python wrapper), with an exception set only on an error. The blocks by name are
 * those its compiled ``timed()`` keeps (re-pointed with its state), read without an attribute lookup. */
static INLINED PyObject *
existing_block(AutoStateObject *session, PyObject *stage)
{
    PyObject *timed = session->kept_lookup;
    PyObject *by_name = LIKELY(timed != NULL && Py_IS_TYPE(timed, &LookupType))
                            ? Py_NewRef(((LookupObject *)timed)->by_name)
                            : PyObject_GetAttr(session->sw, s_by_name);
    PyObject *block =
        UNLIKELY(by_name == NULL || !PyDict_CheckExact(by_name)) ? NULL : PyDict_GetItemWithError(by_name, stage);
    Py_XINCREF(block);
    Py_XDECREF(by_name);
    return block;
}

/* Remembers ``found`` as the object whose flags and optimizer class the session has seen (they are forgotten
 * when ``found`` is another object). */
static void
know_found(AutoStateObject *session)
{
    if (session->found_known != session->found) {
        Py_XSETREF(session->found_known, Py_XNewRef(session->found));
        session->found_flags = 0;
        Py_CLEAR(session->optimizer_type);
    }
}

/* Whether ``block``'s stopwatch is measuring, read from the stacks the block keeps (the stopwatch's, re-pointed
 * when its state is lent or shared), or from ``sw`` for a block of another kind: 1, 0, or -1. */
static INLINED int
block_measuring(PyObject *block, PyObject *sw)
{
    if (!PyObject_TypeCheck(block, &BlockBaseType) || ((BlockObject *)block)->stacks == NULL) {
        return measuring(sw);
    }
    return stacks_measuring(((BlockObject *)block)->stacks);
}

/* ``runs_base_methods``'s miss: the class looked up, and remembered where it runs BlockBase's own. 1 or 0. */
static COLD int
finds_base_methods(PyTypeObject *type)
{
    if (!PyType_IsSubtype(type, &BlockBaseType)) {
        return 0;
    }
    PyObject *enter = _PyType_Lookup(type, s_enter); /* borrowed; assigns the class a version tag */
    PyObject *exit = _PyType_Lookup(type, s_exit);
    if (enter == NULL || exit == NULL || enter != _PyType_Lookup(&BlockBaseType, s_enter) ||
        exit != _PyType_Lookup(&BlockBaseType, s_exit)) {
        return 0;
    }
    return remember_class(&hot_state.base_methods, type);
}

/* Whether ``block``'s __enter__ and __exit__ are BlockBase's own, its class (``Block``, a Python subclass) not
 * overriding them: then they are called here directly, without looking them up on the class (a few cache lines
 * of the class and the interpreter's method cache, cold in a real step). 1 or 0. Inlined where it is read: the
 * remembered class, compared, is a line of the class and none of code. */
static inline int
runs_base_methods(PyObject *block)
{
    PyTypeObject *type = Py_TYPE(block);
    return is_known_class(&hot_state.base_methods, type) || finds_base_methods(type);
}

/* ``block.__enter__()``: a new reference, or NULL with an exception. */
static PyObject *
enter_block(PyObject *block)
{
    if (runs_base_methods(block)) {
        return block_enter((BlockObject *)block, NULL);
    }
    return PyObject_CallMethodNoArgs(block, s_enter);
}

/* ``block.__exit__(type, value, traceback)``: a new reference, or NULL with an exception. */
static PyObject *
exit_block(PyObject *block, PyObject *type, PyObject *value, PyObject *traceback)
{
    if (runs_base_methods(block)) {
        PyObject *args[3] = {type, value, traceback};
        return block_exit((BlockObject *)block, args, 3);
    }
    return PyObject_CallMethodObjArgs(block, s_exit, type, value, traceback, NULL);
}

/* ``__exit__`` of ``block`` with the exception in flight (``callable`` raised inside it), as a ``with``
 * statement calls it: the exception goes on (NULL), unless ``__exit__`` swallowed it (None) or raised its own. */
static COLD PyObject *
exit_raising(PyObject *block)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback != NULL) {
        PyException_SetTraceback(value, traceback);
    }
    PyObject *exited = exit_block(block, type, value, traceback ? traceback : Py_None);
    int suppress = exited == NULL ? 0 : PyObject_IsTrue(exited);
    PyObject *result = NULL;
    if (exited != NULL && suppress == 0) {
        PyErr_Restore(type, value, traceback); /* the exception goes on */
    }
    else {
        Py_XDECREF(type); /* __exit__ raised (its exception replaces it) or swallowed it */
        Py_XDECREF(value);
        Py_XDECREF(traceback);
        if (suppress > 0) {
            result = Py_NewRef(Py_None);
        }
    }
    Py_XDECREF(exited);
    return result;
}

/* ``callable(*args)`` inside ``block``, entered and exited as a ``with`` statement would (the exception, if any,
 * passed to ``__exit__``, suppressed where it says so). Also a batch's collate (_reads.c). */
static PyObject *
with_block(PyObject *block, PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *entered = enter_block(block);
    if (entered == NULL) {
        return NULL;
    }
    Py_DECREF(entered);
    PyObject *result = PyObject_Vectorcall(callable, args, nargsf, kwnames);
    if (result == NULL) {
        return exit_raising(block);
    }
    PyObject *exited = exit_block(block, Py_None, Py_None, Py_None);
    if (exited == NULL) {
        Py_CLEAR(result);
    }
    Py_XDECREF(exited);
    return result;
}
