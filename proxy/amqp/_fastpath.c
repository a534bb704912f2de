/* The proxy hop's per-message calls into proton, made from C (issue #19).

   How this works. python-qpid-proton reaches proton's C functions through cffi,
   and every such call converts its arguments and releases and takes back the
   GIL: about 0.2 us each, some 35 of them per proxied message. This module makes
   the calls that come in fixed runs, for every message, in one call from Python:

   - pump(): the event loop of a collector (proxy.amqp.engine's EventPump and
     SharedEventPump). Per event it peeks, asks for the delivery, its link and
     (when it is not a delivery event) the type and connection, calls the
     Python owner, and pops: four to six calls into proton, now none from Python.
   - relay(): a complete delivery moved from a receiver link to a sender link
     as a new delivery (engine.relay_transfer's common case): partial?, aborted?,
     pending, recv, advance, new delivery, send, advance. relay_kept() does the
     same and also returns the bytes (a client's unsettled send, kept for a replay).
   - settle_accepted(): a delivery its peer accepted settled, and the other
     delivery of its pair (the other side of the proxy) accepted and settled.

   It holds the GIL throughout: proton is called from the one event-loop thread
   of a node process and each call is short.

   Pointers stay cffi objects of python-qpid-proton's own types (made and read
   with the conversion functions that cffi gives every compiled cffi module,
   its "_C_API" capsule), so Python code keys its tables and calls proton with
   them as before. proton's functions are reached through their addresses in
   python-qpid-proton's module (setup() gets them from cffi): nothing here links
   against proton, so the module builds without proton's headers or library.

   Optional: proxy.amqp.engine falls back to its Python code when this module is
   not built (pyproject.toml: an optional extension) or FEDGATE_NO_FASTPATH is set. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define PN_EOS (-1)
#define PN_ACCEPTED 0x24  /* the accepted outcome's descriptor code (AMQP 1.0 §3.4.2) */
#define READ_SIZE (64 * 1024)

typedef struct {
    size_t size;
    const char *start;
} delivery_tag;  /* pn_delivery_tag_t, passed by value */

/* proton's functions, as their addresses (setup) */
static void *(*collector_peek)(void *);
static bool (*collector_pop)(void *);
static void *(*event_delivery)(void *);
static void *(*event_connection)(void *);
static int (*event_type)(void *);
static void *(*delivery_link)(void *);
static bool (*delivery_partial)(void *);
static bool (*delivery_aborted)(void *);
static size_t (*delivery_pending)(void *);
static ssize_t (*link_recv)(void *, char *, size_t);
static bool (*link_advance)(void *);
static void *(*new_delivery)(void *, delivery_tag);
static ssize_t (*link_send)(void *, const char *, size_t);
static uint64_t (*delivery_remote_state)(void *);
static void (*delivery_update)(void *, uint64_t);
static void (*delivery_settle)(void *);
static void *(*link_current)(void *);

/* cffi's conversions (its _C_API table: the entries _cffi_include.h numbers 10 and 11) */
static PyObject *(*from_pointer)(char *, PyObject *);
static char *(*to_pointer)(PyObject *, PyObject *);

/* python-qpid-proton's ctypes for the pointers we make and read */
static PyObject *ct_collector, *ct_event, *ct_delivery, *ct_link, *ct_connection;
static PyObject *partial_sizes;  /* engine._partial_sizes: relay() leaves links listed there to Python */
static PyObject *late_links;     /* engine.late_links: while not empty, relay() leaves all to Python */
static PyObject *slow;           /* relay()'s answer when Python must do it */
static PyObject *on_event_name;  /* "on_event" */
static char read_buffer[READ_SIZE];
static bool ready;

#define N_FUNCTIONS 17
#define N_CTYPES 5

static PyObject *
setup(PyObject *self, PyObject *args)
{
    PyObject *capsule, *functions, *ctypes, *sizes, *answer, *late;
    if (!PyArg_ParseTuple(args, "OO!O!O!OO!", &capsule, &PyTuple_Type, &functions, &PyTuple_Type,
                          &ctypes, &PyDict_Type, &sizes, &answer, &PyDict_Type, &late))
        return NULL;
    void **exports = PyCapsule_GetPointer(capsule, "cffi");
    if (exports == NULL)
        return NULL;
    if (PyTuple_GET_SIZE(functions) != N_FUNCTIONS || PyTuple_GET_SIZE(ctypes) != N_CTYPES) {
        PyErr_SetString(PyExc_ValueError, "setup: wrong number of functions or ctypes");
        return NULL;
    }
    void *addresses[N_FUNCTIONS];
    for (Py_ssize_t i = 0; i < N_FUNCTIONS; i++) {
        addresses[i] = PyLong_AsVoidPtr(PyTuple_GET_ITEM(functions, i));
        if (addresses[i] == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "setup: a null function address");
            return NULL;
        }
    }
    if (on_event_name == NULL && (on_event_name = PyUnicode_InternFromString("on_event")) == NULL)
        return NULL;
    collector_peek = addresses[0];
    collector_pop = addresses[1];
    event_delivery = addresses[2];
    event_connection = addresses[3];
    event_type = addresses[4];
    delivery_link = addresses[5];
    delivery_partial = addresses[6];
    delivery_aborted = addresses[7];
    delivery_pending = addresses[8];
    link_recv = addresses[9];
    link_advance = addresses[10];
    new_delivery = addresses[11];
    link_send = addresses[12];
    delivery_remote_state = addresses[13];
    delivery_update = addresses[14];
    delivery_settle = addresses[15];
    link_current = addresses[16];
    from_pointer = exports[10];
    to_pointer = exports[11];
    Py_INCREF(ctypes);  /* kept for the process's life, with what it holds */
    ct_collector = PyTuple_GET_ITEM(ctypes, 0);
    ct_event = PyTuple_GET_ITEM(ctypes, 1);
    ct_delivery = PyTuple_GET_ITEM(ctypes, 2);
    ct_link = PyTuple_GET_ITEM(ctypes, 3);
    ct_connection = PyTuple_GET_ITEM(ctypes, 4);
    Py_INCREF(sizes);
    partial_sizes = sizes;
    Py_INCREF(late);
    late_links = late;
    Py_INCREF(answer);
    slow = answer;
    ready = true;
    Py_RETURN_NONE;
}

static bool
check_ready(void)
{
    if (!ready)
        PyErr_SetString(PyExc_RuntimeError, "proxy.amqp._fastpath: setup() was not called");
    return ready;
}

/* ``table[pointer]`` (borrowed), the pointer made a cffi object of ``ctype``; NULL when
   absent or on an error (then set). */
static PyObject *
lookup(PyObject *table, void *pointer, PyObject *ctype)
{
    PyObject *key = from_pointer(pointer, ctype);
    if (key == NULL)
        return NULL;
    PyObject *value = PyDict_GetItemWithError(table, key);
    Py_DECREF(key);
    return value;
}

/* ``target.name(arg)`` for a pointer ``arg`` of ``ctype``: 0, or -1 with an exception set. */
static int
call_with_pointer(PyObject *target, PyObject *name, void *arg, PyObject *ctype)
{
    PyObject *object = from_pointer(arg, ctype);
    if (object == NULL)
        return -1;
    Py_INCREF(target);  /* the call may take it out of its table */
    PyObject *result = PyObject_CallMethodOneArg(target, name, object);
    Py_DECREF(target);
    Py_DECREF(object);
    if (result == NULL)
        return -1;
    Py_DECREF(result);
    return 0;
}

/* One event to Python: a delivery event of a link in ``links`` to its owner's ``method``
   (the delivery as argument), any other event to ``handler.on_event(type, event)``, the
   handler being ``handlers[event's connection]`` (dropped if absent) when ``handlers`` is
   not None. 0, or -1 with an exception set. */
static int
dispatch(void *event, PyObject *links, PyObject *method, PyObject *handlers, PyObject *handler)
{
    void *delivery = event_delivery(event);  /* only a delivery event has one (pn_work_update) */
    if (delivery != NULL && links != Py_None) {
        PyObject *owner = lookup(links, delivery_link(delivery), ct_link);
        if (owner != NULL)
            return call_with_pointer(owner, method, delivery, ct_delivery);
        if (PyErr_Occurred())
            return -1;
    }
    if (handlers != Py_None) {
        handler = lookup(handlers, event_connection(event), ct_connection);
        if (handler == NULL)
            return PyErr_Occurred() ? -1 : 0;  /* a connection that has left */
    }
    PyObject *type = PyLong_FromLong(event_type(event));
    if (type == NULL)
        return -1;
    PyObject *object = from_pointer(event, ct_event);
    if (object == NULL) {
        Py_DECREF(type);
        return -1;
    }
    Py_INCREF(handler);
    PyObject *call_args[3] = {handler, type, object};
    PyObject *result = PyObject_VectorcallMethod(on_event_name, call_args,
                                                 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(handler);
    Py_DECREF(type);
    Py_DECREF(object);
    if (result == NULL)
        return -1;
    Py_DECREF(result);
    return 0;
}

/* pump(collector, links, method, handlers, handler): every event of ``collector`` to
   Python (dispatch above), each popped after its call, also when the call raised (the
   exception then ends the run). ``links``: link -> owner, or None; ``method``: the
   owner's method for a delivery (a str); ``handlers``: connection -> handler, or None
   for the one ``handler``. */
static PyObject *
pump(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "pump() takes 5 arguments");
        return NULL;
    }
    if (!check_ready())
        return NULL;
    PyObject *links = args[1], *method = args[2], *handlers = args[3], *handler = args[4];
    if ((links != Py_None && !PyDict_Check(links)) || (handlers != Py_None && !PyDict_Check(handlers))
        || !PyUnicode_Check(method)) {
        PyErr_SetString(PyExc_TypeError, "pump(): links and handlers are dicts or None, method a str");
        return NULL;
    }
    void *collector = to_pointer(args[0], ct_collector);
    if (collector == NULL && PyErr_Occurred())
        return NULL;
    void *event;
    while ((event = collector_peek(collector)) != NULL) {
        int failed = dispatch(event, links, method, handlers, handler);
        collector_pop(collector);
        if (failed)
            return NULL;
    }
    Py_RETURN_NONE;
}

/* Reads the complete ``delivery``, current on receiver ``link``, into the read buffer
   and advances past it: its size, or -1 when engine.relay_transfer must do it in Python
   (nothing read): a partial or aborted delivery, one larger than the buffer or than
   ``max_size`` (0: no limit), and any while a partial transfer is being counted. */
static ssize_t
take(void *link, void *delivery, long long max_size)
{
    if (PyDict_GET_SIZE(partial_sizes) || PyDict_GET_SIZE(late_links))
        return -1;
    /* a delivery event for one that is not current is the peer's disposition (issue #41):
       reading would take the current delivery's bytes as its own */
    if (link_current(link) != delivery)
        return -1;
    if (delivery_partial(delivery) || delivery_aborted(delivery))
        return -1;
    size_t pending = delivery_pending(delivery);
    if (pending >= READ_SIZE || (max_size > 0 && pending > (size_t)max_size))
        return -1;
    ssize_t received = link_recv(link, read_buffer, READ_SIZE);
    if (received == PN_EOS)
        received = 0;  /* complete and empty */
    else if (received < 0)  /* not a current, complete delivery: nothing was read */
        return -1;
    link_advance(link);
    return received;
}

/* The read buffer's first ``size`` bytes sent on ``target`` as a new complete delivery
   tagged with the decimal digits of ``tag``. */
static void *
put(void *target, long long tag, ssize_t size)
{
    char digits[24];
    int length = snprintf(digits, sizeof digits, "%lld", tag);
    delivery_tag out_tag = {(size_t)length, digits};  /* proton copies the tag */
    void *out = new_delivery(target, out_tag);
    link_send(target, read_buffer, (size_t)size);
    link_advance(target);
    return out;
}

/* relay()'s and relay_kept()'s arguments: 0, or -1 with an exception set. */
static int
relay_arguments(PyObject *const *args, Py_ssize_t nargs, void **link, void **delivery, void **target,
                long long *tag, long long *max_size)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "relay() and relay_kept() take 5 arguments");
        return -1;
    }
    if (!check_ready())
        return -1;
    *link = to_pointer(args[0], ct_link);
    *delivery = to_pointer(args[1], ct_delivery);
    *target = to_pointer(args[2], ct_link);
    if (PyErr_Occurred())
        return -1;
    *tag = PyLong_AsLongLong(args[3]);
    *max_size = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred())
        return -1;
    if (*link == NULL || *delivery == NULL || *target == NULL) {
        PyErr_SetString(PyExc_ValueError, "relay(): a null link or delivery");
        return -1;
    }
    return 0;
}

/* relay() and relay_kept(): the new delivery, with ``keep`` (the message's bytes, it). */
static PyObject *
relay_one(PyObject *const *args, Py_ssize_t nargs, bool keep)
{
    void *link, *delivery, *target;
    long long tag, max_size;
    if (relay_arguments(args, nargs, &link, &delivery, &target, &tag, &max_size))
        return NULL;
    ssize_t size = take(link, delivery, max_size);
    if (size < 0)
        return Py_NewRef(slow);
    PyObject *payload = NULL;
    if (keep && (payload = PyBytes_FromStringAndSize(read_buffer, size)) == NULL)
        return NULL;  /* read, not sent: the caller ends the link (as for any exception) */
    PyObject *out = from_pointer(put(target, tag, size), ct_delivery);
    if (!keep || out == NULL) {
        Py_XDECREF(payload);
        return out;
    }
    PyObject *pair = PyTuple_Pack(2, payload, out);
    Py_DECREF(payload);
    Py_DECREF(out);
    return pair;
}

/* relay(link, delivery, target, tag, max_size): the complete ``delivery``, current on
   receiver ``link``, sent on sender ``target`` as a new delivery tagged with the decimal
   digits of the int ``tag``; returns the new delivery, or ``slow`` (nothing read, see
   take()). */
static PyObject *
relay(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return relay_one(args, nargs, false);
}

/* relay_kept(...): as relay(), returning (the message's bytes, the new delivery). */
static PyObject *
relay_kept(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return relay_one(args, nargs, true);
}

/* settle_accepted(delivery, other): False if ``delivery``'s peer did not accept it;
   otherwise ``other`` (a delivery, or None) is accepted and settled, ``delivery``
   settled, and True returned (§3.4: the outcome passed on, then both settled). */
static PyObject *
settle_accepted(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "settle_accepted() takes 2 arguments");
        return NULL;
    }
    if (!check_ready())
        return NULL;
    void *delivery = to_pointer(args[0], ct_delivery);
    void *other = args[1] == Py_None ? NULL : to_pointer(args[1], ct_delivery);
    if (PyErr_Occurred())
        return NULL;
    if (delivery == NULL) {
        PyErr_SetString(PyExc_ValueError, "settle_accepted(): a null delivery");
        return NULL;
    }
    if (delivery_remote_state(delivery) != PN_ACCEPTED)
        Py_RETURN_FALSE;
    if (other != NULL) {
        delivery_update(other, PN_ACCEPTED);
        delivery_settle(other);
    }
    delivery_settle(delivery);
    Py_RETURN_TRUE;
}

/* roundtrip(collector): the same pointer made back into a cffi object, for proxy.amqp.fastpath
   to check at load that cffi's conversions are the ones this module expects. */
static PyObject *
roundtrip(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "roundtrip() takes 1 argument");
        return NULL;
    }
    if (!check_ready())
        return NULL;
    void *pointer = to_pointer(args[0], ct_collector);
    if (pointer == NULL && PyErr_Occurred())
        return NULL;
    return from_pointer(pointer, ct_collector);
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS,
     "setup(cffi_capsule, function_addresses, ctypes, partial_sizes, slow, late_links)"},
    {"pump", (PyCFunction)(void (*)(void))pump, METH_FASTCALL,
     "pump(collector, links, method, handlers, handler): run a collector's events"},
    {"relay", (PyCFunction)(void (*)(void))relay, METH_FASTCALL,
     "relay(link, delivery, target, tag, max_size): move a complete delivery to another link"},
    {"relay_kept", (PyCFunction)(void (*)(void))relay_kept, METH_FASTCALL,
     "relay_kept(link, delivery, target, tag, max_size): relay(), returning (bytes, delivery)"},
    {"settle_accepted", (PyCFunction)(void (*)(void))settle_accepted, METH_FASTCALL,
     "settle_accepted(delivery, other): settle an accepted delivery and accept its pair"},
    {"roundtrip", (PyCFunction)(void (*)(void))roundtrip, METH_FASTCALL,
     "roundtrip(collector): the pointer converted to C and back (a load-time check)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastpath",
    "The proxy hop's per-message calls into proton, made from C (see proxy.amqp.engine).", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__fastpath(void)
{
    return PyModule_Create(&module);
}
