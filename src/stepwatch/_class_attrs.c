/* A Python function on a class swapped for another without ``setattr``'s slot updates (included by
 * _speedups.c; optional, as the block is: ``_patches.set_on_class`` uses ``setattr`` where it is not built).
 *
 * ``setattr(nn.Module, "__call__", f)`` updates the ``tp_call`` slot of every subclass of ``nn.Module`` (353 once
 * torch is imported, each looked up again along its MRO): about 25 us warm, and 280 us in a training step,
 * paid when auto() starts, when its module-call wrapper narrows to the outermost classes, and at each
 * relearning (``benchmarks/footprint.py``'s dumps, docs/overhead.md). Where the class's own dictionary holds a
 * Python function under that name and the new value is a Python function too, every slot the name fills is
 * the generic one, which looks the name up at each call (``slot_tp_call`` and its kind), before and after:
 * the update would change nothing. Here the dictionary is written and the lookup caches of the class and its
 * subclasses invalidated (``PyType_Modified``), which is the rest of what ``setattr`` does on a class whose
 * metaclass is ``type``'s kind. False, with nothing done, in every other case.
 */

static PyObject *
swap_class_function(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "swap_class_function() takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *cls = args[0], *name = args[1], *function = args[2];
    if (!PyType_Check(cls) || !PyUnicode_CheckExact(name) || !PyFunction_Check(function) ||
        Py_TYPE(cls)->tp_setattro != PyType_Type.tp_setattro) {
        Py_RETURN_FALSE; /* (a metaclass with its own __setattr__ decides for itself) */
    }
    PyTypeObject *type = (PyTypeObject *)cls;
    if (!(type->tp_flags & Py_TPFLAGS_HEAPTYPE) || (type->tp_flags & Py_TPFLAGS_IMMUTABLETYPE) ||
        type->tp_dict == NULL || !PyDict_CheckExact(type->tp_dict)) {
        Py_RETURN_FALSE;
    }
    PyObject *meta_attribute = _PyType_Lookup(Py_TYPE(cls), name); /* borrowed */
    if (meta_attribute != NULL && Py_TYPE(meta_attribute)->tp_descr_set != NULL) {
        Py_RETURN_FALSE; /* the metaclass's data descriptor (``__doc__``, ``__name__``...) takes the assignment */
    }
    PyObject *current = PyDict_GetItemWithError(type->tp_dict, name); /* borrowed */
    if (current == NULL) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_FALSE;
    }
    if (!PyFunction_Check(current)) {
        Py_RETURN_FALSE;
    }
    Py_INCREF(name);
    PyUnicode_InternInPlace(&name); /* as setattr keys a class's dictionary */
    int failed = PyDict_SetItem(type->tp_dict, name, function) < 0;
    Py_DECREF(name);
    if (failed) {
        return NULL;
    }
    PyType_Modified(type);
    Py_RETURN_TRUE;
}
