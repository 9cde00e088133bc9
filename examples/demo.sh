#!/bin/sh
# make demo: compile the bundled examples and run them with novarun.
set -e
B=${1:-build}
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "== $($B/bin/novac --version)"
echo
echo "== examples/mlp.nova in the nova dialect (novac --emit=nova):"
$B/bin/novac examples/mlp.nova --dim=batch=8 --emit=nova
echo "== compile it to a step (novac examples/mlp.nova --dim=batch=8 -o mlp.so --time-passes):"
$B/bin/novac examples/mlp.nova --dim=batch=8 -o "$out/mlp.so" --time-passes
echo
echo "== run it on examples/data/mlp (novarun mlp.so --inputs examples/data/mlp --print):"
$B/bin/novarun "$out/mlp.so" --inputs examples/data/mlp --print --repeat 20
echo
echo "== the transformer block (novac examples/transformer_block.nova --dim=batch=2):"
$B/bin/novac examples/transformer_block.nova --dim=batch=2 -o "$out/tb.so" --time-passes
$B/bin/novarun "$out/tb.so" --inputs examples/data/transformer_block --print --repeat 20
echo
echo "== training: the MLP's forward, backward and AdamW update compiled as one step"
echo "   (novac examples/mlp.nova --dim=batch=8 --train --optimizer=adamw --lr=0.001 -o mlp_train.so):"
$B/bin/novac examples/mlp.nova --dim=batch=8 --train --optimizer=adamw --lr=0.001 -o "$out/mlp_train.so" --time-passes
echo
echo "== 200 steps on examples/data/mlp (novarun mlp_train.so --inputs examples/data/mlp --steps 200):"
$B/bin/novarun "$out/mlp_train.so" --inputs examples/data/mlp --steps 200
echo
echo "== manifest (first lines of tb.json):"
head -n 12 "$out/tb.json"
