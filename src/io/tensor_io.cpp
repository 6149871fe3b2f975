#include "io/tensor_io.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <slimpi/error.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <functional>
#include <regex>
#include <set>

#include "arch/architecture.h"
#include "arch/mtp_names.h"
#include "core/log.h"
#include "io/safetensors.h"
#include "io/tensor_pieces.h"
#include "model/fp8_blocks.h"
#include "model/linear_channels.h"
#include "model/model_config.h"

namespace slimpi {

const StoredDtype& stored_dtype(at::ScalarType dtype) {
  for (const auto& t : stored_dtypes())
    if (t.torch == dtype) return t;
  SLIMPI_FAIL("cannot store tensors of dtype {} in HDF5", std::string(c10::toString(dtype)));
}

const std::vector<StoredDtype>& stored_dtypes() {
  static const std::vector<StoredDtype> t{
      {"float32", at::kFloat, H5T_NATIVE_FLOAT}, {"float64", at::kDouble, H5T_NATIVE_DOUBLE},
      {"bfloat16", at::kBFloat16, H5T_NATIVE_UINT16}, {"float16", at::kHalf, H5T_NATIVE_UINT16},
      {"int64", at::kLong, H5T_NATIVE_INT64}, {"int32", at::kInt, H5T_NATIVE_INT32},
      {"uint8", at::kByte, H5T_NATIVE_UINT8},
  };
  return t;
}

h5::Handle create_tensor_dataset(hid_t loc, const std::string& name, const std::vector<int64_t>& shape,
                                 at::ScalarType dtype, bool filled) {
  const StoredDtype& st = stored_dtype(dtype);
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  h5::Handle space(h5::check(dims.empty() ? H5Screate(H5S_SCALAR)
                                          : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                             "H5Screate"),
                   H5Sclose);
  h5::Handle lcpl(h5::check(H5Pcreate(H5P_LINK_CREATE), "H5Pcreate(lcpl)"), H5Pclose);
  h5::check_status(H5Pset_create_intermediate_group(lcpl.id(), 1), "H5Pset_create_intermediate_group");
  h5::Handle dcpl(h5::check(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate(dcpl)"), H5Pclose);
  if (!filled) h5::check_status(H5Pset_fill_time(dcpl.id(), H5D_FILL_TIME_NEVER), "H5Pset_fill_time");
  h5::Handle d(h5::check(H5Dcreate2(loc, name.c_str(), st.h5, space.id(), lcpl.id(), dcpl.id(), H5P_DEFAULT),
                         ("create tensor dataset " + name).c_str()),
               H5Dclose);
  h5::write_attr(d.id(), "dtype", std::string(st.name));
  return d;
}

StoredTensorInfo stored_tensor_info(hid_t dataset, const std::string& name) {
  SLIMPI_CHECK(h5::has_attr(dataset, "dtype"), "tensor {} has no 'dtype' attribute (every tensor slimpi writes has "
               "one: 'float32', 'bfloat16', ...); the file is damaged or was not written by slimpi", name);
  std::string dtype;
  try {
    dtype = h5::read_attr_string(dataset, "dtype");
  } catch (const Error& e) {
    SLIMPI_FAIL("tensor {}: its 'dtype' attribute cannot be read as a string: {}", name, e.what());
  }
  StoredTensorInfo info;
  for (const auto& t : stored_dtypes())
    if (dtype == t.name) info.dtype = &t;
  SLIMPI_CHECK(info.dtype, "tensor {} has unknown dtype attribute '{}'", name, dtype);
  h5::Handle space(h5::check(H5Dget_space(dataset), "H5Dget_space"), H5Sclose);
  std::vector<hsize_t> dims(size_t(std::max(0, H5Sget_simple_extent_ndims(space.id()))));
  h5::check_status(H5Sget_simple_extent_dims(space.id(), dims.data(), nullptr), "H5Sget_simple_extent_dims");
  info.shape.assign(dims.begin(), dims.end());
  return info;
}

void write_tensor(hid_t loc, const std::string& name, const at::Tensor& tensor) {
  at::Tensor t = tensor.detach().cpu().contiguous();
  h5::Handle d = create_tensor_dataset(loc, name, t.sizes().vec(), t.scalar_type(), /*filled=*/false);
  if (t.numel() > 0)
    h5::check_status(H5Dwrite(d.id(), stored_dtype(t.scalar_type()).h5, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data_ptr()),
                     ("write tensor " + name).c_str());
}

at::Tensor read_tensor(hid_t loc, const std::string& name) {
  h5::Handle d(h5::check(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), ("open tensor " + name).c_str()), H5Dclose);
  const StoredTensorInfo info = stored_tensor_info(d.id(), name);
  at::Tensor t = at::empty(info.shape, info.dtype->torch);
  if (t.numel() > 0)
    h5::check_status(H5Dread(d.id(), info.dtype->h5, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data_ptr()),
                     ("read tensor " + name).c_str());
  return t;
}

void write_tensors(hid_t loc, const std::vector<NamedTensor>& tensors) {
  for (const auto& t : tensors) write_tensor(loc, t.name, t.tensor);
}

void read_tensors_into(hid_t loc, const std::vector<NamedTensor>& targets, bool any_float, const StoredWhole& stored) {
  // Each tensor's part only: a hyperslab of the whole tensor (io/tensor_pieces.h).
  at::NoGradGuard no_grad;
  std::vector<TensorPiece> pieces;
  for (const auto& t : targets)  // views: reading a piece writes the target
    pieces.push_back({t.name, t.tensor.sizes().vec(), 0, t.tensor.detach().view({-1})});
  read_tensor_pieces(loc, stored, pieces, any_float);
}

namespace {

// How the model's tensor names appear in a Hugging Face checkpoint's files: slimpi's, or
// its family's (arch/architecture.h: Mixtral names its MoE tensors its own way) when the
// files use that naming (errors then name what the files would hold); MTP depths as
// slimpi's (MiMo's), DeepSeek-V3's "model.layers.<L + i>." or Qwen3.5's "mtp.*"
// (arch/mtp_names.h).
struct HfNames {
  const Architecture* naming = nullptr;
  bool deepseek_mtp = false, qwen_mtp = false;
  int64_t n_layers = 0, n_mtp = 0;  // the trunk's layers, the model's MTP depths

  // cfg (when given): the model's layer counts (a pipeline stage's `like` holds some).
  HfNames(const SafetensorsReader& reader, const std::vector<NamedTensor>& like, const ModelConfig* cfg = nullptr) {
    std::vector<std::string> names;
    for (const auto& [name, e] : reader.entries()) names.push_back(name);
    naming = architecture_naming(names);
    deepseek_mtp = uses_deepseek_mtp_names(names);
    qwen_mtp = uses_qwen_mtp_names(names);
    const std::string layers = "model.layers.", depths = "model.mtp_layers.";
    for (const auto& l : like) {
      if (l.name.rfind(layers, 0) == 0)
        n_layers = std::max<int64_t>(n_layers, std::stoll(l.name.substr(layers.size())) + 1);
      if (is_mtp_parameter(l.name)) n_mtp = std::max<int64_t>(n_mtp, std::stoll(l.name.substr(depths.size())) + 1);
    }
    if (cfg) {
      n_layers = cfg->n_layers;
      n_mtp = cfg->mtp_num_layers;
    }
  }
  // Whether a file tensor belongs to an MTP depth in any layout (Qwen3.5's "mtp.*",
  // slimpi's "model.mtp_layers.", DeepSeek-V3's layers past the trunk's).
  // A Qwen3.5 layout's depth past the model's (mtp.layers.<k>., k >= n_mtp): not read.
  bool is_extra_qwen_mtp_depth(const std::string& name) const {
    const std::string layers = "mtp.layers.";
    return qwen_mtp && name.rfind(layers, 0) == 0 && std::stoll(name.substr(layers.size())) >= n_mtp;
  }
  bool is_mtp_file_tensor(const std::string& name) const {
    if (name.rfind("mtp.", 0) == 0 || name.rfind("model.mtp_layers.", 0) == 0) return true;
    const std::string layers = "model.layers.";
    if (!deepseek_mtp || name.rfind(layers, 0) != 0) return false;
    return std::stoll(name.substr(layers.size())) >= n_layers;
  }
  // The MTP depth of a file tensor (is_mtp_file_tensor): DeepSeek-V3's layer past the
  // trunk's, slimpi's index, Qwen3.5's one depth (its extra ones: is_extra_qwen_mtp_depth).
  int64_t mtp_depth_of(const std::string& name) const {
    for (const std::string prefix : {"model.mtp_layers.", "model.layers."})
      if (name.rfind(prefix, 0) == 0)
        return std::stoll(name.substr(prefix.size())) - (prefix == "model.layers." ? n_layers : 0);
    return 0;
  }
  std::string in_files(const std::string& name) const {
    if (deepseek_mtp && is_mtp_parameter(name)) return deepseek_mtp_name(name, n_layers);
    if (qwen_mtp && is_mtp_parameter(name)) return qwen_mtp_name(name);
    return naming ? naming->tensor_name(name) : name;
  }
};

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// A tensor of the files the model does not take that is no error: another expert shard's,
// a DeepSeek MTP depth's copy of the shared embedding or head, an FP8 weight's block
// scales (read with it), HF's non-parameter RoPE buffer, a tied model's stored lm_head
// equal to its embedding.
bool expected_extra(const SafetensorsReader& reader, const std::string& name, const std::set<std::string>& wanted,
                    const HfNames& names, bool experts_sharded, bool tied) {
  if (experts_sharded && is_hf_expert_name(name)) return true;
  if (names.deepseek_mtp && is_deepseek_mtp_copy(name)) return true;
  if (const std::string tail = "_scale_inv"; name.size() > tail.size() && ends_with(name, tail)) {
    const std::string weight = name.substr(0, name.size() - tail.size());
    if (wanted.count(weight) && reader.entries().at(weight).dtype == at::kFloat8_e4m3fn) return true;
  }
  if (ends_with(name, "rotary_emb.inv_freq")) return true;
  return name == "lm_head.weight" && tied && reader.contains("model.embed_tokens.weight") &&
         at::equal(reader.read(name), reader.read("model.embed_tokens.weight"));
}

std::vector<int64_t> without_unit_dims(const std::vector<int64_t>& shape) {
  std::vector<int64_t> out;
  for (int64_t n : shape)
    if (n != 1) out.push_back(n);
  return out;
}

std::string listed(const std::vector<std::string>& names) {
  const size_t shown = std::min<size_t>(names.size(), 12);
  std::string text = fmt::format("{}", fmt::join(names.begin(), names.begin() + shown, ", "));
  if (shown < names.size()) text += fmt::format(", ... ({} in all)", names.size());
  return text;
}

// Tensor `name` of the files as floating point: an F8_E4M3 weight de-quantised with its
// "<name>_scale_inv" block scales (model/fp8_blocks.h).
at::Tensor read_hf_tensor(const SafetensorsReader& reader, const std::string& name) {
  const std::string& where = reader.description();
  at::Tensor whole = reader.read(name);
  if (whole.scalar_type() != at::kFloat8_e4m3fn) return whole;
  const std::string scales = fp8_scale_name(name);
  SLIMPI_CHECK(reader.contains(scales) && whole.dim() == 2, "{}: {} is F8_E4M3 but {}", where, name,
               whole.dim() != 2 ? "not a matrix" : "the files hold no " + scales + " (its block scales)");
  const at::Tensor s = reader.read(scales);
  SLIMPI_CHECK(s.scalar_type() == at::kFloat && s.sizes().vec() == fp8_scale_shape(whole.size(0), whole.size(1)),
               "{}: {} is {} {}; a {}x{} F8_E4M3 weight in 128 x 128 blocks needs F32 {}", where, scales,
               std::string(c10::toString(s.scalar_type())), fmt::join(s.sizes(), "x"), whole.size(0), whole.size(1),
               fmt::join(fp8_scale_shape(whole.size(0), whole.size(1)), "x"));
  return dequantize_fp8_blocks(whole, s, at::kFloat);
}

// Copies the tensors of a Hugging Face checkpoint (io/safetensors.h: a file, a directory, a
// sharded index) into `like`, all checked by name and shape first: a tensor the model
// needs and the files lack, or one the files hold and the model does not use, is an
// error listing them all (never dropped or left at its init); the expected extras
// (expected_extra) pass. A model given MTP depths that the files do not hold keeps their
// fresh initialisation.
// Under pipeline parallelism the files' tensors of another stage's layers, embedding,
// final norm, head or MTP layers (`in_files`: the model's name -> the files').
// mtp_depth: the file tensor's MTP depth (HfNames::mtp_depth_of), -1 for a trunk tensor.
bool held_by_another_stage(const std::string& file_name, int64_t mtp_depth, const PipelineShard& stage,
                           const ModelConfig* cfg, const std::function<std::string(const std::string&)>& in_files) {
  if (stage.size == 1 || !cfg) return false;
  // The model's MTP depths: the last stage's (a depth past the model's is every stage's error).
  if (mtp_depth >= 0) return mtp_depth < cfg->mtp_num_layers && !stage.last();
  static const std::regex layer(R"((^|\.)layers\.(\d+)\.)");
  if (std::smatch m; std::regex_search(file_name, m, layer))
    return !stage.holds_layer(std::stoll(m[2].str()), cfg->n_layers);
  for (const char* name : {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"})
    if (file_name == in_files(name)) return !stage.holds(name, cfg->n_layers, last_stage_copies_embedding(*cfg));
  return false;
}

void load_hf_tensors_into(const std::string& path, const std::vector<NamedTensor>& like, bool experts_sharded,
                          const StoredWhole& stored, const PipelineShard& stage) {
  SafetensorsReader reader(path);
  const std::string& where = reader.description();
  const ModelConfig* staged = stage.size > 1 ? stored.cfg : nullptr;  // a stage's `like` holds some layers
  const HfNames names(reader, like, staged);
  bool files_have_mtp = false;
  for (const auto& l : like)
    files_have_mtp = files_have_mtp || (is_mtp_parameter(l.name) && reader.contains(names.in_files(l.name)));
  auto loaded = [&](const NamedTensor& l) { return files_have_mtp || !is_mtp_parameter(l.name); };
  std::set<std::string> wanted;
  std::vector<std::string> missing, unused, wrong;
  int64_t n_fresh = 0;
  for (const auto& l : like) {
    if (!loaded(l)) {
      ++n_fresh;
      continue;
    }
    wanted.insert(names.in_files(l.name));
    if (!reader.contains(names.in_files(l.name))) missing.push_back(names.in_files(l.name));
  }
  if (n_fresh > 0)
    log::info("{} holds no multi-token-prediction layers: the model's {} MTP tensors keep their fresh initialisation",
              where, n_fresh);
  const bool tied = wanted.count("lm_head.weight") == 0;
  bool model_has_mtp = staged && staged->mtp_num_layers > 0;  // (on any stage)
  for (const auto& l : like) model_has_mtp = model_has_mtp || is_mtp_parameter(l.name);
  // The family's tensors outside the text model (a vision tower), and the files' MTP
  // layers when the model has none (model.mtp_num_layers = 0: a critic, a teacher, a deck
  // that drops them).
  int64_t n_not_loaded = 0;
  for (const auto& [name, e] : reader.entries()) {
    if (wanted.count(name)) continue;
    if ((names.naming && names.naming->not_loaded && names.naming->not_loaded(name)) ||
        (!model_has_mtp && names.is_mtp_file_tensor(name)) || names.is_extra_qwen_mtp_depth(name))
      ++n_not_loaded;
    else if (!expected_extra(reader, name, wanted, names, experts_sharded, tied) &&
             !held_by_another_stage(name, names.is_mtp_file_tensor(name) ? names.mtp_depth_of(name) : -1, stage,
                                    stored.cfg,
                                    [&](const std::string& model_name) { return names.in_files(model_name); }))
      unused.push_back(name);
  }
  if (n_not_loaded > 0)
    log::info("{}: {} tensors outside the text model (vision tower, MTP layers) are not loaded", where, n_not_loaded);
  SLIMPI_CHECK(missing.empty() && unused.empty(),
               "{} does not match the model{}{}{}", where,
               missing.empty() ? "" : "; the model needs tensors the files lack: " + listed(missing),
               unused.empty() ? "" : "; the files hold tensors the model does not use: " + listed(unused),
               tied && !unused.empty() ? " (a tied model has no lm_head.weight; check model.tie_word_embeddings)" : "");
  for (const auto& l : like) {
    if (!loaded(l)) continue;
    const SafetensorsReader::Entry& e = reader.entries().at(names.in_files(l.name));
    const bool same_kind = at::isFloatingType(e.dtype) && at::isFloatingType(l.tensor.scalar_type());
    const std::vector<int64_t> shape = stored.whole_shape(l.name, l.tensor.sizes().vec());
    if (without_unit_dims(e.shape) != without_unit_dims(shape) || !same_kind)  // (dtypes: converted by the copy below)
      wrong.push_back(fmt::format("{} is {} {}, the model needs {} {}", names.in_files(l.name), fmt::join(e.shape, "x"),
                                  std::string(c10::toString(e.dtype)), fmt::join(shape, "x"),
                                  std::string(c10::toString(l.tensor.scalar_type()))));
  }
  SLIMPI_CHECK(wrong.empty(), "{}: {}", where, fmt::join(wrong, "; "));
  at::NoGradGuard no_grad;
  for (const auto& l : like) {  // one whole tensor read at a time
    if (!loaded(l)) continue;
    // (a tensor the files hold with unit dimensions the model's lacks: a depthwise conv1d's [C, 1, K])
    at::Tensor whole = read_hf_tensor(reader, names.in_files(l.name)).reshape(stored.whole_shape(l.name, l.tensor.sizes().vec()));
    if ((names.deepseek_mtp || names.qwen_mtp) && is_mtp_input_proj(l.name))
      whole = swap_input_proj_halves(whole);  // [emb ; h] -> [h ; emb]
    if (l.name.find(".linear_attn.") != std::string::npos) {
      SLIMPI_CHECK(stored.cfg, "loading {} from {}: a Gated DeltaNet layer's tensors need the model's shape "
                   "(StoredWhole::cfg) to be put in slimpi's channel order", l.name, where);
      if (holds_linear_channels(l.name, *stored.cfg)) whole = linear_channels_from_hf(whole, *stored.cfg);
    }
    l.tensor.copy_(stored.part_of(l.name, whole));
  }
}

}  // namespace

void mark_linear_channel_order(hid_t group, const ModelConfig& cfg) {
  if (cfg.is_hybrid()) h5::write_attr(group, kLinearChannelsAttr, std::string(kLinearChannelsByKeyHead));
}

void check_linear_channel_order(hid_t group, const std::vector<NamedTensor>& params, const StoredWhole& stored,
                                const std::string& path) {
  bool linear = false;
  for (const auto& p : params) linear = linear || p.name.find(".linear_attn.") != std::string::npos;
  if (!linear) return;
  SLIMPI_CHECK(stored.cfg, "loading {}: a Gated DeltaNet layer's tensors need the model's shape (StoredWhole::cfg)",
               path);
  bool reordered = false;  // (with one key head the two orders are the same)
  for (const auto& p : params)
    reordered = reordered || (holds_linear_channels(p.name, *stored.cfg) && stored.cfg->linear_num_key_heads > 1);
  const bool grouped = h5::has_attr(group, kLinearChannelsAttr) &&
                       h5::read_attr_string(group, kLinearChannelsAttr) == kLinearChannelsByKeyHead;
  SLIMPI_CHECK(grouped || !reordered,
               "{}: its hybrid model's Gated DeltaNet tensors (in_proj_qkv, conv1d) are in Hugging Face's channel "
               "order, written by an older slimpi (no '{}' attribute on its model group: before the channels were held "
               "grouped by key head). Export the checkpoint with the slimpi that wrote it (slimpi export) and start "
               "from the export (model.init_from)", path, kLinearChannelsAttr);
}

void load_model_weights(const std::vector<NamedTensor>& params, const std::string& path, const std::string& group,
                        bool experts_sharded, const StoredWhole& stored, const PipelineShard& stage) {
  auto ends_with = [&](const std::string& tail) {
    return path.size() > tail.size() && path.compare(path.size() - tail.size(), tail.size(), tail) == 0;
  };
  const bool hf = std::filesystem::is_directory(path) || ends_with(".safetensors") || ends_with(".json");
  SLIMPI_CHECK(hf || std::filesystem::exists(path), "model weights {} do not exist", path);
  if (hf) {
    load_hf_tensors_into(path, params, experts_sharded, stored, stage);
  } else {
    h5::File f = h5::File::open(path, false, MPI_COMM_NULL);
    h5::Handle g = h5::open_group(f.id(), group);
    check_linear_channel_order(g.id(), params, stored, path);
    read_tensors_into(g.id(), params, /*any_float=*/true, stored);
  }
}

}  // namespace slimpi
