"""The NER tagger assembled once: tokens -> `NERFeaturizer` (mask, word ids, char ids) + a feature source (the biLM's
activations) -> `NERTagger` (ScalarMix -> biLSTM -> CRF) -> tags.

`NERPipeline` is that assembly. Training (`elmo_tf.ner.training`: its batches, its dev and test predictions), tagging
(`elmo_tf.ner.tagging.tag_sentences`, `elmo-tf tag`) and the tagger export (`elmo_tf.ner.export`: the same steps in
the graph, the biLM run inside it) all build their inputs through it, so a head is trained, tagged and exported with
inputs made by one piece of code. Tagging needs no tags: its batches hold the head's inputs only.

A batch: sentences grouped by length (`length_groups`, shortest first), featurized together, their activations
zero-padded to the batch's longest sentence (`batch_inputs`).
"""

import numpy as np
import tensorflow as tf

from elmo_tf.errors import ElmoTFError
from elmo_tf.ner.featurizer import MASK

ACTIVATIONS = "activations"  # the head's input of biLM activations, float32 (batch, L+1, T, dim)


class SourceMismatchError(ElmoTFError):
    """A feature source that does not fit the head: features for a head trained without them, or a biLM of another
    shape than the one the head was trained on. The message gives both shapes."""


def length_groups(lengths, batch_size):
    """Batches of indices into `lengths` (token counts), shortest sentences first (ties in input order), each of
    `batch_size` indices but the last."""
    by_length = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [by_length[i : i + batch_size] for i in range(0, len(by_length), batch_size)]


def batch_inputs(featurizer, token_lists, activations=None):
    """The head's inputs for one batch, as NumPy arrays.

    Args:
        featurizer: the `NERFeaturizer` of the head.
        token_lists: the batch's sentences (lists of str).
        activations: None, or per sentence its biLM activations `(L+1, n_tokens, dim)`.
    Returns:
        dict: the featurizer's `mask` bool `(batch, T)` (`word_ids`, `char_ids` as it is configured), and with
        activations `activations` float32 `(batch, L+1, T, dim)`, zeros past each sentence's end.
    """
    inputs = featurizer.featurize(token_lists)
    if activations is not None:
        width = inputs[MASK].shape[1]
        layers, _, dim = activations[0].shape
        stacked = np.zeros([len(activations), layers, width, dim], np.float32)
        for row, array in enumerate(activations):
            stacked[row, :, : array.shape[1]] = array
        inputs[ACTIVATIONS] = stacked
    return inputs


def decode_batch(encoder, tag_ids, lengths):
    """Tag strings (the encoder's source scheme) of each row of `tag_ids` `(batch, T)`, cut to its sentence's length."""
    tag_ids = np.asarray(tag_ids)
    return [encoder.decode_tags(tag_ids[row, :n].tolist()) for row, n in enumerate(lengths)]


class NERPipeline:
    """Featurizer + feature source + head: the NER tagger whole, on the host (`tag`, `inputs`) and in a graph
    (`graph_inputs`, for the export).

    Args:
        head: an `NERTagger` (built: `build_for`, or loaded from a `.keras` file).
        encoder: its `Encoder` (labels, word vocabulary, tag schemes); it gives the featurizer
            (`Encoder.featurizer_for`).
        source: where the biLM activations come from: an `elmo_tf.ner.features.InProcessFeatures` (host side and in a
            graph) or `ServedFeatures` (host side), anything called on token lists that returns per-sentence arrays
            `(L+1, n_tokens, dim)` and has `num_layers` and `dim`. None for a head without ELMo, or where the
            activations come from elsewhere (training reads them from its cache into `NERBatches`).
    Raises:
        SourceMismatchError: a source for a head without ELMo, or with other layers or width than the head's.
    """

    def __init__(self, head, encoder, source=None):
        self.head = head
        self.encoder = encoder
        self.featurizer = encoder.featurizer_for(head)
        if source is not None:
            self._check_source(source)
        self.source = source

    @property
    def uses_elmo(self):
        return self.head.num_elmo_layers > 0

    @property
    def activation_dim(self):
        """The width of the activations the head was built for (None without ELMo)."""
        return self.head.get_build_config()["activation_dim"]

    def _check_source(self, source):
        layers, dim = self.head.num_elmo_layers, self.activation_dim
        if not layers:
            raise SourceMismatchError("the tagger was trained without ELMo features; it takes no feature source")
        if source.num_layers != layers or (dim is not None and source.dim != dim):
            raise SourceMismatchError(
                f"the biLM gives {source.num_layers} layers of width {source.dim}, the model was trained on "
                f"{layers} layers of width {dim}"
            )

    @property
    def layers(self):
        """What an export tracks: the head, the featurizer and, with ELMo, the biLM (`source.elmo`)."""
        elmo = getattr(self.source, "elmo", None) if self.uses_elmo else None
        return [self.head, self.featurizer] + ([elmo] if elmo is not None else [])

    # ------------------------------------------------------------------------------------------------ host side

    def inputs(self, token_lists, activations=None):
        """`batch_inputs` with this head's featurizer."""
        return batch_inputs(self.featurizer, token_lists, activations)

    def features(self, token_lists):
        """The source's activations of `token_lists` (one call: the source packs its own requests); None without
        ELMo.

        Raises:
            ValueError: the head takes ELMo features and the pipeline has no source.
        """
        if not self.uses_elmo:
            return None
        if self.source is None:
            raise ValueError("the tagger was trained with ELMo features: give the pipeline a feature source")
        return self.source(token_lists)

    def tag(self, token_lists, batch_size=32):
        """Tag strings (the encoder's source scheme) for each token list, in order; an empty list gets [].

        The sentences are featurized in batches of `batch_size` sentences of similar length (`length_groups`); no
        tags are needed or made up for them.
        """
        features = self.features(token_lists)
        tags = [None] * len(token_lists)
        for rows in length_groups([len(tokens) for tokens in token_lists], batch_size):
            batch = [token_lists[i] for i in rows]
            inputs = self.inputs(batch, None if features is None else [features[i] for i in rows])
            ids = self.head(inputs, training=False)
            for i, sentence_tags in zip(rows, decode_batch(self.encoder, ids, [len(t) for t in batch])):
                tags[i] = sentence_tags
        return tags

    # ------------------------------------------------------------------------------------------------ in a graph

    def graph_inputs(self, tokens, sequence_len):
        """The head's inputs as tensors, inside a graph (the tagger export): the featurizer's, and with ELMo the
        biLM's activations `(batch, L+1, T, dim)` (`source.graph_activations` of the tokens: the biLM's own char
        mapping, not the featurizer's `char_ids`, which feed the tagger's own char CNN).

        Args:
            tokens: tf.string `(batch, T)` padded with "". sequence_len: int32 `(batch,)`.
        """
        inputs = dict(self.featurizer((tokens, sequence_len)))
        if self.uses_elmo:
            graph_activations = getattr(self.source, "graph_activations", None)
            if graph_activations is None:
                raise ValueError(
                    "the tagger's graph runs its biLM inside it: give the pipeline a biLM in this process "
                    "(InProcessFeatures)"
                )
            # the biLM maps the tokens itself (its own char mapping); the featurizer's `char_ids` are the tagger's
            inputs[ACTIVATIONS] = graph_activations(tf.where(inputs[MASK], tokens, ""))
        return inputs
