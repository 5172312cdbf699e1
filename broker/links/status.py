"""What the API shows of a link (a shovel, a federation link) that is not its own business."""

from __future__ import annotations

import time


def local_timestamp(since: float) -> str:
    """When a link's state last changed, as RabbitMQ's API shows it: local time, the hour not padded."""
    moment = time.localtime(since)
    return time.strftime("%Y-%m-%d ", moment) + f"{moment.tm_hour}:" + time.strftime("%M:%S", moment)
