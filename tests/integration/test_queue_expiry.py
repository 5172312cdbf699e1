"""x-expires: a queue nobody uses for that long deletes itself; consumers, gets and redeclares keep it."""

import pika

from tests.integration.helpers import connect, wait_until


def exists(conn: pika.BlockingConnection, queue: str) -> bool:
    """Whether a mandatory publish reaches the queue. (Declaring it, even passively, would count as using it.)"""
    ch = conn.channel()
    ch.confirm_delivery()
    try:
        ch.basic_publish("", queue, b"probe", mandatory=True)
    except pika.exceptions.UnroutableError:
        return False
    finally:
        ch.close()
    return True


def test_an_unused_queue_expires(broker, unique):
    with connect(broker) as conn:
        conn.channel().queue_declare(unique, arguments={"x-expires": 200})
        wait_until(conn, lambda: not exists(conn, unique), timeout=10)


def test_a_consumer_keeps_a_queue_until_it_leaves(broker, unique):
    with connect(broker) as conn:
        ch = conn.channel()
        ch.queue_declare(unique, arguments={"x-expires": 200})
        tag = ch.basic_consume(unique, lambda *args: None, auto_ack=True)
        conn.sleep(0.5)  # well past x-expires: the consumer keeps the queue in use
        assert exists(conn, unique)
        ch.basic_cancel(tag)
        wait_until(conn, lambda: not exists(conn, unique), timeout=10)
