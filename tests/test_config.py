"""elmo_tf/config.py: the sizes of a biLM are bounded from the options alone (each dimension, the layer counts, the
filter list, the total of weights), so that an options.json from the internet is refused in one line naming the key,
fast and without memory, instead of allocating tens of GB or building layers for minutes."""

import json
import resource
import time

import pytest

from elmo_tf.config import MAX_DIM, MAX_PARAMETERS, PRESETS, BiLMConfig, ConfigError

HUGE = [
    ("lstm.dim", 10**9),
    ("lstm.projection_dim", 10**9),
    ("char_cnn.embedding.dim", 10**9),
    ("char_cnn.filters", [[1, 10**9]]),
    ("lstm.n_layers", 10**6),
    ("char_cnn.n_highway", 10**6),
    ("char_cnn.filters", [[1, 4]] * 10**6),
]


def original_options(**changes):
    """The original ELMo's options with `changes` ({"lstm.dim": value}) applied."""
    options = PRESETS["original"].to_options()
    for path, value in changes.items():
        section, *keys = path.split(".")
        node = options[section]
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value
    return options


def max_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.mark.parametrize("path,value", HUGE, ids=[f"{p}={str(v)[:12]}" for p, v in HUGE])
def test_a_huge_size_is_refused_fast_naming_the_key(tmp_path, path, value):
    from elmo_tf.models import load_elmo

    options = original_options(**{path: value})
    rss, start = max_rss_mib(), time.perf_counter()
    with pytest.raises(ConfigError) as info:
        BiLMConfig.from_options(options)
    assert time.perf_counter() - start < 1.0 and max_rss_mib() - rss < 100
    assert str(info.value).startswith(path) and "elmo_tf's ceiling" in str(info.value)
    file = tmp_path / "options.json"
    file.write_text(json.dumps(options))
    with pytest.raises(ConfigError) as info:  # the same from a file, before anything is built
        load_elmo(file)
    message = str(info.value)
    assert message.startswith(f"{file}: {path}") and "\n" not in message, message
    assert info.value.key.startswith(path)


def test_the_ceilings_name_the_key_and_the_value():
    with pytest.raises(ConfigError, match=r"^lstm\.n_layers must be <= 32 \(elmo_tf's ceiling.*\), got 33$"):
        BiLMConfig.from_options(original_options(**{"lstm.n_layers": 33}))
    with pytest.raises(ConfigError, match=r"^char_cnn\.n_highway must be <= 16 .*, got 17$"):
        BiLMConfig.from_options(original_options(**{"char_cnn.n_highway": 17}))
    with pytest.raises(ConfigError, match=rf"^lstm\.dim must be <= {MAX_DIM} .*, got {MAX_DIM + 1}$"):
        BiLMConfig.from_options(original_options(**{"lstm.dim": MAX_DIM + 1}))
    with pytest.raises(ConfigError, match=r"^char_cnn\.filters must list at most 64 .*, got 65$"):
        BiLMConfig.from_options(original_options(**{"char_cnn.filters": [[1, 4]] * 65}))


def test_the_total_of_weights_is_bounded_naming_the_largest_part():
    options = original_options(**{"lstm.dim": MAX_DIM, "lstm.projection_dim": MAX_DIM})
    with pytest.raises(ConfigError) as info:
        BiLMConfig.from_options(options, source="options.json")
    message = str(info.value)
    assert message.startswith("options.json: lstm.dim is 65536: the biLM would hold ") and "\n" not in message
    assert f"more than {MAX_PARAMETERS:,} (8 GiB of float32" in message and info.value.key == "lstm.dim"
    wide = original_options(**{"char_cnn.filters": [[1, MAX_DIM]] * 64})  # highway: (4M x 4M) kernels
    with pytest.raises(ConfigError, match=r"^char_cnn\.filters is 4194304 filters in all: the biLM would hold"):
        BiLMConfig.from_options(wide)


def test_real_models_fit_far_below_the_ceilings():
    assert sum(PRESETS["original"].parameter_parts().values()) == 93_600_864  # the original ELMo: 93.6M
    big = BiLMConfig(lstm_dim=8192, projection_dim=1024, num_layers=4, num_highway=4)  # larger than any released
    assert sum(big.parameter_parts().values()) < MAX_PARAMETERS / 2
