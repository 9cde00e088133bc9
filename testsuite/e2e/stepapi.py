"""A step.so through its C ABI (include/nova/step.h), with ctypes and numpy:
open, bind, run, eval, get, and the sizes of a step built for several."""
import ctypes
import os

import numpy as np

DTYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 5: np.int16, 6: np.int32, 7: np.int64, 9: np.bool_,
          10: np.float16, 11: np.float64}
CODES = {np.dtype(v): k for k, v in DTYPES.items()}


class Info(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("role", ctypes.c_int), ("dtype", ctypes.c_int), ("rank", ctypes.c_int),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("nbytes", ctypes.c_size_t), ("has_default", ctypes.c_int),
                ("index_bound", ctypes.c_int64)]


class StepError(Exception):
    def __init__(self, status, message):
        super().__init__("status %d: %s" % (status, message))
        self.status, self.message = status, message


class Step:
    def __init__(self, path):
        # RTLD_LOCAL: each step.so its own runtime; a copy per open, so that two steps of one file are apart
        self.lib = ctypes.CDLL(os.path.abspath(path), mode=ctypes.RTLD_LOCAL)
        L = self.lib
        L.nova_step_error.restype = ctypes.c_char_p
        L.nova_step_open.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        for f in ("nova_step_run", "nova_step_eval", "nova_step_close"):
            getattr(L, f).argtypes = [ctypes.c_void_p]
        L.nova_step_error.argtypes = [ctypes.c_void_p]
        L.nova_step_bind.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
                                     ctypes.POINTER(ctypes.c_int64), ctypes.c_void_p]
        L.nova_step_get.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p),
                                    ctypes.POINTER(Info)]
        L.nova_step_num_tensors.argtypes = [ctypes.c_void_p]
        L.nova_step_tensor.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(Info)]
        self.h = ctypes.c_void_p()
        st = L.nova_step_open(ctypes.byref(self.h))
        if st:
            raise StepError(st, "open")

    def close(self):
        if self.h:
            self.lib.nova_step_close(self.h)
            self.h = None

    def _check(self, st):
        if st:
            raise StepError(st, self.lib.nova_step_error(self.h).decode())

    def bind(self, name, arr):
        arr = np.array(arr, order="C", copy=True)  # (ascontiguousarray makes a scalar 1-d)
        shape = (ctypes.c_int64 * max(arr.ndim, 1))(*arr.shape)
        self._check(self.lib.nova_step_bind(self.h, name.encode(), CODES[arr.dtype], arr.ndim, shape,
                                            arr.ctypes.data_as(ctypes.c_void_p)))

    def run(self):
        self._check(self.lib.nova_step_run(self.h))

    def eval(self):
        self._check(self.lib.nova_step_eval(self.h))

    def get(self, name):
        p, info = ctypes.c_void_p(), Info()
        self._check(self.lib.nova_step_get(self.h, name.encode(), ctypes.byref(p), ctypes.byref(info)))
        shape = tuple(info.shape[k] for k in range(info.rank))
        dt = np.dtype(DTYPES[info.dtype])
        n = int(np.prod(shape)) if shape else 1
        buf = (ctypes.c_char * (n * dt.itemsize)).from_address(p.value) if n else b""
        return np.frombuffer(bytes(buf), dtype=dt).reshape(shape).copy()

    def tensors(self):
        out = []
        for i in range(self.lib.nova_step_num_tensors(self.h)):
            info = Info()
            self._check(self.lib.nova_step_tensor(self.h, i, ctypes.byref(info)))
            out.append((info.name.decode(), info.role, tuple(info.shape[k] for k in range(info.rank))))
        return out

    def sizes(self):
        f = self.lib.nova_step_sizes
        f.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_int64),
                      ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.POINTER(ctypes.c_int64))]
        dim, lo, hi, b = ctypes.c_char_p(), ctypes.c_int64(), ctypes.c_int64(), ctypes.POINTER(ctypes.c_int64)()
        n = f(self.h, ctypes.byref(dim), ctypes.byref(lo), ctypes.byref(hi), ctypes.byref(b))
        if not n:
            return None
        return dim.value.decode(), lo.value, hi.value, [b[k] for k in range(n)]
