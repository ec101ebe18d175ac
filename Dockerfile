# syntax=docker/dockerfile:1
#
# sgais service image: the API (`sgais serve`) and the worker (`sgais worker`) share it.
#
# Build arguments:
#   TORCH_VARIANT  PyTorch wheel index tag. `cpu` (default) gives a CPU-only torch (~200 MB
#                  instead of several GB). For a GPU image pass a CUDA tag that PyTorch
#                  publishes for TORCH_VERSION (see the PyTorch install matrix), e.g.
#                  `docker build --build-arg TORCH_VARIANT=cu128 .`, and run the worker with
#                  SGAIS_DEVICE=cuda on a host with the NVIDIA container toolkit.
#   TORCH_VERSION  Must satisfy the torch pin in pyproject.toml (tests/test_deploy.py checks it).
#
# torch is installed first, from the selected index, so that `pip install .` finds the pin
# already satisfied and does not pull the (CUDA) default wheel from PyPI.

ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim

ARG TORCH_VARIANT=cpu
ARG TORCH_VERSION=2.13.0

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

RUN pip install "torch==${TORCH_VERSION}" --index-url "https://download.pytorch.org/whl/${TORCH_VARIANT}"

WORKDIR /src
COPY pyproject.toml README.md ./
COPY models ./models
COPY workers ./workers
COPY service ./service
RUN pip install . \
    && python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

# Non-root runtime user; /data holds the embedded Redis files when no --redis-url is given.
RUN groupadd --gid 10001 sgais \
    && useradd --create-home --uid 10001 --gid 10001 --shell /usr/sbin/nologin sgais \
    && mkdir -p /data \
    && chown sgais:sgais /data
USER 10001:10001
WORKDIR /data

# 8000: HTTP API (/v1, /metrics, /healthz, /readyz). 9100: a worker's Prometheus metrics.
EXPOSE 8000 9100

# Checks the API; the worker service overrides this in docker-compose.yml (it serves only metrics).
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]

ENTRYPOINT ["sgais"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000", "--data-dir", "/data"]
