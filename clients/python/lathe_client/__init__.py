"""lathe_client: a standard-library-only Python client for Lathe's HTTP API.

    from lathe_client import ServiceClient, AdamParams, sft_datum

    service = ServiceClient()                      # LATHE_API_URL, LATHE_API_KEY
    tc = service.create_lora_training_client("lathe-tiny", rank=8)
    p, c = service.tokenize("lathe-tiny", "date: March 5, 2021\\niso:"), service.tokenize("lathe-tiny", " 2021-03-05")
    fb = tc.forward_backward([sft_datum(p, c, eos=0)])   # sent now; runs on the server in order
    opt = tc.optim_step(AdamParams(lr=1e-3))               # queued behind it
    print(fb.result().loss, opt.result().step)             # results when you want them
    tc.end()

See clients/python/README.md.
"""
from .client import JOB_DONE_STATES, LOSSES, SamplingClient, ServiceClient, TrainingClient
from .errors import (AuthError, CallFailed, Conflict, ConnectionFailed, InvalidCall, InvalidRequest, LatheError,
                     NotFound, RateLimited, ServerError, SessionRestarted, Unavailable)
from .futures import CallFuture, CallTimeout
from .types import (AdamParams, Datum, ForwardBackwardOutput, OptimStepOutput, Sample, SampleOutput, SamplingParams,
                    SavedState, rl_datum, sft_datum)

__version__ = "0.1.0"

__all__ = [
    "ServiceClient", "TrainingClient", "SamplingClient", "CallFuture",
    "Datum", "AdamParams", "SamplingParams", "sft_datum", "rl_datum",
    "ForwardBackwardOutput", "OptimStepOutput", "SavedState", "Sample", "SampleOutput",
    "LatheError", "InvalidRequest", "InvalidCall", "AuthError", "NotFound", "Conflict", "RateLimited",
    "Unavailable", "ServerError", "ConnectionFailed", "CallFailed", "SessionRestarted", "CallTimeout",
    "LOSSES", "JOB_DONE_STATES",
]
