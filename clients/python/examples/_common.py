"""What the two examples share: client options, JSONL reading, tokenizing through the server.

The sessions contract tokenizes one text per request, so the examples tokenize each distinct
text once (a cache) with a few requests in flight (concurrent.futures); a 429 from the API's
rate limit is retried by the client after Retry-After (tokenize is idempotent)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Sequence, Tuple

# Runs from a checkout without PYTHONPATH too: clients/python is this folder's parent.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from lathe_client import ServiceClient  # noqa: E402


def add_client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="the API (default LATHE_API_URL or http://127.0.0.1:8080)")
    p.add_argument("--api-key", help="the tenant's key (default LATHE_API_KEY)")
    p.add_argument("--ca-file", help="PEM to check an https API against")
    p.add_argument("--model", default="lathe-tiny", help="base model (default lathe-tiny)")
    p.add_argument("--eos", type=int, default=0,
                   help="the end-of-text token id (lathe-tiny's <|endoftext|> is 0)")
    p.add_argument("--rank", type=int, default=8, help="LoRA rank (default 8)")
    p.add_argument("--seed", type=int, default=0)


def service_from(args: argparse.Namespace) -> ServiceClient:
    # retry_429: a loop that pipelines calls can outrun the API's per-key rate limit; a 429 is
    # answered before the request is acted on, so sending it again cannot run a call twice.
    return ServiceClient(base_url=args.url, api_key=args.api_key, ca_file=args.ca_file, retry_429=True)


def read_jsonl(path: str, limit: int = 0) -> List[Dict[str, str]]:
    """The {"prompt","completion"} lines of a JSONL file (the first `limit`, 0: all)."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            obj = json.loads(line)
            if not isinstance(obj.get("prompt"), str) or not isinstance(obj.get("completion"), str):
                sys.exit(f"{path}:{n}: wanted {{\"prompt\",\"completion\"}} strings")
            rows.append(obj)
            if limit and len(rows) >= limit:
                break
    if not rows:
        sys.exit(f"{path}: no examples")
    return rows


class Tokenizer:
    """The server's tokenizer for one model, with a cache in each direction."""

    def __init__(self, service: ServiceClient, model: str, parallel: int = 4) -> None:
        self.service, self.model, self.parallel = service, model, parallel
        self._enc: Dict[str, List[int]] = {}
        self._dec: Dict[Tuple[int, ...], str] = {}

    def encode_many(self, texts: Sequence[str]) -> List[List[int]]:
        todo = sorted({t for t in texts if t not in self._enc})
        with ThreadPoolExecutor(self.parallel) as pool:
            for t, ids in zip(todo, pool.map(lambda s: self.service.tokenize(self.model, s), todo)):
                self._enc[t] = ids
        return [self._enc[t] for t in texts]

    def decode_many(self, seqs: Sequence[Sequence[int]]) -> List[str]:
        keys = [tuple(s) for s in seqs]
        self._dec[()] = ""
        todo = sorted({k for k in keys if k not in self._dec})
        with ThreadPoolExecutor(self.parallel) as pool:
            for k, text in zip(todo, pool.map(self._detokenize, todo)):
                self._dec[k] = text
        return [self._dec[k] for k in keys]

    def _detokenize(self, ids: Sequence[int]) -> str:
        # Not ServiceClient.detokenize: for ids that decode to bytes that are not UTF-8 (a byte
        # token 0x80-0xff on its own, which a sampler can emit) the server answers 200 with an
        # empty body, where detokenize raises TypeError. Such a text matches no expected answer:
        # U+FFFD stands for it here.
        _, r = self.service.http.request("POST", "/v1/detokenize", {"model": self.model, "tokens": list(ids)},
                                         idempotent=True)
        return str(r["text"]) if isinstance(r, dict) and "text" in r else "\ufffd"
