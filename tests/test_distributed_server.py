"""``core serve`` split over processes: a TP=2 or PP=2 server whose worker dies, a DP=2 server under load.

Each test starts a real server on the tiny random Llama with its own worker processes
(about 20-40 s on 2 cores, most of it the workers importing torch).
"""

import concurrent.futures
import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

PROMPT = {"prompt": "Hello", "temperature": 0, "ignore_eos": True}


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc's children lists)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            todo += [c for c in children if c not in found]
            found.update(children)
    return found


def alive(pids: set[int]) -> set[int]:
    left = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            left.add(pid)
    return left


@pytest.fixture
def two_cpus(monkeypatch):
    """One CPU per rank (``0|1``), and a test thread that may use both: the server inherits its
    affinity, which an earlier test that bound this thread may have narrowed."""
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, range(os.cpu_count() or 1))
    if not {0, 1} <= os.sched_getaffinity(0):
        pytest.skip("needs CPUs 0 and 1")
    monkeypatch.setenv("CORE_CPU_OMP_THREADS_BIND", "0|1")
    yield
    os.sched_setaffinity(0, mine)


@pytest.mark.parametrize("split", [["-tp", "2"], ["-pp", "2"]], ids=["tp2", "pp2"])
def test_split_server_reports_a_killed_worker_answers_503_and_exits(split, tiny_llama, start_server, two_cpus):
    server = start_server(tiny_llama, *split, "--dtype", "float32", "--max-model-len", "512")
    try:
        ok = httpx.post(f"{server.url}/v1/completions", json={**PROMPT, "max_tokens": 4}, timeout=60)
        assert ok.status_code == 200, ok.text
        # ranks 0 and 1 (pp2), or only rank 1 (tp2: rank 0 runs in the server's process)
        pids = [int(p) for p in re.search(r"worker processes \(pids \[([\d, ]+)\]\)", server.log)[1].split(",")]
        assert len(pids) == (1 if split[0] == "-tp" else 2)
        family = descendants(server.proc.pid)
        assert set(pids) <= family
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a long request in flight when the worker dies
            long = pool.submit(
                httpx.post, f"{server.url}/v1/completions", json={**PROMPT, "max_tokens": 500}, timeout=60
            )
            # the kill must land while it runs: the fused TP decoder makes 500 tokens in well under a
            # second on a quiet machine (a fixed 1 s sleep let a 200-token request finish first)
            deadline = time.monotonic() + 30
            while not re.search(
                r"^core:num_requests_running\{.*\} [1-9]", httpx.get(f"{server.url}/metrics").text, re.M
            ):
                assert time.monotonic() < deadline and not long.done(), "the long request never ran"
                time.sleep(0.005)
            killed = time.monotonic()
            os.kill(pids[-1], signal.SIGKILL)
            answer = long.result()
        assert answer.status_code == 503, answer.text
        assert "rank 1" in answer.json()["error"]["message"]
        status = server.proc.wait(30 - (time.monotonic() - killed))
        assert status == 1, server.log[-3000:]
        assert "rank 1" in server.log
        deadline = time.monotonic() + 5  # multiprocessing's resource tracker leaves once its pipe closes
        while alive(family) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(family), f"left behind: {[Path(f'/proc/{p}/cmdline').read_text() for p in alive(family)]}"
    finally:
        server.stop()


def test_dp2_server_keeps_both_replicas_busy(tiny_llama, start_server, two_cpus):
    server = start_server(tiny_llama, "-dp", "2", "--dtype", "float32", "--max-model-len", "256")
    try:
        busy: dict[str, float] = {"0": 0.0, "1": 0.0}
        done = threading.Event()

        def scrape() -> None:
            while not done.is_set():
                text = httpx.get(f"{server.url}/metrics", timeout=10).text
                for engine, value in re.findall(r'^core:num_requests_running\{engine="(\d)".*\} (\S+)$', text, re.M):
                    busy[engine] = max(busy[engine], float(value))
                time.sleep(0.05)

        watcher = threading.Thread(target=scrape)
        watcher.start()

        def stream(i: int) -> int:  # the number of tokens generated, from the stream's final usage
            body = {**PROMPT, "prompt": f"Hello {i}", "max_tokens": 24, "stream": True}
            body["stream_options"] = {"include_usage": True}
            with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=120) as response:
                assert response.status_code == 200
                events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
            return events[-1]["usage"]["completion_tokens"]

        try:
            with concurrent.futures.ThreadPoolExecutor(32) as pool:
                chunks = list(pool.map(stream, range(32)))
        finally:
            done.set()
            watcher.join()
        assert all(n == 24 for n in chunks), chunks
        assert busy["0"] > 0 and busy["1"] > 0, busy
    finally:
        server.stop()
