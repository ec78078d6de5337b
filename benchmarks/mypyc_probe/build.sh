#!/bin/bash
# build the compiled modules in the scratch tree; shim mypy_extensions (runtime dep of @mypyc_attr) after build
cd /tmp/mypyc-scratch && rm -f mypy_extensions.py *.so core/*.so core/*/*.so && rm -rf build .mypy_cache
/tmp/venv-mypyc/bin/python /tmp/mypyc-setup.py build_ext --inplace > /tmp/mypyc-build.log 2>&1
rc=$?
grep -i "error" /tmp/mypyc-build.log | grep -v Werror | head -20
cp /tmp/venv-mypyc/lib/python3.11/site-packages/mypy_extensions.py /tmp/mypyc-scratch/
/work/venv/bin/python -m compileall -q core console mypy_extensions.py
echo build rc=$rc
