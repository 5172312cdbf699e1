"""The digests a join compares: kept up to date through the ops that change the files, equal to a hash of the disk."""

from __future__ import annotations

import hashlib
import os

import pytest

from storage.digests import MARK, RunningDigests, file_digests, prefix_digest
from storage.replica import APPEND, DELETE, REPLACE, RMTREE, TRUNCATE, ReplicaError, ReplicaWriter, reset_op, \
    truncate_op


def test_file_digests_name_each_replicated_file_with_its_size_and_sha256(tmp_path):
    (tmp_path / "messages").mkdir()
    (tmp_path / "messages/0000000001.seg").write_bytes(b"x" * 3_000_000)
    (tmp_path / "cluster-state").write_bytes(b"{}")
    [(path, size, digest)] = file_digests(tmp_path)
    assert (path, size, digest) == ("messages/0000000001.seg", 3_000_000, hashlib.sha256(b"x" * 3_000_000).hexdigest())
    fd = os.open(tmp_path / path, os.O_RDONLY)
    try:
        assert prefix_digest(fd, 5) == hashlib.sha256(b"xxxxx").hexdigest()
        with pytest.raises(ReplicaError, match="shrank"):
            prefix_digest(fd, 3_000_001)
    finally:
        os.close(fd)


class Disk:
    """A data dir written through a ReplicaWriter, its digests followed as a follower follows them."""

    def __init__(self, root) -> None:
        self.root = root
        self.writer = ReplicaWriter(root)
        self.running = RunningDigests(root)
        self.sequence = 0

    def apply(self, *ops) -> None:
        self.sequence += 1
        self.writer.apply([(self.sequence, list(ops))])
        self.running.follow(list(ops))

    def kept(self) -> list:
        return file_digests(self.root, self.running)


def hashed_from_disk(root) -> list:
    return file_digests(root)


def test_digests_followed_through_every_kind_of_op_are_those_of_the_files(tmp_path):
    disk = Disk(tmp_path)
    big = os.urandom(MARK * 2 + 12_345)
    disk.apply((APPEND, "messages/1.seg", big[:1000]), (APPEND, "messages/1.seg", big[1000:]))
    disk.apply((APPEND, "definitions.log", b"d" * 10), (APPEND, "streams/s/0.seg", b"chunk"))
    disk.apply((REPLACE, "definitions.log", b"snapshot"), (APPEND, "definitions.log", b"+more"))
    disk.apply((APPEND, "messages/2.seg", b"abc"), (DELETE, "messages/2.seg", b""), (APPEND, "messages/2.seg", b"z"))
    disk.apply((RMTREE, "streams/s", b""), (APPEND, "streams/t/0.seg", b"t"))
    assert disk.kept() == hashed_from_disk(tmp_path)
    disk.apply((APPEND, "messages/1.seg", b"tail"), truncate_op("messages/1.seg", MARK * 2))  # a failed batch undone
    assert disk.kept() == hashed_from_disk(tmp_path)
    disk.apply(reset_op(["messages/1.seg"]), (APPEND, "messages/1.seg", b"copied tail"))
    assert disk.kept() == hashed_from_disk(tmp_path)
    assert [path for path, _, _ in disk.kept()] == ["messages/1.seg"]


def test_a_file_changed_without_an_op_is_hashed_from_disk_again(tmp_path):
    disk = Disk(tmp_path)
    disk.apply((APPEND, "messages/1.seg", b"a" * 100), (APPEND, "messages/2.seg", b"b" * 100))
    disk.kept()
    with open(tmp_path / "messages/1.seg", "ab") as file:  # a torn tail cut back by recovery, say
        file.truncate(60)
    (tmp_path / "messages/2.seg.new").write_bytes(b"c" * 100)  # another file of the same size renamed over it
    os.replace(tmp_path / "messages/2.seg.new", tmp_path / "messages/2.seg")
    assert disk.kept() == hashed_from_disk(tmp_path)


def test_the_digest_of_any_prefix_reads_no_more_than_a_mark(tmp_path, monkeypatch):
    disk = Disk(tmp_path)
    data = os.urandom(MARK * 3 + 777)
    for start in range(0, len(data), 100_000):
        disk.apply((APPEND, "messages/1.seg", data[start:start + 100_000]))
    fd = os.open(tmp_path / "messages/1.seg", os.O_RDONLY)
    try:
        [followed] = disk.running.at_cut([("messages/1.seg", fd, len(data))]).values()
        read = []
        real_pread = os.pread
        monkeypatch.setattr(os, "pread", lambda fd, count, offset: read.append(count) or real_pread(fd, count, offset))
        for size in (0, 1, MARK - 1, MARK, MARK + 1, MARK * 3, len(data)):
            read.clear()
            assert followed.prefix_digest(fd, size) == hashlib.sha256(data[:size]).hexdigest()
            assert sum(read) < MARK
    finally:
        os.close(fd)


def test_a_cut_keeps_only_files_whose_digests_were_followed_to_their_size(tmp_path):
    disk = Disk(tmp_path)
    disk.apply((APPEND, "messages/1.seg", b"one"), (APPEND, "messages/2.seg", b"two"))
    disk.apply(truncate_op("messages/2.seg", 1))
    with open(tmp_path / "messages/3.seg", "wb") as file:  # there before the digests were followed
        file.write(b"three")
    disk.apply((APPEND, "messages/3.seg", b"+"))
    fds = {name: os.open(tmp_path / "messages" / name, os.O_RDONLY) for name in ("1.seg", "2.seg", "3.seg")}
    try:
        cut = [(f"messages/{name}", fd, os.fstat(fd).st_size) for name, fd in fds.items()]
        assert list(disk.running.at_cut(cut)) == ["messages/1.seg"]
    finally:
        for fd in fds.values():
            os.close(fd)
