"""make cluster-demo stops at once, naming the port, when one it needs is taken (a node that cannot listen was
elected again and again, with the reason only in its log), before it starts etcd or touches its directory."""

import socket

import pytest

from tests.cluster import demo


def test_a_taken_port_stops_the_demo_at_once_naming_it(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(SystemExit) as stopped:
            demo.main(["--dir", str(tmp_path / "demo"), "--port", str(port - 1)])  # node b's AMQP port
    assert f"{port}" in str(stopped.value) and "DEMO_ARGS" in str(stopped.value)
    assert not (tmp_path / "demo").exists()
