#!/usr/bin/env python3
"""Reinforcement learning on the bundled date task, over a training session.

    PYTHONPATH=clients/python python3 clients/python/examples/rl_loop.py \
        "$(build/lathe model path)/task_train.jsonl" "$(build/lathe model path)/task_eval.jsonl" \
        [--iters 30] [--prompts 8] [--num-samples 8] [--lr 1e-3] [--sft-warmup 20] [--eval-n 100]

The task (workers/engine/lt_task.h): "date: March 5, 2021\\niso:" -> " 2021-03-05". Each
iteration samples --num-samples completions of --prompts training prompts, rewards each 1 when
its text (up to EOS, whitespace trimmed at both ends) equals the expected completion, else 0,
takes as advantage the reward minus the mean reward of its prompt's group, and sends an
importance_sampling forward_backward with the sampler's logprobs, then an optim_step. The next
iteration's sample call is sent right behind them, so it samples from the updated weights
without a round trip in between. Exact match on the validation split (greedy; the first
--eval-n lines, 0: all, or a random subset with --eval-seed) is measured at the start, after
the supervised warm-up, and at the end with the weights saved by save_weights_for_sampler, each
with a 95% percentile bootstrap CI (--bootstrap resamples of the per-example 0/1 scores, seeded
by --seed); the gains (end vs start, end vs after the warm-up) come with paired bootstrap CIs.
The sampler's logprobs are the model's own (not tempered), so with --temperature below 1 the
importance ratio is 1 on policy and the update is plain REINFORCE on the tempered samples.

The bundled base model has never seen the task, so its samples rarely match and a group whose
samples all score the same has no advantage to learn from. --sft-warmup N first runs N
supervised steps on the training split in the same session (0: pure RL from the base model);
the exact match after it is printed so that the gain of RL itself can be told apart.
Measured on lathe-tiny: bench/RESULTS.md, "Training sessions: RL on the date task".
"""
import argparse
import random
import sys
import time
from typing import List, Sequence, Tuple

from _common import Tokenizer, add_client_args, read_jsonl, service_from

from lathe_client import AdamParams, LatheError, SamplingParams, rl_datum, sft_datum


def completion_tokens(tokens: List[int], eos: int) -> List[int]:
    """The sampled tokens up to (not including) the first EOS."""
    return tokens[:tokens.index(eos)] if eos in tokens else tokens


def exact_match(expected: str, got: str) -> bool:
    return expected.strip() == got.strip()


def evaluate(sampler, tok: Tokenizer, prompts, expected, args, chunk: int = 32) -> List[int]:
    """Greedy exact match over (prompt tokens, expected text) pairs, one 0/1 score per example;
    every chunk sent first."""
    sp = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, stop=[args.eos], seed=args.seed)
    futures = [sampler.sample_many(prompts[i:i + chunk], 1, sp) for i in range(0, len(prompts), chunk)]
    got: List[List[int]] = []
    for f in futures:
        got.extend(completion_tokens(s.tokens, args.eos) for s in f.result(args.call_timeout).samples)
    texts = tok.decode_many(got)
    return [int(exact_match(e, t)) for e, t in zip(expected, texts)]


def bootstrap_ci(scores: Sequence[float], n: int, seed: int, level: float = 0.95) -> Tuple[float, float]:
    """Percentile bootstrap CI of the mean of scores: n resamples with replacement, seeded."""
    rng = random.Random(seed)
    k = len(scores)
    means = sorted(sum(scores[rng.randrange(k)] for _ in range(k)) / k for _ in range(n))
    lo = means[int((1 - level) / 2 * n)]
    hi = means[min(n - 1, int((1 + level) / 2 * n))]
    return lo, hi


def report(what: str, scores: Sequence[int], args) -> float:
    em = sum(scores) / len(scores)
    lo, hi = bootstrap_ci(scores, args.bootstrap, args.seed)
    print(f"validation exact match {what}: {em:.3f}  95% CI [{lo:.3f}, {hi:.3f}]  "
          f"({sum(scores)}/{len(scores)} examples; {args.bootstrap} bootstrap resamples)", flush=True)
    return em


def report_gain(what: str, before: Sequence[int], after: Sequence[int], args) -> None:
    """The paired difference (same examples), with its bootstrap CI."""
    diff = [a - b for a, b in zip(after, before)]
    d = sum(diff) / len(diff)
    lo, hi = bootstrap_ci(diff, args.bootstrap, args.seed)
    print(f"exact match gain {what}: {d:+.3f}  95% CI [{lo:+.3f}, {hi:+.3f}] (paired bootstrap)", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("train", help="task_train.jsonl ({prompt, completion} lines)")
    p.add_argument("valid", help="task_eval.jsonl")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--prompts", type=int, default=8, help="prompts per iteration")
    p.add_argument("--num-samples", type=int, default=8, help="samples per prompt (the group)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=12)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--sft-warmup", type=int, default=20, help="supervised steps first (0: none)")
    p.add_argument("--sft-lr", type=float, default=3e-3)
    p.add_argument("--sft-batch", type=int, default=16, help="examples per supervised step")
    p.add_argument("--eval-n", type=int, default=100, help="validation examples to score (0: all)")
    p.add_argument("--eval-seed", type=int, default=None,
                   help="score a random subset of --eval-n lines drawn with this seed (default: the first --eval-n)")
    p.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples for the 95%% CIs")
    p.add_argument("--max-examples", type=int, default=1024, help="training lines to read (0: all)")
    p.add_argument("--call-timeout", type=float, default=600.0)
    add_client_args(p)
    args = p.parse_args()

    service = service_from(args)
    tok = Tokenizer(service, args.model)
    train = read_jsonl(args.train, args.max_examples)
    if args.eval_seed is None:
        valid = read_jsonl(args.valid, args.eval_n)
    else:
        valid = read_jsonl(args.valid)
        valid = random.Random(args.eval_seed).sample(valid, min(args.eval_n or len(valid), len(valid)))
    start = time.monotonic()
    t0 = time.monotonic()
    train_prompts = tok.encode_many([r["prompt"] for r in train])
    valid_prompts = tok.encode_many([r["prompt"] for r in valid])
    print(f"tokenized {len(train)} training and {len(valid)} validation prompts in {time.monotonic() - t0:.1f} s")
    rng = random.Random(args.seed)
    order = list(range(len(train)))
    rng.shuffle(order)

    def take(n: int) -> List[int]:
        out = [order[(take.at + i) % len(order)] for i in range(n)]
        take.at += n
        return out
    take.at = 0

    valid_expected = [r["completion"] for r in valid]
    with service.create_lora_training_client(args.model, rank=args.rank, alpha=2 * args.rank,
                                             seed=args.seed) as tc:
        print(f"session {tc.id}")
        base = evaluate(tc, tok, valid_prompts, valid_expected, args)
        report("at the start (base model)", base, args)

        if args.sft_warmup:
            completions = tok.encode_many([r["completion"] for r in train])
            sft = AdamParams(lr=args.sft_lr, grad_clip=1.0)
            inflight: List = []
            for step in range(args.sft_warmup + 1):  # one step queued ahead of the one awaited
                if step < args.sft_warmup:
                    batch = [sft_datum(train_prompts[i], completions[i], eos=args.eos) for i in take(args.sft_batch)]
                    inflight.append((tc.forward_backward(batch), tc.optim_step(sft)))
                if len(inflight) > 1 or step == args.sft_warmup:
                    fb, opt = inflight.pop(0)
                    loss = fb.result(args.call_timeout).loss
                    opt.result(args.call_timeout)
                    if step % 50 == 0 or step == args.sft_warmup:
                        print(f"supervised step {step:4d}  loss {loss:.4f}", flush=True)
            print(f"supervised warm-up: {args.sft_warmup} steps, last loss {loss:.4f} "
                  f"({time.monotonic() - start:.0f} s so far)", flush=True)
            warm = evaluate(tc, tok, valid_prompts, valid_expected, args)  # the weights as they are now
            report("after the supervised warm-up", warm, args)

        adam = AdamParams(lr=args.lr, grad_clip=1.0)
        sp = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, stop=[args.eos], seed=args.seed)
        idx = take(args.prompts)
        pending = tc.sample_many([train_prompts[i] for i in idx], args.num_samples, sp)
        for it in range(args.iters):
            out = pending.result(args.call_timeout)
            texts = tok.decode_many([completion_tokens(s.tokens, args.eos) for s in out.samples])
            rewards = [float(exact_match(train[idx[s.prompt]]["completion"], t)) for s, t in zip(out.samples, texts)]
            data = []
            signal = 0  # groups whose samples did not all score the same
            for g in range(len(idx)):
                group = [(s, r) for s, r in zip(out.samples, rewards) if s.prompt == g]
                mean = sum(r for _, r in group) / len(group) if group else 0.0
                signal += any(r != mean for _, r in group)
                for s, r in group:
                    if r != mean and s.tokens:  # zero advantage teaches nothing: not sent
                        data.append(rl_datum(train_prompts[idx[g]], s.tokens, s.logprobs, r - mean))
            calls = None
            if data:
                calls = (tc.forward_backward(data, "importance_sampling"), tc.optim_step(adam))
            # The next sample call goes out now, queued behind the update: on-policy, no idle gap.
            idx = take(args.prompts)
            sp.seed += 1
            pending = tc.sample_many([train_prompts[i] for i in idx], args.num_samples, sp)
            line = (f"iter {it + 1:3d}  mean reward {sum(rewards) / len(rewards):.3f}  "
                    f"groups with signal {signal}/{args.prompts}  {time.monotonic() - start:.0f} s")
            if calls:
                fb, st = calls[0].result(args.call_timeout), calls[1].result(args.call_timeout)
                line += f"  loss {fb.loss:+.4f}  trained on {len(data)} samples  optimizer step {st.step}"
            else:
                line += "  (every group scored evenly: no update)"
            print(line, flush=True)
        pending.result(args.call_timeout)  # the last prefetched sample: drained, unused

        sampler = tc.save_weights_for_sampler("rl-final").result(args.call_timeout)
        final = evaluate(sampler, tok, valid_prompts, valid_expected, args)
        report(f"at the end (weights {sampler.name!r}, step {sampler.step})", final, args)
        report_gain("end vs base", base, final, args)
        if args.sft_warmup:
            report_gain("of RL alone (end vs after the warm-up)", warm, final, args)
        print(f"wall time {time.monotonic() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except LatheError as e:
        sys.exit(f"rl_loop: {e}")
