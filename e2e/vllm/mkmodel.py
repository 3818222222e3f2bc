"""Writes the e2e/vllm test model: a Qwen3-architecture causal LM with two
layers, hidden size 64, the real Qwen3 vocabulary, tokenizer and chat
template, and seeded random weights. The same bytes on every machine:
weights come from a seeded CPU generator and are written in a fixed order,
config.json with sorted keys, and TestModelDeterministic checks the digest.

Purely random weights decode greedily into endless whitespace (with tied
embeddings a token predicts itself, and the generation prompt ends in a
newline), and whitespace is what a JSON grammar always allows, so even a
constrained tool call never ends. The output layer is therefore untied and
carries a per-token bias: every embedding has 1.0 in dimension 0, which
RMSNorm turns into a large, nearly constant hidden component, and
lm_head's column 0 scales it per token. The double quote is preferred,
then JSON punctuation and the end-of-turn tokens, and everything else
(whitespace, words, <tool_call>) is far below: free text is a run of
quotes (non-empty), a grammar-constrained tool call completes as the
shortest valid JSON and ends, and the model never calls a tool unasked.

usage: python mkmodel.py TOKENIZER_DIR OUT_DIR
"""

import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file

SEED = 53
VOCAB = 151936  # Qwen3's embedding rows (tokenizer.json holds 151,669 ids)
HIDDEN = 64
HEADS = 2
KV_HEADS = 1
HEAD_DIM = 32  # the smallest head size vLLM's CPU attention supports
INTER = 128
LAYERS = 2

CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": HEAD_DIM,
    "hidden_act": "silu",
    "hidden_size": HIDDEN,
    "initializer_range": 0.02,
    "intermediate_size": INTER,
    "max_position_embeddings": 4096,
    "max_window_layers": LAYERS,
    "num_attention_heads": HEADS,
    "num_hidden_layers": LAYERS,
    "num_key_value_heads": KV_HEADS,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": VOCAB,
}

GENERATION = {
    "bos_token_id": 151643,
    "eos_token_id": [151645, 151643],
    "do_sample": False,
}


PUNCT = set('{}[]":,')
END_OF_TURN = (151643, 151645)  # <|endoftext|>, <|im_end|>
# Logit biases (before the small random part, whose spread is about 0.03).
BIAS_QUOTE, BIAS_PUNCT, BIAS_OTHER = 10.0, 0.0, -20.0
H0 = 7.9  # the hidden state's dimension 0 after the final RMSNorm, about


def biases(tok_dir):
    with open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8") as f:
        vocab = json.load(f)["model"]["vocab"]
    b = torch.full((VOCAB,), BIAS_OTHER)
    for token, i in vocab.items():
        if token and set(token) <= PUNCT:
            b[i] = BIAS_PUNCT
    for i in END_OF_TURN:
        b[i] = BIAS_PUNCT
    b[vocab['"']] = BIAS_QUOTE
    return b


def tensors(tok_dir):
    g = torch.Generator(device="cpu").manual_seed(SEED)

    def rnd(*shape):
        return (torch.randn(*shape, generator=g, dtype=torch.float32) * 0.02).contiguous()

    embed = rnd(VOCAB, HIDDEN)
    embed[:, 0] = 1.0
    head = rnd(VOCAB, HIDDEN)
    head[:, 0] = biases(tok_dir) / H0
    out = {"model.embed_tokens.weight": embed.contiguous(), "lm_head.weight": head.contiguous()}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = torch.ones(HIDDEN)
        out[p + "post_attention_layernorm.weight"] = torch.ones(HIDDEN)
        out[p + "self_attn.q_proj.weight"] = rnd(HEADS * HEAD_DIM, HIDDEN)
        out[p + "self_attn.k_proj.weight"] = rnd(KV_HEADS * HEAD_DIM, HIDDEN)
        out[p + "self_attn.v_proj.weight"] = rnd(KV_HEADS * HEAD_DIM, HIDDEN)
        out[p + "self_attn.o_proj.weight"] = rnd(HIDDEN, HEADS * HEAD_DIM)
        out[p + "self_attn.q_norm.weight"] = torch.ones(HEAD_DIM)
        out[p + "self_attn.k_norm.weight"] = torch.ones(HEAD_DIM)
        out[p + "mlp.gate_proj.weight"] = rnd(INTER, HIDDEN)
        out[p + "mlp.up_proj.weight"] = rnd(INTER, HIDDEN)
        out[p + "mlp.down_proj.weight"] = rnd(HIDDEN, INTER)
    out["model.norm.weight"] = torch.ones(HIDDEN)
    return out


def main():
    tok_dir, out_dir = sys.argv[1], sys.argv[2]
    tmp = out_dir + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    save_file(tensors(tok_dir), os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    for name, obj in (("config.json", CONFIG), ("generation_config.json", GENERATION)):
        with open(os.path.join(tmp, name), "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True)
            f.write("\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(tok_dir, name), os.path.join(tmp, name))
    shutil.rmtree(out_dir, ignore_errors=True)
    os.rename(tmp, out_dir)


if __name__ == "__main__":
    main()
