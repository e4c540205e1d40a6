"""Byte sizes: the units the server's limits are given in, and a size as a message shows it; the largest TCP port.

Imports nothing, so the command line (`elmo_tf.cli.serve`) takes its defaults from here without loading TensorFlow.
"""

KiB = 1 << 10
MiB = 1 << 20


def size_text(num_bytes):
    """1536 -> "1.5 KiB", 3 << 20 -> "3.0 MiB"."""
    return f"{num_bytes / MiB:.1f} MiB" if num_bytes >= MiB else f"{num_bytes / KiB:.1f} KiB"


MAX_PORT = 65535  # a TCP port: --port and --rest_api_port are 0 (none; `ServerOptions`: a free port) to this
