#!/bin/sh
# bench/pack_gpu.sh [BUILD_DIR] [PACK_DIR]: prepares, on a machine with novac,
# everything bench/run_gpu.sh needs on a GPU machine that has no novac (no
# MLIR/LLVM there): every step that make check-gpu and bench/bench_gpu.py
# compile, recorded by tools/stepcache.py, plus novarun and its libraries.
#
#   sh bench/pack_gpu.sh              # -> gpu-pack/ and gpu-pack.tar.xz (~30 MB; ignored by git)
#   NOVA_PACK=gpu-pack.tar.xz sh bench/run_gpu.sh      # on the GPU machine
#
# PACK_DIR (default gpu-pack):  steps/ (the recorded compiles), bin/novarun,
# lib/ (novarun's shared libraries besides libc), device (the novac --device).
# Environment: NOVA_GPU_DEVICE (default h200) is the --device the steps are
# compiled for.  The suites run here with --gpu-sim while recording (their
# PASS/FAIL lines are the simulation's); the benchmark's runs fail here (no
# GPU) and only its compiles matter.
cd "$(dirname "$0")/.." || exit 1
B=${1:-build}
P=${2:-gpu-pack}
DEV=${NOVA_GPU_DEVICE:-h200}
[ -x "$B/bin/novac" ] && [ -x "$B/bin/novarun" ] || { echo "pack_gpu: build $B first (make)"; exit 1; }
rm -rf "$P"
mkdir -p "$P/steps" "$P/bin" "$P/lib"
P=$(cd "$P" && pwd)
echo "$DEV" > "$P/device"
export NOVA_STEP_CACHE="$P/steps" NOVA_STEP_CACHE_MODE=fill
t0=$(date +%s)
echo "pack_gpu: recording the check-gpu compiles (--device=$DEV)"
NOVA_SUITES=gpu NOVA_GPU_FLAGS="--target=cuda --device=$DEV" sh testsuite/run.sh "$B" > "$P/check_fill.log" 2>&1
grep -E '^(FAIL|TIMEOUT)' "$P/check_fill.log"
tail -n 1 "$P/check_fill.log"
echo "pack_gpu: recording the benchmark's compiles"
python3 bench/bench_gpu.py "$B" --device="$DEV" --budget 100000 --out "$P/bench_fill.md" \
  2> "$P/bench_fill.log" > /dev/null
cp "$B/bin/novarun" "$P/bin/"
ldd "$B/bin/novarun" | awk '/=> \// {print $3}' | grep -Ev '/(libc|libm|libdl|libpthread|librt)\.so' |
  while read -r lib; do cp -L "$lib" "$P/lib/"; done
n=$(find "$P/steps" -name meta.json | wc -l)
rm -f "$P.tar.xz"
(cd "$P/.." && XZ_OPT="-6 -T2" tar cJf "$P.tar.xz" "$(basename "$P")")
echo "pack_gpu: $n compiles recorded, $(du -sh "$P" | cut -f1) in $P ($(du -sh "$P.tar.xz" | cut -f1) as" \
  "$P.tar.xz), $(( $(date +%s) - t0 )) s"
