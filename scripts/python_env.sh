# Sourced by scripts/example.sh and scripts/test.sh: the Python environment they install into.
#
#   - an active virtual environment ($VIRTUAL_ENV) is used as it is;
#   - otherwise the repository's .venv (CRYPTEN_LITE_VENV=DIR: another folder), made with
#     `python3 -m venv` when missing (python3 3.11 or newer).
#
# It is then activated for everything the scripts start (PATH, VIRTUAL_ENV): `python`,
# `crypten-lite`, the parties, the dealer and Jupyter kernels are the environment's. Nothing is
# installed outside it. To use the environment afterwards: `. .venv/bin/activate`.
# pip inside it reads the same configuration as everywhere on this machine (pip.conf, PIP_*).

_cl_say() { echo "$(basename "$0"): $*" >&2; }

if [[ -n ${VIRTUAL_ENV:-} && -x ${VIRTUAL_ENV}/bin/python ]]; then
    _cl_say "using the active virtual environment $VIRTUAL_ENV"
else
    _cl_venv="${CRYPTEN_LITE_VENV:-.venv}"
    if [[ ! -x $_cl_venv/bin/python ]]; then
        command -v python3 >/dev/null || { _cl_say "no python3 on PATH: install Python 3.11 or newer"; exit 1; }
        python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
            _cl_say "crypten_lite needs Python 3.11 or newer; python3 is $(python3 -V 2>&1): put a newer python3 first on PATH"
            exit 1
        }
        _cl_say "making a virtual environment in $_cl_venv (python3 -m venv; $(python3 -V 2>&1))"
        python3 -m venv "$_cl_venv" || {
            _cl_say "python3 -m venv failed: on Debian/Ubuntu install python3-venv (apt-get install python3-venv), or activate a virtual environment of your own and rerun"
            exit 1
        }
    else
        _cl_say "using the virtual environment $_cl_venv"
    fi
    VIRTUAL_ENV="$(cd "$_cl_venv" && pwd)"
    export VIRTUAL_ENV
    export PATH="$VIRTUAL_ENV/bin:$PATH"
    unset PYTHONHOME _cl_venv
fi
hash -r
