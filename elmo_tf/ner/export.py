"""The NER tagger with its frozen ELMo as one SavedModel: sentences -> tags and entity spans.

Signature `tag` (also `serving_default`): input `sentences` tf.string `(batch,)`, tokenized in the graph like the
ELMo export. Outputs:
    `tokens` tf.string `(batch, T)` ("" padding), `sequence_len` int32 `(batch,)`,
    `tags` tf.string `(batch, T)`: the CRF's tags (in the tagger's CRF scheme, BIOES by default; "" padding),
    `num_spans` int32 `(batch,)`, `span_start` / `span_end` int32 `(batch, S)` (token offsets, end exclusive;
    -1 padding), `span_type` tf.string `(batch, S)` ("" padding).
    An empty (or all-whitespace) sentence gets `sequence_len` 0, no tags and no spans; a batch of empty sentences
    only has `T` = 0 (and `S` = 0), an empty batch `(0,)` batch 0 in every output, as in the ELMo export.
Signature `featurize`: the same input; outputs `tokens`, `sequence_len` and the head's own inputs as
`NERFeaturizer` computes them in training (`mask`, and as the tagger uses them `word_ids`, `char_ids`).
Both run the tagger as training and tagging assemble it (`elmo_tf.ner.pipeline.NERPipeline`): the featurizer
(vocabulary lookup, lowercasing, char ids) is the training code's own layer, tracked in the graph, and the biLM
(`InProcessFeatures.graph_activations`) runs inside the graph.
Versioned like the ELMo export (`<base>/<version>/`, never overwritten), with TF Serving's warmup file
(`assets.extra/tf_serving_warmup_requests`: the 8 sentences of `elmo_tf.saved_model.warmup.WARMUP_SENTENCES` to
`tag`, `serving_default` and `featurize`) and its metadata (`assets.extra/elmo_tf.json`,
`elmo_tf.saved_model.metadata`): the precision its biLM computes in (the ELMo model's, `ELMo(precision=...)`; float32
for a tagger without ELMo), the tokenizer, the cut.
"""

import keras
import numpy as np
import tensorflow as tf

from elmo_tf.ner.features import InProcessFeatures
from elmo_tf.ner.featurizer import MASK
from elmo_tf.ner.pipeline import NERPipeline
from elmo_tf.preprocessing.tokenizer import make_tokenizer
from elmo_tf.saved_model.contract import SENTENCES_SPEC, SEQUENCE_LEN, SERVING_DEFAULT, TOKENS
from elmo_tf.saved_model.metadata import export_metadata, write_export_metadata
from elmo_tf.saved_model.versions import publish_version
from elmo_tf.saved_model.warmup import run_warmup_requests, sentence_requests, write_warmup_requests

TAG_SIGNATURE = "tag"
FEATURIZE_SIGNATURE = "featurize"
CHECK_SENTENCES = ("EU rejects German call to boycott British lamb .", "", "Peter Blackburn")
EDGE_BATCHES = (("", "x"), ("", ""), ())  # a longest sentence of one token, of none; no sentence at all


def _label_parts(labels):
    prefixes = [label.split("-", 1)[0] if label != "O" else "O" for label in labels]
    kinds = [label.split("-", 1)[1] if label != "O" else "" for label in labels]
    return prefixes, kinds


def spans_from_tags(tag_ids, mask, labels):
    """Entity spans of valid IOB2/BIOES tag ids, in the graph: (num, start, end, type), padded -1 / ""."""
    prefixes, kinds = _label_parts(labels)
    prefix = tf.gather(tf.constant(prefixes), tag_ids)
    kind = tf.gather(tf.constant(kinds), tag_ids)
    inside = mask & tf.not_equal(prefix, "O")
    starts = mask & ((prefix == "B") | (prefix == "S"))
    next_prefix = tf.concat([prefix[:, 1:], tf.fill([tf.shape(prefix)[0], 1], "O")], axis=1)
    next_kind = tf.concat([kind[:, 1:], tf.fill([tf.shape(kind)[0], 1], "")], axis=1)
    next_mask = tf.concat([mask[:, 1:], tf.zeros_like(mask[:, :1])], axis=1)
    continues = (
        next_mask
        & ((next_prefix == "I") | (next_prefix == "E"))
        & (next_kind == kind)
        & (prefix != "E")
        & (prefix != "S")
    )
    ends = inside & ~continues
    positions = tf.broadcast_to(tf.range(tf.shape(tag_ids)[1])[None], tf.shape(tag_ids))
    start = tf.ragged.boolean_mask(positions, starts).to_tensor(-1)
    end = tf.ragged.boolean_mask(positions + 1, ends).to_tensor(-1)
    span_type = tf.ragged.boolean_mask(kind, starts).to_tensor("")
    return tf.reduce_sum(tf.cast(starts, tf.int32), axis=1), start, end, span_type


def build_tagger_archive(head, encoder, elmo=None, tokenizer="whitespace", max_tokens=None):
    """`(archive, functions)`: a `keras.export.ExportArchive` with the `tag` and `featurize` endpoints (see the module
    docstring) and the Python functions behind them by name (callable eagerly, for checks)."""
    if head.num_elmo_layers and elmo is None:
        raise ValueError("the tagger was trained with ELMo features: pass the ELMo model")
    pipeline = NERPipeline(head, encoder, InProcessFeatures(elmo) if head.num_elmo_layers else None)
    tokenize = make_tokenizer(tokenizer, max_tokens)
    archive = keras.export.ExportArchive()
    for layer in pipeline.layers:  # the head, the featurizer, the biLM
        archive.track(layer)
    labels = list(encoder.labels)

    def featurize(sentences):
        tokens, lengths = tokenize(sentences)
        return dict(pipeline.featurizer((tokens, lengths)), **{TOKENS: tokens, SEQUENCE_LEN: lengths})

    def tag(sentences):
        tokens, lengths = tokenize(sentences)
        inputs = pipeline.graph_inputs(tokens, lengths)
        mask = inputs[MASK]
        ids = head(inputs, training=False)
        num, start, end, span_type = spans_from_tags(ids, mask, labels)
        return {
            TOKENS: tokens,
            SEQUENCE_LEN: lengths,
            "tags": tf.where(mask, tf.gather(labels, ids), ""),
            "num_spans": num,
            "span_start": start,
            "span_end": end,
            "span_type": span_type,
        }

    archive.add_endpoint(TAG_SIGNATURE, tag, input_signature=[SENTENCES_SPEC])
    archive.add_endpoint(FEATURIZE_SIGNATURE, featurize, input_signature=[SENTENCES_SPEC])
    return archive, {TAG_SIGNATURE: tag, FEATURIZE_SIGNATURE: featurize}


def export_tagger(
    head,
    encoder,
    base_dir,
    elmo=None,
    version=None,
    tokenizer="whitespace",
    max_tokens=None,
    check_sentences=CHECK_SENTENCES,
):
    """Writes `<base_dir>/<version>/` and checks the reloaded signatures give what the Keras tagger gives (tags,
    spans, features: exactly) on `check_sentences` and on `EDGE_BATCHES`; returns the path.

    Raises:
        FileExistsError: the version exists. RuntimeError: the reloaded tagger differs; nothing is published.
    """

    precision = InProcessFeatures(elmo).precision if elmo is not None and head.num_elmo_layers else "float32"

    def write(tmp):
        archive, functions = build_tagger_archive(head, encoder, elmo, tokenizer, max_tokens)
        archive.write_out(tmp, verbose=False)
        write_warmup_requests(tmp, sentence_requests((TAG_SIGNATURE, SERVING_DEFAULT, FEATURIZE_SIGNATURE)))
        write_export_metadata(tmp, export_metadata("ner_tagger", precision, tokenizer, max_tokens))
        loaded = tf.saved_model.load(tmp)
        for batch in (check_sentences, *EDGE_BATCHES):
            sentences = tf.constant(list(batch), tf.string)
            for name, function in functions.items():
                got, want = loaded.signatures[name](sentences=sentences), function(sentences)
                for key in want:
                    if not np.array_equal(got[key].numpy(), want[key].numpy()):
                        raise RuntimeError(f"the reloaded tagger's {name}/{key} differ from the Keras tagger's")
        run_warmup_requests(loaded, tmp)

    return publish_version(base_dir, version, write)
