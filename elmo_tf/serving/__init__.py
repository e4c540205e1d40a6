"""Serving ELMo SavedModels over TF Serving's API: the clients and the embedded model server, composed as TF Serving's
is (a version source -> a manager -> a core -> stateless gRPC and REST fronts; the server holds a core).

    client.py        ElmoClient (gRPC, tensorflow_serving.apis) and ElmoRestClient
    server.py        ModelServer: holds a ServerCore and its gRPC and REST fronts, started and stopped together
    options.py       ServerOptions: the server's settings (the flags of serving/serve.py)
    grpc_front.py    TF Serving's gRPC API (PredictionService, ModelService) over the core
    rest_front.py    TF Serving's REST API over HTTP (aiohttp): body, in-flight and deadline limits
    rest_api.py      the REST routes (/v1/models/...), transport-free, over the core
    json_tensor.py   JSON request bodies -> tensors as TF Serving reads them (row and columnar formats, its errors)
    rest_json.py     tensors -> JSON: the response written within its limit
    core.py          ServerCore: models by name, predict / status / metadata, in-flight cap, deadlines
    manager.py       ModelManager: one model's versions, loaded, retried and retired
    source.py        FileSystemSource: a base path's version directories (int64 names) and fingerprints
    batching.py      the batch scheduler (merges concurrent requests, like --enable_batching)
    servable.py      one loaded version: its SignatureDefs and a SignatureRunner per signature
    inference.py     Classify, Regress and MultiInference checked as TF Serving checks them (Predict is what runs)
    merge.py         merged calls: requests concatenated into one model call and split back
    budget.py        the request budget: Limits, checks of TensorProtos and arrays before anything is built
    response_size.py the response's size estimated before the model runs (proto and JSON)
    signature.py     a SignatureDef's inputs, outputs and roles, and the checks of request names
    tokens.py        a sentence's tokens counted as the signature's own tokenizer makes them
    status.py        ServingError (gRPC code + message), the gRPC -> HTTP status mapping, path redaction
    config_files.py  TF Serving's model config and batching parameters files
    sizes.py         byte units (KiB, MiB) and a size as messages show it (imports nothing)

Imports run one way, from the top of this list down (the clients stand apart: status and the serving contract).
Names are imported lazily, so `import elmo_tf.serving` loads neither gRPC nor the server.
"""

from elmo_tf._lazy import lazy_namespace

__all__, __getattr__, __dir__ = lazy_namespace(
    __name__,
    {
        "elmo_tf.serving.client": ("ElmoClient", "ElmoRestClient", "Embeddings"),
        "elmo_tf.serving.status": ("ServingError",),
        "elmo_tf.serving.core": ("ServerCore",),
        "elmo_tf.serving.server": ("ModelServer",),
        "elmo_tf.serving.options": ("ServerOptions",),
        "elmo_tf.serving.batching": ("BatchingOptions",),
        "elmo_tf.serving.budget": ("Limits",),
    },
)
