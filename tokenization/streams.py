"""Reading a (possibly gzip-compressed) file as bytes, and the record of what could not be read.

The lowest layer of :mod:`tokenization`: :mod:`tokenization.pubmed_xml` and
:mod:`tokenization.sources` both read through :func:`iter_blocks` and report damage as
:class:`Problem`, and neither imports the other for it.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from typing import Iterator


@dataclass(frozen=True)
class Problem:
    """Something in an input that could not be used. ``reason`` is a short machine-readable key."""

    path: str
    reason: str
    message: str
    line: int | None = None
    byte_offset: int | None = None

    def describe(self) -> str:
        where = self.path
        if self.line is not None:
            where += f", line {self.line}"
        if self.byte_offset is not None:
            where += f" (byte {self.byte_offset})"
        return f"{where}: {self.reason}: {self.message}"

    def to_dict(self) -> dict:
        return {"path": self.path, "reason": self.reason, "message": self.message,
                "line": self.line, "byte_offset": self.byte_offset}


class StreamDamage(Exception):
    """The byte stream of a file ends early or is corrupt; everything before the damage was read."""


def iter_blocks(path: str | os.PathLike, block_size: int = 1 << 20) -> Iterator[bytes]:
    """Yield the (decompressed) bytes of a file in blocks of about ``block_size``.

    For ``.gz`` files this drives :mod:`zlib` directly rather than :mod:`gzip`, because
    ``GzipFile.read`` discards what it decompressed in a call that hits damage. Compressed input
    is fed in small pieces, so when the stream is truncated or corrupt everything up to the last
    piece before the damage is yielded before :class:`StreamDamage` is raised. Concatenated gzip
    members (as ``cat a.gz b.gz`` makes) are read in sequence.
    """
    with open(path, "rb") as raw:
        if not str(path).endswith(".gz"):
            while block := raw.read(block_size):
                yield block
            return
        pending: list[bytes] = []
        pending_size = 0
        decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
        member_open = False  # the current gzip member has started but not reached its end marker
        damage: str | None = None
        while damage is None and (compressed := raw.read(_GZIP_PIECE)):
            while compressed:
                try:
                    out = decompressor.decompress(compressed)
                except zlib.error as err:
                    damage = f"corrupt gzip data ({err}) near compressed byte {raw.tell()}"
                    break
                member_open = True
                if out:
                    pending.append(out)
                    pending_size += len(out)
                if decompressor.eof:  # end of one gzip member; another may follow
                    compressed = decompressor.unused_data.lstrip(b"\0")  # NUL padding is allowed
                    decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
                    member_open = False
                else:
                    compressed = b""
            if pending_size >= block_size:
                yield b"".join(pending)
                pending, pending_size = [], 0
        if pending:
            yield b"".join(pending)
        if damage is None and member_open:
            damage = "the gzip stream is truncated (it ends before its end-of-stream marker)"
        if damage is not None:
            raise StreamDamage(damage)


_GZIP_PIECE = 1 << 12  # compressed bytes per zlib call: the most a damaged stream can lose
