// DeepSeekMoE's router (model/moe.h) against a reference written per token from the
// formulas: sigmoid scores, the correction bias in the choice only, the best groups by
// their top-2 sum, top-k within them, weights from the unbiased scores renormalised and
// scaled, the ungated shared expert; replayed experts weighed the same way.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include "model/moe.h"

namespace slimpi {
namespace {

constexpr int64_t E = 8, d = 6, f = 4, T = 40, k = 2, G = 4, kGroups = 2;
constexpr double kScale = 2.5;

struct Experts {
  MoeWeights w;
  explicit Experts(uint64_t seed) {
    at::Generator g = at::detail::createCPUGenerator(seed);
    w.router = at::randn({E, d}, g);
    w.score_bias = 0.3 * at::randn({E}, g);
    for (int64_t e = 0; e < E; ++e) {
      w.gate.push_back(at::randn({f, d}, g));
      w.up.push_back(at::randn({f, d}, g));
      w.down.push_back(at::randn({d, f}, g));
    }
    w.shared_gate_proj = at::randn({2 * f, d}, g);
    w.shared_up = at::randn({2 * f, d}, g);
    w.shared_down = at::randn({d, 2 * f}, g);
  }
  at::Tensor expert(int64_t e, const at::Tensor& x) const {  // x [d] -> [d]
    return at::matmul(w.down[size_t(e)], at::silu(at::matmul(w.gate[size_t(e)], x)) * at::matmul(w.up[size_t(e)], x));
  }
  at::Tensor shared(const at::Tensor& x) const {
    return at::matmul(w.shared_down, at::silu(at::matmul(w.shared_gate_proj, x)) * at::matmul(w.shared_up, x));
  }
};

// The experts token x chooses, by the formulas (plain loops over doubles).
std::vector<int64_t> reference_choice(const std::vector<double>& c) {
  std::vector<double> group_score(G);
  for (int64_t j = 0; j < G; ++j) {
    std::vector<double> in(c.begin() + j * (E / G), c.begin() + (j + 1) * (E / G));
    std::sort(in.rbegin(), in.rend());
    group_score[size_t(j)] = in[0] + in[1];
  }
  std::vector<int64_t> groups(G);
  std::iota(groups.begin(), groups.end(), 0);
  std::sort(groups.begin(), groups.end(), [&](int64_t a, int64_t b) { return group_score[a] > group_score[b]; });
  std::vector<int64_t> candidates;
  for (int64_t j = 0; j < kGroups; ++j)
    for (int64_t e = groups[j] * (E / G); e < (groups[j] + 1) * (E / G); ++e) candidates.push_back(e);
  std::sort(candidates.begin(), candidates.end(), [&](int64_t a, int64_t b) { return c[a] > c[b]; });
  return {candidates.begin(), candidates.begin() + k};
}

TEST(DeepSeekMoe, RoutingEqualsTheFormulasTokenByToken) {
  at::NoGradGuard no_grad;
  const Experts x(5);
  at::Generator g = at::detail::createCPUGenerator(6);
  const at::Tensor h = at::randn({T, d}, g);
  const MoeRouting routing{k, /*norm_topk_prob=*/true, /*sigmoid=*/true, G, kGroups, kScale};
  const MoeLayerOutput out = moe_mlp(h, x.w, routing);
  const at::Tensor total = out.out + shared_experts_mlp(h, x.w);  // [T, d] the layer's output
  const at::Tensor logits = at::matmul(h.to(at::kDouble), x.w.router.to(at::kDouble).t());  // [T, E]
  int moved_by_bias = 0;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> s(E), c(E), plain(E);
    for (int64_t e = 0; e < E; ++e) {
      s[e] = 1 / (1 + std::exp(-logits[t][e].item<double>()));
      c[e] = s[e] + x.w.score_bias[e].item<double>();
    }
    const std::vector<int64_t> want = reference_choice(c);
    const std::vector<int64_t> unbiased = reference_choice(s);
    moved_by_bias += std::set<int64_t>(want.begin(), want.end()) != std::set<int64_t>(unbiased.begin(), unbiased.end());
    const at::Tensor got = out.chosen[t];
    EXPECT_EQ(std::set<int64_t>({got[0].item<int64_t>(), got[1].item<int64_t>()}),
              std::set<int64_t>(want.begin(), want.end()))
        << "token " << t;
    // The weights come from the unbiased scores: s_i / Σ s · scale.
    at::Tensor y = x.shared(h[t]);
    const double sum = s[want[0]] + s[want[1]];
    for (int64_t e : want) y = y + x.expert(e, h[t]) * (s[e] / sum * kScale);
    EXPECT_TRUE(at::allclose(total[t], y, 1e-5, 1e-5)) << "token " << t;
  }
  EXPECT_GT(moved_by_bias, 0) << "the correction bias changed no choice: the test cannot see it";

  // Replaying other experts weighs them by their own scores the same way.
  const at::Tensor other = (out.chosen + 1).remainder(E);
  const MoeLayerOutput replayed = moe_mlp(h, x.w, routing, other);
  EXPECT_TRUE(at::equal(replayed.chosen, other));
  EXPECT_TRUE(at::equal(replayed.routed, out.chosen));
  for (int64_t t = 0; t < T; t += 7) {
    const int64_t a = other[t][0].item<int64_t>(), b = other[t][1].item<int64_t>();
    const double sa = 1 / (1 + std::exp(-logits[t][a].item<double>())), sb = 1 / (1 + std::exp(-logits[t][b].item<double>()));
    const at::Tensor y = x.expert(a, h[t]) * (sa / (sa + sb) * kScale) + x.expert(b, h[t]) * (sb / (sa + sb) * kScale);
    EXPECT_TRUE(at::allclose(replayed.out[t], y, 1e-5, 1e-5)) << "replayed token " << t;
  }
}

// The correction bias gets no gradient (it chooses; it never weighs), the router does.
TEST(DeepSeekMoe, TheCorrectionBiasHasNoGradient) {
  Experts x(7);
  x.w.router.set_requires_grad(true);
  x.w.score_bias.set_requires_grad(true);
  at::Generator g = at::detail::createCPUGenerator(8);
  const MoeLayerOutput out = moe_mlp(at::randn({T, d}, g), x.w, MoeRouting{k, true, true, G, kGroups, kScale});
  out.out.square().sum().backward();
  ASSERT_TRUE(x.w.router.grad().defined());
  EXPECT_GT(x.w.router.grad().abs().max().item<double>(), 0);
  EXPECT_FALSE(x.w.score_bias.grad().defined());
}

}  // namespace
}  // namespace slimpi
