// Hugging Face config.json as deck keys: with model.init_from naming a Hugging Face model
// directory (config.json + safetensors), the checkpoint's config supplies the [model]
// keys, so a user starts from a Hub model without copying its shape by hand.
//
// Architectures: the families of arch/architecture.h (Llama, Qwen2, Qwen3, Qwen2-MoE,
// Qwen3-MoE, Mixtral, MiMo, GLM-4.5, DeepSeek-V3, GLM-4.7-Flash), which read their own
// fields (biases, q/k norms, experts, partial rotary factor, latent attention). Fields
// every family has, read here: vocab_size, hidden_size, num_hidden_layers,
// num_attention_heads, num_key_value_heads, head_dim, intermediate_size,
// max_position_embeddings, rope_theta, rope_scaling (or transformers 5's
// rope_parameters: default, linear, llama3, yarn), rms_norm_eps, tie_word_embeddings. Rules:
//   - a [model] key the deck leaves at its default takes the config's value (its source
//     reads "<dir>/config.json (<field>)", so deck.resolved.toml and checkpoints carry it);
//   - a key the deck sets to another value is a problem naming both (model.max_seq_len
//     may be lower than max_position_embeddings: it is a limit, not a shape);
//   - a field that changes the math and is not supported (another architecture or
//     hidden_act, mlp_bias, sliding-window layers, other rope_scaling types, a partial
//     rotary factor where the family has none, experts in a dense family, attention
//     dropout) is a problem, never ignored.
// tokenizer.path is resolved here too: "" becomes model.init_from's directory when it
// holds a tokenizer.json, else "bytes"; a path that holds no tokenizer.json is a problem.
// A model.init_from that is not a directory with config.json is left alone (an HDF5 or
// single .safetensors file keeps the deck's shape; a missing path is reported where the
// weights are read).
#pragma once

#include <map>
#include <string>
#include <vector>

#include <slimpi/deck.h>

namespace slimpi {

// entries: a deck being loaded, defaults filled in. Appends one line per problem.
void apply_hf_config(std::map<std::string, DeckEntry>& entries, std::vector<std::string>& problems);

}  // namespace slimpi
