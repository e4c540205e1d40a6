"""The tiny biLM shape the tests share, and how they randomize weights (importable from any test directory: tests/ is
on sys.path)."""

import numpy as np

# Small enough that the whole suite runs in well under 2 minutes on 2 CPU cores; filter total 12 differs
# from the projection 8, so the CNN projection is exercised.
TINY = dict(
    char_embedding_dim=4,
    filters=((1, 4), (2, 8)),
    num_highway=1,
    lstm_dim=16,
    projection_dim=8,
    num_layers=2,
    cell_clip=3.0,
    proj_clip=3.0,
    use_skip_connections=True,
)


def randomize_weights(layer, seed=0, scale=0.3):
    """Overwrites every variable of `layer` with N(0, scale^2) values (biases too), reproducibly."""
    rng = np.random.default_rng(seed)
    for var in layer.weights:
        var.assign(rng.normal(0.0, scale, size=tuple(var.shape)).astype(var.dtype))
