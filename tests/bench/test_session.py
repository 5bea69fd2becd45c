"""`ddtree bench session`: start the server, benchmark, always stop the whole process group."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddtree.bench.schema import BenchPlan, ServerSpec, read_plan
from ddtree.bench.session import port_is_free, server_command


def make_plan(pair: Path, tmp: Path, *, model: str | None = None, num_prompts: int = 1,
              max_new_tokens: int = 4) -> Path:
    plan = {
        "server": {"engine": "reference", "model": model or str(pair), "method": "ddtree", "budget": 16,
                   "device": "cpu", "dtype": "float32", "extra_args": [], "health_timeout_s": 180,
                   "log": str(tmp / "server.log")},
        "prompts": str(pair / "prompts" / "heldout.jsonl"),
        "acceptance": {"variants": [{"name": "greedy", "temperature": 0.0, "top_k": -1, "top_p": 1.0}],
                       "num_prompts": num_prompts, "max_new_tokens": max_new_tokens, "samples_per_prompt": 1},
        "throughput": {"concurrency": [1, 2], "num_requests": 2, "max_new_tokens": 4,
                       "variant": {"name": "greedy", "temperature": 0.0, "top_k": -1, "top_p": 1.0}},
        "tags": {"profile": "cpu", "pair": "tiny", "method": "ddtree", "budget": 16},
        "out": {"acceptance": str(tmp / "acc.jsonl"), "throughput": str(tmp / "thr.jsonl"),
                "summary": str(tmp / "summary.json")},
        "schema_version": 1,
    }
    path = tmp / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def start_session(plan: Path) -> subprocess.Popen:
    # its own group, so a failing test can still clean up everything it started
    return subprocess.Popen([sys.executable, "-m", "ddtree.cli", "bench", "session", "--plan", str(plan)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)  # the server led its own group: no member may be left
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 0)
            return False
        return True
    return False


def finish(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise


def test_session_runs_the_plan_and_stops_the_server(tiny_pair: Path, tmp_path: Path) -> None:
    proc = start_session(make_plan(tiny_pair, tmp_path))
    stdout, stderr = finish(proc, 300)
    assert proc.returncode == 0, stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "ok" and json.loads(stdout)["status"] == "ok"
    assert summary["acceptance"]["written"] == 1 and summary["throughput"]["written"] == 4
    assert summary["cpus"] == os.cpu_count() and [s["at"] for s in summary["load"]] == ["acceptance", "throughput"]
    assert all(s["load_1m"] >= 0 for s in summary["load"])
    assert summary["server_info"]["internal_states"][0]["avg_spec_accept_length"] >= 1.0
    assert len((tmp_path / "acc.jsonl").read_text().splitlines()) == 1
    assert len((tmp_path / "thr.jsonl").read_text().splitlines()) == 4
    assert "Uvicorn running" in (tmp_path / "server.log").read_text()
    assert gone(summary["server_pid"])
    assert port_is_free(int(summary["url"].rsplit(":", 1)[1]))


def test_sigterm_mid_run_leaves_no_server_behind(tiny_pair: Path, tmp_path: Path) -> None:
    proc = start_session(make_plan(tiny_pair, tmp_path, num_prompts=40, max_new_tokens=64))
    acc = tmp_path / "acc.jsonl"
    deadline = time.monotonic() + 240
    while not (acc.exists() and acc.read_text().count("\n") >= 1):  # mid-way through acceptance
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no acceptance record in time"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    start = time.monotonic()
    _, stderr = finish(proc, 60)
    assert time.monotonic() - start < 30
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["signal"] == signal.SIGTERM
    assert gone(summary["server_pid"])
    assert port_is_free(int(summary["url"].rsplit(":", 1)[1]))
    done = acc.read_text().splitlines()
    assert 1 <= len(done) < 40 and all(json.loads(line)["error"] is None for line in done)


def test_sigkilled_session_takes_the_server_down(tiny_pair: Path, tmp_path: Path) -> None:
    proc = start_session(make_plan(tiny_pair, tmp_path, num_prompts=40, max_new_tokens=64))
    log = tmp_path / "server.log"
    deadline = time.monotonic() + 240
    while not (log.exists() and "Uvicorn running" in log.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    server_pid = int(re.search(r"Started server process \[(\d+)\]", log.read_text()).group(1))
    os.killpg(proc.pid, signal.SIGKILL)  # no handler, no finally: only the death signal is left
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 30
    while not gone(server_pid):
        assert time.monotonic() < deadline, "server outlived its SIGKILLed session"
        time.sleep(0.2)


def test_server_that_dies_fails_fast_with_its_log(tiny_pair: Path, tmp_path: Path) -> None:
    proc = start_session(make_plan(tiny_pair, tmp_path, model=str(tmp_path / "no-such-pair")))
    start = time.monotonic()
    _, stderr = finish(proc, 120)
    assert proc.returncode == 1 and time.monotonic() - start < 60
    assert "before becoming healthy" in stderr and "is not a directory" in stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and gone(summary["server_pid"])


def test_sglang_command() -> None:
    cmd = server_command(ServerSpec(engine="sglang", model="Qwen/Qwen3-8B", method="dflash", dtype="bfloat16",
                                    device="cuda", extra_args=("--speculative-draft-model-path", "z-lab/drafter")),
                         "127.0.0.1", 1234)
    assert cmd[1:3] == ["-m", "sglang.launch_server"]
    assert cmd[cmd.index("--model-path") + 1] == "Qwen/Qwen3-8B"
    assert cmd[cmd.index("--speculative-algorithm") + 1] == "DFLASH"
    assert cmd[cmd.index("--port") + 1] == "1234" and cmd[-2:] == ["--speculative-draft-model-path", "z-lab/drafter"]
    ar = server_command(ServerSpec(engine="sglang", model="m", method="ar"), "127.0.0.1", 1)
    assert "--speculative-algorithm" not in ar


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda p: p.pop("server"), "server"),
        (lambda p: p["server"].update(engine="vllm"), "engine"),
        (lambda p: p["server"].update(method="beam"), "method"),
        (lambda p: p["out"].pop("summary"), "summary"),
        (lambda p: (p.pop("acceptance"), p.pop("throughput")), "acceptance"),
        (lambda p: p.pop("schema_version"), "missing field `schema_version`"),
        (lambda p: p.update(schema_version=2), "`schema_version`: this code reads version 1, got 2"),
        (lambda p: p["server"].update(port=1), "unknown field `server.port`"),
        (lambda p: p["server"].pop("model"), "missing field `server.model`"),
        (lambda p: p["throughput"].update(num_requests="8"), "`throughput.num_requests`: expected int"),
        (lambda p: p["out"].pop("throughput"), "missing field `out.throughput`"),
        (lambda p: p["tags"].update(prompt_id="x"), "`tags.prompt_id` clashes"),
    ],
)
def test_bad_plans_are_refused_naming_the_file_and_field(tmp_path: Path, mutate, message: str) -> None:
    path = make_plan(tmp_path, tmp_path)
    plan = json.loads(path.read_text())
    assert read_plan(path).to_json() == {**plan, "acceptance": {**plan["acceptance"], "concurrency": 1,
                                                              "seed_salt": ""}}
    mutate(plan)
    path.write_text(json.dumps(plan))
    with pytest.raises(ValueError, match=f"plan {path}: .*{re.escape(message)}"):
        read_plan(path)
    with pytest.raises(ValueError, match=re.escape(message)):
        BenchPlan.from_json(plan)


def test_session_interrupted_escapes_an_asyncio_socket_write() -> None:
    """The signal handler raises wherever the main thread is, e.g. inside asyncio's socket write: there any
    exception but KeyboardInterrupt/SystemExit becomes a logged "fatal write error" (one failed request) and
    the run goes on. SessionInterrupted must get out (a CI run once saw it swallowed there)."""
    import asyncio
    import socket

    from ddtree.bench.session import SessionInterrupted

    class InterruptedSocket:
        """Stands in for the transport's socket: the signal 'arrives' during send."""

        def __init__(self, sock: socket.socket) -> None:
            self._sock = sock

        def send(self, data: bytes) -> int:
            raise SessionInterrupted(signal.SIGTERM)

        def __getattr__(self, name: str):
            return getattr(self._sock, name)

    async def write_once() -> None:
        left, right = socket.socketpair()
        try:
            transport, _ = await asyncio.get_running_loop().create_connection(asyncio.Protocol, sock=left)
            transport._sock = InterruptedSocket(left)  # the selector transport calls self._sock.send
            transport.write(b"x")
            await asyncio.sleep(0)
        finally:
            right.close()

    with pytest.raises(SessionInterrupted):
        asyncio.run(write_once())
