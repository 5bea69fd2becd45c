"""TokenStream: chunks queued behind a chunk are merged (one event for the rounds the event loop missed), the
end item is never merged and comes after every token, in order."""

from __future__ import annotations

import asyncio

from ddtree.server.streaming import Failed, Finished, TokenStream


def test_queued_chunks_merge_and_the_end_comes_last() -> None:
    async def scenario() -> list:
        stream = TokenStream(asyncio.get_running_loop())
        stream.on_tokens([1, 2])
        await asyncio.sleep(0)  # delivered: the first read gets it alone
        first = await stream.next()
        for chunk in ([3], [4, 5], [6]):
            stream.on_tokens(chunk)
        await asyncio.sleep(0)
        end = Finished(output=None)  # type: ignore[arg-type]
        stream._queue.put_nowait(end)
        stream.on_tokens([7])  # a chunk after the end item stays behind it
        await asyncio.sleep(0)
        return [first, await stream.next(), await stream.next(), await stream.next()]

    first, merged, end, late = asyncio.run(scenario())
    assert first == [1, 2]
    assert merged == [3, 4, 5, 6]
    assert isinstance(end, Finished)
    assert late == [7]


def test_a_failure_is_returned_as_is() -> None:
    async def scenario() -> list:
        stream = TokenStream(asyncio.get_running_loop())
        stream._queue.put_nowait(Failed(RuntimeError("x")))
        return [await stream.next()]

    (item,) = asyncio.run(scenario())
    assert isinstance(item, Failed)
