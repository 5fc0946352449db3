#!/bin/sh
# Install torch and the third-party requirements of distribution folders into the active venv:
#   docker/scripts/install-deps.sh plugins core plugin_cpu_x86      (run from the context root)
# torch: a wheel for this machine's architecture in docker/wheels/ when there is one, else
# $TORCH_SPEC from $TORCH_INDEX_URL (PyPI when empty). Then torch is slimmed for serving.
set -e
wheel=$(ls docker/wheels/torch-*"$(uname -m)".whl 2>/dev/null | head -n 1)
if [ -n "$wheel" ]; then
    docker/scripts/with-ca.sh pip install -q "$wheel"
else
    docker/scripts/with-ca.sh pip install -q "$TORCH_SPEC" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
fi
# a requirements file, not words: a requirement with an environment marker has spaces
python3 docker/scripts/deps.py "$@" > /tmp/requirements.txt
docker/scripts/with-ca.sh pip install -q -r /tmp/requirements.txt
rm /tmp/requirements.txt
docker/scripts/slim-torch.sh
