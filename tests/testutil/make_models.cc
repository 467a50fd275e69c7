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
#include <torch/script.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

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

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::fprintf(argc == 2 ? stdout : stderr,
                 "usage: ferry-make-models OUTDIR\n"
                 "Writes tiny.pt, multi.pt and encoder.pt (TorchScript) into OUTDIR.\n");
    return argc == 2 ? 0 : 2;
  }
  const std::filesystem::path dir = argv[1];
  try {
    std::filesystem::create_directories(dir);
    const std::pair<const char*, torch::jit::Module> models[] = {
        {"tiny.pt", MakeTiny()}, {"multi.pt", MakeMulti()}, {"encoder.pt", MakeEncoder()}};
    for (const auto& [file, module] : models) {
      const std::string path = (dir / file).string();
      module.save(path);
      std::printf("%s\n", path.c_str());
    }
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "ferry-make-models: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry-make-models: %s\n", e.what());
    return 1;
  }
  return 0;
}
