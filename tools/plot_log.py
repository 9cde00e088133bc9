#!/usr/bin/env python3
"""Curves of a novarun --log file (JSON lines): the training loss per step,
the evaluation losses, and the learning rate.

    python3 tools/plot_log.py run.jsonl -o curves.svg   (no dependency)
    python3 tools/plot_log.py run.jsonl -o curves.png   (needs matplotlib)

Two panels: loss (training, and evaluation as points) against the step,
and the learning rate against the step (when the log has one).  Skipped
steps (non-finite) are left out of the loss curve.  Exit 1 with the reason
for an unreadable or empty log, 2 for bad usage."""
import json
import math
import sys


def read(path):
    steps, loss, lr, evals = [], [], [], []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except ValueError as e:
                raise SystemExit("%s:%d: not a JSON line (%s)" % (path, n, e))
            if not isinstance(r, dict) or not isinstance(r.get("step"), int):
                raise SystemExit("%s:%d: a line without an integer \"step\"" % (path, n))
            if "eval_loss" in r:
                if isinstance(r["eval_loss"], (int, float)):
                    evals.append((r["step"], float(r["eval_loss"])))
                continue
            if r.get("skipped") or not isinstance(r.get("loss"), (int, float)):
                continue
            steps.append(r["step"])
            loss.append(float(r["loss"]))
            lr.append(float(r["lr"]) if isinstance(r.get("lr"), (int, float)) else None)
    if not steps and not evals:
        raise SystemExit("%s: no steps to plot" % path)
    return steps, loss, lr, evals


def ticks(lo, hi, n=5):
    """About N round values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + (abs(lo) if lo else 1.0)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 5, 10) if m * mag >= raw), default=10 * mag)
    first = math.floor(lo / step) * step
    out, v = [], first
    while v <= hi + step * 1e-9:
        out.append(v)
        v += step
    return out


def fmt(v):
    return ("%.4g" % v) if v else "0"


def panel(out, x0, y0, w, h, xs, series, title):
    """SVG of one panel: axes, ticks, the series [(label, colour, [(x, y)], points?)]."""
    allx = [x for _, _, pts, _ in series for x, _ in pts] or [0, 1]
    ally = [y for _, _, pts, _ in series for _, y in pts] or [0, 1]
    xt, yt = ticks(min(allx), max(allx)), ticks(min(ally), max(ally))
    xl, xh, yl, yh = xt[0], xt[-1], yt[0], yt[-1]
    X = lambda x: x0 + (x - xl) / ((xh - xl) or 1) * w
    Y = lambda y: y0 + h - (y - yl) / ((yh - yl) or 1) * h
    out.append('<rect x="%g" y="%g" width="%g" height="%g" fill="none" stroke="#444"/>' % (x0, y0, w, h))
    out.append('<text x="%g" y="%g" font-size="13" text-anchor="middle">%s</text>' % (x0 + w / 2, y0 - 8, title))
    for v in xt:
        out.append('<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#ddd"/>' % (X(v), y0, X(v), y0 + h))
        out.append('<text x="%g" y="%g" font-size="10" text-anchor="middle">%s</text>' % (X(v), y0 + h + 14, fmt(v)))
    for v in yt:
        out.append('<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#ddd"/>' % (x0, Y(v), x0 + w, Y(v)))
        out.append('<text x="%g" y="%g" font-size="10" text-anchor="end">%s</text>' % (x0 - 4, Y(v) + 3, fmt(v)))
    for k, (label, colour, pts, dots) in enumerate(series):
        if dots:
            for x, y in pts:
                out.append('<circle cx="%.2f" cy="%.2f" r="3" fill="%s"/>' % (X(x), Y(y), colour))
        elif pts:
            out.append('<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>'
                       % (colour, " ".join("%.2f,%.2f" % (X(x), Y(y)) for x, y in pts)))
        out.append('<text x="%g" y="%g" font-size="11" fill="%s">%s</text>' % (x0 + w - 120, y0 + 16 + 14 * k, colour,
                                                                           label))


def svg(path, steps, loss, lr, evals):
    have_lr = any(v is not None for v in lr)
    W, H = 760, 620 if have_lr else 340
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif">' % (W, H),
           '<rect width="100%" height="100%" fill="white"/>']
    series = [("training loss", "#1f77b4", list(zip(steps, loss)), False)]
    if evals:
        series.append(("evaluation loss", "#d62728", evals, True))
    panel(out, 70, 30, W - 100, 250, steps, series, "loss")
    if have_lr:
        panel(out, 70, 340, W - 100, 230, steps,
              [("learning rate", "#2ca02c", [(s, v) for s, v in zip(steps, lr) if v is not None], False)],
              "learning rate")
    out.append('<text x="%g" y="%g" font-size="11" text-anchor="middle">step</text>' % (W / 2, H - 6))
    out.append("</svg>\n")
    with open(path, "w") as f:
        f.write("\n".join(out))


def png(path, steps, loss, lr, evals):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("writing a PNG needs matplotlib (pip install matplotlib); or name an .svg output")
    have_lr = any(v is not None for v in lr)
    fig, axes = plt.subplots(2 if have_lr else 1, 1, figsize=(8, 6.5 if have_lr else 3.5), sharex=True, squeeze=False)
    ax = axes[0][0]
    ax.plot(steps, loss, label="training loss")
    if evals:
        ax.plot([s for s, _ in evals], [v for _, v in evals], "o", label="evaluation loss")
    ax.set_ylabel("loss")
    ax.legend()
    if have_lr:
        pts = [(s, v) for s, v in zip(steps, lr) if v is not None]
        axes[1][0].plot([s for s, _ in pts], [v for _, v in pts], color="C2")
        axes[1][0].set_ylabel("learning rate")
    axes[-1][0].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv):
    args = [a for a in argv[1:]]
    if len(args) != 3 or args[1] != "-o" or not args[2].endswith((".svg", ".png")):
        sys.stderr.write("usage: plot_log.py LOG.jsonl -o OUT.svg|OUT.png\n")
        return 2
    try:
        data = read(args[0])
    except OSError as e:
        sys.stderr.write("plot_log.py: %s\n" % e)
        return 1
    except SystemExit as e:
        sys.stderr.write("plot_log.py: %s\n" % e)
        return 1
    try:
        (png if args[2].endswith(".png") else svg)(args[2], *data)
    except SystemExit as e:
        sys.stderr.write("plot_log.py: %s\n" % e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
