# One image for the control plane (API, scheduler) and the demo agent on simulated GPUs;
# GPU nodes run the agent on the host (deploy/systemd/gpusched-agent.service).

# Build stage: gcc and mypy compile the scheduling core with mypyc (app/compile_core.py);
# the runtime image carries neither.
FROM python:3.11-slim AS build
ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /srv/gpusched
COPY pyproject.toml README.md alembic.ini ./
COPY app ./app
COPY workers ./workers
COPY migrations ./migrations
COPY frontend ./frontend
# Editable, so that every entry point (gpusched, uvicorn, celery) imports app/ from here,
# beside migrations/, frontend/ and the compiled core; a plain `pip install .` would copy
# the packages into site-packages and leave those behind. The build must exist: an image
# running the plain-Python core would be silently twice as slow.
RUN python -m venv /opt/gpusched \
    && /opt/gpusched/bin/pip install -e . 'mypy>=1.10' \
    && /opt/gpusched/bin/python -m app.compile_core \
    && /opt/gpusched/bin/python -c "from app import compiled_core; assert compiled_core.compiled_build(), 'scheduling core not compiled'" \
    && /opt/gpusched/bin/pip uninstall -y mypy

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/gpusched/bin:$PATH
# Same paths as in the build stage: the editable install points at /srv/gpusched.
COPY --from=build /opt/gpusched /opt/gpusched
COPY --from=build /srv/gpusched /srv/gpusched
WORKDIR /srv/gpusched
RUN useradd --system --create-home --uid 10001 gpusched \
    && mkdir -p /var/lib/gpusched && chown gpusched /var/lib/gpusched

ENV GPUSCHED_DATA_DIR=/var/lib/gpusched
EXPOSE 8000
USER gpusched
CMD ["gpusched", "server"]
