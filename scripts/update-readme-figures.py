#!/usr/bin/env python3
"""Runs the benchmarks behind README.md's figures and rewrites README's (and
docs/pytorch.md's) tables between their markers, so that the figures are always the output of
one run of the tools, never typed by hand:

    <!-- figures:NAME begin (scripts/update-readme-figures.py) -->
    ...generated...
    <!-- figures:NAME end -->

    python3 scripts/update-readme-figures.py                 # every section
    python3 scripts/update-readme-figures.py --only codec    # one section
    python3 scripts/update-readme-figures.py --dry-run       # print, do not write

Sections:
  codec   compcoll-bench codec on a ResNet-50-sized gradient (25,557,032
          float32), one thread, against memcpy of the same buffer.
  link    compcoll-bench allreduce, 4 ranks in 4 network namespaces whose
          links are shaped to 1 Gbit/s (needs root; a few minutes).
  digits  the PyTorch digits example, DDP on 4 ranks, every algorithm
          (needs the compcoll package in this interpreter; a few minutes).

Needs a built compcoll-bench (scripts/build.sh; BUILD_DIR as there). Timings
are whatever this machine gives at the time: the generated text says when and
how busy the machine was (load average).
"""
import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
PYTORCH_DOC = os.path.join(ROOT, "docs", "pytorch.md")
COUNT = 25557032  # a ResNet-50 gradient
ALGOS = ["dense", "dgc", "sbc", "sdagc", "csc", "onebit"]
# What the link table says of each algorithm besides its name; the sparse
# ones get their resolved settings from the codec bench (link_details).
LINK_DETAILS = {"dense": [], "csc": ["1 % of chunks"], "onebit": []}


def fail(msg):
    sys.exit(f"update-readme-figures: {msg}")


def run_json(cmd, env=None):
    """Runs a command that prints JSON on stdout; its stderr passes through."""
    print("update-readme-figures: running " + " ".join(cmd), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env)
    if p.returncode != 0:
        fail(f"{cmd[0]} failed (exit {p.returncode})")
    try:
        return json.loads(p.stdout)
    except json.JSONDecodeError as e:
        fail(f"{' '.join(cmd)} printed no JSON ({e}): {p.stdout[-500:]}")


def when():
    load = os.getloadavg()[0]
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"{stamp}, {os.cpu_count()} cores, load average {load:.1f} when it started"


def ratio_text(r):
    """A compression ratio as README writes it: 31.5, 97, 1391; n/a where undefined."""
    if r is None:
        return "n/a"
    return f"{r:.1f}" if r < 100 else f"{r:.0f}"


def x(v):
    """A ratio to memcpy: two decimals, three for the small decode ratios."""
    return f"{v:.2f}" if v >= 0.1 else f"{v:.3f}"


def setting_text(r):
    """A codec bench row's resolved setting: "d = 0.002, fp8 + rice" (sbc
    sends no values or indices: its density alone)."""
    if r["algo"] == "sbc":
        return f"d = {r['density']:.3g}"
    return f"d = {r['density']:.3g}, {r['values']} + {r['indices']}"


def codec_section(bench):
    """The codecs at the library's defaults (the bench reads COMPCOLL_* as an
    allreduce would, so they are left out here), and dgc at DGC's own setting."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPCOLL_")}
    base = [bench, "codec", "--count", str(COUNT), "--json"]
    started = when()
    others = run_json(base + ["--algo", "sdagc,sbc,csc,onebit"], env)
    dgc = run_json(base + ["--algo", "dgc", "--momentum", "0.9"], env)
    dgc8 = run_json(base + ["--algo", "dgc", "--momentum", "0.9", "--density", "0.001",
                            "--values", "fp32", "--indices", "u32"], env)
    by = {r["algo"]: r for r in others}
    iters = dgc["iters"]

    lines = [
        "Codecs on one thread at the default settings, as ratios to `memcpy` of the same buffer",
        f"timed in the same run (`compcoll-bench codec --count {COUNT}`, median of {iters}; "
        f"{started}):",
        "",
        "| codec | encode (× memcpy) | decode-accumulate (× memcpy) | payload ratio |",
        "|---|---:|---:|---:|",
        f"| dgc, momentum 0.9 ({setting_text(dgc)}) | {x(dgc['encode_vs_memcpy'])} "
        f"({dgc['encode_ms']:.1f} ms) | {x(dgc['decode_vs_memcpy'])} | {dgc['ratio']:.0f} |",
        f"| dgc, momentum 0.9 ({setting_text(dgc8)}: DGC's) | {x(dgc8['encode_vs_memcpy'])} | "
        f"{x(dgc8['decode_vs_memcpy'])} | {dgc8['ratio']:.0f} |",
        f"| sdagc ({setting_text(by['sdagc'])}) | {x(by['sdagc']['encode_vs_memcpy'])} | "
        f"{x(by['sdagc']['decode_vs_memcpy'])} | {by['sdagc']['ratio']:.0f} |",
        f"| sbc ({setting_text(by['sbc'])}) | {x(by['sbc']['encode_vs_memcpy'])} | "
        f"{x(by['sbc']['decode_vs_memcpy'])} | {by['sbc']['ratio']:.0f} |",
        f"| csc (accumulate + chunk norms) | {x(by['csc']['encode_vs_memcpy'])} | "
        f"{x(by['csc']['decode_vs_memcpy'])} (unpack) | {by['csc']['ratio']:.0f} |",
        f"| onebit | {x(by['onebit']['encode_vs_memcpy'])} | {x(by['onebit']['decode_vs_memcpy'])} | "
        f"{by['onebit']['ratio']:.1f} |",
        "",
        f"(memcpy of the {COUNT * 4 / 2**20:.1f} MiB buffer: {dgc['memcpy_ms']:.1f} ms in the dgc run.)",
    ]
    return {README: "\n".join(lines)}


def link_details(bench):
    """LINK_DETAILS with the sparse algorithms' resolved settings, as the codec
    bench reports them for the same environment (COMPCOLL_DENSITY=auto:
    collectives/registry.cc density_for), so the table names what ran."""
    rows = run_json([bench, "codec", "--count", "100000", "--algo", "dgc,sdagc,sbc", "--json"])
    details = {a: list(d) for a, d in LINK_DETAILS.items()}
    for r in rows:
        details[r["algo"]] = [setting_text(r)]
    return details


def link_section(bench):
    if os.geteuid() != 0:
        fail("the link section needs root (network namespaces); use --only codec,digits")
    cmd = [bench, "allreduce", "--ranks", "4", "--count", str(COUNT), "--iters", "5",
           "--algo", ",".join(ALGOS), "--link", "1gbit", "--json"]
    started = when()
    rows = run_json(cmd)
    details = link_details(bench)
    by = {r["algo"]: r for r in rows}
    missing = [a for a in ALGOS if a not in by]
    if missing:
        fail(f"allreduce printed no row for {missing}")
    gloo_ms = rows[0]["dense_time_ms"]
    dense_wire = by["dense"]["dense_wire_bytes"]
    limit_s = dense_wire * 8 / 1e9  # the dense ring's bytes per rank at 1 Gbit/s
    lines = [
        "4 ranks in 4 network namespaces, every link shaped with tbf to 1 Gbit/s",
        f"(`compcoll-bench allreduce --ranks 4 --count {COUNT} --iters 5 --link 1gbit`, median of "
        f"{rows[0]['iters']} calls of the slowest rank, one run; {started}):",
        "",
        f"| algo | time (ms) | vs Gloo dense ({gloo_ms:.0f} ms) | wire bytes / rank / call | ratio | "
        "rel_err (one call) | run_err (all calls) | same bits on all ranks |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    named_pattern = False  # whether a row names what COMPCOLL_SPARSE_PATTERN=auto chose
    for a in ALGOS:
        r = by[a]
        parts = list(details[a])
        pattern = r.get("decision", "").split(" ", 1)[0]
        if pattern in ("allgather", "scatter"):
            parts.append(pattern)
            named_pattern = True
        label = f"{a} ({'; '.join(parts)})" if parts else a
        lines.append(f"| {label} | {r['time_ms']:.1f} | {r['speedup']:.1f}× | "
                     f"{r['wire_bytes']:,} | {ratio_text(r['ratio'])} | {r['rel_error']:.2g} | "
                     f"{r['running_rel_error']:.2g} | {'yes' if r['identical'] else 'NO'} |")
    lines += [
        "",
        f"The wire limit of the dense ring at 1 Gbit/s is {limit_s:.2f} s ({dense_wire:,} bytes per "
        f"rank), so Gloo's {gloo_ms / 1000:.2f} s is at {100 * limit_s * 1000 / gloo_ms:.0f} % of it. "
        "`rel_err` and `run_err` are explained in `docs/benchmark.md`.",
    ]
    if named_pattern:
        lines[-1] += (
            " The dgc and sdagc rows name the pattern `COMPCOLL_SPARSE_PATTERN=auto` chose from the "
            "link each run measured at its start (the benchmark's `decision` field; sbc always "
            "allgathers): at 4 ranks the two patterns' predicted times are a few ms apart, so on this "
            "shared machine either may run (`docs/scaling.md`).")
    return {README: "\n".join(lines)}


# Past the default warm-up (COMPCOLL_WARMUP_STEPS), as the example's own default.
DIGITS_STEPS = 1000


def digits_section(python):
    out_dir = tempfile.mkdtemp(prefix="compcoll-figures-")
    out = os.path.join(out_dir, "digits.json")
    cmd = [python, os.path.join(ROOT, "integration", "pytorch", "examples", "ddp_digits.py"),
           "--ranks", "4", "--steps", str(DIGITS_STEPS), "--algos", ",".join(ALGOS), "--plot", "",
           "--json", out]
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPCOLL_")}
    started = when()
    print("update-readme-figures: running " + " ".join(cmd), file=sys.stderr, flush=True)
    try:
        p = subprocess.run(cmd, env=env)
        if p.returncode != 0:
            fail(f"the digits example failed (exit {p.returncode})")
        with open(out) as f:
            results = json.load(f)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    parts = []
    table = ["| algo | test accuracy | wire MB/rank | ratio | after the warm-up | compressed calls |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in results:
        steady = f"{ratio_text(r['steady_ratio'])}×" if r.get("steady_ratio") else "none"
        ratio = (f" ({ratio_text(r['ratio'])}×, {steady} after the warm-up)" if r["algo"] != "dense"
                 else "")
        parts.append(f"{r['algo']} {100 * r['accuracy']:.2f} %{ratio}")
        warmup = r.get("warmup_dense_calls") or 0
        table.append(f"| {r['algo']} | {100 * r['accuracy']:.2f} % | {r['wire_bytes_per_rank'] / 1e6:.3f} | "
                     f"{ratio_text(r['ratio'])}× | {steady} | {r['compressed_calls']}/{r['calls']}"
                     + (f" ({warmup} dense in the warm-up)" if warmup else "") + " |")
    span = (f"{DIGITS_STEPS} steps at the defaults, so the ratios are over the whole run, the warm-up "
            "(a tensor's first COMPCOLL_WARMUP_STEPS calls) included")
    readme = (f"DDP on the digits data, 4 ranks, {span}; test accuracy: {', '.join(parts)} "
              f"({started}).")
    docs = "\n".join([f"One run, {span} ({started}):", ""] + table)
    return {README: readme, PYTORCH_DOC: docs}


SECTIONS = {"codec": codec_section, "link": link_section, "digits": digits_section}


SECTION_FILES = {"codec": [README], "link": [README], "digits": [README, PYTORCH_DOC]}


def replace_section(text, name, body, path):
    begin = f"<!-- figures:{name} begin (scripts/update-readme-figures.py) -->"
    end = f"<!-- figures:{name} end -->"
    # The block keeps the indentation of its begin marker (inside a list item, say).
    pattern = re.compile(r"^([ \t]*)" + re.escape(begin) + r"\n.*?" + re.escape(end), re.S | re.M)
    found = pattern.findall(text)
    if len(found) != 1:
        fail(f"{os.path.relpath(path, ROOT)} must contain exactly one '{begin}' ... '{end}' block")
    indent = found[0]
    lines = [begin] + (body.split("\n") if body else []) + [end]
    block = "\n".join(indent + line if line else line for line in lines)
    return pattern.sub(lambda _: block, text)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="codec,link,digits",
                   help="comma-separated sections to regenerate: codec, link, digits")
    p.add_argument("--build-dir", default=os.environ.get("BUILD_DIR", "build"),
                   help="where compcoll-bench was built (default $BUILD_DIR or build)")
    p.add_argument("--dry-run", action="store_true", help="print the sections, leave README alone")
    args = p.parse_args()
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in SECTIONS]
    if unknown or not names:
        p.error(f"--only: unknown section(s) {unknown}; choose from {', '.join(SECTIONS)}")
    bench = os.path.join(ROOT, args.build_dir, "integration", "bench", "compcoll-bench")
    if any(n in ("codec", "link") for n in names) and not os.access(bench, os.X_OK):
        p.error(f"{bench} not found: build it first (scripts/build.sh)")

    for name in names:  # check every marker before spending minutes on a run
        for path in SECTION_FILES[name]:
            with open(path) as f:
                replace_section(f.read(), name, "", path)
    for name in names:
        bodies = SECTIONS[name](sys.executable if name == "digits" else bench)
        for path, body in bodies.items():
            rel = os.path.relpath(path, ROOT)
            if args.dry_run:
                print(f"--- {rel}, section {name}:\n{body}\n")
                continue
            with open(path) as f:
                text = replace_section(f.read(), name, body, path)
            with open(path, "w") as f:  # after each section: a later failure keeps it
                f.write(text)
            print(f"update-readme-figures: {rel} section '{name}' rewritten", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
