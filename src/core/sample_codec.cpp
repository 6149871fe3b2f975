#include "core/sample_codec.h"

#include "core/byte_codec.h"

namespace slimpi {

std::string encode_samples(const std::vector<Sample>& samples) {
  ByteWriter w;
  w.put<uint64_t>(samples.size());
  for (const auto& s : samples) {
    w.put(s.step);
    w.put(s.group_index);
    w.put(s.index);
    w.put(s.status);
    w.put_vector(s.tokens);
    w.put(s.prompt_length);
    w.put_vector(s.rollout_log_probs);
    w.put_vector(s.sampling_support);
    w.put_vector(s.weight_versions);
    w.put_vector(s.routing);
    w.put(s.spec_drafted);
    w.put(s.spec_accepted);
    w.put(s.spec_passes);
    w.put(s.env_turns);
    w.put(s.env_tool_calls);
    w.put(s.env_s);
    w.put(s.episode_s);
    w.put(s.env_error);
    w.put_vector(s.context_starts);
    w.put<uint64_t>(s.env_metrics.size());
    for (const auto& [name, value] : s.env_metrics) {
      w.put_string(name);
      w.put(value);
    }
    w.put(s.raw_reward);
    w.put(s.reward);
    w.put_vector(s.loss_mask);
    w.put_vector(s.old_log_probs);
    w.put_vector(s.ref_log_probs);
    w.put_vector(s.kl);
    w.put_vector(s.raw_advantages);
    w.put_vector(s.advantages);
    w.put_vector(s.values);
    w.put_vector(s.returns);
    w.put_vector(s.teacher_log_probs);
  }
  return w.take();
}

std::vector<Sample> decode_samples(const std::string& bytes) {
  ByteReader r(bytes);
  std::vector<Sample> out(r.get<uint64_t>());
  for (auto& s : out) {
    s.step = r.get<int64_t>();
    s.group_index = r.get<int64_t>();
    s.index = r.get<int64_t>();
    s.status = r.get<SampleStatus>();
    s.tokens = r.get_vector<int64_t>();
    s.prompt_length = r.get<int64_t>();
    s.rollout_log_probs = r.get_vector<float>();
    s.sampling_support = r.get_vector<int32_t>();
    s.weight_versions = r.get_vector<int64_t>();
    s.routing = r.get_vector<int16_t>();
    s.spec_drafted = r.get<int32_t>();
    s.spec_accepted = r.get<int32_t>();
    s.spec_passes = r.get<int32_t>();
    s.env_turns = r.get<int32_t>();
    s.env_tool_calls = r.get<int32_t>();
    s.env_s = r.get<float>();
    s.episode_s = r.get<float>();
    s.env_error = r.get<int8_t>();
    s.context_starts = r.get_vector<int64_t>();
    for (uint64_t k = r.get<uint64_t>(); k > 0; --k) {
      std::string name = r.get_string();
      s.env_metrics[name] = r.get<double>();
    }
    s.raw_reward = r.get<float>();
    s.reward = r.get<float>();
    s.loss_mask = r.get_vector<float>();
    s.old_log_probs = r.get_vector<float>();
    s.ref_log_probs = r.get_vector<float>();
    s.kl = r.get_vector<float>();
    s.raw_advantages = r.get_vector<float>();
    s.advantages = r.get_vector<float>();
    s.values = r.get_vector<float>();
    s.returns = r.get_vector<float>();
    s.teacher_log_probs = r.get_vector<float>();
  }
  SLIMPI_CHECK(r.done(), "sample message has trailing bytes");
  return out;
}

}  // namespace slimpi
