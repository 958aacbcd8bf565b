# One image, several roles: the command picks it (serve, worker, migrate; the `spark` target adds Java).
# Build: docker build -t outboxq .        (api / worker / migrate)
#        docker build --target spark -t outboxq-spark .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md alembic.ini ./
COPY app ./app
COPY workers ./workers
COPY spark_jobs ./spark_jobs
COPY migrations ./migrations
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim AS runtime
RUN useradd --create-home --uid 10001 outboxq
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
COPY --chown=outboxq examples/shop /home/outboxq/shop
USER outboxq
WORKDIR /home/outboxq
ENV OUTBOXQ_HOST=0.0.0.0 OUTBOXQ_PORT=8000
EXPOSE 8000
ENTRYPOINT ["outboxq"]
CMD ["serve"]

FROM runtime AS spark
USER root
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/* && pip install --no-cache-dir "pyspark>=3.5"
USER outboxq
ENV SPARK_LOCAL_IP=127.0.0.1
CMD ["spark", "run", "--help"]
