"""The served side of bench/serving_latency.py: a preset's seeded random model exported once into a cache (with TF
Serving's warmup file and the `packed` signature), and `serving/serve.py --embedded` serving it as a subprocess on
free ports, with its Prometheus counters."""

import logging
import os
import shutil
import socket
import subprocess
import sys

from common import REPO

SERVE = os.path.join(REPO, "serving", "serve.py")
MONITORING = os.path.join(REPO, "export", "monitoring.config")  # the Prometheus metrics the runs read

log = logging.getLogger("serving_latency")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_export(preset, seed, cache):
    """`<cache>/<preset>-seed<seed>/elmo` with version 1 (exported once; an export cached before the exports wrote TF
    Serving's warmup file gets it added; one cached before the `packed` signature is exported again)."""
    base = os.path.join(cache, f"{preset}-seed{seed}", "elmo")
    if os.path.isfile(os.path.join(base, "1", "saved_model.pb")):
        from elmo_tf.saved_model.contract import PACKED_SIGNATURE
        from elmo_tf.serving.servable import read_signature_defs

        if PACKED_SIGNATURE not in read_signature_defs(os.path.join(base, "1")):
            log.info("the cached export %s has no %r signature: exported again", base, PACKED_SIGNATURE)
            shutil.rmtree(base)
    if os.path.isfile(os.path.join(base, "1", "saved_model.pb")):
        from elmo_tf.saved_model.export import warmup_requests
        from elmo_tf.saved_model.warmup import warmup_path, write_warmup_requests

        if not os.path.exists(warmup_path(os.path.join(base, "1"))):
            write_warmup_requests(os.path.join(base, "1"), warmup_requests())
        return base
    import keras

    from elmo_tf import ELMo, get_config
    from elmo_tf.saved_model.export import export_elmo

    log.info("exporting a random %s model to %s (once)", preset, base)
    keras.utils.set_random_seed(seed)
    export_elmo(ELMo(get_config(preset)), base, version=1)
    return base


class Server:
    """`serving/serve.py --embedded` as a subprocess on free ports."""

    def __init__(self, base, batching, log_path, extra=(), monitoring=True):
        self.port, self.rest_port = free_port(), free_port()
        self.log_file = open(log_path, "w")
        command = [
            sys.executable,
            SERVE,
            "--embedded",
            "--model_base_path",
            base,
            "--model_name",
            "elmo",
            "--port",
            str(self.port),
            "--rest_api_port",
            str(self.rest_port),
            "--rest_api_num_threads",
            "64",
            f"--enable_batching={'true' if batching else 'false'}",
            *(["--monitoring_config_file", str(MONITORING)] if monitoring else []),
            *extra,
        ]
        log.info("starting %s", " ".join(command))
        self.process = subprocess.Popen(command, stdout=self.log_file, stderr=subprocess.STDOUT)

    def wait(self, timeout):
        from elmo_tf.serving.client import ElmoClient

        with ElmoClient(f"127.0.0.1:{self.port}", "elmo") as client:
            client.wait_for_model(timeout=timeout)

    def metrics(self):
        import urllib.request

        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.rest_port}/monitoring/prometheus/metrics", timeout=10
            ) as r:
                text = r.read().decode()
        except OSError:
            return {}
        totals = {}
        for line in text.splitlines():
            if line.startswith("elmo_serving_") and "_total{" in line:
                name = line.split("{")[0][len("elmo_serving_") : -len("_total")]
                totals[name] = totals.get(name, 0) + int(float(line.split()[-1]))
        return totals

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log_file.close()
