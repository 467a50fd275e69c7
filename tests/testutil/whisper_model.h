#pragma once
// A Whisper-shaped speech-to-text pipeline as one TorchScript module, for ferry-make-models:
//
//   forward(pcm: [B, L] int16) -> [B, max_tokens] int64 token ids
//
// int16 PCM at 16 kHz (L samples, up to 30 s) -> log-mel on the module's device (80 mels, n_fft
// 400, hop 160, Hann window, Whisper's normalisation) -> conv stem (80 -> D, D -> D stride 2,
// GELU) + sinusoidal positions + the encoder's pre-norm blocks -> a greedy decoder with a KV
// cache: it starts from Whisper's start-of-transcript tokens (50258 50259 50359 50363), runs
// its blocks (causal self-attention, cross-attention on the audio, MLP) on the new token only,
// reusing the keys and values of the earlier ones, and stops at end-of-text (50257) or after
// max_tokens; a sequence that ended is padded with 50257.
//
// The weights use openai-whisper's state_dict names and shapes (e.g.
// decoder.blocks.0.cross_attn.query.weight [D, D]), so that a real checkpoint maps one to one:
// scripts/whisper_import.py reads a checkpoint (openai-whisper's tiny.pt: torch.save of {"dims",
// "model_state_dict"}) and LoadWhisperWeights takes what it writes. Without one,
// RandomWhisperWeights makes tiny's shapes (D 384, 6 heads, 4 + 4 layers, vocabulary 51865) from a
// seed. Nothing is downloaded.
//
// Other dims (base, small, ...) build too: the source is generated for the dims given.

#include <map>
#include <string>
#include <vector>

#include <torch/script.h>

namespace ferry::testmodels {

struct WhisperDims {
  int64_t n_mels = 80;
  int64_t n_audio_ctx = 1500;
  int64_t n_audio_state = 384;
  int64_t n_audio_head = 6;
  int64_t n_audio_layer = 4;
  int64_t n_vocab = 51865;
  int64_t n_text_ctx = 448;
  int64_t n_text_state = 384;
  int64_t n_text_head = 6;
  int64_t n_text_layer = 4;
};

struct WhisperWeights {
  WhisperDims dims;
  std::map<std::string, torch::Tensor> state;  // openai-whisper names, float32
};

// Random weights of the given shapes (Whisper tiny's by default) from `seed` (deterministic).
WhisperWeights RandomWhisperWeights(uint64_t seed, const WhisperDims& dims = {});

// Reads the weights scripts/whisper_import.py writes from an openai-whisper checkpoint: a
// msgpack map {"format": "ferry-whisper-weights/1", "dims": {n_mels: int, ...}, "tensors":
// {name: {"dtype": "float32" | "float16" | "bfloat16", "shape": [int], "data": bin (C order,
// little-endian)}}}. false with *error when a dim or a weight is missing, out of range or of
// the wrong shape. (libtorch cannot read the checkpoint itself: its unpickler does not take the
// OrderedDict a state_dict is, before PyTorch 2.6.)
bool LoadWhisperWeights(const std::string& path, WhisperWeights* out, std::string* error);

// The pipeline module. `max_tokens`: tokens decoded per clip (at most n_text_ctx - 4). The
// decoder never picks sot, translate, transcribe, sot_lm, sot_prev or no_speech, nor the ids in
// `suppress` (each < n_vocab), and not " " (220) or end-of-text first: openai-whisper's greedy
// decoding with its default suppress_tokens="-1" when `suppress` holds the tokenizer's
// non_speech_tokens; that default minus them otherwise.
torch::jit::Module MakeWhisper(const WhisperWeights& weights, int64_t max_tokens,
                               const std::vector<int64_t>& suppress = {});

// The mel filterbank Whisper uses (librosa.filters.mel(sr=16000, n_fft=400, n_mels), Slaney
// scale and area normalisation): [n_mels, 201] float32.
torch::Tensor MelFilters(int64_t n_mels);

}  // namespace ferry::testmodels
