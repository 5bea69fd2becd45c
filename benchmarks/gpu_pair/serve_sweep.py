"""Throughput against concurrency through the reference server: `ar`, `dflash` and `ddtree` at each budget
(issue 12: 8 concurrent requests, and the sweep over 1, 2, 4, 8, 16 with the best budget per level).

One server per method, all started at once and kept up (`ddtree serve --log-level info`, continuous batching up to
--max-batch, CUDA graphs of every batch bucket and every swept budget captured at start; its log shows each
captured program's seconds); the ddtree budgets go to one server as per-request overrides. Each level measures
every (method, budget) back to back, and --repeats passes over the levels rotate that order, so ratios compare
neighbours in time; the summary reports medians over passes and a per-pass table the spread. After one untimed
warm-up level per (method, budget, T),
each (method, budget, T, concurrency) level sends a first batch of max(--min-requests, 2 x concurrency) requests
of --max-new-tokens tokens (EOS ignored, so every request decodes the same length); while the last batch lasted
under --min-seconds, it sends a larger one sized from that batch's rate (whole waves of `concurrency`, at most
--max-requests in the level) and reports the last batch alone (one span of steady traffic; the requests before
it are its probes). --time-budget-s (seconds from the sweep's start) stops it starting a server or a level that
would not fit, so it ends with what it has instead of being killed; the summary marks cells not measured.

Writes $OUT/sweep_records.jsonl (one record per request, `ddtree bench throughput`'s; the reported batch is the
level's records from `first_request_index` on), $OUT/server_<method>.log, and after every level $OUT/sweep.json
(each server's start-up seconds; per level its reported requests and seconds, the probes', the batches) and
$OUT/sweep.txt: start-ups, output tokens/s per (method, budget, T, concurrency), the best ddtree budget per
level and the ratios over dflash and ar, with --repeats > 1 the per-pass ratios and spread, then one line per level.

    python3 benchmarks/gpu_pair/serve_sweep.py --pair /tmp/gpu-pair --methods ddtree,dflash,ar \\
        --budgets 16,32,64 --min-seconds 5 --time-budget-s 570                # one H200: under `timeout 585`
    python3 benchmarks/gpu_pair/serve_sweep.py --pair PAIR --device cpu --dtype float32 --concurrency 1,2 \\
        --budgets 4 --max-new-tokens 16 --min-requests 2 --min-seconds 1       # a CPU check of the script
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from ddtree.bench.http_client import wait_for_health
from ddtree.bench.session import free_port, start_server, stop_server
from ddtree.bench.throughput import run_throughput

MARGIN = 1.5  # a short probe runs below the steady rate (ramp-up): a batch sized to just --min-seconds falls short
RESERVE_S = 15.0  # kept back from --time-budget-s: stopping a server (10 s SIGTERM grace) and the summary


def variant(temperature: float) -> dict[str, Any]:
    return {"name": "greedy" if temperature == 0 else f"t{temperature:g}", "temperature": temperature,
            "top_k": -1, "top_p": 1.0}


def server_counters(url: str) -> dict[str, Any]:
    """The server's cumulative counters (`/server_info`): `engine_loop`, the decoding loop's seconds by phase, and
    `request_timeline`, finished requests' seconds by phase; each None when the server does not report it."""
    import httpx

    try:
        info = httpx.get(f"{url.rstrip('/')}/server_info", timeout=10.0).json()
    except (httpx.HTTPError, ValueError):
        return {"engine_loop": None, "request_timeline": None}
    return {"engine_loop": info.get("engine_loop"), "request_timeline": info.get("request_timeline")}


def request_phases(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
    """Per finished request over a span (two `request_timeline` snapshots): ms waiting for a row, in the engine,
    and handed back to the event loop."""
    from ddtree.server.app import RequestTimeline

    return RequestTimeline.per_request_ms(before, after)


def loop_per_round(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
    """Per decoding round over a span (two `engine_loop` snapshots): ms enqueueing, waiting on the device, in
    the host's bookkeeping, admitting (prefill + first token), idle; mean rows per round; admissions per round."""
    if not before or not after or after["rounds"] <= before["rounds"]:
        return None
    d = {k: after[k] - before[k] for k in after}
    rounds = d["rounds"]
    out = {f"{k}_ms": 1e3 * d[f"{k}_s"] / rounds for k in ("launch", "wait", "post", "admit", "idle")}
    out["rows"] = d["row_rounds"] / rounds
    out["admissions"] = d["admissions"] / rounds
    return out


def next_batch(concurrency: int, batches: list[tuple[int, float]], *, min_requests: int, min_seconds: float,
               max_requests: int, seconds_left: float = math.inf) -> int:
    """Requests of a level's next batch, 0 when the level is done. `batches`: (requests, seconds) so far.

    The first is max(min_requests, 2 x concurrency). While the last lasted under min_seconds, the next is sized
    from its request rate to last MARGIN x min_seconds, in whole waves of `concurrency`, cut to what
    max_requests (over the level) and seconds_left allow; a cut below the first batch's size is not run."""
    floor = max(min_requests, 2 * concurrency)
    left = max_requests - sum(n for n, _ in batches)
    if not batches:
        return max(min(floor, left), 0)
    n, seconds = batches[-1]
    if seconds >= min_seconds:
        return 0
    rate = n / max(seconds, 1e-6)
    want = math.ceil(rate * min_seconds * MARGIN / concurrency) * concurrency
    size = int(min(want, left, rate * max(seconds_left, 0.0)))
    return size if size >= floor else 0


class Sweep:
    """The sweep's state: rows, servers' start-ups, the --time-budget-s deadline; rewrites its outputs."""

    def __init__(self, args: argparse.Namespace, out: Path) -> None:
        self.args, self.out = args, out
        self.t0 = time.monotonic()
        self.rows: list[dict[str, Any]] = []
        self.servers: dict[str, dict[str, Any]] = {}
        self.stopped: str | None = None  # why levels were left out (the time budget), None when all ran
        self.level_estimate_s = MARGIN * args.min_seconds  # refreshed by each level's measured wall time

    def seconds_left(self) -> float:
        if self.args.time_budget_s is None:
            return math.inf
        return self.args.time_budget_s - (time.monotonic() - self.t0) - RESERVE_S

    def fits(self, what: str, seconds: float) -> bool:
        """Whether `what` (taking about `seconds`) fits the time budget; records the first that does not."""
        if seconds <= self.seconds_left():
            return True
        self.stopped = self.stopped or (f"time budget: {what} (~{seconds:.0f} s) not started at "
                                        f"{time.monotonic() - self.t0:.0f} s of {self.args.time_budget_s:g} s")
        return False

    def write(self) -> str:
        text = report(self.rows, self.servers, self.plan(), self.stopped)
        doc = {"args": vars(self.args), "elapsed_s": time.monotonic() - self.t0, "stopped": self.stopped,
               "servers": self.servers, "rows": self.rows}
        (self.out / "sweep.json").write_text(json.dumps(doc, indent=1) + "\n")
        (self.out / "sweep.txt").write_text(text + "\n")
        return text

    def plan(self) -> dict[str, list[Any]]:
        a = self.args
        return {"methods": a.methods.split(","), "budgets": [int(b) for b in a.budgets.split(",")],
                "temperatures": [float(t) for t in a.temperatures.split(",")],
                "levels": [int(c) for c in a.concurrency.split(",")]}

    def run_level(self, url: str, tags: dict[str, Any], level: int, budget: int | None) -> dict[str, Any]:
        """Batches of one level until the last lasts --min-seconds (see next_batch); a row of the last one."""
        a, t = self.args, time.perf_counter()
        batches: list[tuple[int, float]] = []
        summary: dict[str, Any] = {}
        counters_before = server_counters(url)  # covers the probes too: the same traffic, only shorter
        while n := next_batch(level, batches, min_requests=a.min_requests, min_seconds=a.min_seconds,
                              max_requests=a.max_requests, seconds_left=self.seconds_left()):
            done = sum(b for b, _ in batches)
            # same tags and a larger total: run_throughput skips the stored requests and summarises only the new
            result = run_throughput(url, a.prompts, concurrency=[level], num_requests=done + n,
                                    max_new_tokens=a.max_new_tokens, variant=variant(tags["temperature"]),
                                    tags=tags, out=self.out / "sweep_records.jsonl", budget=budget)
            summary = {**result["levels"][level], "first_request_index": done}
            batches.append((summary["requests"], summary["duration_s"]))
        seconds = time.perf_counter() - t
        counters = server_counters(url)
        loop = loop_per_round(counters_before["engine_loop"], counters["engine_loop"])
        phases = request_phases(counters_before["request_timeline"], counters["request_timeline"])
        self.level_estimate_s = max(seconds, MARGIN * a.min_seconds)
        return {**tags, "concurrency": level, **{k: summary.get(k) for k in (
            "requests", "errors", "output_tokens", "duration_s", "output_tokens_per_s", "mean_tpot", "mean_ttft",
            "e2e_p50", "e2e_p90", "first_request_index")},
            "short": (summary.get("duration_s") or 0) < a.min_seconds, "batches": batches,
            "level_requests": sum(n for n, _ in batches), "level_seconds": seconds, "loop": loop,
            "request_phases": phases}

    def launch_server(self, method: str, budgets: list[int | None]) -> Any:
        """Start one method's server process (not waited for: `wait_ready`); None when it would not fit."""
        a = self.args
        if not self.fits(f"the {method} server", self.level_estimate_s):
            return None
        port = free_port()
        top = max((b for b in budgets if b is not None), default=1)
        cmd = [sys.executable, "-m", "ddtree.cli", "serve", "--model", a.pair, "--method", method,
               "--budget", str(top), "--max-budget", str(top), "--max-batch", str(a.max_batch),
               "--max-seq-len", str(a.max_seq_len), "--device", a.device, "--dtype", a.dtype,
               "--port", str(port), "--log-level", "info"]  # info: the engine's warm-up lines, one per program
        if method == "ddtree":
            cmd += ["--warmup-budgets", ",".join(str(b) for b in budgets)]
        info: dict[str, Any] = self.servers.setdefault(method, {"log": f"server_{method}.log", "startup_s": None})
        info["launched_at"] = time.perf_counter()
        return start_server(cmd, self.out / info["log"], port=port)

    def wait_ready(self, method: str, server: Any) -> bool:
        """Wait for a launched server's health; False (server stopped, the reason recorded) when it did not come up."""
        info = self.servers[method]
        # a start that cannot leave time for one level is cut here, not by the command's timeout
        wait = min(self.args.health_timeout_s, self.seconds_left() - self.level_estimate_s)
        try:
            wait_for_health(server.url, max(wait, 1.0), process=server.process, log_path=server.log_path)
        except (RuntimeError, TimeoutError) as exc:
            info["error"] = str(exc).splitlines()[0]
            print(f"{method} server not ready: {info['error']}", flush=True)
            stop_server(server)
            return False
        info["startup_s"] = time.perf_counter() - info.pop("launched_at")
        print(f"{method} server ready in {info['startup_s']:.1f} s", flush=True)
        self.write()
        return True

    def measure(self, cells: list[tuple[str, int | None, Any]]) -> None:
        """cells: (method, budget, server). One untimed warm-up per (cell, T), then --repeats passes over the
        levels; within a pass each level measures every cell back to back, in an order rotated per pass, so a
        ratio between methods compares neighbours in time and a drift of the machine shows as spread."""
        a, plan = self.args, self.plan()
        top_level = max(plan["levels"])
        for method, budget, server in cells:
            for temperature in plan["temperatures"]:
                if not self.fits(f"warm-up {method} budget {budget or '-'}", self.level_estimate_s):
                    return
                tags = {"method": method, "budget": budget or 0, "temperature": temperature, "warmup": True}
                run_throughput(server.url, a.prompts, concurrency=[top_level], num_requests=top_level,
                               max_new_tokens=a.max_new_tokens, variant=variant(temperature), tags=tags,
                               out=self.out / "warmup.jsonl", budget=budget)
        for rep in range(a.repeats):
            order = cells[rep % len(cells):] + cells[: rep % len(cells)]
            for temperature in plan["temperatures"]:
                for level in plan["levels"]:
                    for method, budget, server in order:
                        what = f"{method} budget {budget or '-'} T={temperature:g} c={level} pass {rep + 1}"
                        if not self.fits(what, self.level_estimate_s):
                            return
                        tags = {"method": method, "budget": budget or 0, "temperature": temperature, "repeat": rep}
                        row = self.run_level(server.url, tags, level, budget)
                        self.rows.append(row)
                        print(f"  {what}: {row['output_tokens_per_s'] or 0:9.1f} tok/s, TPOT "
                              f"{1e3 * (row['mean_tpot'] or 0):7.2f} ms, {row['requests']} requests in "
                              f"{row['duration_s'] or 0:.2f} s (level {row['level_requests']} in "
                              f"{row['level_seconds']:.1f} s), errors {row['errors']}", flush=True)
                        if row["loop"]:
                            lp = row["loop"]
                            print(f"    per round (ms): launch {lp['launch_ms']:.3f} wait {lp['wait_ms']:.3f} "
                                  f"post {lp['post_ms']:.3f} admit {lp['admit_ms']:.3f} idle {lp['idle_ms']:.3f}; "
                                  f"{lp['rows']:.2f} rows, {lp['admissions']:.2f} admissions", flush=True)
                        self.write()


MISSING = "missing"  # a planned cell with no measurement (a time-budget stop, a server that did not start)


def cell_medians(rows: list[dict[str, Any]], temperature: float, level: int) -> dict[tuple[str, int], float]:
    """(method, budget) -> the median tokens/s over the passes that measured it, at one (T, concurrency)."""
    rates: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        if r["temperature"] == temperature and r["concurrency"] == level and r["output_tokens_per_s"] is not None:
            rates.setdefault((r["method"], r["budget"]), []).append(r["output_tokens_per_s"])
    return {cell: statistics.median(x) for cell, x in rates.items()}


def repeats_table(rows: list[dict[str, Any]], plan: dict[str, list[Any]]) -> str:
    """Per (T, concurrency) and pass: ar, dflash and the best ddtree budget (by median) in tokens/s, the ratios
    within the pass, and each method's spread (max / min over passes)."""
    lines = [f"{'T':>4} {'conc':>5} {'pass':>4} {'ar':>9} {'dflash':>9} {'ddtree':>9} {'budget':>6} {'/dflash':>8} "
             f"{'/ar':>6}"]
    for temperature in plan["temperatures"]:
        for level in plan["levels"]:
            med = cell_medians(rows, temperature, level)
            trees = {b: x for (m, b), x in med.items() if m == "ddtree"}
            best = max(trees, key=trees.get, default=None)
            per_pass: dict[int, dict[str, float]] = {}
            for r in rows:
                if r["temperature"] != temperature or r["concurrency"] != level or r["output_tokens_per_s"] is None:
                    continue
                name = r["method"] if r["method"] != "ddtree" else ("ddtree" if r["budget"] == best else None)
                if name is not None:
                    per_pass.setdefault(r.get("repeat", 0), {})[name] = r["output_tokens_per_s"]
            for rep, x in sorted(per_pass.items()):
                ratio = lambda a, b: f"{x[a] / x[b]:.2f}x" if a in x and b in x else "-"  # noqa: E731
                lines.append(f"{temperature:>4g} {level:>5} {rep + 1:>4} "
                             + " ".join(f"{x[m]:>9.1f}" if m in x else f"{'-':>9}" for m in ("ar", "dflash", "ddtree"))
                             + f" {best if best is not None else '-':>6} {ratio('ddtree', 'dflash'):>8} "
                               f"{ratio('ddtree', 'ar'):>6}")
            spread = []
            for m in ("ar", "dflash", "ddtree"):
                xs = [x[m] for x in per_pass.values() if m in x]
                if len(xs) > 1:
                    spread.append(f"{m} {max(xs) / min(xs):.2f}")
            if spread:
                lines.append(f"{'':>10} spread (max / min over passes): " + ", ".join(spread))
    return "\n".join(lines)


def summary_table(rows: list[dict[str, Any]], plan: dict[str, list[Any]]) -> str:
    """Tokens/s per planned (T, concurrency): ar, dflash, every ddtree budget and the best (medians over the
    passes); unplanned methods '-'."""
    fmt = lambda x: MISSING if x is None else f"{x:.1f}"  # noqa: E731
    ratio = lambda a, b: "-" if a is None or not b else f"{a / b:.2f}x"  # noqa: E731
    lines = [f"{'T':>4} {'conc':>5} {'ar tok/s':>9} {'dflash':>9} {'best ddtree':>12} {'budget':>7} "
             f"{'/dflash':>8} {'/ar':>6}   ddtree tok/s per budget"]
    for temperature in plan["temperatures"]:
        for level in plan["levels"]:
            at = cell_medians(rows, temperature, level)
            rate = lambda m: at.get((m, 0)) if m in plan["methods"] else None  # noqa: E731
            cell = lambda m: fmt(rate(m)) if m in plan["methods"] else "-"  # noqa: E731
            trees = {b: at.get(("ddtree", b)) for b in plan["budgets"]} if "ddtree" in plan["methods"] else {}
            best = max((b for b in trees if trees[b] is not None), key=lambda b: trees[b] or 0, default=None)
            b_rate = trees[best] if best is not None else None
            per = " ".join(f"{b}:{fmt(x)}" for b, x in trees.items())
            lines.append(f"{temperature:>4g} {level:>5} {cell('ar'):>9} {cell('dflash'):>9} "
                         f"{fmt(b_rate) if trees else '-':>12} {best if best is not None else '-':>7} "
                         f"{ratio(b_rate, rate('dflash')):>8} {ratio(b_rate, rate('ar')):>6}   {per}")
    return "\n".join(lines)


def report(rows: list[dict[str, Any]], servers: dict[str, dict[str, Any]], plan: dict[str, list[Any]],
           stopped: str | None) -> str:
    """sweep.txt: start-ups, the summary table, one line per measured level, why the sweep stopped early."""
    def start(m: str) -> str:
        seconds = servers.get(m, {}).get("startup_s")
        return f"{seconds:.1f} s" if seconds is not None else "not ready" if m in servers else "not started"

    lines = ["server start-up: " + ", ".join(f"{m} {start(m)}" for m in plan["methods"]), "",
             summary_table(rows, plan), ""]
    if any(r.get("repeat", 0) > 0 for r in rows):
        lines += ["per pass (interleaved: each level measures every method back to back):", repeats_table(rows, plan), ""]
    lines += [
             f"{'method':<7} {'budget':>6} {'T':>4} {'conc':>5} {'requests':>8} {'seconds':>8} {'tok/s':>9} "
             f"{'TPOT ms':>8} {'errors':>6}   level (probes included)"]
    for r in rows:
        lines.append(f"{r['method']:<7} {r['budget'] or '-':>6} {r['temperature']:>4g} {r['concurrency']:>5} "
                     f"{r['requests'] or 0:>8} {r['duration_s'] or 0:>8.2f} {r['output_tokens_per_s'] or 0:>9.1f} "
                     f"{1e3 * (r['mean_tpot'] or 0):>8.2f} {r['errors'] or 0:>6}   {r['level_requests']} requests "
                     f"in {r['level_seconds']:.1f} s{' (short of --min-seconds)' if r['short'] else ''}")
    looped = [r for r in rows if r.get("loop")]
    if looped:
        lines += ["", "the server's decoding loop per round, ms (whole level, probes included): enqueue the stages, "
                  "wait for the device, host bookkeeping after, admissions, idle",
                  f"{'method':<7} {'budget':>6} {'T':>4} {'conc':>5} {'launch':>7} {'wait':>7} {'post':>7} "
                  f"{'admit':>7} {'idle':>7} {'rows':>5} {'admits':>7}"]
        for r in looped:
            lp = r["loop"]
            lines.append(f"{r['method']:<7} {r['budget'] or '-':>6} {r['temperature']:>4g} {r['concurrency']:>5} "
                         + " ".join(f"{lp[k + '_ms']:>7.3f}" for k in ("launch", "wait", "post", "admit", "idle"))
                         + f" {lp['rows']:>5.2f} {lp['admissions']:>7.2f}")
    phased = [r for r in rows if r.get("request_phases")]
    if phased:
        lines += ["", "a request's time, ms (server phases over the whole level; the client's cycle, concurrency x "
                  "seconds / requests, and the median end-to-end latency over the reported batch): waiting for a "
                  "row, in the engine, handed back to the event loop; the cycle less the three is HTTP, parsing, the "
                  "response and the client",
                  f"{'method':<7} {'budget':>6} {'T':>4} {'conc':>5} {'queue':>7} {'engine':>7} {'handoff':>7} "
                  f"{'cycle':>7} {'e2e p50':>7}"]
        for r in phased:
            ph = r["request_phases"]
            cycle = 1e3 * r["concurrency"] * r["duration_s"] / r["requests"] if r.get("requests") else math.nan
            e2e = 1e3 * r["e2e_p50"] if r.get("e2e_p50") is not None else math.nan
            lines.append(f"{r['method']:<7} {r['budget'] or '-':>6} {r['temperature']:>4g} {r['concurrency']:>5} "
                         + " ".join(f"{ph[k + '_ms']:>7.3f}" for k in ("queue", "engine", "handoff"))
                         + f" {cycle:>7.3f} {e2e:>7.3f}")
    if stopped:
        lines += ["", f"stopped early ({stopped}); cells marked {MISSING} were not measured"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", required=True)
    ap.add_argument("--prompts", default=None, help="default PAIR/prompts/heldout.jsonl")
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--budgets", default="16,32,64,128")
    ap.add_argument("--temperatures", default="0")
    ap.add_argument("--methods", default="ar,dflash,ddtree")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--min-requests", type=int, default=16, help="a level's first batch: max(this, 2 x concurrency)")
    ap.add_argument("--min-seconds", type=float, default=3.0, help="the reported batch of a level lasts at least this")
    ap.add_argument("--max-requests", type=int, default=2000, help="at most this many requests in one level")
    ap.add_argument("--time-budget-s", type=float, default=None,
                    help="seconds from the start: no server or level is started that would not fit")
    ap.add_argument("--repeats", type=int, default=1,
                    help="passes over the levels; every server stays up and each level measures all methods "
                         "back to back (the summary reports medians, the per-pass table the spread)")
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--max-seq-len", type=int, default=2048)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--health-timeout-s", type=float, default=300.0)
    args = ap.parse_args(argv)
    if args.min_requests < 1 or args.max_requests < 1 or args.min_seconds < 0 or args.repeats < 1:
        ap.error("--min-requests, --max-requests and --repeats must be >= 1, --min-seconds >= 0")
    args.prompts = args.prompts or str(Path(args.pair) / "prompts" / "heldout.jsonl")
    out = Path(os.environ.get("OUT") or "results/serve_sweep")
    out.mkdir(parents=True, exist_ok=True)
    sweep = Sweep(args, out)
    budgets = sweep.plan()["budgets"]
    servers = []
    try:
        # every server starts at once (their start-ups, mostly compiling and capturing, overlap), then each is
        # waited for; an idle server's engine blocks on its pipe, so it does not disturb the one being measured
        launched = []
        for method in sweep.plan()["methods"]:
            method_budgets = budgets if method == "ddtree" else [None]
            server = sweep.launch_server(method, method_budgets)
            if server is not None:
                servers.append(server)
                launched.append((method, method_budgets, server))
        cells = [(method, b, server) for method, method_budgets, server in launched
                 if sweep.wait_ready(method, server) for b in method_budgets]
        if cells:
            sweep.measure(cells)
    finally:
        for server in servers:
            stop_server(server)
    print(sweep.write())
    return 1 if any(s["startup_s"] is None for s in sweep.servers.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
