#!/usr/bin/env python3
"""Supervised fine-tuning driven from your own loop, over a training session.

    PYTHONPATH=clients/python python3 clients/python/examples/sft_loop.py TRAIN.jsonl \
        [--valid VALID.jsonl] [--steps 100] [--batch 16] [--lr 3e-3] [--save sft-final]

TRAIN.jsonl has one {"prompt","completion"} object a line (e.g. task_train.jsonl beside the
bundled model: `build/lathe model path`). Each example is tokenized through the server, prompt
and completion apart, and trained on the completion and EOS only (sft_datum).

The loop pipelines: it sends step k+1's forward_backward and optim_step before awaiting step
k's results, so the server always has the next step queued. It prints the loss of each step:
the server's `loss` and the mean negative logprob per weighted token, computed here from the
returned logprobs. At the end it saves the state (weights and optimizer) under --save.
"""
import argparse
import collections
import random
import sys
import time

from _common import Tokenizer, add_client_args, read_jsonl, service_from

from lathe_client import AdamParams, LatheError, sft_datum


def mean_nll(out, batch) -> float:
    """-sum(w * logprob) / sum(w) over a batch, from forward/forward_backward's logprobs."""
    num = den = 0.0
    for lps, d in zip(out.logprobs, batch):
        for lp, w in zip(lps, d.weights):
            num -= lp * w
            den += w
    return num / den if den else float("nan")


def valid_loss(tc, valid, timeout: float, chunk: int = 32) -> float:
    """Mean NLL per weighted token over valid: every chunk's forward sent first, then awaited
    (chunks keep each request body small; the API caps JSON bodies)."""
    parts = [valid[i:i + chunk] for i in range(0, len(valid), chunk)]
    futures = [tc.forward(part) for part in parts]
    num = den = 0.0
    for part, f in zip(parts, futures):
        out = f.result(timeout)
        for lps, d in zip(out.logprobs, part):
            num -= sum(lp * w for lp, w in zip(lps, d.weights))
            den += sum(d.weights)
    return num / den if den else float("nan")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("train", help="JSONL of {prompt, completion}")
    p.add_argument("--valid", help="JSONL to measure the loss on before and after (forward only)")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--max-examples", type=int, default=1024, help="read at most this many lines (0: all)")
    p.add_argument("--save", default="sft-final", help="name of the state saved at the end")
    p.add_argument("--call-timeout", type=float, default=600.0, help="seconds to wait for one call")
    add_client_args(p)
    args = p.parse_args()

    service = service_from(args)
    tok = Tokenizer(service, args.model)
    rows = read_jsonl(args.train, args.max_examples)
    t0 = time.monotonic()
    prompts = tok.encode_many([r["prompt"] for r in rows])
    completions = tok.encode_many([r["completion"] for r in rows])
    data = [sft_datum(pt, ct, eos=args.eos) for pt, ct in zip(prompts, completions)]
    valid = []
    if args.valid:
        vrows = read_jsonl(args.valid, 256)
        vp, vc = tok.encode_many([r["prompt"] for r in vrows]), tok.encode_many([r["completion"] for r in vrows])
        valid = [sft_datum(pt, ct, eos=args.eos) for pt, ct in zip(vp, vc)]
    print(f"tokenized {len(data)} training and {len(valid)} validation examples in {time.monotonic() - t0:.1f} s")

    rng = random.Random(args.seed)
    order: list = []

    def next_batch():
        while len(order) < args.batch:  # epochs, each in a fresh seeded order
            idx = list(range(len(data)))
            rng.shuffle(idx)
            order.extend(idx)
        return [data[order.pop(0)] for _ in range(args.batch)]

    adam = AdamParams(lr=args.lr, grad_clip=args.grad_clip)
    with service.create_lora_training_client(args.model, rank=args.rank, alpha=2 * args.rank,
                                             seed=args.seed) as tc:
        print(f"session {tc.id}")
        if valid:
            print(f"valid loss before: {valid_loss(tc, valid, args.call_timeout):.4f}")
        pending = collections.deque()
        t0 = time.monotonic()
        for step in range(args.steps):
            batch = next_batch()
            # Sent now, queued behind the previous step's calls: nothing waits here.
            pending.append((step, batch, tc.forward_backward(batch, "cross_entropy"), tc.optim_step(adam)))
            if len(pending) > 1:  # await the step before this one while this one is queued
                report(pending.popleft(), args.call_timeout, t0)
        while pending:
            report(pending.popleft(), args.call_timeout, t0)
        if valid:
            print(f"valid loss after:  {valid_loss(tc, valid, args.call_timeout):.4f}")
        saved = tc.save_state(args.save).result(args.call_timeout)
        print(f"saved state {saved.name!r} at step {saved.step} (session {tc.id})")
    return 0


def report(item, timeout: float, t0: float) -> None:
    step, batch, fb, opt = item
    out = fb.result(timeout)
    st = opt.result(timeout)
    gn = "-" if st.grad_norm is None else f"{st.grad_norm:.3f}"
    print(f"step {step + 1:4d}  loss {out.loss:.4f}  nll/token {mean_nll(out, batch):.4f}  "
          f"tokens {out.tokens}  grad_norm {gn}  optimizer step {st.step}  {time.monotonic() - t0:.1f} s",
          flush=True)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except LatheError as e:
        sys.exit(f"sft_loop: {e}")
