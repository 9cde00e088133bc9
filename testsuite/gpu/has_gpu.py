"""Exit 0 and print the GPU's name if this machine has a usable CUDA GPU
(the driver library loads, cuInit succeeds, at least one device); else
exit 1 and print why.  Used by testsuite/run.sh for make check-gpu."""
import ctypes
import sys

try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as e:
    print("no CUDA driver on this machine (%s)" % e)
    sys.exit(1)
r = cuda.cuInit(0)
if r != 0:
    print("cuInit failed with CUDA error %d" % r)
    sys.exit(1)
n = ctypes.c_int(0)
if cuda.cuDeviceGetCount(ctypes.byref(n)) != 0 or n.value < 1:
    print("no CUDA device")
    sys.exit(1)
dev = ctypes.c_int(0)
name = ctypes.create_string_buffer(256)
cuda.cuDeviceGet(ctypes.byref(dev), 0)
cuda.cuDeviceGetName(name, 256, dev)
print("%d CUDA device(s); device 0: %s" % (n.value, name.value.decode(errors="replace")))
