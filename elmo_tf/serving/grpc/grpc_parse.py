"""Request messages of the gRPC front (`grpc_front`), parsed off its event loop and with their parsing cost bounded
before the parse starts, from the wire bytes alone.

Why: protobuf's parser (upb) holds the GIL for the whole parse of a message, and its cost grows with the message's
entries far more than with its bytes (on a 2-core machine: 20-100 ns per map entry or string, 25 ns per shape
dimension, 6 ns per unpacked number, 4 ns per packed varint, 0.35 ns per byte of a string's contents). One 60 MB
PredictRequest of 20M one-byte strings holds the GIL for 0.5-3 s, on whichever thread parses it: parsed on the
event loop, it stopped every other call of the server for that long (issue 38: 1.44 s for another client's
GetModelStatus), and another thread would stop the loop as well, through the GIL. So:

    - a message of at most `INLINE_PARSE_BYTES` is parsed on the loop at once (at most one entry per 2 bytes: well
      under a millisecond);
    - a larger one goes to a pool of `PARSE_THREADS` threads, where its entries are counted first by a walk over the
      wire format (`count_entries`: Python, which gives the GIL back every few milliseconds, and stops as soon as the
      count passes the limit: 0.25 us an entry, 17 ms at most at the default limits), and the message is refused
      above `ParseLimits.max_entries` (RESOURCE_EXHAUSTED, naming the limit and the flag it follows from) before
      upb sees it. Its parse then holds the GIL for at most max_entries x 100 ns (7 ms at the default limits) plus
      its bytes at memory speed (21 ms for 60 MB, 90 ms at the default 256 MiB `max_message_bytes`).

An entry is one field of the wire format (a value of a repeated field, a map entry, a submessage, a scalar), at any
depth; a packed run of varints counts one entry per 8 bytes (upb decodes them some 20 x faster than it makes a
string entry), a packed run of fixed-width numbers (`float_val`, `double_val`) and any string's contents count by
their bytes only, which `max_message_bytes` bounds. What a request can need (`ParseLimits.from_limits`) follows from
the request budget (`budget.Limits`): an input holds at most one value per token of work (the padded input's rows x
width and the `packed` signature's positions are held to `max_request_tokens`), so 4 entries per token (tokens,
`table_rows`, `starts` as unpacked entries at worst, and one more) and `ENTRY_SLACK` more (model spec, map entries,
shape dimensions, output filter) cover every request the signatures of this library's exports accept (a `tokens`
request of 64 x 256 tokens, the most at the default limits, holds 16,404 entries); what may be refused here is a
request no budget would accept, or Classify, Regress and MultiInference requests of very many tf.Example values
(the server never reads them: it answers those methods from the model spec and the signature, `inference`).

What is left on the loop is gRPC's own copy of a received message into a bytes object (grpc.aio's
`ReceiveMessageOperation`, slice by slice, before any of this runs): about 1 ms per MB on a 2-core machine,
bounded by `max_message_bytes`.

A message the parser refuses (malformed) is INTERNAL, as gRPC's C++ server (stock TF Serving's) answers a request
it cannot parse (grpcpp/impl/generic_serialize.h: `Status(StatusCode::INTERNAL, ...)`).
"""

import dataclasses
import threading

import grpc
from google.protobuf import descriptor as descriptor_module
from google.protobuf.message import DecodeError

from elmo_tf.serving.limits.byte_units import KiB, size_text
from elmo_tf.serving.serving_error import ServingError, resource_exhausted
from elmo_tf.serving.signature import STRING_ELEMENT_BYTES

INLINE_PARSE_BYTES = 16 * KiB  # messages up to this size are parsed on the event loop (at most 8,192 entries)
# Parsing holds the GIL (upb) and the entry count is Python: two parses never run at once in one process, so more
# threads add no throughput. Two let the next large message's count start (interleaved at the GIL's switches) while
# one is parsed; the messages waiting for them are bounded by the working places each holds (`grpc_front`).
PARSE_THREADS = 2
ENTRY_SLACK = 4096  # entries besides the inputs' values: model spec, map entries, shape dimensions, output filter
ENTRIES_PER_TOKEN = 4  # the `packed` signature's tokens, table_rows and starts hold one value per position each
PACKED_VARINT_BYTES_PER_ENTRY = 8


@dataclasses.dataclass(frozen=True)
class ParseLimits:
    """The most entries (see the module docstring) one request message may hold, and the flag it derives from.

    Args:
        max_entries: entries of one message; a message with more is refused before it is parsed.
        source: how `max_entries` follows from the server's flags, for the refusal's message.
    """

    max_entries: int
    source: str

    @classmethod
    def from_limits(cls, limits):
        """`ENTRIES_PER_TOKEN` x the most values one input of a request may hold + `ENTRY_SLACK`: the values are
        `limits.max_request_tokens`; without it, max_request_sentences x max_tokens_per_sentence; without that
        either, the strings `max_request_bytes` can count (`STRING_ELEMENT_BYTES` each)."""
        if limits.max_request_tokens is not None:
            values, source = limits.max_request_tokens, f"--max_request_tokens {limits.max_request_tokens}"
        elif limits.max_tokens_per_sentence is not None:
            values = limits.max_request_sentences * limits.max_tokens_per_sentence
            source = (
                f"--max_request_sentences {limits.max_request_sentences} x --max_tokens_per_sentence "
                f"{limits.max_tokens_per_sentence}"
            )
        else:
            values = limits.max_request_bytes // STRING_ELEMENT_BYTES
            source = f"--max_message_bytes {limits.max_request_bytes} / {STRING_ELEMENT_BYTES}"
        values = max(values, limits.max_request_sentences)
        return cls(ENTRIES_PER_TOKEN * values + ENTRY_SLACK, f"{ENTRIES_PER_TOKEN} x {source} + {ENTRY_SLACK}")


# ------------------------------------------------------------------------------------------------ the wire format

_PACKED_VARINTS = object()  # a repeated varint-encoded field: its packed form holds up to one value per byte
_VARINT_TYPES = frozenset(
    getattr(descriptor_module.FieldDescriptor, f"TYPE_{name}")
    for name in ("INT32", "INT64", "UINT32", "UINT64", "SINT32", "SINT64", "BOOL", "ENUM")
)
_LAYOUTS = {}  # message full name -> its layout (`_layout`), built under `_LAYOUTS_LOCK`
_LAYOUTS_LOCK = threading.Lock()
_MAX_VARINT_BYTES = 10


def _is_repeated(field):
    if hasattr(type(field), "is_repeated"):  # newer protobuf, where `label` is deprecated
        return field.is_repeated
    return field.label == field.LABEL_REPEATED


def _layout(descriptor):
    """{field number: the layout of its message type (a dict), or `_PACKED_VARINTS`} of the fields of `descriptor`
    whose length-delimited form holds entries; other fields (strings, bytes, fixed-width numbers) are skipped by
    their length. Recursive types share one dict; a layout is seen by other threads only once it is whole."""
    layout = _LAYOUTS.get(descriptor.full_name)
    if layout is not None:
        return layout
    with _LAYOUTS_LOCK:
        built = {}
        layout = _build_layout(descriptor, built)
        for name, fields in built.items():
            _LAYOUTS.setdefault(name, fields)
        return _LAYOUTS[descriptor.full_name]


def _build_layout(descriptor, built):
    layout = _LAYOUTS.get(descriptor.full_name)
    if layout is None:
        layout = built.get(descriptor.full_name)
    if layout is None:
        layout = built[descriptor.full_name] = {}
        for field in descriptor.fields:
            if field.message_type is not None:
                layout[field.number] = _build_layout(field.message_type, built)
            elif _is_repeated(field) and field.type in _VARINT_TYPES:
                layout[field.number] = _PACKED_VARINTS
    return layout


def _varint(data, pos):
    """(value, next position) of the varint at `pos`; IndexError past the end or after `_MAX_VARINT_BYTES`."""
    value = shift = 0
    for at in range(pos, pos + _MAX_VARINT_BYTES):
        byte = data[at]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at + 1
        shift += 7
    raise IndexError("varint too long")


def count_entries(data, descriptor, limit):
    """The entries of message `data` of type `descriptor` (see the module docstring), counted without parsing it, in
    Python: at most `limit` + 1 steps (the count stops once above `limit`: a hostile message costs no more). A
    malformed message stops the count where it breaks: upb refuses it, having parsed fewer entries than counted.

    Returns:
        the entries counted: the message's, or a number above `limit`.
    """
    layout = _layout(descriptor)
    count, pos, end, outer = 0, 0, len(data), []
    try:
        while True:
            if pos >= end:
                if not outer or pos > end:
                    return count
                end, layout = outer.pop()
                continue
            key = data[pos]
            pos += 1
            if key >= 0x80:
                key, pos = _varint(data, pos - 1)
            count += 1
            if count > limit:
                return count
            wire = key & 7
            if wire == 2:
                length, pos = _varint(data, pos)
                kind = layout.get(key >> 3)
                if kind is None:
                    pos += length
                elif kind is _PACKED_VARINTS:
                    count += length // PACKED_VARINT_BYTES_PER_ENTRY
                    pos += length
                else:
                    if pos + length > end:
                        return count
                    outer.append((end, layout))
                    end, layout = pos + length, kind
            elif wire == 0:
                _, pos = _varint(data, pos)
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            elif wire not in (3, 4):  # 3, 4: a group's start and end; its fields are counted as they come
                return count
    except IndexError:
        return count


# ------------------------------------------------------------------------------------------------ parsing


def parse_error(message_class):
    """INTERNAL for a request message upb cannot parse (grpcpp/impl/generic_serialize.h)."""
    return ServingError(
        grpc.StatusCode.INTERNAL, f"Failed to parse the request message as {message_class.DESCRIPTOR.full_name}"
    )


def parse(data, message_class, limits):
    """`message_class` parsed from `data`, its entries counted first when it is above `INLINE_PARSE_BYTES` and may
    hold more than `limits.max_entries` (2 bytes at least per entry).

    Args:
        data: the serialized message (bytes).
        message_class: a generated protobuf message class.
        limits: `ParseLimits`.
    Raises:
        ServingError: RESOURCE_EXHAUSTED above `limits.max_entries`, INTERNAL when upb cannot parse it.
    """
    if len(data) > 2 * limits.max_entries:
        count = count_entries(data, message_class.DESCRIPTOR, limits.max_entries)
        if count > limits.max_entries:
            raise resource_exhausted(
                f"the request message ({size_text(len(data))}) holds more than {limits.max_entries} protobuf "
                f"entries (values of repeated fields, map entries, submessages), above the server's limit of "
                f"{limits.max_entries} per request ({limits.source}): send fewer values per request"
            )
    try:
        return message_class.FromString(data)
    except DecodeError:
        raise parse_error(message_class) from None


def parses_inline(data, limits):
    """Whether `data` is parsed on the event loop: small enough that upb holds the GIL for well under a
    millisecond, and too small to need its entries counted."""
    return len(data) <= min(INLINE_PARSE_BYTES, 2 * limits.max_entries)
