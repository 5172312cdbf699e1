/* Instances the cyclic garbage collector never walks: untracked(cls) makes every later instance of cls start out of
 * the collector's sight (broker/model/message.py says which classes and why none of them can be part of a cycle);
 * untrack(items) takes one list out of it (broker.collector.unwalked says which).
 *
 * Each instance is still freed the moment its last reference goes; the collector only stops walking it. A class
 * built by mypyc allocates through its type's tp_alloc, as a Python class does: this sets that slot to one that
 * allocates as before (PyType_GenericAlloc: zeroed, the type's reference taken) and untracks the object at once.
 * Its deallocator untracks it again, which CPython allows for an object that is not tracked. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *
untracked_alloc(PyTypeObject *type, Py_ssize_t items)
{
    PyObject *self = PyType_GenericAlloc(type, items);
    if (self != NULL)
        PyObject_GC_UnTrack(self);
    return self;
}

static PyObject *
untracked(PyObject *module, PyObject *cls)
{
    if (!PyType_Check(cls)) {
        PyErr_Format(PyExc_TypeError, "untracked() takes a class, not %.100s", Py_TYPE(cls)->tp_name);
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)cls;
    if (!PyType_IS_GC(type) || (type->tp_alloc != PyType_GenericAlloc && type->tp_alloc != untracked_alloc)) {
        PyErr_Format(PyExc_TypeError, "%.100s does not allocate its instances as the collector's containers",
                     type->tp_name);
        return NULL;
    }
    type->tp_alloc = untracked_alloc;
    Py_INCREF(cls);
    return cls;
}

static PyObject *
untrack(PyObject *module, PyObject *items)
{
    /* (a list is never tracked again by CPython itself, as a dict is when an object goes in) */
    if (!PyList_CheckExact(items)) {
        PyErr_Format(PyExc_TypeError, "untrack() takes a list, not %.100s", Py_TYPE(items)->tp_name);
        return NULL;
    }
    if (PyObject_GC_IsTracked(items))
        PyObject_GC_UnTrack(items);
    Py_INCREF(items);
    return items;
}

static PyMethodDef methods[] = {
    {"untracked", untracked, METH_O,
     "untracked(cls) -> cls: cls's later instances start untracked by the cyclic garbage collector."},
    {"untrack", untrack, METH_O,
     "untrack(items) -> items: the list untracked by the cyclic garbage collector from now on."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "untracked", NULL, 0, methods};

PyMODINIT_FUNC
PyInit_untracked(void)
{
    return PyModule_Create(&module);
}
