#!/usr/bin/env bash
# usage: /tmp/md5check-installed.sh VENV_BIN -> md5 of stdout per case, run by the installed slo-console from /tmp/mi-cwd
# Compare against /tmp/md5-before37.txt
set -u
BIN=$1  # the venv bin dir of an installed slo-console
cd /tmp/mi-cwd  # holds only a profiles/ link: nothing importable
run() { local name=$1; shift; printf '%-40s %s\n' "$name" "$(env -u PYTHONPATH $BIN/slo-console --batch "$@" 2>/dev/null | md5sum | cut -c1-8)"; }
run fcfs-bench-10k --profile profiles/bench-chat.yaml --requests 10000
run fcfs-quickstart --profile profiles/quickstart.yaml
run fcfs-longprompt-3k --profile profiles/long-prompt-chat.yaml --requests 3000
run fcfs-tunerpaper-3k --profile profiles/slo-tuner-paper.yaml --requests 3000
run fcfs-optrace-3k --profile profiles/operator-trace.yaml --requests 3000
run fcfs-tinysim-3k --profile profiles/vllm-cpu-tiny-sim.yaml --requests 3000
run fcfs-bursty --profile /tmp/bursty.yaml
run fcfs-bursty-short --profile /tmp/bursty-short.yaml
for m in saber slos-serve adaserve; do
  run $m-quickstart-1500 --profile profiles/quickstart.yaml --mode $m --requests 1500
  run $m-mixed-1500 --profile profiles/slos-serve-mixed.yaml --mode $m --requests 1500
  run $m-bursty-short --profile /tmp/bursty-short.yaml --mode $m
done
run slos-bench-5k --profile profiles/bench-chat.yaml --mode slos-serve --requests 5000
run slos-trace --profile profiles/slos-serve-trace.yaml --mode slos-serve
run adaserve-trace --profile profiles/adaserve-trace.yaml --mode adaserve
run adaserve-mix --profile profiles/adaserve-mix.yaml --mode adaserve
run adaserve-bench-5k --profile profiles/bench-chat.yaml --mode adaserve --requests 5000
