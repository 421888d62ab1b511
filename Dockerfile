# specon: the manager, the node agent and the bundled training workloads in one image.
#   make image                     # docker build -t specon:0.1.0 .
#   docker run --rm specon:0.1.0 --help
# The manifests override the entrypoint with `specon-manager` / `specon-agent`; training
# pods run `python -m specon.workloads --model vae` (or their own script using specon.jobkit).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    OMP_NUM_THREADS=1

WORKDIR /src
# The CPU build of torch, pinned: an unpinned torch pulls several GB of CUDA wheels.
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0"
COPY pyproject.toml README.md ./
COPY specon ./specon
COPY agent ./agent
COPY manager ./manager
# The image serves every backend: the Kubernetes client and the Docker SDK with it.
RUN pip install ".[kubernetes,docker]" && rm -rf /src

# Unprivileged by default (the manager runs as this user; the agent's manifest chooses root
# with DAC_OVERRIDE only, to write beside the training pods' files on the shared volume).
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin specon
USER 10001
WORKDIR /home/specon
ENTRYPOINT ["specon"]
CMD ["--help"]
