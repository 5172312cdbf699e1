"""On a fresh data dir, a durable declare-ok and a publisher confirm go out only once every directory whose entries
changed before them (the data dir in its parent, messages/ and streams/ in the data dir, each new segment or log in
its own directory) has been fsynced since: watched from outside, in the syscalls of a real broker, with strace."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pika
import pytest

from tests.conftest import EXTERNAL_URL, REPO_ROOT, free_port, wait_for_port

PERSISTENT = pika.BasicProperties(delivery_mode=2)
ARTIFACTS = REPO_ROOT / "test-artifacts" / "directory-fsync"  # a failing run's strace output
REPLIES = {b"\x00\x32\x00\x0b": "queue.declare-ok", b"\x00\x3c\x00\x50": "basic.ack"}  # method frame's class, method
NOT_DURABLE = {".lock", ".write-probe", "pages"}  # data dir entries no reply depends on
# '?': a call this architecture lacks (mkdir, rename on arm64: only their *at forms) is left out without an error
TRACED = "openat,?mkdir,?mkdirat,?rename,?renameat,?renameat2,fsync,write,?writev,?sendto,?sendmsg"


def strace_works() -> bool:
    """strace is installed and may trace a child here (a container may forbid ptrace)."""
    if shutil.which("strace") is None:
        return False
    return subprocess.run(["strace", "-o", os.devnull, "true"], capture_output=True).returncode == 0


pytestmark = [
    pytest.mark.skipif(EXTERNAL_URL is not None, reason="needs a broker process of its own"),
    pytest.mark.skipif(not strace_works(), reason="needs strace, allowed to trace a child (ptrace), to see syscalls"),
]


@dataclass
class Trace:
    """What strace saw, by line: the changes of directory entries under the data dir, directory fsyncs, replies."""

    changes: list[tuple[int, Path, str]] = field(default_factory=list)  # (done at, directory, what changed)
    fsyncs: list[tuple[int, int, Path]] = field(default_factory=list)  # (began at, done at, directory)
    replies: list[tuple[int, str]] = field(default_factory=list)  # (began at, method)

    def early_replies(self) -> list[str]:
        """A line for each reply sent while a change made before it was not fsynced yet in its directory."""
        return [f"{method} sent before {directory} was fsynced after {what}"
                for sent, method in self.replies for done, directory, what in self.changes
                if done < sent and not any(began > done and synced < sent and fsynced == directory
                                           for began, synced, fsynced in self.fsyncs)]


def calls(path: Path) -> Iterator[tuple[int, int, str]]:
    """(line it began on, line it was done on, text) of each call in ``strace -f`` output, an interrupted one joined
    back together."""
    unfinished: dict[str, tuple[int, str]] = {}  # thread id -> (line, text) of its call interrupted by another's
    for number, line in enumerate(path.read_text(errors="replace").splitlines()):
        thread, _, text = line.partition(" ")
        text = text.lstrip()
        if text.endswith("<unfinished ...>"):
            unfinished[thread] = (number, text.removesuffix("<unfinished ...>"))
        elif resumed := re.match(r"<\.\.\. \w+ resumed>", text):
            began, head = unfinished.pop(thread, (number, ""))
            yield began, number, head + text[resumed.end():]
        else:
            yield number, number, text


def strings(text: str) -> list[bytes]:
    """The string arguments of a call as strace -x prints them (C escapes, non-ASCII ones all in hex)."""
    return [literal.encode("latin-1").decode("unicode_escape").encode("latin-1")
            for literal in re.findall(r'"((?:[^"\\]|\\.)*)"', text)]


def read_trace(path: Path, data_dir: Path) -> Trace:
    trace = Trace()
    made: set[Path] = set()  # files opened with O_CREAT so far: a later open does not make them again
    for began, done, text in calls(path):
        result = re.search(r"\)\s+= (-?\d+)", text)  # (strace pads a resumed call's result)
        if result is None or int(result.group(1)) < 0:
            continue
        call = text.split("(", 1)[0]
        if call.startswith(("mkdir", "rename", "openat")):
            target = Path(strings(text)[-1].decode())
            inside = target.is_relative_to(data_dir) and target != data_dir
            if inside and target.relative_to(data_dir).parts[0] in NOT_DURABLE:
                continue
            if call == "openat" and ("O_CREAT" not in text or target in made):
                continue
            if inside or target == data_dir:
                made.add(target)
                trace.changes.append((done, target.parent, f"{call} of {target}"))
        elif call == "fsync":
            trace.fsyncs.append((began, done, Path(re.search(r"fsync\(\d+<(.*?)>", text).group(1))))
        elif "<socket:" in text:
            payload = b"".join(strings(text))
            trace.replies += [(began, method) for ids, method in REPLIES.items() if ids in payload]
    return trace


def stop(tracer: subprocess.Popen) -> None:
    """End the traced broker with SIGTERM (strace then ends too)."""
    with contextlib.suppress(FileNotFoundError, ValueError):
        children = Path(f"/proc/{tracer.pid}/task/{tracer.pid}/children").read_text().split()
        os.kill(int(children[0]), signal.SIGTERM)
    try:
        tracer.wait(30)
    except subprocess.TimeoutExpired:
        tracer.kill()
        tracer.wait()


def test_declare_oks_and_confirms_wait_for_the_fsync_of_new_directory_entries(tmp_path):
    data_dir, trace_file, port = tmp_path / "data", tmp_path / "strace.txt", free_port()
    command = ["strace", "-f", "-y", "-x", "-s", "1024", "-o", str(trace_file), "-e", f"trace={TRACED}",
               sys.executable, "-m", "broker", "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir),
               "--management-port", "0", "--prometheus-port", "0", "--mqtt-port", "0"]
    with open(tmp_path / "broker.log", "wb") as log:
        tracer = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_port("127.0.0.1", port, tracer, timeout=60)
        url = pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{port}/%2F")
        with contextlib.closing(pika.BlockingConnection(url)) as connection:
            channel = connection.channel()
            for queue in ("q0", "q1", "q2"):
                channel.queue_declare(queue, durable=True)
            channel.queue_declare("events", durable=True, arguments={"x-queue-type": "stream"})
            channel.confirm_delivery()
            for queue in ("q0", "q1", "events"):
                channel.basic_publish("", queue, b"confirmed", PERSISTENT)
    finally:
        stop(tracer)
    trace = read_trace(trace_file, data_dir)
    made = {Path(what.split(" of ")[1]).relative_to(tmp_path).as_posix() for _, _, what in trace.changes}
    assert {"data", "data/messages", "data/definitions.log", "data/messages/0000000000.seg", "data/streams"} <= made
    assert [method for _, method in trace.replies].count("queue.declare-ok") == 4
    assert [method for _, method in trace.replies].count("basic.ack") == 3
    early = trace.early_replies()
    if early:  # the syscalls kept for a look (test-artifacts/ is CI's)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(trace_file, ARTIFACTS / "early-replies-strace.txt")
    assert early == []
