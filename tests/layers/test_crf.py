"""elmo_tf/layers/crf.py: log-likelihood, Viterbi path and score, and the gradient of the log-likelihood equal
brute-force enumeration of every tag path (float64 NumPy) on tiny random cases (K = 3-5 tags, T <= 5), with
padding, length-0 and length-1 sentences, with and without transition constraints; the layer contract.
"""

import itertools

import numpy as np
import pytest
import tensorflow as tf
from layer_testlib import same_mask

from elmo_tf.layers.crf import CRF, NEG_INF
from elmo_tf.ner.tags import allowed_transitions

ATOL = 1e-4  # float32 forward algorithm vs float64 enumeration, scores of magnitude ~10


def make_crf(num_tags, seed, constraints=None, scale=1.0):
    rng = np.random.default_rng(seed)
    trans, start, end = constraints if constraints is not None else (None, None, None)
    crf = CRF(num_tags, allowed_transitions=trans, allowed_start=start, allowed_end=end)
    crf.build((None, None, num_tags))
    for var in crf.weights:
        var.assign(rng.normal(0.0, scale, size=tuple(var.shape)).astype("float32"))
    return crf


def constrained_weights(crf):
    """(transitions, start, end) as float64 with the forbidden entries at -inf (excluded from enumeration)."""

    def apply(weight, allowed):
        w = weight.numpy().astype(np.float64)
        return w if allowed is None else np.where(np.asarray(allowed), w, -np.inf)

    return (
        apply(crf.transitions, crf.allowed_transitions),
        apply(crf.start_transitions, crf.allowed_start),
        apply(crf.end_transitions, crf.allowed_end),
    )


def path_score(x, path, trans, start, end):
    if not path:
        return 0.0
    return (
        start[path[0]]
        + sum(x[t, y] for t, y in enumerate(path))
        + sum(trans[a, b] for a, b in zip(path[:-1], path[1:]))
        + end[path[-1]]
    )


def brute_force(x, length, trans, start, end):
    """Every path of `length` tags: (paths, float64 scores); forbidden paths score -inf."""
    num_tags = x.shape[-1]
    paths = list(itertools.product(range(num_tags), repeat=length))
    scores = np.array([path_score(x, list(p), trans, start, end) for p in paths])
    return paths, scores


def logsumexp(a):
    top = np.max(a)
    return top + np.log(np.sum(np.exp(a - top))) if np.isfinite(top) else top


def random_batch(rng, num_tags, lengths, width=None):
    """Potentials `(batch, width, K)` with garbage (large values) at padding, and the left-aligned mask."""
    width = max(lengths + [0]) if width is None else width
    x = rng.normal(0.0, 2.0, size=(len(lengths), width, num_tags)).astype("float32")
    mask = np.arange(width)[None, :] < np.array(lengths)[:, None]
    x = np.where(mask[..., None], x, 50.0 * rng.normal(size=x.shape)).astype("float32")
    return x, mask


def valid_path(rng, length, constraints):
    """A random path that satisfies the constraints (rejection sampling; tiny K and T)."""
    num_tags = len(constraints[1])
    trans, start, end = (np.asarray(c) for c in constraints)
    for _ in range(10000):
        path = rng.integers(0, num_tags, size=length).tolist()
        if not path or (start[path[0]] and end[path[-1]] and all(trans[a, b] for a, b in zip(path, path[1:]))):
            return path
    raise AssertionError("no valid path found")


def iob2_constraints():  # O, B-A, I-A, B-B: K = 4
    return allowed_transitions(["O", "B-A", "I-A", "B-B"], "iob2")


def bioes_constraints():  # O, B-A, I-A, E-A, S-A: K = 5
    return allowed_transitions(["O", "B-A", "I-A", "E-A", "S-A"], "bioes")


def random_constraints(num_tags, seed):
    """Random forbidden entries; tag 0 stays allowed everywhere, so every length has a valid path."""
    rng = np.random.default_rng(seed)
    trans, start, end = rng.random((num_tags, num_tags)) < 0.6, rng.random(num_tags) < 0.6, rng.random(num_tags) < 0.6
    trans[0, :] = trans[:, 0] = start[0] = end[0] = True
    trans[1, 2] = start[1] = end[2] = False  # at least one of each kind forbidden
    return trans, start, end


CASES = [  # (id, K, constraints)
    ("K3", 3, None),
    ("K4", 4, None),
    ("K4-iob2", 4, iob2_constraints()),
    ("K5-bioes", 5, bioes_constraints()),
    ("K4-random", 4, random_constraints(4, 7)),
]
LENGTHS = [5, 4, 3, 2, 1, 0, 5, 1]  # padded to T = 5; length 0 and 1 included


@pytest.mark.parametrize("num_tags,constraints", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_log_likelihood_and_viterbi_equal_brute_force(num_tags, constraints):
    for seed in range(3):
        rng = np.random.default_rng(100 + seed)
        crf = make_crf(num_tags, seed, constraints)
        trans, start, end = constrained_weights(crf)
        x, mask = random_batch(rng, num_tags, LENGTHS)
        gold = np.zeros(mask.shape, np.int32)
        for b, n in enumerate(LENGTHS):
            gold[b, :n] = valid_path(rng, n, constraints) if constraints is not None else rng.integers(0, num_tags, n)
        ll = crf.log_likelihood(x, gold, mask).numpy()
        path, best = (a.numpy() for a in crf.decode(x, mask))
        assert path.dtype == np.int32 and path.shape == mask.shape
        for b, n in enumerate(LENGTHS):
            paths, scores = brute_force(x[b].astype(np.float64), n, trans, start, end)
            expected_ll = path_score(x[b].astype(np.float64), gold[b, :n].tolist(), trans, start, end) - (
                logsumexp(scores) if n else 0.0
            )
            np.testing.assert_allclose(ll[b], expected_ll, atol=ATOL, rtol=1e-5, err_msg=f"row {b}, length {n}")
            k = int(np.argmax(scores))
            assert path[b, :n].tolist() == list(paths[k]), f"row {b}: Viterbi path differs from brute force"
            np.testing.assert_allclose(best[b], scores[k] if n else 0.0, atol=ATOL, rtol=1e-5)
            assert (path[b, n:] == 0).all(), "tags at padding must be 0"
            if constraints is not None:  # the decoded path is allowed
                t, s, e = (np.asarray(c) for c in constraints)
                p = path[b, :n].tolist()
                assert not p or (s[p[0]] and e[p[-1]] and all(t[i, j] for i, j in zip(p, p[1:])))
        assert np.all(ll <= 1e-5)  # log-probabilities


def test_sum_of_probabilities_is_one():
    """exp(log p(y | x)) over every y of a row sums to 1 (the partition function is the forward algorithm's)."""
    rng = np.random.default_rng(3)
    crf = make_crf(3, 3)
    x, mask = random_batch(rng, 3, [4])
    paths = np.array(list(itertools.product(range(3), repeat=4)), np.int32)
    ll = crf.log_likelihood(np.repeat(x, len(paths), axis=0), paths, np.repeat(mask, len(paths), axis=0))
    np.testing.assert_allclose(np.exp(ll.numpy().astype(np.float64)).sum(), 1.0, rtol=1e-4)


def test_padding_and_batch_mates_do_not_change_results():
    """A sentence alone (no padding) or batched with longer ones (padding with garbage) gives the same outputs."""
    rng = np.random.default_rng(5)
    crf = make_crf(4, 5, iob2_constraints())
    x, mask = random_batch(rng, 4, [5, 2, 3, 0])
    tags = rng.integers(0, 4, size=mask.shape).astype(np.int32)
    ll = crf.log_likelihood(x, tags, mask).numpy()
    path, best = (a.numpy() for a in crf.decode(x, mask))
    for b, n in enumerate([5, 2, 3]):
        alone_ll = crf.log_likelihood(x[b : b + 1, :n], tags[b : b + 1, :n]).numpy()  # mask=None: all real
        alone_path, alone_best = (a.numpy() for a in crf.decode(x[b : b + 1, :n]))
        np.testing.assert_allclose(ll[b], alone_ll[0], atol=1e-5)
        np.testing.assert_allclose(best[b], alone_best[0], atol=1e-5)
        assert path[b, :n].tolist() == alone_path[0].tolist()


def test_time_dimension_of_one_and_all_empty_batches():
    """T = 1 (no transitions at all) and a batch of only empty sentences work; an empty batch too."""
    rng = np.random.default_rng(9)
    crf = make_crf(3, 9)
    trans, start, end = constrained_weights(crf)
    x = rng.normal(size=(2, 1, 3)).astype("float32")
    mask = np.array([[True], [False]])
    tags = np.array([[2], [0]], np.int32)
    ll = crf.log_likelihood(x, tags, mask).numpy()
    path, best = (a.numpy() for a in crf.decode(x, mask))
    scores = start + x[0, 0] + end
    np.testing.assert_allclose(ll, [scores[2] - logsumexp(scores), 0.0], atol=ATOL)
    assert path.tolist() == [[int(np.argmax(scores))], [0]]
    np.testing.assert_allclose(best, [scores.max(), 0.0], atol=ATOL)
    empty = np.zeros([3, 4], bool)
    ll = crf.log_likelihood(rng.normal(size=(3, 4, 3)).astype("float32"), np.zeros([3, 4], np.int32), empty)
    path, best = crf.decode(rng.normal(size=(3, 4, 3)).astype("float32"), empty)
    assert ll.numpy().tolist() == [0.0] * 3 and best.numpy().tolist() == [0.0] * 3
    assert (path.numpy() == 0).all()
    path, best = crf.decode(np.zeros([0, 3, 3], np.float32))
    assert path.shape == (0, 3) and best.shape == (0,)
    assert crf.log_likelihood(np.zeros([0, 3, 3], np.float32), np.zeros([0, 3], np.int32)).shape == (0,)


def test_time_dimension_of_zero():
    crf = make_crf(3, 0)
    path, best = crf.decode(np.zeros([2, 0, 3], np.float32), np.zeros([2, 0], bool))
    assert path.shape == (2, 0) and best.numpy().tolist() == [0.0, 0.0]
    ll = crf.log_likelihood(np.zeros([2, 0, 3], np.float32), np.zeros([2, 0], np.int32), np.zeros([2, 0], bool))
    assert ll.numpy().tolist() == [0.0, 0.0]


@pytest.mark.parametrize("static", [False, True], ids=["unknown-shape", "known-shape"])
def test_one_or_no_time_steps_in_a_graph_equal_eager(static):
    """In a tf.function (a SavedModel signature, a compiled training step), with shapes unknown or fixed by the
    signature: batches whose longest sentence has one token or none, and batches without rows, give what eager mode
    gives (eager mode equals enumeration: the tests above). A scan over no steps failed there (stacking no steps when
    run; `[-1]` of it when traced)."""
    crf = make_crf(5, 4, bioes_constraints())
    rng = np.random.default_rng(4)
    for lengths, width in (([1, 0, 1], 1), ([0, 0], 0), ([0, 0], 1), ([], 0), ([], 2), ([3, 1, 0], 3)):
        x = rng.normal(size=(len(lengths), width, 5)).astype("float32")
        mask = np.arange(width)[None] < np.array(lengths, int).reshape(-1, 1)
        tags = rng.integers(0, 5, size=mask.shape).astype(np.int32) * mask
        shape = list(mask.shape) if static else [None, None]
        specs = [tf.TensorSpec(shape + [5]), tf.TensorSpec(shape, tf.int32), tf.TensorSpec(shape, tf.bool)]
        decode = tf.function(lambda p, t, m: crf.decode(p, m), input_signature=specs)
        log_likelihood = tf.function(crf.log_likelihood, input_signature=specs)
        for got, want in zip(decode(x, tags, mask), crf.decode(x, mask)):
            assert got.shape == want.shape == x.shape[: got.shape.rank]
            np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-6)
        np.testing.assert_allclose(log_likelihood(x, tags, mask).numpy(), crf.log_likelihood(x, tags, mask).numpy())


@pytest.mark.parametrize("constraints", [None, bioes_constraints()], ids=["free", "bioes"])
def test_gradient_is_finite_and_equals_brute_force_marginals(constraints):
    """d log p(y|x) / d x[t, k] = [y_t = k] - p(y_t = k | x): the marginals by enumeration; finite everywhere
    (forbidden transitions included), zero at padding."""
    num_tags = 5 if constraints is not None else 3
    rng = np.random.default_rng(11)
    crf = make_crf(num_tags, 11, constraints)
    trans, start, end = constrained_weights(crf)
    lengths = [4, 2, 0]
    x, mask = random_batch(rng, num_tags, lengths, width=4)
    gold = np.zeros(mask.shape, np.int32)
    for b, n in enumerate(lengths):
        gold[b, :n] = valid_path(rng, n, constraints) if constraints is not None else rng.integers(0, num_tags, n)
    x_var = tf.Variable(x)
    with tf.GradientTape() as tape:
        ll = crf.log_likelihood(x_var, gold, mask)
        total = tf.reduce_sum(ll)
    grads = tape.gradient(total, [x_var] + crf.trainable_weights)
    for g in grads:
        assert np.isfinite(g.numpy()).all()
    gx = grads[0].numpy()
    for b, n in enumerate(lengths):
        expected = np.zeros([4, num_tags])
        if n:
            paths, scores = brute_force(x[b].astype(np.float64), n, trans, start, end)
            probs = np.exp(scores - logsumexp(scores))
            for p, w in zip(paths, probs):
                expected[np.arange(n), list(p)] -= w
            expected[np.arange(n), gold[b, :n]] += 1.0
        np.testing.assert_allclose(gx[b], expected, atol=1e-4, err_msg=f"row {b}")
    if constraints is not None:  # forbidden transitions get no gradient
        forbidden = ~np.asarray(constraints[0])
        assert np.abs(grads[1].numpy()[forbidden]).max() == 0.0


def test_forbidden_transitions_are_never_decoded():
    """Potentials that strongly favour forbidden moves still decode to an allowed path."""
    constraints = bioes_constraints()
    crf = make_crf(5, 2, constraints)
    x = np.zeros([1, 4, 5], np.float32)
    x[0, :, 2] = 20.0  # I-A everywhere: I-A cannot start, nor end, nor follow O
    path = crf.decode(x)[0].numpy()[0].tolist()
    t, s, e = (np.asarray(c) for c in constraints)
    assert s[path[0]] and e[path[-1]] and all(t[i, j] for i, j in zip(path, path[1:]))
    assert path == [1, 2, 2, 3]  # B-A I-A I-A E-A


@pytest.mark.parametrize("constraints", [None, iob2_constraints()], ids=["free", "iob2"])
def test_layer_contract(constraints, layer_contract):
    """Config, shapes, the mask passed through, padding (garbage potentials at masked positions) and batch-mates,
    `.keras` reload in another process (tests/layer_testlib.py); the constraints are in the config as lists."""
    rng = np.random.default_rng(0)
    x, mask = random_batch(rng, 4, [5, 2, 3, 0])
    mates, mates_mask = random_batch(rng, 4, [7, 6])
    trans, start, end = constraints if constraints is not None else (None, None, None)
    init = dict(num_tags=4, allowed_transitions=trans, allowed_start=start, allowed_end=end)
    layer, tags = layer_contract(
        CRF,
        init,
        x,
        mask=mask,
        output_mask=same_mask,
        pad_value=50.0,
        batch_mates=mates,
        batch_mates_mask=mates_mask,
        weight_scale=1.0,
    )
    expected = None if constraints is None else np.asarray(constraints[0]).tolist()
    assert layer.get_config()["allowed_transitions"] == expected
    assert tags.dtype == np.int32 and tags[mask].any()
    assert NEG_INF < -1e3


def test_bad_arguments_raise_naming_the_argument():
    with pytest.raises(ValueError, match="num_tags"):
        CRF(0)
    with pytest.raises(ValueError, match="allowed_transitions"):
        CRF(3, allowed_transitions=np.ones([3, 2], bool))
    with pytest.raises(ValueError, match="allowed_start"):
        CRF(3, allowed_start=[True, False])
    crf = make_crf(3, 0)
    with pytest.raises(ValueError, match="potentials"):
        crf.decode(np.zeros([2, 3], np.float32))
