# The image of docker-compose.pairwise.yml: the project's image (Dockerfile) plus the
# `pairwise` extra (TenSEAL: Microsoft SEAL's BFV; PyNaCl: libsodium's Ed25519 for the base OTs).
#   docker compose build                       # crypten-lite:latest from Dockerfile first
#   docker compose -f docker-compose.pairwise.yml -p crypten-lite-pw build
ARG BASE=crypten-lite:latest
FROM ${BASE}
USER root
RUN pip install "tenseal>=0.3.16" "pynacl>=1.5"
USER mpc
