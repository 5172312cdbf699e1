"""The replication op stream (storage.replica): its codec refuses anything malformed, a full copy lists the right
files, and the follower's writer applies frames with one sync per file per group and stops at the first error."""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

import pytest

from storage.replica import (
    APPEND, DELETE, REPLACE, RESET, RMTREE, Op, ReplicaError, ReplicaWriter, decode_ops, encode_ops,
    replicated_files, reset_op, truncate_op, truncated_size,
)

ALL_KINDS: list[Op] = [
    (RESET, "", b""),
    reset_op(["format", "messages/0000000000.seg"]),
    (APPEND, "messages/0000000000.seg", b"records"),
    (APPEND, "streams/ab12/0.seg", b""),
    (REPLACE, "definitions.log", b"snapshot"),
    (DELETE, "messages/0000000001.seg", b""),
    (RMTREE, "streams/cd34", b""),
    truncate_op("messages/0000000000.seg", 3),
]


def op_bytes(kind: int, path: bytes, data: bytes) -> bytes:
    return struct.pack(">BHI", kind, len(path), len(data)) + path + data


def frame(*ops: bytes, count: int | None = None) -> bytes:
    return struct.pack(">I", len(ops) if count is None else count) + b"".join(ops)


# --- the codec ------------------------------------------------------------------------------------------------
def test_ops_of_every_kind_come_back_as_they_went():
    assert decode_ops(encode_ops(ALL_KINDS)) == ALL_KINDS
    assert decode_ops(encode_ops([])) == []
    assert truncated_size(truncate_op("definitions.log", 1 << 40)) == 1 << 40


@pytest.mark.parametrize("data, text", [
    (b"", "cannot hold the op count"),
    (b"\x00\x00\x01", "cannot hold the op count"),
    (frame(count=1), "op 0 of 1 has no complete head"),
    (frame(op_bytes(APPEND, b"a", b"xy"))[:-1], "op 0 of 1 needs 3 bytes, 2 are left"),
    (frame(op_bytes(APPEND, b"a", b"x"), count=2), "op 1 of 2 has no complete head"),
    (frame(op_bytes(APPEND, b"a", b"x")) + b"\x00", "1 bytes follow the last of 1 ops"),
    (frame(op_bytes(9, b"a", b"")), "op 0 of 1: unknown op kind 9"),
    (frame(op_bytes(0, b"a", b"")), "unknown op kind 0"),
    (frame(op_bytes(APPEND, b"\xff\xfe", b"")), "op 0 of 1: its path is not UTF-8"),
    (frame(op_bytes(APPEND, b"", b"x")), "APPEND without a path"),
    (frame(op_bytes(APPEND, b"/etc/passwd", b"x")), "not a plain relative path"),
    (frame(op_bytes(APPEND, b"../outside", b"x")), "not a plain relative path"),
    (frame(op_bytes(DELETE, b"messages/../../x", b"")), "not a plain relative path"),
    (frame(op_bytes(APPEND, b"messages//x", b"x")), "not a plain relative path"),
    (frame(op_bytes(APPEND, b"./x", b"x")), "not a plain relative path"),
    (frame(op_bytes(APPEND, b"messages/", b"x")), "not a plain relative path"),
    (frame(op_bytes(APPEND, b"a\x00b", b"x")), "not a plain relative path"),
    (frame(op_bytes(REPLACE, b".lock", b"1")), "the node's own"),
    (frame(op_bytes(APPEND, b"cluster-state", b"1")), "the node's own"),
    (frame(op_bytes(RMTREE, b"quarantine", b"")), "the node's own"),
    (frame(op_bytes(DELETE, b"quarantine/x@0", b"")), "the node's own"),
    (frame(op_bytes(RESET, b"messages", b"")), "a RESET op takes no path"),
    (frame(op_bytes(RESET, b"", b"messages/1.seg\x00../x")), "not a plain relative path"),
    (frame(op_bytes(RESET, b"", b"cluster-state")), "the node's own"),
    (frame(op_bytes(RESET, b"", b"\xff")), "a RESET keeps a path that is not UTF-8"),
    (frame(op_bytes(5, b"a", b"\x00" * 4)), "TRUNCATE of 'a' carries 4 bytes instead of an 8-byte size"),
    (frame(op_bytes(DELETE, b"a", b"x")), "DELETE of 'a' carries 1 bytes of data"),
    (frame(op_bytes(RMTREE, b"a", b"x")), "RMTREE of 'a' carries 1 bytes of data"),
])
def test_malformed_ops_are_refused_whole_with_a_text_naming_the_fault(data, text):
    with pytest.raises(ReplicaError, match=text.replace("(", r"\(")):
        decode_ops(data)


def test_a_frame_claiming_billions_of_ops_fails_at_once():
    with pytest.raises(ReplicaError, match="op 1 of 4294967295 has no complete head"):
        decode_ops(frame(op_bytes(APPEND, b"a", b""), count=0xFFFFFFFF))


def test_encoding_refuses_an_op_that_would_not_decode():
    with pytest.raises(ReplicaError, match="not a plain relative path"):
        encode_ops([(APPEND, "/abs", b"")])
    with pytest.raises(ReplicaError, match="unknown op kind 7"):
        encode_ops([(7, "a", b"")])
    with pytest.raises(ReplicaError, match="too long"):
        encode_ops([(APPEND, "a" * 70000, b"")])


# --- what a full copy holds -----------------------------------------------------------------------------------
def test_a_full_copy_leaves_out_the_nodes_own_files_and_rewrites_in_progress(tmp_path):
    for name in [".lock", "clean-shutdown", "cluster-state", "format", "definitions.log", "definitions.snapshot",
                 "quarantine/0000000000.seg@12", "messages/0000000000.seg", "messages/0000000001.compacting",
                 "streams/ab/0.seg", "streams/ab/100.seg", "streams/empty/.keep"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "streams" / "nothing").mkdir()
    (tmp_path / "messages" / "link.seg").symlink_to(tmp_path / "format")
    assert replicated_files(tmp_path) == [Path(name) for name in [
        "definitions.log", "format", "messages/0000000000.seg", "streams/ab/0.seg", "streams/ab/100.seg",
        "streams/empty/.keep"]]


# --- the follower's writer ------------------------------------------------------------------------------------
class Follower:
    """A ReplicaWriter, with what each group reported: its durable sequence, or the failure."""

    def __init__(self, directory: Path) -> None:
        self.applied: list[int] = []
        self.failures: list[str] = []
        self.writer = ReplicaWriter(directory)

    def group(self, *frames: tuple[int, list[Op]]) -> None:
        try:
            self.applied.append(self.writer.apply(list(frames)))
        except ReplicaError as error:
            self.failures.append(str(error))


def test_frames_arrived_together_are_applied_in_order_with_one_sync_per_file(tmp_path):
    follower = Follower(tmp_path)
    follower.group((1, [(APPEND, "messages/0000000000.seg", b"abc"), (APPEND, "definitions.log", b"d")]),
                   (2, [(APPEND, "messages/0000000000.seg", b"def"), truncate_op("definitions.log", 0)]),
                   (3, [(APPEND, "streams/ab/0.seg", b"chunk"), (APPEND, "definitions.log", b"e")]))
    follower.writer.close()
    assert follower.applied == [3] and follower.failures == []
    assert (tmp_path / "messages/0000000000.seg").read_bytes() == b"abcdef"
    assert (tmp_path / "definitions.log").read_bytes() == b"e"
    assert (tmp_path / "streams/ab/0.seg").read_bytes() == b"chunk"
    # three files, and the directories that got entries: data dir, messages/, streams/, streams/ab/
    assert follower.writer.fsyncs == 3 + 4


def test_replace_delete_rmtree_and_reset_leave_the_files_as_the_leader_has_them(tmp_path):
    own = {".lock": b"123", "cluster-state": b"epoch 4", "quarantine/definitions.log@0": b"bad"}
    for name, content in {**own, "stale/file": b"old", "format": b"1\n"}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(content)
    follower = Follower(tmp_path)
    follower.group((7, [(RESET, "", b""), (APPEND, "format", b"2\n"), (APPEND, "messages/0000000003.seg", b"old"),
                        (APPEND, "messages/0000000004.seg", b"head"), (APPEND, "streams/ab/0.seg", b"s")]))
    follower.group((8, [(REPLACE, "messages/0000000003.seg", b"compacted"), (DELETE, "nothing-here", b""),
                        (APPEND, "messages/0000000004.seg", b"+more"), (RMTREE, "streams/ab", b""),
                        (RMTREE, "streams/never", b""), (DELETE, "messages/0000000004.seg", b"")]))
    follower.writer.close()
    assert follower.applied == [7, 8] and follower.failures == []
    assert {path.as_posix(): (tmp_path / path).read_bytes() for path in replicated_files(tmp_path)} == {
        "format": b"2\n", "messages/0000000003.seg": b"compacted"}
    for name, content in own.items():
        assert (tmp_path / name).read_bytes() == content
    assert not (tmp_path / "stale").exists() and not (tmp_path / "messages/0000000003.compacting").exists()


def test_a_reset_keeps_only_the_files_it_names_and_the_nodes_own(tmp_path):
    held = {".lock": b"123", "cluster-state": b"epoch 4", "clean-shutdown": b"", "pages/q.page": b"p",
            "format": b"2\n", "messages/0000000003.seg": b"same prefix", "messages/0000000004.seg": b"diverged",
            "streams/ab/0.seg": b"kept chunk", "streams/gone/0.seg": b"a deleted stream's", "x.snapshot": b"t"}
    for name, content in held.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(content)
    follower = Follower(tmp_path)
    follower.group((-1, [reset_op(["format", "messages/0000000003.seg", "streams/ab/0.seg"]),
                         (APPEND, "messages/0000000003.seg", b" and its tail"), truncate_op("other.seg", 0),
                         (APPEND, "other.seg", b"new")]))
    follower.writer.close()
    assert follower.failures == []
    assert {path.as_posix(): (tmp_path / path).read_bytes() for path in replicated_files(tmp_path)} == {
        "format": b"2\n", "messages/0000000003.seg": b"same prefix and its tail", "other.seg": b"new",
        "streams/ab/0.seg": b"kept chunk"}
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        ".lock", "cluster-state", "format", "messages", "other.seg", "streams"]
    assert not (tmp_path / "streams/gone").exists()


def test_the_first_error_is_raised_and_everything_after_it_is_refused(tmp_path):
    follower = Follower(tmp_path)
    follower.group((1, [(APPEND, "a.seg", b"12345")]))
    follower.group((2, [(APPEND, "a.seg", b"6"), truncate_op("a.seg", 100)]), (3, [(APPEND, "a.seg", b"7")]))
    follower.group((4, [(APPEND, "a.seg", b"8")]))
    assert follower.applied == [1]
    assert follower.failures == ["replica could not apply frame 2: TRUNCATE of 'a.seg' to 100 bytes, but it holds "
                                 "only 6", "an earlier frame could not be applied: nothing more is"]
    assert (tmp_path / "a.seg").read_bytes() == b"123456"
    assert follower.writer.broken and follower.writer._files == {}


def test_a_bad_op_fails_the_writer(tmp_path):
    follower = Follower(tmp_path / "data")
    follower.group((1, [(APPEND, "../escape", b"x")]))
    assert follower.failures == ["replica could not apply frame 1: APPEND of '../escape': not a plain relative path "
                                 "inside the data dir"]
    assert not (tmp_path / "escape").exists()


def test_a_truncate_of_a_file_the_follower_lacks_makes_it_empty_only_when_cut_to_nothing(tmp_path):
    follower = Follower(tmp_path)
    follower.group((1, [truncate_op("messages/0000000009.seg", 0)]))
    follower.group((2, [truncate_op("messages/0000000010.seg", 5)]))
    assert follower.applied == [1] and len(follower.failures) == 1
    assert (tmp_path / "messages/0000000009.seg").read_bytes() == b""


def test_files_appended_to_stay_open_between_groups_and_close_closes_them(tmp_path):
    follower = Follower(tmp_path)
    follower.group((1, [(APPEND, "a", b"1"), (APPEND, "b", b"1")]))
    follower.group((2, [(APPEND, "a", b"2")]))
    assert sorted(follower.writer._files) == ["a"]
    follower.writer.close()
    assert follower.writer._files == {}
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]
