#!/usr/bin/env python3
"""Generates the scheduler traces in bench/traces/ deterministically (fixed seeds).

heavy.csv   one heavy tenant floods the queue, four light tenants arrive steadily (fairness).
mixed.csv   production/standard/preemptible work, gangs of 2-8 GPUs, six base models,
            twelve tenants (priority, preemption, gangs, affinity).
Usage: gen_traces.py [OUTDIR]   (default: the directory of this script)"""
import os
import random
import sys

HEADER = "arrival_s,tenant,class,gpus,duration_s,base_model\n"


def heavy(path):
    rows = []
    for i in range(200):
        rows.append((i, "heavy", "standard", 1, 300, "llama-8b"))
    for light in range(4):
        for i in range(15):
            rows.append((60 + i * 40 + light, f"light{light}", "standard", 1, 300, "llama-8b"))
    write(path, rows)


def mixed(path):
    rnd = random.Random(4)
    models = ["llama-8b", "llama-70b", "qwen-7b", "mistral-7b", "gemma-9b", "phi-3"]
    rows = []
    t = 0.0
    for _ in range(1500):
        t += rnd.expovariate(1 / 6.0)
        tenant = min(int(rnd.paretovariate(1.2)), 12)
        r = rnd.random()
        cls = "production" if r < 0.15 else "standard" if r < 0.75 else "preemptible"
        g = rnd.random()
        gpus = 8 if g < 0.03 else 4 if g < 0.08 else 2 if g < 0.2 else 1
        dur = round(rnd.lognormvariate(6.0, 0.8))
        model = models[min(int(rnd.expovariate(0.7)), len(models) - 1)]
        rows.append((round(t, 1), f"t{tenant:02d}", cls, gpus, max(dur, 10), model))
    write(path, rows)


def write(path, rows):
    rows = sorted(rows, key=lambda r: r[0])  # `lathe sim` wants arrivals in order (stable sort)
    with open(path, "w") as f:
        f.write(HEADER)
        for r in rows:
            f.write(",".join(str(x) for x in r) + "\n")


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    heavy(os.path.join(out, "heavy.csv"))
    mixed(os.path.join(out, "mixed.csv"))
