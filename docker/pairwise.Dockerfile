# The image of docker-compose.pairwise.yml: the project's image (Dockerfile) plus the
# `pairwise` extra (TenSEAL: Microsoft SEAL's BFV for the dealer-free provider).
#   docker compose build                       # crypten-lite:latest from Dockerfile first
#   docker compose -f docker-compose.pairwise.yml -p crypten-lite-pw build
ARG BASE=crypten-lite:latest
FROM ${BASE}
USER root
RUN pip install "tenseal>=0.3.16"
USER mpc
