"""`ServingError`: a gRPC status code and message, shared by the clients and the embedded server; and
`redact_paths`, which keeps the server's filesystem paths out of what clients are told.

The REST API answers each gRPC code with the HTTP status TF Serving's REST handler uses
(`tensorflow_serving/model_servers/http_server.cc`, `ToHTTPStatusCode`): INVALID_ARGUMENT and
FAILED_PRECONDITION 400, NOT_FOUND 404, RESOURCE_EXHAUSTED 429, UNIMPLEMENTED 501, UNAVAILABLE 503,
DEADLINE_EXCEEDED 504, INTERNAL/UNKNOWN 500.
"""

import re

import grpc

from elmo_tf.errors import ElmoTFError

SIGNATURE_DEF_FIELD = "signature_def"  # GetModelMetadata's metadata key holding the SignatureDefMap

HTTP_STATUS = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}

# the reverse, for REST clients: the most likely gRPC code of an HTTP status
GRPC_CODE_OF_HTTP = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.ABORTED,
    411: grpc.StatusCode.INVALID_ARGUMENT,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    500: grpc.StatusCode.INTERNAL,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}

_ABSOLUTE_PATH = re.compile(r"(?<![\w>)\]])(?:[A-Za-z]:)?[/\\][^\s'\"]*")

# TensorFlow's error codes (tf.errors.*.error_code, tensorflow.error.Code) are the gRPC codes' numbers
_CODE_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


def status_code(number):
    """The `grpc.StatusCode` of a numeric code (TensorFlow's `error_code` or a proto `tensorflow.error.Code`)."""
    return _CODE_BY_NUMBER.get(int(number), grpc.StatusCode.UNKNOWN)


class ServingError(ElmoTFError):
    """A failed request: a `grpc.StatusCode` and the server's message.

    Attributes:
        code: `grpc.StatusCode`, e.g. `grpc.StatusCode.INVALID_ARGUMENT`.
        details: the message (TF Serving's wording where it has one).
        http_status: the HTTP status for REST (given by a REST server, else derived from `code`).
    """

    def __init__(self, code, details, http_status=None):
        if not isinstance(code, grpc.StatusCode):
            raise TypeError(f"code must be a grpc.StatusCode, got {code!r}")
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
        self.http_status = http_status if http_status is not None else HTTP_STATUS.get(code, 500)

    def __reduce__(self):  # picklable (multiprocessing, pytest-xdist)
        return type(self), (self.code, self.details, self.http_status)


def invalid_argument(message):
    return ServingError(grpc.StatusCode.INVALID_ARGUMENT, message)


def failed_precondition(message):
    return ServingError(grpc.StatusCode.FAILED_PRECONDITION, message)


def not_found(message):
    return ServingError(grpc.StatusCode.NOT_FOUND, message)


def resource_exhausted(message):
    return ServingError(grpc.StatusCode.RESOURCE_EXHAUSTED, message)


def redact_paths(message, known=()):
    """`message` without filesystem paths: each of `known` (`{path: replacement}` items) is replaced, then any other
    absolute path becomes "<path>"."""
    for path, replacement in known:
        message = message.replace(path, replacement)
    return _ABSOLUTE_PATH.sub("<path>", message)
