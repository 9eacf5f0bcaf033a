/* Reading the ``__slots__`` attributes of stepwatch's own hot-path objects from C at their offsets (included by
 * _speedups.c).
 *
 * Inside a real training step everything stepwatch touches has been pushed out of the CPU's caches by the model's
 * work, so what a read costs there is the cache lines it touches, not its instructions. ``PyObject_GetAttr`` on
 * a slot touches five or so: the type's method cache entry, the type, the member descriptor and its definition,
 * then the object. At its offset, a slot is one line: the object's own. (Measured in a real 1.8 ms step: a C
 * function making a dozen such reads took 6.8 us.) The offsets are those of the member descriptors Python made
 * for the classes' ``__slots__``, found once by :func:`configure_slots`; an object of any other type, or a slot
 * not set, is read by ``PyObject_GetAttr`` as before, so the two ways always read the same value.
 */

typedef struct {
    const char *text;   /* the attribute's name */
    PyObject *name;     /* interned */
    PyTypeObject *type; /* the class whose slot it is (held), or NULL before configure_slots() */
    Py_ssize_t offset;
} Slot;

/* ThreadStacks */
static Slot slot_measuring = {"measuring"}, slot_hot = {"hot"}, slot_local = {"local"};
/* Node */
static Slot slot_children = {"children"}, slot_buf = {"buf"}, slot_batches = {"batches"};
/* Phase */
static Slot slot_counters = {"counters"}, slot_count_calls = {"count_calls"}, slot_in_first_step = {"in_first_step"},
            slot_counting = {"counting"}, slot_loop_ns = {"loop_ns"}, slot_steps = {"steps"},
            slot_schedule_pos = {"schedule_pos"};
/* PeriodicCalls */
static Slot slot_ticks = {"ticks"};

/* ``obj.<slot>``: a new reference, or NULL with an exception. */
static inline PyObject *
slot_get(PyObject *obj, Slot *slot)
{
    if (Py_TYPE(obj) == slot->type) {
        PyObject *value = *(PyObject **)((char *)obj + slot->offset);
        if (value != NULL) {
            Py_INCREF(value);
            return value;
        }
    }
    return PyObject_GetAttr(obj, slot->name);
}

/* ``obj.<slot> = value``: 0, or -1 with an exception. */
static inline int
slot_set(PyObject *obj, Slot *slot, PyObject *value)
{
    if (Py_TYPE(obj) == slot->type) {
        Py_INCREF(value);
        Py_XSETREF(*(PyObject **)((char *)obj + slot->offset), value);
        return 0;
    }
    return PyObject_SetAttr(obj, slot->name, value);
}

static PyObject *one; /* the int 1 (made by slots_ready) */

/* ``obj.<slot> += 1``: 0, or -1 with an exception. */
static int
slot_increment(PyObject *obj, Slot *slot)
{
    PyObject *value = slot_get(obj, slot);
    PyObject *more = value != NULL ? PyNumber_Add(value, one) : NULL;
    Py_XDECREF(value);
    int failed = more == NULL || slot_set(obj, slot, more) < 0;
    Py_XDECREF(more);
    return failed ? -1 : 0;
}

/* Finds ``slot`` on ``type``: 0, or -1 with an exception if it is not a writable object slot there. */
static int
find_slot(PyTypeObject *type, Slot *slot)
{
    PyObject *descriptor = PyObject_GetAttr((PyObject *)type, slot->name);
    if (descriptor == NULL) {
        return -1;
    }
    int usable = Py_IS_TYPE(descriptor, &PyMemberDescr_Type) &&
                 ((PyMemberDescrObject *)descriptor)->d_common.d_type == type &&
                 ((PyMemberDescrObject *)descriptor)->d_member->type == T_OBJECT_EX;
    if (usable) {
        slot->offset = ((PyMemberDescrObject *)descriptor)->d_member->offset;
        Py_INCREF(type);
        Py_XSETREF(slot->type, type);
    }
    Py_DECREF(descriptor);
    if (!usable) {
        PyErr_Format(PyExc_TypeError, "stepwatch: %s.%s is not a slot", type->tp_name, slot->text);
        return -1;
    }
    return 0;
}

static Slot *all_slots[] = {&slot_measuring,     &slot_hot,      &slot_local,   &slot_children,
                            &slot_buf,           &slot_counters, &slot_count_calls, &slot_in_first_step,
                            &slot_counting,      &slot_loop_ns,  &slot_steps,       &slot_batches,
                            &slot_schedule_pos,  &slot_ticks};

/* Interns the slots' names (read by ``PyObject_GetAttr`` until configured) and makes ``one``; 0, or -1 with an
 * exception. */
static int
slots_ready(void)
{
    if (one == NULL && (one = PyLong_FromLong(1)) == NULL) {
        return -1;
    }
    for (size_t i = 0; i < sizeof(all_slots) / sizeof(all_slots[0]); i++) {
        Slot *slot = all_slots[i];
        if (slot->name == NULL && (slot->name = PyUnicode_InternFromString(slot->text)) == NULL) {
            return -1;
        }
    }
    return 0;
}

static PyObject *loop_owner; /* stepwatch._tree.LOOP: the owner of a timed loop's frames */

/* configure_slots(ThreadStacks, Node, Phase, LOOP, PeriodicCalls): where their hot-path slots are, and the loops'
 * frame owner. */
static PyObject *
configure_slots(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyType_Check(args[0]) || !PyType_Check(args[1]) || !PyType_Check(args[2]) ||
        !PyType_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "configure_slots(ThreadStacks, Node, Phase, LOOP, PeriodicCalls)");
        return NULL;
    }
    struct {
        PyObject *type;
        Slot *slot;
    } found[] = {
        {args[0], &slot_measuring},     {args[0], &slot_hot},           {args[0], &slot_local},
        {args[1], &slot_children},      {args[1], &slot_buf},           {args[2], &slot_counters},
        {args[2], &slot_count_calls},   {args[2], &slot_in_first_step}, {args[2], &slot_counting},
        {args[2], &slot_loop_ns},       {args[2], &slot_steps},         {args[1], &slot_batches},
        {args[2], &slot_schedule_pos},  {args[4], &slot_ticks},
    };
    for (size_t i = 0; i < sizeof(found) / sizeof(found[0]); i++) {
        if (find_slot((PyTypeObject *)found[i].type, found[i].slot) < 0) {
            return NULL;
        }
    }
    Py_INCREF(args[3]);
    Py_XSETREF(loop_owner, args[3]);
    Py_RETURN_NONE;
}
