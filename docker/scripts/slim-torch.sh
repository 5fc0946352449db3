#!/bin/sh
# Remove what a serving image never uses from the installed torch: C++ headers (no compiler
# in the image), its test suite and test binaries (~190 MB). torch_shm_manager stays.
set -e
torch=$(python3 -c "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('torch').origin))")
rm -rf "$torch/include" "$torch/test"
find "$torch/bin" -type f ! -name torch_shm_manager -delete
