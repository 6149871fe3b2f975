// The packed micro-batch: the trainer's view of a few samples as one token stream for
// Transformer::forward_packed, plus the per-token fields of their responses laid out
// in the same order. Free functions over `samples` (owned by the caller) and the
// indices `which` of the micro-batch's samples in it.
//
// Shapes: T = Σ packed tokens of the micro-batch's samples, N = Σ response tokens.
//
// A trajectory split into contexts (Sample::context_starts c_1 < ... < c_m, response
// offsets; P the prompt, R the response) packs as m + 1 sequences, each attended and
// positioned on its own as the engine ran it: P + R[0, c_1], then R[c_k, c_{k+1}] for
// k = 1..m-1, then R[c_m, R), the later ones with prompt length 1 (R[c_k] opens a fresh
// sequence). Every sequence but the last ends with the next context's first token, so
// the response rows are the sample's R in order (that token's row, predicted across the
// boundary, is an environment token: loss mask 0). T grows by m (Sample::packed_length).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <slimpi/sample.h>

#include <cstdint>
#include <vector>

#include "model/log_probs.h"
#include "model/precision.h"
#include "model/vocab_parallel_log_probs.h"

namespace slimpi {

class Transformer;
struct ModelConfig;
struct MoeTrace;

struct PackedBatch {
  at::Tensor tokens;  // [T] int64
  std::vector<int64_t> seq_lens, prompt_lens;
  at::Tensor sample_of_token;  // [N] int64, index within the micro-batch
  at::Tensor support;          // [N] int64 sampling-support sizes (undefined: whole vocabulary everywhere)
};

PackedBatch pack(const std::vector<Sample>& samples, const std::vector<int64_t>& which, const at::Device& device);

// A per-token vector of n response tokens as [n] fp32 on `device`; `fill` everywhere
// when it is empty (a field the sample does not carry).
at::Tensor per_token_tensor(const std::vector<float>& v, int64_t n, float fill, const at::Device& device);

// A per-token field of the micro-batch's samples concatenated: [N].
at::Tensor gather_field(const std::vector<Sample>& samples, const std::vector<int64_t>& which,
                        std::vector<float> Sample::*field, float fill, const at::Device& device);

// The micro-batch's rollout routing traces packed like its tokens: [T, n_moe_layers, k]
// int64, -1 where a sample has none (its last token; a sample without a trace). A trace
// must hold (tokens − 1) rows of k distinct experts in [0, n_experts) per MoE layer;
// `required`: every sample must have one (routing replay in RL).
at::Tensor packed_routing(const std::vector<Sample>& samples, const std::vector<int64_t>& which,
                          const ModelConfig& cfg, const at::Device& device, bool required);

// The response tokens' log-probs (and entropies) of a packed micro-batch under `model`:
// its forward in `precision` up to the LM head (the autocast region is the forward
// alone), then the head and the log-probs together, chunk by chunk
// (model/head_log_probs.h; vocab-parallel when the model is a tensor shard). No [T, V]
// logits are formed. hidden_out: the trunk's final-norm output [T, d] (the MTP layers'
// input, train/mtp_loss.h).
// Under context parallelism (model/context_split.h) each rank of the group runs its rows
// (hidden_out: [T_i, d], model.context_split(b.seq_lens)->local_rows()) and scores the
// tokens they predict; the log-probs and entropies are gathered, so every rank returns
// all N, and each rank's backward reaches its own rows only.
TokenLogProbs packed_log_probs(const Transformer& model, const PackedBatch& b, Precision precision,
                               double temperature, bool with_entropy, MoeTrace* moe = nullptr,
                               at::Tensor* hidden_out = nullptr);

// The reducer's weights [N] of a packed micro-batch (the policy loss's and the critic's
// value loss's): m / (D_i · n_samples), D_i = max(Σ mask of sample i, 1), the mean over
// the step's samples of each one's token mean; or m / n_masked per token (per_token).
// mask [N] on the batch's device; n_samples, n_masked: over every data-parallel rank.
at::Tensor reducer_weights(const std::vector<Sample>& samples, const std::vector<int64_t>& which, const PackedBatch& b,
                           const at::Tensor& mask, double n_samples, double n_masked, bool per_token);

// The second half of packed_log_probs: the response tokens' log-probs (and entropies) from
// the trunk's final-norm output `hidden` [T, d] (this rank's rows under context
// parallelism), through the LM head (a pipeline's last stage runs it on its stage's output).
TokenLogProbs head_token_log_probs(const Transformer& model, const PackedBatch& b, const at::Tensor& hidden,
                                   Precision precision, double temperature, bool with_entropy);

// A model's vocabulary shard for the head's log-probs (none without tensor parallelism).
VocabShard vocab_shard_of(const Transformer& model);

// Sum of a sample's loss mask (its response length when it has none): host data, no
// device sync.
double mask_sum(const Sample& s);

}  // namespace slimpi
