"""Ferry's Python client: submit inference jobs to a Ferry broker, read results by id.

    import numpy as np, ferry

    with ferry.Client() as client:                   # $FERRY_FRONTEND / $FERRY_REDIS
        r = client.run("tiny", np.ones(8, np.float32), timeout=10)
        r.outputs[0]                                   # numpy array, without the batch dim

    async with ferry.AsyncClient() as client:        # asyncio: thousands of awaits at once
        r = await client.run("whisper", pcm_int16)

See docs/python.md for the API, options, dtypes and errors.
"""

from ._aio import AsyncClient, CancelReport
from ._errors import (Duplicate, FerryError, InvalidArgument, QueueFull, Timeout, TooLarge,
                      Unavailable, UnknownModel, error_for)
from ._protocol import Job, Result
from ._sync import Client
from ._tensor import DTYPES, Tensor, bfloat16

__version__ = "0.1.0"

__all__ = [
    "Client", "AsyncClient", "Result", "Job", "CancelReport", "Tensor", "bfloat16", "DTYPES",
    "FerryError", "QueueFull", "Unavailable", "UnknownModel", "InvalidArgument", "TooLarge",
    "Timeout", "Duplicate", "error_for", "__version__",
]
