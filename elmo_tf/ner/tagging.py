"""Tagging new text with a trained NER head (a train_ner.py / tune_ner.py output directory).

Text is one sentence per line, split into tokens on ASCII whitespace (`elmo_tf.preprocessing.tokenizer.split_tokens`,
the same rule as the exports' in-graph `whitespace` tokenizer).
"""

import json
import os

from elmo_tf.errors import ElmoTFError, one_line
from elmo_tf.ner.data import Encoder
from elmo_tf.ner.tags import spans
from elmo_tf.preprocessing.tokenizer import split_tokens

MODEL_FILES = ("model.keras", "encoder.json")


class TextError(ElmoTFError):
    """Input text that cannot be tagged; the message names the line."""


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
        ValueError: a file is missing or cannot be read; the message names the directory and the file.
    """
    import keras

    import elmo_tf.ner.model  # noqa: F401  (registers NERTagger, CRF for deserialization)

    check_model_dir(model_dir)
    try:
        model = keras.saving.load_model(os.path.join(model_dir, "model.keras"), compile=False)
    except Exception as e:  # a corrupt or foreign .keras file: say which, in one line
        raise ValueError(f"cannot load {os.path.join(model_dir, 'model.keras')!r}: {one_line(e)}") from None
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


def tag_sentences(model, encoder, sentences, source=None, batch_size=32):
    """Tag strings (the encoder's source scheme) for each token list; `source` gives the ELMo features."""
    from elmo_tf.io.conll import Sentence
    from elmo_tf.ner.training import NERBatches, predict_tags

    items = [Sentence(list(tokens), ["O"] * len(tokens), 0) for tokens in sentences]
    features = source([s.tokens for s in items]) if model.num_elmo_layers else None
    batches = NERBatches(
        items, encoder, encoder.featurizer_for(model), features, batch_size=batch_size, shuffle=False, with_tags=False
    )
    return predict_tags(model, batches)


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
