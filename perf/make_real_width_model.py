#!/usr/bin/env python3
"""A Hugging Face directory at a released model's real width and reduced depth, random
weights in bf16 safetensors shards (developer-run, for perf/real_width_step.sh).

    /opt/slimpi/hf-dev/bin/python perf/make_real_width_model.py OUT deepseek_v3|glm45_air

deepseek_v3  DeepSeek-V3's layer (hidden 7168, 128 heads, query latent 1536, key/value
             latent 512, per head 128 no-rope + 64 rotary dims and 128 value dims, experts
             of 2048 with one shared expert, sigmoid routing in groups, YaRN factor 40 over
             4096) at 1 layer, 4 routed experts (2 groups, top-2), vocabulary 8192, no MTP layer
glm45_air    GLM-4.5-Air's layer (hidden 4096, 96 heads / 8 key/value heads of 128,
             half-rotary, q/k/v biases, experts of 1408 with one shared expert) at 1
             layer, 4 routed experts (top-2), vocabulary 8192, no MTP layer
Widths are the released config.json's; depth, expert count and vocabulary are cut so that
a training step fits four ranks of a 24 GiB machine.
"""
import os
import sys

import torch
import transformers

SHAPES = {
    "deepseek_v3": (transformers.DeepseekV3Config, transformers.DeepseekV3ForCausalLM, dict(
        vocab_size=8192, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
        num_hidden_layers=1, num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1,
        n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1, routed_scaling_factor=2.5,
        first_k_dense_replace=0, norm_topk_prob=True, kv_lora_rank=512, q_lora_rank=1536,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, rope_interleave=True,
        max_position_embeddings=163840, rms_norm_eps=1e-6, tie_word_embeddings=False, num_nextn_predict_layers=0,
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=40.0,
                             original_max_position_embeddings=4096, beta_fast=32, beta_slow=1,
                             mscale=1.0, mscale_all_dim=1.0))),
    "glm45_air": (transformers.Glm4MoeConfig, transformers.Glm4MoeForCausalLM, dict(
        vocab_size=8192, hidden_size=4096, intermediate_size=10944, moe_intermediate_size=1408,
        num_hidden_layers=1, num_attention_heads=96, num_key_value_heads=8, head_dim=128,
        n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        routed_scaling_factor=1.0, first_k_dense_replace=0, norm_topk_prob=True, attention_bias=True,
        use_qk_norm=False, max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False,
        num_nextn_predict_layers=0,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0, partial_rotary_factor=0.5))),
}


def main():
    out, shape = sys.argv[1], sys.argv[2]
    config_class, model_class, kwargs = SHAPES[shape]
    torch.manual_seed(7)
    model = model_class(config_class(**kwargs)).to(torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True, max_shard_size="400MB")
    shards = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
    print(f"{shape}: {n / 1e6:.0f}M parameters in {len(shards)} shards at {out}")


if __name__ == "__main__":
    main()
