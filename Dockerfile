# One image for every service of docker-compose.yml: migrate, api and worker.
FROM python:3.11-slim

WORKDIR /app
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

COPY pyproject.toml README.md alembic.ini ./
COPY agora_pg ./agora_pg
RUN pip install ".[fast]"

# The application: job handlers and pipelines (worker.py) and the API entry point.
COPY worker.py ./
COPY families ./families
COPY api ./api

RUN useradd --system --uid 10001 agora
USER agora

EXPOSE 8000
CMD ["agora-pg", "api", "--host", "0.0.0.0", "--port", "8000"]
