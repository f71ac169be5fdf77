# The image of docker-compose.pairwise.yml: the project's image (Dockerfile) plus the
# `pairwise` extra (TenSEAL: Microsoft SEAL's BFV; PyNaCl: libsodium's Ed25519 for the base OTs).
#   docker compose build                       # crypten-lite:latest from Dockerfile first
#   docker compose -f docker-compose.pairwise.yml -p crypten-lite-pw build
ARG BASE=crypten-lite:latest
FROM ${BASE}
USER root
# The versions this tree is tested with (a TenSEAL other than provider/he_pow2.py's
# LAYOUT_CHECKED_TENSEAL takes the slower serialized path for ciphertext reads).
RUN pip install "tenseal==0.3.18" "pynacl==1.6.2"
USER mpc
