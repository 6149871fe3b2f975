// The gated delta rule's chunked form (training, prefill) against its recurrent form (the
// definition; the engine's decode step), in fp64: outputs, final states and the gradients
// of every input, over decays near 0 and near 1, write strengths near 0 and near 1, lengths
// around the chunk (1, 63, 64, 65, 500), an initial state, and padded sequences whose
// padding carries g = beta = 0.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/gated_delta_rule.h"

namespace slimpi {
namespace {

struct Inputs {
  at::Tensor q, k, v, g, beta, state;
  std::vector<at::Tensor> all() const { return {q, k, v, g, beta, state}; }
};

// B sequences of L tokens, H heads; q and k unit vectors (q / sqrt(Dk)), g = log decay with
// exp(g) in [decay_lo, decay_hi], beta in [beta_lo, beta_hi]; all fp64 leaves with gradients.
Inputs random_inputs(int64_t B, int64_t L, int64_t H, int64_t Dk, int64_t Dv, double decay_lo, double decay_hi,
                     double beta_lo, double beta_hi, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  auto unit = [&](std::vector<int64_t> shape) {
    at::Tensor x = at::randn(shape, gen, f64);
    return x / x.norm(2, -1, true);
  };
  Inputs in;
  in.q = (unit({B, L, H, Dk}) / std::sqrt(double(Dk))).set_requires_grad(true);
  in.k = unit({B, L, H, Dk}).set_requires_grad(true);
  in.v = at::randn({B, L, H, Dv}, gen, f64).set_requires_grad(true);
  in.g = (at::rand({B, L, H}, gen, f64) * (decay_hi - decay_lo) + decay_lo).log().set_requires_grad(true);
  in.beta = (at::rand({B, L, H}, gen, f64) * (beta_hi - beta_lo) + beta_lo).set_requires_grad(true);
  in.state = at::randn({B, H, Dk, Dv}, gen, f64).set_requires_grad(true);
  return in;
}

// The loss whose gradients are compared: a fixed random weighting of the outputs and the final state.
at::Tensor weighted(const at::Tensor& o, const at::Tensor& S, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return (o * at::randn(o.sizes(), gen, o.options())).sum() + (S * at::randn(S.sizes(), gen, S.options())).sum();
}

struct Case {
  const char* name;
  double decay_lo, decay_hi, beta_lo, beta_hi;
};

class DeltaRuleForms : public ::testing::TestWithParam<std::tuple<int64_t, int>> {};

TEST_P(DeltaRuleForms, ChunkedEqualsRecurrentWithGradients) {
  const auto [L, which] = GetParam();
  const Case cases[] = {{"decay near 1, beta mid", 0.999, 0.99999, 0.2, 0.8},
                        {"decay near 0, beta near 1", 1e-6, 1e-2, 0.99, 0.9999},
                        {"decay anywhere, beta near 0", 1e-3, 1.0, 1e-4, 1e-2}};
  const Case& c = cases[which];
  SCOPED_TRACE(std::string(c.name) + ", L = " + std::to_string(L));
  // Two value heads per key head are the caller's business (it repeats q and k): H = 3 here.
  // The same inputs twice (same seed), each form differentiated on its own leaves.
  const Inputs rec = random_inputs(2, L, 3, 8, 6, c.decay_lo, c.decay_hi, c.beta_lo, c.beta_hi, 17 + uint64_t(L));
  const Inputs chunk = random_inputs(2, L, 3, 8, 6, c.decay_lo, c.decay_hi, c.beta_lo, c.beta_hi, 17 + uint64_t(L));
  at::Tensor s_rec, s_chunk;
  const at::Tensor o_rec = gated_delta_rule_recurrent(rec.q, rec.k, rec.v, rec.g, rec.beta, rec.state, &s_rec);
  const at::Tensor o_chunk =
      gated_delta_rule_chunked(chunk.q, chunk.k, chunk.v, chunk.g, chunk.beta, chunk.state, &s_chunk);
  ASSERT_EQ(o_chunk.sizes(), o_rec.sizes());
  // fp64 round-off: outputs and states of size ~1-10 after up to 500 steps
  EXPECT_LT((o_chunk - o_rec).abs().max().item<double>(), 1e-10);
  EXPECT_LT((s_chunk - s_rec).abs().max().item<double>(), 1e-10);
  weighted(o_rec, s_rec, 5).backward();
  weighted(o_chunk, s_chunk, 5).backward();
  const char* names[] = {"q", "k", "v", "g", "beta", "initial state"};
  const std::vector<at::Tensor> a = rec.all(), b = chunk.all();
  for (size_t i = 0; i < a.size(); ++i) {
    const double scale = std::max(1.0, a[i].grad().abs().max().item<double>());
    EXPECT_LT((b[i].grad() - a[i].grad()).abs().max().item<double>(), 1e-9 * scale) << "gradient of " << names[i];
  }
}

INSTANTIATE_TEST_SUITE_P(Lengths, DeltaRuleForms,
                         ::testing::Combine(::testing::Values(1, 63, 64, 65, 500), ::testing::Values(0, 1, 2)));

// Padded sequences: positions past a sequence's end with g = beta = 0 leave its state as
// its last token left it, and its outputs as the sequence alone gives them; no initial
// state is zeros.
TEST(DeltaRule, PaddingWithZeroDecayAndStrengthLeavesTheState) {
  const Inputs in = random_inputs(1, 70, 2, 4, 5, 0.5, 0.99, 0.1, 0.9, 3);
  at::NoGradGuard no_grad;
  for (int64_t n : {1, 40, 64, 69}) {
    at::Tensor g = in.g.clone(), beta = in.beta.clone();
    g.narrow(1, n, 70 - n).zero_();
    beta.narrow(1, n, 70 - n).zero_();
    at::Tensor s_padded, s_alone;
    const at::Tensor o_padded = gated_delta_rule_chunked(in.q, in.k, in.v, g, beta, {}, &s_padded);
    const at::Tensor o_alone = gated_delta_rule_chunked(in.q.narrow(1, 0, n), in.k.narrow(1, 0, n),
                                                        in.v.narrow(1, 0, n), g.narrow(1, 0, n),
                                                        beta.narrow(1, 0, n), {}, &s_alone);
    EXPECT_LT((s_padded - s_alone).abs().max().item<double>(), 1e-12) << n << " tokens";
    EXPECT_LT((o_padded.narrow(1, 0, n) - o_alone).abs().max().item<double>(), 1e-12) << n << " tokens";
    const at::Tensor zeros = at::zeros({1, 2, 4, 5}, in.q.options());
    EXPECT_TRUE(at::equal(gated_delta_rule_chunked(in.q, in.k, in.v, g, beta, zeros), o_padded));
  }
}

// Prefill in pieces: the state after a first chunk, fed to the second, continues the
// whole sequence (the engine's chunked prefill), and the recurrent step continues it too.
TEST(DeltaRule, StateCarriesAcrossPiecesAtAnyBoundary) {
  const Inputs in = random_inputs(1, 130, 2, 4, 5, 0.8, 0.999, 0.1, 0.9, 4);
  at::NoGradGuard no_grad;
  const at::Tensor whole = gated_delta_rule_chunked(in.q, in.k, in.v, in.g, in.beta, in.state);
  for (int64_t cut : {1, 37, 64, 129}) {
    auto piece = [&](int64_t from, int64_t n, const at::Tensor& s, at::Tensor* out_state, bool recurrent) {
      auto part = [&](const at::Tensor& x) { return x.narrow(1, from, n); };
      return recurrent ? gated_delta_rule_recurrent(part(in.q), part(in.k), part(in.v), part(in.g), part(in.beta), s,
                                                    out_state)
                       : gated_delta_rule_chunked(part(in.q), part(in.k), part(in.v), part(in.g), part(in.beta), s,
                                                  out_state);
    };
    at::Tensor s1, s2;
    const at::Tensor first = piece(0, cut, in.state, &s1, false);
    const at::Tensor second = piece(cut, 130 - cut, s1, &s2, cut == 129);
    EXPECT_LT((at::cat({first, second}, 1) - whole).abs().max().item<double>(), 1e-10) << "cut at " << cut;
  }
}

}  // namespace
}  // namespace slimpi
