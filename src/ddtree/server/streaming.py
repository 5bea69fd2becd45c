"""Incremental output of one request, from the decoding thread to the event loop.

The engine calls `on_tokens(new_ids)` from its decoding thread after each round with the tokens that
round committed (stop rules applied). `TokenStream.on_tokens` forwards each chunk into an
`asyncio.Queue` with `loop.call_soon_threadsafe`, and the request's generation task, once done, puts
the final `Finished` / `Failed` item. Nothing here depends on how requests are scheduled onto the
engine (one at a time or batched), only on that callback and on an awaitable result.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

from ddtree.engine.types import GenerationOutput
from ddtree.server.protocol import TokenizerLike, trim_at_stop

REPLACEMENT = "\ufffd"  # what a decoder shows for an incomplete UTF-8 sequence


class RequestCancelled(Exception):
    """The client went away: raised inside `on_tokens`, so the engine stops decoding the request."""


@dataclass(frozen=True)
class Finished:
    output: GenerationOutput


@dataclass(frozen=True)
class Failed:
    error: BaseException


StreamItem = list[int] | Finished | Failed


class TokenStream:
    """One request's token chunks, then exactly one `Finished` or `Failed`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[StreamItem] = asyncio.Queue()
        self._cancelled = threading.Event()
        self._held: StreamItem | None = None  # an end item read while merging chunks, returned next

    def on_tokens(self, new_ids: list[int]) -> None:
        """The engine's callback (decoding thread)."""
        if self._cancelled.is_set():
            raise RequestCancelled("the client closed the stream")
        self._loop.call_soon_threadsafe(self._queue.put_nowait, list(new_ids))

    def settle(self, task: asyncio.Future) -> None:
        """Done callback of the generation task (event loop): after every chunk the engine sent,
        since the decoding thread posts its chunks before its result."""
        if task.cancelled():
            self._queue.put_nowait(Failed(asyncio.CancelledError()))
        elif task.exception() is not None:
            self._queue.put_nowait(Failed(task.exception()))
        else:
            self._queue.put_nowait(Finished(task.result()))

    def cancel(self) -> None:
        self._cancelled.set()

    async def next(self) -> StreamItem:
        """The next item; chunks already queued behind a chunk are merged into it. When the event loop falls
        behind the decoding rounds (many concurrent streams), it renders and sends one event per request for
        all the rounds it missed instead of one per round, so its work stops growing with the backlog and
        the decoding thread gets the GIL back sooner."""
        if self._held is not None:
            item, self._held = self._held, None
            return item
        item = await self._queue.get()
        if not isinstance(item, list):
            return item
        while not self._queue.empty():  # `item` is this stream's own list (on_tokens copies), extended in place
            following = self._queue.get_nowait()
            if not isinstance(following, list):
                self._held = following
                break
            item.extend(following)
        return item


def render_text(
    tokenizer: TokenizerLike, ids: list[int], stop_strings: list[str], skip_special_tokens: bool
) -> str:
    """The text of `ids` as the client sees it: cut before the first stop string (SGLang does not
    return it)."""
    text, _ = trim_at_stop(tokenizer.decode(ids, skip_special_tokens=skip_special_tokens), stop_strings)
    return text


def stable_text(text: str, stop_strings: list[str]) -> str:
    """The part of a partial output's text that later tokens cannot change: an incomplete UTF-8
    character at the end is held back, and so is an ending that could grow into a stop string."""
    text = text.rstrip(REPLACEMENT)
    hold = 0
    for stop in stop_strings:
        for k in range(min(len(stop) - 1, len(text)), hold, -1):
            if text.endswith(stop[:k]):
                hold = k
                break
    return text[: len(text) - hold]
