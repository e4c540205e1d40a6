"""elmo_tf/precision.py (the command line's flag: tests/cli/test_precision.py): the values of the one `precision`
setting, its check, and "auto"'s decision from CPUID: float32 on a CPU without a bfloat16 unit (this AVX2 EPYC, and the
emulated EPYC-Milan of `make test-avx2`), bfloat16 where AVX512_BF16 is there; and what a model built with "auto"
computes in."""

import logging

import pytest

from elmo_tf import precision
from elmo_tf.precision import PRECISIONS, PrecisionError, check_precision, native_bfloat16, resolve_precision


def _cpuid_has_avx512_bf16():
    try:
        from numpy._core._multiarray_umath import __cpu_features__
    except ImportError:  # NumPy < 2
        from numpy.core._multiarray_umath import __cpu_features__
    return bool(__cpu_features__.get("AVX512BF16", False))


def test_values_and_their_check():
    assert PRECISIONS == ("float32", "bfloat16", "auto")
    for value in PRECISIONS:
        assert check_precision(value) == value
    for bad in ("bf16", "Float32", None, 16):
        with pytest.raises(PrecisionError, match=f"precision must be one of float32, bfloat16, auto; got {bad!r}") as e:
            check_precision(bad)
        assert e.value.key == "precision"
    with pytest.raises(PrecisionError, match="--precision must be one of") as e:
        resolve_precision("half", name="--precision")
    assert e.value.key == "--precision"
    assert resolve_precision(None) == resolve_precision("float32") == "float32"
    assert resolve_precision("bfloat16") == "bfloat16"


def test_auto_follows_the_cpus_bfloat16_unit():
    """CPUID's AVX512_BF16 decides: float32 on this AVX2-only EPYC and under `make test-avx2`'s emulated one (where
    /proc/cpuinfo still describes the host), bfloat16 on Zen 4/5, Cooper Lake, Sapphire Rapids and later."""
    assert native_bfloat16() == _cpuid_has_avx512_bf16()
    assert resolve_precision("auto") == ("bfloat16" if _cpuid_has_avx512_bf16() else "float32")


def test_auto_is_decided_once_and_said_once(monkeypatch, caplog):
    """A CPU with AVX512_BF16 (faked) gives bfloat16; one without, float32; the decision is logged once per process."""
    decisions = {}
    for native in (True, False):
        precision._auto.cache_clear()
        monkeypatch.setattr(precision, "native_bfloat16", lambda native=native: native)
        with caplog.at_level(logging.INFO, logger="elmo_tf.precision"):
            caplog.clear()
            decisions[native] = [resolve_precision("auto") for _ in range(3)]
            said = [r.getMessage() for r in caplog.records if r.name == "elmo_tf.precision"]
        assert len(said) == 1 and said[0].startswith(f"precision auto: {decisions[native][0]}")
    precision._auto.cache_clear()
    assert decisions == {True: ["bfloat16"] * 3, False: ["float32"] * 3}


def test_a_model_asked_for_auto_computes_in_what_auto_resolves_to(make_elmo):
    model = make_elmo(precision="auto", randomize=False)
    assert model.get_config()["precision"] == "auto"
    assert model.precision == ("bfloat16" if _cpuid_has_avx512_bf16() else "float32")
    if not _cpuid_has_avx512_bf16():  # float32 where there is no bfloat16 unit: no copies are held
        assert not any(hasattr(layer, "_low_precision") for layer in model._flatten_layers())
