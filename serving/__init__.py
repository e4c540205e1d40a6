"""Serving ELMo SavedModels over TF Serving's API: clients, the embedded model server, and its launcher.

    client.py      ElmoClient (gRPC, tensorflow_serving.apis) and ElmoRestClient
    registry.py    ModelRegistry: models, their versions on disk (polled, loaded, retried, retired), the requests
                   of both fronts (in-flight cap, deadlines); ServerOptions
    grpc_front.py  TF Serving's gRPC API (PredictionService, ModelService) over the registry
    rest.py        TF Serving's REST API (/v1/models/...) over the registry
    server.py      ModelServer: the registry with its gRPC and REST fronts, started and stopped together
    servable.py    one loaded version: SignatureDefs, request checks and limits, model calls, merged calls
    batching.py    the batch scheduler (merges concurrent requests, like --enable_batching)
    status.py      ServingError (gRPC code + message) and the gRPC -> HTTP status mapping
    serve.py       the CLI: runs tensorflow_model_server when installed, else the embedded server

Names are imported lazily, so `serve.py` can hand over to the stock server without loading TensorFlow.
"""

_EXPORTS = {
    "ElmoClient": "serving.client",
    "ElmoRestClient": "serving.client",
    "Embeddings": "serving.client",
    "ServingError": "serving.status",
    "ModelRegistry": "serving.registry",
    "ModelServer": "serving.server",
    "ServerOptions": "serving.registry",
    "BatchingOptions": "serving.batching",
    "Limits": "serving.servable",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'serving' has no attribute {name!r}")
