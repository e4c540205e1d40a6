"""TF Serving's gRPC API over a `core.ServerCore`: `tensorflow.serving.PredictionService`
(`Predict`, `GetModelMetadata`; `Classify`, `Regress` and `MultiInference` answer UNIMPLEMENTED) and
`tensorflow.serving.ModelService.GetModelStatus`, with the protos of `tensorflow_serving.apis`.

Before anything is built from a request: gRPC refuses a message above `max_message_bytes` (RESOURCE_EXHAUSTED,
gRPC's own message), each input's TensorProto is checked (dtype, declared shape, limits:
`budget.RequestBudget.check_tensor_proto`) before `tf.make_ndarray` reads its values, and a call whose deadline has
passed is not run. Calls beyond `4 x grpc_max_threads` waiting for a thread are refused by gRPC
(RESOURCE_EXHAUSTED).
"""

import concurrent.futures
import logging

import grpc
import tensorflow as tf
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from elmo_tf.serving.status import SIGNATURE_DEF_FIELD, ServingError, invalid_argument, not_found, redact_paths

logger = logging.getLogger(__name__)


def _model_spec(request):
    if not request.HasField("model_spec"):
        raise invalid_argument("Missing ModelSpec")
    spec = request.model_spec
    if spec.version_label:
        raise not_found(f"Unrecognized servable version label: {spec.version_label} (this server has no labels)")
    return spec.name, (spec.version.value if spec.HasField("version") else None)


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
                arrays[alias] = tf.make_ndarray(proto)
            except Exception as e:
                raise invalid_argument(
                    f"input '{alias}': cannot read the TensorProto ({type(e).__name__}: {e})"
                ) from None
        return arrays

    return decode


def _answer(context, method, response_type, work):
    """Runs `work()`; a `ServingError` (or any exception) becomes the call's status, never a crash."""
    try:
        return work()
    except ServingError as e:
        code, details = e.code, e.details
        logger.debug("%s: %s %s", method, code.name, details)
    except MemoryError:
        code, details = grpc.StatusCode.RESOURCE_EXHAUSTED, "out of memory: send fewer or shorter sentences"
        logger.error("%s: out of memory", method)
    except Exception as e:
        code, details = grpc.StatusCode.INTERNAL, redact_paths(f"{type(e).__name__}: {e}")
        logger.exception("%s failed", method)
    context.set_code(code)
    context.set_details(details)
    return response_type()


class _PredictionServicer(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, core):
        self.core = core

    def Predict(self, request, context):
        def work():
            name, version = _model_spec(request)
            served, signature, outputs = self.core.predict(
                name,
                version,
                request.model_spec.signature_name,
                decode_tensor_protos(request.inputs),
                tuple(request.output_filter),
                timeout=context.time_remaining(),  # None or ~9.2e18 s without a deadline
                cancelled=lambda: not context.is_active(),
            )
            response = predict_pb2.PredictResponse()
            response.model_spec.name = name
            response.model_spec.version.value = served
            response.model_spec.signature_name = signature
            for alias, value in outputs.items():
                response.outputs[alias].CopyFrom(tf.make_tensor_proto(value))
            return response

        return _answer(context, "Predict", predict_pb2.PredictResponse, work)

    def GetModelMetadata(self, request, context):
        def work():
            name, version = _model_spec(request)
            if not request.metadata_field:
                raise invalid_argument("GetModelMetadataRequest must specify at least one metadata_field")
            for field in request.metadata_field:
                if field != SIGNATURE_DEF_FIELD:
                    raise invalid_argument(f"Metadata field {field} is not supported")
            return self.core.model_metadata(name, version)

        return _answer(context, "GetModelMetadata", get_model_metadata_pb2.GetModelMetadataResponse, work)


class _ModelServicer(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, core):
        self.core = core

    def GetModelStatus(self, request, context):
        def work():
            name, version = _model_spec(request)
            return self.core.model_status(name, version)

        return _answer(context, "GetModelStatus", get_model_status_pb2.GetModelStatusResponse, work)


def listen_address(host, port):
    """The gRPC address of host and port: "host:port", with brackets around an IPv6 host."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


class GrpcServer:
    """The gRPC API of a `ServerCore` on `options.host:options.port` (0: a free port, see `.port`).

    Args:
        core: `core.ServerCore`.
        options: `ServerOptions` (host, port, grpc_max_threads, max_message_bytes).
    """

    def __init__(self, core, options):
        size = options.max_message_bytes
        self._server = grpc.server(
            concurrent.futures.ThreadPoolExecutor(max_workers=options.grpc_max_threads, thread_name_prefix="grpc"),
            options=[
                ("grpc.max_send_message_length", size),
                ("grpc.max_receive_message_length", size),
                ("grpc.so_reuseport", 0),
            ],
            maximum_concurrent_rpcs=4 * options.grpc_max_threads,
        )
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(_PredictionServicer(core), self._server)
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(_ModelServicer(core), self._server)
        address = listen_address(options.host, options.port)
        try:
            self.port = self._server.add_insecure_port(address)
        except RuntimeError as e:
            raise OSError(f"cannot listen on {address} for gRPC: {e}") from None
        if not self.port:
            raise OSError(f"cannot listen on {address} for gRPC (port in use?)")
        logger.info("gRPC API on %s (max message %d bytes)", listen_address(options.host, self.port), size)

    def start(self):
        self._server.start()

    def stop(self, grace=5.0):
        """Stops accepting calls; returns an event set when running calls have ended (at most `grace` seconds)."""
        return self._server.stop(grace)
