# syntax=docker/dockerfile:1
# The stocksentry exporter image: `stocksentry exporter` with the [exporter] extra only.
#
#   docker build -t registry.example.com/shop/stocksentry:0.1.0 \
#     --build-arg REVISION="$(git rev-parse HEAD)" .
#   docker push registry.example.com/shop/stocksentry:0.1.0
#
# Stage 1 builds the wheel from the source and installs it, with the [exporter] extra
# and nothing else, into a virtual environment; stage 2 is the same slim Python with
# only that environment copied in. It runs as uid/gid 65532 (what the Helm chart's
# securityContext asks for), with a read-only root filesystem, and needs no shell: the
# entrypoint is exec form and nothing runs through /bin/sh. The container's command is
# `stocksentry`; the chart passes `exporter --config=...` as arguments.
# tests/integration/test_image.py repeats these steps without docker (there is no docker
# engine on the machines this project is built on) and serves the chart's ConfigMap.

ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY . .
# The commit the image is built from; stocksentry_build_info{revision} reports it.
ARG REVISION=unknown
RUN printf '%s\n' "${REVISION}" > exporter/REVISION \
 && pip wheel --no-deps --wheel-dir /dist . \
 && python -m venv /opt/stocksentry \
 && /opt/stocksentry/bin/pip install "$(ls /dist/stocksentry-*.whl)[exporter]" \
 && /opt/stocksentry/bin/pip uninstall --yes pip \
 && /opt/stocksentry/bin/stocksentry --version

FROM ${PYTHON_IMAGE}
ARG PYTHON_IMAGE
ARG REVISION=unknown
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="stocksentry" \
      org.opencontainers.image.description="Exporter sidecar that catches double-selling in flash sales: database and Redis invariant probes, the app's multiprocess metrics" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
COPY --from=build /opt/stocksentry /opt/stocksentry
ENV PATH=/opt/stocksentry/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
EXPOSE 19464
ENTRYPOINT ["stocksentry"]
CMD ["exporter", "--config=/etc/stocksentry/config/config.yaml"]
