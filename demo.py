"""`make demo`: the whole job end to end, each step through the project's own command-line tools.

  1. data      writes demo text and NER files itself (demo_data.py), or reads real corpora with --data DIR
  2. vocab     training/build_vocab.py
  3. pretrain  training/pretrain.py: a small biLM (sampled softmax, checkpoints, held-out perplexity)
  4. export    export/export_savedmodel.py: versioned SavedModel (signatures default/serving_default/tokens)
  5. serve     serving/serve.py on 127.0.0.1 (the embedded server, or tensorflow_model_server if installed)
  6. check     gRPC (ElmoClient) and REST (ElmoRestClient) answers == the biLM run in this process
  7. ner       training/train_ner.py --elmo-server: the biLSTM-CRF head on features fetched over gRPC
  8. tag       training/tag.py --elmo-server: tags new sentences through the server
  9. stop      the server is shut down (also on errors and Ctrl-C)

--data DIR runs the same pipeline on real corpora laid out as ../shared/data: DIR/pretrain/*.txt (one sentence
per line) for the biLM, DIR/conll2003/eng.{train,testa,testb} for NER. Budgets (--pretrain-steps,
--ner-epochs, --max-sentences) keep it bounded; raise them for real models.
"""

import argparse
import codecs
import glob
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MARKER = ".elmo_tf_demo"
CHILD_ENV = "ELMO_TF_DEMO_CHILD"
DEMO_CONFIG = {
    "lstm": {
        "dim": 256,
        "projection_dim": 64,
        "n_layers": 2,
        "cell_clip": 3.0,
        "proj_clip": 3.0,
        "use_skip_connections": True,
    },
    "char_cnn": {
        "embedding": {"dim": 16},
        "filters": [[1, 32], [2, 32], [3, 64], [4, 64], [5, 64]],
        "n_highway": 1,
        "activation": "relu",
        "max_characters_per_token": 50,
        "n_characters": 262,
    },
}
TAG_SENTENCES = [
    "Ingrid Andersen met officials from Samsung in Prague on Monday .",
    "The Swedish government rejected the plan proposed by Kofi Mensah .",
    "Shares of Philips rose after the company signed a deal with the United Nations .",
]
# The entities of TAG_SENTENCES, each "text [TYPE]" as step 8 prints them. Their names are in none of the files
# demo_data.py writes (tests/test_demo.py checks): the tagger finds them from context and spelling.
EXPECTED_SPANS = [
    "Ingrid Andersen [PER], Samsung [ORG], Prague [LOC]",
    "Swedish [MISC], Kofi Mensah [PER]",
    "Philips [ORG], United Nations [ORG]",
]


NOISE = re.compile(
    r"^([IWE]\d{4} [\d:.]+ +\d+ \S+:\d+\]|WARNING: All log messages before absl|"
    r"To enable the following instructions:)"
)


def pass_through(stream, sink):
    """Copies a tool's output to `sink` as it comes, minus TensorFlow's C++ start-up notices (oneDNN, CUDA, CPU
    features), which TF_CPP_MIN_LOG_LEVEL does not silence in TF 2.21. Whole lines are filtered; a partial line
    holding a carriage return is a progress bar redrawing itself and is shown at once."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    pending = ""
    while True:
        chunk = os.read(stream.fileno(), 65536)
        pending += decoder.decode(chunk, final=not chunk)
        *lines, pending = pending.split("\n")
        for line in lines:
            if not NOISE.match(line.lstrip("\r")):
                sink.write(line + "\n")
        if "\r" in pending or not chunk:
            if not NOISE.match(pending):
                sink.write(pending)
            pending = ""
        sink.flush()
        if not chunk:
            return


def run_filtered(argv):
    """Runs the demo in a child process (this script again) and shows its output through `pass_through`:
    the demo's own TensorFlow import prints the same notices. Ctrl-C reaches the child, which stops the server."""
    env = dict(os.environ, **{CHILD_ENV: "1"})
    child = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__)] + list(argv),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        pass_through(child.stdout, sys.stderr)
        return child.wait()
    finally:
        signal.signal(signal.SIGINT, previous)


def shown(cmd):
    """A command as echoed to the user: paths inside the repository relative to it."""
    return " ".join(os.path.relpath(c, HERE) if c.startswith(HERE + os.sep) else c for c in cmd)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_parser():
    p = argparse.ArgumentParser(
        description="The elmo_tf pipeline end to end: pretrain -> export -> serve -> NER over gRPC -> tag.",
        epilog=__doc__.split("\n\n", 1)[1]
        + """
examples:
  python demo.py                                   # demo data written by the project, about 2 min on 2 cores
  python demo.py --data ../shared/data             # real corpora (5M-token pretraining text, CoNLL-2003)
  python demo.py --data ../shared/data --pretrain-steps 3000 --ner-epochs 10 --max-sentences 0
  make demo DATA=../shared/data                    # the same through make""",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", default="demo_out", help="where everything is written (demo_out; replaced on rerun)")
    p.add_argument("--data", default=None, help="real corpora: DIR/pretrain/*.txt and DIR/conll2003/")
    p.add_argument("--pretrain-steps", type=int, default=None, help="biLM steps (600 demo data, 400 with --data)")
    p.add_argument("--ner-epochs", type=int, default=None, help="NER epochs (12 demo data, 3 with --data)")
    p.add_argument("--max-sentences", type=int, default=None, help="NER sentences per split with --data (2000; 0: all)")
    p.add_argument("--threads", type=int, default=0, help="TF threads for every step (0: TensorFlow's default)")
    return p


class Demo:
    def __init__(self, args, log):
        self.args, self.log, self.server = args, log, None
        self.env = dict(
            os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", "")
        )
        if args.threads:
            self.env["TF_NUM_INTRAOP_THREADS"] = self.env["TF_NUM_INTEROP_THREADS"] = str(args.threads)

    def run(self, step, what, cmd, **kwargs):
        """Runs one tool, its progress on this terminal; a failure stops the demo naming the command."""
        self.log.info("%s %s", step, what)
        self.log.info("    $ %s", shown(cmd))
        proc = subprocess.run(cmd, cwd=HERE, env=self.env, **kwargs)
        if proc.returncode != 0:
            if kwargs.get("capture_output"):
                sys.stderr.write(proc.stderr or "")
            raise SystemExit(f"demo: step {step} failed (exit {proc.returncode}): {' '.join(cmd)}")
        return proc

    def start_server(self, base, port, rest_port):
        cmd = [
            sys.executable,
            os.path.join(HERE, "serving", "serve.py"),
            "--model_base_path",
            base,
            "--model_name",
            "elmo",
            "--port",
            str(port),
            "--rest_api_port",
            str(rest_port),
            "--host",
            "127.0.0.1",
            "--embedded",  # the demo runs the embedded server even where tensorflow_model_server is installed
        ]
        self.log.info("5/9 starting the model server on 127.0.0.1:%d (gRPC), :%d (REST)", port, rest_port)
        self.log.info("    $ %s", shown(cmd[1:]))
        self.server_log = open(os.path.join(self.args.out, "server.log"), "w")
        self.server = subprocess.Popen(
            cmd, cwd=HERE, env=self.env, stdout=self.server_log, stderr=subprocess.STDOUT, start_new_session=True
        )
        from elmo_tf.serving.client import ElmoClient, ServingError

        deadline = time.monotonic() + 180
        with ElmoClient(f"127.0.0.1:{port}", model_name="elmo", timeout=10) as client:
            while True:
                if self.server.poll() is not None:
                    raise SystemExit(
                        f"demo: the model server exited ({self.server.returncode}); see {self.server_log.name}"
                    )
                try:
                    status = client.wait_for_model(timeout=5)
                    break
                except ServingError:
                    if time.monotonic() > deadline:
                        raise SystemExit(
                            f"demo: the model server did not load the model in 180 s; see {self.server_log.name}"
                        ) from None
        self.log.info("    model 'elmo' version %s AVAILABLE", status[0]["version"])

    def stop_server(self):
        if self.server is None or self.server.poll() is not None:
            return
        self.log.info("9/9 stopping the model server")
        self.server.send_signal(signal.SIGTERM)
        try:
            code = self.server.wait(timeout=30)
            self.log.info("    server exited with status %d", code)
        except subprocess.TimeoutExpired:
            self.log.warning("    server did not stop in 30 s: killing it")
            os.killpg(self.server.pid, signal.SIGKILL)
            self.server.wait()
        self.server_log.close()


def prepare_out(out, parser):
    """A fresh output dir: created, or emptied when it is a previous demo's (it holds the marker file)."""
    if os.path.exists(out):
        if not os.path.isdir(out):
            parser.error(f"--out: {out!r} exists and is not a directory")
        if os.listdir(out) and not os.path.exists(os.path.join(out, MARKER)):
            parser.error(f"--out: {out!r} is not empty and was not written by the demo; choose another directory")
        shutil.rmtree(out)
    os.makedirs(out)
    open(os.path.join(out, MARKER), "w").close()


def checked_args(parser, argv):
    """The parsed flags, with the files of --data: `(args, lm_files, ner)` (parser.error on a bad value)."""
    args = parser.parse_args(argv)
    for flag in ("pretrain_steps", "ner_epochs"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')}: must be >= 1, got {getattr(args, flag)}")
    if args.max_sentences is not None and args.max_sentences < 0:
        parser.error(f"--max-sentences: must be >= 0, got {args.max_sentences}")
    lm_files, ner = [], []
    if args.data:
        lm_files = sorted(glob.glob(os.path.join(args.data, "pretrain", "*.txt")))
        ner = [os.path.join(args.data, "conll2003", f"eng.{s}") for s in ("train", "testa", "testb")]
        if not lm_files:
            parser.error(f"--data: no pretrain/*.txt under {args.data!r}")
        for path in ner:
            if not os.path.isfile(path):
                parser.error(f"--data: {path!r} does not exist")
    return args, lm_files, ner


def step_data(args, lm_files, ner, log):
    """Step 1: the pretraining text and the NER files (--data's, or the demo's written under --out): a dict of
    `lm_train`, `lm_valid` (None with --data), `ner_train`, `ner_dev`, `ner_test`."""
    if args.data:
        lm_train = os.path.join(args.data, "pretrain", "*.txt")
        log.info("1/9 data: pretraining text %s (%d files); NER %s", lm_train, len(lm_files), os.path.dirname(ner[0]))
        return dict(lm_train=lm_train, lm_valid=None, ner_train=ner[0], ner_dev=ner[1], ner_test=ner[2])
    import demo_data

    paths = demo_data.write_demo_data(os.path.join(args.out, "data"))
    log.info(
        "1/9 data: wrote demo text and NER files (PER/LOC/ORG/MISC; test names unseen in training, "
        "step 8's names in no file) under %s",
        os.path.join(args.out, "data"),
    )
    return {name: paths[name] for name in ("lm_train", "lm_valid", "ner_train", "ner_dev", "ner_test")}


def step_pretrain(demo, args, data, steps, log):
    """Steps 2 and 3: the vocabulary and the pretrained biLM; its directory."""
    py, out = sys.executable, args.out
    vocab = os.path.join(out, "vocab.txt")
    min_count = "3" if args.data else "2"  # demo data: made-up names once -> <UNK>
    cmd = [py, "training/build_vocab.py", "--train", data["lm_train"], "--output", vocab, "--min-count", min_count]
    demo.run("2/9", "building the vocabulary", cmd)
    config = os.path.join(out, "bilm_options.json")
    with open(config, "w") as f:
        json.dump(DEMO_CONFIG, f, indent=2)
    bilm = os.path.join(out, "bilm")
    cmd = [py, "training/pretrain.py", "--train", data["lm_train"], "--vocab", vocab, "--config", config]
    cmd += ["--output", bilm, "--steps", str(steps), "--batch-size", "32", "--num-sampled", "512"]
    cmd += ["--checkpoint-every", "200", "--log-every", "50"]
    if data["lm_valid"]:
        cmd += ["--valid", data["lm_valid"]]
    demo.run("3/9", f"pretraining a {DEMO_CONFIG['lstm']['n_layers']}-layer biLM ({steps} steps)", cmd)
    with open(os.path.join(bilm, "metrics.json")) as f:
        metrics = json.load(f)
    if "valid" in metrics:
        valid = metrics["valid"]
        log.info("    held-out perplexity forward %.1f, backward %.1f", valid["forward"], valid["backward"])
    return bilm


def step_ner(demo, args, data, port, epochs, max_sentences, log):
    """Step 7: the NER head trained on ELMo features fetched from the server on `port`; its directory."""
    ner_dir = os.path.join(args.out, "ner")
    cmd = [sys.executable, "training/train_ner.py", "--train", data["ner_train"], "--dev", data["ner_dev"]]
    cmd += ["--test", data["ner_test"], "--elmo-server", f"127.0.0.1:{port}", "--model-name", "elmo"]
    cmd += ["--output", ner_dir, "--epochs", str(epochs), "--patience", str(epochs)]
    cmd += ["--cache", os.path.join(args.out, "ner_features.h5")]
    if max_sentences:
        cmd += ["--max-sentences", str(max_sentences)]
    demo.run("7/9", "training the NER head on ELMo features fetched over gRPC", cmd)
    with open(os.path.join(ner_dir, "metrics.json")) as f:
        metrics = json.load(f)
    log.info(
        "    dev span F1 %.1f, test span F1 %.1f (best epoch %d)",
        metrics["dev"]["f1"],
        metrics["test"]["f1"],
        metrics["best_epoch"],
    )
    return ner_dir


def step_tag(demo, out, ner_dir, port, log):
    """Step 8: TAG_SENTENCES tagged through the server, written to tagged.jsonl and logged."""
    cmd = [sys.executable, "training/tag.py", "--model", ner_dir, "--elmo-server", f"127.0.0.1:{port}"]
    cmd += ["--format", "json", "--quiet"]
    sentences = "\n".join(TAG_SENTENCES) + "\n"
    tagged = demo.run(
        "8/9", "tagging new sentences through the server", cmd, input=sentences, capture_output=True, text=True
    )
    with open(os.path.join(out, "tagged.jsonl"), "w") as f:
        f.write(tagged.stdout)
    for line in tagged.stdout.splitlines():
        result = json.loads(line)
        log.info("    %s\n        -> %s", " ".join(result["tokens"]), span_line(result))


def main(argv=None):
    parser = build_parser()
    args, lm_files, ner = checked_args(parser, argv)
    steps = args.pretrain_steps or (400 if args.data else 600)
    epochs = args.ner_epochs or (3 if args.data else 12)
    max_sentences = (2000 if args.max_sentences is None else args.max_sentences) if args.data else 0
    if os.environ.get(CHILD_ENV) != "1":
        prepare_out(args.out, parser)
        return run_filtered(sys.argv[1:] if argv is None else argv)
    args.out = os.path.abspath(args.out)
    logging.basicConfig(
        level=logging.INFO, format="[demo %(asctime)s] %(message)s", datefmt="%H:%M:%S", stream=sys.stderr
    )
    log = logging.getLogger("demo")
    demo = Demo(args, log)
    start = time.perf_counter()
    out = args.out
    try:
        data = step_data(args, lm_files, ner, log)
        bilm = step_pretrain(demo, args, data, steps, log)
        models = os.path.join(out, "models", "elmo")
        cmd = [sys.executable, "export/export_savedmodel.py", "--model-dir", bilm, "--output", models]
        demo.run("4/9", "exporting the SavedModel for TF Serving", cmd)
        port, rest_port = free_port(), free_port()
        demo.start_server(models, port, rest_port)
        check_served(log, bilm, port, rest_port)
        ner_dir = step_ner(demo, args, data, port, epochs, max_sentences, log)
        step_tag(demo, out, ner_dir, port, log)
    finally:
        demo.stop_server()
    log.info("done in %.1f min. Written under %s:", (time.perf_counter() - start) / 60, out)
    for name, what in (
        ("bilm/", "the biLM: options.json + weights.hdf5 (bilm-tf layout), vocab, checkpoints, log"),
        ("models/elmo/1/", "the SavedModel TF Serving loads"),
        ("ner/", "the NER head: model.keras, encoder.json, metrics.json"),
        ("tagged.jsonl", "tags of the example sentences"),
        ("server.log", "the model server's log"),
    ):
        log.info("    %-16s %s", name, what)
    return 0


def span_line(result):
    """One tagged sentence's entities as step 8 prints them: "Ingrid Andersen [PER], Samsung [ORG], ..."."""
    return ", ".join(f"{s['text']} [{s['type']}]" for s in result["spans"]) or "(no entities)"


def check_served(log, bilm, port, rest_port):
    """Served vectors (gRPC and REST) == the same weights run in this process."""
    import numpy as np

    from elmo_tf import load_elmo
    from elmo_tf.preprocessing import tokens_to_char_ids_numpy
    from elmo_tf.serving.client import ElmoClient
    from elmo_tf.serving.rest_client import ElmoRestClient

    sentences = TAG_SENTENCES[:2]
    elmo = load_elmo(os.path.join(bilm, "options.json"), os.path.join(bilm, "weights.hdf5"))
    with ElmoClient(f"127.0.0.1:{port}", model_name="elmo") as grpc_client:
        served = grpc_client.embed(sentences, output_filter=["elmo", "mask"])
    rest = ElmoRestClient(f"http://127.0.0.1:{rest_port}", model_name="elmo")
    try:
        rested = rest.embed(sentences, output_filter=["elmo"])
    finally:
        rest.close()
    worst = 0.0
    for i, sentence in enumerate(sentences):
        tokens = sentence.split()
        alone = elmo(tokens_to_char_ids_numpy(tokens)[None])["elmo"][0].numpy()
        for answer in (served, rested):
            worst = max(worst, float(np.abs(np.asarray(answer["elmo"])[i, : len(tokens)] - alone).max()))
    log.info(
        "6/9 gRPC and REST answers vs the biLM in this process: max |diff| %.1e over %d sentences (shape %s)",
        worst,
        len(sentences),
        tuple(served["elmo"].shape),
    )
    if worst > 1e-4:
        raise SystemExit(f"demo: served vectors differ from in-process vectors by {worst:.2e}")


if __name__ == "__main__":
    sys.exit(main())
