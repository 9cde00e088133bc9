#!/usr/bin/env python3
"""testsuite/fuzz/mutate.py BUILD_DIR [N]: novac on mutated models.

Takes examples/*.nova and testsuite/bad/*.nova as seeds and makes N mutants
(default 300) with a fixed seed, so every run tries the same inputs: bytes
and tokens deleted, duplicated or inserted, lines swapped, files truncated,
numbers replaced by huge, negative or zero ones, names replaced by other
names, keywords or op names.  Each mutant goes through `novac --emit=nova`;
every 10th also through a full build to a temporary step.so.  novac must
exit 0 or 1 within the timeout (20 s; never a signal, never 2, never a
hang), an exit 1 must print a line with 'error:', a failed build must leave
no output behind, and stderr must hold no sanitizer report.

Failing inputs are saved to testsuite/fuzz/crashes/ (NAME.nova, and
NAME.txt with the command and what went wrong).  After MAX_FAILURES failing
inputs the run stops, so that a hang does not cost 20 s per mutant.

Prints 'PASS: fuzz :: mutate' or 'FAIL: fuzz :: mutate' with the failing
inputs; exits 0 either way.  Environment: NOVA_FUZZ_SEED (default 1),
NOVA_FUZZ_TIMEOUT (seconds, default 20), NOVA_FUZZ_JOBS (default 2),
NOVA_FUZZ_MAX_FAILURES (default 3).
"""
import concurrent.futures
import glob
import hashlib
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CRASH_DIR = os.path.join(ROOT, "testsuite", "fuzz", "crashes")
MAX_FAILURES = int(os.environ.get("NOVA_FUZZ_MAX_FAILURES", "3"))
MAX_SIZE = 64 << 10  # seeds larger than this are cut, to keep runs fast

SANITIZER = re.compile(rb"ERROR: (Address|Leak|Memory|Thread)Sanitizer|runtime error:|SUMMARY: \w*Sanitizer")

HUGE_NUMBERS = [b"0", b"-1", b"-0", b"1", b"99999999999999999999", b"9223372036854775807",
                b"-9223372036854775808", b"9223372036854775808", b"1099511627776", b"17179869184",
                b"4294967296", b"65536", b"1e308", b"1e-320", b"1e999", b"0.5", b"-2.5", b"1.2.3", b"0x10", b"00"]
WORDS = [b"input", b"label", b"param", b"const", b"output", b"seed", b"f32", b"f64", b"i32", b"i64", b"f16",
         b"zeros", b"ones", b"he", b"xavier", b"normal", b"uniform", b"file", b"causal_mask",
         b"relu", b"matmul", b"softmax", b"log_softmax", b"layer_norm", b"reduce_sum", b"reduce_mean",
         b"reduce_max", b"reshape", b"transpose", b"broadcast", b"concat", b"slice", b"gather",
         b"cross_entropy", b"exp", b"log", b"sqrt", b"tanh", b"sigmoid", b"gelu", b"neg", b"add",
         b"axis", b"axes", b"keepdims", b"shape", b"perm", b"start", b"end", b"step", b"eps",
         b"batch", b"x", b"y", b"undefined_name", b"_", b"a" * 300]
TOKENS = [b"(", b")", b"[", b"]", b",", b":", b"=", b"+", b"-", b"*", b"/", b"@", b"#", b'"', b"\n",
          b"\r\n", b" ", b"\t", b"(" * 50, b")" * 50, b"[]", b"()", b"relu(", b"f32[", b"output ",
          b"shape=[", b"axis=", b"-1", b"...", b"$", b";", b"\\", b"\x00", b"\xff", b"\xc3\xa9"]
TOKEN_RE = re.compile(rb"[A-Za-z_][A-Za-z0-9_.]*|[0-9][0-9A-Za-z.]*|\S")
NUMBER_RE = re.compile(rb"[0-9][0-9.eE]*")
NAME_RE = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*")


def mutate(rng, data):
    """One random mutation of data (bytes)."""
    n = len(data)
    kind = rng.randrange(12)
    if n == 0:
        return rng.choice(TOKENS + WORDS)
    i = rng.randrange(n + 1)
    if kind == 0:  # delete a byte range
        j = min(n, i + rng.choice([1, 1, 2, 5, 20, 100]))
        return data[:i] + data[j:]
    if kind == 1:  # duplicate a byte range
        j = min(n, i + rng.choice([1, 3, 10, 50, 200]))
        return data[:j] + data[i:j] * rng.choice([1, 2, 10]) + data[j:]
    if kind == 2:  # insert random bytes
        k = rng.choice([1, 1, 2, 4, 16])
        return data[:i] + bytes(rng.randrange(256) for _ in range(k)) + data[i:]
    if kind == 3:  # truncate
        return data[:i]
    if kind == 4:  # swap two lines
        lines = data.split(b"\n")
        if len(lines) > 1:
            a, b = rng.randrange(len(lines)), rng.randrange(len(lines))
            lines[a], lines[b] = lines[b], lines[a]
        return b"\n".join(lines)
    if kind == 5:  # duplicate or delete a line
        lines = data.split(b"\n")
        a = rng.randrange(len(lines))
        if rng.random() < 0.5:
            lines.insert(a, lines[rng.randrange(len(lines))])
        else:
            del lines[a]
        return b"\n".join(lines)
    if kind in (6, 7):  # replace a number
        nums = list(NUMBER_RE.finditer(data))
        if nums:
            m = rng.choice(nums)
            return data[:m.start()] + rng.choice(HUGE_NUMBERS) + data[m.end():]
    if kind == 8:  # replace a name by another name of the file, a keyword or an op
        names = list(NAME_RE.finditer(data))
        if names:
            m = rng.choice(names)
            pool = WORDS + [x.group() for x in names[:200]]
            return data[:m.start()] + rng.choice(pool) + data[m.end():]
    if kind == 9:  # delete a token
        toks = list(TOKEN_RE.finditer(data[:MAX_SIZE]))
        if toks:
            m = rng.choice(toks)
            return data[:m.start()] + data[m.end():]
    if kind == 10:  # duplicate a token
        toks = list(TOKEN_RE.finditer(data[:MAX_SIZE]))
        if toks:
            m = rng.choice(toks)
            return data[:m.end()] + b" " * rng.randrange(2) + m.group() + data[m.end():]
    # insert a token or a word
    tok = rng.choice(TOKENS + WORDS)
    return data[:i] + tok + data[i:]


def header_args(data):
    """Extra arguments for the mutants of a seed: its '# ARGS:' line, or
    --dim=batch=4 when it mentions batch.  Taken from the seed, not the mutant,
    so that a mutated ARGS line is not a usage error."""
    m = re.search(rb"^# ARGS: *([^\r\n]*)", data, re.M)
    if m:
        try:
            return shlex.split(m.group(1).decode("utf-8", "replace"))
        except ValueError:
            return []
    return ["--dim=batch=4"] if b"batch" in data else []


def run_one(novac, timeout, idx, seed_name, data, args, build):
    """Runs novac on one mutant; returns None, or (idx, seed_name, data, command,
    reason, stderr) when it misbehaved."""
    work = tempfile.mkdtemp(prefix="nova-fuzz.")
    try:
        src = os.path.join(work, "m%d.nova" % idx)
        data_dir = os.path.join(ROOT, "testsuite", "bad", "data")
        if os.path.isdir(data_dir):  # the seeds' file("data/...") paths resolve next to the model
            shutil.copytree(data_dir, os.path.join(work, "data"))
        with open(src, "wb") as f:
            f.write(data)
        outdir = os.path.join(work, "out")
        tmpdir = os.path.join(work, "tmp")
        os.mkdir(outdir)
        os.mkdir(tmpdir)
        if build:
            cmd = [novac, src] + args + ["-o", os.path.join(outdir, "out.so")]
        else:
            cmd = [novac, src] + args + ["--emit=nova", "-o", os.path.join(outdir, "out.mlir")]
        env = dict(os.environ, TMPDIR=tmpdir)
        # a session of its own, so that a hang is ended with the tools it started
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, env=env, start_new_session=True)
        try:
            err = p.communicate(timeout=timeout)[1]
            rc = p.returncode
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            err = p.communicate()[1] or b""
            rc = None
        shown = " ".join(shlex.quote(c) for c in cmd)
        reason = None
        if rc is None:
            reason = "hang: no exit within %gs" % timeout
        elif rc < 0:
            reason = "crash: killed by signal %d" % -rc
        elif rc not in (0, 1):
            reason = "exit status %d (expected 0 or 1)" % rc
        elif SANITIZER.search(err):
            line = next((l for l in err.splitlines() if SANITIZER.search(l)), b"")
            reason = "sanitizer report: " + line.decode("utf-8", "replace")[:200]
        elif rc == 1 and b"error:" not in err:
            reason = "exit 1 without a diagnostic ('error:')"
        elif rc == 1 and (os.listdir(outdir) or os.listdir(tmpdir)):
            reason = "a failed run left files behind: %s" % " ".join(sorted(os.listdir(outdir) + os.listdir(tmpdir)))
        if reason is None:
            return None
        return (idx, seed_name, data, shown.replace(work, "$WORK"), reason,
                err.replace(work.encode(), b"$WORK").decode("utf-8", "replace")[:1000])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def save(fail):
    idx, seed_name, data, cmd, reason, err = fail
    os.makedirs(CRASH_DIR, exist_ok=True)
    name = "%s-%s" % (os.path.splitext(os.path.basename(seed_name))[0], hashlib.sha1(data).hexdigest()[:10])
    path = os.path.join(CRASH_DIR, name + ".nova")
    with open(path, "wb") as f:
        f.write(data)
    with open(os.path.join(CRASH_DIR, name + ".txt"), "w") as f:
        f.write("mutant %d of %s\n%s\ncommand: %s\nstderr (start):\n%s\n" % (idx, seed_name, reason, cmd, err))
    return os.path.relpath(path, ROOT)


def main():
    if len(sys.argv) < 2:
        print("usage: mutate.py BUILD_DIR [N]", file=sys.stderr)
        return 2
    build_dir = sys.argv[1]
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    novac = os.path.abspath(os.path.join(ROOT, build_dir, "bin", "novac")) if not os.path.isabs(build_dir) \
        else os.path.join(build_dir, "bin", "novac")
    if not os.access(novac, os.X_OK):
        print("FAIL: fuzz :: mutate\n    %s is missing; build it first" % novac)
        return 0
    timeout = float(os.environ.get("NOVA_FUZZ_TIMEOUT", "20"))
    jobs = int(os.environ.get("NOVA_FUZZ_JOBS", "2"))
    rng = random.Random(int(os.environ.get("NOVA_FUZZ_SEED", "1")))

    seeds = []
    for pat in ("examples/*.nova", "testsuite/bad/*.nova"):
        for path in sorted(glob.glob(os.path.join(ROOT, pat))):
            with open(path, "rb") as f:
                seeds.append((os.path.relpath(path, ROOT), f.read()[:MAX_SIZE]))
    if not seeds:
        print("FAIL: fuzz :: mutate\n    no seed files")
        return 0

    mutants = []
    for idx in range(count):
        seed_name, data = seeds[rng.randrange(len(seeds))]
        args = header_args(data)
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            data = mutate(rng, data)
        mutants.append((idx, seed_name, data, args, idx % 10 == 9))

    failures = []
    ran = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as ex:
        # in windows of a few mutants, in order, so the first failures found are always the same
        for w in range(0, len(mutants), 2 * jobs):
            window = mutants[w:w + 2 * jobs]
            results = list(ex.map(lambda m: run_one(novac, timeout, *m), window))
            ran += len(window)
            failures += [r for r in results if r]
            if len(failures) >= MAX_FAILURES:
                break

    if not failures:
        print("PASS: fuzz :: mutate")
        print("    %d mutants of %d seeds" % (ran, len(seeds)))
        return 0
    print("FAIL: fuzz :: mutate")
    print("    %d failing of %d mutants run%s" % (len(failures), ran,
          " (stopped early)" if ran < len(mutants) else ""))
    for f in failures:
        print("    %s: %s" % (save(f), f[4]))
        print("      command: %s" % f[3])
    return 0


if __name__ == "__main__":
    sys.exit(main())
