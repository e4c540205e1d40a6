"""Full-softmax perplexity of a pretrained biLM (forward, backward, average) as JSON.

examples:
  python training/evaluate_lm.py --model runs/small --test ../shared/data/ptb/ptb.test.txt
  python training/evaluate_lm.py --model runs/small --test heldout.txt --output ppl.json

--model is a training/pretrain.py output dir (options.json, weights.hdf5, softmax.hdf5, vocab.txt).
Targets: every word plus </S> (forward) / <S> (backward); lines longer than --max-tokens are cut into
pieces, as in training.
"""

import argparse
import json
import logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="pretraining output dir")
    parser.add_argument("--test", required=True, help="text file")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=50)
    parser.add_argument("--output", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    if not os.path.isfile(args.test):
        parser.error(f"--test: no such file: {args.test!r}")
    if args.batch_size < 1:
        parser.error(f"--batch-size: must be >= 1, got {args.batch_size}")
    from tqdm import tqdm

    from elmo_tf.pretrain import evaluate_perplexity, load_model_dir

    try:
        model, vocab = load_model_dir(args.model)
    except ValueError as e:
        parser.error(f"--model: {e}")
    with tqdm(unit="sent", file=sys.stderr, desc="evaluate") as bar:
        result = evaluate_perplexity(
            model, vocab, [args.test], batch_size=args.batch_size, max_tokens=args.max_tokens, progress=bar.update
        )
    result.update(model=args.model, test=args.test)
    text = json.dumps(result, indent=2)
    print(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
