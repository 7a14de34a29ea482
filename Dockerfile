# One image for every convplane process: region node, replay worker, simulated engine, CLI.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY eventlog eventlog
COPY regions regions
COPY replay replay
COPY services services
RUN pip install --no-cache-dir .
ENTRYPOINT ["convplane"]
