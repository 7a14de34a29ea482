# One image for every convplane process: region node, replay worker, simulated engine, CLI.
# It runs as "convplane" (uid/gid 999, the uid the postgres image's server runs as: the secrets
# service writes the database's password, hba file and TLS key, which the server must own).
FROM python:3.11-slim
RUN groupadd --system --gid 999 convplane \
 && useradd --system --uid 999 --gid 999 --no-create-home --shell /usr/sbin/nologin convplane \
 && install -d -m 0700 -o convplane -g convplane /run/convplane-secrets
WORKDIR /app
COPY pyproject.toml README.md ./
COPY eventlog eventlog
COPY regions regions
COPY replay replay
COPY services services
RUN pip install --no-cache-dir .
USER convplane:convplane
ENTRYPOINT ["convplane"]
