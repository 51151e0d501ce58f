# gpu-steward: one image for the webhook, the descheduler and the node labeler (`gpu-steward COMMAND`).
# Build: docker build -t gpu-steward:dev --build-arg VERSION=$(git describe --always) .
# Both architectures (GH200/GB200 nodes are arm64): docker buildx bake (docker-bake.json; docs/release.md).
# The base is pinned by digest (the tag's multi-platform index, so each platform resolves its own image). Refresh
# it with `docker buildx imagetools inspect python:3.11-slim-bookworm` and note the change in CHANGELOG.md.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:2e32f7d302adc1c37428355c1e646897c0c53f4fd60b6a551245fb90ee129f91

# --- build: a virtualenv with the pinned dependencies and the package, nothing else -----------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
ARG VENV=/opt/gpu-steward
WORKDIR /src
RUN python -m venv "${VENV}"
# Dependencies first: this layer is reused until requirements.lock changes.
COPY requirements.lock ./
RUN "${VENV}/bin/pip" install --no-deps -r requirements.lock
COPY pyproject.toml ./
COPY common ./common
COPY admission ./admission
COPY descheduler ./descheduler
COPY gpu_steward ./gpu_steward
# --no-deps: only the lock decides versions; pip check fails the build if the lock misses one.
RUN "${VENV}/bin/pip" install --no-deps . \
    && "${VENV}/bin/pip" check \
    && "${VENV}/bin/python" -m compileall -q "${VENV}/lib"

# --- runtime: the slim base plus the virtualenv; no compiler, no pip cache, not root -----------------
FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="gpu-steward" \
      org.opencontainers.image.description="NVLink-aware GPU placement webhook, gang release and idle-GPU reclaim descheduler, NVLink topology node labeler" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/gpu-steward/gpu-steward"
COPY --from=build /opt/gpu-steward /opt/gpu-steward
ENV PATH=/opt/gpu-steward/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# 65532: the conventional "nonroot" uid; the chart's securityContext uses the same.
USER 65532:65532
ENTRYPOINT ["gpu-steward"]
CMD ["--help"]
