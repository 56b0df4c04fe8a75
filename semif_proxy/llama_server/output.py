"""The child's output, read as it comes: whole lines whatever their length, so that the pipe
can never fill and block the child, and a line too long to log in full is cut."""

from __future__ import annotations

# Longest output line logged in full; longer ones are cut (the rest is counted, not kept).
LINE_LIMIT = 16 * 1024


class LineReader:
    """Splits a byte stream into lines. A line longer than `limit` is handed on cut, as soon as
    it overflows, and the rest of it is skipped: memory stays bounded whatever the child
    writes."""

    def __init__(self, limit: int = LINE_LIMIT) -> None:
        self.limit = limit
        self._buf = bytearray()
        self._skipping = False  # inside an over-long line that was already handed on

    def feed(self, data: bytes) -> list[tuple[bytes, bool]]:
        """(line, was it cut) for every line this chunk completes or overflows."""
        out: list[tuple[bytes, bool]] = []
        start = 0
        while start < len(data):
            end = data.find(b"\n", start)
            stop = len(data) if end < 0 else end
            if not self._skipping:
                room = self.limit - len(self._buf)
                self._buf += data[start : min(stop, start + room)]
                if stop - start > room:
                    out.append((bytes(self._buf), True))
                    self._buf.clear()
                    self._skipping = True
            if end < 0:
                break
            if not self._skipping:
                out.append((bytes(self._buf), False))
            self._buf.clear()
            self._skipping = False
            start = end + 1
        return out

    def flush(self) -> list[tuple[bytes, bool]]:
        line = bytes(self._buf)
        self._buf.clear()
        return [(line, False)] if line else []
