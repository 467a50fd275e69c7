#!/usr/bin/python3
"""scripts/whisper_import.py's checkpoint reader, on files written the way torch.save writes
openai-whisper's checkpoints: a zip with <name>/data.pkl (pickle protocol 2) and
<name>/data/<key>; the state dict an OrderedDict carrying _metadata (a BUILD opcode), tensors
as torch._utils._rebuild_tensor_v2 of storages named by persistent ids. PyTorch is not
installed here, so stand-in `torch` modules give pickle the same global names to write.

(The whole import, down to the TorchScript module, is checked by the worker unit test
WhisperImportTest against a checkpoint libtorch writes.)
"""
import collections
import io
import os
import pickle
import sys
import tempfile
import types
import unittest
import zipfile

import msgpack
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "scripts"))
import whisper_import  # noqa: E402


def _install_fake_torch():
    """Modules named torch and torch._utils whose objects pickle under torch's global names."""
    torch = types.ModuleType("torch")
    utils = types.ModuleType("torch._utils")

    def _rebuild_tensor_v2(*args):
        raise AssertionError("only pickled, never called")

    def _rebuild_parameter(*args):
        raise AssertionError("only pickled, never called")

    for f in (_rebuild_tensor_v2, _rebuild_parameter):
        f.__module__, f.__qualname__ = "torch._utils", f.__name__
    utils._rebuild_tensor_v2 = _rebuild_tensor_v2
    utils._rebuild_parameter = _rebuild_parameter
    torch._utils = utils
    for name in ("HalfStorage", "FloatStorage", "BFloat16Storage"):
        cls = type(name, (), {"__module__": "torch"})
        setattr(torch, name, cls)
    sys.modules["torch"] = torch
    sys.modules["torch._utils"] = utils
    return torch


TORCH = _install_fake_torch()


class Storage:
    def __init__(self, key, storage_type, raw, numel):
        self.key, self.storage_type, self.raw, self.numel = key, storage_type, raw, numel


class Tensor:
    """Pickles as torch.save pickles a tensor (optionally wrapped as a Parameter)."""

    def __init__(self, storage, offset, size, stride, parameter=False):
        self.args = (storage, offset, tuple(size), tuple(stride), False,
                     collections.OrderedDict())
        self.parameter = parameter

    def __reduce_ex__(self, protocol):
        if self.parameter:
            return (TORCH._utils._rebuild_parameter,
                    (Tensor(*self.args[:4]), False, collections.OrderedDict()))
        return (TORCH._utils._rebuild_tensor_v2, self.args)


class Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            return ("storage", obj.storage_type, obj.key, "cpu", obj.numel)
        return None


def save(path, root, storages, archive_name="tiny"):
    """torch.save's zip layout: <archive_name>/data.pkl, /data/<key>, /version."""
    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump(root)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr(archive_name + "/data.pkl", buf.getvalue())
        for s in storages:
            z.writestr(archive_name + "/data/" + s.key, s.raw)
        z.writestr(archive_name + "/version", "3\n")


def half_storage(key, values):
    a = np.asarray(values, dtype="<f2")
    return Storage(key, TORCH.HalfStorage, a.tobytes(), a.size)


DIMS = {"n_mels": 80, "n_vocab": 51865, "n_audio_ctx": 1500, "n_audio_state": 384,
        "n_audio_head": 6, "n_audio_layer": 4, "n_text_ctx": 448, "n_text_state": 384,
        "n_text_head": 6, "n_text_layer": 4}


class ReadCheckpointTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.tmp.name, "tiny.pt")

    def tearDown(self):
        self.tmp.cleanup()

    def test_a_whisper_layout_checkpoint_reads_back_exactly(self):
        rng = np.random.default_rng(7)
        w = rng.standard_normal((3, 4)).astype(np.float16)
        shared = rng.standard_normal(10).astype(np.float16)
        bf16_values = np.array([1.0, -2.5, 0.15625], dtype=np.float32)
        bf16 = Storage("3", TORCH.BFloat16Storage,
                       (bf16_values.view(np.uint32) >> 16).astype("<u2").tobytes(), 3)
        s0, s1 = half_storage("0", w.ravel()), half_storage("1", shared)
        state = collections.OrderedDict()
        state["decoder.ln.weight"] = Tensor(s0, 0, (3, 4), (4, 1))
        # A transposed view: strides (1, 3) over the same bytes.
        state["decoder.ln.bias"] = Tensor(s0, 0, (4, 3), (1, 4))
        # Two tensors in one storage at different offsets.
        state["encoder.conv1.bias"] = Tensor(s1, 2, (3,), (1,))
        state["encoder.conv2.bias"] = Tensor(s1, 5, (5,), (1,), parameter=True)
        state["x.bf16"] = Tensor(bf16, 0, (3,), (1,))
        state._metadata = collections.OrderedDict([("", {"version": 1})])
        save(self.path, {"dims": DIMS, "model_state_dict": state}, [s0, s1, bf16])

        dims, tensors = whisper_import.read_checkpoint(self.path)

        self.assertEqual(dims, DIMS)
        self.assertEqual(list(tensors), list(state))
        np.testing.assert_array_equal(tensors["decoder.ln.weight"], w)
        np.testing.assert_array_equal(tensors["decoder.ln.bias"], w.T)
        np.testing.assert_array_equal(tensors["encoder.conv1.bias"], shared[2:5])
        np.testing.assert_array_equal(tensors["encoder.conv2.bias"], shared[5:10])
        self.assertEqual(tensors["decoder.ln.weight"].dtype, np.float16)
        np.testing.assert_array_equal(tensors["x.bf16"], bf16_values)

    def test_weights_file_holds_dims_dtypes_shapes_and_bytes(self):
        a = np.arange(6, dtype=np.float16).reshape(2, 3)
        b = np.arange(4, dtype=np.float64)
        out = os.path.join(self.tmp.name, "w.msgpack")
        whisper_import.write_weights(out, {"n_mels": 80}, {"a": a, "b": b})
        with open(out, "rb") as f:
            root = msgpack.unpack(f, raw=False)
        self.assertEqual(root["format"], "ferry-whisper-weights/1")
        self.assertEqual(root["dims"], {"n_mels": 80})
        self.assertEqual(root["tensors"]["a"]["dtype"], "float16")
        self.assertEqual(root["tensors"]["a"]["shape"], [2, 3])
        self.assertEqual(root["tensors"]["a"]["data"], a.astype("<f2").tobytes())
        self.assertEqual(root["tensors"]["b"]["dtype"], "float32")
        self.assertEqual(root["tensors"]["b"]["data"], b.astype("<f4").tobytes())

    def test_a_checkpoint_that_names_other_code_is_refused_and_nothing_runs(self):
        marker = os.path.join(self.tmp.name, "ran")

        class Evil:
            def __reduce__(self):
                return (os.system, ("touch " + marker,))

        save(self.path, {"dims": DIMS, "model_state_dict": Evil()}, [])
        with self.assertRaisesRegex(whisper_import.CheckpointError, "refusing"):
            whisper_import.read_checkpoint(self.path)
        self.assertFalse(os.path.exists(marker))

    def test_broken_files_get_a_clear_error(self):
        s0 = half_storage("0", [1.0, 2.0])
        cases = {
            "not a zip": (None, "not a zip"),
            "missing storage": ({"dims": DIMS, "model_state_dict": collections.OrderedDict(
                [("w", Tensor(s0, 0, (2,), (1,)))])}, "missing"),
            "past the end": ({"dims": DIMS, "model_state_dict": collections.OrderedDict(
                [("w", Tensor(s0, 1, (2,), (1,)))])}, "past the end"),
            # Stride 0: 10^12 elements from 2 (before, the copy tried to allocate them all).
            "stride 0": ({"dims": DIMS, "model_state_dict": collections.OrderedDict(
                [("w", Tensor(s0, 0, (10**6, 10**6), (0, 0)))])}, "over a storage of 2"),
            "no dims": ({"model_state_dict": collections.OrderedDict()}, "dims"),
            "not a tensor": ({"dims": DIMS, "model_state_dict": {"w": 3}}, "not a tensor"),
        }
        for what, (root, message) in cases.items():
            with self.subTest(what):
                if root is None:
                    with open(self.path, "wb") as f:
                        f.write(b"\x80\x02}q\x00.")  # a bare pickle: the legacy format
                else:
                    save(self.path, root, [s0] if what in ("past the end", "stride 0") else [])
                with self.assertRaisesRegex(whisper_import.CheckpointError, message):
                    whisper_import.read_checkpoint(self.path)


if __name__ == "__main__":
    unittest.main()
