// Builds against the installed SDK only: <ferry/client.h> and ferry::client.
#include <ferry/client.h>

#include <cstdio>
#include <memory>

int main() {
  ferry::client::ClientOptions options;  // no broker needed: Create connects lazily
  options.frontend = "tcp://127.0.0.1:1";
  std::unique_ptr<ferry::client::Client> client;
  ferry::Status s = ferry::client::Client::Create(options, &client);
  if (!s.ok()) {
    std::fprintf(stderr, "Create: %s\n", s.ToString().c_str());
    return 1;
  }
  ferry::Tensor t = ferry::Tensor::From<float>({1, 2, 3, 4}, {2, 2}, ferry::DType::kFloat32);
  if (t.shape.size() != 2 || t.data.size() != 4 * sizeof(float)) {
    std::fprintf(stderr, "unexpected tensor\n");
    return 1;
  }
  // A bad option is an error value, not an exception.
  ferry::client::ClientOptions bad;
  bad.frontend = "not an endpoint";
  std::unique_ptr<ferry::client::Client> none;
  ferry::Status bad_status = ferry::client::Client::Create(bad, &none);
  if (bad_status.ok()) {
    std::fprintf(stderr, "Create accepted a bad frontend\n");
    return 1;
  }
  std::printf("consumer ok: tensor %zu bytes\n", t.data.size());
  return 0;
}
