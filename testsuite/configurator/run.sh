#!/bin/sh
# testsuite/configurator/run.sh BUILD_DIR: builds and runs the configurator
# property tests; prints 'PASS: configurator :: NAME' / 'FAIL: configurator :: NAME'.
# Always exits 0; the caller counts the lines.
B=${1:-build}
cd "$(dirname "$0")/../.." || exit 0
mkdir -p "$B" || { echo "FAIL: configurator :: build"; exit 0; }
if ! cc -std=c11 -Wall -Wextra -Werror -Iinclude configurator/*.c \
        testsuite/configurator/test_schedules.c -lcjson -lm -o "$B/test_schedules"; then
    echo "FAIL: configurator :: build"
    exit 0
fi
echo "PASS: configurator :: build"
"$B/test_schedules" "$B" || true
exit 0
