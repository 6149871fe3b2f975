# The Qwen3-0.6B shape as `slimpi run` overrides (sourced by perf scripts): d 1024, 28
# layers, 16 heads / 8 KV heads, head dim 128, MLP 3072, vocabulary 151936, tied
# embeddings, q/k norms; random weights from the seed.
qwen3_shape=(--set model.vocab_size=151936 --set model.hidden_size=1024 --set model.n_layers=28 --set model.n_heads=16
             --set model.n_kv_heads=8 --set model.head_dim=128 --set model.intermediate_size=3072
             --set model.tie_word_embeddings=true --set model.qk_norm=true --set model.max_seq_len=128)
