#include "tests/support/expected.h"

#include "collectives/onebit_allreduce.h"
#include "collectives/registry.h"
#include "compression/decode.h"

namespace compcoll::testing {

std::vector<float> expected_sparse_sum(const std::string& algo, const AlgoParams& p,
                                       const std::vector<std::vector<float>>& inputs) {
  const size_t n = inputs.empty() ? 0 : inputs[0].size();
  std::vector<float> out(n, 0.0f);
  for (const auto& in : inputs) {
    auto codec = make_sparse_codec(algo, p);
    auto st = codec->make_state(n);
    Bytes payload;
    codec->encode(in.data(), n, *st, payload);
    decode_accumulate(payload, out.data(), n);
  }
  return out;
}

std::vector<float> expected_onebit_sum(const AlgoParams& p,
                                       const std::vector<std::vector<float>>& inputs) {
  const int world = static_cast<int>(inputs.size());
  const size_t n = inputs.empty() ? 0 : inputs[0].size();
  const OneBitConfig c{p.onebit_block, p.onebit_scale, p.onebit_residual_bound};
  const OneBitAllreduce algo(c);
  std::vector<std::vector<float>> errs(inputs.size(), std::vector<float>(n, 0.0f));
  std::vector<float> out(n);
  for (int j = 0; j < world; ++j) {
    const auto s = algo.shard(n, world, j);
    std::vector<float> sum(s.len, 0.0f), server_err(s.len, 0.0f);
    for (int r = 0; r < world; ++r) {
      Bytes payload;
      onebit_encode(c, inputs[r].data() + s.begin, errs[r].data() + s.begin, s.len, payload);
      onebit_decode(payload, sum.data(), s.len, true);
    }
    Bytes q;
    onebit_encode(c, sum.data(), server_err.data(), s.len, q);
    onebit_decode(q, out.data() + s.begin, s.len, false);
  }
  return out;
}

}  // namespace compcoll::testing
