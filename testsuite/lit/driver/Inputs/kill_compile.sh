#!/bin/sh
# kill_compile.sh NOVAC MODEL WORK SIGNAL [WAIT_FOR]: compiles MODEL with a
# private TMPDIR, sends SIGNAL once a temporary folder named WAIT_FOR*
# (default novac.: the step's folder, made as its code generation starts) exists (waiting up to a
# minute: a loaded machine reaches code generation late), and prints the exit
# status, what is left in TMPDIR and beside the output, and whether any
# process of that compile survived.
novac=$1 model=$2 w=$3 sig=$4 what=${5:-novac.}
rm -rf "$w" && mkdir -p "$w/tmp" "$w/out"
TMPDIR="$w/tmp" NOVAC_JOBS=2 "$novac" "$model" --dim=batch=8 --train -o "$w/out/k.so" 2>/dev/null &
pid=$!
i=0
while [ $i -lt 3000 ] && ! ls "$w/tmp" | grep -q "^$what"; do sleep 0.02; i=$((i + 1)); done
[ $i -lt 3000 ] || echo "no $what folder appeared"
kill -"$sig" $pid
wait $pid
echo "exit $?"
sleep 0.3 # workers killed with novac go at once; a code generation lasts longer
pgrep -f "$w/out/k.so" >/dev/null && echo "processes left"
echo "left: $(ls -A "$w/tmp" "$w/out" | tr '\n' ' ')"
