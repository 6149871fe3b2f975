// RolloutLog — the run's rollouts.h5: one row per sample, appended every step by all
// ranks of the file's communicator at once (collective; a rank with no samples still
// calls append). Owned by the driver. Layout (every dataset under /samples):
//   step, group_index, index, weight_version  int64 [n]  (weight_version: first response token's,
//                                             the oldest: a sample's versions never decrease)
//   weight_version_max                        int64 [n]  (the last response token's, the newest;
//                                             absent from files written before it was recorded)
//   prompt_length, response_length            int32 [n]
//   reward, raw_reward, advantage             float32 [n] (advantage: first response token's, as trained)
//   status                                    int8 [n]   (attribute status_names)
//   env_turns, env_tool_calls                 int32 [n]  multi-turn episodes (rollout.environment):
//   env_time_s, episode_time_s                float32 [n] model turns, tool calls, seconds waiting for
//   env_error                                 int8 [n]   the environment and in the episode, error
//                                             class (attribute env_error_names); 0 for
//                                             single-turn rollouts; absent from older files
//   tokens/{values,offsets}                   int32 CSR: prompt + response token ids
//   context_starts/{values,offsets}           int32 CSR: a split trajectory's later contexts,
//                                             as response offsets (Sample::context_starts;
//                                             empty rows otherwise; absent from older files)
//   routing/{values,offsets}                  int16 CSR: a mixture-of-experts policy's
//                                             experts per computed token, MoE layer and
//                                             top-k slot (Sample::routing; a row holds
//                                             (tokens − 1) × moe layers × k values, the
//                                             shape from the deck's [model] keys; empty
//                                             rows for dense models)
// and per response token, CSR {values,offsets} (a row is empty where not computed):
//   rollout_log_probs   float32  the engine's, over the sampling support
//   sampling_support    int32    size of the top-k/top-p set each token was drawn from
//                                (0 = whole vocabulary; empty row: no truncation at all)
//   weight_versions     int64    weights that produced each token
//   old_log_probs       float32  the trainer's, before its first optimizer step
//   ref_log_probs       float32  the reference model's (when one exists)
//   kl                  float32  KL estimate old vs reference (train.kl_loss_type)
//   raw_advantages      float32  the estimator's, before whitening
//   advantages          float32  as trained (after whitening when it is on)
//   loss_mask           float32  the tokens' weights in the loss (empty row: all ones;
//                                absent from files written before it was recorded)
//   values              float32  the critic's (ppo; empty rows otherwise; absent from
//   returns             float32  files written before PPO existed): values before the
//                                rollout's first critic step, GAE returns (λ_value)
//   teacher_log_probs   float32  on-policy distillation: the teacher's, whole vocabulary
//                                (empty rows otherwise; absent from older files)
// Row i of every dataset is the same sample; rows of lower ranks come first within one
// append (or one part of a two-part append). A step's trained samples come first, in training order (each trainer
// appends its share); then the groups it generated but did not train on: status 5
// (dropped by the dynamic filter; reward = 0, the group post-processing of equal
// rewards) and status 3 (over-sampling surplus; reward NaN: never post-processed).
// Neither has training fields.
// Root attributes: slimpi_version, created_utc, kind = "slimpi rollouts", deck (text).
#pragma once

#include <slimpi/sample.h>

#include "io/appendable_dataset.h"

namespace slimpi {

class RolloutLog {
 public:
  // Creates (truncates) `path`, collectively over `comm` (MPI_COMM_NULL: serial).
  static RolloutLog create(const std::string& path, MPI_Comm comm, const std::string& deck_text);
  // Opens an existing log, for appending when `writable` (same communicator rules).
  static RolloutLog open(const std::string& path, MPI_Comm comm, bool writable);

  // Collective: appends this rank's samples (rows of lower ranks first).
  void append(const std::vector<Sample>& local) { append(local, {}); }
  // Collective: every rank's `first` samples (in rank order), then every rank's
  // `second` ones, in one pass (one exchange of counts, one write per dataset).
  void append(const std::vector<Sample>& first, const std::vector<Sample>& second);
  uint64_t n_samples() const { return step_.n_rows(); }
  // Collective: drops every row of step >= `step` (rows are in step order). Returns
  // the rows kept.
  uint64_t truncate_to_step(int64_t step);
  // Independent: the trained rows of one step (status completed or truncated), in
  // file order = the order the step trained them in (debug replay).
  std::vector<Sample> read_trained(int64_t step) const;
  void flush() { file_.flush(); }
  const std::string& path() const { return file_.path(); }
  // Reads every sample back (independent; any rank). For tests and tools.
  std::vector<Sample> read_all() const;

 private:
  void bind(bool create);
  std::vector<Sample> read_rows(uint64_t first, uint64_t count) const;
  // read_rows' steps: the fixed-size columns (returns the rows' response lengths), then
  // the variable-length ones, checked against those lengths.
  std::vector<int32_t> read_fixed_columns(uint64_t first, std::vector<Sample>& out) const;
  void read_csr_columns(uint64_t first, const std::vector<int32_t>& response_len, std::vector<Sample>& out) const;
  // Rows [first, last) holding step `step` (first == last: none).
  std::pair<uint64_t, uint64_t> step_rows(int64_t step) const;
  // append's steps: the samples' columns, then the rows' datasets and the CSR ones.
  struct RowColumns;
  struct CsrColumns;
  CsrColumns gather_csr(const std::vector<const Sample*>& rows) const;
  void append_rows(const RowColumns& r, const h5::AppendPlan& row_plan);
  void append_csr(const CsrColumns& c, const std::vector<h5::AppendPlan>& plan);

  // The per-response-token float columns, each with the Sample field it stores.
  struct TokenColumn {
    const char* name;
    std::vector<float> Sample::*field;
    h5::CsrDataset<float> data;
  };

  h5::File file_;
  h5::Handle group_;
  h5::AppendableDataset<int64_t> step_, group_index_, index_, weight_version_, weight_version_max_;
  bool has_version_max_ = true;  // false: a file from before weight_version_max was recorded
  h5::AppendableDataset<int32_t> prompt_length_, response_length_;
  bool has_spec_ = true;  // false: a file from before speculative decoding's columns
  h5::AppendableDataset<int32_t> spec_drafted_, spec_accepted_, spec_passes_;
  bool has_env_ = true;  // false: a file from before multi-turn episodes' columns
  h5::AppendableDataset<int32_t> env_turns_, env_tool_calls_;
  h5::AppendableDataset<float> env_time_s_, episode_time_s_;
  h5::AppendableDataset<int8_t> env_error_;
  h5::CsrDataset<uint8_t> env_metrics_;  // each row: its env_metrics as a JSON object ("" none)
  h5::CsrDataset<int32_t> context_starts_;
  bool has_context_starts_ = true;  // false: a file from before split trajectories were recorded
  bool has_env_metrics_ = true;          // false: a file from before the environment's metrics were recorded
  bool said_no_metrics_column_ = false;  // such a file: the metrics left out, said once
  h5::AppendableDataset<float> reward_, raw_reward_, advantage_;
  h5::AppendableDataset<int8_t> status_;
  h5::CsrDataset<int32_t> tokens_, sampling_support_;
  h5::CsrDataset<int16_t> routing_;
  bool has_routing_ = true;  // false: a file from before routing traces (dense runs)
  h5::CsrDataset<int64_t> weight_versions_;
  std::vector<TokenColumn> token_columns_;
};

}  // namespace slimpi
