"""`ddtree bench session --plan plan.json`: start a server, benchmark it, always stop it.

The server runs in its own process group (`start_new_session=True`) so the whole group (an SGLang
server's scheduler/detokenizer children included) can be signalled at once. It is terminated in a
`finally`, and SIGTERM/SIGINT sent to the session raise inside it, so a killed benchmark leaves no
server behind and no held port.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddtree.bench.acceptance import format_summary as format_acceptance
from ddtree.bench.acceptance import run_acceptance
from ddtree.bench.http_client import get_json, setup_logging, wait_for_health
from ddtree.bench.sglang_client import format_summary as format_sglang_bench
from ddtree.bench.sglang_client import run_sglang_bench
from ddtree.bench.schema import BenchPlan, SchemaError, ServerSpec, read_plan
from ddtree.bench.throughput import format_summary as format_throughput
from ddtree.bench.throughput import run_throughput
from ddtree.jsonl import write_json_atomic

log = logging.getLogger(__name__)

TERM_GRACE_S = 10.0
SGLANG_ALGORITHMS = {"dflash": "DFLASH", "ddtree": "DDTREE"}


class SessionInterrupted(KeyboardInterrupt):
    """The session received SIGTERM or SIGINT.

    A KeyboardInterrupt, because the signal handler raises it wherever the main thread happens to be: asyncio
    re-raises KeyboardInterrupt out of its transports and tasks, but turns any other exception raised inside a
    socket write into a logged "fatal write error" and one failed request, and the run would go on.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"received {signal.Signals(signum).name}")
        self.signum = signum


# ---------------------------------------------------------------- server process


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing listens on the port (connections in TIME_WAIT do not hold it, as for a server
    binding with SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def server_command(server: ServerSpec, host: str, port: int) -> list[str]:
    """argv that starts the plan's server on host:port."""
    method = server.method
    extra = list(server.extra_args)
    if server.engine == "reference":
        return [
            sys.executable, "-m", "ddtree.cli", "serve", "--model", server.model, "--method", method,
            "--budget", str(server.budget), "--host", host, "--port", str(port),
            "--device", server.device or "cpu", "--dtype", server.dtype or "float32", *extra,
        ]
    # SGLang: a pair directory gives target and drafter; a hub id needs the drafter in extra_args
    model = Path(server.model)
    target, drafter = (model / "target", model / "drafter") if (model / "target").is_dir() else (model, None)
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(target), "--host", host,
           "--port", str(port)]
    if method in SGLANG_ALGORITHMS:
        cmd += ["--speculative-algorithm", SGLANG_ALGORITHMS[method]]
        if drafter is not None:
            cmd += ["--speculative-draft-model-path", str(drafter)]
    if method == "ddtree":
        cmd += sglang_ddtree_args(server.budget, extra)
    if server.dtype:
        cmd += ["--dtype", server.dtype]
    if server.device and server.device != "cuda":
        cmd += ["--device", server.device]
    return cmd + extra


def sglang_ddtree_args(budget: int, extra: list[str]) -> list[str]:
    """DDTREE's SGLang arguments for a budget: N = budget + 1 verify nodes, and running requests and decode
    CUDA-graph batch sizes bounded so that N tokens per request fit (SGLang captures up to 160 requests
    otherwise: 160 x N verify rows). Flags already in `extra` (the profile's) win; the graph batch bound
    follows the profile's running-request bound when it sets one."""
    from ddtree.sglang.plugin import default_max_running_requests

    n = budget + 1
    flag = "--max-running-requests"
    bound = int(extra[extra.index(flag) + 1]) if flag in extra else default_max_running_requests(n)
    args = ["--speculative-num-draft-tokens", str(n)]
    for flag in ("--max-running-requests", "--cuda-graph-max-bs-decode"):
        if flag not in extra:
            args += [flag, str(bound)]
    return args


@dataclass
class ServerProcess:
    process: subprocess.Popen
    url: str
    port: int
    log_path: Path

    @property
    def pgid(self) -> int:
        return self.process.pid  # start_new_session: the server leads its own group


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM it when the session dies without cleaning up (SIGKILL),
    the one case no handler or `finally` can cover (Linux PR_SET_PDEATHSIG)."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start_server(cmd: list[str], log_path: str | Path, *, port: int, host: str = "127.0.0.1",
                 env: Mapping[str, str] | None = None) -> ServerProcess:
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with log_path.open("ab") as log_fh:
        log_fh.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n".encode())
        log_fh.flush()
        process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log_fh, stderr=subprocess.STDOUT,
                                   start_new_session=True, env=full_env,
                                   preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    return ServerProcess(process=process, url=f"http://{host}:{port}", port=port, log_path=log_path)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_server(server: ServerProcess, grace_s: float = TERM_GRACE_S) -> None:
    """SIGTERM the whole process group, SIGKILL what is left after `grace_s`, reap the leader."""
    pgid = server.pgid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        server.process.poll()  # reap the leader so it stops counting as alive
        if not _group_alive(pgid):
            break
        time.sleep(0.1)
    else:
        log.warning("server group %d still alive after %.0f s: SIGKILL", pgid, grace_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.process.wait(timeout=5)


@contextlib.contextmanager
def _on_signals(handler: Any) -> Iterator[None]:
    """`handler` for SIGTERM and SIGINT inside the block, the previous handlers after it."""
    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def raise_on_signals() -> contextlib.AbstractContextManager[None]:
    """Turn SIGTERM/SIGINT into `SessionInterrupted` so `finally` blocks run."""

    def handler(signum: int, _frame: Any) -> None:
        raise SessionInterrupted(signum)

    return _on_signals(handler)


def signals_ignored() -> contextlib.AbstractContextManager[None]:
    """Keep a second signal from interrupting the cleanup itself."""
    return _on_signals(signal.SIG_IGN)


# ---------------------------------------------------------------- session


def note_load(summary: dict[str, Any], at: str) -> None:
    """Append the machine's 1-minute load average at the end of a timed phase to summary["load"] (with the core
    count): timings taken with more runnable processes than cores are inflated, and the report says so."""
    summary.setdefault("cpus", os.cpu_count())
    summary.setdefault("load", []).append({"at": at, "load_1m": round(os.getloadavg()[0], 2)})


def run_phases(plan: BenchPlan, url: str, summary: dict[str, Any]) -> None:
    if (acc := plan.acceptance) is not None:
        summary["acceptance"] = run_acceptance(
            url, plan.prompts, acc.variants, num_prompts=acc.num_prompts, max_new_tokens=acc.max_new_tokens,
            samples_per_prompt=acc.samples_per_prompt, tags=plan.tags, out=plan.out.acceptance,
            concurrency=acc.concurrency, seed_salt=acc.seed_salt,
        )
        note_load(summary, "acceptance")
    if (thr := plan.throughput) is not None:
        summary["throughput"] = run_throughput(
            url, plan.prompts, concurrency=thr.concurrency, num_requests=thr.num_requests,
            max_new_tokens=thr.max_new_tokens, variant=thr.variant, tags=plan.tags, out=plan.out.throughput,
        )
        note_load(summary, "throughput")
    if (sgl := plan.sglang_bench) is not None:  # optional: SGLang's own client on the same prompts and lengths
        summary["sglang_bench"] = run_sglang_bench(
            url, plan.prompts, concurrency=sgl.concurrency, num_prompts=sgl.num_prompts, output_len=sgl.output_len,
            variant=sgl.variant, out=plan.out.sglang_bench,
        )


def run_session(plan: BenchPlan, host: str = "127.0.0.1") -> dict[str, Any]:
    """Start the server, run the phases, always stop the server; the summary records how it ended."""
    server_spec = plan.server
    log_path = server_spec.log or str(Path(plan.out.summary).with_suffix(".server.log"))
    summary: dict[str, Any] = {"plan": plan.to_json(), "status": "starting", "started_at": time.time()}
    server: ServerProcess | None = None
    try:
        with raise_on_signals():
            port = free_port(host)
            cmd = server_command(server_spec, host, port)
            summary.update(server_command=cmd, url=f"http://{host}:{port}", server_log=log_path)
            log.info("starting server: %s", " ".join(cmd))
            server = start_server(cmd, log_path, port=port, host=host)
            summary["server_pid"] = server.process.pid
            summary["health_wait_s"] = wait_for_health(
                server.url, server_spec.health_timeout_s, process=server.process,
                log_path=log_path,
            )
            summary["status"] = "running"
            run_phases(plan, server.url, summary)
            summary["server_info"] = get_json(server.url, "/server_info")
            summary["status"] = "ok"
    except SessionInterrupted as exc:
        summary.update(status="interrupted", error=str(exc), signal=exc.signum)
        raise
    except BaseException as exc:
        summary.update(status="failed", error=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        with signals_ignored():
            if server is not None:
                stop_server(server)
                summary["server_returncode"] = server.process.returncode
            summary["finished_at"] = time.time()
            write_json_atomic(plan.out.summary, summary)
    return summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plan", required=True, help="plan JSON (schema: ddtree.bench.schema.BenchPlan)")


def run(args: argparse.Namespace) -> int:
    setup_logging()
    try:
        plan = read_plan(args.plan)
    except (OSError, SchemaError) as exc:
        raise SystemExit(f"ddtree bench session: {exc}") from None
    try:
        summary = run_session(plan)
    except SessionInterrupted as exc:
        log.error("session interrupted (%s); server stopped", exc)
        return 128 + exc.signum
    except (RuntimeError, TimeoutError, ValueError) as exc:
        log.error("session failed: %s", exc)
        return 1
    if summary.get("acceptance"):
        print(format_acceptance(summary["acceptance"]), file=sys.stderr)
    if summary.get("throughput"):
        print(format_throughput(summary["throughput"]), file=sys.stderr)
    if summary.get("sglang_bench"):
        print(format_sglang_bench(summary["sglang_bench"]), file=sys.stderr)
    requests, errors = request_counts(summary)
    print(json.dumps({"status": summary["status"], "requests": requests, "errors": errors,
                      "summary": plan.out.summary}))
    # failed requests are recorded (and retried by a rerun); only a run that measured nothing fails
    return 1 if requests and errors == requests else 0


def request_counts(summary: Mapping[str, Any]) -> tuple[int, int]:
    """(requests, failed requests) over both phases, stored records included."""
    acc = summary.get("acceptance") or {}
    levels = (summary.get("throughput") or {}).get("levels", {}).values()
    requests = int(acc.get("planned", 0)) + sum(int(s["requests"]) for s in levels)
    errors = int(acc.get("errors", 0)) + sum(int(s["errors"]) for s in levels)
    return requests, errors
