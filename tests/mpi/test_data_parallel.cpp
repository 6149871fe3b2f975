// Data-parallel invariance at np 1, 2, 4: the same step split over dp ranks and
// micro-batches gives the same loss, metrics and gradients as one rank with the whole
// batch in one micro-batch (to fp32 round-off); whitening gives the same advantages,
// including on a rank that holds no tokens; reducing gradient buckets from inside
// backward (overlap) gives the gradients of reducing them after it.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>

#include "parallel/comm_tensor.h"
#include "parallel/mpi_comm.h"
#include "train/adamw.h"
#include "train/trainer.h"
#include "train/whitening.h"

namespace slimpi {
namespace {

ModelConfig model_config() {
  ModelConfig c;
  c.vocab_size = 40;
  c.hidden_size = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.intermediate_size = 48;
  c.max_seq_len = 32;
  c.init_std = 0.1;
  return c;
}

// A step of n RL samples with uneven lengths, masks with holes, and old/ref/rollout
// log-probs near the policy's so that clipping, KL and TIS all act.
std::vector<Sample> rl_batch(int n, const Trainer& trainer) {
  at::Generator g = at::detail::createCPUGenerator(42);
  std::vector<Sample> out;
  for (int i = 0; i < n; ++i) {
    Sample s;
    const int64_t len = 5 + at::randint(14, {1}, g, at::kLong).item<int64_t>();
    at::Tensor t = at::randint(40, {len}, g, at::kLong);
    s.tokens.assign(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + len);
    s.prompt_length = 1 + i % 4;
    const int64_t r = s.response_length();
    for (int64_t j = 0; j < r; ++j) s.loss_mask.push_back((i + j) % 5 == 4 ? 0.0f : 1.0f);
    s.reward = at::randn({1}, g).item<float>();
    out.push_back(s);
  }
  trainer.compute_log_probs(out, false);
  for (auto& s : out) {
    for (auto& x : s.old_log_probs) x += 0.3f * at::randn({1}, g).item<float>();
    s.rollout_log_probs = s.old_log_probs;
    for (auto& x : s.rollout_log_probs) x += 0.1f * at::randn({1}, g).item<float>();
  }
  return out;
}

TrainerConfig rl_config(bool per_token, int64_t micro) {
  TrainerConfig c;
  c.mode = "rl";
  c.eps_clip = 0.1;
  c.eps_clip_high = 0.15;
  c.eps_clip_c = 2.0;
  c.use_kl_loss = true;
  c.kl_loss_coef = 0.1;
  c.kl_loss_type = "low_var_kl";
  c.entropy_coef = 0.01;
  c.use_tis = true;
  c.mismatch.tis_clip = 1.1;
  c.mismatch.tis_clip_low = 0.9;
  c.normalize_advantages = true;
  c.calculate_per_token_loss = per_token;
  c.n_micro_batches = micro;
  c.clip_grad = 0.0;  // compare raw gradients
  c.lr.lr = 0.0;      // and leave the weights alone
  c.grad_bucket_bytes = 1 << 12;
  return c;
}

class DataParallel : public ::testing::TestWithParam<std::tuple<bool, int64_t>> {};

TEST_P(DataParallel, SameLossMetricsAndGradientsAsOneRank) {
  auto [per_token, micro] = GetParam();
  MpiComm world(MPI_COMM_WORLD, "trainer");
  const int r = world.rank(), n = world.size();
  Transformer policy(model_config(), 1, at::kCPU), ref_a(model_config(), 2, at::kCPU);
  Transformer single_policy(model_config(), 1, at::kCPU), ref_b(model_config(), 2, at::kCPU);

  Trainer single(rl_config(per_token, 1), single_policy, nullptr, &ref_b);
  std::vector<Sample> all = rl_batch(10, single);
  std::vector<Sample> mine(all.begin() + all.size() * r / n, all.begin() + all.size() * (r + 1) / n);
  // Reference log-probs, advantages and their whitening over the whole rollout.
  auto want_rollout = single.prepare_rollout(all, /*recompute_old=*/false);
  auto want = single.train_step(all);
  at::Tensor want_grads = single.grads().flat().clone();

  Trainer dp(rl_config(per_token, micro), policy, &world, &ref_a);
  auto got_rollout = dp.prepare_rollout(mine, /*recompute_old=*/false);
  for (size_t j = 0; j < mine.size(); ++j) {
    const Sample& whole = all[all.size() * r / n + j];
    for (size_t t = 0; t < whole.advantages.size(); ++t)
      EXPECT_NEAR(mine[j].advantages[t], whole.advantages[t], 1e-5) << "sample " << j << " token " << t;
  }
  for (const auto& [k, v] : want_rollout) EXPECT_NEAR(got_rollout.at(k), v, 1e-5 * std::max(1.0, std::abs(v))) << k;
  auto got = dp.train_step(mine);

  for (const auto& [k, v] : want) {
    if (k.rfind("perf/", 0) == 0) continue;
    EXPECT_NEAR(got.at(k), v, 1e-5 * std::max(1.0, std::abs(v))) << k;
  }
  EXPECT_GT(want.at("train/pg_clipfrac"), 0.0);  // the clip did act
  EXPECT_GT(want.at("train/tis_clipfrac"), 0.0);
  EXPECT_TRUE(at::allclose(dp.grads().flat(), want_grads, 1e-4, 1e-6))
      << "max |diff| " << (dp.grads().flat() - want_grads).abs().max().item<float>();
}

TEST(OverlappedGradReduce, SameGradientsAsReducingAfterBackward) {
  MpiComm world(MPI_COMM_WORLD, "trainer");
  const int r = world.rank(), n = world.size();
  // Rank n-1 of several holds no sample: it reduces without a backward of its own.
  const int n_samples = 9;
  const int holders = n > 1 ? n - 1 : 1;
  auto run = [&](bool overlap, at::Tensor* grads, int64_t* started_in_backward) {
    Transformer policy(model_config(), 1, at::kCPU), ref(model_config(), 2, at::kCPU);
    TrainerConfig c = rl_config(false, 2);
    c.overlap_grad_reduce = overlap;
    Trainer trainer(c, policy, &world, &ref);
    std::vector<Sample> all = rl_batch(n_samples, trainer);
    std::vector<Sample> mine;
    if (r < holders) mine.assign(all.begin() + n_samples * r / holders, all.begin() + n_samples * (r + 1) / holders);
    trainer.prepare_rollout(mine, /*recompute_old=*/false);
    trainer.train_step(mine);
    *grads = trainer.grads().flat().clone();
    *started_in_backward = trainer.grads().n_started_in_backward();
    EXPECT_GT(trainer.grads().n_buckets(), 10);
  };
  at::Tensor blocking, overlapped;
  int64_t started_blocking = 0, started_overlapped = 0;
  run(false, &blocking, &started_blocking);
  run(true, &overlapped, &started_overlapped);
  EXPECT_GT(blocking.abs().sum().item<double>(), 0.0);
  if (n == 1) return;  // nothing to reduce
  if (r < holders) EXPECT_GT(started_overlapped, 0) << "no bucket was reduced during backward";
  if (n <= 2) {  // a sum of two is the same in any order: bit for bit
    EXPECT_TRUE(at::equal(overlapped, blocking)) << "max |diff| " << (overlapped - blocking).abs().max().item<float>();
  } else {  // the MPI library may pick another summation order for non-blocking collectives
    EXPECT_TRUE(at::allclose(overlapped, blocking, 1e-6, 1e-8))
        << "max |diff| " << (overlapped - blocking).abs().max().item<float>();
  }
  // Every rank ends with the same sum.
  at::Tensor gathered = allgather(world, overlapped);
  for (int k = 1; k < n; ++k) EXPECT_TRUE(at::equal(gathered[k], gathered[0])) << "rank " << k;
}

INSTANTIATE_TEST_SUITE_P(Splits, DataParallel,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(int64_t{1}, 2, 4)));

// What "the same step as one rank" means for the weights after a first AdamW step.
// The gradients (each p.grad() aliases the trainer's buffer: what AdamW used, clipped)
// are sums of the same terms in another order, so they agree to round-off of the
// parameter's largest entry. The weights cannot be compared with a fixed tolerance: at
// t = 1, m̂ = g and v̂ = g², so AdamW moves w by lr·f(g), f(g) = g / (|g| + eps), whatever
// g's size; where g is round-off (|g| ~ eps = 1e-8) f is anything in (−1, 1), and two
// orders of summation move such a weight by up to 2·lr (what failed on a Xeon, where
// MKL's kernels round differently from an EPYC's). So each weight's difference is
// checked against what the gradients predict: Δw = −lr·(f(g_dp) − f(g_one)), to the
// fp32 rounding of the update (a few ulp of |w| + lr).
void expect_same_first_adamw_step(const Transformer& dp, const Transformer& one, double lr, double eps) {
  for (size_t i = 0; i < dp.parameters().size(); ++i) {
    const std::string& name = dp.parameters()[i].name;
    const at::Tensor g_dp = dp.parameters()[i].tensor.grad().to(at::kDouble);
    const at::Tensor g_one = one.parameters()[i].tensor.grad().to(at::kDouble);
    const double scale = g_one.abs().max().item<double>();
    const double g_diff = (g_dp - g_one).abs().max().item<double>();
    EXPECT_LE(g_diff, 1e-5 * scale + 1e-12) << name << ": gradients differ by " << g_diff << " (largest " << scale << ")";
    auto f = [eps](const at::Tensor& g) { return g / (g.abs() + eps); };
    const at::Tensor predicted = -lr * (f(g_dp) - f(g_one));
    const at::Tensor w_dp = dp.parameters()[i].tensor.detach().to(at::kDouble);
    const at::Tensor w_one = one.parameters()[i].tensor.detach().to(at::kDouble);
    const at::Tensor allowed = 8 * std::ldexp(1.0, -24) * (w_one.abs() + lr);
    const at::Tensor off = ((w_dp - w_one) - predicted).abs() - allowed;
    EXPECT_LE(off.max().item<double>(), 0.0)
        << name << ": a weight moved " << ((w_dp - w_one) - predicted).abs().max().item<double>()
        << " away from what its gradients predict";
  }
}

// MTP layers trained beside the policy (train/mtp_loss.h) with the gradient reduction
// overlapping backward: ranks whose micro-batches hold no position the MTP loss counts
// (one-token responses) give their MTP layers no gradient at all, and the step still
// equals one rank's (the MTP buffers are reduced after backward, in one order on every
// rank; reduced from inside backward they would pair with another rank's trunk buckets).
TEST(DataParallelMtp, RanksWithoutCountedPositionsStillMatchOneRank) {
  MpiComm world(MPI_COMM_WORLD, "trainer");
  const int r = world.rank(), n = world.size();
  ModelConfig cfg = model_config();
  cfg.mtp_num_layers = 1;
  TrainerConfig tc;
  tc.mode = "sft";
  tc.lr.lr = 1e-2;
  tc.n_micro_batches = 2;
  tc.grad_bucket_bytes = 1 << 12;
  at::Generator g = at::detail::createCPUGenerator(8);
  std::vector<Sample> all;
  for (int i = 0; i < 8; ++i) {
    Sample s;
    const bool short_response = i >= 4;  // the second half: one response token, nothing for the MTP loss
    const int64_t len = short_response ? 6 : 12;
    at::Tensor t = at::randint(40, {len}, g, at::kLong);
    s.tokens.assign(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + len);
    s.prompt_length = short_response ? len - 1 : 3;
    all.push_back(s);
  }
  Transformer single_policy(cfg, 3, at::kCPU), policy(cfg, 3, at::kCPU);
  TrainerConfig after = tc;
  after.overlap_grad_reduce = false;
  Trainer single(after, single_policy, nullptr);
  auto want = single.train_step(all);
  std::vector<Sample> mine(all.begin() + all.size() * r / n, all.begin() + all.size() * (r + 1) / n);
  Trainer dp(tc, policy, &world);
  auto got = dp.train_step(mine);
  for (const char* k : {"train/loss", "train/grad_norm", "train/mtp_loss", "train/mtp_grad_norm"})
    EXPECT_NEAR(got.at(k), want.at(k), 1e-5 * std::max(1.0, std::abs(want.at(k)))) << k;
  expect_same_first_adamw_step(policy, single_policy, tc.lr.lr, tc.adam.eps);
}

// PPO's critic: the same values, GAE advantages (whitened over every rank), returns, value
// loss and critic update as one rank holding the whole rollout, uneven masks included.
TEST(DataParallelCritic, SameValuesAdvantagesAndCriticUpdateAsOneRank) {
  MpiComm world(MPI_COMM_WORLD, "trainer");
  const int r = world.rank(), n = world.size();
  TrainerConfig tc = rl_config(false, 2);
  tc.estimator = &advantage_estimators().get("ppo");
  tc.use_kl_loss = false;
  tc.kl_loss_coef = 0.0;
  tc.gamma = 0.97;
  tc.lambd = 0.9;
  tc.lambd_value = 0.95;
  tc.critic.lr.lr = 1e-2;
  tc.critic.value_clip = 0.05;
  tc.critic.seed = 3;
  Transformer single_policy(model_config(), 1, at::kCPU), policy(model_config(), 1, at::kCPU);
  TrainerConfig one = tc;
  one.n_micro_batches = 1;
  Trainer single(one, single_policy, nullptr);
  std::vector<Sample> all = rl_batch(10, single);
  std::vector<Sample> mine(all.begin() + all.size() * r / n, all.begin() + all.size() * (r + 1) / n);
  auto want_rollout = single.prepare_rollout(all, /*recompute_old=*/false);
  auto want_critic = single.critic()->train_step(all);
  auto want_critic2 = single.critic()->train_step(all);  // V moved from V_old: the clip acts

  Trainer dp(tc, policy, &world);
  auto got_rollout = dp.prepare_rollout(mine, /*recompute_old=*/false);
  for (size_t j = 0; j < mine.size(); ++j) {
    const Sample& whole = all[all.size() * r / n + j];
    for (size_t t = 0; t < whole.advantages.size(); ++t) {
      EXPECT_NEAR(mine[j].values[t], whole.values[t], 1e-5) << "sample " << j << " token " << t;
      EXPECT_NEAR(mine[j].returns[t], whole.returns[t], 1e-5) << "sample " << j << " token " << t;
      EXPECT_NEAR(mine[j].advantages[t], whole.advantages[t], 1e-5) << "sample " << j << " token " << t;
    }
  }
  for (const auto& [k, v] : want_rollout) EXPECT_NEAR(got_rollout.at(k), v, 1e-5 * std::max(1.0, std::abs(v))) << k;
  auto got_critic = dp.critic()->train_step(mine);
  auto got_critic2 = dp.critic()->train_step(mine);
  for (const auto& [want, got] : {std::pair{&want_critic, &got_critic}, std::pair{&want_critic2, &got_critic2}})
    for (const auto& [k, v] : *want) EXPECT_NEAR(got->at(k), v, 1e-5 * std::max(1.0, std::abs(v))) << k;
  EXPECT_GT(want_critic2.at("train/value_clipfrac"), 0.0);
  const auto& a = single.critic()->parameters();
  const auto& b = dp.critic()->parameters();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(at::allclose(a[i].tensor, b[i].tensor, 1e-5, 1e-6)) << a[i].name;
}

TEST(Whitening, SameAdvantagesAtAnyDpIncludingAnEmptyRank) {
  MpiComm world(MPI_COMM_WORLD, "trainer");
  const int r = world.rank(), n = world.size();
  at::Generator g = at::detail::createCPUGenerator(5);
  std::vector<at::Tensor> adv, masks;
  for (int i = 0; i < 3; ++i) {  // 3 samples: at np 4 the last rank holds none
    adv.push_back(at::randn({4 + i}, g));
    masks.push_back((at::rand({4 + i}, g) > 0.3).to(at::kFloat));
  }
  std::vector<at::Tensor> whole = adv;
  for (auto& a : whole) a = a.clone();
  whiten_advantages(whole, masks, nullptr);

  std::vector<at::Tensor> mine, my_masks;
  std::vector<int> index;
  for (int i = 3 * r / n; i < 3 * (r + 1) / n; ++i) {
    mine.push_back(adv[i].clone());
    my_masks.push_back(masks[i]);
    index.push_back(i);
  }
  whiten_advantages(mine, my_masks, &world);
  for (size_t j = 0; j < mine.size(); ++j)
    EXPECT_TRUE(at::allclose(mine[j], whole[index[j]], 1e-6, 1e-6)) << "sample " << index[j];
  // Whitened over the masked tokens: mean 0 and unbiased variance 1.
  at::Tensor flat = at::cat(whole).to(at::kDouble), m = at::cat(masks).to(at::kDouble);
  const double cnt = m.sum().item<double>();
  const double mean = (flat * m).sum().item<double>() / cnt;
  EXPECT_NEAR(mean, 0.0, 1e-6);
  EXPECT_NEAR(((flat - mean).pow(2) * m).sum().item<double>() / (cnt - 1), 1.0, 1e-5);
}

}  // namespace
}  // namespace slimpi
