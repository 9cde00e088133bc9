#!/bin/sh
# testsuite/configurator/run.sh BUILD_DIR: builds and runs the configurator
# property tests; prints 'PASS: configurator :: NAME' / 'FAIL: configurator :: NAME'.
# Always exits 0; the caller counts the lines.  A second run tests
# cfg_device_auto_gpu against a stand-in libcuda.so.1 (fake_cuda.c).
B=${1:-build}
cd "$(dirname "$0")/../.." || exit 0
mkdir -p "$B" || { echo "FAIL: configurator :: build"; exit 0; }
if ! cc -std=c11 -Wall -Wextra -Werror -Iinclude configurator/*.c \
        testsuite/configurator/test_schedules.c -lcjson -ldl -lm -o "$B/test_schedules"; then
    echo "FAIL: configurator :: build"
    exit 0
fi
echo "PASS: configurator :: build"
"$B/test_schedules" "$B" || true

case "$B" in /*) fake="$B/fake_cuda" ;; *) fake="$(pwd)/$B/fake_cuda" ;; esac
mkdir -p "$fake" && rm -f "$fake/libcuda.so.1"
if cc -std=c11 -Wall -Wextra -Werror -shared -fPIC testsuite/configurator/fake_cuda.c \
        -o "$fake/libcuda.so.1"; then
    echo "PASS: configurator :: build-fake-libcuda"
    LD_LIBRARY_PATH="$fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$B/test_schedules" --fake-cuda || true
else
    echo "FAIL: configurator :: build-fake-libcuda"
fi
exit 0
