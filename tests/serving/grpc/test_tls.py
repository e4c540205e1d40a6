"""gRPC over TLS (`--ssl_config_file`, elmo_tf.serving.options.SslConfig) with certificates made at test time by
trustme and real handshakes on 127.0.0.1: a client trusting the server's CA is served; a plaintext client, a client
trusting another CA, and under mutual TLS (`client_verify: true`) a client without a certificate or with one another
CA signed are all refused. The SSLConfig text proto holds PEM contents, as stock reads it
(`BuildServerCredentials` in tensorflow_serving/model_servers/server.cc)."""

import subprocess
import sys

import grpc
import pytest
import trustme
from cli_testlib import assert_one_error
from serving_testlib import SERVE, start_server

from elmo_tf.serving.client import ElmoClient, tls_credentials
from elmo_tf.serving.config_files import parse_ssl_config
from elmo_tf.serving.serving_error import ServingError


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, the server's certificate for 127.0.0.1, a client certificate of the same CA, and a stranger CA's."""
    root = tmp_path_factory.mktemp("pki")
    ca, stranger = trustme.CA(), trustme.CA()
    server, client = ca.issue_cert("127.0.0.1", "localhost"), ca.issue_cert("client.example")
    rogue = stranger.issue_cert("client.example")
    files = {}
    for name, blob in (
        ("ca.pem", ca.cert_pem),
        ("stranger.pem", stranger.cert_pem),
        ("server.key", server.private_key_pem),
        ("server.pem", server.cert_chain_pems[0]),
        ("client.key", client.private_key_pem),
        ("client.pem", client.cert_chain_pems[0]),
        ("rogue.key", rogue.private_key_pem),
        ("rogue.pem", rogue.cert_chain_pems[0]),
    ):
        blob.write_to_path(str(root / name))
        files[name] = root / name
    return files


def ssl_config_file(path, pki, client_verify):
    def quoted(name):
        return '"' + pki[name].read_text().replace("\n", "\\n") + '"'

    path.write_text(
        f"server_key: {quoted('server.key')}\nserver_cert: {quoted('server.pem')}\ncustom_ca: {quoted('ca.pem')}\n"
        f"client_verify: {'true' if client_verify else 'false'}\n"
    )
    return str(path)


def embed(port, credentials):
    with ElmoClient(f"127.0.0.1:{port}", "elmo", timeout=30, max_retries=0, credentials=credentials) as c:
        return c.embed(["over TLS"], output_filter=["default"])["default"].shape


def refused(port, credentials):
    with pytest.raises(ServingError) as e:
        embed(port, credentials)
    assert e.value.code == grpc.StatusCode.UNAVAILABLE, e.value
    return e.value


def test_tls_serves_a_client_that_trusts_the_ca_and_refuses_the_others(base_path, pki, tmp_path):
    ssl = parse_ssl_config(ssl_config_file(tmp_path / "ssl.config", pki, client_verify=False))
    server = start_server(base_path, ssl=ssl, rest_api_port=None)
    try:
        assert embed(server.grpc_port, tls_credentials(ca=pki["ca.pem"])) == (1, 64)
        refused(server.grpc_port, None)  # plaintext against TLS: the handshake fails
        refused(server.grpc_port, tls_credentials(ca=pki["stranger.pem"]))  # the server's certificate is not trusted
    finally:
        server.stop(0)


def test_mutual_tls_refuses_a_client_without_a_certificate_of_the_ca(base_path, pki, tmp_path):
    ssl = parse_ssl_config(ssl_config_file(tmp_path / "ssl.config", pki, client_verify=True))
    server = start_server(base_path, ssl=ssl, rest_api_port=None)
    try:
        mine = tls_credentials(ca=pki["ca.pem"], cert=pki["client.pem"], key=pki["client.key"])
        assert embed(server.grpc_port, mine) == (1, 64)
        refused(server.grpc_port, tls_credentials(ca=pki["ca.pem"]))  # no client certificate
        rogue = tls_credentials(ca=pki["ca.pem"], cert=pki["rogue.pem"], key=pki["rogue.key"])
        refused(server.grpc_port, rogue)  # a certificate another CA signed
    finally:
        server.stop(0)


def test_the_ssl_config_is_read_as_stock_reads_it(pki, tmp_path):
    ssl = parse_ssl_config(ssl_config_file(tmp_path / "ok.config", pki, client_verify=True))
    assert ssl.server_key == pki["server.key"].read_bytes() and ssl.client_verify
    assert ssl.custom_ca == pki["ca.pem"].read_bytes()
    config = tmp_path / "bad.config"

    def quoted(name):
        return '"' + pki[name].read_text().replace("\n", "\\n") + '"'

    for text, needle in (
        ("server_key: 'x'\nserver_cert: 'y'\n", "server_key must hold a PEM block"),
        ("client_verify: true\nserver_keys: 'x'\n", "cannot parse"),  # a misspelt field: stock's parser refuses it
        (
            f"server_key: {quoted('server.key')}\nserver_cert: {quoted('server.pem')}\nclient_verify: true\n",
            "client_verify needs custom_ca",
        ),
    ):
        config.write_text(text)
        with pytest.raises(ValueError, match=needle):
            parse_ssl_config(str(config))
    with pytest.raises(ValueError, match="cert and key go together"):
        tls_credentials(ca=pki["ca.pem"], cert=pki["client.pem"])
    with pytest.raises(ValueError, match="ca: cannot read"):
        tls_credentials(ca=tmp_path / "missing.pem")
    (tmp_path / "plain.txt").write_text("not a certificate\n")
    with pytest.raises(ValueError, match="holds no PEM block"):
        tls_credentials(ca=tmp_path / "plain.txt")


def test_serve_refuses_a_bad_ssl_config_file_in_one_line(base_path, tmp_path):
    config = tmp_path / "ssl.config"
    config.write_text("server_key: 'not pem'\nserver_cert: 'not pem'\n")
    result = subprocess.run(
        [sys.executable, SERVE, "--embedded", "--model_base_path", base_path, "--ssl_config_file", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert_one_error(result, 2, "--ssl_config_file", "server_key must hold a PEM block")
