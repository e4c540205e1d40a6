"""Helpers shared by the export tests: the model they export."""

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "elmo_fixtures" / "allennlp"


def load_test_model(precision="float32"):
    """The AllenNLP test biLM (2 layers, projection 16) when the shared fixtures exist, else a tiny random ELMo (the
    same weights for every `precision`, what it computes in)."""
    import keras

    from elmo_tf import BiLMConfig, ELMo
    from elmo_tf.models import load_elmo

    if (FIXTURES / "options.json").is_file() and (FIXTURES / "lm_weights.hdf5").is_file():
        return load_elmo(str(FIXTURES / "options.json"), str(FIXTURES / "lm_weights.hdf5"), precision=precision)
    keras.utils.set_random_seed(0)
    return ELMo(
        BiLMConfig(
            char_embedding_dim=4,
            filters=((1, 4), (2, 8), (3, 8)),
            num_highway=1,
            lstm_dim=16,
            projection_dim=8,
            num_layers=2,
        ),
        precision=precision,
    )
