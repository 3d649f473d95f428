"""The two edits of a serialised SentencePiece model that vocabulary extension needs, on the protobuf wire format.

A SentencePiece model is a ``ModelProto`` message: field 1 is the repeated ``SentencePiece`` (piece string = 1,
score float = 2, type enum = 3), field 2 the ``TrainerSpec`` (whose field 3 is the model type). Protobuf parsers
append the elements of a repeated field in the order they appear, wherever in the message they are, so appending
serialised field-1 records to the bytes of a model appends pieces with the next ids and changes nothing else. The
``protobuf`` package (which ``sentencepiece_model_pb2`` needs) is not a dependency for these few lines.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence

NORMAL = 1  # SentencePiece.Type.NORMAL: a piece the segmentation may use
USER_DEFINED = 4  # SentencePiece.Type.USER_DEFINED: always one piece where its text occurs, never split or merged
MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if not byte & 0x80:
            return value, i


def _fields(data: bytes) -> Iterator[tuple[int, int, bytes | int]]:
    """``(field number, wire type, value)`` of a message: bytes for length-delimited fields, else the integer."""
    i = 0
    while i < len(data):
        key, i = _read_varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _read_varint(data, i)
            yield number, wire, value
        elif wire == 2:
            size, i = _read_varint(data, i)
            yield number, wire, data[i : i + size]
            i += size
        elif wire == 5:
            yield number, wire, data[i : i + 4]
            i += 4
        elif wire == 1:
            yield number, wire, data[i : i + 8]
            i += 8
        else:
            raise ValueError(f"not a SentencePiece model: wire type {wire} at byte {i}")


def model_type(proto: bytes) -> str:
    """``"unigram"``, ``"bpe"``, ``"word"`` or ``"char"``: the type of a serialised SentencePiece model."""
    for number, _, value in _fields(proto):
        if number == 2 and isinstance(value, bytes):
            for inner, _, kind in _fields(value):
                if inner == 3 and isinstance(kind, int):
                    return MODEL_TYPES.get(kind, "unigram")
    return "unigram"  # the proto default


def piece_record(piece: str, score: float, kind: int = NORMAL) -> bytes:
    """One serialised ``ModelProto.pieces`` element: a piece of type ``kind`` (NORMAL, USER_DEFINED) with ``score``."""
    text = piece.encode("utf-8")
    body = b"\x0a" + _varint(len(text)) + text + b"\x15" + struct.pack("<f", score) + b"\x18" + _varint(kind)
    return b"\x0a" + _varint(len(body)) + body


def append_pieces(proto: bytes, pieces: Sequence[tuple[str, float]], kind: int = NORMAL) -> bytes:
    """``proto`` with ``pieces`` (text, score) of type ``kind`` appended: they get ids ``n, n + 1, ...`` for a model
    of n pieces."""
    return proto + b"".join(piece_record(p, s, kind) for p, s in pieces)
