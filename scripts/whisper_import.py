#!/usr/bin/python3
"""Builds Ferry's Whisper pipeline from an openai-whisper checkpoint (tiny.pt, base.pt, ...).

    scripts/whisper_import.py tiny.pt whisper.pt [--max-tokens 224] [--suppress-tokens IDS]

The result is the module `ferry-make-models` writes as whisper.pt, with the checkpoint's
weights: forward(pcm: [B, L] int16, 16 kHz) -> [B, max_tokens] int64 token ids (see
docs/models.md, "Serving speech end to end"). Installed as `ferry-whisper-import`.

No PyTorch is needed, and the checkpoint cannot run code. A torch.save file is a zip archive:
<name>/data.pkl is a pickle of {"dims": {...}, "model_state_dict": OrderedDict(name -> tensor)}
and <name>/data/<key> holds each tensor storage's raw bytes. The unpickler here allows only the
globals torch.save writes for that (an OrderedDict, _rebuild_tensor_v2, _rebuild_parameter and
the storage types) and refuses anything else, where torch.load(weights_only=False) would run
whatever the pickle names.

The weights go to ferry-make-models as a msgpack file ("ferry-whisper-weights/1", read by
LoadWhisperWeights in tests/testutil/whisper_model.h), which builds the TorchScript module.
(libtorch's own unpickler cannot read a state_dict before PyTorch 2.6: it has no OrderedDict.)

Needs python3-numpy and python3-msgpack (Debian packages).
"""
import argparse
import collections
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import zipfile

import msgpack
import numpy as np

WEIGHTS_FORMAT = "ferry-whisper-weights/1"

# torch storage class name -> numpy dtype ("bfloat16" is read as uint16 and widened).
STORAGE_DTYPES = {
    "FloatStorage": np.dtype("<f4"),
    "HalfStorage": np.dtype("<f2"),
    "DoubleStorage": np.dtype("<f8"),
    "BFloat16Storage": np.dtype("<u2"),
    "LongStorage": np.dtype("<i8"),
    "IntStorage": np.dtype("<i4"),
}


class CheckpointError(Exception):
    pass


class _StorageType:
    """Stands for torch.<Name>Storage inside the pickle."""

    def __init__(self, name):
        self.name = name


def _bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _rebuild_tensor_v2(storage, offset, size, stride, requires_grad=False, hooks=None,
                       metadata=None):
    array, name = storage
    size, stride = tuple(size), tuple(stride)
    if any(n < 0 for n in size) or any(s < 0 for s in stride):
        raise CheckpointError("a tensor with a negative size or stride")
    count = 1
    for n in size:
        count *= n
    if count:
        last = offset + sum((n - 1) * s for n, s in zip(size, stride))
        if offset < 0 or last >= array.size:
            raise CheckpointError("a tensor reaches past the end of its storage")
        # More elements than its storage holds (a stride of 0 repeats them): weights never do,
        # and the copy below would allocate all of them (a few bytes can ask for terabytes).
        if count > array.size - offset:
            raise CheckpointError("a tensor of %d elements over a storage of %d" %
                                  (count, array.size - offset))
    view = np.lib.stride_tricks.as_strided(
        array[offset:], shape=size, strides=[s * array.itemsize for s in stride],
        writeable=False)
    view = np.ascontiguousarray(view)
    return _bf16_to_f32(view) if name == "BFloat16Storage" else view


def _rebuild_parameter(data, requires_grad=False, hooks=None, *rest):
    return data


def _restore_type_tag(value, type_str):
    return value


class _Unpickler(pickle.Unpickler):
    """Reads the data.pkl of a torch.save archive, allowing only what a state_dict needs."""

    def __init__(self, file, archive, prefix):
        super().__init__(file)
        self.archive = archive
        self.prefix = prefix
        self.storages = {}

    def find_class(self, module, name):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor_v2
        if (module, name) == ("torch._utils", "_rebuild_parameter"):
            return _rebuild_parameter
        if (module, name) == ("torch.jit._pickle", "restore_type_tag"):
            return _restore_type_tag  # libtorch's torch::pickle_save tags typed dicts
        if module == "torch" and name in STORAGE_DTYPES:
            return _StorageType(name)
        raise CheckpointError("the checkpoint names %s.%s, which a checkpoint of weights has no "
                              "use for; refusing to load it" % (module, name))

    def persistent_load(self, pid):
        # ("storage", torch.<Name>Storage, key, location, numel), as torch.save writes it.
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType)):
            raise CheckpointError("unexpected persistent id %r" % (pid,))
        _, storage_type, key, _location, numel = pid
        if key not in self.storages:
            dtype = STORAGE_DTYPES[storage_type.name]
            try:
                raw = self.archive.read(self.prefix + "data/" + str(key))
            except KeyError:
                raise CheckpointError("storage %s is missing from the archive" % key) from None
            if len(raw) < numel * dtype.itemsize:
                raise CheckpointError("storage %s is %d bytes, short of %d elements"
                                      % (key, len(raw), numel))
            self.storages[key] = (np.frombuffer(raw, dtype=dtype, count=numel),
                                  storage_type.name)
        return self.storages[key]


def read_checkpoint(path):
    """Returns (dims: dict of int, tensors: dict of name -> numpy array) from a torch.save
    file of openai-whisper's layout. Raises CheckpointError when it is not one."""
    if not zipfile.is_zipfile(path):
        raise CheckpointError("%s is not a zip-format torch.save file (the format of every "
                              "openai-whisper checkpoint; the legacy pre-1.6 format is not read)"
                              % path)
    with zipfile.ZipFile(path) as archive:
        pickles = [n for n in archive.namelist() if n.endswith("data.pkl")]
        if len(pickles) != 1:
            raise CheckpointError("%s holds %d data.pkl files, not one" % (path, len(pickles)))
        prefix = pickles[0][:-len("data.pkl")]
        with archive.open(pickles[0]) as f:
            try:
                root = _Unpickler(f, archive, prefix).load()
            except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as e:
                raise CheckpointError("%s: %s" % (path, e)) from None
    if not isinstance(root, dict) or "dims" not in root or "model_state_dict" not in root:
        raise CheckpointError('%s is not {"dims", "model_state_dict"} (openai-whisper\'s layout)'
                              % path)
    dims, state = root["dims"], root["model_state_dict"]
    if not isinstance(dims, dict) or not all(isinstance(v, int) for v in dims.values()):
        raise CheckpointError('"dims" is not a dict of integers')
    tensors = {}
    for name, value in state.items():
        if not isinstance(value, np.ndarray):
            raise CheckpointError("model_state_dict[%r] is not a tensor" % (name,))
        tensors[name] = value
    return dict(dims), tensors


def write_weights(path, dims, tensors):
    """Writes the ferry-whisper-weights/1 msgpack file that ferry-make-models reads."""
    packed = {}
    for name, array in tensors.items():
        # float16 stays float16 (half the bytes); anything else becomes float32.
        dtype = "float16" if array.dtype == np.float16 else "float32"
        array = np.ascontiguousarray(array, dtype="<f2" if dtype == "float16" else "<f4")
        packed[name] = {"dtype": dtype, "shape": list(array.shape), "data": array.tobytes()}
    with open(path, "wb") as f:
        msgpack.pack({"format": WEIGHTS_FORMAT, "dims": dims, "tensors": packed}, f,
                     use_bin_type=True)


def find_make_models(explicit):
    if explicit:
        return explicit
    here = os.path.dirname(os.path.realpath(__file__))
    for candidate in (os.path.join(here, "ferry-make-models"),
                      os.path.join(here, "..", "build", "gpu-worker", "ferry-make-models")):
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("ferry-make-models")
    if not found:
        raise CheckpointError("ferry-make-models not found (next to this script, in ../build or "
                              "on PATH); name it with --make-models")
    return found


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Build Ferry's Whisper pipeline (TorchScript) from an openai-whisper "
                    "checkpoint, without PyTorch.")
    parser.add_argument("checkpoint", help="openai-whisper checkpoint, e.g. tiny.pt")
    parser.add_argument("out", help="the TorchScript module to write, e.g. whisper.pt")
    parser.add_argument("--max-tokens", type=int, default=224,
                        help="tokens decoded per clip (default 224; at most n_text_ctx - 4)")
    parser.add_argument("--suppress-tokens", default="",
                        help="comma-separated token ids never to decode, besides Whisper's "
                             "special tokens; openai-whisper's default (\"-1\") is its "
                             "tokenizer's non_speech_tokens (docs/models.md)")
    parser.add_argument("--make-models", help="path of ferry-make-models")
    args = parser.parse_args(argv)
    try:
        dims, tensors = read_checkpoint(args.checkpoint)
        make_models = find_make_models(args.make_models)
        with tempfile.TemporaryDirectory(prefix="ferry-whisper-") as tmp:
            weights = os.path.join(tmp, "weights.msgpack")
            write_weights(weights, dims, tensors)
            del tensors
            extra = ["--suppress-tokens", args.suppress_tokens] if args.suppress_tokens else []
            return subprocess.call([make_models, "--whisper-weights", weights,
                                    "--max-tokens", str(args.max_tokens)] + extra + [args.out])
    except (CheckpointError, OSError) as e:
        print("whisper_import: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
