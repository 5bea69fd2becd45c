"""Old vs new core on one device, in one call: `ddtree bench core --check` over the issue grid for two source trees.

    OLD_SRC=/path/to/old/src python3 benchmarks/core_old_vs_new.py --out "$OUT"

OLD_SRC is a source tree holding the old `ddtree` package (e.g. `git archive f44460a src | tar -x -C /tmp/old`,
then OLD_SRC=/tmp/old/src); the new code is this checkout's src/. Each `bench core` run is its own process
(PYTHONPATH set to one tree), one process per batch size and version, interleaved: old then new for the first
batch size, new then old for the next, and so on, so that drift of the machine hits both versions alike.
Then one more process per version builds every cell's tree (heap and batched, the seed logits of `bench core`)
and this script checks old == new field for field.

Prints one table, per (B, budget): batched build ms old / new / new over old, auto ms ratio, greedy and sampling
verify ms ratios, `agree` (heap == batched == auto == eager inside each version) and `same` (the old and new
trees are identical). Writes $OUT/core_old_vs_new.json and every process's raw JSON under $OUT/raw/.
On one H200 the default grid (B 1, 8, 32, 64 x budget 32, 64, 128, 256) took about 3-4 minutes in an earlier
session; on a fresh machine one B = 1 process ran past 240 s (why is not known: a cold Triton cache is a guess),
so give it --timeout 500 or split
the batch sizes over calls. Each process logs to raw/<version>_b<B>.log as it runs; one stopped at --timeout is
reported with the cells it finished and the table keeps the cells both versions measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

NEW_SRC = Path(__file__).resolve().parents[1] / "src"
FIELDS = ("token_ids", "parents", "depths", "node_logws", "num_nodes")


def _env(src: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(src)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_bench(src: Path, batch: int, args: argparse.Namespace, out: Path) -> tuple[list[dict], float]:
    """One `ddtree bench core --check` process over one batch size and every budget; its rows and seconds."""
    cmd = [sys.executable, "-m", "ddtree.cli", "bench", "core", "--check", "--batch-sizes", str(batch),
           "--budgets", args.budgets, "--vocab", str(args.vocab), "--depth", str(args.depth),
           "--json-out", str(out)]
    for flag in ("device", "repeats", "warmup"):
        if getattr(args, flag) is not None:
            cmd += [f"--{flag}", str(getattr(args, flag))]
    if args.no_verify:
        cmd.append("--no-verify")
    # the process's output goes to a log beside its JSON as it runs, so a process stopped by its time limit still
    # shows how far it got (each finished cell prints a line)
    log_path = out.with_suffix(".log")
    start = time.perf_counter()
    with log_path.open("w") as log_file:
        try:
            proc = subprocess.run(cmd, env=_env(src), stdout=log_file, stderr=subprocess.STDOUT, text=True,
                                  timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"{out.stem}: stopped at its {args.timeout} s limit; cells finished: "
                  f"{log_path.read_text().count('cell B=')} (see {log_path})", flush=True)
            return [], time.perf_counter() - start
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} (PYTHONPATH={src}) failed, rc {proc.returncode}:\n"
                         f"{log_path.read_text()[-3000:]}")
    print(f"{out.stem}: {seconds:.0f} s", flush=True)
    return json.loads(out.read_text())["rows"], seconds


def dump_trees(args: argparse.Namespace) -> None:
    """(subprocess mode) Build every cell's tree with the ddtree on PYTHONPATH; save them with torch.save."""
    import torch

    from ddtree.core.build import build_tree

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    trees = {}
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        for budget in [int(b) for b in args.budgets.split(",")]:
            gen = torch.Generator(device=device).manual_seed(0)  # the logits `bench core` times at seed 0
            logits = torch.randn((batch, args.depth, args.vocab), generator=gen, device=device).mul_(3).to(dtype)
            for method in ("heap", "batched"):
                tree = build_tree(logits, budget, method=method)
                trees[f"{batch}x{budget}:{method}"] = {f: getattr(tree, f).cpu() for f in FIELDS}
    torch.save(trees, args.dump_trees)


def same_trees(old: Path, new: Path) -> dict[str, bool]:
    import torch

    a, b = torch.load(old), torch.load(new)
    return {key: key in b and all(torch.equal(a[key][f], b[key][f]) for f in FIELDS) for key in a}


def _ratio(new: float | None, old: float | None) -> str:
    return f"{new / old:.2f}" if new is not None and old else "n/a"


def _ms(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else "n/a"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "results/core_old_vs_new")))
    parser.add_argument("--old-src", type=Path, default=os.environ.get("OLD_SRC"))
    parser.add_argument("--batch-sizes", default="1,8,32,64")
    parser.add_argument("--budgets", default="32,64,128,256")
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--depth", type=int, default=15)
    parser.add_argument("--device", default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--no-verify", action="store_true")
    parser.add_argument("--timeout", type=int, default=240, help="seconds per bench process")
    parser.add_argument("--dump-trees", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dump_trees is not None:
        dump_trees(args)
        return 0
    if args.old_src is None or not (Path(args.old_src) / "ddtree" / "__init__.py").is_file():
        raise SystemExit("set OLD_SRC (or --old-src) to a source tree holding the old ddtree package")
    versions = {"old": Path(args.old_src).resolve(), "new": NEW_SRC}
    raw = args.out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rows: dict[tuple[str, int, int], dict] = {}
    seconds: dict[str, float] = {"old": 0.0, "new": 0.0}
    for i, batch in enumerate(int(b) for b in args.batch_sizes.split(",")):
        for name in ("old", "new") if i % 2 == 0 else ("new", "old"):
            got, took = run_bench(versions[name], batch, args, raw / f"{name}_b{batch}.json")
            seconds[name] += took
            for row in got:
                rows[(name, row["batch"], row["budget"])] = row
    for name, src in versions.items():
        cmd = [sys.executable, __file__, "--dump-trees", str(raw / f"trees_{name}.pt"), "--batch-sizes",
               args.batch_sizes, "--budgets", args.budgets, "--vocab", str(args.vocab), "--depth", str(args.depth)]
        if args.device:
            cmd += ["--device", args.device]
        try:
            subprocess.run(cmd, env=_env(src), check=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"trees_{name}: stopped at its {args.timeout} s limit", flush=True)
    dumped = (raw / "trees_old.pt").is_file() and (raw / "trees_new.pt").is_file()
    same = same_trees(raw / "trees_old.pt", raw / "trees_new.pt") if dumped else {}

    header = ("B", "budget", "old ms", "new ms", "new/old", "auto new/old", "greedy new/old", "samp new/old",
              "agree old", "agree new", "same")
    table, cells = [header], []
    keys = {(b, k) for _, b, k in rows}
    missing = sorted(key for key in keys if ("old", *key) not in rows or ("new", *key) not in rows)
    for key in sorted(keys - set(missing)):
        old, new = rows[("old", *key)], rows[("new", *key)]
        cell_same = same.get(f"{key[0]}x{key[1]}:heap", False) and same.get(f"{key[0]}x{key[1]}:batched", False)
        cells.append({"batch": key[0], "budget": key[1], "old": old, "new": new, "same_trees": cell_same})
        table.append((str(key[0]), str(key[1]), _ms(old["batched_ms"]), _ms(new["batched_ms"]),
                      _ratio(new["batched_ms"], old["batched_ms"]), _ratio(new["auto_ms"], old["auto_ms"]),
                      _ratio(new.get("greedy_ms"), old.get("greedy_ms")),
                      _ratio(new.get("sampling_ms"), old.get("sampling_ms")),
                      str(old.get("agree")), str(new.get("agree")), str(cell_same)))
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    ok = bool(cells) and not missing and all(c["old"].get("agree") and c["new"].get("agree") and c["same_trees"]
                                             for c in cells)
    if missing:
        print(f"cells measured by one version only (the other stopped at its limit): {missing}", flush=True)
    print(f"core old vs new: old={versions['old']} new={versions['new']}; bench seconds old {seconds['old']:.0f}, "
          f"new {seconds['new']:.0f}; ms = batched build (median); all agree and same: {ok}")
    print("\n".join(lines), flush=True)
    (args.out / "core_old_vs_new.json").write_text(json.dumps(
        {"versions": {k: str(v) for k, v in versions.items()}, "seconds": seconds, "ok": ok, "cells": cells},
        indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
