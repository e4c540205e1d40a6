"""TF Serving's REST API over HTTP, on aiohttp (asynchronous: no client holds a thread): the transport of
`rest_api.RestApi`, which routes the requests to a `core.ServerCore` (endpoints, formats and errors are its and
`rest_json`'s).

Limits (what a client sees; every message names the limit, the value and the flag that raises it):
    - body size, `rest_api_max_body_bytes` (8 MiB by default, never above `max_message_bytes`): a larger
      Content-Length is answered 413 before any of the body is read; a chunked body is counted as it arrives and
      cut with a 413 at the limit. The connection is closed after a 413.
    - bytes in flight, `rest_api_max_bytes_in_flight` (64 MiB by default): request bodies being read or parsed
      plus responses not yet sent, over all connections; past it a request is answered 429 at once. (A legal
      request of the ELMo signatures at the default row and token limits is about 2 MB of JSON; parsing costs up
      to ~25x the body, hence the body limit well under the gRPC message size, and a body of more JSON values than
      the request limits allow is refused unparsed: `json_tensor.max_json_values`.)
    - whole-request deadline, `rest_api_timeout_in_ms` (30 s by default): headers must arrive within it of the
      connection opening (or of the previous response: idle keep-alive connections close then too); the body
      within it of the headers (408 and the connection closed); the model call gets what is left (504 after).
      A response must be written within it too, or the connection is dropped.
    - response size, `max_message_bytes`: the predict budget counts JSON's cost before the model runs (see
      `response_size`), and the JSON is written piece by piece and abandoned with a 429 as soon as it passes
      the limit, so no response above it is ever built.
    - HTTP framing: request line and each header at most 8190 bytes, at most 128 headers (aiohttp's parser: 400).

Threads: one event loop thread owns every connection (aiohttp); JSON parsing, the model call and JSON writing run
on a pool of `rest_api_num_threads` threads, so a slow client costs a socket and a coroutine, never a thread.
"""

import asyncio
import concurrent.futures
import logging
import socket
import threading

import grpc
from aiohttp import web

from elmo_tf.serving.limits.byte_units import MiB
from elmo_tf.serving.rest.rest_api import RestApi
from elmo_tf.serving.rest.rest_json import error_body
from elmo_tf.serving.serving_error import ServingError, invalid_argument, resource_exhausted

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 8 * MiB  # Python objects from JSON cost up to ~25x the body (a list of empty lists)
DEFAULT_MAX_BYTES_IN_FLIGHT = 64 * MiB
LINGER_SECONDS = 2.0  # after an error, unread body is drained (and dropped) this long before the connection closes


def _listen(host, port):
    """A bound TCP socket for `host:port` (0: a free port); OSError naming the address if it cannot be had."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as e:
        raise OSError(f"cannot listen on {host}:{port} for REST: {e}") from None
    return sock


class _Held:
    """Bytes one request holds against the server's bytes-in-flight budget; released together at the end."""

    def __init__(self, rest):
        self.rest, self.size = rest, 0

    def add(self, size):
        self.size += size
        self.rest.in_flight += size

    def release(self):
        self.rest.in_flight -= self.size
        self.size = 0


class RestServer:
    """The REST API of a `ServerCore` on `options.host:options.rest_api_port` (0: a free port, see `.port`).

    Args:
        core: the `core.ServerCore` (predict, model_status, model_metadata, stats).
        options: its `ServerOptions`: host, rest_api_port, rest_api_num_threads, rest_api_timeout_in_ms,
            max_message_bytes, rest_api_max_body_bytes and rest_api_max_bytes_in_flight (None: the defaults here).
    """

    def __init__(self, core, options):
        self.timeout = options.rest_api_timeout_in_ms / 1000.0
        self.max_response_bytes = options.max_message_bytes
        body_limit = options.rest_api_max_body_bytes or DEFAULT_MAX_BODY_BYTES
        if options.max_message_bytes < body_limit:
            self.max_body_bytes, self.body_flag = options.max_message_bytes, "--max_message_bytes"
        else:
            self.max_body_bytes, self.body_flag = body_limit, "--rest_api_max_body_bytes"
        self.max_bytes_in_flight = options.rest_api_max_bytes_in_flight or DEFAULT_MAX_BYTES_IN_FLIGHT
        self.in_flight = 0  # bytes held by requests (bodies read, responses not yet sent); touched on the loop only
        self.api = RestApi(core, self.timeout, self.max_response_bytes)
        self._sock = _listen(options.host, options.rest_api_port)
        self.port = self._sock.getsockname()[1]
        self._pool = concurrent.futures.ThreadPoolExecutor(options.rest_api_num_threads, thread_name_prefix="rest")
        self._loop = asyncio.new_event_loop()
        self._thread = None
        self._runner = self._site = None
        self._active = 0

    # ------------------------------------------------------------------------------------------------ lifecycle

    def start(self):
        self._thread = threading.Thread(target=self._loop.run_forever, name="rest-loop", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result()
        return self

    async def _start(self):
        server = web.Server(
            self._handle, keepalive_timeout=self.timeout, lingering_time=LINGER_SECONDS, access_log=None
        )
        self._runner = web.ServerRunner(server, shutdown_timeout=1.0)
        await self._runner.setup()
        self._site = web.SockSite(self._runner, self._sock, backlog=128)
        await self._site.start()

    def stop(self, grace=5.0):
        """Stops listening, lets requests being handled finish (up to `grace` seconds), closes every connection."""
        if self._thread is not None:
            try:
                asyncio.run_coroutine_threadsafe(self._stop(grace), self._loop).result(grace + 10)
            except Exception:
                logger.warning("REST server did not stop cleanly", exc_info=True)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            self._thread = None
        if not self._loop.is_running():
            self._loop.close()
        self._sock.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _stop(self, grace):
        await self._site.stop()
        loop = asyncio.get_running_loop()
        end = loop.time() + grace
        while self._active and loop.time() < end:
            await asyncio.sleep(0.05)
        await self._runner.cleanup()

    # ------------------------------------------------------------------------------------------------ requests

    async def _handle(self, request):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout  # the loop's clock is time.monotonic()
        held = _Held(self)
        self._active += 1
        try:
            try:
                self.api.core.check_open()  # a draining server refuses every new request: 503
                body = await self._read_body(request, held, deadline) if request.method == "POST" else b""
            except ServingError as e:
                logger.debug("%s %s: %s", request.method, request.path, e.details)
                response = web.Response(
                    status=e.http_status, body=error_body(e.details), content_type="application/json"
                )
                response.force_close()
                return response
            transport = request.transport
            status, parts, content_type = await loop.run_in_executor(
                self._pool,
                self.api.handle,
                request.method,
                request.raw_path,  # as sent: percent-encoded, with its query (TF Serving matches that)
                body,
                deadline,
                lambda: transport is None or transport.is_closing(),
                request.headers.get("Origin", ""),
            )
            del body
            held.release()
            held.add(sum(len(part) for part in parts))
            return await self._respond(request, status, parts, content_type)
        finally:
            held.release()
            self._active -= 1

    async def _read_body(self, request, held, deadline):
        """The body, counted against the body limit and the bytes in flight as it arrives, within `deadline`."""
        length, limit = request.content_length, self.max_body_bytes
        if length is not None and length > limit:
            raise self._too_large(f"a request body of {length} bytes (Content-Length)")
        if self.in_flight >= self.max_bytes_in_flight:
            raise self._busy()
        if request.headers.get("Expect", "").lower() == "100-continue":
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = bytearray()
        try:
            async with asyncio.timeout_at(deadline):
                while chunk := await request.content.readany():
                    body += chunk
                    held.add(len(chunk))
                    if len(body) > limit:
                        raise self._too_large(f"a request body of more than {limit} bytes")
                    if self.in_flight > self.max_bytes_in_flight:
                        raise self._busy()
        except TimeoutError:
            raise ServingError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the request body was not received within {self.timeout:g} s, the server's limit "
                f"(--rest_api_timeout_in_ms)",
                http_status=408,
            ) from None
        except web.RequestPayloadError as e:
            raise invalid_argument(f"the request body could not be read: {e}") from None
        return body

    def _too_large(self, what):
        return ServingError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"{what} is above the server's limit of {self.max_body_bytes} bytes ({self.body_flag}): "
            f"send fewer or shorter sentences per request",
            http_status=413,
        )

    def _busy(self):
        return resource_exhausted(
            f"REST requests in flight hold {self.in_flight} bytes, at the server's limit of "
            f"{self.max_bytes_in_flight} bytes (--rest_api_max_bytes_in_flight): retry later"
        )

    async def _respond(self, request, status, parts, content_type):
        response = web.StreamResponse(status=status, headers={"Content-Type": content_type})
        response.content_length = sum(len(part) for part in parts)
        try:
            async with asyncio.timeout(self.timeout):
                await response.prepare(request)
                for part in parts:
                    await response.write(part)
                await response.write_eof()
        except TimeoutError:
            logger.debug("%s %s: the client did not read its response in time", request.method, request.path)
            if request.transport is not None:
                request.transport.abort()
        return response
