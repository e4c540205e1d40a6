"""The NER commands' TLS flags for a feature server (elmo_tf/cli/ner.py `server_credentials`: --elmo-server-ca,
--elmo-server-cert, --elmo-server-key beside --elmo-server): credentials for a server on TLS, and one-line usage errors
naming the flag for a flag without a server, a cert without its key, a missing or non-PEM file. The handshakes
themselves are tests/serving/grpc/test_tls.py's."""

import argparse

import grpc
import pytest
import trustme

from elmo_tf.cli import UsageError
from elmo_tf.cli.ner import server_credentials


def flags(ca=None, cert=None, key=None, server="127.0.0.1:8500"):
    return argparse.Namespace(elmo_server=server, elmo_server_ca=ca, elmo_server_cert=cert, elmo_server_key=key)


@pytest.fixture(scope="module")
def pem(tmp_path_factory):
    root = tmp_path_factory.mktemp("pem")
    ca = trustme.CA()
    client = ca.issue_cert("client.example")
    ca.cert_pem.write_to_path(str(root / "ca.pem"))
    client.cert_chain_pems[0].write_to_path(str(root / "client.pem"))
    client.private_key_pem.write_to_path(str(root / "client.key"))
    (root / "plain.txt").write_text("not a certificate\n")
    return root


def test_no_flags_is_plaintext_and_the_flags_make_tls_credentials(pem):
    args = flags()
    assert server_credentials(args, args.elmo_server) is None
    args = flags(ca=str(pem / "ca.pem"))
    assert isinstance(server_credentials(args, args.elmo_server), grpc.ChannelCredentials)
    args = flags(ca=str(pem / "ca.pem"), cert=str(pem / "client.pem"), key=str(pem / "client.key"))
    assert isinstance(server_credentials(args, args.elmo_server), grpc.ChannelCredentials)


@pytest.mark.parametrize(
    "given, server, needle",
    [
        (dict(ca="ca.pem"), None, "--elmo-server-ca: only with --elmo-server"),
        (dict(cert="client.pem"), "127.0.0.1:1", "--elmo-server-cert: cert and key go together"),
        (dict(ca="missing.pem"), "127.0.0.1:1", "--elmo-server-ca: ca: cannot read"),
        (dict(ca="plain.txt"), "127.0.0.1:1", "--elmo-server-ca: ca: "),
        (dict(ca="ca.pem", cert="client.pem", key="plain.txt"), "127.0.0.1:1", "--elmo-server-key: key: "),
    ],
)
def test_usage_errors_name_the_flag(pem, given, server, needle):
    args = flags(**{k: str(pem / v) for k, v in given.items()}, server=server)
    with pytest.raises(UsageError) as e:
        server_credentials(args, server)
    assert str(e.value).startswith(needle), str(e.value)
