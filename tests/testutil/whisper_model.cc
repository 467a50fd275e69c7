#include "whisper_model.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <vector>

#include <msgpack.hpp>

namespace ferry::testmodels {
namespace {

constexpr const char* kWeightsFormat = "ferry-whisper-weights/1";

// Whisper's fixed token ids (the multilingual vocabulary of tiny, base, small, ...).
constexpr int64_t kMultilingualVocab = 51865;
constexpr int64_t kEndOfText = 50257;
constexpr int64_t kStartOfTranscript[4] = {50258, 50259, 50359, 50363};  // sot, en, transcribe,
                                                                         // notimestamps
// Never decoded, as in openai-whisper's default decoding (suppress_tokens="-1", whose list
// always holds them): sot, translate, transcribe, sot_lm, sot_prev, no_speech.
constexpr int64_t kSuppressed[6] = {50258, 50358, 50359, 50360, 50361, 50362};
// Not decoded first (openai-whisper's SuppressBlank): " " (GPT-2's 220) and end-of-text.
constexpr int64_t kSuppressedFirst[2] = {220, kEndOfText};

// The forward pass, written once with placeholders for the dims.
constexpr const char* kSource = R"(
def _heads(self, x, H: int):
    return x.reshape(x.size(0), x.size(1), H, x.size(2) // H).transpose(1, 2)

def _attend(self, q, k, v, causal: bool):
    # q [B, H, Tq, hd], k and v [B, H, Tk, hd] -> [B, Tq, H * hd]
    w = torch.matmul(q, k.transpose(-2, -1)) * (float(q.size(3)) ** -0.5)
    if causal:
        Tq = q.size(2)
        Tk = k.size(2)
        later = torch.arange(Tk, device=q.device)[None, :] > (torch.arange(Tq, device=q.device)[:, None] + (Tk - Tq))
        w = w.masked_fill(later, float('-inf'))
    o = torch.matmul(torch.softmax(w, -1), v)
    return o.transpose(1, 2).reshape(o.size(0), o.size(2), o.size(1) * o.size(3))

def log_mel(self, pcm):
    # [B, L] int16 -> [B, n_mels, L / 160]: Whisper's log-mel spectrogram, on pcm's device.
    # torch.stft(center=True) spelled out (reflect-pad n_fft / 2 each side), so that the same
    # source compiles against libtorch 1.13 and 2.x. In float32, with the window made here in
    # float32 (a float16 one raised the mel bands beside a tone by ~3 %), then in the weights'
    # dtype: a half-precision module (the model repository's `half = true`) encodes and decodes
    # in float16; its filterbank is rounded to float16 (~5e-4 relative) and applied in float32.
    x = torch.reflection_pad1d(pcm.float() / 32768.0, [200, 200])
    window = torch.hann_window(400, True, dtype=x.dtype, device=x.device)
    spec = torch.stft(x, 400, hop_length=160, win_length=400, window=window, normalized=False, onesided=True, return_complex=True)
    power = spec.abs() ** 2
    mel = torch.matmul(self.mel_filters.float(), power[:, :, :-1])
    logm = torch.clamp(mel, min=1e-10).log10()
    logm = torch.maximum(logm, logm.amax(dim=[1, 2], keepdim=True) - 8.0)
    return ((logm + 4.0) / 4.0).to(self.enc_conv1_w.dtype)

def encode(self, mel):
    x = torch.gelu(torch.conv1d(mel, self.enc_conv1_w, self.enc_conv1_b, 1, 1))
    x = torch.gelu(torch.conv1d(x, self.enc_conv2_w, self.enc_conv2_b, 2, 1))
    x = x.transpose(1, 2)
    x = x + self.enc_pos[0:x.size(1)]
    for i in range(@AL@):
        h = torch.layer_norm(x, [@AD@], self.enc_attn_ln_w[i], self.enc_attn_ln_b[i], 1e-5)
        q = self._heads(torch.matmul(h, self.enc_q_w[i]) + self.enc_q_b[i], @AH@)
        k = self._heads(torch.matmul(h, self.enc_k_w[i]), @AH@)
        v = self._heads(torch.matmul(h, self.enc_v_w[i]) + self.enc_v_b[i], @AH@)
        x = x + torch.matmul(self._attend(q, k, v, False), self.enc_o_w[i]) + self.enc_o_b[i]
        h = torch.layer_norm(x, [@AD@], self.enc_mlp_ln_w[i], self.enc_mlp_ln_b[i], 1e-5)
        h = torch.gelu(torch.matmul(h, self.enc_mlp1_w[i]) + self.enc_mlp1_b[i])
        x = x + torch.matmul(h, self.enc_mlp2_w[i]) + self.enc_mlp2_b[i]
    return torch.layer_norm(x, [@AD@], self.enc_ln_w, self.enc_ln_b, 1e-5)

def _decoder_block(self, i: int, x, self_k, self_v, cross_k, cross_v):
    h = torch.layer_norm(x, [@TD@], self.dec_attn_ln_w[i], self.dec_attn_ln_b[i], 1e-5)
    q = self._heads(torch.matmul(h, self.dec_q_w[i]) + self.dec_q_b[i], @TH@)
    x = x + torch.matmul(self._attend(q, self_k, self_v, True), self.dec_o_w[i]) + self.dec_o_b[i]
    h = torch.layer_norm(x, [@TD@], self.dec_cross_ln_w[i], self.dec_cross_ln_b[i], 1e-5)
    q = self._heads(torch.matmul(h, self.dec_cq_w[i]) + self.dec_cq_b[i], @TH@)
    x = x + torch.matmul(self._attend(q, cross_k, cross_v, False), self.dec_co_w[i]) + self.dec_co_b[i]
    h = torch.layer_norm(x, [@TD@], self.dec_mlp_ln_w[i], self.dec_mlp_ln_b[i], 1e-5)
    h = torch.gelu(torch.matmul(h, self.dec_mlp1_w[i]) + self.dec_mlp1_b[i])
    return x + torch.matmul(h, self.dec_mlp2_w[i]) + self.dec_mlp2_b[i]

def _self_kv(self, i: int, x):
    h = torch.layer_norm(x, [@TD@], self.dec_attn_ln_w[i], self.dec_attn_ln_b[i], 1e-5)
    k = self._heads(torch.matmul(h, self.dec_k_w[i]), @TH@)
    v = self._heads(torch.matmul(h, self.dec_v_w[i]) + self.dec_v_b[i], @TH@)
    return k, v

def _cross_kv(self, audio):
    ks: List[Tensor] = []
    vs: List[Tensor] = []
    for i in range(@TL@):
        ks.append(self._heads(torch.matmul(audio, self.dec_ck_w[i]), @TH@))
        vs.append(self._heads(torch.matmul(audio, self.dec_cv_w[i]) + self.dec_cv_b[i], @TH@))
    return ks, vs

def _logits(self, x):
    x = torch.layer_norm(x, [@TD@], self.dec_ln_w, self.dec_ln_b, 1e-5)
    return torch.matmul(x, self.dec_tok.t())

def _next(self, x, step: int):
    # The greedy choice from the newest position's logits, with the suppressed ids at -inf.
    logits = self._logits(x[:, -1:]).squeeze(1)
    logits = logits.index_fill(1, self.suppress.to(logits.device), float("-inf"))
    if step == 0:
        logits = logits.index_fill(1, self.suppress_first.to(logits.device), float("-inf"))
    return logits.argmax(-1)

def decode(self, audio, max_tokens: int):
    # Greedy, with a KV cache: each step runs the blocks on the new token only.
    B = audio.size(0)
    cross_k, cross_v = self._cross_kv(audio)
    tokens = self.sot.to(audio.device).unsqueeze(0).expand([B, self.sot.size(0)])
    out = tokens.new_full([B, max_tokens], @EOT@)
    done = out[:, 0] < 0  # [B] bool, all False
    cache_k: List[Tensor] = []
    cache_v: List[Tensor] = []
    offset = 0
    for step in range(max_tokens):
        x = self.dec_tok[tokens] + self.dec_pos[offset:offset + tokens.size(1)]
        for i in range(@TL@):
            k, v = self._self_kv(i, x)
            if step == 0:
                cache_k.append(k)
                cache_v.append(v)
            else:
                cache_k[i] = torch.cat([cache_k[i], k], 2)
                cache_v[i] = torch.cat([cache_v[i], v], 2)
            x = self._decoder_block(i, x, cache_k[i], cache_v[i], cross_k[i], cross_v[i])
        nxt = self._next(x, step)
        nxt = torch.where(done, torch.full_like(nxt, @EOT@), nxt)
        out[:, step] = nxt
        done = done | (nxt == @EOT@)
        offset += tokens.size(1)
        tokens = nxt.unsqueeze(1)
        if bool(done.all()):
            break
    return out

def decode_without_cache(self, audio, max_tokens: int):
    # The same greedy decoding, running every block on the whole sequence at every step: what
    # the KV cache must agree with (tests).
    B = audio.size(0)
    cross_k, cross_v = self._cross_kv(audio)
    seq = self.sot.to(audio.device).unsqueeze(0).expand([B, self.sot.size(0)])
    out = seq.new_full([B, max_tokens], @EOT@)
    done = out[:, 0] < 0  # [B] bool, all False
    for step in range(max_tokens):
        x = self.dec_tok[seq] + self.dec_pos[0:seq.size(1)]
        for i in range(@TL@):
            k, v = self._self_kv(i, x)
            x = self._decoder_block(i, x, k, v, cross_k[i], cross_v[i])
        nxt = self._next(x, step)
        nxt = torch.where(done, torch.full_like(nxt, @EOT@), nxt)
        out[:, step] = nxt
        done = done | (nxt == @EOT@)
        seq = torch.cat([seq, nxt.unsqueeze(1)], 1)
        if bool(done.all()):
            break
    return out

def forward(self, pcm):
    # A clip keeps its length (the model repository's buckets pad batches; Whisper pads every
    # clip to 30 s), but gets at least 400 samples (two frames) and at most the audio positions.
    L = pcm.size(1)
    assert L <= @MAXS@, "a clip of " + str(L) + " samples; at most @MAXS@ (30 s at 16 kHz): split longer audio"
    if L < 400:
        pcm = torch.constant_pad_nd(pcm, [0, 400 - L], 0)
    return self.decode(self.encode(self.log_mel(pcm)), self.max_tokens)
)";

std::string Substitute(std::string s, const std::map<std::string, int64_t>& values) {
  for (const auto& [key, value] : values) {
    const std::string token = "@" + key + "@";
    for (size_t at = s.find(token); at != std::string::npos; at = s.find(token, at))
      s.replace(at, token.size(), std::to_string(value));
  }
  return s;
}

torch::Tensor Sinusoids(int64_t length, int64_t channels) {
  const double increment = std::log(10000.0) / static_cast<double>(channels / 2 - 1);
  torch::Tensor inv = torch::exp(-increment * torch::arange(channels / 2, torch::kFloat64));
  torch::Tensor t = torch::arange(length, torch::kFloat64).unsqueeze(1) * inv.unsqueeze(0);
  return torch::cat({torch::sin(t), torch::cos(t)}, 1).to(torch::kFloat32);
}

// The names of one block's weights, for the encoder ("attn" only) or the decoder.
std::vector<std::string> BlockParts(bool decoder) {
  std::vector<std::string> parts = {"attn.query.weight", "attn.query.bias", "attn.key.weight",
                                    "attn.value.weight", "attn.value.bias", "attn.out.weight",
                                    "attn.out.bias",     "attn_ln.weight",  "attn_ln.bias",
                                    "mlp.0.weight",      "mlp.0.bias",      "mlp.2.weight",
                                    "mlp.2.bias",        "mlp_ln.weight",   "mlp_ln.bias"};
  if (decoder) {
    for (const char* p :
         {"cross_attn.query.weight", "cross_attn.query.bias", "cross_attn.key.weight",
          "cross_attn.value.weight", "cross_attn.value.bias", "cross_attn.out.weight",
          "cross_attn.out.bias", "cross_attn_ln.weight", "cross_attn_ln.bias"})
      parts.push_back(p);
  }
  return parts;
}

// Every weight a checkpoint must have, with its shape.
std::map<std::string, std::vector<int64_t>> ExpectedShapes(const WhisperDims& d) {
  std::map<std::string, std::vector<int64_t>> s;
  const int64_t A = d.n_audio_state, T = d.n_text_state;
  s["encoder.conv1.weight"] = {A, d.n_mels, 3};
  s["encoder.conv1.bias"] = {A};
  s["encoder.conv2.weight"] = {A, A, 3};
  s["encoder.conv2.bias"] = {A};
  s["encoder.positional_embedding"] = {d.n_audio_ctx, A};
  s["encoder.ln_post.weight"] = {A};
  s["encoder.ln_post.bias"] = {A};
  s["decoder.token_embedding.weight"] = {d.n_vocab, T};
  s["decoder.positional_embedding"] = {d.n_text_ctx, T};
  s["decoder.ln.weight"] = {T};
  s["decoder.ln.bias"] = {T};
  for (int side = 0; side < 2; ++side) {
    const bool dec = side == 1;
    const int64_t D = dec ? T : A, layers = dec ? d.n_text_layer : d.n_audio_layer;
    for (int64_t i = 0; i < layers; ++i) {
      const std::string prefix =
          std::string(dec ? "decoder" : "encoder") + ".blocks." + std::to_string(i) + ".";
      for (const std::string& part : BlockParts(dec)) {
        std::vector<int64_t> shape;
        if (part.rfind("mlp.0.weight", 0) == 0)
          shape = {4 * D, D};
        else if (part == "mlp.0.bias")
          shape = {4 * D};
        else if (part == "mlp.2.weight")
          shape = {D, 4 * D};
        else if (part.find(".weight") != std::string::npos && part.find("ln.") == std::string::npos)
          shape = {D, D};
        else
          shape = {D};
        s[prefix + part] = shape;
      }
    }
  }
  return s;
}

}  // namespace

torch::Tensor MelFilters(int64_t n_mels) {
  // librosa.filters.mel(sr=16000, n_fft=400, n_mels, fmin=0, fmax=8000, htk=False,
  // norm="slaney"), in float64, as Whisper's assets/mel_filters.npz holds it.
  constexpr double kSr = 16000, kFsp = 200.0 / 3, kMinLogHz = 1000;
  const double min_log_mel = kMinLogHz / kFsp, logstep = std::log(6.4) / 27.0;
  auto hz_to_mel = [&](double f) {
    return f < kMinLogHz ? f / kFsp : min_log_mel + std::log(f / kMinLogHz) / logstep;
  };
  auto mel_to_hz = [&](double m) {
    return m < min_log_mel ? kFsp * m : kMinLogHz * std::exp(logstep * (m - min_log_mel));
  };
  const int64_t bins = 201;
  std::vector<double> fft(bins), mel_f(static_cast<size_t>(n_mels + 2));
  for (int64_t j = 0; j < bins; ++j) fft[j] = kSr / 2 * static_cast<double>(j) / (bins - 1);
  const double top = hz_to_mel(kSr / 2);
  for (int64_t i = 0; i < n_mels + 2; ++i)
    mel_f[i] = mel_to_hz(top * static_cast<double>(i) / static_cast<double>(n_mels + 1));
  torch::Tensor w = torch::zeros({n_mels, bins}, torch::kFloat64);
  auto a = w.accessor<double, 2>();
  for (int64_t i = 0; i < n_mels; ++i) {
    const double enorm = 2.0 / (mel_f[i + 2] - mel_f[i]);
    for (int64_t j = 0; j < bins; ++j) {
      const double lower = (fft[j] - mel_f[i]) / (mel_f[i + 1] - mel_f[i]);
      const double upper = (mel_f[i + 2] - fft[j]) / (mel_f[i + 2] - mel_f[i + 1]);
      a[i][j] = std::max(0.0, std::min(lower, upper)) * enorm;
    }
  }
  return w.to(torch::kFloat32);
}

WhisperWeights RandomWhisperWeights(uint64_t seed, const WhisperDims& dims) {
  torch::manual_seed(seed);
  WhisperWeights w;
  w.dims = dims;
  for (const auto& [name, shape] : ExpectedShapes(w.dims)) {
    torch::Tensor t;
    if (name.find("ln") != std::string::npos && name.find("weight") != std::string::npos) {
      t = torch::ones(shape);
    } else if (name.find("bias") != std::string::npos) {
      t = torch::randn(shape) * 0.02;
    } else if (name == "encoder.positional_embedding") {
      t = Sinusoids(shape[0], shape[1]);
    } else if (name.find("embedding") != std::string::npos) {
      t = torch::randn(shape) * 0.02;
    } else {
      const int64_t fan_in = shape.size() == 3 ? shape[1] * shape[2] : shape.back();
      t = torch::randn(shape) * (1.0 / std::sqrt(static_cast<double>(fan_in)));
    }
    w.state[name] = t.contiguous();
  }
  return w;
}

bool LoadWhisperWeights(const std::string& path, WhisperWeights* out, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = "cannot read " + path;
    return false;
  }
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    const msgpack::object_handle handle = msgpack::unpack(bytes.data(), bytes.size());
    const auto root = handle.get().as<std::map<std::string, msgpack::object>>();
    auto field = [&](const char* name) -> const msgpack::object& {
      const auto it = root.find(name);
      if (it == root.end()) throw std::runtime_error(std::string("no \"") + name + "\"");
      return it->second;
    };
    if (field("format").as<std::string>() != kWeightsFormat)
      throw std::runtime_error("format is not " + std::string(kWeightsFormat));
    const auto dims = field("dims").as<std::map<std::string, int64_t>>();
    auto dim = [&](const char* name, int64_t* v) {
      const auto it = dims.find(name);
      if (it == dims.end()) throw std::runtime_error(std::string("dims has no ") + name);
      if (it->second <= 0 || it->second > (int64_t{1} << 20))
        throw std::runtime_error(std::string("dims.") + name + " is out of range");
      *v = it->second;
    };
    WhisperWeights w;
    dim("n_mels", &w.dims.n_mels);
    dim("n_audio_ctx", &w.dims.n_audio_ctx);
    dim("n_audio_state", &w.dims.n_audio_state);
    dim("n_audio_head", &w.dims.n_audio_head);
    dim("n_audio_layer", &w.dims.n_audio_layer);
    dim("n_vocab", &w.dims.n_vocab);
    dim("n_text_ctx", &w.dims.n_text_ctx);
    dim("n_text_state", &w.dims.n_text_state);
    dim("n_text_head", &w.dims.n_text_head);
    dim("n_text_layer", &w.dims.n_text_layer);
    if (w.dims.n_vocab != kMultilingualVocab)
      throw std::runtime_error(
          "n_vocab is " + std::to_string(w.dims.n_vocab) +
          ", not 51865: only the multilingual vocabulary (tiny, base, small, medium, large-v1 "
          "and -v2) has the special tokens this pipeline uses; the English-only *.en models "
          "and large-v3 number them differently");
    if (w.dims.n_audio_state % w.dims.n_audio_head != 0 ||
        w.dims.n_text_state % w.dims.n_text_head != 0)
      throw std::runtime_error("a state size is not a multiple of its head count");
    if (w.dims.n_text_ctx <= static_cast<int64_t>(std::size(kStartOfTranscript)))
      throw std::runtime_error("n_text_ctx leaves no room for a token");
    const auto tensors = field("tensors").as<std::map<std::string, msgpack::object>>();
    for (const auto& [name, shape] : ExpectedShapes(w.dims)) {
      const auto it = tensors.find(name);
      if (it == tensors.end()) throw std::runtime_error("no weight " + name);
      const auto t = it->second.as<std::map<std::string, msgpack::object>>();
      const std::string dtype = t.at("dtype").as<std::string>();
      const auto got = t.at("shape").as<std::vector<int64_t>>();
      if (got != shape)
        throw std::runtime_error(name + " has shape " + c10::str(c10::IntArrayRef(got)) +
                                 "; expected " + c10::str(c10::IntArrayRef(shape)));
      const msgpack::object& data = t.at("data");
      if (data.type != msgpack::type::BIN) throw std::runtime_error(name + ": data is not bin");
      torch::ScalarType type;
      if (dtype == "float32")
        type = torch::kFloat32;
      else if (dtype == "float16")
        type = torch::kFloat16;
      else if (dtype == "bfloat16")
        type = torch::kBFloat16;
      else
        throw std::runtime_error(name + ": dtype " + dtype +
                                 " (expected float32, float16 "
                                 "or bfloat16)");
      int64_t count = 1;
      for (int64_t n : shape) count *= n;
      if (static_cast<int64_t>(data.via.bin.size) != count * torch::elementSize(type))
        throw std::runtime_error(name + ": " + std::to_string(data.via.bin.size) +
                                 " bytes for shape " + c10::str(c10::IntArrayRef(shape)));
      // from_blob does not copy; .to(float32) (or .clone() for float32) does, before the
      // msgpack buffer goes away.
      torch::Tensor view = torch::from_blob(const_cast<char*>(data.via.bin.ptr), shape, type);
      w.state[name] = type == torch::kFloat32 ? view.clone() : view.to(torch::kFloat32);
    }
    *out = std::move(w);
    return true;
  } catch (const std::exception& e) {  // msgpack type errors, std::out_of_range, the above
    *error = path + ": " + e.what();
    return false;
  }
}

torch::jit::Module MakeWhisper(const WhisperWeights& weights, int64_t max_tokens,
                               const std::vector<int64_t>& suppress) {
  const WhisperDims& d = weights.dims;
  torch::jit::Module m("FerryWhisper");
  auto param = [&](const std::string& name, const torch::Tensor& t) {
    m.register_parameter(name, t.contiguous(), /*is_buffer=*/false);
  };
  auto get = [&](const std::string& name) { return weights.state.at(name); };
  // One block weight of every layer, stacked along a leading layer dimension so that forward
  // can loop; linear weights ([out, in] in Whisper) transposed to [in, out] for matmul.
  auto stack = [&](const char* side, int64_t layers, const std::string& part, bool linear) {
    std::vector<torch::Tensor> ts;
    for (int64_t i = 0; i < layers; ++i) {
      torch::Tensor t = get(std::string(side) + ".blocks." + std::to_string(i) + "." + part);
      ts.push_back(linear ? t.t() : t);
    }
    return torch::stack(ts);
  };
  struct Part {
    const char* ours;
    const char* theirs;
    bool linear;
  };
  const Part enc_parts[] = {
      {"enc_q_w", "attn.query.weight", true},   {"enc_q_b", "attn.query.bias", false},
      {"enc_k_w", "attn.key.weight", true},     {"enc_v_w", "attn.value.weight", true},
      {"enc_v_b", "attn.value.bias", false},    {"enc_o_w", "attn.out.weight", true},
      {"enc_o_b", "attn.out.bias", false},      {"enc_attn_ln_w", "attn_ln.weight", false},
      {"enc_attn_ln_b", "attn_ln.bias", false}, {"enc_mlp1_w", "mlp.0.weight", true},
      {"enc_mlp1_b", "mlp.0.bias", false},      {"enc_mlp2_w", "mlp.2.weight", true},
      {"enc_mlp2_b", "mlp.2.bias", false},      {"enc_mlp_ln_w", "mlp_ln.weight", false},
      {"enc_mlp_ln_b", "mlp_ln.bias", false}};
  for (const Part& p : enc_parts)
    param(p.ours, stack("encoder", d.n_audio_layer, p.theirs, p.linear));
  const Part dec_parts[] = {{"dec_q_w", "attn.query.weight", true},
                            {"dec_q_b", "attn.query.bias", false},
                            {"dec_k_w", "attn.key.weight", true},
                            {"dec_v_w", "attn.value.weight", true},
                            {"dec_v_b", "attn.value.bias", false},
                            {"dec_o_w", "attn.out.weight", true},
                            {"dec_o_b", "attn.out.bias", false},
                            {"dec_attn_ln_w", "attn_ln.weight", false},
                            {"dec_attn_ln_b", "attn_ln.bias", false},
                            {"dec_cq_w", "cross_attn.query.weight", true},
                            {"dec_cq_b", "cross_attn.query.bias", false},
                            {"dec_ck_w", "cross_attn.key.weight", true},
                            {"dec_cv_w", "cross_attn.value.weight", true},
                            {"dec_cv_b", "cross_attn.value.bias", false},
                            {"dec_co_w", "cross_attn.out.weight", true},
                            {"dec_co_b", "cross_attn.out.bias", false},
                            {"dec_cross_ln_w", "cross_attn_ln.weight", false},
                            {"dec_cross_ln_b", "cross_attn_ln.bias", false},
                            {"dec_mlp1_w", "mlp.0.weight", true},
                            {"dec_mlp1_b", "mlp.0.bias", false},
                            {"dec_mlp2_w", "mlp.2.weight", true},
                            {"dec_mlp2_b", "mlp.2.bias", false},
                            {"dec_mlp_ln_w", "mlp_ln.weight", false},
                            {"dec_mlp_ln_b", "mlp_ln.bias", false}};
  for (const Part& p : dec_parts)
    param(p.ours, stack("decoder", d.n_text_layer, p.theirs, p.linear));
  param("enc_conv1_w", get("encoder.conv1.weight"));
  param("enc_conv1_b", get("encoder.conv1.bias"));
  param("enc_conv2_w", get("encoder.conv2.weight"));
  param("enc_conv2_b", get("encoder.conv2.bias"));
  param("enc_pos", get("encoder.positional_embedding"));
  param("enc_ln_w", get("encoder.ln_post.weight"));
  param("enc_ln_b", get("encoder.ln_post.bias"));
  param("dec_tok", get("decoder.token_embedding.weight"));
  param("dec_pos", get("decoder.positional_embedding"));
  param("dec_ln_w", get("decoder.ln.weight"));
  param("dec_ln_b", get("decoder.ln.bias"));
  m.register_buffer("mel_filters", MelFilters(d.n_mels));
  m.register_buffer("sot", torch::tensor(std::vector<int64_t>(std::begin(kStartOfTranscript),
                                                              std::end(kStartOfTranscript))));
  for (int64_t id : suppress)
    if (id < 0 || id >= d.n_vocab)
      throw std::invalid_argument("token id " + std::to_string(id) + " to suppress is not in the " +
                                  "vocabulary (0.." + std::to_string(d.n_vocab - 1) + ")");
  std::vector<int64_t> never(std::begin(kSuppressed), std::end(kSuppressed));
  never.insert(never.end(), suppress.begin(), suppress.end());
  std::sort(never.begin(), never.end());
  never.erase(std::unique(never.begin(), never.end()), never.end());
  m.register_buffer("suppress", torch::tensor(never));
  m.register_buffer("suppress_first",
                    torch::tensor(std::vector<int64_t>(std::begin(kSuppressedFirst),
                                                       std::end(kSuppressedFirst))));
  const int64_t cap = d.n_text_ctx - static_cast<int64_t>(std::size(kStartOfTranscript));
  m.register_attribute("max_tokens", c10::IntType::get(), std::min(max_tokens, cap));
  m.define(Substitute(kSource, {{"AL", d.n_audio_layer},
                                {"AD", d.n_audio_state},
                                {"AH", d.n_audio_head},
                                {"TL", d.n_text_layer},
                                {"TD", d.n_text_state},
                                {"TH", d.n_text_head},
                                {"EOT", kEndOfText},
                                {"MAXS", d.n_audio_ctx * 320}}));
  return m;
}

}  // namespace ferry::testmodels
