"""Tensors on the wire <-> numpy arrays (docs/protocol.md, "Tensors").

| protocol dtype | numpy in (what you pass)        | numpy out (what you get)            |
|----------------|---------------------------------|-------------------------------------|
| float32        | float32                         | float32                             |
| float16        | float16                         | float16                             |
| bfloat16       | ``ferry.bfloat16(x)`` (or an    | float32: exact (bfloat16 is the top |
|                | ml_dtypes bfloat16 array)       | 16 bits of a float32)               |
| float64        | float64                         | float64                             |
| int64 / int32 / int16 / int8 | int64 / int32 / int16 / int8 | the same                  |
| uint8          | uint8                           | uint8                               |
| bool           | bool                            | bool                                |

Other numpy dtypes (uint16, uint32, uint64, complex, object, strings) have no protocol dtype and
are refused with InvalidArgument: cast them first. Arrays are sent little-endian and C-contiguous
(converted when they are not). Outputs are writable arrays of their own (a big one a view of the
record read from Redis, which only it holds).
"""

import numpy as np

from ._errors import InvalidArgument, TooLarge

__all__ = ["Tensor", "bfloat16", "DTYPES"]

#: protocol dtype name -> numpy dtype of the bytes on the wire (bfloat16: raw uint16 bits).
DTYPES = {
    "float32": np.dtype("<f4"),
    "float16": np.dtype("<f2"),
    "bfloat16": np.dtype("<u2"),
    "float64": np.dtype("<f8"),
    "int64": np.dtype("<i8"),
    "int32": np.dtype("<i4"),
    "int16": np.dtype("<i2"),
    "int8": np.dtype("i1"),
    "uint8": np.dtype("u1"),
    "bool": np.dtype("?"),
}

# numpy dtype (native or little-endian) -> protocol name. bfloat16 is not here: a uint16 array
# is not bfloat16 unless the caller says so (Tensor / bfloat16()).
_NAMES = {}
for _name, _dt in DTYPES.items():
    if _name != "bfloat16":
        _NAMES[_dt] = _name
        _NAMES[_dt.newbyteorder("=")] = _name

MAX_DIMS = 16
MAX_TENSOR_BYTES = (1 << 31) - 1  # one msgpack bin


class Tensor:
    """An input with an explicit protocol dtype: ``Tensor(array, "bfloat16")`` sends the array's
    raw 2-byte values (uint16/int16 bits) as bfloat16; any other dtype name casts the array to
    that dtype first. Plain numpy arrays need no wrapper."""

    __slots__ = ("dtype", "shape", "data")

    def __init__(self, array, dtype):
        if dtype not in DTYPES:
            raise InvalidArgument("unknown protocol dtype %r (one of %s)" % (dtype, ", ".join(DTYPES)))
        a = np.asarray(array)
        if dtype == "bfloat16":
            if a.dtype.itemsize != 2 or a.dtype.kind not in "ui":
                raise InvalidArgument("Tensor(x, 'bfloat16') takes the raw bits as a 2-byte "
                                      "integer array; use ferry.bfloat16(x) to convert floats")
            a = a.view(np.dtype("u2").newbyteorder(a.dtype.byteorder))
        # Not np.ascontiguousarray: it makes a scalar (shape []) an array of shape [1].
        a = np.asarray(a, dtype=DTYPES[dtype], order="C")
        self.dtype = dtype
        self.shape = list(a.shape)
        self.data = a.tobytes()

    def __repr__(self):
        return "ferry.Tensor(dtype=%r, shape=%r)" % (self.dtype, self.shape)


def bfloat16(x):
    """A float array as a bfloat16 input: rounded to nearest even (NaN stays NaN)."""
    f = np.asarray(x, dtype="<f4", order="C")
    bits = f.view("<u4")
    # np.where, not an assignment: a scalar's arithmetic gives a numpy scalar, not an array.
    rounded = np.where(np.isnan(f), 0x7FC0, (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16)
    return Tensor(rounded.astype("<u2"), "bfloat16")


def encode(x, where, view_bytes=65536):
    """(dtype name, shape list, bytes-like, nbytes) of one input; InvalidArgument if it has no
    protocol dtype. The bytes-like is bytes for arrays under `view_bytes` and a memoryview of
    the (C-contiguous, little-endian) array for bigger ones: no copy, and it holds the array
    (the caller's own when it already was C-contiguous little-endian: its contents are read
    when they are sent)."""
    if type(x) is Tensor:
        return x.dtype, x.shape, x.data, len(x.data)
    a = x if type(x) is np.ndarray else np.asarray(x)
    name = _NAMES.get(a.dtype)
    if name is None:
        if a.dtype.name == "bfloat16":  # ml_dtypes, when the caller has it
            a = np.asarray(a, order="C").view("<u2")
            name = "bfloat16"
        elif a.dtype.byteorder == ">" and a.dtype.newbyteorder("<") in _NAMES:
            a = a.astype(a.dtype.newbyteorder("<"))
            name = _NAMES[a.dtype]
        else:
            raise InvalidArgument("%s: numpy dtype %s has no Ferry dtype (%s); cast it first"
                                  % (where, a.dtype, ", ".join(DTYPES)))
    if a.ndim > MAX_DIMS:
        raise InvalidArgument("%s: more than %d dimensions" % (where, MAX_DIMS))
    nbytes = a.nbytes
    if nbytes > MAX_TENSOR_BYTES:
        raise TooLarge("%s: over 2 GiB of data" % where)
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    if nbytes < view_bytes:
        return name, list(a.shape), a.tobytes(), nbytes
    return name, list(a.shape), memoryview(a.reshape(-1).view(np.uint8)), nbytes


def decode(t):
    """A numpy array from a tensor map ({"dtype", "shape", "data"}); ValueError when malformed."""
    try:
        name, shape, data = t["dtype"], t["shape"], t["data"]
    except (KeyError, TypeError):
        raise ValueError("tensor is not a map with dtype, shape and data")
    dt = DTYPES.get(name)
    if dt is None:
        raise ValueError("unknown tensor dtype %r" % (name,))
    n = 1
    for d in shape:
        n *= d
    if len(data) != n * dt.itemsize:
        raise ValueError("tensor %s%r has %d bytes of data" % (name, shape, len(data)))
    if type(data) is memoryview and not data.readonly:
        a = np.frombuffer(data, dtype=dt)  # the record's own bytes (_record.unpack): no copy
        if not a.flags.aligned:
            a = a.copy()
    else:
        a = np.frombuffer(bytearray(data), dtype=dt)  # a writable array of its own
    a = a.reshape(shape)
    if name == "bfloat16":
        b = a.astype("<u4")  # shifted in place: `<< 16` makes a 0-d array's uint32 an int64
        np.left_shift(b, np.uint32(16), out=b)
        return b.view("<f4")
    if dt.byteorder == "<":  # little-endian wire; native arrays on every host
        a = a.astype(dt.newbyteorder("="), copy=False)
    return a
