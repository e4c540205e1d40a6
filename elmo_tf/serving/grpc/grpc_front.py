"""TF Serving's gRPC API over a `core.ServerCore`: `tensorflow.serving.PredictionService` (`Predict`,
`GetModelMetadata`, and `Classify`, `Regress`, `MultiInference` answered as stock answers them for the signatures
served: see `inference`) and `tensorflow.serving.ModelService.GetModelStatus`, with the protos of
`tensorflow_serving.apis`.

An asyncio server (`grpc.aio`) on one event loop thread shared by the process's gRPC servers: a call waits for its
request message as a coroutine, so calls whose request never arrives hold no thread and cannot starve the others.
The message arrives as bytes and is parsed off the loop (`grpc_parse`): one above `grpc_parse.INLINE_PARSE_BYTES`
on a pool of `grpc_parse.PARSE_THREADS` threads, its protobuf entries counted first and held to what the request
budget needs, so that no parse holds the GIL (the loop's too) much longer than its bytes take to copy (issue 38: one
60 MB Predict of 20M strings, parsed on the loop, stopped every other call for 1.44 s; gRPC's own copy of a message
into bytes, on the loop, is left: about 1 ms per MB). The work of a call (reading TensorProtos, the
model) runs on a pool of `grpc_max_threads` threads; a client that cancels is seen by the core (`cancelled`). At
most `4 x grpc_max_threads` calls that have their request are open at once (being parsed on the pool, or at work;
past that bound a call is refused, RESOURCE_EXHAUSTED), and at most `MAX_WAITING_CALLS` calls waiting for it, each for
at most `grpc_request_receive_timeout_s` (then DEADLINE_EXCEEDED). Clients that never send fill the waiting places
only (`CallPlaces`, `_ReceiveBounded`). A connection must complete its HTTP/2 handshake within
`grpc_request_receive_timeout_s` and is closed after `MAX_CONNECTION_IDLE_S` without calls.

A waiting place is never refused (issue 49: calls that never sent their request, from one address, held its share of
the places, and a complete Predict from the same address, a client behind the same proxy or NAT, was refused at once).
grpc.aio starts a handler on a call's headers, before its message, so every call takes a waiting place first; stock's
server dispatches a unary call once its message has arrived, and calls that never send never refuse one that did.
Here, when a newcomer puts its connection past `CONNECTION_SHARE` of the waiting places, else its address past
`ADDRESS_SHARE`, else the server past `MAX_WAITING_CALLS`, the call that has waited longest in that group (for the
server: in the address holding the most waiting places) gives its place up, as slow-client defences drop the slowest:
it ends RESOURCE_EXHAUSTED, naming the share (`CallPlaces.wait`). So:
- memory stays bounded: at most `MAX_WAITING_CALLS` waiting calls in all, a share per connection and per address;
- a call whose message has arrived is served: a call leaves the waiting places when its read ends, one whose read has
  ended is never evicted (and one evicted while its message was being delivered is served all the same), and the
  newcomer, the newest of every group, is never the one evicted. A call could lose its place only if its whole
  connection's (or address's) share of newer calls came after it while its message, sent with its headers by every
  ordinary client, was still on its way: 256 calls by default, while its read takes one pass of the event loop;
- fairness: a client evicts its own calls first (its connection's, then its address's oldest), and when the server is
  full, the address holding the most places gives up its oldest; an attacker at its address's share never evicts the
  slow calls of another address holding fewer, but clients behind the same address share its places, whoever opened
  them: an attacker there can evict a slow honest upload, never a complete call.

Before anything is built from a request: gRPC refuses a message above `max_message_bytes` (RESOURCE_EXHAUSTED,
gRPC's own message); a message with more protobuf entries than any request within the budget needs is refused before
it is parsed (RESOURCE_EXHAUSTED naming the limit: `grpc_parse.ParseLimits`), one that cannot be parsed is INTERNAL
(as gRPC's C++ server answers); each input's TensorProto is checked (dtype, declared shape, limits:
`budget.RequestBudget.check_tensor_proto`, for every signature, `packed` and `lm` too) before its values are read
(`budget.read_tensor_proto`), and a call whose deadline has passed is not run. Model specs are checked as TF
Serving's ServerCore checks them (`core.ServerCore.resolve`).
"""

import asyncio
import concurrent.futures
import logging
import threading
import time

import grpc
import tensorflow as tf
from tensorflow_serving.apis import (
    classification_pb2,
    inference_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from elmo_tf.serving.grpc import grpc_parse
from elmo_tf.serving.grpc.call_places import CallPlaces, Waiting
from elmo_tf.serving.limits.budget import read_tensor_proto
from elmo_tf.serving.serving_error import SIGNATURE_DEF_FIELD, ServingError, invalid_argument, redact_paths

logger = logging.getLogger(__name__)


def _model_spec(request):
    """(name, version or None, version label) of a request's model spec; INVALID_ARGUMENT "Missing ModelSpec" without
    one (predict_impl.cc `TensorflowPredictor::Predict`, get_model_status_impl.cc
    `GetModelStatusImpl::GetModelStatus`)."""
    if not request.HasField("model_spec"):
        raise invalid_argument("Missing ModelSpec")
    spec = request.model_spec
    return spec.name, (spec.version.value if spec.HasField("version") else None), spec.version_label


def decode_tensor_protos(protos):
    """`budget -> {alias: array}` for `ServerCore.predict`: names and each TensorProto's declared dtype and shape
    are checked against the signature's request budget before its values are read."""

    def decode(budget):
        budget.signature.check_input_names(protos.keys())
        for alias, proto in protos.items():
            budget.check_tensor_proto(alias, proto)
        arrays = {}
        for alias, proto in protos.items():
            try:
                arrays[alias] = read_tensor_proto(proto)
            except Exception as e:
                logger.debug("input %s: tf.make_ndarray failed: %s: %s", alias, type(e).__name__, e)
                raise invalid_argument(f"tensor parsing error: {alias}") from None  # saved_model/util.cc
        return arrays

    return decode


def _outcome(method, work):
    """Runs `work()`: (response, None, None), or (None, code, details) for a `ServingError` or any exception."""
    try:
        return work(), None, None
    except ServingError as e:
        logger.debug("%s: %s %s", method, e.code.name, e.details)
        return None, e.code, e.details
    except MemoryError:
        logger.error("%s: out of memory", method)
        return None, grpc.StatusCode.RESOURCE_EXHAUSTED, "out of memory: send fewer or shorter sentences"
    except Exception as e:
        logger.exception("%s failed", method)
        return None, grpc.StatusCode.INTERNAL, redact_paths(f"{type(e).__name__}: {e}")


class _Servicer:
    def __init__(self, core, pool, places):
        self.core = core
        self._pool = pool
        self._places = places

    async def _call(self, context, method, work, blocking=True, model_name=None):
        """Runs `work(cancelled)` (on the pool when `blocking`: `_run_working`) and answers with its response or its
        status. A draining server refuses it UNAVAILABLE at once. With `model_name` (Predict, Classify, Regress) the
        outcome is counted and a success timed, as stock's prediction_service_impl.cc records them."""
        started = time.monotonic()
        try:
            self.core.check_open()
        except ServingError as e:
            if model_name is not None:
                self.core.metrics.record_request(model_name, e.code)
            await context.abort(e.code, e.details)
        cancelled = threading.Event()
        if blocking:
            outcome = await _run_working(
                self._pool, self._places, context, method, lambda: work(cancelled.is_set), cancelled
            )
        else:
            outcome = _outcome(method, lambda: work(cancelled.is_set))
        response, code, details = outcome
        if model_name is not None:
            self.core.metrics.record_request(model_name, code)
            if code is None:
                self.core.metrics.record_latency(model_name, method, "GRPC", time.monotonic() - started)
        if code is not None:
            await context.abort(code, details)
        return response


async def _run_working(pool, places, context, method, work, cancelled=None):
    """`_outcome(method, work)` run on `pool`, holding one of the `places.max_working` places until `work` has ended,
    even when its client cancels first: the work (and the request it holds) lives on until then; `cancelled` (an
    Event) is set when the client cancels or its deadline passes. RESOURCE_EXHAUSTED without a place, UNAVAILABLE
    once the pool is shut down."""
    peer = context.peer()
    refused = places.refusal(peer)
    if refused:
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refused)
    places.take(peer)
    loop = asyncio.get_running_loop()
    try:
        future = pool.submit(_outcome, method, work)
    except RuntimeError:  # the pool is shut down: the server is stopping
        places.release(peer)
        await context.abort(grpc.StatusCode.UNAVAILABLE, "the server is stopping")
    future.add_done_callback(lambda _: loop.call_soon_threadsafe(places.release, peer))
    try:  # shielded: a cancelled call's work is not taken off the pool's queue, it sees `cancelled` and ends
        return await asyncio.shield(asyncio.wrap_future(future))
    except asyncio.CancelledError:  # the client cancelled, or its deadline passed
        if cancelled is not None:
            cancelled.set()
        raise


class _PredictionServicer(_Servicer, prediction_service_pb2_grpc.PredictionServiceServicer):
    async def Predict(self, request, context):
        timeout = context.time_remaining()  # None or ~9.2e18 s without a deadline

        def work(cancelled):
            name, version, label = _model_spec(request)
            served, signature, outputs = self.core.predict(
                name,
                version,
                request.model_spec.signature_name,
                decode_tensor_protos(request.inputs),
                tuple(request.output_filter),
                timeout=timeout,
                cancelled=cancelled,
                label=label,
            )
            response = predict_pb2.PredictResponse()
            response.model_spec.name = name
            response.model_spec.version.value = served
            response.model_spec.signature_name = signature
            for alias, value in outputs.items():
                response.outputs[alias].CopyFrom(tf.make_tensor_proto(value))
            return response

        return await self._call(context, "Predict", work, model_name=request.model_spec.name)

    async def GetModelMetadata(self, request, context):
        def work(cancelled):
            name, version, label = _model_spec(request)
            if not request.metadata_field:  # get_model_metadata_impl.cc ValidateGetModelMetadataRequest
                raise invalid_argument("GetModelMetadataRequest must specify at least one metadata_field")
            for field in request.metadata_field:
                if field != SIGNATURE_DEF_FIELD:
                    raise invalid_argument(f"Metadata field {field} is not supported")
            return self.core.model_metadata(name, version, label)

        return await self._call(context, "GetModelMetadata", work, blocking=False)

    def _infer(self, request, method):
        name, version, label = _model_spec(request)  # classification_service.cc Classify
        self.core.infer(name, version, label, method, request.model_spec.signature_name)

    async def Classify(self, request, context):
        def work(cancelled):
            self._infer(request, "classify")
            return classification_pb2.ClassificationResponse()

        return await self._call(context, "Classify", work, blocking=False, model_name=request.model_spec.name)

    async def Regress(self, request, context):
        def work(cancelled):
            self._infer(request, "regress")
            return regression_pb2.RegressionResponse()

        return await self._call(context, "Regress", work, blocking=False, model_name=request.model_spec.name)

    async def MultiInference(self, request, context):
        def work(cancelled):
            self.core.multi_inference(request.tasks)
            return inference_pb2.MultiInferenceResponse()

        return await self._call(context, "MultiInference", work, blocking=False)


class _ModelServicer(_Servicer, model_service_pb2_grpc.ModelServiceServicer):
    async def GetModelStatus(self, request, context):
        def work(cancelled):
            name, version, _ = _model_spec(request)  # a version label plays no part (get_model_status_impl.cc)
            return self.core.model_status(name, version)

        return await self._call(context, "GetModelStatus", work, blocking=False)

    async def HandleReloadConfigRequest(self, request, context):
        def work(cancelled):
            return self.core.reload_config(request.config)

        return await self._call(context, "HandleReloadConfigRequest", work)  # on the pool: new models load here


def listen_address(host, port):
    """The gRPC address of host and port: "host:port", with brackets around an IPv6 host."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


MAX_CONNECTION_IDLE_S = 300.0  # a connection without calls is closed after this (gRPC: max_connection_idle_ms)
MAX_WAITING_CALLS = 1024  # calls waiting for their request message at once (each costs a coroutine and a few KiB)


class _ReceiveBounded(grpc.GenericRpcHandler):
    """A generated service's unary-unary handlers, each served as a stream-unary handler of raw bytes that waits at
    most `places.timeout` seconds for the request message (a unary handler would wait for it without end) in a
    waiting place (`CallPlaces.wait`: never refused; evicted calls end RESOURCE_EXHAUSTED), parses it (`_Parser`: off
    the event loop in a working place unless it is small), then runs the unary handler with it; `CallPlaces` bounds
    each stage."""

    def __init__(self, handler, places, parser):
        self._handler = handler
        self._places = places
        self._parser = parser

    def service(self, handler_call_details):
        handler = self._handler.service(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        unary, places, parser = handler.unary_unary, self._places, self._parser
        message_class = handler.request_deserializer.__self__  # a generated message class's FromString
        method = handler_call_details.method

        async def receive_then_run(request_iterator, context):
            call = Waiting(context.peer(), asyncio.ensure_future(request_iterator.__anext__()))
            places.wait(call)  # never refused: past a share, the call that has waited longest gives its place up
            try:
                await asyncio.wait(
                    (call.read, call.evicted), timeout=places.timeout, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                places.leave(call)
                if not call.read.done():  # timed out, evicted, or the client cancelled
                    call.read.cancel()
            if call.read.done():  # the message (served even when evicted in the meantime), or the end of the stream
                try:
                    data = call.read.result()
                except StopAsyncIteration:  # half-closed without a message
                    await context.abort(grpc.StatusCode.INTERNAL, "No request message received")
            elif call.evicted.done():
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, call.evicted.result())
            else:
                await context.abort(
                    grpc.StatusCode.DEADLINE_EXCEEDED, f"request message not received within {places.timeout:g} s"
                )
            request = await parser.parse(context, method, data, message_class)
            return await unary(request, context)

        return grpc.stream_unary_rpc_method_handler(
            receive_then_run, request_deserializer=None, response_serializer=handler.response_serializer
        )


class _Parser:
    """Parses request messages (`grpc_parse.parse`): a small one on the event loop, a larger one on `pool`
    (`grpc_parse.PARSE_THREADS` threads) holding a working place, its entries counted against `limits`
    (`grpc_parse.ParseLimits`) first."""

    def __init__(self, pool, places, limits):
        self._pool = pool
        self._places = places
        self._limits = limits

    async def parse(self, context, method, data, message_class):
        def work():
            return grpc_parse.parse(data, message_class, self._limits)

        if grpc_parse.parses_inline(data, self._limits):
            request, code, details = _outcome(method, work)
        else:
            request, code, details = await _run_working(self._pool, self._places, context, method, work)
        if code is not None:
            await context.abort(code, details)
        return request


class _BoundedRegistry:
    """What a generated `add_*Servicer_to_server` is given: it adds the service's handlers to `server` wrapped in
    `_ReceiveBounded`."""

    def __init__(self, server, places, parser):
        self._server = server
        self._places = places
        self._parser = parser

    def add_generic_rpc_handlers(self, handlers):
        self._server.add_generic_rpc_handlers(tuple(_ReceiveBounded(h, self._places, self._parser) for h in handlers))


class _Loop:
    """The process's asyncio loop for gRPC servers, on a daemon thread started on first use (one loop: grpc.aio
    objects belong to the loop they were made on)."""

    _lock = threading.Lock()
    _loop = None

    @classmethod
    def get(cls):
        with cls._lock:
            if cls._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="grpc-loop", daemon=True).start()
                cls._loop = loop
            return cls._loop

    @classmethod
    def run(cls, coroutine, timeout=None):
        return asyncio.run_coroutine_threadsafe(coroutine, cls.get()).result(timeout)


class _Stopped:
    """What `GrpcServer.stop` returns: `wait(timeout)` until running calls have ended."""

    def __init__(self, future):
        self._future = future

    def wait(self, timeout=None):
        try:
            self._future.result(timeout)
        except concurrent.futures.TimeoutError:
            return False
        return True


class GrpcServer:
    """The gRPC API of a `ServerCore` on `options.host:options.port` (0: a free port, see `.port`; None: no TCP port)
    and on the UNIX socket `options.grpc_socket_path` when set ("unix:PATH", as stock's Server::BuildAndStart in
    server.cc adds it).

    Args:
        core: `core.ServerCore`.
        options: `ServerOptions` (host, port, grpc_socket_path, grpc_max_threads, max_message_bytes, and the request
            limits the protobuf entries of a message are held to: `grpc_parse.ParseLimits.from_limits`).
    Attributes:
        port: the TCP port listened on (None without one).
    """

    def __init__(self, core, options):
        self._pool = concurrent.futures.ThreadPoolExecutor(options.grpc_max_threads, thread_name_prefix="grpc")
        self._parse_pool = concurrent.futures.ThreadPoolExecutor(
            grpc_parse.PARSE_THREADS, thread_name_prefix="grpc-parse"
        )
        self._parse_limits = grpc_parse.ParseLimits.from_limits(options.limits)
        self._server = None
        self.health = None  # the grpc.health.v1 servicer, with --enable_grpc_healthcheck_service
        addresses = [listen_address(options.host, options.port)] if options.port is not None else []
        if options.grpc_socket_path is not None:
            addresses.append(f"unix:{options.grpc_socket_path}")
        ports = _Loop.run(self._create(core, options, addresses))
        self.port = ports[0] if options.port is not None else None
        listening = [listen_address(options.host, self.port)] if self.port is not None else []
        listening += addresses[len(listening) :]
        logger.info(
            "gRPC API on %s (max message %d bytes, %d protobuf entries)",
            ", ".join(listening),
            options.max_message_bytes,
            self._parse_limits.max_entries,
        )

    async def _create(self, core, options, addresses):
        size = options.max_message_bytes
        self._server = grpc.aio.server(
            options=[
                ("grpc.max_send_message_length", size),
                ("grpc.max_receive_message_length", size),
                ("grpc.so_reuseport", 0),
                # idle connections end: a handshake within the receive bound, no calls for MAX_CONNECTION_IDLE_S
                ("grpc.server_handshake_timeout_ms", int(options.grpc_request_receive_timeout_s * 1000)),
                ("grpc.max_connection_idle_ms", int(MAX_CONNECTION_IDLE_S * 1000)),
            ],
        )  # no maximum_concurrent_rpcs: grpc.aio's counts calls still waiting for their message (CallPlaces)
        places = CallPlaces(MAX_WAITING_CALLS, 4 * options.grpc_max_threads, options.grpc_request_receive_timeout_s)
        self._places = places
        parser = _Parser(self._parse_pool, places, self._parse_limits)
        registry = _BoundedRegistry(self._server, places, parser)
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
            _PredictionServicer(core, self._pool, places), registry
        )
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(_ModelServicer(core, self._pool, places), registry)
        if options.enable_grpc_healthcheck_service:
            from grpc_health.v1 import health, health_pb2_grpc

            self.health = health.aio.HealthServicer()
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        ports = []
        credentials = options.ssl.credentials() if options.ssl is not None else None
        for address in addresses:
            try:
                if credentials is not None:
                    port = self._server.add_secure_port(address, credentials)
                else:
                    port = self._server.add_insecure_port(address)
            except RuntimeError as e:
                raise OSError(f"cannot listen on {address} for gRPC: {e}") from None
            if not port:
                raise OSError(f"cannot listen on {address} for gRPC (in use?)")
            ports.append(port)
        return ports

    def start(self):
        _Loop.run(self._server.start())

    def set_health(self, statuses):
        """Sets the health service's `{service name: serving (bool)}`; nothing without the health service, or once
        `drain_health` has run (gRPC's servicer then keeps every service NOT_SERVING)."""
        if self.health is None:
            return
        from grpc_health.v1 import health_pb2

        serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING

        async def apply():
            for service, ok in statuses.items():
                await self.health.set(service, serving if ok else not_serving)

        _Loop.run(apply(), timeout=10)

    def drain_health(self):
        """Every service of the health service NOT_SERVING, for good (grpc_health's graceful shutdown)."""
        if self.health is not None:
            _Loop.run(self.health.enter_graceful_shutdown(), timeout=10)

    def stop(self, grace=5.0):
        """Stops accepting calls; returns an object whose `wait(timeout)` returns once running calls have ended (at
        most `grace` seconds)."""
        future = asyncio.run_coroutine_threadsafe(self._server.stop(grace), _Loop.get())
        future.add_done_callback(lambda _: self._shut_pools())
        return _Stopped(future)

    def _shut_pools(self):
        for pool in (self._parse_pool, self._pool):
            pool.shutdown(wait=False, cancel_futures=True)
