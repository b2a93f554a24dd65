#!/usr/bin/python3
"""PyTorch peer for the sampling benchmark: KV-cached greedy decode of a Llama-family model in
plain torch (Debian's python3-torch 1.13 under /usr/bin/python3; it has no
scaled_dot_product_attention, so attention is matmul + softmax, written out).

Loads a Hugging Face model directory (config.json + model.safetensors, F32; F16/BF16 are
widened) into RMSNorm / RoPE (rope_theta) / grouped-query attention / SwiGLU MLP, tied
embeddings when tie_word_embeddings, q/k/v bias when attention_bias or present in the file.

What it measures: a batch of B deterministic prompts of P token ids ((i*7 + j*13) % vocab),
one prefill forward of (B, P) that fills a preallocated per-layer KV cache (B, KV, P+N, hd),
then N greedy decode steps, each a forward of (B, 1) that writes its K/V in place and attends
over the first t cached positions, argmax picking (logits only for the last position). One
untimed warm-up run, then --repeat timed runs; reports the median:
  decode_tok_s = B*N / decode seconds   (decode steps only, prefill excluded)
  prefill_s    = seconds of the prefill forward
The lead's C benchmark runs the same shape (same model dir, B, P, N, threads) through Lathe's
own sampler and compares its decode tokens/s against decode_tok_s from this script, in the
same run on the same machine, so the ratio is what is reported, not absolute numbers.

Tuning (measured on Debian torch 1.13 / OpenBLAS, 2 cores): single-row linears use mv (sgemm's
fixed cost is ~4x gemv at (1, d)); GQA attention is one batched matmul per kv group (no K/V
repeat), which beat broadcast mul+sum at batch 1 and einsum everywhere; OPENBLAS_NUM_THREADS is
pinned to --threads and OMP_WAIT_POLICY=PASSIVE (both setdefault: the environment wins).

Usage:
  bench/sample_torch.py --model DIR --batch B --prompt-len P --new-tokens N --threads T
                        [--repeat K] [--json] [--check]
--json prints one line: {"batch","prompt_len","new_tokens","threads","decode_tok_s",
"prefill_s","torch"}. --check compares last-position logits of the KV-cached path (prefill
then token-by-token decode) against a full no-cache forward; exits 1 if max |diff| >= 1e-3.
"""
import argparse
import json
import math
import os
import struct
import sys
import time

ap = argparse.ArgumentParser(description="KV-cached greedy decode benchmark (PyTorch peer)")
ap.add_argument("--model", required=True, help="HF model dir: config.json + model.safetensors")
ap.add_argument("--batch", type=int, default=1)
ap.add_argument("--prompt-len", type=int, default=64)
ap.add_argument("--new-tokens", type=int, default=64)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--repeat", type=int, default=3, help="timed runs after the warm-up; median reported")
ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32",
                help="the model's weights, activations and KV cache in this type (bf16: as people serve "
                     "bf16 checkpoints on CPUs with AVX512-BF16/AMX)")
ap.add_argument("--json", action="store_true")
ap.add_argument("--check", action="store_true", help="cached vs uncached logits self-check first")
args = ap.parse_args()
# Debian's torch does its GEMMs in OpenBLAS (pthreads), whose pool is sized from the environment
# at load time, not by torch.set_num_threads: pin it to --threads before torch is imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(args.threads))
# With two pools (OpenMP for elementwise/softmax, OpenBLAS for GEMM) spinning OpenMP workers steal
# the cores the GEMM needs; passive waiting measured 2-7x faster at batch 8 here, ~same at batch 1.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DT = {"F32": (torch.float32, 4), "F16": (torch.float16, 2), "BF16": (torch.bfloat16, 2)}
DTYPE = torch.bfloat16 if args.dtype == "bf16" else torch.float32


def load_safetensors(path):
    """Parse safetensors by hand: u64 LE header length, JSON header, raw LE data."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = bytearray(f.read())
    out = {}
    for name, m in hdr.items():
        if name == "__metadata__":
            continue
        a, b = m["data_offsets"]
        dt, size = DT[m["dtype"]]
        t = torch.frombuffer(data, dtype=dt, count=(b - a) // size, offset=a)
        out[name] = t.reshape(m["shape"]).to(DTYPE).clone()
    return out


def lin(x, w, b=None):
    """F.linear, but a single row goes through addmv/mv: Debian's torch calls OpenBLAS sgemm,
    whose fixed cost dominates (1, d) x (d, n) products (~4x slower than gemv here)."""
    if x.numel() == x.shape[-1]:
        y = torch.mv(w, x.reshape(-1)) if b is None else torch.addmv(b, w, x.reshape(-1))
        return y.view(*x.shape[:-1], w.shape[0])
    return F.linear(x, w, b)


class Model:
    def __init__(self, d):
        c = json.load(open(os.path.join(d, "config.json")))
        w = load_safetensors(os.path.join(d, "model.safetensors"))
        self.D, self.H = c["hidden_size"], c["num_attention_heads"]
        self.KV = c.get("num_key_value_heads", self.H)
        self.hd = c.get("head_dim") or self.D // self.H
        self.G, self.V, self.eps = self.H // self.KV, c["vocab_size"], c.get("rms_norm_eps", 1e-6)
        self.theta = c.get("rope_theta", 10000.0)
        bias = c.get("attention_bias", False)
        self.E = w["model.embed_tokens.weight"]
        self.head = self.E if c.get("tie_word_embeddings", False) else w["lm_head.weight"]
        self.norm = w["model.norm.weight"]
        self.layers = []
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            g = lambda k: w.get(p + k)
            ly = {k: g(n) for k, n in [("n1", "input_layernorm.weight"), ("n2", "post_attention_layernorm.weight"),
                                        ("q", "self_attn.q_proj.weight"), ("k", "self_attn.k_proj.weight"),
                                        ("v", "self_attn.v_proj.weight"), ("o", "self_attn.o_proj.weight"),
                                        ("gate", "mlp.gate_proj.weight"), ("up", "mlp.up_proj.weight"),
                                        ("down", "mlp.down_proj.weight")]}
            for k in "qkv":
                ly[k + "b"] = g(f"self_attn.{k}_proj.bias")
                if bias and ly[k + "b"] is None:
                    sys.exit(f"attention_bias set but {p}self_attn.{k}_proj.bias missing")
            self.layers.append(ly)
        self.set_max_len(c.get("max_position_embeddings", 2048))

    def set_max_len(self, T):
        inv = 1.0 / (self.theta ** (torch.arange(0, self.hd, 2, dtype=torch.float64) / self.hd))
        fr = torch.outer(torch.arange(T, dtype=torch.float64), inv)
        emb = torch.cat([fr, fr], -1)
        self.cos, self.sin = emb.cos().to(DTYPE), emb.sin().to(DTYPE)

    def rms(self, x, wt):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * wt

    def rope(self, x, pos0):  # x (B, heads, S, hd), HF rotate_half convention
        S, h = x.shape[2], self.hd // 2
        cos, sin = self.cos[pos0:pos0 + S], self.sin[pos0:pos0 + S]
        return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin

    def new_cache(self, B, T):
        return [(torch.zeros(B, self.KV, T, self.hd, dtype=DTYPE), torch.zeros(B, self.KV, T, self.hd, dtype=DTYPE))
                for _ in self.layers]

    def forward(self, tok, cache, pos0, last_only=True):
        """tok (B, S) at positions pos0..pos0+S-1; writes K/V into cache in place; attends over
        cache[:, :, :pos0+S]. Returns logits (B, V) for the last position, or (B, S, V)."""
        B, S = tok.shape
        t = pos0 + S
        KV, G, hd = self.KV, self.G, self.hd
        mask = None
        if S > 1:  # causal: query i (pos pos0+i) sees keys j <= pos0+i; rows ordered (g, s)
            m = torch.arange(t)[None, :] > (pos0 + torch.arange(S))[:, None]
            mask = torch.zeros(S, t, dtype=DTYPE).masked_fill(m, float("-inf")).repeat(G, 1)
        x = self.E[tok]
        for ly, (kc, vc) in zip(self.layers, cache):
            h = self.rms(x, ly["n1"])
            q = lin(h, ly["q"], ly["qb"]).view(B, S, self.H, hd).transpose(1, 2)
            k = lin(h, ly["k"], ly["kb"]).view(B, S, KV, hd).transpose(1, 2)
            v = lin(h, ly["v"], ly["vb"]).view(B, S, KV, hd).transpose(1, 2)
            kc[:, :, pos0:t] = self.rope(k, pos0)
            vc[:, :, pos0:t] = v
            # GQA without repeating K/V: query heads of kv group j are heads j*G..j*G+G-1
            q = self.rope(q, pos0).reshape(B, KV, G * S, hd)
            s = torch.matmul(q, kc[:, :, :t].transpose(-1, -2)) * (1.0 / math.sqrt(hd))
            if mask is not None:
                s = s + mask
            o = torch.matmul(torch.softmax(s, -1), vc[:, :, :t])  # (B, KV, G*S, hd)
            o = o.view(B, self.H, S, hd).transpose(1, 2).reshape(B, S, self.H * hd)
            x = x + lin(o, ly["o"])
            h2 = self.rms(x, ly["n2"])
            x = x + lin(F.silu(lin(h2, ly["gate"])) * lin(h2, ly["up"]), ly["down"])
        if last_only:
            x = x[:, -1]
        return lin(self.rms(x, self.norm), self.head)


def prompts(B, P, V):
    return torch.tensor([[(i * 7 + j * 13) % V for j in range(P)] for i in range(B)], dtype=torch.long)


def run(m, B, P, N):
    """Prefill (picks the first token) + N greedy decode steps; returns (prefill_s, decode_s, tokens)."""
    cache = m.new_cache(B, P + N)
    tok = prompts(B, P, m.V)
    t0 = time.perf_counter()
    nxt = m.forward(tok, cache, 0).argmax(-1)
    t1 = time.perf_counter()
    out = [nxt]
    for i in range(N):  # N decode forwards of (B, 1) at positions P..P+N-1
        nxt = m.forward(nxt[:, None], cache, P + i).argmax(-1)
        out.append(nxt)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, torch.stack(out, 1)


def check(m):
    B, P, extra = 2, 12, 6
    tok = prompts(B, P + extra, m.V)
    cache = m.new_cache(B, P + extra)
    lg = m.forward(tok[:, :P], cache, 0)
    for i in range(extra):
        lg = m.forward(tok[:, P + i:P + i + 1], cache, P + i)
    full = m.forward(tok, m.new_cache(B, P + extra), 0, last_only=False)[:, -1]
    d = (lg - full).abs().max().item()
    print(f"check: max |cached - full| last-position logits = {d:.3e}")
    return d < 1e-3


def main():
    a = args
    torch.set_num_threads(a.threads)
    with torch.inference_mode():
        m = Model(a.model)
        B, P, N = a.batch, a.prompt_len, a.new_tokens
        if P < 1 or N < 1:
            sys.exit("need --prompt-len >= 1 and --new-tokens >= 1")
        m.set_max_len(max(P + N, 32))  # RoPE table covers the run even past max_position_embeddings
        if a.check and not check(m):
            sys.exit(1)
        run(m, B, P, N)  # warm-up
        res = [run(m, B, P, N)[:2] for _ in range(max(1, a.repeat))]
        pre = sorted(r[0] for r in res)[len(res) // 2]
        dec = sorted(r[1] for r in res)[len(res) // 2]
    tps = B * N / dec  # N decode forwards of (B, 1), B tokens each
    if a.json:
        print(json.dumps({"batch": B, "prompt_len": P, "new_tokens": N, "threads": a.threads,
                          "decode_tok_s": round(tps, 2), "dtype": args.dtype, "prefill_s": round(pre, 6), "torch": torch.__version__}))
    else:
        print(f"torch {torch.__version__}  B={B} P={P} N={N} threads={a.threads}: "
              f"decode {tps:.1f} tok/s ({dec:.4f} s), prefill {pre:.4f} s")


if __name__ == "__main__":
    main()
