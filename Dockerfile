# One image for every service of docker-compose.yml: migrate, api and worker.
# The base is pinned by digest (python:3.11-slim-bookworm as published on Docker Hub), so
# that a rebuild gets the same bytes; to move to a newer one, look its digest up with
#   docker buildx imagetools inspect python:3.11-slim-bookworm
# and replace the one below.
FROM python:3.11-slim-bookworm@sha256:2e32f7d302adc1c37428355c1e646897c0c53f4fd60b6a551245fb90ee129f91

WORKDIR /app
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

COPY pyproject.toml README.md alembic.ini ./
COPY agora_pg ./agora_pg
RUN pip install ".[fast]"

# The application: job handlers and pipelines (worker.py), its composition root (init.py),
# its job families and the API entry point.
COPY worker.py init.py ./
COPY families ./families
COPY api ./api

RUN useradd --system --uid 10001 agora
USER agora

EXPOSE 8000
CMD ["agora-pg", "api", "--host", "0.0.0.0", "--port", "8000"]
