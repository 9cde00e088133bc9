# lit configuration for novac's IR and driver tests.
import os
import subprocess

import lit.formats

config.name = "novac"
config.test_format = lit.formats.ShTest(execute_external=True)
config.suffixes = [".nova", ".test"]
config.excludes = ["Inputs"]
config.test_source_root = os.path.dirname(__file__)

root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
build = os.path.abspath(os.path.join(root, os.environ.get("NOVA_BUILD", "build")))
llvm_bin = subprocess.run(["llvm-config-22", "--bindir"], capture_output=True, text=True).stdout.strip() \
    or "/usr/lib/llvm-22/bin"

config.test_exec_root = os.path.join(build, "lit")
config.substitutions.append(("%novac", os.path.join(build, "bin", "novac")))
config.substitutions.append(("%novarun", os.path.join(build, "bin", "novarun")))
config.substitutions.append(("%examples", os.path.join(root, "examples")))
# a step.so built by a sanitizer build links an instrumented runtime
config.substitutions.append(("%sancflags", "-fsanitize=address,undefined" if "asan" in os.path.basename(build) else ""))
config.substitutions.append(("%mlir-opt", os.path.join(llvm_bin, "mlir-opt")))
config.environment["PATH"] = llvm_bin + os.pathsep + config.environment.get("PATH", os.environ["PATH"])
for var in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "HOME", "TMPDIR"):
    if var in os.environ:
        config.environment[var] = os.environ[var]
