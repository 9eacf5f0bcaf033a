/* auto()'s wrappers of a module call, ``backward`` and ``zero_grad``: their common case, compact (included by
 * _speedups.c after _auto_calls.c, whose ``auto_call_general`` does every case and gets all this one does not);
 * the optimizer step's hooks go to their own functions from here.
 *
 * In a real step each wrapped call fetches its code cold, and the general function, every kind and case inlined,
 * is about 1,600 bytes, with small functions beside it (the block, whether it measures, its methods, its
 * ``with``), each a few lines more: about 55 lines of code fetched a call (benchmarks/footprint.py). Here the
 * common case (the session free on the loop's thread, training, its stage's block made, a ``BlockBase`` one,
 * measuring, and for ``backward`` and ``zero_grad`` their finding already made) is read through the general
 * function's own checks (``common_stage``, ``existing_block``, ``block_measuring``), then written as it writes
 * it, without the rest; the first condition that does not hold hands the call, before anything was written, to
 * the general function, which reads it all again (whatever was called on the way, ``is_grad_enabled()`` say,
 * only queries).
 */

static char not_common_marker;
#define NOT_COMMON ((PyObject *)&not_common_marker) /* compared only: "the general function's case" */

/* The call's stage in the common case of a training step, as ``common_stage`` reads it (borrowed); NOT_COMMON,
 * or NULL with an exception. */
static inline PyObject *
common_call_stage(AutoCallObject *self, AutoStateObject *session, PyObject *const *args, Py_ssize_t nargs)
{
    if (self->kind != AUTO_MODULE_CALL) {
        int bit = self->kind == AUTO_BACKWARD ? FOUND_BACKWARD : FOUND_ZERO_GRAD;
        if (UNLIKELY(session->found == NULL || session->found != session->found_known ||
                     !(session->found_flags & bit))) {
            return NOT_COMMON; /* the finding still to be written: the general function's */
        }
    }
    PyObject *stage = common_stage(self, session, args, nargs);
    return LIKELY(stage != NULL) || PyErr_Occurred() ? stage : NOT_COMMON;
}

/* The stage's block when it runs BlockBase's own methods and is measuring (a new reference), or NOT_COMMON, or
 * NULL with an exception. Its class is read first: a class that runs them derives from BlockBase, so the block's
 * stacks are read as ``block_measuring`` reads them, without its check of the class's bases (two more lines of
 * the class, cold). */
static inline PyObject *
measuring_base_block(AutoStateObject *session, PyObject *stage)
{
    PyObject *block = existing_block(session, stage);
    if (UNLIKELY(block == NULL)) {
        return PyErr_Occurred() ? NULL : NOT_COMMON;
    }
    if (UNLIKELY(!runs_base_methods(block) || ((BlockObject *)block)->stacks == NULL)) {
        Py_DECREF(block); /* (the general function finds and remembers a class running them) */
        return NOT_COMMON;
    }
    int on = stacks_measuring(((BlockObject *)block)->stacks);
    if (UNLIKELY(on != 1)) {
        Py_DECREF(block);
        return on < 0 ? NULL : NOT_COMMON;
    }
    return block;
}

/* Whether ``current`` is an AutoState (the session's class, remembered when it is): 1 or 0. */
static COLD int
is_session(PyObject *current)
{
    if (!PyObject_TypeCheck(current, &AutoStateType)) {
        return 0;
    }
    Py_INCREF(Py_TYPE(current)); /* held, so that no other class can take its address */
    Py_XSETREF(hot_state.session_type, Py_TYPE(current));
    return 1;
}

static PyObject *
auto_call_vectorcall(AutoCallObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *current = hot_state.auto_session; /* borrowed */
    if (UNLIKELY(current == NULL || (Py_TYPE(current) != hot_state.session_type && !is_session(current)))) {
        return auto_call_general(self, args, nargsf, kwnames);
    }
    AutoStateObject *session = (AutoStateObject *)current;
    if (UNLIKELY(self->kind > AUTO_ZERO_GRAD)) {
        return optimizer_hook(self, session, args, nargsf, kwnames);
    }
    if (UNLIKELY(session->busy || session->loop_thread != session->ident_source ||
                 session->loop_ident != current_ident())) {
        return auto_call_general(self, args, nargsf, kwnames);
    }
    Py_INCREF(session); /* the checks below may run Python code */
    PyObject *stage = common_call_stage(self, session, args, PyVectorcall_NARGS(nargsf));
    PyObject *block = stage == NULL || stage == NOT_COMMON ? stage : measuring_base_block(session, stage);
    PyObject *result;
    if (UNLIKELY(block == NULL || block == NOT_COMMON)) {
        result = block == NULL ? NULL : auto_call_general(self, args, nargsf, kwnames);
        Py_DECREF(session);
        return result;
    }
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
    if (LIKELY(result != NULL)) {
        Py_DECREF(result);
        result = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
        if (LIKELY(result != NULL)) {
            PyObject *none[3] = {Py_None, Py_None, Py_None}; /* BlockBase's __exit__, as found at the entry */
            PyObject *exited = block_exit((BlockObject *)block, none, 3);
            if (UNLIKELY(exited == NULL)) {
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
