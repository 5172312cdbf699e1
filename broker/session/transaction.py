"""What a transactional channel (tx.select) holds until tx.commit or tx.rollback."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from broker.session.unacked import Unacked


class Transaction:
    __slots__ = ("publishes", "settles")

    def __init__(self) -> None:
        # routings to run at commit, in order (each says whether its message went to disk; given a share, they hold
        # it for a commit across processes: broker.model.transactions)
        self.publishes: list[Callable[..., bool]] = []
        # (deliveries, requeue, failed) acked or rejected, as Channel.reject takes them
        self.settles: list[tuple[list[Unacked], bool | None, bool]] = []
