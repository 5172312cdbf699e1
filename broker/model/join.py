"""One callback for several asynchronous parts (the disk, and the processes that own queues: broker.crossing)."""

from __future__ import annotations

from typing import Callable


class Join:
    """callback(ok) once every part added said whether it went well (ok: all did) and the join was sealed (no more
    parts to come): at once, on seal(), where no part is left."""

    __slots__ = ("callback", "left", "ok")

    def __init__(self, callback: Callable[[bool], None]):
        self.callback = callback
        self.left = 1  # parts still to say, the seal included
        self.ok = True

    def part(self) -> Callable[[bool], None]:
        """A part's callback, to be called once."""
        self.left += 1
        return self.done

    def seal(self) -> None:
        self.done(True)

    def done(self, ok: bool) -> None:
        self.ok = self.ok and ok
        self.left -= 1
        if not self.left:
            self.callback(self.ok)
