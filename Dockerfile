# One image for every crypten_lite role: the dealer, each party, and the one-shot `certs` job.
# The role is the command: `docker run IMAGE dealer`, `docker run IMAGE party script.py`.
# All configuration comes from CRYPTEN_LITE_* environment variables (see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Torch first, in its own layer, so code changes do not reinstall it. For a much smaller
# image use the CPU-only wheel: add `--index-url https://download.pytorch.org/whl/cpu`.
RUN pip install torch==2.13.0

WORKDIR /app
COPY pyproject.toml README.md ./
COPY crypten_lite ./crypten_lite
RUN pip install .
COPY examples ./examples

# Run unprivileged. /certs belongs to that user so that a named volume mounted there
# starts out writable by it (docker copies the mount point's owner into a new volume), and
# the keys `crypten-lite certs` writes with mode 0600 stay readable by every service.
RUN useradd --create-home --uid 10001 mpc && mkdir /certs && chown mpc:mpc /certs
USER mpc

ENTRYPOINT ["crypten-lite"]
CMD ["party"]
