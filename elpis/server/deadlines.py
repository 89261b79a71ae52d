"""A deadline for the request line and headers, which aiohttp does not have on its own.

The timer runs from the moment a connection opens, and again from the end of each response, until the next
request's headers are complete. If it fires while part of a request has arrived, the client gets 408 and
the connection is closed; an idle keep-alive connection is simply closed. The body deadline lives in the
handler (`app.read_body`), where the body is read.

This wraps aiohttp's connection protocol (`RequestHandler`) through its own extension points: the protocol
factory (`Server.__call__`) and `AppRunner._make_server`; aiohttp is pinned, and the tests exercise it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server

from elpis.server.errors import error_body


def _timeout_response() -> bytes:
    body = json.dumps(error_body(408, "request headers did not arrive in time", "request_timeout")).encode()
    head = (
        "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class HeaderDeadlineHandler(RequestHandler):
    def __init__(self, *args: Any, header_timeout: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timeout = header_timeout
        self._header_timer: asyncio.TimerHandle | None = None
        self._bytes_since_armed = 0

    def _arm(self) -> None:
        self._disarm()
        self._bytes_since_armed = 0
        self._header_timer = self._loop.call_later(self._header_timeout, self._headers_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self._bytes_since_armed:
            transport.write(_timeout_response())
        self.force_close()
        transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        requests_before = self._request_count
        self._bytes_since_armed += len(data)
        super().data_received(data)
        if self._request_count != requests_before:
            self._disarm()  # headers complete; the body has its own deadline

    async def finish_response(self, request: Any, resp: Any, start_time: Any) -> Any:
        result = await super().finish_response(request, resp, start_time)
        if resp.keep_alive and request.content.is_eof() and not self._messages and self.transport is not None:
            self._arm()  # the connection stays open for the next request: its headers get the deadline
        # Otherwise aiohttp either closes the connection (after a short lingering read of an unread body,
        # so the client sees the answer) or reads that body first; its keep-alive timeout then bounds the
        # wait for the next request's headers (closing without a 408).
        return result


class HeaderDeadlineServer(Server):
    def __call__(self) -> RequestHandler:
        return HeaderDeadlineHandler(self, loop=self._loop, **self._kwargs)


class DeadlineAppRunner(web.AppRunner):
    """`web.AppRunner` whose connections enforce `header_timeout` (a keyword argument, in seconds)."""

    async def _make_server(self) -> Server:
        server = await super()._make_server()
        server.__class__ = HeaderDeadlineServer
        return server
