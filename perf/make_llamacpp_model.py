#!/usr/bin/env python3
"""A Qwen3-0.6B-shaped model with random weights, as a Hugging Face directory (slimpi's
input) and as a GGUF file in the same dtype (llama.cpp's input), for
perf/engine_vs_llamacpp.sh. Developer-only: runs in a venv with transformers (and
slimpi's torch) and llama.cpp's convert_hf_to_gguf.py from llama-cpp-python's sources.

Shape: d 1024, 28 layers, 16 heads / 8 KV heads, head dim 128, MLP 3072, vocabulary
151936, tied embeddings, q/k norms, rope theta 1e6; weights drawn by transformers'
initialiser (std 0.02) from a fixed seed, stored in fp32. The tokenizer is the test
fixture's 900-id Qwen2-style BPE (tests/fixtures/tokenizers/qwen2_style): the
benchmarks feed token ids, so only the vocabulary size matters; llama.cpp's converter
pads it to 151936 and is told its pre-tokenizer is Qwen2's (the fixture's hash is not in
its table, and that it has no SentencePiece model).

Usage: make_llamacpp_model.py OUT_DIR LLAMA_CPP_DIR
  writes OUT_DIR/hf/{config.json,model.safetensors,tokenizer*.json} and OUT_DIR/model.gguf
"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

out, llama = Path(sys.argv[1]), Path(sys.argv[2])
root = Path(__file__).resolve().parent.parent
hf = out / "hf"
hf.mkdir(parents=True, exist_ok=True)

torch.manual_seed(0)
config = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                     num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                     max_position_embeddings=4096, rope_theta=1e6, rms_norm_eps=1e-6, bos_token_id=None,
                     eos_token_id=0, torch_dtype="float32")
model = Qwen3ForCausalLM(config).to(torch.float32).eval()
model.save_pretrained(hf, safe_serialization=True)
shutil.copy(root / "tests/fixtures/tokenizers/qwen2_style/tokenizer.json", hf / "tokenizer.json")
(hf / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                      "eos_token": "<|endoftext|>", "bos_token": None}))

# llama.cpp's converter, its pre-tokenizer check answered with Qwen2's (see above).
wrapper = f"""
import sys
sys.path.insert(0, {str(llama)!r})
sys.path.insert(1, {str(llama / "gguf-py")!r})
sys.argv = ["convert_hf_to_gguf.py", {str(hf)!r}, "--outtype", "f32", "--outfile", {str(out / "model.gguf")!r}]
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
def no_sentencepiece(self):  # a BPE tokenizer.json, no tokenizer.model: Qwen2's GPT-2-style vocabulary
    raise FileNotFoundError("tokenizer.model")
base.TextModel._set_vocab_sentencepiece = no_sentencepiece
import runpy
runpy.run_path({str(llama / "convert_hf_to_gguf.py")!r}, run_name="__main__")
"""
subprocess.run([sys.executable, "-c", wrapper], check=True)
print(f"make_llamacpp_model: {hf} and {out / 'model.gguf'}")
