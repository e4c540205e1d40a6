"""elmo_tf/serving/inference_checks.py: Classify, Regress and MultiInference checked as stock TF Serving checks them, on
SignatureDefs made here (no model): classifier.cc GetClassificationSignatureDef and
PreProcessClassification, regressor.cc GetRegressionSignatureDef and PreProcessRegression, multi_inference.cc
TensorFlowMultiInferenceRunner::Infer."""

import grpc
import pytest
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow_serving.apis import inference_pb2

from elmo_tf.serving.inference_checks import check_inference, check_multi_inference
from elmo_tf.serving.serving_error import ServingError

INVALID = grpc.StatusCode.INVALID_ARGUMENT
UNIMPLEMENTED = grpc.StatusCode.UNIMPLEMENTED


def signature(inputs, outputs):
    sig = meta_graph_pb2.SignatureDef()
    for name in inputs:
        sig.inputs[name].name = f"{name}:0"
    for name in outputs:
        sig.outputs[name].name = f"{name}:0"
    return sig


SIGNATURES = {
    "classify": signature(["inputs"], ["classes", "scores"]),
    "regress": signature(["inputs"], ["outputs"]),
    "no_inputs_key": signature(["x"], ["scores"]),
    "no_classes": signature(["inputs"], ["probabilities"]),
    "predict": signature(["tokens", "sequence_len"], ["elmo", "mask", "default"]),
}


def answer(call):
    with pytest.raises(ServingError) as info:
        call()
    return info.value.code, info.value.details


def test_classify_and_regress_checks():
    assert answer(lambda: check_inference(SIGNATURES, "classify", "nope")) == (
        INVALID,
        "No signature was found with the name: nope",
    )
    assert answer(lambda: check_inference(SIGNATURES, "classify", "predict")) == (INVALID, "Expected one input Tensor.")
    code, details = answer(lambda: check_inference(SIGNATURES, "classify", "no_inputs_key"))
    assert code == INVALID and details.startswith("No classification inputs found in SignatureDef: ")
    code, details = answer(lambda: check_inference(SIGNATURES, "classify", "no_classes"))
    assert details.startswith('Expected classification signature outputs to contain at least one of "classes" or')
    code, details = answer(lambda: check_inference(SIGNATURES, "regress", "classify"))
    assert (code, details) == (INVALID, "Expected one output Tensor.")
    code, details = answer(lambda: check_inference(SIGNATURES, "regress", "no_classes"))
    assert details.startswith("No regression outputs found in SignatureDef: ")
    # a signature stock would run: the embedded server runs Predict only
    for method, name in (("classify", "classify"), ("regress", "regress")):
        code, details = answer(lambda method=method, name=name: check_inference(SIGNATURES, method, name))
        assert code == UNIMPLEMENTED and "runs Predict only" in details


def test_multi_inference_checks():
    def tasks(*specs):
        request = inference_pb2.MultiInferenceRequest()
        for model, name, method in specs:
            task = request.tasks.add(method_name=method)
            task.model_spec.name, task.model_spec.signature_name = model, name
        return request.tasks

    classify, regress = "tensorflow/serving/classify", "tensorflow/serving/regress"
    cases = [
        (tasks(("m", "classify", classify), ("", "regress", regress)), "Found ModelSpec with an empty model name."),
        (
            tasks(("m", "classify", classify), ("other", "regress", regress)),
            "All ModelSpecs in a MultiInferenceRequest must access the same model name.",
        ),
        (tasks(("m", "classify", classify), ("m", "classify", regress)), "Duplicate evaluation of signature: classify"),
        (
            tasks(("m", "classify", classify), ("m", "nope", regress)),
            "Requested signature not found in model graph: nope",
        ),
    ]
    for request_tasks, details in cases:
        assert answer(lambda request_tasks=request_tasks: check_multi_inference(SIGNATURES, request_tasks)) == (
            INVALID,
            details,
        )
    code, details = answer(lambda: check_multi_inference(SIGNATURES, tasks(("m", "classify", "x"))))
    assert (code, details) == (UNIMPLEMENTED, "Unsupported signature method_name: x")
    code, _ = answer(
        lambda: check_multi_inference(SIGNATURES, tasks(("m", "classify", classify), ("m", "regress", regress)))
    )
    assert code == UNIMPLEMENTED
