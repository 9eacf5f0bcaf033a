/* auto()'s wrappers of a module call, ``backward`` and ``zero_grad``: their common case, compact (included by
 * _speedups.c after _auto_calls.c, whose ``auto_call_general`` does every case and gets all this one does not).
 *
 * In a real step each wrapped call fetches its code cold, and the general function, every kind and case inlined,
 * is about 1,600 bytes, with six small functions beside it (the block, whether it measures, its methods, its
 * ``with``), each a few lines more: about 55 lines of code fetched a call (benchmarks/footprint.py). Here the
 * common case (the session free on the loop's thread, training, its stage's block made, a ``BlockBase`` one,
 * measuring, and for ``backward`` and ``zero_grad`` their finding already made) reads what the general function
 * reads, in the same order, with borrowed references, then writes what it writes; the first condition that
 * does not hold hands the call, before anything was written, to the general function, which reads it all again
 * (whatever was called on the way, ``is_grad_enabled()`` say, only queries).
 */

static char not_common_marker;
#define NOT_COMMON ((PyObject *)&not_common_marker) /* compared only: "the general function's case" */

/* What a weak reference refers to, only to be compared (NULL: dead, None, or a reference of another kind, which
 * the general function calls): ``module`` is held by the call, so an object equal to it is alive. */
static inline PyObject *
referent_in_place(PyObject *reference)
{
    if (reference == NULL || !PyWeakref_CheckRefExact(reference)) {
        return NULL;
    }
#if PY_VERSION_HEX < 0x030D0000
    PyObject *object = PyWeakref_GET_OBJECT(reference);
    return object == Py_None ? NULL : object;
#else
    PyObject *object = NULL;
    if (PyWeakref_GetRef(reference, &object) < 0) {
        PyErr_Clear();
        return NULL;
    }
    Py_XDECREF(object);
    return object;
#endif
}

/* The stage of a module call in the common case, as ``common_stage`` reads it (borrowed), or NOT_COMMON, or
 * NULL with an exception. */
static PyObject *
module_call_stage(AutoCallObject *self, AutoStateObject *session, PyObject *module)
{
    PyObject *outer = session->outer_classes;
    if (outer == NULL || !PyDict_CheckExact(outer)) {
        return NOT_COMMON;
    }
    int outermost = PyDict_Contains(outer, (PyObject *)Py_TYPE(module));
    if (outermost != 1) {
        return outermost < 0 ? NULL : NOT_COMMON;
    }
    PyObject *stage;
    if (module == referent_in_place(session->steady_forward)) {
        PyObject *training = PyObject_GetAttr(module, s_training);
        int truth = training == NULL ? -1 : PyObject_IsTrue(training);
        Py_XDECREF(training);
        if (truth < 0) {
            return NULL;
        }
        stage = truth ? s_forward_stage : NOT_COMMON;
    }
    else {
        stage = module == referent_in_place(session->steady_loss) ? s_loss_stage : NOT_COMMON;
    }
    if (stage == NOT_COMMON) {
        return NOT_COMMON; /* (or a steady module behind a reference of another kind: the general function's) */
    }
    int grad = call_is_true(self->grad_enabled);
    int inference = grad != 1 ? -1 : call_is_true(self->inference_enabled);
    if (grad < 0 || inference < 0) {
        return PyErr_Occurred() ? NULL : NOT_COMMON;
    }
    return grad == 1 && inference == 0 ? stage : NOT_COMMON;
}

/* The call's stage, borrowed, in the common case of a training step; NOT_COMMON, or NULL with an exception. */
static inline PyObject *
common_call_stage(AutoCallObject *self, AutoStateObject *session, PyObject *const *args, Py_ssize_t nargs)
{
    if (self->kind == AUTO_MODULE_CALL) {
        return nargs < 1 ? NOT_COMMON : module_call_stage(self, session, args[0]);
    }
    int bit = self->kind == AUTO_BACKWARD ? FOUND_BACKWARD : FOUND_ZERO_GRAD;
    if (session->found == NULL || session->found != session->found_known || !(session->found_flags & bit)) {
        return NOT_COMMON; /* the finding still to be written: the general function's */
    }
    return self->kind == AUTO_BACKWARD ? s_backward : s_zero_grad;
}

/* The stage's block when it is a measuring ``BlockBase`` running its own methods (borrowed), or NOT_COMMON, or
 * NULL with an exception. */
static inline PyObject *
measuring_base_block(AutoStateObject *session, PyObject *stage)
{
    PyObject *timed = session->kept_lookup;
    PyObject *by_name = timed != NULL && Py_IS_TYPE(timed, &LookupType) ? ((LookupObject *)timed)->by_name : NULL;
    if (by_name == NULL || !PyDict_CheckExact(by_name)) {
        return NOT_COMMON;
    }
    PyObject *block = PyDict_GetItemWithError(by_name, stage);
    if (block == NULL) {
        return PyErr_Occurred() ? NULL : NOT_COMMON;
    }
    if (!runs_base_methods(block)) {
        return NOT_COMMON;
    }
    PyObject *stacks = ((BlockObject *)block)->stacks;
    if (stacks == NULL || Py_TYPE(stacks) != slot_measuring.type || SLOT_IN_PLACE(stacks, slot_measuring) != Py_True) {
        return NOT_COMMON;
    }
    return block;
}

static PyTypeObject *session_type; /* held: the class of the sessions seen (AutoSession, an AutoState subclass) */

/* Whether ``current`` is an AutoState (the session's class, remembered when it is): 1 or 0. */
static COLD int
is_session(PyObject *current)
{
    if (!PyObject_TypeCheck(current, &AutoStateType)) {
        return 0;
    }
    Py_INCREF(Py_TYPE(current)); /* held, so that no other class can take its address */
    Py_XSETREF(session_type, Py_TYPE(current));
    return 1;
}

static PyObject *
auto_call_vectorcall(AutoCallObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (self->kind > AUTO_ZERO_GRAD) {
        return auto_call_general(self, args, nargsf, kwnames);
    }
    PyObject *current = PyDict_GetItemWithError(self->namespace, s_session); /* borrowed */
    if (current == NULL || (Py_TYPE(current) != session_type && !is_session(current))) {
        return current == NULL && PyErr_Occurred() ? NULL : auto_call_general(self, args, nargsf, kwnames);
    }
    AutoStateObject *session = (AutoStateObject *)current;
    if (session->busy || session->evaluation != Py_None || session->sw == NULL ||
        session->loop_thread != session->ident_source || session->loop_ident != PyThread_get_thread_ident()) {
        return auto_call_general(self, args, nargsf, kwnames);
    }
    Py_INCREF(session); /* the checks below may run Python code */
    PyObject *stage = common_call_stage(self, session, args, PyVectorcall_NARGS(nargsf));
    PyObject *block = stage == NULL || stage == NOT_COMMON ? stage : measuring_base_block(session, stage);
    PyObject *result;
    if (block == NULL || block == NOT_COMMON) {
        result = block == NULL ? NULL : auto_call_general(self, args, nargsf, kwnames);
        Py_DECREF(session);
        return result;
    }
    Py_INCREF(block);
    if (self->kind == AUTO_MODULE_CALL) { /* count_call's writes, in its order */
        session->training_blocks++;
    }
    else if (self->kind == AUTO_BACKWARD) {
        session->backward_calls++;
        session->training_blocks++;
    }
    else {
        session->zero_grads++;
    }
    session->busy++;
    result = block_enter((BlockObject *)block, NULL);
    if (result != NULL) {
        Py_DECREF(result);
        result = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
        if (result != NULL) {
            PyObject *exited = exit_block(block, Py_None, Py_None, Py_None); /* (its class may have changed) */
            if (exited == NULL) {
                Py_CLEAR(result);
            }
            Py_XDECREF(exited);
        }
        else {
            result = exit_raising(block);
        }
    }
    session->busy--;
    Py_DECREF(block);
    Py_DECREF(session);
    return result;
}
