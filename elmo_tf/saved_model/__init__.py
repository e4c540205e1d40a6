"""The SavedModel: the one artifact the exporters write and the model server loads.

    versions   `<base>/<version>/` as TF Serving's file-system source reads it; atomic, never-overwriting publication
    contract   the signatures, their input and output keys, and the functions that build each one
    warmup     TF Serving's warmup file (`assets.extra/tf_serving_warmup_requests`), written and replayed
    export     `export_elmo`: an `ELMo` with the contract's signatures and its warmup file, checked after reloading

The ELMo exporter (`export`) and the NER tagger's (`elmo_tf.ner.export`) publish through `versions`; the server
(`elmo_tf.serving`) reads versions, the contract and the warmup file from here.
"""

from elmo_tf import _lazy

__all__, __getattr__, __dir__ = _lazy.lazy_namespace(
    __name__,
    {
        "elmo_tf.saved_model.versions": (
            "ExportError",
            "existing_versions",
            "next_version",
            "parse_version",
            "publish_version",
        ),
        "elmo_tf.saved_model.contract": (
            "SIGNATURES",
            "activations_from_outputs",
            "build_elmo_archive",
            "layer_keys",
            "output_keys",
        ),
        "elmo_tf.saved_model.warmup": (
            "WarmupError",
            "iter_warmup_requests",
            "run_warmup_requests",
            "warmup_path",
            "write_warmup_requests",
        ),
        "elmo_tf.saved_model.export": ("check_export", "check_lm_export", "export_elmo"),
    },
)
