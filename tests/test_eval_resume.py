"""`semif-proxy eval` for real runs, against the real server and the real command: a server
that admits one request at a time and queues none (SEMIF_MAX_IN_FLIGHT=1, SEMIF_MAX_QUEUE=0:
a second request at once is a 503 with Retry-After) still gets every row answered at
--concurrency 3; a URL target keeps one connection for the run; a run interrupted with Ctrl-C
keeps its answers in <out>.rows.jsonl and --resume asks only the rest (counted in the server's
access log); the bar on a terminal. The retry bounds themselves on a target that always says 503.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from semif_proxy.eval.runner import Limiter, Retries, ask_one, parse_row
from semif_proxy.eval.targets import Failure, retry_after
from semif_proxy.testing.server import ProxyProcess, wait_for

TEAMS = [
    {"id": "billing", "description": "payments, charges and refunds"},
    {"id": "shipping", "description": "deliveries and parcels"},
    {"id": "account", "description": "logins and passwords"},
]
TICKETS = [
    ("My card was charged twice for order {i}; I want one charge back.", "billing"),
    ("Parcel {i} was due on Monday and has still not arrived.", "shipping"),
    ("I cannot log in since I reset my password (attempt {i}).", "account"),
]


def decision_rows(n: int) -> list[dict[str, Any]]:
    """n labelled decisions, each state its own (no two rows share a prefix)."""
    rows = []
    for i in range(n):
        text, team = TICKETS[i % len(TICKETS)]
        decision = {
            "id": f"ticket-{i}",
            "state": text.format(i=i),
            "question": "Which team should handle this ticket?",
            "options": TEAMS,
        }
        rows.append({"decision": decision, "expected": team})
    return rows


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def eval_command(rows: Path, target: str, out: Path, *extra: str) -> list[str]:
    cmd = [sys.executable, "-m", "semif_proxy.cli", "eval", str(rows), "--target", target]
    return [*cmd, "--out", str(out), *extra]


def run_eval(*args: Any, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(eval_command(*args), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def tight(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyProcess]:
    log = tmp_path_factory.mktemp("tight") / "server.log"
    env = {"SEMIF_CHAT": "off", "SEMIF_MAX_IN_FLIGHT": "1", "SEMIF_MAX_QUEUE": "0"}
    server = ProxyProcess(model_path, env, log_path=log).start()
    yield server
    server.stop()


def decisions_seen(server: ProxyProcess) -> list[int]:
    """The statuses of every POST /v1/decisions the server has logged, in order."""
    out = []
    for line in server.log_lines():
        record = json.loads(line)
        if record.get("msg") == "request" and record.get("path") == "/v1/decisions":
            out.append(record["status"])
    return out


def settled_count(server: ProxyProcess) -> int:
    """The number of decision requests logged, once it stops changing (a request cut off by
    an interrupted client is logged when its handler ends)."""
    last = -1
    while True:
        now = len(decisions_seen(server))
        if now == last:
            return now
        last = now
        time.sleep(0.5)


def record_lines(path: Path) -> list[dict[str, Any]]:
    """The complete records of a rows file."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def test_a_full_queue_is_retried_until_every_row_is_answered(tight, tmp_path):
    rows = write_rows(tmp_path / "rows.jsonl", decision_rows(9))
    out = tmp_path / "results.json"
    before = len(decisions_seen(tight))
    done = run_eval(rows, tight.url, out, "--concurrency", "3")
    assert done.returncode == 0, done.stderr
    results = json.loads(out.read_text())
    metrics = results["targets"][0]["metrics"]
    assert (metrics["answered"], metrics["errors"]) == (9, 0)
    statuses = Counter(decisions_seen(tight)[before:])
    # Three rows at once against one place and no queue: the server did refuse some...
    assert statuses[503] >= 1, statuses
    assert set(statuses) == {200, 503} and statuses[200] == 9
    # ...and each refusal is one more try of the row it refused, recorded on that row.
    tries = [r["answers"][tight.url]["tries"] for r in results["results"]]
    assert sum(t - 1 for t in tries) == statuses[503] == results["run"]["retries"]
    assert f"retries: {statuses[503]}" in done.stderr
    assert "ask/s" not in done.stderr  # no bar off a terminal


class Relay:
    """A TCP relay in front of the server that counts the connections made through it."""

    def __init__(self, port: int) -> None:
        self.upstream = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            server = socket.create_connection(("127.0.0.1", self.upstream))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


def test_a_url_target_keeps_one_connection_for_the_run(tight, tmp_path):
    relay = Relay(tight.port)
    try:
        rows = write_rows(tmp_path / "rows.jsonl", decision_rows(6))
        out = tmp_path / "results.json"
        before = len(decisions_seen(tight))
        done = run_eval(rows, f"http://127.0.0.1:{relay.port}", out)
        assert done.returncode == 0, done.stderr
        assert decisions_seen(tight)[before:] == [200] * 6
        assert relay.accepted == 1
    finally:
        relay.close()


def test_an_interrupted_run_resumes_without_asking_again(tight, tmp_path):
    total = 30
    rows = write_rows(tmp_path / "rows.jsonl", decision_rows(total))
    out, html = tmp_path / "results.json", tmp_path / "report.html"
    log = tmp_path / "results.json.rows.jsonl"
    command = eval_command(rows, tight.url, out, "--html", str(html))
    before = len(decisions_seen(tight))
    # Ctrl-C as a terminal delivers it: a run started in the background by a shell without job
    # control (`cmd &`, nohup) inherits SIGINT ignored, and Python then keeps it ignored.
    first = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        wait_for(lambda: len(record_lines(log)) >= 5, 120, "five answers in the rows file")
        first.send_signal(signal.SIGINT)  # Ctrl-C
        _, err = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 130, err
    assert "--resume" in err and "Traceback" not in err
    assert not out.exists() and not html.exists()
    kept = record_lines(log)
    assert 5 <= len(kept) < total
    first_run = settled_count(tight) - before
    assert first_run in (len(kept), len(kept) + 1)  # plus the one Ctrl-C cut short, if any
    # A run killed mid-write leaves a line cut short: it is skipped, and what follows starts on
    # a line of its own.
    with log.open("a", encoding="utf-8") as f:
        f.write('{"line": 3, "target": "http')

    between = settled_count(tight)
    second = subprocess.run([*command, "--resume"], capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    asked = decisions_seen(tight)[between:]
    assert asked == [200] * (total - len(kept))
    results = json.loads(out.read_text())
    assert results["rows"] == total and results["targets"][0]["metrics"]["answered"] == total
    assert results["run"]["resumed"] == len(kept)
    assert results["run"]["rows_log_unreadable_lines"] == 1
    by_line = {r["line"]: r["answers"][tight.url] for r in results["results"]}
    for record in kept:  # the answers of the first run, as they were (timings included)
        assert by_line[record["line"]] == record["answer"]
    records = record_lines(log)
    assert len(records) == total
    assert {r["line"] for r in records} == set(range(1, total + 1))
    assert html.read_text().count(tight.url) >= 1
    assert f"resumed: {len(kept)} answers" in second.stderr


def test_the_bar_on_a_terminal_has_the_count_and_an_eta(tight, tmp_path):
    rows = write_rows(tmp_path / "rows.jsonl", decision_rows(4))
    out = tmp_path / "results.json"
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    proc = subprocess.Popen(
        eval_command(rows, tight.url, out),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=slave,
    )
    os.close(slave)
    shown = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child closed its side
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    assert proc.wait(timeout=120) == 0
    text = shown.decode("utf-8", "replace")
    assert re.search(r"eval: +100%\|[^|]*\| 4/4 \[", text), text
    assert re.search(r"\d/4 \[\d\d:\d\d<\d\d:\d\d", text), text  # elapsed < remaining
    assert "wrote " in text


# -- the retry bounds -------------------------------------------------------------------------


class Refusing:
    """A target that always answers 503, with the Retry-After it is given."""

    name = "refusing"

    def __init__(self, wait: float | None) -> None:
        self.wait = wait
        self.asked: list[float] = []

    def ask(self, route: str, body: dict[str, Any]) -> Failure:
        self.asked.append(time.monotonic())
        return Failure("HTTP 503", 0.0, 503, None, self.wait)


def a_row() -> Any:
    return parse_row(1, decision_rows(1)[0], Path("rows.jsonl"))


def test_retries_stop_at_the_tries_and_the_budget() -> None:
    stop = threading.Event()
    quick = Retries(tries=5, budget=30.0, first_wait=0.01, max_wait=0.04)
    target = Refusing(None)
    got, tries = ask_one(target, a_row(), Limiter(1, stop), quick)
    assert isinstance(got, Failure) and got.status == 503 and tries == 5
    assert len(target.asked) == 5
    # The waits double from first_wait (plus up to a fifth), up to max_wait.
    gaps = [b - a for a, b in zip(target.asked, target.asked[1:])]
    assert gaps[0] >= 0.01 and gaps[1] >= 0.02 and gaps[3] >= 0.04
    # A Retry-After is waited out, whatever the backoff says...
    target = Refusing(0.3)
    got, tries = ask_one(target, a_row(), Limiter(1, stop), Retries(tries=2, budget=30.0))
    assert tries == 2 and target.asked[1] - target.asked[0] >= 0.3
    # ...unless it would take the row's waits past the budget: then the row keeps its failure.
    target = Refusing(5.0)
    start = time.monotonic()
    got, tries = ask_one(target, a_row(), Limiter(1, stop), Retries(tries=5, budget=1.0))
    assert tries == 1 and time.monotonic() - start < 1.0


def test_retry_after_is_seconds_or_a_date() -> None:
    assert retry_after("2") == 2.0
    assert retry_after(None) is None and retry_after("soon") is None
    later = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 60))
    assert 55 <= (retry_after(later) or 0) <= 61
