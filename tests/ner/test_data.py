"""elmo_tf/ner/data.py: the label set holds every form of every entity type seen in train (dev and test forms train
lacks are labels too; a type train lacks is an error naming it), on small sentences and on the real files cut by
--max-sentences."""

from pathlib import Path

import pytest

from elmo_tf.io.conll import Sentence, read_conll
from elmo_tf.ner.data import Encoder, NERDataError, read_splits
from elmo_tf.ner.tags import convert, labels_for

DATA_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def data_file(relative):
    path = DATA_DIR / relative
    if not path.is_file():
        pytest.skip(f"{path} not found (the shared data is not checked out)")
    return str(path)


def sentence(pairs, line=1):
    tokens, tags = zip(*(p.split("/") for p in pairs.split())) if pairs else ((), ())
    return Sentence(list(tokens), list(tags), line)


# train: PER only as one token (S-PER in BIOES), LOC only as two (B-LOC E-LOC)
TRAIN = [sentence("Peter/B-PER went/O to/O New/B-LOC York/I-LOC"), sentence("Anna/B-PER ./O")]


@pytest.mark.parametrize("scheme", ["bioes", "iob2"])
def test_labels_are_every_form_of_the_train_types(scheme):
    encoder = Encoder.fit(TRAIN, "iob2", scheme)
    assert encoder.labels == labels_for({"PER", "LOC"}, scheme)
    assert encoder.entity_types() == ["LOC", "PER"]
    # forms train lacks: a two-token PER (B-PER E-PER / B-PER I-PER), a one-token LOC (S-LOC / B-LOC)
    dev = sentence("Peter/B-PER Blackburn/I-PER in/O Paris/B-LOC").tags
    ids = encoder.encode_tags(dev)
    assert [encoder.labels[i] for i in ids] == convert(dev, "iob2", scheme)
    assert encoder.decode_tags(ids) == dev


def test_a_type_train_lacks_is_an_error_naming_it():
    encoder = Encoder.fit(TRAIN, "iob2", "bioes")
    with pytest.raises(ValueError) as error:
        encoder.encode_tags(["B-ORG", "I-ORG"])
    assert "entity type 'ORG' (tag 'B-ORG')" in str(error.value) and "entity types there: LOC, PER" in str(error.value)
    # an encoder.json written when labels were the forms seen: a missing form is named as a tag
    old = Encoder(["O", "S-PER"], "bioes", [], "iob2")
    with pytest.raises(ValueError, match=r"tag 'B-PER' \(bioes 'B-PER'\) never appears"):
        old.encode_tags(["B-PER", "I-PER"])


@pytest.mark.parametrize(
    "train, dev, max_sentences",
    [
        ("wnut17/wnut17train.conll", "wnut17/emerging.dev.conll", 100),  # refused 'B-product' before
        ("conll2003/eng.train", "conll2003/eng.testa", 20),  # refused 'I-LOC' before
    ],
)
def test_read_splits_takes_real_dev_files_with_few_train_sentences(train, dev, max_sentences):
    paths = {"train": data_file(train), "dev": data_file(dev)}
    scheme, splits, encoder = read_splits(paths, max_sentences=max_sentences)
    types = {t.split("-", 1)[1] for s in splits["train"] for t in s.tags if t != "O"}
    assert encoder.labels == labels_for(types, "bioes") and len(splits["dev"]) == max_sentences
    for s in splits["dev"]:  # every dev tag is a label, and decodes back to the file's tags
        assert encoder.decode_tags(encoder.encode_tags(s.tags)) == convert(s.tags, scheme, scheme)


def test_read_splits_names_the_type_and_the_cut(tmp_path):
    """A dev type the first train sentences lack: the error names the type, the dev line and --max-sentences."""
    paths = {"train": data_file("conll2003/eng.train"), "dev": data_file("conll2003/eng.testa")}
    with pytest.raises(NERDataError) as error:
        read_splits(paths, max_sentences=2)
    message = str(error.value)
    assert error.value.split == "dev" and "eng.testa:15: entity type 'LOC' (tag 'I-LOC')" in message
    assert "(entity types there: MISC, ORG, PER)" in message and "--max-sentences 2" in message
    assert len(read_conll(paths["train"])) > 2
    small = tmp_path / "train.txt"
    small.write_text("Peter B-PER\n")
    with pytest.raises(NERDataError) as error:  # train is whole: no word of --max-sentences
        read_splits({"train": str(small), "dev": paths["dev"]}, max_sentences=2)
    assert "never appears in the training data" in str(error.value) and "--max-sentences" not in str(error.value)
