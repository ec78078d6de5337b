#!/bin/bash
# alternating whole-process timings: before-tree (pure, PYTHONPATH) vs the compiled install (venv-mi2)
B() { (cd /tmp/before37 && PYTHONPATH=/tmp/before37 /usr/bin/time -f "before %e %U %S %M" /work/venv/bin/python -m console --batch --profile profiles/bench-chat.yaml --requests 100000 >/dev/null 2>/tmp/t37.err; tail -1 /tmp/t37.err); }
C() { (cd /tmp/mi-cwd && env -u PYTHONPATH /usr/bin/time -f "compiled %e %U %S %M" /tmp/venv-mi2/bin/slo-console --batch --profile profiles/bench-chat.yaml --requests 100000 >/dev/null 2>/tmp/t37.err; tail -1 /tmp/t37.err); }
for i in $(seq 1 ${1:-4}); do B; C; done
