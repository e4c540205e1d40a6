"""elmo_tf.presets.registry: the package's registry.json has the form the presets need (every file an http(s) URL
with a size or a note, the AllenNLP, German, ELMoForManyLangs and TF Hub models); `parse_registry` refuses entries
that break it, naming the entry; `read_registry` and `$ELMO_TF_REGISTRY` add or override entries."""

import copy
import json
import re
import urllib.parse

import pytest

from elmo_tf.presets import registry
from elmo_tf.presets.registry import REGISTRY_ENV, RegistryError, parse_registry, presets, read_registry

EFML_URL = re.compile(r"^https?://vectors\.nlpl\.eu/repository/11/(\d+)\.zip$")


@pytest.fixture
def package(monkeypatch):
    monkeypatch.delenv(REGISTRY_ENV, raising=False)
    return presets()


def test_the_registry_is_the_package_file_and_its_env_key():
    assert REGISTRY_ENV == "ELMO_TF_REGISTRY"
    assert registry.REGISTRY_PATH.endswith("elmo_tf/presets/registry.json")


def test_the_package_registry_parses_and_every_file_has_a_url_and_a_size_or_a_note(package):
    assert len(package) >= 55
    for name, preset in package.items():
        assert preset.name == name
        assert preset.files, name
        for spec in preset.files:
            parts = urllib.parse.urlsplit(spec.url)
            assert parts.scheme in ("http", "https") and parts.netloc, (name, spec.url)
            assert (isinstance(spec.size, int) and spec.size > 0) or spec.note, (name, spec.name)


def test_model_and_file_names_are_unique_and_lowercase():
    """Checked on the JSON text itself: `json.load` would keep the last of two equal keys without a word."""

    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        assert len(keys) == len(set(keys)), [k for k in keys if keys.count(k) > 1]
        return dict(pairs)

    with open(registry.REGISTRY_PATH, encoding="utf-8") as f:
        data = json.load(f, object_pairs_hook=no_duplicates)
    for name in data["models"]:
        assert name == name.lower() and re.fullmatch(r"[a-z0-9][a-z0-9.\-]*", name), name


def test_the_models_the_issue_asks_for_are_there(package):
    for name in ("small", "medium", "original", "original-5.5b", "pubmed", "german", "tf-hub"):
        assert name in package, name
    for name in ("small", "medium", "original", "original-5.5b", "pubmed"):
        assert package[name].format == "bilm-hdf5"
        assert "AllenNLP" in package[name].source
        assert all(
            f.url.startswith("https://s3-us-west-2.amazonaws.com/allennlp/models/elmo/") for f in package[name].files
        )


def test_german_carries_its_published_md5_and_sha1(package):
    files = {f.name: f for f in package["german"].files}
    base = "https://github.com/t-systems-on-site-services-gmbh/german-elmo-model/releases/download/files_1/"
    assert files["options.json"].url == base + "options.json"
    assert files["weights.hdf5"].url == base + "weights.hdf5"
    # t-systems-on-site-services-gmbh/german-elmo-model README, "Download Options and Weights Files only"
    assert files["options.json"].md5 == "da99676f2fe2838ff2663a6d9bad97dd"
    assert files["options.json"].sha1 == "04afb8bc77acf5e65633ced2efc1e91d05332e89"
    assert files["weights.hdf5"].md5 == "f3ab3a68caae6d42bac47c230b3a65bf"
    assert files["weights.hdf5"].sha1 == "9084adab3eefaed4f07da7331217fcb873417add"


def test_the_elmoformanylangs_models_are_one_nlpl_zip_each(package):
    efml = {name: preset for name, preset in package.items() if name.startswith("efml-")}
    assert len(efml) >= 44
    numbers = []
    for name, preset in efml.items():
        assert preset.format == "elmoformanylangs-zip" and preset.converter == "elmoformanylangs", name
        assert [f.name for f in preset.files] == ["archive.zip"], name
        match = EFML_URL.match(preset.files[0].url)
        assert match, (name, preset.files[0].url)
        numbers.append(match.group(1))
        assert preset.language and name == f"efml-{preset.language}", name
    assert len(set(numbers)) == len(numbers)  # no two languages share one NLPL entry


def test_tf_hub_is_one_tarball(package):
    preset = package["tf-hub"]
    assert preset.format == "tf-hub-tarball" and preset.converter == "tf-hub"
    assert [f.name for f in preset.files] == ["archive.tar.gz"]
    assert preset.files[0].url.startswith("https://tfhub.dev/google/elmo/")


def test_formats_are_known_and_bilm_models_have_options_and_weights(package):
    assert set(registry.FORMATS) == {"bilm-hdf5", "elmoformanylangs-zip", "tf-hub-tarball"}
    for name, preset in package.items():
        assert preset.format in registry.FORMATS, name
        names = [f.name for f in preset.files]
        if preset.format == "bilm-hdf5":
            assert {"options.json", "weights.hdf5"} <= set(names), name
            assert preset.converter is None
        else:
            assert len(names) == 1, name


# -- parse_registry refuses what breaks the form ---------------------------------------------------------------------

GOOD_FILE = {"url": "https://example.org/m/options.json", "size": 10, "sha256": "0" * 64}


def good(**model):
    entry = {
        "description": "a test model",
        "format": "bilm-hdf5",
        "files": {
            "options.json": dict(GOOD_FILE),
            "weights.hdf5": {"url": "https://example.org/m/weights.hdf5", "size": None, "note": "not published"},
        },
    }
    entry.update(model)
    return {"format": 1, "models": {"mymodel": entry}}


def with_file(name="options.json", **fields):
    """A registry whose model's `name` file is GOOD_FILE with `fields` changed (a value of ... removes the key)."""
    data = good()
    spec = data["models"]["mymodel"]["files"].setdefault(name, copy.deepcopy(GOOD_FILE))
    for key, value in fields.items():
        if value is ...:
            spec.pop(key, None)
        else:
            spec[key] = value
    return data


def refused(data, message, key="mymodel"):
    with pytest.raises(RegistryError, match=message) as e:
        parse_registry(data)
    assert str(e.value).startswith("registry 'mymodel'")
    assert e.value.key == key
    return e.value


def test_a_good_entry_parses():
    preset = parse_registry(good())["mymodel"]
    assert preset.format == "bilm-hdf5" and preset.description == "a test model"
    assert [f.name for f in preset.files] == ["options.json", "weights.hdf5"]
    assert preset.files[0].sha256 == "0" * 64 and preset.files[1].note == "not published"
    assert preset.size is None


def test_a_file_without_url_is_refused():
    refused(with_file(url=...), r"^registry 'mymodel', file 'options.json': 'url' must be an http\(s\) URL, got None$")


@pytest.mark.parametrize(
    "url",
    ["file:///etc/passwd", "javascript:alert(1)", "ftp://example.org/w.hdf5", "https:///no-host", "example.org/w", 7],
)
def test_a_url_that_is_not_http_is_refused(url):
    message = rf"^registry 'mymodel', file 'options.json': 'url' must be an http\(s\) URL, got {re.escape(repr(url))}$"
    refused(with_file(url=url), message)


@pytest.mark.parametrize(
    "algorithm, value",
    [
        ("sha256", "0" * 63),
        ("sha256", "0" * 65),
        ("sha256", "A" * 64),  # uppercase
        ("sha256", "g" * 64),  # not hex
        ("sha256", 12),
        ("md5", "0" * 40),
        ("sha1", "0" * 32),
    ],
)
def test_a_bad_checksum_is_refused(algorithm, value):
    length = {"sha256": 64, "md5": 32, "sha1": 40}[algorithm]
    message = rf"^registry 'mymodel', file 'options.json': '{algorithm}' must be {length} lowercase hex digits or null$"
    refused(with_file(**{algorithm: value}), message)


@pytest.mark.parametrize("size", [0, -1, True, False, "12", 12.0])
def test_a_size_that_is_not_a_positive_int_is_refused(size):
    message = rf"^registry 'mymodel', file 'options.json': 'size' must be a positive int or null, got {size!r}$"
    refused(with_file(size=size), message)


@pytest.mark.parametrize("note", [..., None, ""])
def test_a_file_without_size_and_without_note_is_refused(note):
    message = r"^registry 'mymodel', file 'options.json': a file without a size needs a 'note' saying why$"
    refused(with_file(size=None, note=note), message)
    refused(with_file(size=..., note=note), message)


@pytest.mark.parametrize("name", ["sub/options.json", "/etc/passwd", "../weights.hdf5", "..", ".hidden", ""])
def test_a_file_name_that_is_a_path_is_refused(name):
    message = rf"^registry 'mymodel', file {re.escape(repr(name))}: a file name, not a path$"
    refused(with_file(name), message)


def test_an_unknown_format_is_refused():
    message = (
        r"^registry 'mymodel': 'format' must be one of "
        r"\['bilm-hdf5', 'elmoformanylangs-zip', 'tf-hub-tarball'\]$"
    )
    refused(good(format="pytorch"), message)
    refused(good(format=None), message)


@pytest.mark.parametrize("fmt", ["elmoformanylangs-zip", "tf-hub-tarball"])
def test_an_archive_format_with_two_files_is_refused(fmt):
    refused(good(format=fmt), r"^registry 'mymodel': an archive format has exactly one file$")
    data = good(format=fmt, files={"archive.zip": dict(GOOD_FILE)})
    assert parse_registry(data)["mymodel"].converter == registry.FORMATS[fmt]


def test_a_bilm_hdf5_entry_without_weights_is_refused():
    data = good(files={"options.json": dict(GOOD_FILE), "vocab.txt": dict(GOOD_FILE)})
    refused(data, r"^registry 'mymodel': a bilm-hdf5 model needs options.json and weights.hdf5$")


def test_an_entry_without_files_is_refused():
    refused(good(files={}), r"^registry 'mymodel': 'files' must list at least one file$")
    refused(good(files=["options.json"]), r"^registry 'mymodel': 'files' must list at least one file$")


def test_unknown_keys_of_a_file_are_refused():
    message = r"^registry 'mymodel', file 'options.json': unknown keys \['crc32', 'sha512'\]$"
    refused(with_file(sha512="0" * 128, crc32="00000000"), message)


def test_unknown_keys_of_a_model_are_refused():
    """A misspelt field (`licence`, `descripton`) is an error, as a file's unknown keys are, not silently dropped."""
    with pytest.raises(RegistryError, match=r"^registry 'mymodel'.*unknown keys.*'licence'") as e:
        parse_registry(good(licence="MIT"))
    assert e.value.key == "mymodel"


@pytest.mark.parametrize("data", [[], {"models": {}}, {"format": 2, "models": {}}, {"format": 1, "models": []}])
def test_a_registry_of_another_form_is_refused(data):
    with pytest.raises(RegistryError, match=r"^registry: expected \{'format': 1, 'models': \{\.\.\.\}\}$"):
        parse_registry(data)


@pytest.mark.parametrize("name", ["", " padded", "a/b", ".hidden"])
def test_an_unusable_model_name_is_refused(name):
    data = good()
    data["models"] = {name: data["models"]["mymodel"]}
    with pytest.raises(RegistryError, match=rf"^registry {re.escape(repr(name))}: not a usable model name$") as e:
        parse_registry(data)
    assert e.value.key == name


# -- read_registry and $ELMO_TF_REGISTRY -----------------------------------------------------------------------------


def test_read_registry_on_a_missing_file_names_the_path_and_the_env_key(tmp_path):
    path = tmp_path / "absent.json"
    with pytest.raises(RegistryError, match=rf"^{re.escape(str(path))}: not a readable registry JSON: .*") as e:
        read_registry(path)
    assert e.value.key == REGISTRY_ENV and e.value.path == path


def test_read_registry_on_invalid_json_names_the_path_and_the_env_key(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"format": 1,\n "models": {', encoding="utf-8")
    with pytest.raises(RegistryError, match=rf"^{re.escape(str(path))}: not a readable registry JSON: [^\n]*$") as e:
        read_registry(path)
    assert e.value.key == REGISTRY_ENV and e.value.path == path


def test_read_registry_on_a_bad_entry_names_the_path_and_the_entry(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(with_file(url="file:///etc/passwd")), encoding="utf-8")
    message = rf"^{re.escape(str(path))}: registry 'mymodel', file 'options.json': 'url' must be an http\(s\) URL"
    with pytest.raises(RegistryError, match=message) as e:
        read_registry(path)
    assert e.value.key == REGISTRY_ENV and e.value.path == path


def test_the_env_registry_adds_and_overrides_entries(tmp_path, monkeypatch):
    monkeypatch.delenv(REGISTRY_ENV, raising=False)
    package = presets()
    data = good()
    data["models"]["small"] = dict(data["models"]["mymodel"], description="a site's own small")
    path = tmp_path / "site.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    monkeypatch.setenv(REGISTRY_ENV, str(path))
    merged = presets()
    assert merged["mymodel"].description == "a test model"
    assert merged["small"].description == "a site's own small"
    assert merged["small"].files[0].url == "https://example.org/m/options.json"
    assert set(merged) == set(package) | {"mymodel"}
    assert all(merged[name] == package[name] for name in package if name != "small")  # the rest are kept
    monkeypatch.delenv(REGISTRY_ENV)
    again = presets()
    assert (
        again == package
    )  # the package's own registry is untouched by the override  # the package's own registry is untouched


def test_a_broken_env_registry_is_an_error_naming_the_env_key(tmp_path, monkeypatch):
    monkeypatch.setenv(REGISTRY_ENV, str(tmp_path / "absent.json"))
    with pytest.raises(RegistryError, match=r"absent\.json: not a readable registry JSON") as e:
        presets()
    assert e.value.key == REGISTRY_ENV
