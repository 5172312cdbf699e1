"""The workers' board (broker.workers.board): what each worker posts, every worker reads; a worker that ends has
its posts taken off."""

from __future__ import annotations

import asyncio
import socket
import time

import uvloop

from broker.workers.board import Board, BoardCopy, led_elsewhere


async def until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.005)


def test_every_worker_reads_what_each_posted_until_the_poster_ends():
    async def test():
        board = Board()
        copies, serving = [], []
        for number in range(2):
            supervisor_end, worker_end = socket.socketpair()
            serving.append(asyncio.ensure_future(board.serve(number, supervisor_end)))
            copy = BoardCopy(worker_end)
            copy.post({f"group {number}": {"node": "a"}})  # posted before it is started: sent once it is
            await copy.start()
            copies.append(copy)
        both = {"group 0": {"node": "a"}, "group 1": {"node": "a"}}
        await until(lambda: all(copy.entries == both for copy in copies))
        copies[1].post({"group 1": {"node": "b"}})
        await until(lambda: copies[0].entries["group 1"] == {"node": "b"})
        copies[1].post({"group 1": None})
        await until(lambda: copies[0].entries == {"group 0": {"node": "a"}})
        copies[1].post({"group 1": {"node": "c"}})
        await until(lambda: "group 1" in copies[0].entries)
        copies[1].writer.close()  # worker 1 ends
        await until(lambda: copies[0].entries == {"group 0": {"node": "a"}})
        await asyncio.wait_for(serving[1], 5)
        copies[0].writer.close()
        await asyncio.wait_for(serving[0], 5)
        assert board.entries == {}

    uvloop.run(asyncio.wait_for(test(), 10))


def test_a_clustered_node_keeps_who_leads_a_group_elsewhere_when_its_worker_of_that_group_ends():
    """The node's other workers go on forwarding the group's clients to its leader while the worker starts again;
    a group this node led has no leader here once its worker has ended."""
    async def test():
        board = Board(led_elsewhere("a"))
        copies, serving = [], []
        for number in range(3):
            supervisor_end, worker_end = socket.socketpair()
            serving.append(asyncio.ensure_future(board.serve(number, supervisor_end)))
            copies.append(BoardCopy(worker_end))
            await copies[-1].start()
        copies[1].post({"group 1": {"node": "b"}, "members 1": {"a": {}, "b": {}}})  # led by another node
        copies[2].post({"group 2": {"node": "a"}, "members 2": {"a": {}, "b": {}}})  # led by this one
        await until(lambda: len(copies[0].entries) == 4)
        for ending in (1, 2):
            copies[ending].writer.close()
            await asyncio.wait_for(serving[ending], 5)
        await until(lambda: copies[0].entries == {"group 1": {"node": "b"}})
        copies[0].writer.close()
        await asyncio.wait_for(serving[0], 5)

    uvloop.run(asyncio.wait_for(test(), 10))


def test_a_clustered_node_keeps_the_clusters_secret_when_worker_0_ends():
    """The node's other workers go on proving their forwards to other nodes while worker 0 starts again."""
    async def test():
        board = Board(led_elsewhere("a"))
        copies, serving = [], []
        for number in range(2):
            supervisor_end, worker_end = socket.socketpair()
            serving.append(asyncio.ensure_future(board.serve(number, supervisor_end)))
            copies.append(BoardCopy(worker_end))
            await copies[-1].start()
        copies[0].post({"cluster secret": "s3cret", "members 0": {"a": {}}})
        await until(lambda: len(copies[1].entries) == 2)
        copies[0].writer.close()
        await asyncio.wait_for(serving[0], 5)
        await until(lambda: copies[1].entries == {"cluster secret": "s3cret"})
        copies[1].writer.close()
        await asyncio.wait_for(serving[1], 5)

    uvloop.run(asyncio.wait_for(test(), 10))


def test_an_entry_is_waited_for_until_a_worker_posts_it_or_the_time_given_is_spent():
    """What the API waits on while a group has no leader here (an election under way): answered as soon as a worker
    posts one, else after the time given (its one lease)."""
    async def test():
        board = Board()
        supervisor_end, worker_end = socket.socketpair()
        serving = asyncio.ensure_future(board.serve(0, supervisor_end))
        copy = BoardCopy(worker_end)
        await copy.start()
        started = time.monotonic()
        assert await board.entry("group 0", 0.2) is None
        assert time.monotonic() - started >= 0.2
        waiting = asyncio.ensure_future(board.entry("group 0", 30))
        copy.post({"members 0": {"a": {}}})  # another key: it waits on
        await until(lambda: "members 0" in board.entries)
        assert not waiting.done()
        copy.post({"group 0": {"node": "b"}})
        assert await asyncio.wait_for(waiting, 5) == {"node": "b"}
        copy.writer.close()
        await asyncio.wait_for(serving, 5)

    uvloop.run(asyncio.wait_for(test(), 10))
