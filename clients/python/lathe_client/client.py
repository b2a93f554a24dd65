"""ServiceClient (the tenant's door), TrainingClient (one training session) and SamplingClient."""
from __future__ import annotations

import os
import threading
import time
import uuid
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union
from urllib.parse import quote

from .errors import ConnectionFailed, InvalidRequest, LatheError
from .futures import CallFuture, CallTimeout
from .transport import DEFAULT_URL, Http
from .types import (AdamParams, DatumLike, ForwardBackwardOutput, OptimStepOutput, Sample, SampleOutput,
                    SamplingParams, SavedState, datum_json)

LOSSES = ("cross_entropy", "importance_sampling", "ppo")
JOB_DONE_STATES = ("completed", "failed", "cancelled", "rejected")


def _q(s: str) -> str:
    return quote(str(s), safe="")


def _fb_output(r: Dict[str, Any]) -> ForwardBackwardOutput:
    return ForwardBackwardOutput(loss=float(r.get("loss", float("nan"))), logprobs=r.get("logprobs") or [],
                                 tokens=int(r.get("tokens") or 0), raw=r)


def _optim_output(r: Dict[str, Any]) -> OptimStepOutput:
    g = r.get("grad_norm")
    return OptimStepOutput(step=int(r.get("step") or 0), grad_norm=None if g is None else float(g), raw=r)


def _saved(r: Dict[str, Any]) -> SavedState:
    return SavedState(name=str(r.get("name")), step=int(r.get("step") or 0), raw=r)


def _samples(r: Dict[str, Any]) -> SampleOutput:
    out = [Sample(prompt=int(s.get("prompt", 0)), tokens=list(s.get("tokens") or []),
                  logprobs=list(s.get("logprobs") or [])) for s in r.get("samples") or []]
    return SampleOutput(samples=out, raw=r)


class TrainingClient:
    """One training session: a LoRA adapter on a base model, trained by the calls you send.

    Every call method sends its call at once (POST, in the order you call them: the POSTs of one
    TrainingClient are serialized by a lock) and returns a CallFuture without waiting for the
    call to run; the server runs a session's calls in order. So you can queue the next
    forward_backward while the last one runs, and await results later.

    Every call's POST carries an Idempotency-Key of its own, so the client sends it again after
    a lost answer, a connection failure, 429 or 503 (a few times, after Retry-After): the server
    answers a repeat with the seq of the call the key first queued, and the call runs once. What
    it refuses raises (InvalidRequest naming the field, NotFound, Conflict when the session has
    ended); RateLimited/Unavailable or ConnectionFailed raise once the tries are spent, and then
    the call may or may not be queued: state()["calls_completed"] and the results of the calls
    you hold tell."""

    def __init__(self, http: Http, session_id: str, info: Optional[Dict[str, Any]] = None) -> None:
        self._http = http
        self.id = session_id
        self.info = info or {}
        self._post_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<TrainingClient {self.id}>"

    @property
    def _path(self) -> str:
        return f"/v1/sessions/{_q(self.id)}"

    def __enter__(self) -> "TrainingClient":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """Ends the session after its queued calls; cancels it when the block raised."""
        try:
            self.cancel() if exc_type else self.end()
        except LatheError:
            if exc_type is None:
                raise

    # -------------------------------------------------------------- calls

    def _call(self, body: Dict[str, Any], convert: Any) -> CallFuture:
        key = uuid.uuid4().hex
        with self._post_lock:  # a retry is sent before the next call, so the order holds
            _, r = self._http.request("POST", self._path + "/calls", body, idempotent=True,
                                      headers={"Idempotency-Key": key})
        if not isinstance(r, dict) or not isinstance(r.get("seq"), int):
            raise LatheError(f"POST {self._path}/calls: no seq in the answer {r!r}")
        return CallFuture(self._http, self.id, r["seq"], body["kind"], r.get("request_id"), convert)

    def _fb_body(self, kind: str, data: Sequence[DatumLike], loss_fn: str,
                 loss_config: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
        if loss_fn not in LOSSES:
            raise InvalidRequest(f"unknown loss {loss_fn!r} (one of {', '.join(LOSSES)})", field="loss",
                                 code="invalid")
        if not data:
            raise InvalidRequest("data is empty", field="data", code="invalid")
        body: Dict[str, Any] = {"kind": kind, "loss": loss_fn, "data": [datum_json(d, i) for i, d in enumerate(data)]}
        if loss_config is not None:
            body["loss_config"] = dict(loss_config)
        return body

    def forward_backward(self, data: Sequence[DatumLike], loss_fn: str = "cross_entropy",
                         loss_config: Optional[Mapping[str, Any]] = None) -> "CallFuture[ForwardBackwardOutput]":
        """Computes the loss over data and adds its gradient to the session's; result: loss,
        per-example per-token logprobs, tokens counted. loss_config: ppo's clip_low/clip_high."""
        return self._call(self._fb_body("forward_backward", data, loss_fn, loss_config), _fb_output)

    def forward(self, data: Sequence[DatumLike], loss_fn: str = "cross_entropy",
                loss_config: Optional[Mapping[str, Any]] = None) -> "CallFuture[ForwardBackwardOutput]":
        """Like forward_backward without the gradient: loss and logprobs only."""
        return self._call(self._fb_body("forward", data, loss_fn, loss_config), _fb_output)

    def optim_step(self, adam_params: Union[AdamParams, Mapping[str, Any]]) -> "CallFuture[OptimStepOutput]":
        """One AdamW step with the gradients accumulated since the last; result: step, grad_norm."""
        adam = adam_params.to_json() if isinstance(adam_params, AdamParams) else dict(adam_params)
        return self._call({"kind": "optim_step", "adam": adam}, _optim_output)

    def save_state(self, name: str) -> "CallFuture[SavedState]":
        """Saves weights and optimizer state under name (committed like a job checkpoint)."""
        return self._call({"kind": "save_state", "name": name}, _saved)

    def load_state(self, name: str) -> "CallFuture[SavedState]":
        """Replaces weights and optimizer state with those saved under name."""
        return self._call({"kind": "load_state", "name": name}, _saved)

    def save_weights_for_sampler(self, name: str) -> "CallFuture[SamplingClient]":
        """Saves the adapter as it is when the call runs; result: a SamplingClient for it."""
        return self._call({"kind": "save_weights_for_sampler", "name": name},
                          lambda r: SamplingClient(self, str(r.get("name", name)), int(r.get("step") or 0),
                                                   r.get("adapter"), r))

    def sample(self, prompt: Sequence[int], num_samples: int = 1,
               sampling_params: Optional[SamplingParams] = None) -> "CallFuture[SampleOutput]":
        """num_samples completions of one prompt (token ids), with the weights the session holds
        when the call runs (after every call sent before it)."""
        return self.sample_many([prompt], num_samples, sampling_params)

    def sample_many(self, prompts: Sequence[Sequence[int]], num_samples: int = 1,
                    sampling_params: Optional[SamplingParams] = None) -> "CallFuture[SampleOutput]":
        """num_samples completions of each prompt; samples come prompt-major."""
        if not prompts or any(not p for p in prompts):
            raise InvalidRequest("every prompt needs at least one token", field="prompts", code="invalid")
        sp = sampling_params or SamplingParams()
        body: Dict[str, Any] = {"kind": "sample", "prompts": [list(p) for p in prompts],
                                "num_samples": num_samples}
        body.update(sp.to_json())
        return self._call(body, _samples)

    # -------------------------------------------------------------- the session

    def state(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        """GET the session: state, attempt, step (optimizer steps of the state it holds),
        calls_completed, saved [{name, step}], idle."""
        _, r = self._http.request("GET", self._path, timeout=timeout, idempotent=True)
        self.info = r
        return r

    def end(self) -> Dict[str, Any]:
        """Ends the session once its queued calls have run (DELETE; state -> completed). Sent
        with an Idempotency-Key of its own, so one sent again after a lost answer is the same end
        (the answer names the first one's seq)."""
        _, r = self._http.request("DELETE", self._path, idempotent=True,
                                  headers={"Idempotency-Key": uuid.uuid4().hex})
        return r or {}

    def cancel(self) -> Dict[str, Any]:
        """Stops the session at once (state -> cancelled); queued calls do not run. Idempotent:
        sent again after a lost answer."""
        _, r = self._http.request("POST", self._path + "/cancel", idempotent=True)
        return r or {}

    def delete(self) -> Dict[str, Any]:
        """Deletes the finished session and everything it made: its adapter (its key first),
        checkpoints, saved states, calls' bodies and results (DELETE ?purge=true). A session not
        finished is refused (409): end() or cancel() it and wait_until() it first. Idempotent."""
        _, r = self._http.request("DELETE", self._path + "?purge=true", idempotent=True)
        return r or {}

    def wait_until(self, states: Iterable[str] = ("completed", "cancelled", "failed"),
                   timeout: float = 600.0, poll: float = 1.0) -> Dict[str, Any]:
        """Polls state() until the session is in one of states; CallTimeout after timeout s."""
        want = set(states)
        deadline = time.monotonic() + timeout
        while True:
            s = self.state()
            if s.get("state") in want:
                return s
            if time.monotonic() >= deadline:
                raise CallTimeout(f"session {self.id} still {s.get('state')} after {timeout} s")
            time.sleep(poll)

    def download_artifact(self, name: str, path: str) -> int:
        """Downloads a published artifact of the ended session (adapter_model.safetensors,
        adapter_config.json, ...: its final state, published once end() completed) to path."""
        return self._http.download(f"{self._path}/artifacts/{_q(name)}", path)


class SamplingClient:
    """Weights saved by save_weights_for_sampler: name, step, adapter (its sha256).

    sample() is a call of the same session, so it runs in order after the calls sent before it
    and samples with the weights the session holds then -- the saved ones only if no optim_step
    or load_state was sent in between (the sessions contract has no field to pick saved weights
    in a sample call). The saved weights themselves are served by the sampler (lathed --role
    sampler) to any OpenAI client as model "ft:<base>:<session id>:<name>" while the session lives."""

    def __init__(self, training: TrainingClient, name: str, step: int, adapter: Optional[str],
                 raw: Optional[Dict[str, Any]] = None) -> None:
        self.training = training
        self.name = name
        self.step = step
        self.adapter = adapter
        self.raw = raw or {}

    def __repr__(self) -> str:
        return f"<SamplingClient {self.training.id} {self.name} step {self.step}>"

    def sample(self, prompt: Sequence[int], num_samples: int = 1,
               sampling_params: Optional[SamplingParams] = None) -> "CallFuture[SampleOutput]":
        return self.training.sample(prompt, num_samples, sampling_params)

    def sample_many(self, prompts: Sequence[Sequence[int]], num_samples: int = 1,
                    sampling_params: Optional[SamplingParams] = None) -> "CallFuture[SampleOutput]":
        return self.training.sample_many(prompts, num_samples, sampling_params)


class ServiceClient:
    """The tenant's client: sessions, the tokenizer, datasets and jobs.

    base_url: LATHE_API_URL or http://127.0.0.1:8080; api_key: LATHE_API_KEY; ca_file: a PEM to
    check an https server against (LATHE_API_CA_FILE; default the system's CAs). timeout: seconds
    for each ordinary request (long polls wait their own time plus 30 s). No global state: two
    ServiceClients with different keys do not meet.

    retry_429: also send a POST again (after Retry-After, a few times) when the API's rate limit
    refused it with 429, which it does before acting on a request. Off by default: only
    idempotent requests are repeated unless you ask."""

    def __init__(self, base_url: Optional[str] = None, api_key: Optional[str] = None,
                 ca_file: Optional[str] = None, timeout: float = 60.0, retry_429: bool = False) -> None:
        url = base_url or os.environ.get("LATHE_API_URL") or DEFAULT_URL
        key = api_key if api_key is not None else os.environ.get("LATHE_API_KEY")
        ca = ca_file or os.environ.get("LATHE_API_CA_FILE") or None
        self.http = Http(url, key, ca, timeout=timeout, retry_429=retry_429)

    @property
    def base_url(self) -> str:
        return self.http.base_url

    # -------------------------------------------------------------- sessions

    def create_lora_training_client(self, base_model: str, rank: int = 8, alpha: float = 16,
                                    targets: Optional[Sequence[str]] = None, seed: int = 0,
                                    priority: str = "standard", dropout: float = 0.0) -> TrainingClient:
        """Opens a training session (POST /v1/sessions). It may still be queued for a slot when
        this returns; calls sent meanwhile wait their turn. targets None: every target module.
        Sent with an Idempotency-Key of its own, so it is sent again after a lost answer without
        opening a second session (which would hold a slot of its own)."""
        lora: Dict[str, Any] = {"rank": rank, "alpha": alpha, "dropout": dropout}
        if targets is not None:
            lora["targets"] = list(targets)
        body = {"base_model": base_model, "lora": lora, "seed": seed, "priority": priority}
        _, r = self.http.request("POST", "/v1/sessions", body, idempotent=True,
                                 headers={"Idempotency-Key": uuid.uuid4().hex})
        if not isinstance(r, dict) or not r.get("id"):
            raise LatheError(f"POST /v1/sessions: no id in the answer {r!r}")
        return TrainingClient(self.http, r["id"], r)

    def training_client(self, session_id: str) -> TrainingClient:
        """A TrainingClient for an existing session (e.g. after this process restarted)."""
        return TrainingClient(self.http, session_id)

    def list_sessions(self) -> List[Dict[str, Any]]:
        _, r = self.http.request("GET", "/v1/sessions", idempotent=True)
        return list((r or {}).get("data") or [])

    def usage(self) -> Dict[str, Any]:
        """GET /v1/usage: {"tenant_id", "quotas": {...}, "usage": {...}}: each quota (0: none) and
        what the tenant uses against it (jobs and sessions not ended, running slots, stored bytes)."""
        _, r = self.http.request("GET", "/v1/usage", idempotent=True)
        return r or {}

    # -------------------------------------------------------------- tokenizer

    def tokenize(self, model: str, text: str) -> List[int]:
        _, r = self.http.request("POST", "/v1/tokenize", {"model": model, "text": text}, idempotent=True)
        return list(r["tokens"])

    def detokenize(self, model: str, tokens: Sequence[int]) -> str:
        _, r = self.http.request("POST", "/v1/detokenize", {"model": model, "tokens": list(tokens)},
                                 idempotent=True)
        return str(r["text"])

    # -------------------------------------------------------------- datasets and jobs

    def upload_dataset(self, path: str, name: Optional[str] = None, timeout: float = 600.0) -> Dict[str, Any]:
        """Uploads a JSONL file as a dataset (POST /v1/datasets?name=N), streamed from disk;
        returns the dataset's report (id, name, ...). Not retried."""
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            _, r = self.http.request("POST", "/v1/datasets", query={"name": name or os.path.basename(path)},
                                     raw=f, content_type="application/x-ndjson", timeout=timeout,
                                     headers={"Content-Length": str(size)})
        return r

    def submit_job(self, spec: Mapping[str, Any], idempotency_key: Optional[str] = None) -> Dict[str, Any]:
        """POST /v1/jobs. With an idempotency_key, sending it again (e.g. after ConnectionFailed)
        finds the same job instead of making a second; without one, it is never repeated."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        _, r = self.http.request("POST", "/v1/jobs", dict(spec), headers=headers,
                                 idempotent=idempotency_key is not None)
        return r

    def list_jobs(self, state: Optional[str] = None, limit: Optional[int] = None,
                  cursor: Optional[str] = None) -> Dict[str, Any]:
        """One page of the tenant's jobs: {"jobs": [...], "has_more", "next_cursor", ...}."""
        _, r = self.http.request("GET", "/v1/jobs", query={"state": state, "limit": limit, "cursor": cursor},
                                 idempotent=True)
        return r

    def get_job(self, job_id: str) -> Dict[str, Any]:
        _, r = self.http.request("GET", f"/v1/jobs/{_q(job_id)}", idempotent=True)
        return r

    def cancel_job(self, job_id: str) -> Dict[str, Any]:
        _, r = self.http.request("POST", f"/v1/jobs/{_q(job_id)}/cancel", idempotent=True)
        return r or {}

    def wait_job(self, job_id: str, timeout: Optional[float] = None, poll: float = 2.0,
                 artifacts: bool = False) -> Dict[str, Any]:
        """Polls get_job until the job is completed, failed, cancelled or rejected; returns it.
        artifacts=True: a completed job is waited for until its artifacts are published too (the
        publisher promotes them a moment after the job completes). CallTimeout after timeout
        seconds (None: no limit)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                j = self.get_job(job_id)
            except ConnectionFailed:
                j = None  # get_job already retried; keep waiting while the deadline allows
            if j is not None and j.get("state") in JOB_DONE_STATES:
                if not artifacts or j.get("state") != "completed" or j.get("artifacts"):
                    return j
            if deadline is not None and time.monotonic() >= deadline:
                state = j.get("state") if j else "unknown"
                raise CallTimeout(f"job {job_id} still {state} after {timeout} s")
            time.sleep(poll)

    def list_artifacts(self, job_id: str) -> List[Dict[str, Any]]:
        """A job's published artifacts: [{"name", "sha256", "bytes"}] (empty until published)."""
        _, r = self.http.request("GET", f"/v1/jobs/{_q(job_id)}/artifacts", idempotent=True)
        return list((r or {}).get("artifacts") or [])

    def download_artifact(self, job_id: str, name: str, path: str, timeout: float = 600.0,
                          sha256: Optional[str] = None) -> int:
        """Downloads a published artifact of a job to path; returns its size in bytes. With
        sha256 (from list_artifacts), a download with other bytes raises and leaves no file."""
        return self.http.download(f"/v1/jobs/{_q(job_id)}/artifacts/{_q(name)}", path, timeout=timeout,
                                  sha256=sha256)
