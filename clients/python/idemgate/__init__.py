"""idemgate: a Python client and batch runner for the idemgate gateway (standard library only).

    from idemgate import Client, derive_key
    c = Client("http://127.0.0.1:8080", token)
    key = derive_key({"product": "sku-123", "template": 3, "variant": 1}, prefix="poster-")
    job = c.submit("mock-images/images/generations", {"prompt": "…", "n": 1}, key, wait=10)
    job = c.wait(job, timeout=120)
"""

from .client import Client, Job, Output
from .errors import (BudgetExceeded, IdemgateError, IntegrityError, InvalidRequest, KeyReused,
                     NotFound, OutputsUnavailable, RateLimited, Rejected, Unauthorized,
                     Unavailable, Unknown)
from .keys import canonical_json, derive_key
from .policy import RetryPolicy
from .stream import Event, JobEnded, StreamCut, StreamDiverged

__version__ = "0.1.0"
__all__ = ["Client", "Job", "Output", "RetryPolicy", "derive_key", "canonical_json",
           "IdemgateError", "Rejected", "InvalidRequest", "Unauthorized", "BudgetExceeded",
           "NotFound", "KeyReused", "RateLimited", "Unavailable", "Unknown",
           "OutputsUnavailable", "IntegrityError", "Event", "StreamCut", "StreamDiverged",
           "JobEnded"]
