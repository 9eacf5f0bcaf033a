/* The addresses of libpython's and the C library's objects, classes and functions that the module's hot paths use,
 * side by side on three cache lines (included by _speedups.c, first: the names below are redefined for all that
 * follows).
 *
 * A shared library reads each such address from its global offset table, where the linker places the entries in
 * an order of its own over fourteen lines: a block's exit read entries on nine of them, a block's entry on nine, the
 * loop's step boundary on nine, each cold in a real step, where the model's work between two stages evicts them
 * (benchmarks/footprint.py: -34 data lines a step in ``block_exit`` alone once read from here).
 * Read here instead, they come from the lines of ``linked``, ordered by use: the first holds what a block's entry
 * and exit read. ``linked_ready()`` fills it from the real names, first thing when the module is imported; each
 * name is then redefined to read it from ``linked``, so that the code below is written as usual.
 */

#if defined(__GNUC__)
#define LINE_ALIGNED __attribute__((aligned(64)))
#else
#define LINE_ALIGNED
#endif

static struct {
    /* a block's entry and exit */
    PyObject *true_object, *false_object, *none_object;
    PyTypeObject *list_type, *tuple_type, *long_type, *dict_type;
    int (*read_clock)(clockid_t, struct timespec *);
    /* a block's exit, the step boundary, the loader's batch */
    PyObject *(*long_from_long_long)(long long);
    PyObject *(*dict_get_item)(PyObject *, PyObject *);
    PyObject *(*error_occurred)(void);
    int (*list_append)(PyObject *, PyObject *);
    PyObject *(*get_attr)(PyObject *, PyObject *);
    PyObject *(*call_one_arg)(PyObject *, PyObject *);
    PyTypeObject *unicode_type;
    /* auto()'s wrapped calls */
    PyObject *(*vectorcall)(PyObject *, PyObject *const *, size_t, PyObject *);
    int (*is_true)(PyObject *);
    PyObject *(*call_no_args)(PyObject *);
    int (*dict_contains)(PyObject *, PyObject *);
} linked LINE_ALIGNED;

static void
linked_ready(void)
{
    linked.true_object = Py_True;
    linked.false_object = Py_False;
    linked.none_object = Py_None;
    linked.list_type = &PyList_Type;
    linked.tuple_type = &PyTuple_Type;
    linked.long_type = &PyLong_Type;
    linked.dict_type = &PyDict_Type;
    linked.read_clock = clock_gettime;
    linked.long_from_long_long = PyLong_FromLongLong;
    linked.dict_get_item = PyDict_GetItemWithError;
    linked.error_occurred = PyErr_Occurred;
    linked.list_append = PyList_Append;
    linked.get_attr = PyObject_GetAttr;
    linked.call_one_arg = PyObject_CallOneArg;
    linked.unicode_type = &PyUnicode_Type;
    linked.vectorcall = PyObject_Vectorcall;
    linked.is_true = PyObject_IsTrue;
    linked.call_no_args = PyObject_CallNoArgs;
    linked.dict_contains = PyDict_Contains;
}

#undef Py_True
#undef Py_False
#undef Py_None
#define Py_True (linked.true_object)
#define Py_False (linked.false_object)
#define Py_None (linked.none_object)
#define PyList_Type (*linked.list_type)
#define PyTuple_Type (*linked.tuple_type)
#define PyLong_Type (*linked.long_type)
#define PyDict_Type (*linked.dict_type)
#define PyUnicode_Type (*linked.unicode_type)
#define clock_gettime (*linked.read_clock)
#define PyLong_FromLongLong (*linked.long_from_long_long)
#define PyDict_GetItemWithError (*linked.dict_get_item)
#define PyErr_Occurred (*linked.error_occurred)
#define PyList_Append (*linked.list_append)
#define PyObject_GetAttr (*linked.get_attr)
#define PyObject_CallOneArg (*linked.call_one_arg)
#define PyObject_Vectorcall (*linked.vectorcall)
#define PyObject_IsTrue (*linked.is_true)
#define PyObject_CallNoArgs (*linked.call_no_args)
#define PyDict_Contains (*linked.dict_contains)
