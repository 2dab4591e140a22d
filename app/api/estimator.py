"""``POST /api/v1/estimate``: the estimator against the GPU models of this cluster."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import CurrentUser, SessionDep
from app.estimator.catalog import estimate_on_cluster
from app.estimator.schemas import EstimateRequest, EstimateResponse

router = APIRouter(prefix="/api/v1", tags=["estimator"])


@router.post("/estimate", response_model=EstimateResponse)
def post_estimate(
    request: EstimateRequest, session: SessionDep, principal: CurrentUser
) -> EstimateResponse:
    """Per-GPU memory, fits per registered GPU model (the catalog when none is registered),
    training time for ``tokens`` and suggestions when it does not fit.

    Formulas and assumptions: docs/estimator.md.  Model names the catalog does not know are
    named in ``warnings`` (their peak TFLOPS is a conservative default)."""
    del principal  # any authenticated user may estimate
    return estimate_on_cluster(session=session, request=request)
