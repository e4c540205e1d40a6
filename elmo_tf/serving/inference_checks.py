"""Classify, Regress and MultiInference as stock TF Serving answers them for the signatures of a served version.

The embedded server runs Predict only. A Classify or Regress request is still checked as TF Serving checks it, so a
client sees the same status: the signature is looked up, then its inputs and outputs are checked against what a
classification or regression signature has (`tensorflow_serving/servables/tensorflow/classifier.cc`,
`GetClassificationSignatureDef` and `PreProcessClassification`; `regressor.cc`, `PreProcessRegression`; without
--enable_signature_method_name_check, stock's default). ELMo's signatures fail those checks, as on stock
(INVALID_ARGUMENT "Expected one input Tensor." / "Expected one or two output Tensors, found 7" / "Expected one output
Tensor."). A signature that passes them is answered UNIMPLEMENTED: running tf.Example inputs is not built here.

MultiInference follows `multi_inference.cc` (`TensorFlowMultiInferenceRunner::Infer`): every task names the same
model, no signature twice, each found and of a supported method.
"""

import grpc

from elmo_tf.serving.serving_error import ServingError, invalid_argument

CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"
CLASSIFY_INPUTS = "inputs"
CLASSIFY_CLASSES = "classes"
CLASSIFY_SCORES = "scores"
REGRESS_INPUTS = "inputs"
REGRESS_OUTPUTS = "outputs"
DEFAULT_SIGNATURE = "serving_default"


def _debug_string(signature_def):
    return str(signature_def).strip()


def check_classification_signature(signature_def):
    """`PreProcessClassification` (classifier.cc): INVALID_ARGUMENT unless a classification signature."""
    if len(signature_def.inputs) != 1:
        raise invalid_argument("Expected one input Tensor.")
    if len(signature_def.outputs) not in (1, 2):
        raise invalid_argument(f"Expected one or two output Tensors, found {len(signature_def.outputs)}")
    if CLASSIFY_INPUTS not in signature_def.inputs:
        raise invalid_argument(f"No classification inputs found in SignatureDef: {_debug_string(signature_def)}")
    if CLASSIFY_CLASSES not in signature_def.outputs and CLASSIFY_SCORES not in signature_def.outputs:
        raise invalid_argument(
            f'Expected classification signature outputs to contain at least one of "{CLASSIFY_CLASSES}" or '
            f'"{CLASSIFY_SCORES}". Signature was: {_debug_string(signature_def)}'
        )


def check_regression_signature(signature_def):
    """`PreProcessRegression` (regressor.cc): INVALID_ARGUMENT unless a regression signature."""
    if len(signature_def.inputs) != 1:
        raise invalid_argument("Expected one input Tensor.")
    if len(signature_def.outputs) != 1:
        raise invalid_argument("Expected one output Tensor.")
    if REGRESS_INPUTS not in signature_def.inputs:
        raise invalid_argument(f"No regression inputs found in SignatureDef: {_debug_string(signature_def)}")
    if REGRESS_OUTPUTS not in signature_def.outputs:
        raise invalid_argument(f"No regression outputs found in SignatureDef: {_debug_string(signature_def)}")


CHECKS = {"classify": check_classification_signature, "regress": check_regression_signature}
METHODS = {CLASSIFY_METHOD: "classify", REGRESS_METHOD: "regress"}


def _not_run(method, signature_name):
    return ServingError(
        grpc.StatusCode.UNIMPLEMENTED,
        f"{method} of signature {signature_name}: the embedded server runs Predict only (tf.Example inputs are not "
        f"supported); serve this model with tensorflow_model_server",
    )


def check_inference(signature_defs, method, signature_name):
    """Classify or Regress (`method`) of `signature_name` on a version with `signature_defs`, as stock checks it
    (`GetClassificationSignatureDef`, classifier.cc; `GetRegressionSignatureDef`, regressor.cc).

    Raises:
        ServingError: INVALID_ARGUMENT as stock answers; UNIMPLEMENTED when the signature would be run.
    """
    name = signature_name or DEFAULT_SIGNATURE
    signature_def = signature_defs.get(name)
    if signature_def is None:
        raise invalid_argument(f"No signature was found with the name: {name}")
    CHECKS[method](signature_def)
    raise _not_run(method.capitalize(), name)


def check_multi_inference(signature_defs, tasks):
    """The tasks of a MultiInferenceRequest (`TensorFlowMultiInferenceRunner::Infer`, multi_inference.cc).

    Raises:
        ServingError: INVALID_ARGUMENT or UNIMPLEMENTED as stock answers; UNIMPLEMENTED when they would be run.
    """
    model_name, seen = "", set()
    for task in tasks:
        if not task.model_spec.name:
            raise invalid_argument("Found ModelSpec with an empty model name.")
        if not model_name:
            model_name = task.model_spec.name
        elif model_name != task.model_spec.name:
            raise invalid_argument("All ModelSpecs in a MultiInferenceRequest must access the same model name.")
        name = task.model_spec.signature_name or DEFAULT_SIGNATURE
        if name in seen:
            raise invalid_argument(f"Duplicate evaluation of signature: {name}")
        seen.add(name)
        signature_def = signature_defs.get(name)
        if signature_def is None:
            raise invalid_argument(f"Requested signature not found in model graph: {name}")
        method = METHODS.get(task.method_name)
        if method is None:
            raise ServingError(grpc.StatusCode.UNIMPLEMENTED, f"Unsupported signature method_name: {task.method_name}")
        CHECKS[method](signature_def)
    raise _not_run("MultiInference", ",".join(sorted(seen)))
