"""Tokens of a sentences input as the signature's own tokenizer makes them, counted before the model runs (the request
budget's tokens of work: `budget.RequestBudget`).

The tokenizer is read from the SavedModel: the op types a signature reaches (`signature_op_types`: its output nodes,
their inputs, and the functions they call) tell a `--tokenizer unicode_script` export (tensorflow-text's
UnicodeScriptTokenizeWithOffsets) from a whitespace one (`tf.strings.split`).

    WhitespaceCounter      runs of ASCII whitespace, counted in Python without building tokens (exact for
                           `tf.strings.split`; `count_tokens`)
    UnicodeScriptCounter   tensorflow-text's UnicodeScriptTokenizer itself, on the request's sentences: punctuation
                           and script changes split tokens too ("a,a," is 4 tokens)

Counting is cheap and bounded: sentences go to the op in batches of about `CHUNK_BYTES`, a longer sentence in pieces
cut at ASCII whitespace (or, in a piece without any, at a character boundary: at most one token more per cut), and
counting stops as soon as one sentence passes the largest count the budget allows (`bound`).
"""

import logging

logger = logging.getLogger(__name__)

UNICODE_SCRIPT_OPS = frozenset({"UnicodeScriptTokenizeWithOffsets"})
CHUNK_BYTES = 1 << 20

# bytes.split()'s whitespace (ASCII space, \t, \n, \v, \f, \r) -> b" ", every other byte -> b"x"
_TOKEN_MAP = bytes(32 if b in b" \t\n\x0b\x0c\r" else 120 for b in range(256))
_WHITESPACE = b" \t\n\x0b\x0c\r"


def count_tokens(sentence):
    """len(`split_tokens(sentence)`) for `bytes`, without building the tokens: a 100 MB sentence of one-letter
    words would be 50 million bytes objects; this reads it in 1 MiB chunks."""
    count, previous = 0, b" "
    for start in range(0, len(sentence), CHUNK_BYTES):
        part = previous + sentence[start : start + CHUNK_BYTES].translate(_TOKEN_MAP)
        count += part.count(b" x")  # a token starts where a non-space follows a space (or the start)
        previous = part[-1:]
    return count


def _function_refs(node):
    for attr in node.attr.values():
        if attr.HasField("func"):
            yield attr.func.name
        yield from (f.name for f in attr.list.func)


def signature_op_types(meta_graph, signature_def):
    """The op types `signature_def` reaches in `meta_graph` (a MetaGraphDef): its output nodes, their inputs, and
    every function they call (attributes holding functions, functions called as ops), without recursion."""
    graph = meta_graph.graph_def
    nodes = {node.name: node for node in graph.node}
    functions = {f.signature.name: f for f in graph.library.function}
    ops, seen, called = set(), set(), []
    pending = [info.name.split(":")[0] for info in signature_def.outputs.values()]
    while pending:
        name = pending.pop()
        if name in seen or name not in nodes:
            continue
        seen.add(name)
        node = nodes[name]
        ops.add(node.op)
        pending.extend(i.lstrip("^").split(":")[0] for i in node.input)
        called.extend(_function_refs(node))
    done = set()
    while called:
        name = called.pop()
        if name in done or name not in functions:
            continue
        done.add(name)
        for node in functions[name].node_def:
            ops.add(node.op)
            called.extend(_function_refs(node))
            if node.op in functions:
                called.append(node.op)
    return ops


class WhitespaceCounter:
    """Runs of ASCII whitespace, as `tf.strings.split` (and `elmo_tf.preprocessing.tokenizer.split_tokens`)."""

    name = "whitespace"

    def counts(self, sentences, bound=None):
        """(token counts of `sentences` (bytes), the index of a sentence counted only in part, here None)."""
        del bound
        return [count_tokens(s) for s in sentences], None


def _pieces(sentence, size=None):
    """`sentence` cut into pieces of at most `size` bytes (`CHUNK_BYTES`), at ASCII whitespace where the piece has
    any, else at a character boundary (never before a UTF-8 continuation byte)."""
    size = size or CHUNK_BYTES
    start = 0
    while len(sentence) - start > size:
        end = start + size
        cut = max(sentence.rfind(c, start, end) for c in _WHITESPACE)
        if cut <= start:
            cut = end
            while cut > start + 1 and 0x80 <= sentence[cut] < 0xC0:  # not inside a character
                cut -= 1
        yield sentence[start:cut]
        start = cut
    yield sentence[start:]


class UnicodeScriptCounter:
    """tensorflow-text's UnicodeScriptTokenizer (the op a `--tokenizer unicode_script` export runs)."""

    name = "unicode_script"

    def __init__(self):
        import tensorflow_text  # registers the op

        self._tokenizer = tensorflow_text.UnicodeScriptTokenizer()

    def _count(self, pieces):
        import tensorflow as tf

        return self._tokenizer.tokenize(tf.constant(pieces, dtype=tf.string)).row_lengths().numpy().tolist()

    def counts(self, sentences, bound=None):
        """(token counts of `sentences` (bytes), the index of a sentence whose count passed `bound` before it was
        all read, or None). Counting stops at the first sentence found above `bound` (None: no bound)."""
        counts = [0] * len(sentences)
        batch, owners, size = [], [], 0

        def flush():
            for owner, count in zip(owners, self._count(batch) if batch else []):
                counts[owner] += count
            batch.clear()
            owners.clear()
            if bound is not None:
                return next((k for k, c in enumerate(counts) if c > bound), None)
            return None

        for k, sentence in enumerate(sentences):
            for piece in _pieces(bytes(sentence)):
                batch.append(piece)
                owners.append(k)
                size += len(piece)
                if size >= CHUNK_BYTES:
                    size = 0
                    over = flush()
                    if over is not None:
                        return counts[: over + 1], over
        over = flush()
        if over is not None:
            return counts[: over + 1], None
        return counts, None


def token_counter(op_types):
    """The counter of a signature that reaches `op_types`."""
    if op_types & UNICODE_SCRIPT_OPS:
        return UnicodeScriptCounter()
    return WhitespaceCounter()
