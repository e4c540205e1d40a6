"""`make demo`: the end-to-end job, on data this script writes itself (or real data with --data).

What runs today (the ELMo core): build an ELMo biLM, write it in the bilm-tf/AllenNLP file layout
(options.json + weights.hdf5), load it back, embed sentences with `python -m elmo_tf embed`, and check
that the vectors are stateless (a sentence's vectors do not depend on its batch). With
`--data DIR` holding `elmo_fixtures/allennlp/` (e.g. ../shared/data), the original test weights are used
instead of a random model. Pretraining, export, serving and NER join this pipeline as they land.
"""
import argparse
import logging
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

DEMO_SENTENCES = [
    "The quick brown fox jumps over the lazy dog .",
    "ELMo gives each word a vector that depends on its whole sentence .",
    "She banked the plane to the left before landing near the river bank .",
    "He deposited the cheque at the bank on Monday morning .",
    "Paris is the capital of France .",
    "",
    "Short .",
    "Word vectors from a bidirectional language model help named entity recognition , parsing and "
    "question answering alike .",
]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="example: python demo.py --out demo_out --data ../shared/data")
    parser.add_argument("--out", default="demo_out", help="where everything is written (demo_out)")
    parser.add_argument("--data", default=None, help="a data dir holding elmo_fixtures/allennlp (optional)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[demo] %(message)s", stream=sys.stderr)
    log = logging.getLogger("demo")
    if args.data and not os.path.isdir(os.path.join(args.data, "elmo_fixtures", "allennlp")):
        parser.error(f"--data: no elmo_fixtures/allennlp under {args.data!r}")
    import h5py
    import keras
    import numpy as np

    from elmo_tf import BiLMConfig, ELMo, load_elmo, save_elmo

    os.makedirs(args.out, exist_ok=True)
    model_dir = os.path.join(args.out, "model")
    start = time.perf_counter()
    if args.data:
        fixtures = os.path.join(args.data, "elmo_fixtures", "allennlp")
        options, weights = os.path.join(fixtures, "options.json"), os.path.join(fixtures, "lm_weights.hdf5")
        log.info("1/4 using the AllenNLP test biLM from %s", fixtures)
    else:
        log.info("1/4 building a small random-weight biLM (pretraining arrives with training/pretrain.py)")
        keras.utils.set_random_seed(0)
        config = BiLMConfig(char_embedding_dim=8, filters=((1, 16), (2, 16), (3, 32), (4, 64)), num_highway=1,
                            lstm_dim=256, projection_dim=64, num_layers=2)
        save_elmo(ELMo(config), model_dir)
        options, weights = os.path.join(model_dir, "options.json"), os.path.join(model_dir, "weights.hdf5")
    log.info("2/4 loading %s + %s through the bilm-tf weight-file reader", options, weights)
    elmo = load_elmo(options, weights)
    log.info("    %s parameters, %d LSTM layers, projection %d", f"{elmo.count_params():,}",
             elmo.config.num_layers, elmo.config.projection_dim)
    text = os.path.join(args.out, "sentences.txt")
    with open(text, "w", encoding="utf-8") as f:
        f.write("\n".join(DEMO_SENTENCES) + "\n")
    output = os.path.join(args.out, "embeddings.hdf5")
    log.info("3/4 python -m elmo_tf embed --input %s --output %s", text, output)
    subprocess.run([sys.executable, "-m", "elmo_tf", "embed", "--options", options, "--weights", weights,
                    "--input", text, "--output", output, "--batch-size", "4"], check=True)
    log.info("4/4 checking the written vectors against the model called on each sentence alone")
    from elmo_tf.preprocessing import tokens_to_char_ids_numpy

    worst = 0.0
    with h5py.File(output, "r") as f:
        for i, sentence in enumerate(DEMO_SENTENCES):
            tokens = sentence.split()
            stored = f[str(i)][...]
            if not tokens:
                log.info("    line %d is empty -> dataset of shape %s", i, stored.shape)
                continue
            alone = np.stack([a[0].numpy() for a in elmo(tokens_to_char_ids_numpy(tokens)[None])["activations"]])
            worst = max(worst, float(np.abs(alone - stored).max()))
        shape = f["0"].shape
    log.info("    dataset '0' has shape %s (layers, tokens, 2 x projection); batched vs alone max |diff| %.2e",
             shape, worst)
    if worst > 1e-5:
        log.error("batched vectors differ from single-sentence vectors by %.2e", worst)
        return 1
    log.info("done in %.0f s; written: %s (model), %s (vectors)", time.perf_counter() - start,
             os.path.dirname(options), output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
