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

/* The classes whose slots are read, and the slots. */
enum { OF_STACKS, OF_NODE, OF_PHASE, OF_PERIODIC, OF_COLLATE, SLOT_OWNERS };
typedef enum {
    SLOT_MEASURING, SLOT_HOT, SLOT_LOCAL, SLOT_TIMELINE,      /* ThreadStacks */
    SLOT_CHILDREN, SLOT_BUF, SLOT_BATCHES,                    /* Node */
    SLOT_COUNTERS, SLOT_COUNT_CALLS, SLOT_IN_FIRST_STEP,      /* Phase */
    SLOT_COUNTING, SLOT_LOOP_NS, SLOT_STEPS, SLOT_SCHEDULE_POS,
    SLOT_BATCH_SAMPLES,
    SLOT_TICKS,                                               /* PeriodicCalls */
    SLOT_ENABLED, SLOT_WATCHING, SLOT_COLLATE_FN,             /* TimedCollate (configure_collate) */
    SLOTS
} Slot;

/* Each slot's class, from its place in the list above (no memory read: a slot not known at compile time, in the
 * functions below, costs no line of a table). */
#define SLOT_OWNER(slot)                                                                                           \
    ((slot) < SLOT_CHILDREN   ? OF_STACKS                                                                          \
     : (slot) < SLOT_COUNTERS ? OF_NODE                                                                            \
     : (slot) < SLOT_TICKS    ? OF_PHASE                                                                           \
     : (slot) < SLOT_ENABLED  ? OF_PERIODIC                                                                        \
                              : OF_COLLATE)

/* Each slot's attribute name. */
static const char *const slot_text[SLOTS] = {
    "measuring", "hot", "local", "timeline", "children", "buf", "batches", "counters", "count_calls", "in_first_step",
    "counting", "loop_ns", "steps", "schedule_pos", "batch_samples", "ticks", "enabled", "watching", "collate_fn",
};
static PyObject *slot_names[SLOTS]; /* interned, read where a slot is read by name (another type, or not set) */

/* A class remembered with its version tag: one changed since (its class dictionary or a base's), or another class
 * at its address, has another tag, so a remembered finding about the class still holds while the two match. */
typedef struct {
    PyTypeObject *type;
    unsigned int version;
} KnownClass;

/* What the module's hot paths read of its own state, on three cache lines. Each static variable of its own lay on a
 * line of its own more often than not (the linker places them by name and kind, not by use): a block's exit read
 * five such lines, each cold in a real step (benchmarks/footprint.py). The first line holds all that a block's
 * entry and exit read: the slots' offsets (small: 16 + 8 per slot before), the fold size (as its power of two),
 * the last block class's tag, the default clock, the generation of what threads found (_threads.c), and the first
 * three classes whose slots are read (a stage's stacks, its node, a phase; where the fold size, the clock and the
 * generation lay on a second line, each exit read one line more: -11 lines a step by hand); the second, the other
 * two classes, the loops' frame owner and the int 1; the third, what auto()'s wrappers read at every call
 * (_auto_calls.c, _auto_fast.c, _auto_state.c). */
static struct {
    unsigned char offsets[SLOTS]; /* (a slot's offset is 16 + 8 per slot before it: small) */
    unsigned char fold_shift;     /* a stage's buffer folds at ``1 << fold_shift`` entries (configure()) */
    unsigned int block_version; /* the version tag of the last class found to be a BlockBase (_bound.c), or 0 */
    PyObject *perf_counter_ns;                                          /* time.perf_counter_ns */
    unsigned long long threads_generation; /* renewed as a thread's hold dies (_threads.c): never 0 */
    PyTypeObject *types[SLOT_OWNERS]; /* NULL before configure_slots() */
    PyObject *loop_owner; /* stepwatch._tree.LOOP: the owner of a timed loop's frames */
    PyObject *one;        /* the int 1 (made by slots_ready) */
    PyObject *auto_session LINE_ALIGNED; /* stepwatch._patches.session (share_session()): NULL, None or the session */
    PyTypeObject *session_type;          /* held: the class of the sessions seen (an AutoState subclass) */
    KnownClass base_methods;             /* the last class found to run BlockBase's own methods (runs_base_methods) */
    KnownClass dict_attrs;               /* the last class found to keep ``training`` in its instances' dictionary */
    int ident_in_thread_state;           /* the thread state's ``thread_id`` is ``get_ident()`` (checked once) */
} hot_state LINE_ALIGNED = {.fold_shift = 10, .threads_generation = 1};
#define FOLD_AT ((Py_ssize_t)1 << hot_state.fold_shift)
#if defined(__GNUC__)
_Static_assert(offsetof(__typeof__(hot_state), types) + (OF_PHASE + 1) * sizeof(PyTypeObject *) <= 64,
               "a block's entry and exit read the hot state's first line only");
#endif

/* Whether ``type`` is the class ``known`` remembers, unchanged since: 1 or 0. From Python 3.11 a change to a class
 * sets its version tag to 0, never a valid tag (what ``remember_class`` keeps), so the tag alone says it: one line of
 * the class read, where its flags are on another (each cold in a real step); 3.10 only clears the flag. */
static inline int
is_known_class(const KnownClass *known, PyTypeObject *type)
{
#if PY_VERSION_HEX >= 0x030B0000
    return type == known->type && type->tp_version_tag == known->version;
#else
    return type == known->type && (type->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) &&
           type->tp_version_tag == known->version;
#endif
}

/* Remembers ``type`` in ``known`` where it has a valid version tag (a lookup on it has just assigned one): 1, or 0
 * where it has none (then nothing is remembered). */
static int
remember_class(KnownClass *known, PyTypeObject *type)
{
    if (!(type->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) || type->tp_version_tag == 0) {
        return 0;
    }
    known->type = type;
    known->version = type->tp_version_tag;
    return 1;
}

/* ``threading.get_ident()``: read from the thread state, where a block's entry reads the thread's ``dict`` (on
 * the same cache line), rather than through ``PyThread_get_thread_ident`` and ``pthread_self``,
 * about nine lines of code and data fetched cold at each wrapped call of a real step (benchmarks/footprint.py).
 * CPython sets ``thread_id`` to that ident on the thread it runs on; ``ident_ready`` checks it once. */
static inline unsigned long
current_ident(void)
{
    return LIKELY(hot_state.ident_in_thread_state) ? PyThreadState_Get()->thread_id : PyThread_get_thread_ident();
}

/* Whether this interpreter's thread state holds ``get_ident()`` (set at the module's start). */
static void
ident_ready(void)
{
    hot_state.ident_in_thread_state = PyThreadState_Get()->thread_id == PyThread_get_thread_ident();
}

/* The class whose slot ``slot`` is (NULL before configure_slots()), and ``obj.<slot>`` read in place, borrowed
 * (NULL where not set; the caller has checked ``obj``'s type). */
#define SLOT_TYPE(slot) (hot_state.types[SLOT_OWNER(slot)])
#define SLOT_IN_PLACE(obj, slot) (*(PyObject **)((char *)(obj) + hot_state.offsets[slot]))

/* ``obj.<slot>``: a new reference, or NULL with an exception. */
static inline PyObject *
slot_get(PyObject *obj, Slot slot)
{
    if (LIKELY(Py_TYPE(obj) == SLOT_TYPE(slot))) {
        PyObject *value = SLOT_IN_PLACE(obj, slot);
        if (LIKELY(value != NULL)) {
            Py_INCREF(value);
            return value;
        }
    }
    return PyObject_GetAttr(obj, slot_names[slot]);
}

/* ``obj.<slot> = value``: 0, or -1 with an exception. */
static inline int
slot_set(PyObject *obj, Slot slot, PyObject *value)
{
    if (LIKELY(Py_TYPE(obj) == SLOT_TYPE(slot))) {
        Py_INCREF(value);
        Py_XSETREF(SLOT_IN_PLACE(obj, slot), value);
        return 0;
    }
    return PyObject_SetAttr(obj, slot_names[slot], value);
}

/* ``a + b``: two ints that fit in a long long added as such, without ``PyNumber_Add``'s dispatch through the int
 * type's number methods (about ten lines of code fetched cold at each of a step's five or six counter updates,
 * where ``int_value``, _ints.c, is already fetched by the clock's arithmetic); anything else by ``PyNumber_Add``. */
static PyObject *
add_ints(PyObject *a, PyObject *b)
{
    long long x, y;
    if (int_value(a, &x) && int_value(b, &y) && (y >= 0 ? x <= LLONG_MAX - y : x >= LLONG_MIN - y)) {
        return PyLong_FromLongLong(x + y);
    }
    return PyNumber_Add(a, b);
}

/* ``obj.<slot> += addend`` (``slot_add``) where the slot's int cannot take the sum in place. */
static COLD int
slot_add_general(PyObject *obj, Slot slot, PyObject *addend)
{
    PyObject *value = slot_get(obj, slot);
    PyObject *total = value != NULL ? add_ints(value, addend) : NULL;
    Py_XDECREF(value);
    int failed = total == NULL || slot_set(obj, slot, total) < 0;
    Py_XDECREF(total);
    return failed ? -1 : 0;
}

/* ``obj.<slot> += addend``: 0, or -1 with an exception. Where the slot's int is held by the object alone and the
 * sum has as many digits, that int takes the sum in place (``rewritten_in_place``): no int made or freed. */
static int
slot_add(PyObject *obj, Slot slot, PyObject *addend)
{
    long long before, more;
    PyObject *value = Py_TYPE(obj) == SLOT_TYPE(slot) ? SLOT_IN_PLACE(obj, slot) : NULL;
    if (LIKELY(value != NULL && compact_int_value(value, &before) && compact_int_value(addend, &more) &&
               rewritten_in_place(value, before + more))) {
        return 0;
    }
    return slot_add_general(obj, slot, addend);
}

/* ``obj.<slot> += 1``: 0, or -1 with an exception. */
static int
slot_increment(PyObject *obj, Slot slot)
{
    return slot_add(obj, slot, hot_state.one);
}

/* ``slot``'s offset on ``type``: >= 0, or -1 with an exception if it is not a writable object slot there, its own
 * or a base's (at an offset that fits ``hot_state.offsets``). */
static Py_ssize_t
find_slot(PyTypeObject *type, Slot slot)
{
    PyObject *descriptor = PyObject_GetAttr((PyObject *)type, slot_names[slot]);
    if (descriptor == NULL) {
        return -1;
    }
    Py_ssize_t offset = -1;
    if (Py_IS_TYPE(descriptor, &PyMemberDescr_Type) &&
        PyType_IsSubtype(type, ((PyMemberDescrObject *)descriptor)->d_common.d_type) && /* (or a base's) */
        ((PyMemberDescrObject *)descriptor)->d_member->type == T_OBJECT_EX &&
        ((PyMemberDescrObject *)descriptor)->d_member->offset <= UCHAR_MAX) {
        offset = ((PyMemberDescrObject *)descriptor)->d_member->offset;
    }
    Py_DECREF(descriptor);
    if (offset < 0) {
        PyErr_Format(PyExc_TypeError, "stepwatch: %s.%s is not a slot", type->tp_name, slot_text[slot]);
    }
    return offset;
}

/* Interns the slots' names (read by ``PyObject_GetAttr`` until configured) and makes ``one``; 0, or -1 with an
 * exception. */
static int
slots_ready(void)
{
    if (hot_state.one == NULL && (hot_state.one = PyLong_FromLong(1)) == NULL) {
        return -1;
    }
    for (int slot = 0; slot < SLOTS; slot++) {
        if (slot_names[slot] == NULL && (slot_names[slot] = PyUnicode_InternFromString(slot_text[slot])) == NULL) {
            return -1;
        }
    }
    return 0;
}

/* Finds ``owners``' slots from ``first`` up to ``end`` and sets them, with the owners (``owners[i]``: NULL for an
 * owner of none of them): 0, or -1 with an exception, where nothing changed. */
static int
set_slots(PyTypeObject *const *owners, int first, int end)
{
    unsigned char offsets[SLOTS];
    for (int slot = first; slot < end; slot++) {
        Py_ssize_t offset = find_slot(owners[SLOT_OWNER(slot)], (Slot)slot);
        if (offset < 0) {
            return -1;
        }
        offsets[slot] = (unsigned char)offset;
    }
    PyTypeObject *old[SLOT_OWNERS] = {NULL};
    for (int owner = SLOT_OWNER(first); owner <= SLOT_OWNER(end - 1); owner++) {
        old[owner] = hot_state.types[owner];
        Py_INCREF(owners[owner]);
        hot_state.types[owner] = owners[owner];
    }
    memcpy(hot_state.offsets + first, offsets + first, (size_t)(end - first));
    for (int owner = 0; owner < SLOT_OWNERS; owner++) {
        Py_XDECREF(old[owner]); /* last: freeing a class may run Python code */
    }
    return 0;
}

/* configure_slots(ThreadStacks, Node, Phase, LOOP, PeriodicCalls): where their hot-path slots are, and the loops'
 * frame owner. Nothing changes unless every slot is found. */
static PyObject *
configure_slots(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyType_Check(args[0]) || !PyType_Check(args[1]) || !PyType_Check(args[2]) ||
        !PyType_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "configure_slots(ThreadStacks, Node, Phase, LOOP, PeriodicCalls)");
        return NULL;
    }
    PyTypeObject *owners[SLOT_OWNERS] = {(PyTypeObject *)args[0], (PyTypeObject *)args[1], (PyTypeObject *)args[2],
                                         (PyTypeObject *)args[4], NULL};
    if (set_slots(owners, 0, SLOT_ENABLED) < 0) {
        return NULL;
    }
    Py_INCREF(args[3]);
    Py_XSETREF(hot_state.loop_owner, args[3]);
    Py_RETURN_NONE;
}

/* configure_collate(TimedCollate): where its flags and wrapped function are, read at each batch's collate in the
 * main process (``collate_samples``, _reads.c) in place of three attribute lookups. */
static PyObject *
configure_collate(PyObject *Py_UNUSED(module), PyObject *collate)
{
    if (!PyType_Check(collate)) {
        PyErr_SetString(PyExc_TypeError, "configure_collate(TimedCollate)");
        return NULL;
    }
    PyTypeObject *owners[SLOT_OWNERS] = {NULL};
    owners[OF_COLLATE] = (PyTypeObject *)collate;
    if (set_slots(owners, SLOT_ENABLED, SLOTS) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}
