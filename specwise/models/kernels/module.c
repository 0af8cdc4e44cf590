/* An empty Python module, so that the kernels' shared library is also a valid extension module; the functions are
 * called through ctypes (see __init__.py). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static struct PyModuleDef specwise_native = {PyModuleDef_HEAD_INIT, "_native", "specwise's native kernels", -1, NULL};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&specwise_native); }
