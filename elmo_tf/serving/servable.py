"""One loaded version of a SavedModel: its SignatureDefs and, per callable signature, a `SignatureRunner` that holds
the signature's roles (`elmo_tf.serving.signature`), its request budget (`elmo_tf.serving.limits.budget`), its response
size model (`elmo_tf.serving.limits.response_size`) and its function. Merged calls of several requests are
`elmo_tf.serving.batching.merge`'s.

Loading reads the SignatureDefs from `saved_model.pb` (or `.pbtxt`), loads the SavedModel with
`tf.saved_model.load`, and warms it up: the requests of its warmup file (`assets.extra/tf_serving_warmup_requests`, as
TF Serving replays it: `elmo_tf.saved_model.warmup`), then a small synthetic request to each signature the file did not
reach (every signature of an export without the file). A missing op, a broken graph or a bad warmup file fails the
load, not the first request, and the warm-up outputs tell the response size model the dims the SignatureDef leaves
unknown. With warm-up off (`warmup=False`, stock's --enable_model_warmup=false: saved_model_bundle_source_adapter.cc
`SavedModelBundleSourceAdapter::GetServableCreator` runs RunSavedModelWarmup only when it is on) nothing runs at load: a
bad warmup file is not read, and each signature's first call teaches the response size model instead (until then its
estimate counts the SignatureDef's dims, unknown ones as 1; the size check after the call, `budget.check_response_size`,
still bounds the response).
"""

import logging
import os

import grpc
import numpy as np
import tensorflow as tf
from google.protobuf import text_format
from tensorflow.core.protobuf import saved_model_pb2

from elmo_tf.saved_model.metadata import MetadataError, read_export_metadata
from elmo_tf.saved_model.warmup import iter_warmup_requests, predict_request, warmup_path
from elmo_tf.serving.batching.packed import attach_packed
from elmo_tf.serving.limits.budget import Limits, RequestBudget, read_tensor_proto, softmax_position_cost
from elmo_tf.serving.limits.response_size import ResponseSizes
from elmo_tf.serving.limits.token_count import signature_op_types, token_counter
from elmo_tf.serving.serving_error import ServingError, failed_precondition, resource_exhausted, status_code
from elmo_tf.serving.signature import Signature

logger = logging.getLogger(__name__)

SERVING_TAG = "serve"
DEFAULT_SIGNATURE = "serving_default"
WARMUP_TOKEN = b"warmup"


def signature_key_not_found(name):
    """gRPC Predict's answer to an unknown signature (TF Serving's predict_util.cc `RunPredict`)."""
    return failed_precondition(f'Serving signature key "{name}" not found.')


def _clean_tf_message(message):
    # drop the op trace TF appends ("\n\t [[{{node ...}}]]")
    return message.split("\n\t [[")[0].split("\n\n")[0].strip()


class SignatureRunner:
    """One callable signature: its roles, request budget and response sizes, and its function.

    Args:
        name: signature key, e.g. "default".
        function: the loaded concrete function (`loaded.signatures[name]`).
        signature_def: its `SignatureDef` proto (input/output aliases, dtypes, shapes).
        limits: `budget.Limits`.
        counter: how the signature's tokenizer counts a sentence's tokens (`elmo_tf.serving.limits.token_count`;
            whitespace runs when None).
    Attributes:
        signature: `signature.Signature` (inputs, outputs, roles).
        sizes: `response_size.ResponseSizes` (learns the outputs' dims at warm-up, or from the first call without).
        budget: `budget.RequestBudget`: checks requests (`budget.prepare(...)` -> `budget.Request`).
    """

    def __init__(self, name, function, signature_def, limits, counter=None):
        self.name = name
        self.function = function
        self.signature = Signature(name, signature_def)
        self.sizes = ResponseSizes(self.signature)
        cost = softmax_position_cost(getattr(function, "variables", ()))
        self.budget = RequestBudget(self.signature, limits, self.sizes, counter, position_cost=cost)
        self.packed = None  # the runner of the export's `packed` signature, when it answers this one's merged calls
        self.max_tokens = None  # for the `packed` signature: the export's max_tokens once read (0: none; `packed`)

    def run(self, inputs):
        """One call of the signature function on NumPy `inputs`; returns alias -> NumPy array. The first call (the
        warm-up's, or the first request's without one) teaches `sizes` the outputs' dims.

        Raises:
            ServingError: the function failed (TensorFlow's error code and first message line).
        """
        specs = self.signature.inputs
        tensors = {alias: tf.constant(value, dtype=specs[alias].tf_dtype) for alias, value in inputs.items()}
        try:
            outputs = self.function(**tensors)
        except tf.errors.OpError as e:
            raise ServingError(status_code(e.error_code), _clean_tf_message(e.message)) from None
        outputs = {alias: value.numpy() for alias, value in outputs.items()}
        if not self.sizes.inner_dims:  # no warm-up taught them (--enable_model_warmup=false): the first call does
            self.sizes.learn_inner_dims(outputs)
        return outputs

    def run_one(self, request):
        """Runs one `budget.Request`; returns its outputs (alias -> array, all outputs) or the `ServingError` it
        failed with (never raises: one request must not take the server down)."""
        try:
            return self.run(request.inputs)
        except ServingError as e:
            return e
        except MemoryError:
            return resource_exhausted("out of memory while running the model: send fewer or shorter sentences")
        except Exception as e:  # never let one request take the server down
            logger.exception("signature %s failed", self.name)
            return ServingError(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")

    def warmup_inputs(self):
        """One small valid-looking request: strings "warmup", numbers 1, dynamic dims 1."""
        inputs = {}
        for alias, spec in self.signature.inputs.items():
            shape = tuple(1 if d is None else d for d in (spec.shape if spec.shape is not None else (1,)))
            if spec.is_string:
                inputs[alias] = np.full(shape, WARMUP_TOKEN, dtype=object)
            else:
                inputs[alias] = np.ones(shape, spec.tf_dtype.as_numpy_dtype)
        return inputs


# ---------------------------------------------------------------------------------------------------- loading


def read_signature_defs(export_dir, tag=SERVING_TAG):
    """The SignatureDefs (name -> proto) of the MetaGraph tagged `tag` in a SavedModel directory."""
    return dict(read_meta_graph(export_dir, tag).signature_def)


def read_meta_graph(export_dir, tag=SERVING_TAG):
    """The MetaGraphDef tagged `tag` in a SavedModel directory (`saved_model.pb` or `.pbtxt`)."""
    saved_model = saved_model_pb2.SavedModel()
    pb = os.path.join(export_dir, "saved_model.pb")
    pbtxt = os.path.join(export_dir, "saved_model.pbtxt")
    if os.path.isfile(pb):
        with open(pb, "rb") as f:
            saved_model.ParseFromString(f.read())
    elif os.path.isfile(pbtxt):
        with open(pbtxt, encoding="utf-8") as f:
            text_format.Parse(f.read(), saved_model)
    else:
        raise FileNotFoundError(f"{export_dir} holds no saved_model.pb or saved_model.pbtxt")
    for meta_graph in saved_model.meta_graphs:
        if tag in meta_graph.meta_info_def.tags:
            return meta_graph
    raise ValueError(
        f"{export_dir}: no MetaGraph tagged {tag!r} (found "
        f"{[list(m.meta_info_def.tags) for m in saved_model.meta_graphs]})"
    )


def _load_op_libraries():
    # a `--tokenizer unicode_script` export needs tensorflow-text's ops registered before loading
    try:
        import tensorflow_text  # noqa: F401
    except ImportError:
        logger.debug("tensorflow-text not installed: exports using its ops will not load")


class Servable:
    """A loaded version of a model: `runners` by signature name, and the SignatureDefs for GetModelMetadata.

    Attributes:
        model_name, version, path: what was loaded from where.
        signature_defs: every SignatureDef of the MetaGraph (`__saved_model_init_op` included, as TF Serving
            reports them).
        runners: `SignatureRunner` by name, for the signatures that can be called.
        scheduler: the `scheduler.BatchScheduler` feeding this version (set by its manager when batching is on).
        precision: what an export of elmo_tf computes in, as its metadata records it ("float32", "bfloat16";
            `elmo_tf.saved_model.metadata`), or None (another export, or one written before exports recorded it).
    """

    def __init__(self, model_name, version, path, loaded, signature_defs, runners):
        self.model_name = model_name
        self.version = version
        self.path = path
        self.loaded = loaded
        self.signature_defs = signature_defs
        self.runners = runners
        self.scheduler = None
        self.precision = export_precision(path)

    def runner(self, signature_name, not_found=None):
        """The runner of `signature_name` ("" means serving_default).

        Args:
            not_found: callable `name -> ServingError` raised when there is none; by default gRPC Predict's
                FAILED_PRECONDITION `Serving signature key "x" not found.` (TF Serving's predict_util.cc `RunPredict`).
        """
        name = signature_name or DEFAULT_SIGNATURE
        runner = self.runners.get(name)
        if runner is None:
            raise (not_found or signature_key_not_found)(name)
        return runner

    def warm_up(self):
        """Replays the export's warmup file (`assets.extra/tf_serving_warmup_requests`) as TF Serving does at load,
        then runs each signature the file did not reach once with `warmup_inputs` (all of them for an export without
        the file): a missing op, a broken graph or a bad warmup file fails the load, not the first request, and the
        outputs teach the response size model the dims the SignatureDef leaves unknown.

        Raises:
            WarmupError: a file TF Serving refuses (`elmo_tf.saved_model.warmup`).
            ServingError: a request of the file that fails (unknown signature, bad inputs, the model failed).
        """
        reached = set()
        path = warmup_path(self.path)
        if os.path.exists(path):
            for log in iter_warmup_requests(path):
                request = predict_request(log, path)
                if request is not None:
                    reached.add(self._replay(request))
            reached.discard(None)  # requests above the server's limits: their signatures get the synthetic warm-up
            logger.info("%s version %d: replayed its warmup file (%s)", self.model_name, self.version, sorted(reached))
        for name, runner in sorted(self.runners.items()):
            if name not in reached:
                runner.run(runner.warmup_inputs())  # its first call teaches `runner.sizes` the outputs' dims
                logger.debug("warmed up %s version %d signature %s", self.model_name, self.version, name)

    def _replay(self, request):
        """Runs one `PredictRequest` of the warmup file as Predict would, under the server's request limits; returns
        the signature's name, or None for a request those limits refuse (logged, not run: a record of a few bytes
        can declare a shape TensorFlow fills to any size, and the process loading it serves the current version)."""
        runner = self.runner(request.model_spec.signature_name)
        budget = runner.budget  # the server's limits, the signature's tokenizer and softmax cost
        runner.signature.check_input_names(request.inputs.keys())
        try:
            for alias, proto in request.inputs.items():
                budget.check_tensor_proto(alias, proto)
            inputs = {alias: read_tensor_proto(proto) for alias, proto in request.inputs.items()}
            checked = budget.prepare(inputs, tuple(request.output_filter))
        except ServingError as e:
            if e.code != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            logger.warning(
                "%s version %d: a warmup request to %s is above the server's limits, not run: %s",
                self.model_name,
                self.version,
                runner.name,
                e.details,
            )
            return None
        runner.run(checked.inputs)
        return runner.name


def export_precision(path):
    """The precision the export at `path` records (`elmo_tf.saved_model.metadata`), or None; a metadata file that
    cannot be read is logged, never a failed load (TF Serving ignores the file)."""
    try:
        return read_export_metadata(path).get("precision")
    except MetadataError as e:
        logger.warning("%s", e)
        return None


def load_servable(model_name, version, path, limits=None, warmup=True):
    """Loads `path` (a SavedModel version directory) with `tf.saved_model.load`, and warms up every signature unless
    `warmup` is False (`ServerOptions.enable_model_warmup`: then no signature runs at load).

    Raises:
        Exception: whatever loading or warming up raised (the caller logs it and keeps the previous version).
    """
    _load_op_libraries()
    limits = limits or Limits()
    meta_graph = read_meta_graph(path)
    signature_defs = dict(meta_graph.signature_def)
    loaded = tf.saved_model.load(path, tags=[SERVING_TAG])
    runners = {
        name: SignatureRunner(
            name,
            function,
            signature_defs[name],
            limits,
            token_counter(signature_op_types(meta_graph, signature_defs[name])),
        )
        for name, function in loaded.signatures.items()
        if name in signature_defs
    }
    if not runners:
        raise ValueError(f"{path}: the SavedModel has no callable signatures")
    servable = Servable(model_name, version, path, loaded, signature_defs, runners)
    if servable.precision:
        logger.info("%s version %d computes in %s (its export's precision)", model_name, version, servable.precision)
    if warmup:
        servable.warm_up()
    else:
        logger.info("%s version %d: model warm-up is off (--enable_model_warmup=false)", model_name, version)
    packed = attach_packed(runners, probe=warmup)
    if packed:
        logger.info("%s version %d: merged calls of %s run packed", model_name, version, packed)
    return servable
