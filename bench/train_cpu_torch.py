#!/usr/bin/python3
"""PyTorch peer of bench/train_cpu: the same LoRA training step in plain torch (Debian's
python3-torch 1.13; attention written out, it has no scaled_dot_product_attention).

SmolLM2-135M shape (d=576, 30 layers, 9 heads, 3 kv heads, ffn 1536, vocab 49152, tied
embeddings), random weights, LoRA rank 16 alpha 32 on q,k,v,o,gate,up,down, batch 4 x 256,
forward + backward + AdamW. Prints `torch_step_s: <seconds per step>` (mean over --steps after
one warm-up step) and `torch_peak_rss_mib: <MiB>`.

--batch B --seq T: other shapes (the length sweep). --mem-gib G caps the address space, so that
a length PyTorch cannot hold fails here (`torch_oom: ...`, exit 3) rather than pushing the
machine into its OOM killer. --checkpoint recomputes each layer in backward
(torch.utils.checkpoint), what a PyTorch user does when the activations do not fit."""
import argparse
import math
import resource
import sys
import time

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--steps", type=int, default=2)
ap.add_argument("--layers", type=int, default=30)
ap.add_argument("--batch", type=int, default=4)
ap.add_argument("--seq", type=int, default=256)
ap.add_argument("--mem-gib", type=float, default=0)
ap.add_argument("--checkpoint", action="store_true")
args = ap.parse_args()
if args.mem_gib > 0:
    cap = int(args.mem_gib * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
torch.set_num_threads(args.threads)
torch.manual_seed(0)

V, D, L, H, KV, FF, T, B, R, ALPHA = 49152, 576, args.layers, 9, 3, 1536, args.seq, args.batch, 16, 32
hd = D // H
scale = ALPHA / R


def w(*shape):
    return (torch.randn(*shape) * 0.02).requires_grad_(False)


class Lora(torch.nn.Module):
    def __init__(self, out, inp):
        super().__init__()
        self.w = w(out, inp)
        self.A = torch.nn.Parameter(torch.empty(R, inp).uniform_(-1 / math.sqrt(inp), 1 / math.sqrt(inp)))
        self.B = torch.nn.Parameter(torch.zeros(out, R))

    def forward(self, x):
        return x @ self.w.T + scale * ((x @ self.A.T) @ self.B.T)


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = Lora(H * hd, D), Lora(KV * hd, D), Lora(KV * hd, D), Lora(D, H * hd)
        self.g, self.u, self.d = Lora(FF, D), Lora(FF, D), Lora(D, FF)
        self.n1, self.n2 = torch.ones(D), torch.ones(D)


def rms(x, wt):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * wt


inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
fr = torch.outer(torch.arange(T).float(), inv)
emb = torch.cat([fr, fr], -1)
COS, SIN = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]


def rope(x):
    h = hd // 2
    return x * COS + torch.cat([-x[..., h:], x[..., :h]], -1) * SIN


layers = torch.nn.ModuleList([Layer() for _ in range(L)])
E = w(V, D)
NF = torch.ones(D)
mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)


def block(x, ly):
    h = rms(x, ly.n1)
    q = rope(ly.q(h).view(B, T, H, hd))
    k = rope(ly.k(h).view(B, T, KV, hd)).repeat_interleave(H // KV, 2)
    v = ly.v(h).view(B, T, KV, hd).repeat_interleave(H // KV, 2)
    s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(hd)
    p = torch.softmax(s.masked_fill(mask, float("-inf")), -1)
    o = torch.einsum("bhts,bshd->bthd", p, v).reshape(B, T, D)
    x = x + ly.o(o)
    h2 = rms(x, ly.n2)
    return x + ly.d(F.silu(ly.g(h2)) * ly.u(h2))


def forward(tok):
    x = E[tok]
    for ly in layers:
        if args.checkpoint:
            x = torch.utils.checkpoint.checkpoint(block, x, ly, use_reentrant=False)
        else:
            x = block(x, ly)
    return rms(x, NF) @ E.T


opt = torch.optim.AdamW(layers.parameters(), lr=1e-4)
tok = torch.randint(0, V, (B, T))
tgt = torch.randint(0, V, (B, T))


def step():
    opt.zero_grad()
    loss = F.cross_entropy(forward(tok).view(-1, V), tgt.view(-1))
    loss.backward()
    opt.step()
    return float(loss)


try:
    step()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
except (MemoryError, RuntimeError) as e:  # torch reports a refused allocation as RuntimeError
    print(f"torch_oom: {str(e).splitlines()[0][:200]}", flush=True)
    sys.exit(3)
dt = (time.perf_counter() - t0) / args.steps
print(f"torch_step_s: {dt:.4f}")
print(f"torch_peak_rss_mib: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}")
