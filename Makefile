# novac: GNU Make build.  `make` builds build/bin/{novac,novarun} and the
# runtime a step.so links in; `make demo`, `make check`, `make install`.
LLVM_CONFIG ?= $(shell command -v llvm-config-22 2>/dev/null || echo /usr/lib/llvm-22/bin/llvm-config)
LLVM_BIN    := $(shell $(LLVM_CONFIG) --bindir 2>/dev/null)
LLVM_INC    := $(shell $(LLVM_CONFIG) --includedir 2>/dev/null)
LLVM_LIB    := $(shell $(LLVM_CONFIG) --libdir 2>/dev/null)
PROTOC_C    ?= protoc-c
ONNX_PROTO  ?= /usr/include/onnx/onnx.proto
PREFIX      ?= /usr/local
B           := build
VERSION     := $(shell cat VERSION)

CC      ?= cc
WERROR  ?= $(if $(CI),-Werror,)
SAN     ?=
CFLAGS  ?= -O2 -g
WARN    := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wpedantic -Wshadow -Wmissing-prototypes $(WERROR)
CPPFLAGS_ALL := -Iinclude -Iruntime -I$(B)/gen -DNOVAC_VERSION='"$(VERSION)"'
ALLCFLAGS = $(WARN) $(CFLAGS) $(SAN) $(CPPFLAGS_ALL)

MLIR_LIBS := -lMLIRCAPIRegisterEverything -lMLIRCAPITransforms -lMLIRCAPITarget -lMLIRCAPIIRDL \
  -lMLIRCAPIConversion -lMLIRCAPIGPU -lMLIRCAPILinalg -lMLIRCAPITensor -lMLIRCAPIArith -lMLIRCAPIMath \
  -lMLIRCAPIFunc -lMLIRCAPILLVM -lMLIRCAPITransformDialect -lMLIRCAPITransformDialectTransforms -lMLIRCAPIIR \
  -lMLIR -lLLVM -lstdc++
NOVAC_LDLIBS := -L$(LLVM_LIB) $(MLIR_LIBS) -Wl,-rpath,$(LLVM_LIB) -lcjson -lprotobuf-c -lm -lpthread -ldl

NOVAC_SRC  := $(wildcard driver/novac*.c driver/pipeline.c driver/memreport.c support/diag.c support/util.c support/json.c frontend/*.c passes/*.c codegen/*.c configurator/*.c)
NOVARUN_SRC := $(wildcard driver/novarun*.c driver/tensor_pb.c support/util.c support/json.c)
RT_SRC     := $(wildcard runtime/*.c)
GEN_ONNX   := $(B)/gen/onnx.pb-c.c

NOVAC_OBJ   := $(NOVAC_SRC:%.c=$(B)/obj/%.o) $(B)/obj/gen/onnx.pb-c.o
NOVARUN_OBJ := $(NOVARUN_SRC:%.c=$(B)/obj/%.o) $(B)/obj/gen/onnx.pb-c.o
RT_OBJ      := $(RT_SRC:%.c=$(B)/rtobj/%.o)

BIN_NOVAC   := $(B)/bin/novac
BIN_NOVARUN := $(B)/bin/novarun
RT_DIR      := $(B)/lib/novac
RT_LIB      := $(RT_DIR)/libnovart.a
RT_HDRS     := $(RT_DIR)/include/nova/step.h $(RT_DIR)/include/rt_graph.h
# the LD_PRELOAD fault-injection shim of testsuite/faults (not installed)
FAULT_LIB   := $(B)/lib/libnvfault.so

.PHONY: check-all check-tsan check-asan-fast all deps check-deps demo check check-gpu check-asan check-lit check-e2e check-bad check-unit check-onnx fuzz fuzz-onnx fuzz-nova fuzz-st fuzz-pb install clean
all: check-deps $(BIN_NOVAC) $(BIN_NOVARUN) $(RT_LIB) $(RT_HDRS) $(FAULT_LIB)

# ---- dependencies -------------------------------------------------------
APT_PKGS := libmlir-22-dev mlir-22-tools llvm-22-dev llvm-22-tools libprotobuf-c-dev \
  protobuf-c-compiler libcjson-dev libonnx-dev gcc make python3 python3-pip openmpi-bin
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
deps:
	$(SUDO) apt-get update
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y --no-install-recommends $(APT_PKGS)
	python3 -c 'import numpy, onnx' 2>/dev/null || python3 -m pip install numpy onnx || \
	  python3 -m pip install --break-system-packages numpy onnx

check-deps:
	@sh tools/check-deps.sh "$(LLVM_CONFIG)" "$(PROTOC_C)" "$(ONNX_PROTO)"

# Installs what is missing, quietly when nothing is.
deps-auto:
	@sh tools/check-deps.sh "$(LLVM_CONFIG)" "$(PROTOC_C)" "$(ONNX_PROTO)" --quiet --tests || $(MAKE) --no-print-directory deps

# ---- build --------------------------------------------------------------
$(B)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) -I$(LLVM_INC) -MMD -MP -c $< -o $@

$(B)/obj/gen/onnx.pb-c.o: $(GEN_ONNX)
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 $(SAN) -I$(B)/gen -c $< -o $@

$(GEN_ONNX): $(ONNX_PROTO)
	@mkdir -p $(B)/gen
	cp $(ONNX_PROTO) $(B)/gen/onnx.proto
	cd $(B)/gen && $(PROTOC_C) --c_out=. onnx.proto

$(B)/obj/driver/novarun.o $(B)/obj/driver/tensor_pb.o $(B)/obj/frontend/onnx.o $(B)/obj/frontend/onnx_ops.o \
  $(B)/obj/frontend/onnx_fold.o $(B)/obj/driver/novac.o: $(GEN_ONNX)

# A sanitized runtime needs the sanitizer's runtime where a step links it:
# novac passes this build's -fsanitize= flag to that link.
RT_SANITIZE := $(firstword $(filter -fsanitize=%,$(SAN)))
$(B)/obj/codegen/step.o: ALLCFLAGS += -DNOVA_RT_SANITIZE='"$(RT_SANITIZE)"'

$(B)/rtobj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(WARN) -O2 -fPIC -fvisibility=hidden $(SAN) $(CPPFLAGS_ALL) -MMD -MP -c $< -o $@

$(BIN_NOVAC): $(NOVAC_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(SAN) $^ -o $@ $(NOVAC_LDLIBS)

$(BIN_NOVARUN): $(NOVARUN_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(SAN) $^ -o $@ -lcjson -lprotobuf-c -ldl -lm

$(RT_LIB): $(RT_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(RT_DIR)/include/nova/step.h: include/nova/step.h
	@mkdir -p $(dir $@)
	cp $< $@
$(RT_DIR)/include/rt_graph.h: runtime/rt_graph.h
	@mkdir -p $(dir $@)
	cp $< $@

# gnu11 without -Wpedantic: dlsym's object pointer becomes a function pointer
$(FAULT_LIB): testsuite/faults/faultinject.c
	@mkdir -p $(dir $@)
	$(CC) -std=gnu11 -Wall -Wextra -Wshadow -Wmissing-prototypes $(WERROR) -O2 -g -fPIC -shared $< -o $@ -ldl

-include $(NOVAC_OBJ:.o=.d) $(NOVARUN_OBJ:.o=.d) $(RT_OBJ:.o=.d)

# ---- demo and tests -----------------------------------------------------
demo: deps-auto
	@$(MAKE) --no-print-directory all
	@sh examples/demo.sh $(B)

check: deps-auto
	@$(MAKE) --no-print-directory all
	@sh testsuite/run.sh $(B)

# make check with its long variants whole (the zoo under --memory-limit: every model).
check-all: deps-auto
	@$(MAKE) --no-print-directory all
	@NOVA_CHECK_ALL=1 sh testsuite/run.sh $(B)

# The numeric suites on this machine's GPU (--target=cuda --device=auto);
# prints a skip message and passes where there is no GPU.
check-gpu: deps-auto
	@$(MAKE) --no-print-directory all
	@NOVA_SUITES=gpu sh testsuite/run.sh $(B)

check-asan:
	@$(MAKE) --no-print-directory B=build-asan SAN='-fsanitize=address,undefined -fno-omit-frame-pointer' all
	@ASAN_OPTIONS=detect_leaks=1 sh testsuite/run.sh build-asan

# CI's sanitizer pass: the fast suites (NOVA_SUITES=fast in testsuite/run.sh)
# against the ASan+UBSan build
check-asan-fast:
	@$(MAKE) --no-print-directory B=build-asan SAN='-fsanitize=address,undefined -fno-omit-frame-pointer' all
	@ASAN_OPTIONS=detect_leaks=1 NOVA_SUITES=fast sh testsuite/run.sh build-asan

# the runtime (thread pool, step handles) and novarun under ThreadSanitizer:
# testsuite/runtime's tests, a report failing the test that made it
check-tsan:
	@$(MAKE) --no-print-directory B=build-tsan SAN='-fsanitize=thread' build-tsan/lib/novac/libnovart.a build-tsan/bin/novarun
	@TSAN_OPTIONS=halt_on_error=1:exitcode=66 sh testsuite/runtime/run.sh build-tsan > build-tsan/runtime.log 2>&1; \
	  cat build-tsan/runtime.log; echo; \
	  echo "$$(grep -c '^PASS: ' build-tsan/runtime.log) passed, $$(grep -c '^FAIL: ' build-tsan/runtime.log) failed"; \
	  ! grep -q '^FAIL: ' build-tsan/runtime.log

# The whole ONNX backend node suite (conformance.py --all); writes the report.
check-onnx: all
	python3 testsuite/onnx/conformance.py --all --build $(B) --write-md testsuite/onnx/CONFORMANCE.md

# libFuzzer harness for the ONNX loader (needs clang); links only what
# fe_parse_onnx needs.  Run: build-fuzz/fuzz_onnx -max_len=65536 DIR testsuite/fuzz/corpus_onnx
FUZZ_ONNX_SRC := testsuite/fuzz/fuzz_onnx.c frontend/graph.c frontend/onnx.c frontend/onnx_ops.c frontend/onnx_math.c frontend/onnx_index.c frontend/onnx_eval.c frontend/onnx_nn.c frontend/onnx_resize.c frontend/onnx_einsum.c frontend/onnx_rnn.c frontend/onnx_dft.c frontend/onnx_seq.c frontend/onnx_qlinear.c \
  frontend/onnx_fold.c frontend/onnx_roles.c frontend/onnx_wire.c support/diag.c support/util.c $(GEN_ONNX)
fuzz-onnx: build-fuzz/fuzz_onnx
build-fuzz/fuzz_onnx: $(FUZZ_ONNX_SRC) $(wildcard frontend/*.h driver/*.h)
	@mkdir -p $(dir $@)
	clang -fsanitize=fuzzer,address,undefined -g -O1 -std=c11 -D_GNU_SOURCE $(CPPFLAGS_ALL) \
	  $(FUZZ_ONNX_SRC) -o $@ -lprotobuf-c -lm

# The other parsers' harnesses, built the same way (testsuite/fuzz/README.md):
# the .nova text parser, novarun's safetensors reader, its TensorProto reader.
FUZZ_CC := clang -fsanitize=fuzzer,address,undefined -g -O1 -std=c11 -D_GNU_SOURCE $(CPPFLAGS_ALL)
FUZZ_NOVA_SRC := testsuite/fuzz/fuzz_nova.c frontend/text.c frontend/graph.c support/diag.c support/util.c
FUZZ_ST_SRC := testsuite/fuzz/fuzz_st.c driver/novarun_st.c support/json.c support/util.c
FUZZ_PB_SRC := testsuite/fuzz/fuzz_pb.c driver/tensor_pb.c support/util.c $(GEN_ONNX)
fuzz: fuzz-onnx fuzz-nova fuzz-st fuzz-pb
fuzz-nova: build-fuzz/fuzz_nova
fuzz-st: build-fuzz/fuzz_st
fuzz-pb: build-fuzz/fuzz_pb
build-fuzz/fuzz_nova: $(FUZZ_NOVA_SRC) $(wildcard frontend/*.h driver/*.h)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_NOVA_SRC) -o $@ -lm
build-fuzz/fuzz_st: $(FUZZ_ST_SRC) $(wildcard driver/*.h runtime/*.h)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_ST_SRC) -o $@ -lcjson -lm
build-fuzz/fuzz_pb: $(FUZZ_PB_SRC) $(wildcard driver/*.h runtime/*.h)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_PB_SRC) -o $@ -lprotobuf-c -lm

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/novac/include/nova \
	  $(DESTDIR)$(PREFIX)/include/nova $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/man/man5
	install -m 755 $(BIN_NOVAC) $(BIN_NOVARUN) $(DESTDIR)$(PREFIX)/bin/
	install -m 644 $(RT_LIB) $(DESTDIR)$(PREFIX)/lib/novac/
	install -m 644 runtime/rt_graph.h $(DESTDIR)$(PREFIX)/lib/novac/include/
	install -m 644 include/nova/step.h $(DESTDIR)$(PREFIX)/lib/novac/include/nova/
	install -m 644 include/nova/step.h $(DESTDIR)$(PREFIX)/include/nova/
	install -m 644 man/novac.1 man/novarun.1 $(DESTDIR)$(PREFIX)/share/man/man1/
	install -m 644 man/novac-manifest.5 man/nova-format.5 $(DESTDIR)$(PREFIX)/share/man/man5/

clean:
	rm -rf build build-asan
