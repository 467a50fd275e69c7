// The Whisper-shaped pipeline of ferry-make-models (tests/testutil/whisper_model.h): its log-mel
// against a plain DFT, its KV-cache decoder against recomputing every step, a batch against
// each clip alone, other dims; and the import path for real weights: a checkpoint in
// openai-whisper's layout, written by libtorch's torch.save-compatible pickler, goes through
// scripts/whisper_import.py and ferry-make-models and gives the same module as its weights.
#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/script.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <msgpack.hpp>

#include "ferry/worker/half_precision.h"
#include "process.h"
#include "whisper_model.h"

namespace ferry::testmodels {
namespace {

// Clips unlike each other, int16 [batch, samples]: clip i is a low voice-like tone (100-300
// Hz with harmonics) when i % 3 == 0, a high whistle (0.6-2 kHz) when 1, noise when 2; pitch
// and loudness drawn from `seed`.
torch::Tensor Clips(int64_t batch, int64_t samples, uint64_t seed) {
  torch::manual_seed(seed);
  const torch::Tensor t = torch::arange(samples, torch::kFloat64) / 16000.0;
  torch::Tensor x = torch::zeros({batch, samples}, torch::kFloat64);
  for (int64_t i = 0; i < batch; ++i) {
    const double u = torch::rand({1}, torch::kFloat64).item<double>();
    if (i % 3 == 2) {
      x[i] = torch::randn({samples}, torch::kFloat64) * 0.1;
      continue;
    }
    const double f0 = i % 3 == 0 ? 100.0 + 200.0 * u : 600.0 + 1400.0 * u;
    for (int h = 1; h <= 3; ++h) x[i] += torch::sin(2 * M_PI * h * f0 * t) / h;
    x[i] *= 0.1 + 0.5 * u;
  }
  x += 0.003 * torch::randn({batch, samples}, torch::kFloat64);
  return (x * 32767.0).clamp(-32768, 32767).to(torch::kInt16);
}

WhisperDims SmallDims() {
  WhisperDims d;
  d.n_audio_state = d.n_text_state = 64;
  d.n_audio_head = d.n_text_head = 2;
  d.n_audio_layer = d.n_text_layer = 2;
  return d;
}

std::set<int64_t> Distinct(const torch::Tensor& tokens) {
  torch::Tensor flat = tokens.flatten().contiguous();
  return std::set<int64_t>(flat.data_ptr<int64_t>(), flat.data_ptr<int64_t>() + flat.numel());
}

class WhisperTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tiny_ = new torch::jit::Module(MakeWhisper(RandomWhisperWeights(2), 12));
  }
  static void TearDownTestSuite() { delete tiny_; }
  static torch::jit::Module* tiny_;
  torch::NoGradGuard no_grad_;
};
torch::jit::Module* WhisperTest::tiny_ = nullptr;

TEST_F(WhisperTest, TheKvCacheDecodesWhatRecomputingEverythingDecodes) {
  torch::Tensor audio =
      tiny_->run_method("encode", tiny_->run_method("log_mel", Clips(2, 16000, 1))).toTensor();
  ASSERT_EQ(audio.sizes(), (std::vector<int64_t>{2, 50, 384}));  // 1 s: 100 frames, stride 2
  torch::Tensor cached = tiny_->run_method("decode", audio, 12).toTensor();
  torch::Tensor full = tiny_->run_method("decode_without_cache", audio, 12).toTensor();
  ASSERT_EQ(cached.sizes(), (std::vector<int64_t>{2, 12}));
  EXPECT_EQ(cached.scalar_type(), torch::kInt64);
  EXPECT_TRUE(torch::equal(cached, full)) << cached << "\n" << full;
  // The comparison says something: the decoder does not emit one constant token.
  EXPECT_GT(Distinct(cached).size(), 2u) << cached;
}

TEST_F(WhisperTest, AClipDecodesTheSameInABatchAsAlone) {
  torch::Tensor pcm = Clips(3, 24000, 2);
  torch::Tensor batched = tiny_->forward({pcm}).toTensor();
  ASSERT_EQ(batched.sizes(), (std::vector<int64_t>{3, 12}));
  for (int64_t i = 0; i < 3; ++i) {
    torch::Tensor alone = tiny_->forward({pcm.slice(0, i, i + 1)}).toTensor();
    EXPECT_TRUE(torch::equal(alone[0], batched[i])) << i << ": " << alone << "\n" << batched;
  }
  // The transcript depends on the clip (so the comparison above could fail).
  EXPECT_FALSE(torch::equal(batched[0], batched[1]) && torch::equal(batched[1], batched[2]))
      << batched;
  const torch::Tensor in_vocab = (batched >= 0) & (batched < 51865);
  EXPECT_TRUE(in_vocab.all().item<bool>());
}

// A clip shorter than two frames is padded with silence (the STFT's reflection needs more than
// 200 samples); one longer than the 1,500 audio positions hold (30 s) fails with a message
// that says so, not in the encoder's shapes.
TEST_F(WhisperTest, ATinyClipDecodesAndOneOver30SecondsIsRefusedByName) {
  for (int64_t samples : {0, 1, 100, 399}) {
    const torch::Tensor tokens = tiny_->forward({Clips(2, samples, 3)}).toTensor();
    EXPECT_EQ(tokens.sizes(), (std::vector<int64_t>{2, 12})) << samples;
  }
  const torch::Tensor too_long = torch::zeros({1, 480001}, torch::kInt16);
  try {
    tiny_->forward({too_long});
    ADD_FAILURE() << "a clip of 480001 samples decoded";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("a clip of 480001 samples; at most 480000"),
              std::string::npos)
        << e.what();
  }
}

// openai-whisper's greedy decoding never picks its special tokens, nor " " (220) or
// end-of-text first. Weights that make each win: its row of the token embedding (which is also
// the output projection) set to 4x the row of a token the model picks, so its logit is 4x that
// token's (positive, the largest) logit. The same module with nothing suppressed picks it.
TEST(WhisperSuppressTest, SpecialTokensALeadingBlankAndTheGivenIdsAreNeverDecoded) {
  torch::NoGradGuard no_grad;
  const WhisperWeights w = RandomWhisperWeights(2, SmallDims());
  const torch::Tensor pcm = Clips(3, 16000, 9);
  const torch::Tensor plain = MakeWhisper(w, 12).forward({pcm}).toTensor();
  const int64_t first = plain[0][0].item<int64_t>(), later = plain[0][3].item<int64_t>();
  auto with_row = [&](int64_t row, int64_t like) {
    WhisperWeights v = w;
    torch::Tensor emb = v.state.at("decoder.token_embedding.weight").clone();
    emb[row] = 4 * emb[like];
    v.state["decoder.token_embedding.weight"] = emb;
    return MakeWhisper(v, 12);
  };
  // The special tokens that are not in the start-of-transcript prompt (sot and transcribe are:
  // their rows are its inputs too), each made to win.
  for (int64_t special : {50358, 50360, 50361, 50362}) {
    torch::jit::Module m = with_row(special, later);
    const torch::Tensor got = m.forward({pcm}).toTensor();
    EXPECT_EQ(Distinct(got).count(special), 0u) << special << " in " << got;
    m.register_buffer("suppress", torch::empty({0}, torch::kInt64));
    const torch::Tensor free = m.forward({pcm}).toTensor();
    EXPECT_EQ(Distinct(free).count(special), 1u) << special << " not in " << free;
  }
  // " " and end-of-text, each made to win first.
  for (int64_t blank : {220, 50257}) {
    torch::jit::Module m = with_row(blank, first);
    const torch::Tensor got = m.forward({pcm}).toTensor();
    for (int64_t i = 0; i < 3; ++i) {
      EXPECT_NE(got[i][0].item<int64_t>(), 220) << got;
      EXPECT_NE(got[i][0].item<int64_t>(), 50257) << got;
    }
    m.register_buffer("suppress_first", torch::empty({0}, torch::kInt64));
    const torch::Tensor free = m.forward({pcm}).toTensor();
    EXPECT_EQ(free[0][0].item<int64_t>(), blank) << free;
  }
  // Ids given to MakeWhisper (a tokenizer's non_speech_tokens, say) join them.
  const torch::Tensor got = MakeWhisper(w, 12, {later, first}).forward({pcm}).toTensor();
  EXPECT_EQ(Distinct(got).count(later) + Distinct(got).count(first), 0u) << got;
  EXPECT_THROW(MakeWhisper(w, 12, {51865}), std::invalid_argument);
}

// Whisper's log-mel, computed here the slow way in float64: reflect-pad 200, periodic Hann
// window of 400, |DFT|^2 of bins 0..200 every 160 samples (the last frame dropped), Slaney mel
// filters, log10 clamped at 1e-10, floored at max - 8, then (x + 4) / 4.
torch::Tensor ReferenceLogMel(const torch::Tensor& pcm16) {
  const int64_t L = pcm16.size(0), frames = L / 160;
  std::vector<double> x(static_cast<size_t>(L + 400));
  auto src = pcm16.accessor<int16_t, 1>();
  for (int64_t i = 0; i < L + 400; ++i) {
    int64_t j = i - 200;
    if (j < 0) j = -j;
    if (j >= L) j = 2 * (L - 1) - j;
    x[i] = src[j] / 32768.0;
  }
  const torch::Tensor filters = MelFilters(80).to(torch::kFloat64);
  torch::Tensor power = torch::zeros({201, frames}, torch::kFloat64);
  auto p = power.accessor<double, 2>();
  for (int64_t f = 0; f < frames; ++f) {
    for (int64_t k = 0; k <= 200; ++k) {
      double re = 0, im = 0;
      for (int64_t n = 0; n < 400; ++n) {
        const double w = 0.5 - 0.5 * std::cos(2 * M_PI * n / 400.0);
        const double a = -2 * M_PI * k * n / 400.0;
        re += x[f * 160 + n] * w * std::cos(a);
        im += x[f * 160 + n] * w * std::sin(a);
      }
      p[k][f] = re * re + im * im;
    }
  }
  torch::Tensor logm = torch::matmul(filters, power).clamp_min(1e-10).log10();
  logm = torch::maximum(logm, logm.max() - 8.0);
  return (logm + 4.0) / 4.0;
}

TEST_F(WhisperTest, LogMelIsWhispersSpectrogram) {
  torch::Tensor pcm = Clips(1, 4000, 3);
  torch::Tensor mel = tiny_->run_method("log_mel", pcm).toTensor();
  ASSERT_EQ(mel.sizes(), (std::vector<int64_t>{1, 80, 25}));  // 4000 / 160 frames
  torch::Tensor expected = ReferenceLogMel(pcm[0]).to(torch::kFloat32);
  EXPECT_LT((mel[0] - expected).abs().max().item<float>(), 2e-3) << (mel[0] - expected).abs().max();

  // A 1 kHz tone is brightest in the mel band whose filter weighs 1 kHz (FFT bin 25) most.
  torch::Tensor t = torch::arange(8000, torch::kFloat64) / 16000.0;
  torch::Tensor tone = (torch::sin(2 * M_PI * 1000.0 * t) * 10000).to(torch::kInt16).unsqueeze(0);
  torch::Tensor tone_mel = tiny_->run_method("log_mel", tone).toTensor();
  const int64_t band = MelFilters(80).select(1, 25).argmax().item<int64_t>();
  EXPECT_EQ(tone_mel[0].select(1, 25).argmax().item<int64_t>(), band);
}

// The filterbank on its own: ReferenceLogMel above takes MelFilters as given. Values of
// librosa.filters.mel(sr=16000, n_fft=400, n_mels=80) (Slaney), from a numpy transcription of
// librosa's code; filter 0 by hand: mel edges 0, 37.24 and 74.48 Hz, so bin 1 (40 Hz) weighs
// (74.48 - 40) / 37.24 * 2 / 74.48 = 0.0248626, and bin 2 (80 Hz) nothing.
TEST(WhisperMelFiltersTest, AreLibrosasSlaneyFilterbank) {
  const torch::Tensor f = MelFilters(80);
  ASSERT_EQ(f.sizes(), (std::vector<int64_t>{80, 201}));
  EXPECT_NEAR(f[0][1].item<float>(), 0.0248626f, 1e-6);
  EXPECT_EQ(f[0][2].item<float>(), 0.0f);
  EXPECT_EQ(f[20].argmax().item<int64_t>(), 20);  // linear below 1 kHz
  EXPECT_NEAR(f[20].max().item<float>(), 0.0138904f, 1e-6);
  EXPECT_EQ(f[40].argmax().item<int64_t>(), 43);  // logarithmic above
  EXPECT_NEAR(f[40].max().item<float>(), 0.0147356f, 1e-6);
  const torch::Tensor top = f[79].nonzero().flatten();
  EXPECT_EQ(top[0].item<int64_t>(), 186);
  EXPECT_EQ(top[-1].item<int64_t>(), 199);
  EXPECT_NEAR(f[79][199].item<float>(), 0.000448759f, 1e-8);
}

// `half = true` (the worker's ToHalfPrecision): the weights and the filterbank become float16,
// the token ids (start of transcript, suppressed) stay int64 (the decoder indexes with them),
// and the log-mel is still computed in float32 before it is handed over in float16. The float16
// forward itself needs a GPU (gpu_test.cc, WhisperRunsInHalfPrecision).
TEST(WhisperHalfTest, HalfPrecisionCastsWeightsNotTokenIds) {
  torch::NoGradGuard no_grad;
  torch::jit::Module m = MakeWhisper(RandomWhisperWeights(5, SmallDims()), 8);
  torch::Tensor clips = Clips(2, 8000, 4);
  torch::Tensor want = m.run_method("log_mel", clips).toTensor();
  worker::ToHalfPrecision(&m);
  for (const auto& p : m.named_parameters())
    EXPECT_EQ(p.value.scalar_type(), torch::kHalf) << p.name;
  const std::set<std::string> ids = {"sot", "suppress", "suppress_first"};
  for (const auto& b : m.named_buffers())
    EXPECT_EQ(b.value.scalar_type(), ids.count(b.name) ? torch::kInt64 : torch::kHalf) << b.name;
  torch::Tensor got = m.run_method("log_mel", clips).toTensor();
  EXPECT_EQ(got.scalar_type(), torch::kHalf);
  EXPECT_LT((got.to(torch::kFloat32) - want).abs().max().item<float>(), 2e-3);
}

TEST(WhisperDimsTest, OtherDimsBuildAndRun) {
  torch::NoGradGuard no_grad;
  torch::jit::Module small = MakeWhisper(RandomWhisperWeights(5, SmallDims()), 8);
  torch::Tensor tokens = small.forward({Clips(2, 8000, 4)}).toTensor();
  ASSERT_EQ(tokens.sizes(), (std::vector<int64_t>{2, 8}));
  EXPECT_TRUE(((tokens >= 0) & (tokens < 51865)).all().item<bool>());
}

// ---- real weights: the import path -----------------------------------------------------------

class WhisperImportTest : public ::testing::Test {
 protected:
  // openai-whisper's checkpoint layout, {"dims": {...}, "model_state_dict": {...}} with float16
  // weights, through torch::pickle_save (a zip that torch.load reads).
  void WriteCheckpoint(const WhisperWeights& w, const std::string& path,
                       const std::string& drop = "") {
    c10::Dict<std::string, int64_t> dims;
    const WhisperDims& d = w.dims;
    for (const auto& [name, value] :
         std::vector<std::pair<std::string, int64_t>>{{"n_mels", d.n_mels},
                                                      {"n_audio_ctx", d.n_audio_ctx},
                                                      {"n_audio_state", d.n_audio_state},
                                                      {"n_audio_head", d.n_audio_head},
                                                      {"n_audio_layer", d.n_audio_layer},
                                                      {"n_vocab", d.n_vocab},
                                                      {"n_text_ctx", d.n_text_ctx},
                                                      {"n_text_state", d.n_text_state},
                                                      {"n_text_head", d.n_text_head},
                                                      {"n_text_layer", d.n_text_layer}})
      dims.insert(name, value);
    c10::Dict<std::string, torch::Tensor> state;
    for (const auto& [name, t] : w.state)
      if (name != drop) state.insert(name, t.to(torch::kFloat16));
    c10::impl::GenericDict root(c10::StringType::get(), c10::AnyType::get());
    root.insert("dims", dims);
    root.insert("model_state_dict", state);
    const std::vector<char> bytes = torch::jit::pickle_save(root);
    std::ofstream(path, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }

  // Runs the import script; its exit code, its output in *output.
  int Import(const std::string& checkpoint, const std::string& out, std::string* output,
             const std::string& suppress = "") {
    const std::string log = dir_.path() + "/import.log";
    std::vector<std::string> argv = {FERRY_PYTHON3,     FERRY_WHISPER_IMPORT, "--make-models",
                                     FERRY_MAKE_MODELS, "--max-tokens",       "8"};
    if (!suppress.empty()) argv.insert(argv.end(), {"--suppress-tokens", suppress});
    argv.insert(argv.end(), {checkpoint, out});
    testutil::Process p(argv, log);
    const int rc = p.Wait(std::chrono::seconds(120));
    *output = p.Log();
    return rc;
  }

  testutil::TempDir dir_;
  torch::NoGradGuard no_grad_;
};

TEST_F(WhisperImportTest, ACheckpointBuildsTheModuleItsWeightsBuild) {
  WhisperWeights w = RandomWhisperWeights(6, SmallDims());
  const std::string checkpoint = dir_.path() + "/small.pt", out = dir_.path() + "/whisper.pt";
  WriteCheckpoint(w, checkpoint);
  std::string output;
  ASSERT_EQ(Import(checkpoint, out, &output), 0) << output;

  // What the checkpoint holds is float16: round the weights the same way for the expectation.
  for (auto& [name, t] : w.state) t = t.to(torch::kFloat16).to(torch::kFloat32);
  torch::jit::Module expected = MakeWhisper(w, 8);
  torch::jit::Module imported = torch::jit::load(out);
  EXPECT_TRUE(torch::equal(imported.attr("dec_tok").toTensor(),
                           w.state.at("decoder.token_embedding.weight")));
  EXPECT_TRUE(torch::equal(imported.attr("enc_q_w").toTensor()[1],
                           w.state.at("encoder.blocks.1.attn.query.weight").t()));
  torch::Tensor pcm = Clips(2, 16000, 7);
  torch::Tensor got = imported.forward({pcm}).toTensor();
  EXPECT_TRUE(torch::equal(got, expected.forward({pcm}).toTensor())) << got;
  EXPECT_EQ(got.sizes(), (std::vector<int64_t>{2, 8}));

  // --suppress-tokens: ids never decoded, as MakeWhisper's `suppress`.
  const int64_t id = got[0][1].item<int64_t>();
  ASSERT_EQ(Import(checkpoint, out, &output, "7," + std::to_string(id)), 0) << output;
  got = torch::jit::load(out).forward({pcm}).toTensor();
  EXPECT_EQ(Distinct(got).count(id), 0u) << got;
  EXPECT_TRUE(torch::equal(got, MakeWhisper(w, 8, {7, id}).forward({pcm}).toTensor())) << got;
  EXPECT_NE(Import(checkpoint, out, &output, "7,51865"), 0);
  EXPECT_NE(output.find("not in the vocabulary"), std::string::npos) << output;
  EXPECT_NE(Import(checkpoint, out, &output, "7,x"), 0);
  EXPECT_NE(output.find("comma-separated token ids"), std::string::npos) << output;
}

TEST_F(WhisperImportTest, AMissingWeightIsNamedAndNothingIsWritten) {
  const std::string checkpoint = dir_.path() + "/small.pt", out = dir_.path() + "/whisper.pt";
  WriteCheckpoint(RandomWhisperWeights(6, SmallDims()), checkpoint,
                  /*drop=*/"decoder.blocks.1.cross_attn.key.weight");
  std::string output;
  EXPECT_EQ(Import(checkpoint, out, &output), 1) << output;
  EXPECT_NE(output.find("no weight decoder.blocks.1.cross_attn.key.weight"), std::string::npos)
      << output;
  EXPECT_FALSE(std::ifstream(out).good());
}

// A weights file of the wrong shape, dims or format (what a mismatched checkpoint makes).
TEST_F(WhisperImportTest, WeightsOfTheWrongShapeOrDimsAreRefused) {
  const WhisperWeights w = RandomWhisperWeights(6, SmallDims());
  auto write = [&](const std::string& format, int64_t n_vocab, const std::string& bad_name,
                   int64_t n_mels = 80) {
    msgpack::sbuffer buf;
    msgpack::packer<msgpack::sbuffer> pk(buf);
    pk.pack_map(3);
    pk.pack("format");
    pk.pack(format);
    pk.pack("dims");
    const WhisperDims& d = w.dims;
    pk.pack(std::map<std::string, int64_t>{{"n_mels", n_mels},
                                           {"n_audio_ctx", d.n_audio_ctx},
                                           {"n_audio_state", d.n_audio_state},
                                           {"n_audio_head", d.n_audio_head},
                                           {"n_audio_layer", d.n_audio_layer},
                                           {"n_vocab", n_vocab},
                                           {"n_text_ctx", d.n_text_ctx},
                                           {"n_text_state", d.n_text_state},
                                           {"n_text_head", d.n_text_head},
                                           {"n_text_layer", d.n_text_layer}});
    pk.pack("tensors");
    pk.pack_map(static_cast<uint32_t>(w.state.size()));
    for (const auto& [name, t0] : w.state) {
      torch::Tensor t = name == bad_name ? t0.flatten() : t0;
      pk.pack(name);
      pk.pack_map(3);
      pk.pack("dtype");
      pk.pack("float32");
      pk.pack("shape");
      pk.pack(t.sizes().vec());
      pk.pack("data");
      pk.pack_bin(static_cast<uint32_t>(t.nbytes()));
      pk.pack_bin_body(static_cast<const char*>(t.data_ptr()), static_cast<uint32_t>(t.nbytes()));
    }
    const std::string path = dir_.path() + "/w.msgpack";
    std::ofstream(path, std::ios::binary)
        .write(buf.data(), static_cast<std::streamsize>(buf.size()));
    return path;
  };
  WhisperWeights loaded;
  std::string error;
  ASSERT_TRUE(LoadWhisperWeights(write("ferry-whisper-weights/1", 51865, ""), &loaded, &error))
      << error;
  EXPECT_TRUE(
      torch::equal(loaded.state.at("encoder.conv1.weight"), w.state.at("encoder.conv1.weight")));

  EXPECT_FALSE(LoadWhisperWeights(write("ferry-whisper-weights/1", 51865, "encoder.conv2.weight"),
                                  &loaded, &error));
  EXPECT_NE(error.find("encoder.conv2.weight has shape [12288]; expected [64, 64, 3]"),
            std::string::npos)
      << error;
  // Dims that do not match the weights (128 mels: large-v3's count).
  EXPECT_FALSE(
      LoadWhisperWeights(write("ferry-whisper-weights/1", 51865, "", 128), &loaded, &error));
  EXPECT_NE(error.find("encoder.conv1.weight has shape [64, 80, 3]; expected [64, 128, 3]"),
            std::string::npos)
      << error;
  // An English-only vocabulary (tiny.en: 51864), whose special tokens are numbered otherwise.
  EXPECT_FALSE(LoadWhisperWeights(write("ferry-whisper-weights/1", 51864, ""), &loaded, &error));
  EXPECT_NE(error.find("not 51865"), std::string::npos) << error;
  EXPECT_FALSE(LoadWhisperWeights(write("something-else", 51865, ""), &loaded, &error));
  EXPECT_NE(error.find("format"), std::string::npos) << error;
}

}  // namespace
}  // namespace ferry::testmodels
