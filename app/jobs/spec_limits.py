"""What a submission may carry, checked by the API's schemas and, before sending, by the
command line: plain constants, so that `gpusched submit` need not load the schemas
(pydantic models and what they import: a tenth of a second of every command)."""

from __future__ import annotations

import re

# A job script's copy travels in the submission, under the API's body limit (1 MB).
MAX_SCRIPT_CHARS = 512 * 1024

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Set by the agent for every job; a job may not override them.
RESERVED_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "GPUSCHED_",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "NODE_RANK",
    "LOCAL_WORLD_SIZE",
)
