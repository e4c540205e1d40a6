"""Apache Beam: `embed` past one machine (`python -m elmo_tf.beam`, `elmo-tf beam-embed`).

`elmo_tf.beam.pipeline` builds the pipeline (it imports apache_beam, the `beam` extra); the shards it writes are read
with `elmo_tf.io.embeddings_shards` (`open_shards`, `merge_shards`), which needs no Beam. Importing this package
imports neither.
"""
