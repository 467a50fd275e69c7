// ferry-make-models OUTDIR: writes the TorchScript models that Ferry's tests, demo and
// benchmarks use, built in C++ (torch::jit::Module::define) so that no network or Python is
// needed. The weights are deterministic, so a client in another language can check results.
//
//   tiny.pt     forward(x: [B,8] float32) -> x @ W + b          W[i][j] = 0.01*(i*8+j) - 0.3,
//                                                               b[j] = 0.1*j   ([B,8] float32)
//   multi.pt    forward(a: [B,4] float32, b: [B,3] int64) -> (a * 2.0 + 1.0, b.sum(1))
//   encoder.pt  forward(x: [B,T,384] float32) -> [B,T,384]: 4 pre-norm transformer encoder
//               layers (6 heads, FFN 1536, GELU) and a final layer norm; random weights from
//               torch::manual_seed(0) (Whisper-tiny encoder sized; a benchmark model)
//   resnet.pt   forward(x: [B,3,H,W] float32) -> [B,1000] logits: ResNet-18 (conv 7x7/2, max
//               pool, 4 stages of 2 basic blocks, 64-128-256-512 channels, global average pool,
//               fc). Batch norm is folded into the convolutions' bias, as inference engines do,
//               so the FLOPs are ResNet-18's (1.8 GFLOP at 224x224); any H,W >= 32 works.
//               Random weights from torch::manual_seed(1).
//   resnet_u8.pt  the same network and weights taking x: [B,3,H,W] uint8 (pixels 0-255); it
//               converts on the model's device: x.float() / 255 then ImageNet mean/std.
//   null.pt     forward(x) -> x: computes nothing; measures dispatch and delivery alone.
//   head.pt     forward(x: [B, N] any dtype) -> x[:, :4] as float32 [B, 4]: reads almost nothing
//               of a big input and returns 16 bytes (the big-input benchmark, `audio`).
//   expand.pt   forward(x: [B, 16] float32) -> [B, 240000] float32, x repeated: 960 KB out of
//               64 bytes in (the big-output benchmark, `audio_out`, shaped like TTS audio).
//   slow.pt     forward(x: [B,1] float32) -> x, after int(max(x)) chained 256x256 matmuls
//               (about a millisecond each on one CPU core): a job that takes as long as its
//               input says, for tests of jobs that are running when something happens.
//   underflow.pt  the same chain with w = 0.5 I + 0.001, whose values shrink into float32
//               denormals after ~290 steps: measures ferry-worker --flush-denormals.
//   whisper.pt  forward(pcm: [B, L] int16 16 kHz) -> [B, 24] int64 token ids: a Whisper-tiny-
//               shaped speech-to-text pipeline (log-mel, conv stem + 4-layer encoder, greedy
//               4-layer decoder with a KV cache; whisper_model.h), random weights from
//               torch::manual_seed(2). --whisper-weights builds it from real ones.
#include <torch/script.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ferry/runtime/version.h"
#include "whisper_model.h"

namespace {

torch::jit::Module MakeTiny() {
  torch::jit::Module m("FerryTiny");
  torch::Tensor w = torch::empty({8, 8}, torch::kFloat32);
  torch::Tensor b = torch::empty({8}, torch::kFloat32);
  auto wa = w.accessor<float, 2>();
  auto ba = b.accessor<float, 1>();
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 8; ++j) wa[i][j] = 0.01f * static_cast<float>(i * 8 + j) - 0.3f;
    ba[i] = 0.1f * static_cast<float>(i);
  }
  m.register_parameter("weight", w, /*is_buffer=*/false);
  m.register_parameter("bias", b, /*is_buffer=*/false);
  m.define(R"(
def forward(self, x):
    return torch.matmul(x, self.weight) + self.bias
)");
  return m;
}

torch::jit::Module MakeMulti() {
  torch::jit::Module m("FerryMulti");
  m.define(R"(
def forward(self, a, b):
    return (a * 2.0 + 1.0, b.sum(1))
)");
  return m;
}

constexpr int64_t kLayers = 4, kModel = 384, kHeads = 6, kFfn = 1536;

torch::Tensor Weights(std::initializer_list<int64_t> shape, int64_t fan_in) {
  return torch::randn(shape) * (1.0 / std::sqrt(static_cast<double>(fan_in)));
}

torch::jit::Module MakeEncoder() {
  torch::manual_seed(0);
  torch::jit::Module m("FerryEncoder");
  auto param = [&](const char* name, torch::Tensor t) {
    m.register_parameter(name, t.contiguous(), /*is_buffer=*/false);
  };
  // Per-layer weights are stacked along a leading layer dimension so forward can loop.
  param("ln1_w", torch::ones({kLayers, kModel}));
  param("ln1_b", torch::zeros({kLayers, kModel}));
  param("w_qkv", Weights({kLayers, kModel, 3 * kModel}, kModel));
  param("b_qkv", torch::randn({kLayers, 3 * kModel}) * 0.02);
  param("w_o", Weights({kLayers, kModel, kModel}, kModel));
  param("b_o", torch::randn({kLayers, kModel}) * 0.02);
  param("ln2_w", torch::ones({kLayers, kModel}));
  param("ln2_b", torch::zeros({kLayers, kModel}));
  param("w_1", Weights({kLayers, kModel, kFfn}, kModel));
  param("b_1", torch::randn({kLayers, kFfn}) * 0.02);
  param("w_2", Weights({kLayers, kFfn, kModel}, kFfn));
  param("b_2", torch::randn({kLayers, kModel}) * 0.02);
  param("lnf_w", torch::ones({kModel}));
  param("lnf_b", torch::zeros({kModel}));
  m.define(R"(
def forward(self, x):
    B = x.size(0)
    T = x.size(1)
    for i in range(4):
        h = torch.layer_norm(x, [384], self.ln1_w[i], self.ln1_b[i], 1e-5)
        qkv = torch.matmul(h, self.w_qkv[i]) + self.b_qkv[i]
        q = qkv[:, :, 0:384].reshape(B, T, 6, 64).transpose(1, 2)
        k = qkv[:, :, 384:768].reshape(B, T, 6, 64).transpose(1, 2)
        v = qkv[:, :, 768:1152].reshape(B, T, 6, 64).transpose(1, 2)
        att = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * 0.125, -1)
        o = torch.matmul(att, v).transpose(1, 2).reshape(B, T, 384)
        x = x + torch.matmul(o, self.w_o[i]) + self.b_o[i]
        h = torch.layer_norm(x, [384], self.ln2_w[i], self.ln2_b[i], 1e-5)
        h = torch.gelu(torch.matmul(h, self.w_1[i]) + self.b_1[i])
        x = x + torch.matmul(h, self.w_2[i]) + self.b_2[i]
    return torch.layer_norm(x, [384], self.lnf_w, self.lnf_b, 1e-5)
)");
  static_assert(kModel / kHeads == 64, "head size is written into forward");
  return m;
}

// ---- ResNet-18 -------------------------------------------------------------------------------

struct ResNetWeights {
  std::vector<std::pair<std::string, torch::Tensor>> params;  // name -> tensor, in order
};

// Conv weights He-scaled (std sqrt(2/fan_in)) times 0.5 on the second conv of each block, so
// the activations stay bounded through the residual sum with random weights.
ResNetWeights MakeResNetWeights() {
  torch::manual_seed(1);
  ResNetWeights w;
  auto conv = [&](const std::string& name, int64_t out, int64_t in, int64_t k, double scale) {
    const double std_dev = std::sqrt(2.0 / static_cast<double>(in * k * k)) * scale;
    w.params.emplace_back(name + "_w", torch::randn({out, in, k, k}) * std_dev);
    w.params.emplace_back(name + "_b", torch::randn({out}) * 0.01);
  };
  conv("conv1", 64, 3, 7, 1.0);
  const int64_t channels[] = {64, 128, 256, 512};
  int64_t in = 64;
  for (int stage = 0; stage < 4; ++stage) {
    for (int block = 0; block < 2; ++block) {
      const std::string p = "l" + std::to_string(stage + 1) + "_" + std::to_string(block);
      const int64_t out = channels[stage];
      conv(p + "_c1", out, in, 3, 1.0);
      conv(p + "_c2", out, out, 3, 0.5);
      if (block == 0 && stage > 0) conv(p + "_d", out, in, 1, 1.0);
      in = out;
    }
  }
  w.params.emplace_back("fc_w", torch::randn({1000, 512}) * (1.0 / std::sqrt(512.0)));
  w.params.emplace_back("fc_b", torch::zeros({1000}));
  return w;
}

// TorchScript source of the network; `prologue` turns the input into float32 `x`.
std::string ResNetSource(const std::string& prologue) {
  std::string src = R"(
def block(self, x, w1, b1, w2, b2, stride: int):
    h = torch.relu(torch.conv2d(x, w1, b1, [stride, stride], [1, 1]))
    h = torch.conv2d(h, w2, b2, [1, 1], [1, 1])
    return torch.relu(h + x)

def down(self, x, w1, b1, w2, b2, wd, bd):
    h = torch.relu(torch.conv2d(x, w1, b1, [2, 2], [1, 1]))
    h = torch.conv2d(h, w2, b2, [1, 1], [1, 1])
    return torch.relu(h + torch.conv2d(x, wd, bd, [2, 2], [0, 0]))

def forward(self, x):
)";
  src += prologue;
  src += "    x = torch.relu(torch.conv2d(x, self.conv1_w, self.conv1_b, [2, 2], [3, 3]))\n";
  src += "    x = torch.max_pool2d(x, [3, 3], [2, 2], [1, 1])\n";
  for (int stage = 1; stage <= 4; ++stage) {
    for (int block = 0; block < 2; ++block) {
      const std::string p = "self.l" + std::to_string(stage) + "_" + std::to_string(block);
      const std::string c = p + "_c1_w, " + p + "_c1_b, " + p + "_c2_w, " + p + "_c2_b";
      if (block == 0 && stage > 1)
        src += "    x = self.down(x, " + c + ", " + p + "_d_w, " + p + "_d_b)\n";
      else
        src += "    x = self.block(x, " + c + ", 1)\n";
    }
  }
  src += "    x = torch.mean(x, [2, 3])\n";
  src += "    return torch.matmul(x, self.fc_w.t()) + self.fc_b\n";
  return src;
}

torch::jit::Module MakeResNet(const ResNetWeights& w, bool uint8_input) {
  torch::jit::Module m(uint8_input ? "FerryResNet18U8" : "FerryResNet18");
  for (const auto& [name, t] : w.params)
    m.register_parameter(name, t.contiguous(), /*is_buffer=*/false);
  std::string prologue;
  if (uint8_input) {
    m.register_buffer("mean", torch::tensor({0.485f, 0.456f, 0.406f}).view({1, 3, 1, 1}));
    m.register_buffer("std", torch::tensor({0.229f, 0.224f, 0.225f}).view({1, 3, 1, 1}));
    prologue = "    x = (x.float() / 255.0 - self.mean) / self.std\n";
  }
  m.define(ResNetSource(prologue));
  return m;
}

torch::jit::Module MakeHead() {
  torch::jit::Module m("FerryHead");
  m.define(R"(
def forward(self, x):
    return x.reshape(x.size(0), -1)[:, :4].float()
)");
  return m;
}

torch::jit::Module MakeExpand() {
  torch::jit::Module m("FerryExpand");
  m.define(R"(
def forward(self, x):
    return x.repeat(1, 15000)
)");
  return m;
}

torch::jit::Module MakeNull() {
  torch::jit::Module m("FerryNull");
  m.define(R"(
def forward(self, x):
    return x
)");
  return m;
}

// Chained tanh(y w), w = 0.5 I + off_diagonal. With 0.01 it settles near 0.995 in every entry;
// with 0.001 it shrinks into float32 denormals after ~290 steps, and matmuls on denormals are
// ~50x slower on Intel CPUs (an Intel VM: 1000 steps 14.5 s, 0.3 s with the denormals flushed
// to zero), not on AMD.
torch::jit::Module MakeChain(const char* name, double off_diagonal) {
  torch::jit::Module m(name);
  torch::Tensor w = torch::eye(256, torch::kFloat32) * 0.5 + off_diagonal;
  m.register_buffer("w", w);
  m.define(R"(
def forward(self, x):
    n = int(x.max())
    y = self.w
    for i in range(n):
        y = torch.tanh(torch.matmul(y, self.w))
    return x + 0.0 * y.sum()
)");
  return m;
}

// Tokens whisper.pt decodes per clip: about what 5-10 s of English speech decodes to. Random
// weights rarely produce end-of-text, so every clip costs this many decoder steps.
constexpr int64_t kWhisperTokens = 24;

constexpr const char* kUsage =
    "usage: ferry-make-models OUTDIR [MODEL...]\n"
    "       ferry-make-models --whisper-weights WEIGHTS [--max-tokens N] [--suppress-tokens IDS]\n"
    "                         OUT.pt\n"
    "The first form writes tiny.pt, multi.pt, encoder.pt, resnet.pt, resnet_u8.pt, null.pt,\n"
    "head.pt, expand.pt, slow.pt, underflow.pt and whisper.pt (TorchScript, fixed random\n"
    "weights) into OUTDIR; given MODEL names (tiny, whisper, ...), only those.\n"
    "The second builds the Whisper pipeline from real weights: WEIGHTS is what\n"
    "scripts/whisper_import.py (ferry-whisper-import) makes of an openai-whisper checkpoint;\n"
    "it runs this for you.\n"
    "--max-tokens: tokens decoded per clip (default 224, at most n_text_ctx - 4).\n"
    "--suppress-tokens: comma-separated token ids never to decode, besides Whisper's special\n"
    "tokens (e.g. its tokenizer's non_speech_tokens, as openai-whisper's default \"-1\").\n";

int Fail(const std::string& what) {
  std::fprintf(stderr, "ferry-make-models: %s\n", what.c_str());
  return 1;
}

// ferry-make-models --whisper-weights WEIGHTS [--max-tokens N] [--suppress-tokens IDS] OUT.pt
int ImportWhisper(const std::vector<std::string>& args) {
  std::string weights_path, out;
  int64_t max_tokens = 224;
  std::vector<int64_t> suppress;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--whisper-weights" && i + 1 < args.size()) {
      weights_path = args[++i];
    } else if (args[i] == "--max-tokens" && i + 1 < args.size()) {
      char* end = nullptr;
      max_tokens = std::strtoll(args[++i].c_str(), &end, 10);
      if (*end != '\0' || max_tokens < 1) return Fail("--max-tokens must be a positive integer");
    } else if (args[i] == "--suppress-tokens" && i + 1 < args.size()) {
      std::stringstream list(args[++i]);
      for (std::string item; std::getline(list, item, ',');) {
        char* end = nullptr;
        const int64_t id = std::strtoll(item.c_str(), &end, 10);
        if (item.empty() || *end != '\0' || id < 0)
          return Fail("--suppress-tokens takes comma-separated token ids, not \"" + item + "\"");
        suppress.push_back(id);
      }
    } else if (out.empty() && args[i].rfind("--", 0) != 0) {
      out = args[i];
    } else {
      std::fputs(kUsage, stderr);
      return 2;
    }
  }
  if (weights_path.empty() || out.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  ferry::testmodels::WhisperWeights weights;
  std::string error;
  if (!ferry::testmodels::LoadWhisperWeights(weights_path, &weights, &error)) return Fail(error);
  try {
    ferry::testmodels::MakeWhisper(weights, max_tokens, suppress).save(out);
  } catch (const std::invalid_argument& e) {
    return Fail(e.what());
  }
  std::printf("%s\n", out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 1 && (args[0] == "--help" || args[0] == "-h")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (args.size() == 1 && args[0] == "--version") {
    std::printf("%s\n", ferry::runtime::VersionLine("ferry-make-models").c_str());
    return 0;
  }
  try {
    if (!args.empty() && args[0].rfind("--", 0) == 0) return ImportWhisper(args);
    if (args.empty()) {
      std::fputs(kUsage, stderr);
      return 2;
    }
    const std::filesystem::path dir = args[0];
    const std::vector<std::string> wanted(args.begin() + 1, args.end());
    using Factory = std::function<torch::jit::Module()>;
    const std::vector<std::pair<std::string, Factory>> models = {
        {"tiny", MakeTiny},
        {"multi", MakeMulti},
        {"encoder", MakeEncoder},
        {"resnet", [] { return MakeResNet(MakeResNetWeights(), /*uint8_input=*/false); }},
        {"resnet_u8", [] { return MakeResNet(MakeResNetWeights(), /*uint8_input=*/true); }},
        {"null", MakeNull},
        {"head", MakeHead},
        {"expand", MakeExpand},
        {"slow", [] { return MakeChain("FerrySlow", 0.01); }},
        {"underflow", [] { return MakeChain("FerryUnderflow", 0.001); }},
        {"whisper", [] {
           return ferry::testmodels::MakeWhisper(ferry::testmodels::RandomWhisperWeights(2),
                                                 kWhisperTokens);
         }}};
    for (const std::string& name : wanted) {
      if (std::none_of(models.begin(), models.end(),
                       [&](const auto& m) { return m.first == name; }))
        return Fail("no model named " + name);
    }
    std::filesystem::create_directories(dir);
    for (const auto& [name, make] : models) {
      if (!wanted.empty() && std::find(wanted.begin(), wanted.end(), name) == wanted.end())
        continue;
      const std::string path = (dir / (name + ".pt")).string();
      make().save(path);
      std::printf("%s\n", path.c_str());
    }
  } catch (const c10::Error& e) {
    return Fail(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return Fail(e.what());
  }
  return 0;
}
