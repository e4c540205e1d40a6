"""Tagging new text with a trained NER head (a train_ner.py / tune_ner.py output directory): the directory (its
files, the feature source training recorded in it), the text read and the results written. The tagging itself is
`elmo_tf.ner.pipeline.NERPipeline.tag`.

Text is one sentence per line, split into tokens on ASCII whitespace (`elmo_tf.preprocessing.tokenizer.split_tokens`,
the same rule as the exports' in-graph `whitespace` tokenizer).
"""

import json
import os

import keras

from elmo_tf.errors import ElmoTFError, one_line
from elmo_tf.ner.data import Encoder
from elmo_tf.ner.model import NERTagger
from elmo_tf.ner.pipeline import NERPipeline
from elmo_tf.ner.tags import spans
from elmo_tf.preprocessing.tokenizer import split_tokens

MODEL_FILES = ("model.keras", "encoder.json")


class TextError(ElmoTFError):
    """Input text that cannot be tagged; the message names the line."""


class RecordedSourceError(ElmoTFError):
    """No feature source given, and none that config.json records can be used; the message says why."""


def read_lines(stream, name="<stdin>"):
    """Token lists of a binary stream, one sentence per line (an empty line: an empty sentence).

    Raises:
        TextError: a line that is not UTF-8, naming `name`, the line and the byte offset.
    """
    sentences = []
    for number, raw in enumerate(stream, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TextError(
                f"{name}:{number}: not UTF-8 (byte {e.start} of the line: {raw[e.start : e.start + 1]!r})"
            ) from None
        if number == 1 and line.startswith("\ufeff"):
            line = line[1:]  # a UTF-8 byte-order mark
        sentences.append(split_tokens(line))
    return sentences


def check_model_dir(model_dir):
    """Raises ValueError naming the first of `MODEL_FILES` missing from `model_dir` (before anything is loaded)."""
    for name in MODEL_FILES:
        if not os.path.isfile(os.path.join(model_dir, name)):
            raise ValueError(f"no {name} in {model_dir!r} (expected a train_ner.py output directory)")


def load_tagger(model_dir):
    """(NERTagger with its trained weights, Encoder, activation dim or None) from a train_ner.py directory.

    Raises:
        ValueError: a file is missing or cannot be read, or model.keras holds another model; the message names the
            directory and the file.
    """
    check_model_dir(model_dir)
    path = os.path.join(model_dir, "model.keras")
    try:  # NERTagger and its CRF are registered with Keras by their modules (imported above)
        model = keras.saving.load_model(path, compile=False)
    except Exception as e:  # a corrupt or foreign .keras file: say which, in one line
        raise ValueError(f"cannot load {path!r}: {one_line(e)}") from None
    if not isinstance(model, NERTagger):
        raise ValueError(f"{path!r} holds a {type(model).__name__}, not an NERTagger (a train_ner.py model)")
    encoder = Encoder.load(os.path.join(model_dir, "encoder.json"))
    return model, encoder, model.get_build_config()["activation_dim"]


def recorded_source(model_dir):
    """The feature source training recorded in `model_dir`/config.json (`elmo_source`), or {}."""
    path = os.path.join(model_dir, "config.json")
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f).get("elmo_source") or {}
    except (ValueError, AttributeError) as e:
        raise ValueError(f"{path}: not a config.json written by train_ner.py ({e})") from None


def source_arguments(model_dir, recorded, elmo=None, elmo_server=None, model_name=None, max_request_tokens=None):
    """The `elmo_tf.ner.features.open_feature_source` arguments for tagging with the head in `model_dir`: `elmo` (a
    biLM's directory or weights) or `elmo_server` (HOST:PORT) when given, else the source training used, as
    `recorded` (`recorded_source`) says. A served source's model name: `model_name`, else training's, else "elmo".

    Raises:
        RecordedSourceError: neither is given, and the record names no source, or a biLM whose files are gone.
    """
    model_name = model_name or recorded.get("model_name") or "elmo"
    if elmo_server or (not elmo and recorded.get("kind") == "server"):
        return dict(
            elmo_server=elmo_server or recorded["address"], model_name=model_name, max_request_tokens=max_request_tokens
        )
    if elmo:
        return dict(elmo=elmo)
    if recorded.get("kind") == "in_process":
        arguments = dict(options=recorded.get("options"), weights=recorded.get("weights"))
        for path in arguments.values():
            if not path or not os.path.isfile(path):
                raise RecordedSourceError(f"the biLM recorded in config.json is gone ({path!r})", path=path)
        return arguments
    raise RecordedSourceError(
        f"the model in {model_dir!r} needs ELMo features and its config.json does not say where training got them",
        path=model_dir,
    )


def tag_sentences(model, encoder, sentences, source=None, batch_size=32):
    """Tag strings (the encoder's source scheme) for each token list: `NERPipeline(model, encoder, source).tag`
    (`source` gives the ELMo features; None for a head without them)."""
    return NERPipeline(model, encoder, source).tag(sentences, batch_size)


def entity_spans(tokens, tags, scheme):
    return [
        {"type": kind, "start": start, "end": end, "text": " ".join(tokens[start:end])}
        for kind, start, end in spans(tags, scheme)
    ]


def format_conll(tokens, tags):
    return "".join(f"{token}\t{tag}\n" for token, tag in zip(tokens, tags)) + "\n"


def format_json(tokens, tags, scheme):
    return (
        json.dumps({"tokens": tokens, "tags": tags, "spans": entity_spans(tokens, tags, scheme)}, ensure_ascii=False)
        + "\n"
    )
