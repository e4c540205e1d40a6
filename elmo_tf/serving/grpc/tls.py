"""TLS of the gRPC API: TF Serving's SSLConfig (tensorflow_serving/config/ssl_config.proto) as the embedded server
takes it (`--ssl_config_file`, read by `config_files.parse_ssl_config`; `options.ServerOptions.ssl`)."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class SslConfig:
    """TF Serving's SSLConfig (config/ssl_config.proto), PEM contents as stock reads them (`BuildServerCredentials` in
    server.cc): the server's key and certificate chain; `custom_ca`, the CAs client certificates are checked against;
    `client_verify`: a client must present a certificate those CAs signed (mutual TLS)."""

    server_key: bytes
    server_cert: bytes
    custom_ca: bytes = None
    client_verify: bool = False

    def __post_init__(self):
        for name in ("server_key", "server_cert"):
            if not isinstance(getattr(self, name), bytes) or b"-----BEGIN " not in getattr(self, name):
                raise ValueError(f"{name} must hold a PEM block (-----BEGIN ...), got {getattr(self, name)!r:.60}")
        if self.custom_ca is not None and b"-----BEGIN " not in self.custom_ca:
            raise ValueError(f"custom_ca must be None or hold PEM certificates, got {self.custom_ca!r:.60}")
        if self.client_verify and not self.custom_ca:
            raise ValueError("client_verify needs custom_ca: the CAs that client certificates are checked against")

    def credentials(self):
        """The `grpc.ServerCredentials` (TLS 1.2+, client certificates required and verified with client_verify)."""
        import grpc

        return grpc.ssl_server_credentials(
            [(self.server_key, self.server_cert)],
            root_certificates=self.custom_ca,
            require_client_auth=self.client_verify,
        )
