"""Big result records without copies: each output's data as a view of the record's own bytes.

msgpack.unpackb copies every bin into a new bytes object, and _tensor.decode copies that again
into a writable array: for a 960 KB output, two more copies after the socket's, each into fresh
memory the kernel faults in page by page. A record that _resp read straight into a bytearray of
its own (a big bulk reply) needs neither. unpack() finds each output tensor's "data" bin with a
walk over the msgpack (no values decoded), unpacks the rest of the record without those bytes,
and puts writable memoryviews of the record in their place, each moved back a few bytes within
the record, over its own "data" key and bin header, to the alignment of its dtype. The record
is consumed: its bytes belong to the arrays from then on.
"""

import msgpack
import numpy as np

from . import _tensor

# Records shorter than this are unpacked the plain way (the copies cost less than the walk).
MIN_BYTES = 64 * 1024

# Bytes taken by each fixed-size msgpack type, its first byte included.
_FIXED = {0xc0: 1, 0xc2: 1, 0xc3: 1, 0xca: 5, 0xcb: 9, 0xcc: 2, 0xcd: 3, 0xce: 5, 0xcf: 9,
          0xd0: 2, 0xd1: 3, 0xd2: 5, 0xd3: 9, 0xd4: 3, 0xd5: 4, 0xd6: 6, 0xd7: 10, 0xd8: 18}
# Types whose first byte is followed by a k-byte big-endian length, `extra` bytes (an ext's type)
# and that many bytes: (k, extra). Bins are c4-c6.
_SIZED = {0xc4: (1, 0), 0xc5: (2, 0), 0xc6: (4, 0), 0xc7: (1, 1), 0xc8: (2, 1), 0xc9: (4, 1),
          0xd9: (1, 0), 0xda: (2, 0), 0xdb: (4, 0)}
_EMPTY_BIN = b"\xc4\x00"


def _length(buf, pos, k):
    if pos + 1 + k > len(buf):
        raise ValueError("record cut short")
    return int.from_bytes(buf[pos + 1:pos + 1 + k], "big")


def _container(buf, pos):
    """(objects inside, offset of the first, is a map) for the array or map at pos, or None."""
    b = buf[pos]
    if 0x80 <= b <= 0x8f:
        return 2 * (b & 0x0f), pos + 1, True
    if 0x90 <= b <= 0x9f:
        return b & 0x0f, pos + 1, False
    if b in (0xdc, 0xde):
        return (2 if b == 0xde else 1) * _length(buf, pos, 2), pos + 3, b == 0xde
    if b in (0xdd, 0xdf):
        return (2 if b == 0xdf else 1) * _length(buf, pos, 4), pos + 5, b == 0xdf
    return None


def _skip(buf, pos):
    """The offset just past the msgpack object at pos; ValueError or IndexError when the bytes
    are not msgpack."""
    b = buf[pos]
    if b <= 0x7f or b >= 0xe0:  # fixints
        return pos + 1
    if 0xa0 <= b <= 0xbf:  # fixstr
        return pos + 1 + (b & 0x1f)
    n = _FIXED.get(b)
    if n is not None:
        return pos + n
    sized = _SIZED.get(b)
    if sized is not None:
        k, extra = sized
        return pos + 1 + k + extra + _length(buf, pos, k)
    c = _container(buf, pos)
    if c is None:
        raise ValueError("not msgpack (byte 0x%02x)" % b)
    count, pos, _ = c
    for _ in range(count):
        pos = _skip(buf, pos)
    return pos


def _key(buf, pos):
    """(the str key at pos, or None for a key of another type; the offset past it)."""
    b = buf[pos]
    if 0xa0 <= b <= 0xbf:
        start, n = pos + 1, b & 0x1f
    elif b in (0xd9, 0xda, 0xdb):
        k = _SIZED[b][0]
        start, n = pos + 1 + k, _length(buf, pos, k)
    else:
        return None, _skip(buf, pos)
    return bytes(buf[start:start + n]).decode("utf-8", "replace"), start + n


def _data_bins(rec):
    """[(output index, "data" key offset, bin header offset, data offset, length)] for each
    output tensor whose "data" is a bin, in order."""
    top = _container(rec, 0)
    if top is None or not top[2]:
        raise ValueError("record is not a map")
    found = []
    entries, pos, _ = top
    seen_outputs = False
    for _ in range(entries // 2):
        key, pos = _key(rec, pos)
        if key == "outputs":
            if seen_outputs:  # msgpack keeps the last: leave the record to it
                raise ValueError("two \"outputs\"")
            seen_outputs = True
        outputs = _container(rec, pos) if key == "outputs" else None
        if outputs is None or outputs[2]:
            pos = _skip(rec, pos)
            continue
        count, pos, _ = outputs
        for i in range(count):
            tensor = _container(rec, pos)
            if tensor is None or not tensor[2]:
                pos = _skip(rec, pos)
                continue
            fields, pos, _ = tensor
            seen_data = False
            for _ in range(fields // 2):
                key_at = pos
                key, pos = _key(rec, pos)
                if key == "data":
                    if seen_data:
                        raise ValueError("a tensor with two \"data\"")
                    seen_data = True
                if key == "data" and rec[pos] in (0xc4, 0xc5, 0xc6):
                    k = _SIZED[rec[pos]][0]
                    found.append((i, key_at, pos, pos + 1 + k, _length(rec, pos, k)))
                pos = _skip(rec, pos)
    if pos != len(rec):
        raise ValueError("record has %d bytes after its map" % (len(rec) - pos))
    return found


def unpack(rec):
    """The record (a bytearray, consumed) as msgpack.unpackb(rec, raw=False) would give it, but
    with each output's "data" a writable memoryview of rec, aligned for its dtype where the
    bytes before it allow (else a bytes copy)."""
    try:
        bins = _data_bins(rec)
    except (ValueError, IndexError, RecursionError):
        bins = None  # not laid out as one record should be: msgpack says what is wrong
    if not bins:
        return msgpack.unpackb(rec, raw=False)
    view = memoryview(rec)
    pieces, last = [], 0
    for _, _, header, data, n in bins:
        pieces.append(view[last:header])
        pieces.append(_EMPTY_BIN)
        last = data + n
    pieces.append(view[last:])
    m = msgpack.unpackb(b"".join(pieces), raw=False)
    base = np.frombuffer(rec, np.uint8).ctypes.data
    for i, key_at, _, data, n in bins:
        tensor = m["outputs"][i]
        dt = _tensor.DTYPES.get(tensor.get("dtype"))
        shift = (base + data) % min(dt.itemsize, 8) if dt is not None else 0
        if data - shift < key_at:  # not reached: a "data" key and bin header are 7+ bytes
            tensor["data"] = bytes(view[data:data + n])
            continue
        if shift:
            view[data - shift:data - shift + n] = view[data:data + n]  # memmove, in place
        tensor["data"] = view[data - shift:data - shift + n]
    return m
