#!/usr/bin/python3
"""PyTorch reference of Lathe's training engine (workers/engine/lt_engine.c), for tests/test_engine.c.

The same Llama-family architecture written out in plain torch (Debian's python3-torch 1.13 has
no F.scaled_dot_product_attention, and no transformers/peft/safetensors packages exist here),
computed in float64 so it serves as ground truth for the engine's float32 results.

Usage: llama_ref.py CASE_DIR
  reads  CASE_DIR/model/{config.json,model.safetensors}   the base model (HF names)
         CASE_DIR/p0/adapter_model.safetensors             initial LoRA adapter (PEFT names)
         CASE_DIR/inputs.safetensors                       batches, prompt (token ids as F32)
         CASE_DIR/params.json                              AdamW, LoRA and loss settings
  writes CASE_DIR/ref.safetensors with
         p1.<name>       adapter after one AdamW step on batch 0
         logits1         (B, T, V) logits on batch 1 with adapter p1
         loss1, logp1    loss (1) and per-token log-probs (B, T) on batch 1
         grad1.<name>    gradient of loss1 wrt every adapter tensor
         p2.<name>       adapter after the second AdamW step
         greedy          greedy continuation (n_greedy) of `prompt` with adapter p2
"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch

torch.set_default_dtype(torch.float64)
torch.set_num_threads(1)

DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64,
          "I32": np.int32}


def st_load(path):
    """Reads a safetensors file by its format: u64 LE header length, JSON header, raw data."""
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        raw = buf[base + b:base + e]
        if info["dtype"] == "BF16":
            u16 = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
            arr = u16.view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=DTYPES[info["dtype"]])
        out[name] = torch.from_numpy(arr.astype(np.float64).reshape(info["shape"]))
    return out


def st_save(path, tensors):
    """Writes F32 safetensors."""
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        a = np.ascontiguousarray(t.detach().cpu().numpy().astype(np.float32))
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes())
        off += a.nbytes
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


MODS = [("self_attn", "q_proj"), ("self_attn", "k_proj"), ("self_attn", "v_proj"),
        ("self_attn", "o_proj"), ("mlp", "gate_proj"), ("mlp", "up_proj"), ("mlp", "down_proj")]


class Llama:
    def __init__(self, cfg, w, lora, scale):
        self.c, self.w, self.lora, self.scale = cfg, w, lora, scale
        self.D = cfg["hidden_size"]
        self.H = cfg["num_attention_heads"]
        self.KV = cfg.get("num_key_value_heads", self.H)
        self.hd = cfg.get("head_dim", self.D // self.H)
        self.L = cfg["num_hidden_layers"]
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        theta = cfg.get("rope_theta", 10000.0)
        rs = cfg.get("rope_scaling")
        self.factor = rs["factor"] if rs and rs.get("type", rs.get("rope_type")) == "linear" else 1.0
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.hd, 2) / self.hd))
        self.tied = cfg.get("tie_word_embeddings", False)

    def rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def lin(self, x, l, parent, mod):
        pre = f"model.layers.{l}.{parent}.{mod}"
        y = x @ self.w[pre + ".weight"].T
        if pre + ".bias" in self.w:
            y = y + self.w[pre + ".bias"]
        key = f"base_model.model.{pre}"
        if key + ".lora_A.weight" in self.lora:
            A, B = self.lora[key + ".lora_A.weight"], self.lora[key + ".lora_B.weight"]
            y = y + self.scale * ((x @ A.T) @ B.T)
        return y

    def rope(self, x, T):  # x (B, T, nh, hd), HF rotate_half
        t = torch.arange(T) / self.factor
        freqs = torch.outer(t, self.inv_freq)
        emb = torch.cat([freqs, freqs], -1)
        cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]
        half = self.hd // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * cos + rot * sin

    def forward(self, tok):  # tok (B, T) long -> logits (B, T, V)
        Bn, T = tok.shape
        x = self.w["model.embed_tokens.weight"][tok]
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        for l in range(self.L):
            h = self.rms(x, self.w[f"model.layers.{l}.input_layernorm.weight"])
            q = self.lin(h, l, "self_attn", "q_proj").view(Bn, T, self.H, self.hd)
            k = self.lin(h, l, "self_attn", "k_proj").view(Bn, T, self.KV, self.hd)
            v = self.lin(h, l, "self_attn", "v_proj").view(Bn, T, self.KV, self.hd)
            q, k = self.rope(q, T), self.rope(k, T)
            g = self.H // self.KV
            k = k.repeat_interleave(g, dim=2)
            v = v.repeat_interleave(g, dim=2)
            s = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(self.hd)
            s = s.masked_fill(mask, float("-inf"))
            p = torch.softmax(s, -1)
            o = torch.einsum("bhts,bshd->bthd", p, v).reshape(Bn, T, self.H * self.hd)
            x = x + self.lin(o, l, "self_attn", "o_proj")
            h2 = self.rms(x, self.w[f"model.layers.{l}.post_attention_layernorm.weight"])
            gt = self.lin(h2, l, "mlp", "gate_proj")
            up = self.lin(h2, l, "mlp", "up_proj")
            x = x + self.lin(torch.nn.functional.silu(gt) * up, l, "mlp", "down_proj")
        x = self.rms(x, self.w["model.norm.weight"])
        lm = self.w["model.embed_tokens.weight"] if self.tied else self.w["lm_head.weight"]
        return x @ lm.T


def loss_fn(logits, b, kind):
    logp = torch.log_softmax(logits, -1).gather(-1, b["targets"].clamp(min=0)[..., None])[..., 0]
    w = b["weights"]
    if kind == "ce":
        loss = -(w * logp).sum() / w.sum()
    else:
        loss = -(w * torch.exp(logp - b["slogp"]) * b["adv"]).sum() / w.sum()
    return loss, logp


def main():
    case = sys.argv[1]
    with open(os.path.join(case, "model", "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(case, "params.json")) as f:
        prm = json.load(f)
    w = st_load(os.path.join(case, "model", "model.safetensors"))
    lora = st_load(os.path.join(case, "p0", "adapter_model.safetensors"))
    inp = st_load(os.path.join(case, "inputs.safetensors"))
    names = sorted(lora)
    params = [lora[n].clone().requires_grad_(True) for n in names]
    adapter = dict(zip(names, params))
    model = Llama(cfg, w, adapter, prm["alpha"] / prm["rank"])
    opt = torch.optim.AdamW(params, lr=prm["lr"], betas=(prm["beta1"], prm["beta2"]),
                            eps=prm["eps"], weight_decay=prm["weight_decay"])

    def batch(i):
        b = {k: inp[f"b{i}.{k}"] for k in ("tokens", "targets", "weights")}
        b["tokens"], b["targets"] = b["tokens"].long(), b["targets"].long()
        if prm["loss"] == "is":
            b["adv"], b["slogp"] = inp[f"b{i}.adv"], inp[f"b{i}.slogp"]
        return b

    def step(b):
        opt.zero_grad()
        loss, logp = loss_fn(model.forward(b["tokens"]), b, prm["loss"])
        loss.backward()
        if prm["max_grad_norm"] > 0:
            torch.nn.utils.clip_grad_norm_(params, prm["max_grad_norm"])
        opt.step()

    out = {}
    step(batch(0))
    for n, p in adapter.items():
        out["p1." + n] = p.detach().clone()
    b1 = batch(1)
    opt.zero_grad()
    logits = model.forward(b1["tokens"])
    loss, logp = loss_fn(logits, b1, prm["loss"])
    loss.backward()
    out["logits1"] = logits.detach()
    out["loss1"] = loss.detach().reshape(1)
    out["logp1"] = logp.detach()
    for n, p in adapter.items():
        out["grad1." + n] = p.grad.detach().clone()
    if prm["max_grad_norm"] > 0:
        torch.nn.utils.clip_grad_norm_(params, prm["max_grad_norm"])
    opt.step()
    for n, p in adapter.items():
        out["p2." + n] = p.detach().clone()
    with torch.no_grad():
        seq = inp["prompt"].long().reshape(1, -1)
        gen = []
        for _ in range(prm["n_greedy"]):
            nxt = int(model.forward(seq)[0, -1].argmax())
            gen.append(nxt)
            seq = torch.cat([seq, torch.tensor([[nxt]])], 1)
        out["greedy"] = torch.tensor(gen, dtype=torch.float64)
    st_save(os.path.join(case, "ref.safetensors"), out)


if __name__ == "__main__":
    main()
