#!/bin/sh
# testsuite/cache/run.sh [BUILD_DIR]: the compile cache (--cache-dir,
# NOVAC_CACHE_DIR, --cache-max, --explain-cache): a hit gives the same step
# and manifest as a compile; --explain-cache names the part of the key that
# differs (options, graph, initializer data, device, precision policy, novac's
# build); new initializer data alone is put into the cached step; a corrupt entry is rebuilt with a warning; an unwritable cache only
# warns; the least recently used entries go past --cache-max; novac processes
# storing the same step at once leave one whole entry.
# Prints 'PASS: cache :: NAME' / 'FAIL: cache :: NAME' (with the reasons).
SUITE=cache
. "$(dirname "$0")/../driver_suite.sh"
unset NOVAC_CACHE_DIR

python3 - "$T" <<'EOF' || { fail setup "could not write the models"; exit 0; }
import sys, numpy as np, onnx
from onnx import helper as h, TensorProto as T, numpy_helper as nh
d = sys.argv[1]
def model(path, data, relu=False, seed=0):
    w = nh.from_array(np.random.default_rng(seed).standard_normal((8, 4)).astype(np.float32), "w")
    b = nh.from_array(np.zeros(4, np.float32), "b")
    nodes = [h.make_node("MatMul", ["x", "w"], ["y0"]), h.make_node("Add", ["y0", "b"], ["y1" if relu else "y"])]
    if relu:
        nodes.append(h.make_node("Relu", ["y1"], ["y"]))
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, ["batch", 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["batch", 4])], initializer=[w, b])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path, save_as_external_data=True,
              all_tensors_to_one_file=True, location=data, size_threshold=0)
model(d + "/lin.onnx", "lin.onnx.data")
model(d + "/relu.onnx", "relu.onnx.data", relu=True)
EOF
cd "$T" || exit 0
C="--cache-dir=$T/c"
run() { "$NOVAC" lin.onnx --dim=batch=2 "$@" >log 2>&1; }

# a miss stores, a hit gives the same step and manifest (but for its source name)
if run $C --explain-cache -o a.so && grep -q "cache miss .*holds no entry" log && [ -d c ] &&
  [ "$(ls c | wc -l)" = 1 ] && cp lin.onnx other.onnx && cp lin.onnx.data other.onnx.data &&
  "$NOVAC" other.onnx --dim=batch=2 $C --explain-cache -o b.so >log 2>&1 && grep -q "cache hit" log &&
  cmp -s a.so b.so && python3 -c "
import json, sys
a, b = json.load(open('a.json')), json.load(open('b.json'))
assert a['source'] == 'lin.onnx' and b['source'] == 'other.onnx', (a['source'], b['source'])
a['source'] = b['source']
sys.exit(0 if a == b else 1)"; then
  pass hit-same-step
else
  fail hit-same-step "$(cat log)" "$(ls -R c 2>&1 | head)"
fi
# the step from a hit runs, with the outputs of the step compiled without the cache
NOVARUN=$(dirname "$NOVAC")/novarun
if "$NOVAC" lin.onnx --dim=batch=2 -o ref.so >/dev/null 2>&1 &&
  "$NOVARUN" ref.so --seed 3 --outputs out_ref -q >log 2>&1 && "$NOVARUN" b.so --seed 3 --outputs out_hit -q >>log 2>&1 &&
  cmp -s out_ref/output_0.pb out_hit/output_0.pb; then
  pass hit-runs
else
  fail hit-runs "$(cat log)"
fi

# --explain-cache names the part that differs
explain() { # NAME WANT novac-args...
  name=$1 want=$2
  shift 2
  "$NOVAC" "$@" $C --explain-cache -o x.so >log 2>&1
  if grep -q "cache miss .*differs in $want\$" log; then pass "explain-$name"; else fail "explain-$name" "$(cat log)"; fi
}
explain options "options" lin.onnx --dim=batch=2 -O1
explain dims "graph, options" lin.onnx --dim=batch=4
explain graph "graph" relu.onnx --dim=batch=2
cp lin.onnx.data saved.data
python3 -c "
b = bytearray(open('lin.onnx.data', 'rb').read()); b[2] ^= 0x40; open('lin.onnx.data', 'wb').write(b)"
# new initializer data alone: the cached step with the new values put in, a new entry; it runs as the
# step compiled without the cache, the same bytes but for its build ID; then a plain hit
"$NOVAC" lin.onnx --dim=batch=2 -o fresh.so >/dev/null 2>&1
n=$(ls c | wc -l)
if "$NOVAC" lin.onnx --dim=batch=2 $C --explain-cache -o re.so >log 2>&1 && grep -q "hit .*with new initializer data" log &&
  [ "$(ls c | wc -l)" = $((n + 1)) ] && "$NOVARUN" fresh.so --seed 3 --outputs out_f -q >>log 2>&1 &&
  "$NOVARUN" re.so --seed 3 --outputs out_r -q >>log 2>&1 && cmp -s out_f/output_0.pb out_r/output_0.pb &&
  ! cmp -s out_r/output_0.pb out_ref/output_0.pb && [ "$(cmp -l fresh.so re.so | wc -l)" -le 20 ] &&
  [ "$(readelf -n fresh.so | grep 'Build ID')" != "$(readelf -n re.so | grep 'Build ID')" ] &&
  "$NOVAC" lin.onnx --dim=batch=2 $C --explain-cache -o re2.so >>log 2>&1 && grep -q "cache hit ([0-9a-f]*): " log &&
  cmp -s re.so re2.so; then
  pass data-reembedded
else
  fail data-reembedded "$(cat log)"
fi
# entries without the layout of their initial values (an older novac's): a miss, named
rm -f c/*/init
cp saved.data lin.onnx.data
python3 -c "
b = bytearray(open('lin.onnx.data', 'rb').read()); b[1] ^= 1; open('lin.onnx.data', 'wb').write(b)"
explain data "initializer data" lin.onnx --dim=batch=2
cp saved.data lin.onnx.data
"$NOVAC" lin.onnx --dim=batch=2 --target=cuda --device=h100 --gpu-sim $C -o g.so >/dev/null 2>&1
explain device "device" lin.onnx --dim=batch=2 --target=cuda --device=a100-80gb --gpu-sim
echo '{"ops": {"matmul": "low"}}' >p1.json
echo '{"ops": {"matmul": "f32"}}' >p2.json
"$NOVAC" lin.onnx --dim=batch=2 --precision=bf16 --precision-policy=p1.json $C -o p.so >/dev/null 2>&1
explain policy "precision policy" lin.onnx --dim=batch=2 --precision=bf16 --precision-policy=p2.json
# another build of novac (a copy of the executable, the same runtime)
mkdir -p nb/bin nb/lib && cp "$NOVAC" nb/bin/novac && ln -s "$(dirname "$NOVAC")/../lib/novac" nb/lib/novac
nb/bin/novac lin.onnx --dim=batch=2 $C --explain-cache -o x.so >log 2>&1
if grep -q "differs in novac (version and build)$" log; then pass explain-novac; else fail explain-novac "$(cat log)"; fi

# NOVAC_CACHE_DIR, and -MMD on a hit
if NOVAC_CACHE_DIR="$T/c" "$NOVAC" lin.onnx --dim=batch=2 --explain-cache -MMD -o e.so >log 2>&1 &&
  grep -q "cache hit" log && [ "$(head -n 1 e.d)" = "e.so: lin.onnx lin.onnx.data" ]; then
  pass env-and-deps
else
  fail env-and-deps "$(cat log)" "$(cat e.d 2>/dev/null)"
fi

# a corrupt entry: a warning, the step rebuilt, the entry replaced
entry=$(grep -l "^file step.so" c/*/meta | head -n 1)
entry=${entry%/meta}
key=$(basename "$entry")
run $C --explain-cache -o h.so
hit_entry=$(sed -n 's/.*cache hit (\([0-9a-f]*\)).*/\1/p' log)
python3 -c "
import sys
p = sys.argv[1] + '/step.so'
b = bytearray(open(p, 'rb').read()); b[len(b) // 2] ^= 0xff; open(p, 'wb').write(b)" "c/$hit_entry"
if run $C -o k.so && grep -q "warning: the compile cache's entry .*$hit_entry is corrupt (its step.so fails its checksum)" log &&
  cmp -s k.so ref.so && run $C --explain-cache -o k2.so && grep -q "cache hit" log && cmp -s k2.so ref.so; then
  pass corrupt-entry
else
  fail corrupt-entry "$(cat log)"
fi

# a cache that cannot be written: one warning, the step compiled
echo file >notadir
if run --cache-dir=notadir/c -o w.so && [ "$(grep -c warning log)" = 1 ] &&
  grep -q "compile cache notadir/c cannot be written" log && cmp -s w.so ref.so; then
  pass unwritable
else
  fail unwritable "$(cat log)"
fi

# --cache-max: the least recently used entries go
rm -rf c2
for n in 2 3 4; do
  "$NOVAC" lin.onnx --dim=batch=$n --cache-dir=c2 -o m$n.so >/dev/null 2>&1
  sleep 1
done
"$NOVAC" lin.onnx --dim=batch=2 --cache-dir=c2 -o m2b.so >/dev/null 2>&1 # batch 2 used again: the newest
sleep 1
one=$(du -sb c2/* | head -n 1 | cut -f1)
"$NOVAC" lin.onnx --dim=batch=5 --cache-dir=c2 --cache-max=$((one * 2 + one / 2)) -o m5.so >/dev/null 2>&1
left=$(ls c2 | wc -l)
if [ "$left" = 2 ] && "$NOVAC" lin.onnx --dim=batch=2 --cache-dir=c2 --explain-cache -o m.so >log 2>&1 &&
  grep -q "cache hit" log && "$NOVAC" lin.onnx --dim=batch=3 --cache-dir=c2 --explain-cache -o m.so >log 2>&1 &&
  grep -q "cache miss" log; then
  pass cache-max-lru
else
  fail cache-max-lru "entries left: $left" "$(cat log)"
fi
"$NOVAC" lin.onnx --cache-max=lots >log 2>&1
rc=$?
if [ $rc = 2 ] && grep -q "cache-max takes a size" log; then pass cache-max-usage; else fail cache-max-usage "exit $rc" "$(cat log)"; fi

# a temporary folder a killed novac left is removed by a later store once an hour old
mkdir -p c/.tmp.old1 c/.tmp.new1 && touch c/.tmp.old1/step.so && touch -d '2 hours ago' c/.tmp.old1 &&
  "$NOVAC" lin.onnx --dim=batch=9 $C -o t.so >/dev/null 2>&1
if [ ! -e c/.tmp.old1 ] && [ -d c/.tmp.new1 ]; then pass sweep-temporaries; else fail sweep-temporaries "$(ls -A c)"; fi

# four novac processes storing the same step at once: one whole entry, no temporaries
rm -rf c3
for n in 1 2 3 4; do "$NOVAC" lin.onnx --dim=batch=7 --cache-dir=c3 -o p$n.so >log$n 2>&1 & done
wait
if [ "$(ls c3 | wc -l)" = 1 ] && [ -z "$(ls -A c3 | grep '^\.tmp')" ] && cmp -s p1.so p2.so && cmp -s p1.so p4.so &&
  "$NOVAC" lin.onnx --dim=batch=7 --cache-dir=c3 --explain-cache -o p5.so >log 2>&1 && grep -q "cache hit" log &&
  cmp -s p1.so p5.so; then
  pass concurrent
else
  fail concurrent "$(ls -A c3)" "$(cat log log1 log2)"
fi
