"""API server process: the ASGI plumbing of the bundle routes (http_bundles.py).

- Scratch: one request's private directory, its blocking calls run in
  the default executor, and its removal once the request ends, however
  it ends. A call a cancelled request leaves running still runs: the
  removal waits for it, so a thread never writes into a directory being
  removed, and is itself shielded and kept, so a second cancellation
  cannot stop it halfway.
- AsgiBody: the request body as bundle_tar's Source, a few ASGI messages
  held at a time.
- TarReply: the bundle sent as one tar, a piece at a time, while a task
  watches for the client going away (uvicorn's ``send`` returns quietly
  then, so the stream would otherwise read the whole bundle for no one).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import time
from pathlib import Path

from vllm_uma.kv_offload.pins.bundle_tar import (
    PIECE,
    Member,
    TarRefused,
    end_of_archive,
    padding,
    tar_length,
)
from vllm_uma.log import get_logger, human_size

logger = get_logger(__name__)


class Scratch:
    def __init__(self, path: Path, keep: set[asyncio.Task]):
        self.path = path
        self._keep = keep  # the owner's: removals outlive their request's task
        self._pending: asyncio.Future | None = None

    async def run(self, fn, *args):
        """``fn(*args)`` in a thread, its result or error."""
        future = asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args))
        # Retrieved even if no one awaits it any more (a cancelled request).
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._pending = future
        return await asyncio.shield(future)

    async def remove(self) -> None:
        task = asyncio.ensure_future(self._remove())
        self._keep.add(task)
        task.add_done_callback(self._keep.discard)
        await asyncio.shield(task)

    async def _remove(self) -> None:
        if self._pending is not None:
            await asyncio.wait({self._pending})
        await asyncio.to_thread(shutil.rmtree, self.path, True)


class AsgiBody:
    def __init__(self, receive):
        self._receive = receive
        self._buffer = bytearray()
        self._ended = False

    async def _more(self) -> None:
        message = await self._receive()
        if message["type"] == "http.disconnect":
            raise TarRefused(400, "the client went away before the body was read")
        self._buffer += message.get("body", b"")
        self._ended = not message.get("more_body", False)

    async def exact(self, n: int) -> bytes | None:
        while len(self._buffer) < n and not self._ended:
            await self._more()
        if len(self._buffer) < n:
            if not self._buffer:
                return None
            raise TarRefused(400, f"the body ends inside a tar block ({len(self._buffer)} of {n})")
        return self._take(n)

    async def read(self, n: int) -> bytes:
        while not self._buffer and not self._ended:
            await self._more()
        return self._take(n)

    def _take(self, n: int) -> bytes:
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data


class TarReply:
    """Called with ``send`` by http_api's _route; owns the scratch from then on."""

    def __init__(self, scratch: Scratch, files: list[Member], receive, filename: str):
        self._scratch, self._files, self._receive = scratch, files, receive
        self._filename = filename

    async def __call__(self, send) -> None:
        mtime = time.time()
        length = tar_length(self._files, mtime)
        watching = asyncio.ensure_future(_disconnect(self._receive))
        sent = 0
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"application/x-tar"),
                        (b"content-length", str(length).encode()),
                        (
                            b"content-disposition",
                            f'attachment; filename="{self._filename}"'.encode(),
                        ),
                    ],
                }
            )
            for member in self._files:
                async with contextlib.aclosing(self._pieces(member, mtime)) as pieces:
                    async for piece in pieces:
                        if watching.done():
                            logger.info(
                                "Bundle %s: the client went away after %s of %s; not sent "
                                "further.", self._filename, human_size(sent), human_size(length),
                            )  # fmt: skip
                            return
                        await send({"type": "http.response.body", "body": piece, "more_body": True})
                        sent += len(piece)
            await send({"type": "http.response.body", "body": end_of_archive(sent)})
        finally:
            watching.cancel()
            await self._scratch.remove()

    async def _pieces(self, member: Member, mtime: float):
        yield member.header(mtime)
        offset = 0
        while offset < member.size:
            want = min(PIECE, member.size - offset)
            piece = await self._scratch.run(_read, member.path, offset, want)
            if len(piece) != want:
                # Our own private copy changed: end the response short, so
                # the client sees a body under its Content-Length.
                raise OSError(f"{member.path} is shorter than the {member.size} bytes it had")
            yield piece
            offset += want
        if pad := padding(member.size):
            yield pad


async def _disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _read(path: Path, offset: int, size: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return os.pread(fd, size, offset)
    finally:
        os.close(fd)
