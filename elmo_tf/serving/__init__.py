"""Serving ELMo SavedModels over TF Serving's API: the clients and the embedded model server, composed as TF Serving's
is (a version source -> a manager -> a core -> stateless gRPC and REST fronts; the server holds a core).

    rest_client.py      ElmoRestClient: ElmoClient's methods over TF Serving's REST API
    client.py           ElmoClient (gRPC, tensorflow_serving.apis), Embeddings and the request arrays
    server.py           ModelServer: holds a ServerCore and its gRPC and REST fronts, started and stopped together
    grpc/               TF Serving's gRPC API (PredictionService, ModelService) over the core
        grpc_front.py   the gRPC server and its services
        call_places.py  the places of its open calls: waiting and working calls, per connection and per address
        grpc_parse.py   request messages parsed within their size limits, off the event loop
        tls.py          SslConfig: the gRPC server's certificate, key and client CAs
    rest/               TF Serving's REST API over HTTP (aiohttp)
        rest_front.py   the HTTP server: body, in-flight and deadline limits
        rest_api.py     the REST routes (/v1/models/...), transport-free, over the core
        json_examples.py Classify and Regress bodies checked as TF Serving checks them
        json_tensor.py  JSON request bodies -> tensors as TF Serving reads them (row and columnar formats, its errors)
        rest_json.py    tensors -> JSON: the response written within its limit
    core.py             ServerCore: models by name, predict / status / metadata, version labels, config reloads
    admission.py        RequestAdmission: the core's in-flight cap, draining, deadlines and counters of refused requests
    options.py          ServerOptions: the server's settings (the flags of serving/serve.py)
    manager.py          ModelManager: one model's versions, loaded, retried and retired
    load_retries.py     LoadRetries: a model's failed loads and when each version may load again
    source.py           FileSystemSource: a base path's version directories (int64 names) and fingerprints
    servable.py         one loaded version: its SignatureDefs and a SignatureRunner per signature
    batching/           the batch scheduler and the merged calls it makes (like --enable_batching)
        scheduler.py    BatchScheduler: merges concurrent requests
        merge.py        merged calls: requests concatenated into one model call and split back
        packed.py       the packed signature's calls: many requests' sentences packed into rows
    inference_checks.py Classify, Regress and MultiInference checked as TF Serving checks them (Predict is what runs)
    limits/             the request budget, checked before anything is built or run
        budget.py       Limits, checks of TensorProtos and arrays
        response_size.py the response's size estimated before the model runs (proto and JSON)
        token_count.py  a sentence's tokens counted as the signature's own tokenizer makes them
        byte_units.py   byte units (KiB, MiB) and a size as messages show it (imports nothing)
    signature.py        a SignatureDef's inputs, outputs and roles, and the checks of request names
    serving_error.py    ServingError (gRPC code + message), the gRPC -> HTTP status mapping, path redaction
    config_files.py     TF Serving's model config and batching parameters files
    metrics.py          the Prometheus metrics (--monitoring_config_file)

Imports run one way, from the top of this list down (grpc/tls.py, which imports nothing, is also read by options and
config_files; the clients stand apart: serving_error and the serving contract).
Names are imported lazily, so `import elmo_tf.serving` loads neither gRPC nor the server.
"""

from elmo_tf._lazy import lazy_namespace

__all__, __getattr__, __dir__ = lazy_namespace(
    __name__,
    {
        "elmo_tf.serving.client": ("ElmoClient", "Embeddings"),
        "elmo_tf.serving.rest_client": ("ElmoRestClient",),
        "elmo_tf.serving.serving_error": ("ServingError",),
        "elmo_tf.serving.core": ("ServerCore",),
        "elmo_tf.serving.server": ("ModelServer",),
        "elmo_tf.serving.options": ("ServerOptions",),
        "elmo_tf.serving.batching.scheduler": ("BatchingOptions",),
        "elmo_tf.serving.limits.budget": ("Limits",),
    },
)
