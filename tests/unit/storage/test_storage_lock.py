"""One store per data dir: a second one is refused with a message naming the dir and the process that holds it."""

from __future__ import annotations

import os
import subprocess
import sys

import pika
import pytest

from storage.lock import DataDirLocked
from storage.store import MessageStore
from tests.conftest import REPO_ROOT, free_port


def test_a_second_store_on_the_same_data_dir_is_refused_until_the_first_closes(tmp_path):
    first = MessageStore(tmp_path)
    first.recover()
    second = MessageStore(tmp_path)
    with pytest.raises(DataDirLocked) as refused:
        second.recover()
    assert str(refused.value) == f"data dir {tmp_path} is in use by another Warren (pid {os.getpid()})"
    first.close()
    second.recover()  # the lock went with the first store
    second.close()


def test_a_lock_file_left_by_a_dead_process_does_not_block(tmp_path):
    (tmp_path / ".lock").write_text("999999\n")  # what a process killed while holding the lock leaves
    store = MessageStore(tmp_path)
    store.recover()
    store.close()


def test_a_failed_recovery_lets_go_of_the_data_dir(tmp_path):
    (tmp_path / "messages").write_text("not a directory")
    with pytest.raises(OSError):
        MessageStore(tmp_path).recover()
    (tmp_path / "messages").unlink()
    store = MessageStore(tmp_path)
    store.recover()
    store.close()


def test_a_second_broker_on_the_same_data_dir_exits_naming_the_first(own_broker, tmp_path):
    first = own_broker()
    second = subprocess.run(
        [sys.executable, "-m", "broker", "--host", "127.0.0.1", "--port", str(free_port()),
         "--data-dir", str(first.data_dir), "--management-port", "0", "--prometheus-port", "0", "--mqtt-port", "0"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )
    assert second.returncode != 0
    assert f"data dir {first.data_dir} is in use by another Warren (pid {first.process.pid})" in second.stderr
    # the first broker goes on serving, and its data dir is intact for its next start
    connection = pika.BlockingConnection(pika.URLParameters(first.url))
    channel = connection.channel()
    channel.queue_declare("kept", durable=True)
    channel.confirm_delivery()
    channel.basic_publish("", "kept", b"m", pika.BasicProperties(delivery_mode=2))
    connection.close()
    first.restart()
    connection = pika.BlockingConnection(pika.URLParameters(first.url))
    method, _, body = connection.channel().basic_get("kept", auto_ack=True)
    assert body == b"m"
    connection.close()
