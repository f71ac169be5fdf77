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
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Torch first, in its own layer, so code changes do not reinstall it.
ARG TORCH_VERSION=2.13.0
ARG TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
RUN pip install ${TORCH_PIP_ARGS} "torch==${TORCH_VERSION}"

# Then the dependencies, with the examples extra (the compose parties run examples/, which use
# scikit-learn), in a layer that only a change of pyproject.toml rebuilds.
WORKDIR /app
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['examples']))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt && rm /tmp/requirements.txt
COPY crypten_lite ./crypten_lite
RUN pip install --no-deps ".[examples]"
COPY examples ./examples

# Run unprivileged. /certs is each service's TLS folder (CRYPTEN_LITE_TLS_DIR); it belongs to
# that user so that a volume mounted there starts out owned by it.
RUN useradd --create-home --uid 10001 mpc && mkdir /certs && chown mpc:mpc /certs
USER mpc

ENTRYPOINT ["crypten-lite"]
CMD ["party"]
