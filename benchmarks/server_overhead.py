"""The reference server's own cost per request: the real app, scheduler and HTTP client around a stub engine
whose rounds are sleeps (a sleep releases the GIL as a CUDA synchronisation does) emitting --tau tokens a row.
With the engine's time known exactly, what the served throughput lacks against it is the server's host work
(HTTP parsing, tokenising, the event loop, the hand-off between threads, the response), reported as
milliseconds per request. Greedy, non-streaming requests of --max-new-tokens, like `gpu_pair/serve_sweep.py`.

    PYTHONPATH=src python benchmarks/server_overhead.py --concurrency 1,8 --round-ms 1 --tau 7 --requests 256

The server runs in a child process (`--serve PORT`), the client in this one; on a machine with few cores the
two compete, so compare runs on the same machine only. The engine-bound rate uses the measured length of the
stub's sleeps, which overshoot their nominal time.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
import functools
from pathlib import Path

from ddtree.testing.stub_engine import ByteTokenizer, StubEngine


def slept_ms(ms: float, samples: int = 200) -> float:
    """The mean time time.sleep(ms) takes here (it overshoots by tens of microseconds)."""
    t = time.perf_counter()
    for _ in range(samples):
        time.sleep(ms / 1e3)
    return (time.perf_counter() - t) / samples * 1e3


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from ddtree.server.app import create_app
    from ddtree.server.engine_process import EngineProcess

    factory = functools.partial(StubEngine, args.round_ms / 1e3, args.admit_ms / 1e3, args.tau, args.max_batch,
                                args.host_ms / 1e3)
    # the engine decodes in a process of its own, as `ddtree serve`'s does, unless asked to share the server's
    engine = factory() if args.engine_in_process else EngineProcess(factory, log_level="WARNING")
    app = create_app(engine, ByteTokenizer(), method="ddtree", budget=32, model_name="stub")
    uvicorn.run(app, host="127.0.0.1", port=args.serve, log_level="warning")
    return 0


def measure(args: argparse.Namespace) -> int:
    import httpx

    from ddtree.bench.session import free_port
    from ddtree.bench.throughput import run_throughput
    from ddtree.server.app import RequestTimeline

    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--round-ms", str(args.round_ms),
                               "--admit-ms", str(args.admit_ms), "--tau", str(args.tau), "--host-ms", str(args.host_ms),
                               "--max-batch", str(args.max_batch)] + ["--engine-in-process"] * args.engine_in_process)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        with tempfile.TemporaryDirectory() as tmp:
            prompts = Path(tmp) / "prompts.jsonl"
            prompts.write_text("".join(json.dumps({"text": f"def f{i}(x):\n    return x * {i}\n" * 8}) + "\n"
                                       for i in range(64)))
            rounds = math.ceil((args.max_new_tokens - 1) / args.tau)
            slept, admit_ms = slept_ms(args.round_ms), slept_ms(args.admit_ms)  # what a sleep really takes
            round_ms = args.host_ms + slept
            where = "in the server's process" if args.engine_in_process else "in its own process"
            print(f"stub engine {where}: {args.round_ms} ms a round ({slept:.3f} slept) after {args.host_ms} ms "
                  f"of Python holding the GIL, {args.admit_ms} ms an admission ({admit_ms:.3f} slept), tau {args.tau}, "
                  f"{rounds} rounds a request of {args.max_new_tokens} tokens, batch {args.max_batch}")
            print(f"{'conc':>5} {'requests':>8} {'tok/s':>9} {'engine-bound tok/s':>18} {'efficiency':>10} "
                  f"{'server ms/request':>17}   a request's ms: waiting for a row, in the engine, handed back")
            for level in (int(c) for c in args.concurrency.split(",")):
                for repeat in range(args.repeats + 1):  # the first pass warms the connection pool: not reported
                    out = Path(tmp) / f"records_{level}_{repeat}.jsonl"
                    before = httpx.get(url + "/server_info", timeout=10).json()["request_timeline"]
                    t = time.perf_counter()
                    result = run_throughput(url, prompts, concurrency=[level], num_requests=args.requests,
                                            max_new_tokens=args.max_new_tokens, out=out)
                    wall = time.perf_counter() - t
                    after = httpx.get(url + "/server_info", timeout=10).json()["request_timeline"]
                    if not repeat:
                        continue
                    per_request = RequestTimeline.per_request_ms(before, after) or {}
                    phases = " ".join(f"{per_request.get(k + '_ms', math.nan):7.3f}" for k in ("queue", "engine", "handoff"))
                    tokens = args.requests * args.max_new_tokens
                    rows = min(level, args.max_batch)
                    # the engine's time alone: every admission, then the rounds with `rows` requests each
                    engine_s = args.requests * (admit_ms + rounds * round_ms / rows) / 1e3
                    summary = result["levels"][level]
                    seconds = summary["duration_s"] or wall
                    print(f"{level:>5} {args.requests:>8} {tokens / seconds:>9.0f} {tokens / engine_s:>18.0f} "
                          f"{engine_s / seconds:>10.2f} {(seconds - engine_s) / args.requests * 1e3:>17.3f}   {phases}",
                          flush=True)
    finally:
        server.terminate()
        server.wait(timeout=10)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--round-ms", type=float, default=1.0)
    ap.add_argument("--admit-ms", type=float, default=0.3)
    ap.add_argument("--host-ms", type=float, default=0.0, help="Python work a round does before its sleep, holding "
                    "the GIL (the real loop enqueues and keeps its books ~0.4 ms a round at 8 requests on the H200)")
    ap.add_argument("--tau", type=int, default=7)
    ap.add_argument("--engine-in-process", action="store_true",
                    help="decode in the server's process (a thread beside the event loop, sharing its GIL), as the "
                         "server did before its engine got a process of its own")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    return serve(args) if args.serve is not None else measure(args)


if __name__ == "__main__":
    raise SystemExit(main())
