# One image for API, scheduler and agents. GPU agents get NVML from the NVIDIA container
# runtime (the "utility" capability mounts libnvidia-ml into the container).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /srv/gpusched

COPY pyproject.toml README.md alembic.ini ./
COPY app ./app
COPY workers ./workers
COPY migrations ./migrations
COPY frontend ./frontend
RUN pip install . && useradd --system --create-home --uid 10001 gpusched \
    && mkdir -p /var/lib/gpusched && chown gpusched /var/lib/gpusched

ENV GPUSCHED_DATA_DIR=/var/lib/gpusched
EXPOSE 8000
USER gpusched
CMD ["gpusched", "server"]
