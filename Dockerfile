# One image for every crypten_lite role: the dealer, each party, and the one-shot `certs` job.
# The role is the command: `docker run IMAGE dealer`, `docker run IMAGE party script.py`.
# All configuration comes from CRYPTEN_LITE_* environment variables (see docker-compose.yml).
#
# Build arguments (defaults give the public, CPU-only image of about 1.4 GB):
#   BASE_IMAGE      a Debian-based image with Python 3.11 and pip (default python:3.11-slim)
#   TORCH_VERSION   the torch release to install (default 2.13.0)
#   TORCH_PIP_ARGS  where pip finds torch; the default is PyTorch's CPU-only index, which
#                   keeps the image small (PyPI's Linux torch is the CUDA build, about 5 GB).
#                   E.g. --build-arg TORCH_PIP_ARGS="--find-links http://host:8000/" for a
#                   local wheel, or "" for PyPI's default build.
#   TORCH_SHA256    sha256 of the torch wheel pip installs (pip refuses any other file). The
#                   default is that of torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl;
#                   give the hash of your wheel with any other version, platform or index.
#
# Every other Python package comes from docker/requirements.lock: one version each, with the
# sha256 of its files, installed with --require-hashes (regenerate it with
# scripts/lock_docker_deps.sh after changing pyproject.toml's dependencies). `pip check`
# then proves that the lock covers every requirement, torch's included.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Torch first, alone (its dependencies are in the lock) and checked against its hash, in its
# own layer, so code changes do not reinstall it.
ARG TORCH_VERSION=2.13.0
ARG TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
ARG TORCH_SHA256=6746dbcbeb526eb61330b76b41ff1b4eb848951103a892eeb080dfa2b264667b
RUN echo "torch==${TORCH_VERSION} --hash=sha256:${TORCH_SHA256}" > /tmp/torch.txt \
    && pip install --require-hashes --no-deps ${TORCH_PIP_ARGS} -r /tmp/torch.txt \
    && rm /tmp/torch.txt

# Then the pinned and hashed dependencies (with the examples extra: the compose parties run
# examples/, which use scikit-learn), in a layer that only a change of the lock rebuilds.
WORKDIR /app
COPY docker/requirements.lock ./docker/requirements.lock
RUN pip install --require-hashes --no-deps -r docker/requirements.lock
COPY pyproject.toml README.md ./
COPY crypten_lite ./crypten_lite
# The package itself, built by the locked setuptools (no build isolation: nothing unpinned is
# fetched), and a check that every requirement is met by what the lock installed.
RUN pip install --no-deps --no-build-isolation ".[examples]" && pip check
COPY examples ./examples

# Run unprivileged. /certs is each service's TLS folder (CRYPTEN_LITE_TLS_DIR); it belongs to
# that user so that a volume mounted there starts out owned by it.
RUN useradd --create-home --uid 10001 mpc && mkdir /certs && chown mpc:mpc /certs
USER mpc

ENTRYPOINT ["crypten-lite"]
CMD ["party"]
