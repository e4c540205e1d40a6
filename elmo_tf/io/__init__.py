"""Weight files (bilm-tf/AllenNLP hdf5 + options.json)."""
from elmo_tf.io.bilm_hdf5 import (WeightFileError, load_bilm_weights, load_elmo, save_bilm_weights, save_elmo,
                                  weight_map)

__all__ = ["WeightFileError", "load_bilm_weights", "load_elmo", "save_bilm_weights", "save_elmo", "weight_map"]
